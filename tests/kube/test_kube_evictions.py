"""Evictions and Events through the real ``kubernetes`` client over real HTTP
(kube/evictions.py), against a tiny server answering as kube-apiserver does, and the
pod-owner sink the defragmenter reads (kube.defrag.inputs.PodOwners)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kube.api_source import ApiBinder
from kube.defrag.inputs import PodOwners
from kube.evictions import ApiEvents, ApiEvictor, PodRef, outcome_of
from kube.responses import finish


class Api:
    """Answers POST .../pods/NAME/eviction with ``status`` and any other POST (events,
    bindings) with 201, over HTTP/1.1 keep-alive; keeps (path, body) of every request
    and counts the TCP connections clients open."""

    def __init__(self) -> None:
        self.status = 201
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.connections = 0
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                api.connections += 1  # one handler per connection

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.seen.append((self.path, body))
                code = api.status if self.path.endswith("/eviction") else 201
                if code < 300:
                    out: dict[str, Any] = {"kind": "Status", "apiVersion": "v1",
                                           "status": "Success"}
                else:
                    out = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "code": code, "reason": "TooManyRequests",
                           "message": "Cannot evict pod as it would violate the pod's "
                                      "disruption budget."}
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True  # kept-alive connections end with the test
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def client(self) -> Any:
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = f"http://127.0.0.1:{self.server.server_address[1]}"
        return client.ApiClient(cfg)


@pytest.fixture
def api() -> Iterator[Api]:
    a = Api()
    yield a
    a.server.shutdown()
    a.server.server_close()


@pytest.mark.parametrize("status, outcome", [
    (201, "evicted"), (200, "evicted"), (429, "pdb"), (404, "gone"), (409, "gone"),
    (403, "forbidden"), (500, "error"),
])
def test_eviction_outcomes_over_http(api: Api, status: int, outcome: str) -> None:
    api.status = status
    got = ApiEvictor(api.client()).evict(PodRef("web/web-1", "uid-1"))
    assert got.outcome == outcome == outcome_of(status)
    if status == 429:
        assert "disruption budget" in got.message
    path, body = api.seen[-1]
    assert path == "/api/v1/namespaces/web/pods/web-1/eviction"
    assert body["apiVersion"] == "policy/v1" and body["kind"] == "Eviction"
    assert body["metadata"] == {"name": "web-1", "namespace": "web"}
    assert body["deleteOptions"]["preconditions"] == {"uid": "uid-1"}


def test_eviction_to_a_closed_port_is_an_error() -> None:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"
    got = ApiEvictor(client.ApiClient(cfg), timeout_s=2).evict(PodRef("web/web-1"))
    assert got.outcome == "error"


def test_events_name_the_pod_and_never_raise(api: Api) -> None:
    ApiEvents(api.client(), host="gpupack-0").emit(
        PodRef("llm/vllm-0", "u-0"), "DefragStarted", "frees room", warning=False)
    path, body = api.seen[-1]
    assert path == "/api/v1/namespaces/llm/events"
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "vllm-0",
                                      "namespace": "llm", "uid": "u-0"}
    assert (body["reason"], body["type"], body["source"]["component"]) == (
        "DefragStarted", "Normal", "gpupack-defrag")
    api.server.shutdown()
    api.server.server_close()
    ApiEvents(api.client(), timeout_s=1).emit(PodRef("llm/vllm-0"), "X", "y", warning=True)


# ---- PodOwners: who recreates a pod, read from the watch --------------------------------

class Sink:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def upsert_node(self, obj: Any) -> bool:
        self.calls.append("upsert_node")
        return True

    def delete_node(self, name: str) -> None:
        self.calls.append("delete_node")

    def upsert_pod(self, obj: Any) -> bool:
        self.calls.append("upsert_pod")
        return True

    def delete_pod(self, key: str) -> None:
        self.calls.append("delete_pod")

    def replace(self, nodes: Any, pods: Any) -> None:
        self.calls.append(f"replace {len(list(pods or []))}")

    def mark_synced(self) -> None:
        self.calls.append("mark_synced")

    def note_bad_object(self) -> None:
        self.calls.append("note_bad_object")


def pod(name: str, owner: str | None = None, terminating: bool = False,
        refs: Any = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "web"}
    if owner is not None:
        kind, _, oname = owner.partition("/")
        meta["ownerReferences"] = [{"kind": kind, "name": oname, "controller": True}]
    if refs is not None:
        meta["ownerReferences"] = refs
    if terminating:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta}


def test_pod_owners_follow_the_watch_and_forward_everything() -> None:
    sink = Sink()
    owners = PodOwners(sink)
    owners.replace([], [pod("rs-1", "ReplicaSet/web-7d"), pod("bare"),
                        pod("ds-1", "DaemonSet/agent"), pod("bad", refs="nope")])
    ev = owners.evictability()
    assert dict(ev.recreated_by) == {"web/rs-1": "ReplicaSet/web-7d"}
    assert ev.blocked["web/bare"] == "without a controller that recreates them"
    assert "DaemonSet" in ev.blocked["web/ds-1"]
    assert ev.blocked["web/bad"].startswith("with unreadable owners")
    owners.upsert_pod(pod("rs-1", "ReplicaSet/web-7d", terminating=True))
    assert owners.evictability().blocked["web/rs-1"] == "already terminating"
    owners.delete_pod("web/rs-1")
    owners.replace(None, [pod("sts-0", "StatefulSet/db")])
    ev = owners.evictability({"web/sts-0": "refused by the API server lately"})
    assert dict(ev.recreated_by) == {"web/sts-0": "StatefulSet/db"}
    assert dict(ev.blocked) == {"web/sts-0": "refused by the API server lately"}
    owners.upsert_node({})
    owners.delete_node("n")
    owners.mark_synced()
    owners.note_bad_object()
    assert sink.calls == ["replace 4", "upsert_pod", "delete_pod", "replace 1", "upsert_node",
                          "delete_node", "mark_synced", "note_bad_object"]


# ---- connections: answers read only for their status are finished (kube.responses) ----


def test_evictions_events_and_binds_reuse_one_connection(api: Api) -> None:
    c = api.client()
    evictor, events, binder = ApiEvictor(c), ApiEvents(c, host="h"), ApiBinder(c)
    for i in range(8):
        pod = PodRef(f"web/web-{i}", f"uid-{i}")
        assert evictor.evict(pod).outcome == "evicted"
        events.emit(pod, "Moved", "moved for a group")
        binder.bind("web", f"web-{i}", f"uid-{i}", "node-a", {"gpupack.io/gpus": "0"})
    assert len(api.seen) == 24
    # One call at a time: every call finds the last one's connection back in the pool.
    assert api.connections == 1


class Answer:
    def __init__(self, fail_read: bool = False) -> None:
        self.fail_read = fail_read
        self.calls: list[str] = []

    def read(self) -> bytes:
        self.calls.append("read")
        if self.fail_read:
            raise OSError("connection reset")
        return b"{}"

    def release_conn(self) -> None:
        self.calls.append("release")


@pytest.mark.parametrize("fail_read", [False, True])
def test_finish_reads_then_releases_even_when_the_read_fails(fail_read: bool) -> None:
    a = Answer(fail_read)
    finish(a)
    assert a.calls == ["read", "release"]


def test_finish_takes_answers_without_a_body() -> None:
    finish(None)
    finish(object())
