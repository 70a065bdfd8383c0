"""``/metrics`` behind delegated authentication on real sockets: the extender's
``--metrics-port`` listener (scheduler.extender.metrics_http) and the node agent's listener, each
with a :class:`serving.metrics_auth.ScrapeGuard` over fake reviews (the real ones are
``kube.delegated_auth``, exercised against a real API server in
tests/e2e/test_e2e_metrics_auth.py)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry, Counter

from scheduler.extender.metrics_http import MetricsServer
from serving.metrics_auth import ScrapeGuard

BODY = b"# HELP gpupack_probe_total a probe\ngpupack_probe_total 1.0\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Who:
    username: str


@dataclass
class FakeApiServer:
    """The answers of TokenReview / SubjectAccessReview, and whether the API server is
    down (raises) or hangs (blocks until released)."""

    tokens: dict[str, Who] = field(default_factory=lambda: {
        "prom-token": Who("system:serviceaccount:monitoring:prometheus"),
        "nosy-token": Who("system:serviceaccount:default:nosy")})
    allowed: set[str] = field(default_factory=lambda: {
        "system:serviceaccount:monitoring:prometheus"})
    down: bool = False
    hang: threading.Event | None = None
    token_reviews: int = 0
    access_reviews: int = 0

    def authenticate(self, token: str) -> Who | None:
        self.token_reviews += 1
        if self.hang is not None:
            self.hang.wait(10)
        if self.down:
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        return self.tokens.get(token)

    def authorize(self, who: Who, path: str, verb: str) -> bool:
        self.access_reviews += 1
        if self.down:
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        return who.username in self.allowed and (path, verb) == ("/metrics", "get")


def request(port: int, path: str, token: str | None = None, header: str | None = None
            ) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if header is not None:
        headers["Authorization"] = header
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.fixture()
def api() -> FakeApiServer:
    return FakeApiServer()


@pytest.fixture()
def extender_metrics(api: FakeApiServer) -> Iterator[int]:
    guard = ScrapeGuard(api.authenticate, api.authorize)
    server = MetricsServer(lambda: BODY, "127.0.0.1", free_port(), ready=lambda: True,
                           guard=guard)
    server.start()
    try:
        yield server.port
    finally:
        server.stop()


@pytest.mark.parametrize(("token", "header", "status", "error"), [
    (None, None, 401, "needs 'Authorization: Bearer <token>'"),
    (None, "Basic cHJvbTpwdw==", 401, "needs 'Authorization: Bearer <token>'"),
    ("forged", None, 401, "the token is not valid"),
    ("nosy-token", None, 403,
     'forbidden: User "system:serviceaccount:default:nosy" cannot get path "/metrics"'),
])
def test_refused_scrapes(extender_metrics: int, token: str | None, header: str | None,
                         status: int, error: str) -> None:
    got, headers, body = request(extender_metrics, "/metrics", token, header)
    assert got == status
    assert headers["content-type"] == "application/json"
    assert error in json.loads(body)["error"]
    assert b"gpupack_probe_total" not in body
    if status == 401:
        assert headers["www-authenticate"].startswith("Bearer")


def test_allowed_scrape_and_open_health(extender_metrics: int, api: FakeApiServer) -> None:
    status, headers, body = request(extender_metrics, "/metrics", "prom-token")
    assert (status, body) == (200, BODY)
    assert headers["content-type"].startswith("text/plain")
    # The kubelet's probes carry no token.
    assert request(extender_metrics, "/healthz")[0] == 200
    assert json.loads(request(extender_metrics, "/readyz")[2]) == {"ready": True}
    assert (api.token_reviews, api.access_reviews) == (1, 1)  # the probes asked nothing


def test_scrapes_reuse_the_reviews(extender_metrics: int, api: FakeApiServer) -> None:
    for _ in range(20):
        assert request(extender_metrics, "/metrics", "prom-token")[0] == 200
        assert request(extender_metrics, "/metrics", "nosy-token")[0] == 403
    assert (api.token_reviews, api.access_reviews) == (2, 2)


def test_api_server_down_is_503_and_the_server_carries_on(extender_metrics: int,
                                                          api: FakeApiServer) -> None:
    api.down = True
    status, headers, body = request(extender_metrics, "/metrics", "prom-token")
    assert status == 503 and headers["retry-after"]
    assert "TokenReview failed" in json.loads(body)["error"]
    assert request(extender_metrics, "/healthz")[0] == 200
    api.down = False  # back: the failure was not cached
    assert request(extender_metrics, "/metrics", "prom-token")[0] == 200


def test_health_answers_while_a_review_hangs(extender_metrics: int,
                                             api: FakeApiServer) -> None:
    """Both request threads stuck in a slow TokenReview: the probes still answer."""
    api.hang = threading.Event()
    results: list[int] = []
    scrapers = [threading.Thread(target=lambda t=t: results.append(
        request(extender_metrics, "/metrics", t)[0])) for t in ("a", "b")]
    for s in scrapers:
        s.start()
    try:
        deadline = time.monotonic() + 5
        while api.token_reviews < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert api.token_reviews == 2
        started = time.monotonic()
        assert request(extender_metrics, "/healthz")[0] == 200
        assert request(extender_metrics, "/readyz")[0] == 200
        assert time.monotonic() - started < 1.0
    finally:
        api.hang.set()
        for s in scrapers:
            s.join(10)
    assert results == [401, 401]


def test_node_agent_metrics_guarded(api: FakeApiServer) -> None:
    from nodeagent.metrics import serve_metrics

    registry = CollectorRegistry()
    Counter("gpupack_probe", "a series of this registry", registry=registry).inc()
    listener = serve_metrics(registry, free_port(), host="127.0.0.1", ready=lambda: True,
                             guard=ScrapeGuard(api.authenticate, api.authorize))
    try:
        port = listener.port
        assert request(port, "/metrics")[0] == 401
        assert request(port, "/metrics", "nosy-token")[0] == 403
        status, _, body = request(port, "/metrics", "prom-token")
        assert status == 200 and b"gpupack_probe_total 1.0" in body
        assert [request(port, p)[0] for p in ("/healthz", "/readyz")] == [200, 200]
    finally:
        listener.stop()


def test_without_a_guard_anyone_scrapes() -> None:
    """Static mode and --metrics-auth none: the listener as before."""
    server = MetricsServer(lambda: BODY, "127.0.0.1", free_port())
    server.start()
    try:
        assert request(server.port, "/metrics")[:1] == (200,)
        assert request(server.port, "/metrics", "anything")[2] == BODY
    finally:
        server.stop()
