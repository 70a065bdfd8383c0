"""The gated gunicorn workers (serving.gunicorn_worker, gpupack.sticky_worker) in a real
gunicorn process: threads only see whole requests, so slow and half-open clients are
cut by the main loop, and health answers while every thread is busy."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module", params=["gated", "sticky"])
def port(request: pytest.FixtureRequest) -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "gunicorn_harness.py"), str(port),
                             request.param, "2"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (
                    proc.stdout.read() if proc.stdout else b"")
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def get(port: int, path: str, method: str = "GET", body: bytes | None = None,
        timeout: float = 10.0) -> tuple[int, bytes, float]:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request(method, path, body=body)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data, time.perf_counter() - started


def read_all(s: socket.socket, limit_s: float = 5.0) -> bytes:
    s.settimeout(limit_s)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def test_health_answers_while_both_threads_are_busy(port: int) -> None:
    busy = [threading.Thread(target=get, args=(port, "/block?2")) for _ in range(3)]
    for t in busy:
        t.start()
    time.sleep(0.3)  # both threads asleep in the app, a third request queued
    status, body, took = get(port, "/healthz")
    assert (status, body) == (200, b"/healthz 0") and took < 0.5
    for t in busy:
        t.join(10)


def test_scrapes_have_a_thread_of_their_own(port: int) -> None:
    scrapes = [threading.Thread(target=get, args=(port, "/metrics?1")) for _ in range(4)]
    for t in scrapes:
        t.start()
    time.sleep(0.2)  # one scrape in its thread, three queued behind it
    for _ in range(3):
        status, body, took = get(port, "/verb", "POST", b"ab")
        assert (status, body) == (200, b"/verb 2") and took < 0.5
    for t in scrapes:
        t.join(10)


def test_slow_and_half_open_clients_hold_no_thread_and_are_cut(port: int) -> None:
    crowd = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
    try:
        for i, s in enumerate(crowd):  # slow heads, slow bodies, 3 bytes of a ClientHello
            s.sendall([b"GET / HTTP/1.1\r\nX-Slow: a",
                       b"POST /x HTTP/1.1\r\nContent-Length: 1000\r\n\r\nab",
                       b"\x16\x03\x01"][i % 3])
        time.sleep(0.2)
        for _ in range(5):  # more clients than threads (2), all still stalled
            status, body, took = get(port, "/real", "POST", b"abc")
            assert (status, body) == (200, b"/real 3") and took < 0.5
        started = time.monotonic()
        answers = [read_all(s, 4.0) for s in crowd]
        assert time.monotonic() - started < 3.5  # all cut within the 1 s deadlines
        assert sum(a.startswith(b"HTTP/1.1 408 ") for a in answers) >= 26
    finally:
        for s in crowd:
            s.close()


def test_a_body_over_the_limit_is_answered_unread_and_the_connection_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST /size HTTP/1.1\r\nContent-Length: 150000000\r\n\r\n")
        started = time.monotonic()
        data = read_all(s)  # the server closes: it never reads the announced body
    assert data.startswith(b"HTTP/1.1 413 ") and time.monotonic() - started < 1.0


def test_kept_alive_connection_served_again_and_a_slow_next_request_frees_the_thread(
        port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for i in range(5):
        conn.request("POST", "/k", body=b"x" * i)
        assert conn.getresponse().read() == f"/k {i}".encode()
    sock = conn.sock
    assert sock is not None
    sock.sendall(b"POST /k HTTP/1.1\r\nContent-Len")  # the next request stalls
    others = [get(port, "/other") for _ in range(4)]
    assert all(s == 200 and took < 0.5 for s, _, took in others)
    assert read_all(sock, 3.0).startswith(b"HTTP/1.1 408 ")
    conn.close()


def test_a_client_that_never_closes_does_not_hold_up_the_main_loop(port: int) -> None:
    # Answers that close the connection are drained by the main loop without blocking it.
    lingerers = []
    for _ in range(10):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /bye HTTP/1.1\r\nConnection: close\r\n\r\n")
        lingerers.append(s)
    try:
        time.sleep(0.1)
        status, _, took = get(port, "/after")
        assert status == 200 and took < 0.5
    finally:
        for s in lingerers:
            s.close()
