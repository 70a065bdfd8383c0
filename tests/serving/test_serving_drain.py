"""The two event loops' shared parts (serving.gate.drain, serving.gate.late_answer) on
real sockets."""

from __future__ import annotations

import socket

from serving.gate import ByteBudget, Gate, Limits, drain, late_answer


def pair() -> tuple[socket.socket, socket.socket]:
    server, client = socket.socketpair()
    server.setblocking(False)
    return server, client


def test_drain_waits_while_the_client_is_open_and_silent() -> None:
    server, client = pair()
    with server, client:
        assert drain(server) is False


def test_drain_drops_what_is_sent_and_waits_for_more() -> None:
    server, client = pair()
    with server, client:
        client.sendall(b"x" * 100_000)
        assert drain(server) is False
        assert drain(server) is False  # everything dropped, the client still open


def test_drain_is_over_when_the_client_closes() -> None:
    server, client = pair()
    with server:
        client.sendall(b"late bytes")
        client.close()
        assert drain(server) is True


def test_late_answer_is_408_once_the_request_began() -> None:
    server, client = pair()
    with server, client:
        g = Gate(server, Limits(), ByteBudget(1 << 20), 0.0)  # a new connection: begun
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # head not finished
        g.step(0.0)
        answer = late_answer(g)
        assert answer is not None and answer.startswith(b"HTTP/1.1 408 ")
        g.release()


def test_late_answer_is_nothing_on_an_idle_kept_alive_connection() -> None:
    server, client = pair()
    with server, client:
        g = Gate(server, Limits(), ByteBudget(1 << 20), 0.0, idle=True)
        g.step(0.0)
        assert late_answer(g) is None
        client.sendall(b"G")  # a first byte: the next request has begun
        g.step(0.0)
        assert late_answer(g) is not None
        g.release()


def test_late_answer_is_nothing_during_the_tls_handshake() -> None:
    server, client = pair()
    with server, client:
        g = Gate(server, Limits(), ByteBudget(1 << 20), 0.0, handshake=True)
        assert late_answer(g) is None
