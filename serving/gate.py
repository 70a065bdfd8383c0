"""One connection read without blocking until its whole request is in, under a deadline.

:class:`Gate` is driven by an event loop: the loop calls :meth:`Gate.step` whenever the
socket is ready (and checks :attr:`Gate.deadline` on every turn). A step does the TLS
handshake (if any), reads what the kernel has, and says what next: wait for the socket,
hand the complete request to a thread (:class:`Ready`), answer an error and close
(:class:`Refused`), or close (:class:`Closed`).

Deadlines (:class:`Limits`): a new connection has ``head_s`` for its TLS handshake and
request head together (a ClientHello that stops after three bytes is cut there); a kept-
alive one may stay idle for ``idle_s``, then has ``head_s`` from its first byte; a body
has ``body_s`` more from the end of the head. Bytes buffered by all the gates of one
listener are bounded by a :class:`ByteBudget`, so slow bodies cannot exhaust memory either.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import ssl
from dataclasses import dataclass

from serving.head import END_OF_HEAD, ChunkedBody, Head, HeadError, parse_head

HEALTH_PATHS = frozenset({"/healthz", "/readyz", "/livez"})


@dataclass(frozen=True)
class Limits:
    head_s: float = 5.0  # TLS handshake + request head, from accept (or from the first byte)
    body_s: float = 10.0  # the body, from the end of the head
    write_s: float = 10.0  # each response write (a client that does not read is cut)
    idle_s: float = 75.0  # a kept-alive connection between requests
    linger_s: float = 2.0  # reading (and dropping) what a client still sends after a close
    max_head: int = 64 * 1024
    max_body: int = 8 * 1024 * 1024
    max_connections: int = 256  # per listener; the oldest idle or unfinished one makes room
    buffer_budget: int = 64 * 1024 * 1024  # bytes all unfinished requests of a listener hold

    def __post_init__(self) -> None:
        for name in ("head_s", "body_s", "write_s", "idle_s", "linger_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Limits.{name} must be positive, not {getattr(self, name)!r}")
        for name in ("max_head", "max_body", "max_connections", "buffer_budget"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be at least 1, not {getattr(self, name)!r}")


class ByteBudget:
    """Bytes held by the unfinished requests of one listener (one event-loop thread uses
    it, so no lock)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


@dataclass(frozen=True)
class Ready:
    """A request to serve. ``data``: every byte read (the request, then any pipelined
    bytes); ``body``: its decoded body (chunked coding removed) when ``complete``;
    ``extra``: bytes after it. Not ``complete``: the declared body is over the limit and
    was not read (only the head is in ``data``); the connection must close after it."""

    head: Head
    data: bytes
    body: bytes
    extra: bytes
    complete: bool


@dataclass(frozen=True)
class Refused:
    status: int  # answered with this status and Connection: close
    why: str


@dataclass(frozen=True)
class Closed:
    """Nothing to answer: the client went away, or the TLS handshake failed."""

    why: str


class Wait:
    """Not done: wait until the socket is readable (or writable, mid-handshake)."""

    def __init__(self, writable: bool = False) -> None:
        self.writable = writable


READ = Wait(False)
WRITE = Wait(True)
Step = Ready | Refused | Closed | Wait

_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError)


class Gate:
    def __init__(self, sock: socket.socket, limits: Limits, budget: ByteBudget, now: float, *,
                 handshake: bool = False, buffered: bytes = b"", idle: bool = False,
                 oversize: str = "refuse") -> None:
        """``sock``: non-blocking (an SSLSocket not yet handshaken when ``handshake``).
        ``idle``: a kept-alive connection, which may wait ``idle_s`` for its first byte.
        ``oversize``: a declared body over ``max_body`` is refused here with 413
        ("refuse") or handed on unread (``Ready(complete=False)``, "dispatch") so the
        application answers it."""
        self.sock = sock
        self.limits = limits
        self.budget = budget
        self.handshaking = handshake
        self.oversize = oversize
        self.buf = bytearray()
        self.held = 0  # bytes of self.buf counted in the budget
        self.head: Head | None = None
        self.started = not idle or bool(buffered)
        self.deadline = now + (limits.head_s if self.started else limits.idle_s)
        self.continued = False
        self.scanned = 0  # bytes already searched for the end of the head
        self.chunked: ChunkedBody | None = None
        if buffered:
            self.buf += buffered  # already counted by whoever read them

    def release(self) -> None:
        """Give the buffered bytes back to the budget (the gate is done or dropped)."""
        self.budget.give(self.held)
        self.held = 0

    def step(self, now: float) -> Step:
        if self.handshaking:
            try:
                self.sock.do_handshake()  # type: ignore[attr-defined]
            except ssl.SSLWantReadError:
                return READ
            except ssl.SSLWantWriteError:
                return WRITE
            except (ssl.SSLError, OSError) as e:
                return Closed(f"TLS handshake failed: {e}")
            self.handshaking = False
        got = self._read()
        if isinstance(got, Closed | Refused):
            return got
        if got and not self.started:
            self.started = True
            self.deadline = now + self.limits.head_s
        if not self.buf:
            return READ
        try:
            return self._parse(now)
        except HeadError as e:
            return Refused(e.status, str(e))

    def _read(self) -> int | Closed | Refused:
        total = 0
        while True:
            try:
                chunk = self.sock.recv(256 * 1024)
            except _WOULD_BLOCK:
                return total
            except ssl.SSLWantWriteError:
                return total
            except (ssl.SSLError, OSError) as e:
                if isinstance(e, OSError) and e.errno == errno.EINTR:
                    continue
                return Closed(f"read failed: {e}")
            if not chunk:
                if self.buf:
                    return Closed("client closed in the middle of a request")
                return Closed("client closed")
            if not self.budget.take(len(chunk)):
                return Refused(503, "server busy: too many unfinished requests buffered")
            self.held += len(chunk)
            self.buf += chunk
            total += len(chunk)
            if len(self.buf) > self.limits.max_head + self.limits.max_body:
                return total  # enough to decide: no request of ours is that long

    def _parse(self, now: float) -> Step:
        limits = self.limits
        buf = self.buf
        if self.head is None:
            while buf.startswith(b"\r\n"):  # RFC 9112 2.2: empty lines before a request
                del buf[:2]
            end = buf.find(END_OF_HEAD, max(0, self.scanned - 3))
            self.scanned = len(buf)
            if end < 0:
                if len(buf) > limits.max_head:
                    raise HeadError(431, f"request head over {limits.max_head} bytes")
                return READ
            head = parse_head(bytes(buf[:end + 4]), limits.max_head)
            assert head is not None  # it ends with the blank line just found
            self.head = head
            self.deadline = now + limits.body_s
            if head.chunked:
                self.chunked = ChunkedBody(head.size, limits.max_body)
        head = self.head
        if self.chunked is not None:
            if not self.chunked.feed(buf):
                self._continue(head)
                return READ
            stop = self.chunked.end
            assert stop is not None
            data = bytes(buf)
            return Ready(head, data, self.chunked.body, data[stop:], True)
        length = head.content_length or 0
        if length > limits.max_body:
            if self.oversize == "refuse":
                return Refused(413, f"body of {length} bytes is over the limit of "
                                    f"{limits.max_body}")
            return Ready(head, bytes(buf[:head.size]), b"", b"", False)
        end = head.size + length
        if len(buf) < end:
            self._continue(head)
            return READ
        data = bytes(buf)
        return Ready(head, data, data[head.size:end], data[end:], True)

    def _continue(self, head: Head) -> None:
        """Answer ``Expect: 100-continue`` once (curl waits a second for it otherwise)."""
        if self.continued or head.version != "HTTP/1.1":
            return
        self.continued = True
        if any(k == "expect" and v.lower() == "100-continue" for k, v in head.headers):
            # Best effort: the client sends the body anyway after its own wait.
            send_nowait(self.sock, b"HTTP/1.1 100 Continue\r\n\r\n")


def error_response(status: int, why: str) -> bytes:
    """A short HTTP/1.1 answer that closes the connection."""
    reasons = {400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large",
               431: "Request Header Fields Too Large", 501: "Not Implemented",
               503: "Service Unavailable", 505: "HTTP Version Not Supported"}
    body = (why + "\n").encode("utf-8", "replace")
    return (f"HTTP/1.1 {status} {reasons.get(status, 'Error')}\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode("latin-1") + body


def send_nowait(sock: socket.socket, data: bytes) -> None:
    """Best effort from the event loop: what the kernel takes at once (a short error
    answer always fits an empty send buffer)."""
    with contextlib.suppress(OSError, ssl.SSLError):
        sock.send(data)


def raw_recv(sock: socket.socket, n: int) -> bytes:
    """Read the TCP stream under a TLS socket (to drop it while lingering)."""
    return socket.socket.recv(sock, n)


def drain(sock: socket.socket) -> bool:
    """Drop what a lingering client still sends, without blocking: True when that is over
    (the client closed its side, or the socket failed), False while more may come (the
    next read event, or the linger deadline, ends it)."""
    for _ in range(16):
        try:
            data = raw_recv(sock, 65536)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        if not data:
            return True
    return False


def late_answer(gate: Gate) -> bytes | None:
    """What a connection whose request missed its deadline is told before it closes: 408
    once the request has begun (TLS handshake done); nothing (a plain close) before."""
    if gate.started and not gate.handshaking:
        return error_response(408, "request not received in time")
    return None
