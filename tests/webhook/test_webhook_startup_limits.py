"""Start-up and body size: before its first complete list of nodes and pods the webhook
decides nothing (503, so the API server's failurePolicy applies; never a denial), and a
review over the API server's own 3 MiB limit is refused 413 before it is read."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from webhook_builders import dynamic, node, opted_in, pod, review
from webhook_server import Cert, Server

from packing.model import Snapshot
from webhook.app import MAX_REVIEW_BYTES, create_webhook_app
from webhook.config import WebhookConfig

SIZED = pod("asr", annotations={"gpupack.io/gpu-memory": "8Gi"})


class Feed:
    """A provider that has no complete list until ``synced``."""

    def __init__(self) -> None:
        self.synced = False
        self.snapshot = dynamic(node("h0"))
        self.calls = 0

    def ready(self) -> bool:
        return self.synced

    def __call__(self) -> Snapshot | None:
        self.calls += 1
        return self.snapshot if self.synced else None


@pytest.mark.parametrize("wire_ready", [True, False])
def test_before_the_first_list_nothing_is_decided_then_pods_are_sized(wire_ready: bool) -> None:
    feed = Feed()
    registry = CollectorRegistry()
    app = create_webhook_app(feed, registry, WebhookConfig(),
                             ready=feed.ready if wire_ready else None)
    client = app.test_client()
    assert client.get("/readyz").status_code == 503
    assert client.get("/healthz").status_code == 200  # alive: no restart while it lists
    r = client.post("/mutate", json=review(SIZED))
    # 503 and no AdmissionReview: a failed call, so failurePolicy decides, never a denial.
    assert r.status_code == 503 and "response" not in r.get_json()
    assert r.headers["Retry-After"] == "1"
    assert registry.get_sample_value("gpupack_webhook_reviews_total",
                                     {"outcome": "not_ready", "class": "none"}) == 1
    assert registry.get_sample_value("gpupack_webhook_reviews_total",
                                     {"outcome": "denied", "class": "small"}) is None
    feed.synced = True
    assert client.get("/readyz").get_json() == {"ready": True}
    r = client.post("/mutate", json=review(SIZED))
    body = r.get_json()
    assert r.status_code == 200 and body["response"]["allowed"] is True
    assert body["response"]["patchType"] == "JSONPatch"


def test_a_provider_without_a_list_yet_is_not_ready_even_if_nobody_says_so() -> None:
    # No ready() anywhere: the provider's None still keeps the webhook from deciding.
    app = create_webhook_app(lambda: None, CollectorRegistry(), WebhookConfig())
    r = app.test_client().post("/mutate", json=review(SIZED))
    assert r.status_code == 503


def test_a_declared_body_over_3_mib_is_413_in_process() -> None:
    calls: list[int] = []

    def provider() -> Snapshot:
        calls.append(1)
        return dynamic(node("h0"))

    client = create_webhook_app(provider, CollectorRegistry(), WebhookConfig()).test_client()
    big = json.dumps(review(SIZED)).encode() + b" " * MAX_REVIEW_BYTES
    r = client.post("/mutate", data=big, content_type="application/json")
    assert r.status_code == 413 and "over the API server's limit" in r.get_json()["error"]
    assert calls == []  # nothing decided
    ok = client.post("/mutate", data=big[:MAX_REVIEW_BYTES],
                     content_type="application/json")
    assert ok.status_code == 200  # 3 MiB exactly (trailing spaces are valid JSON)


def _raw_tls(server: Server, cert: Cert, data: bytes, read_s: float = 5.0) -> tuple[bytes, float]:
    ctx = ssl.create_default_context(cadata=cert.cert_pem.decode())
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=read_s) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        # The server may answer (and stop reading) before all of it is sent.
        with contextlib.suppress(OSError, ssl.SSLError):
            s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError, ssl.SSLError):
            pass
    return out, time.monotonic() - started


def test_a_150_mb_review_is_refused_over_https_without_being_read(
        https_server: tuple[Server, Cert]) -> None:
    server, cert = https_server
    head = (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 150000000\r\n\r\n")
    out, took = _raw_tls(server, cert, head + b'{"apiVersion": ')
    assert out.startswith(b"HTTP/1.1 413 ") and took < 2.0
    # The server is fine afterwards.
    status, body = server.request(server.context(cert), "POST", "/mutate", review(SIZED))
    assert status == 200 and json.loads(body)["response"]["allowed"] is True


def test_eight_concurrent_oversize_reviews_do_not_grow_the_server(
        https_server: tuple[Server, Cert]) -> None:
    import threading

    server, cert = https_server
    rss_before = _rss_kib(server.proc.pid)
    head = (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 150000000\r\n\r\n")
    results: list[bytes] = []

    def send() -> None:
        results.append(_raw_tls(server, cert, head + b"x" * (4 << 20))[0])

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 8 and all(r.startswith(b"HTTP/1.1 413 ") for r in results)
    assert _rss_kib(server.proc.pid) - rss_before < 64 * 1024  # not 8 x 150 MB


def _rss_kib(pid: int) -> int:
    """RSS of the process and its children (gunicorn's worker)."""
    total = 0
    for p in [pid, *_children(pid)]:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids = (task / "children").read_text().split()
        out += [int(k) for k in kids]
    return out




def test_the_extenders_feed_gives_no_snapshot_until_the_cache_is_synced() -> None:
    from gpupack.webhook_host import SnapshotFeed
    from kube.cache import ClusterCache

    cache = ClusterCache("gpupack", mig_actuator=True)
    cache.upsert_node(opted_in(node("h0")))  # no slices yet: made on demand
    feed = SnapshotFeed(cache)
    client = create_webhook_app(feed, CollectorRegistry(), WebhookConfig()).test_client()
    assert feed() is None and not feed.ready()
    assert client.get("/readyz").status_code == 503  # the feed's ready() is used
    assert client.post("/mutate", json=review(SIZED)).status_code == 503
    cache.mark_synced()
    snap = feed()
    assert snap is not None and [n.name for n in snap.nodes] == ["h0"]
    assert client.get("/readyz").status_code == 200
    assert client.post("/mutate", json=review(SIZED)).get_json()["response"]["allowed"]


@pytest.mark.parametrize(("min_interval_s", "fresh_after_change"), [
    (0.0, True),  # the standalone webhook's (LiveSnapshots): every change, at once
    (3600.0, False),  # the extender's at most once per interval: still the old one
])
def test_one_feed_keeps_its_snapshot_until_the_cache_changes(
        min_interval_s: float, fresh_after_change: bool) -> None:
    from gpupack.webhook_host import SnapshotFeed
    from kube.cache import ClusterCache

    cache = ClusterCache("gpupack")
    cache.upsert_node(node("h0"))
    cache.mark_synced()
    feed = SnapshotFeed(cache, min_interval_s=min_interval_s)
    first = feed()
    assert first is not None and feed() is first  # no change: the same object
    cache.upsert_node(node("h1"))
    second = feed()
    assert (second is not first) is fresh_after_change
    assert second is not None
    assert [n.name for n in second.nodes] == (["h0", "h1"] if fresh_after_change else ["h0"])

