"""serving.listener.Listener against real sockets on loopback: slow, half-open, idle and
greedy clients are cut at their deadlines or make room, and health answers while every
request thread is busy. Deadlines are shortened so each case takes about a second."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from serving_certs import self_signed

from serving.gate import Limits
from serving.listener import Listener

FAST = Limits(head_s=0.5, body_s=0.5, write_s=0.5, idle_s=1.0, linger_s=0.2,
              max_body=1024 * 1024, max_connections=32, buffer_budget=8 * 1024 * 1024)


class App:
    """/block waits until released; /big answers 64 MiB; others echo the body length."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.blocked = 0

    def __call__(self, env: dict[str, Any], start: Callable[..., Any]) -> list[bytes]:
        path = env["PATH_INFO"]
        if path == "/block":
            self.blocked += 1
            self.release.wait(10)
        body = b"x" * (64 << 20) if path == "/big" else \
            f"{path} {len(env['wsgi.input'].read())}".encode()
        start("200 OK", [("Content-Type", "text/plain")])
        return [body]


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[Listener, App]]]:
    made: list[tuple[Listener, App]] = []

    def make(limits: Limits = FAST, threads: int = 2,
             tls: Callable[[], ssl.SSLContext] | None = None) -> tuple[Listener, App]:
        app = App()
        listener = Listener(app, "127.0.0.1", 0, limits=limits, threads=threads, tls=tls)
        listener.start()
        made.append((listener, app))
        return listener, app

    yield make
    for listener, app in made:
        app.release.set()
        listener.stop()


def request(port: int, method: str = "GET", path: str = "/x", body: bytes | None = None,
            timeout: float = 5.0) -> tuple[int, bytes, float]:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request(method, path, body=body)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data, time.perf_counter() - started


def read_all(s: socket.socket, limit_s: float = 5.0) -> bytes:
    """What the server sends until it closes (or ``limit_s``)."""
    s.settimeout(limit_s)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def test_keep_alive_pipelining_chunked_and_head(serve: Callable[..., tuple[Listener, App]]
                                                ) -> None:
    listener, _ = serve()
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as s:
        s.sendall(b"POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
                  b"POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n"
                  b"HEAD /c HTTP/1.1\r\nConnection: close\r\n\r\n")
        data = read_all(s)
    assert data.count(b"HTTP/1.1 200 OK") == 3
    assert b"/a 3" in data and b"/b 5" in data and b"/c" not in data  # HEAD: no body
    assert data.rstrip().endswith(b"/b 5") or b"Connection: close" in data


def test_a_slow_head_is_cut_at_its_deadline_with_408(serve: Callable[..., tuple[Listener, App]]
                                                     ) -> None:
    listener, _ = serve()
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as s:
        started = time.monotonic()
        s.sendall(b"GET / HTTP/1.1\r\n")
        for _ in range(30):  # a byte every 0.1 s: each read is quick, the whole head is not
            try:
                s.sendall(b"X")
            except OSError:
                break
            time.sleep(0.1)
        data = read_all(s)
        took = time.monotonic() - started
    assert data.startswith(b"HTTP/1.1 408 ")
    assert 0.4 < took < 2.5
    assert listener.timed_out >= 1


def test_a_slow_body_is_cut_at_its_deadline(serve: Callable[..., tuple[Listener, App]]
                                            ) -> None:
    listener, _ = serve()
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as s:
        s.sendall(b"POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\nab")
        started = time.monotonic()
        data = read_all(s)
    assert data.startswith(b"HTTP/1.1 408 ") and time.monotonic() - started < 2.5


def test_a_half_open_tls_client_is_closed_at_the_deadline(
        serve: Callable[..., tuple[Listener, App]], tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    listener, _ = serve(tls=lambda: ctx)
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as s:
        s.sendall(b"\x16\x03\x01")  # three bytes of a ClientHello
        started = time.monotonic()
        assert read_all(s) == b""  # closed without an answer
        assert 0.4 < time.monotonic() - started < 2.5
    client = ssl.create_default_context(cafile=str(cert))
    client.check_hostname = False
    conn = http.client.HTTPSConnection("127.0.0.1", listener.port, context=client, timeout=5)
    conn.request("GET", "/after")
    assert conn.getresponse().read() == b"/after 0"  # a real TLS client is still served


def test_health_answers_while_every_request_thread_is_busy(
        serve: Callable[..., tuple[Listener, App]]) -> None:
    listener, app = serve(threads=2)
    blockers = [threading.Thread(target=request, args=(listener.port, "POST", "/block", b"x"),
                                 kwargs={"timeout": 15}) for _ in range(3)]
    for t in blockers:
        t.start()
    deadline = time.monotonic() + 5
    while app.blocked < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert app.blocked == 2  # both request threads are stuck; a third request waits
    status, body, took = request(listener.port, path="/healthz")
    assert (status, body) == (200, b"/healthz 0") and took < 0.5
    app.release.set()
    for t in blockers:
        t.join(10)


def test_more_idle_clients_than_the_cap_cannot_lock_a_real_client_out(
        serve: Callable[..., tuple[Listener, App]]) -> None:
    listener, _ = serve()  # max_connections 32
    idle = [socket.create_connection(("127.0.0.1", listener.port)) for _ in range(64)]
    try:
        time.sleep(0.1)
        status, body, took = request(listener.port, path="/real")
        assert (status, body) == (200, b"/real 0") and took < 0.5
        assert listener.evicted >= 32 and len(listener.conns) <= 32
    finally:
        for s in idle:
            s.close()


def test_a_declared_body_over_the_limit_is_refused_unread(
        serve: Callable[..., tuple[Listener, App]]) -> None:
    listener, _ = serve()
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as s:
        s.sendall(b"POST / HTTP/1.1\r\nContent-Length: 150000000\r\n\r\n")
        started = time.monotonic()
        data = read_all(s)
    assert data.startswith(b"HTTP/1.1 413 ") and time.monotonic() - started < 0.5


def test_bodies_buffered_at_once_are_bounded_by_the_budget(
        serve: Callable[..., tuple[Listener, App]]) -> None:
    limits = Limits(head_s=2, body_s=2, max_body=1024 * 1024, buffer_budget=1024 * 1024)
    listener, _ = serve(limits=limits)
    socks = []
    try:
        for _ in range(4):  # 4 x 400 kB unfinished bodies against a 1 MiB budget
            s = socket.create_connection(("127.0.0.1", listener.port), timeout=5)
            s.sendall(b"POST / HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n" + b"a" * 400_000)
            socks.append(s)
            time.sleep(0.1)
        answers = [read_all(s, 3.0) for s in socks]
    finally:
        for s in socks:
            s.close()
    assert sum(a.startswith(b"HTTP/1.1 503 ") for a in answers) >= 2
    assert listener.budget.used == 0  # all given back


def test_a_client_that_does_not_read_its_answer_frees_the_thread(
        serve: Callable[..., tuple[Listener, App]]) -> None:
    listener, _ = serve(threads=1)
    greedy = socket.create_connection(("127.0.0.1", listener.port))
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        greedy.sendall(b"GET /big HTTP/1.1\r\n\r\n")  # 64 MiB it never reads
        time.sleep(0.2)
        status, body, took = request(listener.port, path="/next", timeout=5)
        assert (status, body) == (200, b"/next 0") and took < 2.0  # after write_s
    finally:
        greedy.close()
