"""Calls that read only the status of their answer (Bindings, Evictions, Events) hand
their connection back to the client's pool: a run of them over one keep-alive API
server reuses one connection instead of opening one per call (kube.responses.finish)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kube.evictions import ApiEvents, ApiEvictor, PodRef
from kube.responses import finish
from kube.source import ApiBinder


class KeepAliveApi:
    """Answers every POST with 201 and a Status over HTTP/1.1 keep-alive; counts the
    TCP connections clients open."""

    def __init__(self) -> None:
        self.connections = 0
        self.posts = 0
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with lock:
                    api.connections += 1

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    api.posts += 1
                data = json.dumps({"kind": "Status", "apiVersion": "v1",
                                   "status": "Success", "padding": "x" * 4096}).encode()
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def client(self) -> Any:
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = f"http://127.0.0.1:{self.server.server_address[1]}"
        return client.ApiClient(cfg)


@pytest.fixture
def api() -> Iterator[KeepAliveApi]:
    a = KeepAliveApi()
    yield a
    a.server.shutdown()
    a.server.server_close()


def test_evictions_events_and_binds_reuse_one_connection(api: KeepAliveApi) -> None:
    c = api.client()
    evictor, events, binder = ApiEvictor(c), ApiEvents(c, host="h"), ApiBinder(c)
    for i in range(8):
        pod = PodRef(f"web/web-{i}", f"uid-{i}")
        assert evictor.evict(pod).outcome == "evicted"
        events.emit(pod, "Moved", "moved for a group")
        binder.bind("web", f"web-{i}", f"uid-{i}", "node-a", {"gpupack.io/gpus": "0"})
    assert api.posts == 24
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
