"""The extender's gunicorn worker (gpupack.sticky_worker) against a real server process:
a kept-alive connection's requests, pipelined requests, connections that go idle and
come back, and fairness between busy connections when they outnumber the threads."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import yaml
from sched_builders import node
from serve_process import free_port, serving

from gpupack.sticky_worker import STICKY_S


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    d = tmp_path_factory.mktemp("worker")
    (d / "nodes.yaml").write_text(yaml.safe_dump({"kind": "NodeList",
                                                  "items": [node("gpu-a", gpus=2)]}))
    (d / "pods.yaml").write_text(yaml.safe_dump({"kind": "PodList", "items": []}))
    port = free_port()
    with serving(port, ["--threads", "2", "--nodes", str(d / "nodes.yaml"),
                        "--pods", str(d / "pods.yaml"), "--no-planner",
                        "--log-level", "WARNING"], echo=True):
        yield port


def _echo(conn: http.client.HTTPConnection, body: bytes) -> bytes:
    conn.request("POST", "/echo", body=body)
    resp = conn.getresponse()
    assert resp.status == 200
    return resp.read()


def test_a_kept_alive_connection_is_served_busy_idle_and_busy_again(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for i in range(20):
        assert _echo(conn, b"x" * i) == f'{{"bytes":{i}}}'.encode()
        if i in (5, 12):
            time.sleep(STICKY_S * 3)  # back to the main loop, then served again
    conn.close()


def test_pipelined_requests_are_both_answered(port: int) -> None:
    req = (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
           b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(req)
        data = b""
        deadline = time.monotonic() + 5
        while data.count(b"HTTP/1.1 200") < 2 or not data.endswith(b"}"):
            assert time.monotonic() < deadline, data
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
    assert b'{"bytes":3}' in data and b'"ok":true' in data


def test_busy_connections_beyond_the_threads_all_get_served(port: int) -> None:
    # Two threads, four connections sending back to back for a second: a thread may
    # stay with its connection only while nobody waits, so every connection gets its
    # first answer early instead of after the others stop.
    first: dict[int, float] = {}
    counts: dict[int, int] = {}
    start = time.monotonic()

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        n = 0
        while time.monotonic() - start < 1.0:
            _echo(conn, b"y")
            first.setdefault(k, time.monotonic() - start)
            n += 1
        counts[k] = n
        conn.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert sorted(counts) == [0, 1, 2, 3]
    assert max(first.values()) < 0.5, first
    assert min(counts.values()) * 5 > max(counts.values()), counts
