"""A WSGI listener in a thread of the calling process: one event loop, bounded threads.

For the servers that run beside something else in one process (the extender's metrics
port and webhook, the node agent's metrics). The loop thread accepts, does TLS
handshakes and reads each request whole through a :class:`serving.gate.Gate`; a complete
request goes to one of ``threads`` request threads, or, for the health paths, to a
thread of its own (so ``/healthz`` answers while every request thread is busy). The
thread writes the answer with a timeout and hands a kept-alive connection back to the
loop. At ``max_connections`` the oldest connection that is idle or still unfinished is
closed to make room, so a flood of half-open connections cannot lock out a real client.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from serving.client_auth import peer_certificate
from serving.gate import (
    HEALTH_PATHS,
    ByteBudget,
    Closed,
    Gate,
    Limits,
    Ready,
    Refused,
    Step,
    Wait,
    drain,
    error_response,
    late_answer,
    send_nowait,
)
from serving.wsgi import WSGIApp, call, environ, response

log = logging.getLogger("gpupack.serving")

Clock = Callable[[], float]


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    client: tuple[str, int]
    accepted: float
    gate: Gate | None = None  # reading a request
    linger_until: float | None = None  # closing: dropping what the client still sends
    serving: bool = False


class Listener:
    """``app`` on ``host:port`` (TLS when ``tls`` gives a context per connection)."""

    def __init__(self, app: WSGIApp, host: str, port: int, *, limits: Limits | None = None,
                 threads: int = 4, tls: Callable[[], ssl.SSLContext] | None = None,
                 name: str = "gpupack-http", health_paths: frozenset[str] = HEALTH_PATHS,
                 clock: Clock = time.monotonic) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        self.app = app
        self.limits = limits or Limits()
        self.tls = tls
        self.name = name
        self.health_paths = health_paths
        self.clock = clock
        self.sock = socket.create_server((host, port), backlog=1024)
        self.sock.setblocking(False)
        self.budget = ByteBudget(self.limits.buffer_budget)
        self.conns: dict[socket.socket, _Conn] = {}
        self.evicted = 0  # connections closed to make room (for tests and logs)
        self.timed_out = 0  # connections cut at a deadline
        self._sel = selectors.DefaultSelector()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
        self._lane = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-health")
        self._back: queue.SimpleQueue[tuple[_Conn, bool, bytes]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._running = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def address(self) -> tuple[str, int]:
        name = self.sock.getsockname()
        return str(name[0]), int(name[1])

    def start(self) -> None:
        self._running = True
        self._thread.start()

    def stop(self) -> None:
        self._running = False
        self._wake()
        if self._thread.is_alive():
            self._thread.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._lane.shutdown(wait=False, cancel_futures=True)

    # ---- loop thread -------------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _loop(self) -> None:
        sel = self._sel
        sel.register(self.sock, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while self._running:
                for key, _ in sel.select(self._next_timeout()):
                    if key.fileobj is self.sock:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        self._ready(key.data)
                self._take_back()
                self._expire()
        except Exception:
            log.exception("%s: event loop failed", self.name)
        finally:
            for conn in list(self.conns.values()):
                self._close(conn)
            sel.close()
            self.sock.close()
            self._wake_r.close()
            self._wake_w.close()

    def _next_timeout(self) -> float:
        now = self.clock()
        soonest = now + 1.0
        for conn in self.conns.values():
            if conn.gate is not None:
                soonest = min(soonest, conn.gate.deadline)
            elif conn.linger_until is not None:
                soonest = min(soonest, conn.linger_until)
        return max(0.0, soonest - now)

    def _accept(self) -> None:
        for _ in range(64):  # bounded, so a flood of connects cannot starve the rest
            try:
                sock, client = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("%s: accept failed: %s", self.name, e)
                return
            if len(self.conns) >= self.limits.max_connections and not self._evict():
                sock.close()  # every connection is being served: no room
                continue
            sock.setblocking(False)
            # Answers are written whole; without this, one written after the TLS session
            # tickets waits for the client's delayed ACK (40 ms) behind Nagle.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            now = self.clock()
            handshake = False
            if self.tls is not None:
                try:
                    sock = self.tls().wrap_socket(sock, server_side=True,
                                                  do_handshake_on_connect=False)
                except (OSError, ssl.SSLError) as e:
                    log.warning("%s: no TLS context: %s", self.name, e)
                    sock.close()
                    continue
                handshake = True
            conn = _Conn(sock, client, now)
            conn.gate = Gate(sock, self.limits, self.budget, now, handshake=handshake,
                             oversize="refuse")
            self.conns[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _evict(self) -> bool:
        """Close the connection that is lingering, idle the longest, or has been
        reading its request the longest; False when every one is being served."""
        victim: _Conn | None = None
        rank: tuple[int, float] | None = None
        for conn in self.conns.values():
            if conn.serving:
                continue
            if conn.linger_until is not None:
                r = (0, conn.linger_until)
            elif conn.gate is not None and not conn.gate.started:
                r = (1, conn.gate.deadline)
            elif conn.gate is not None:
                r = (2, conn.accepted)
            else:
                continue
            if rank is None or r < rank:
                victim, rank = conn, r
        if victim is None:
            return False
        self.evicted += 1
        self._close(victim)
        return True

    def _ready(self, conn: _Conn) -> None:
        if conn.linger_until is not None:
            self._drain(conn)
            return
        gate = conn.gate
        if gate is None:
            return
        self._after(conn, gate.step(self.clock()))

    def _after(self, conn: _Conn, step: Step) -> None:
        gate = conn.gate
        assert gate is not None
        if isinstance(step, Wait):
            self._sel.modify(conn.sock, selectors.EVENT_WRITE if step.writable
                             else selectors.EVENT_READ, conn)
            return
        gate.release()
        conn.gate = None
        if isinstance(step, Closed):
            self._close(conn)
        elif isinstance(step, Refused):
            send_nowait(conn.sock, error_response(step.status, step.why))
            self._linger(conn)
        else:
            self._dispatch(conn, step)

    def _dispatch(self, conn: _Conn, ready: Ready) -> None:
        self._sel.unregister(conn.sock)
        conn.serving = True
        head = ready.head
        lane = head.method in ("GET", "HEAD") and head.path in self.health_paths
        (self._lane if lane else self._pool).submit(self._serve, conn, ready)

    def _take_back(self) -> None:
        while True:
            try:
                conn, keep, extra = self._back.get_nowait()
            except queue.Empty:
                return
            conn.serving = False
            if not keep or not self._running:
                self._linger(conn)
                continue
            now = self.clock()
            conn.sock.setblocking(False)
            conn.gate = Gate(conn.sock, self.limits, self.budget, now, idle=True,
                             buffered=extra, oversize="refuse")
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)
            if extra:  # a pipelined request already read: the socket may not signal it
                self._after(conn, conn.gate.step(now))

    def _expire(self) -> None:
        now = self.clock()
        for conn in list(self.conns.values()):
            if conn.linger_until is not None and now >= conn.linger_until:
                self._close(conn)
            elif conn.gate is not None and now >= conn.gate.deadline:
                gate = conn.gate
                gate.release()
                conn.gate = None
                self.timed_out += 1
                answer = late_answer(gate)
                if answer is not None:
                    send_nowait(conn.sock, answer)
                    self._linger(conn)
                else:
                    self._close(conn)

    def _linger(self, conn: _Conn) -> None:
        """Half-close and drop what the client still sends for a moment, so the answer
        is not lost to a reset (RFC 9112 9.6), without a thread waiting on it."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.linger_until = self.clock() + self.limits.linger_s
        try:
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        except KeyError:
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)

    def _drain(self, conn: _Conn) -> None:
        if drain(conn.sock):
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if conn.gate is not None:
            conn.gate.release()
            conn.gate = None
        self.conns.pop(conn.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()

    # ---- request threads ---------------------------------------------------------------

    def _serve(self, conn: _Conn, ready: Ready) -> None:
        keep = False
        try:
            head = ready.head
            sock = conn.sock
            sock.settimeout(self.limits.write_s)  # blocking, bounded
            scheme = "https" if self.tls is not None else "http"
            env = environ(head, ready.body, server=self.address(), client=conn.client,
                          scheme=scheme, peer_cert=peer_certificate(sock))
            try:
                status, headers, body = call(self.app, env)
            except Exception:
                log.exception("%s: %s %s failed", self.name, head.method, head.path)
                status, headers, body = ("500 Internal Server Error",
                                         [("Content-Type", "text/plain")], b"internal error\n")
            keep = ready.complete and head.keep_alive and self._running
            sock.sendall(response(status, headers, body, head_only=head.method == "HEAD",
                                  keep_alive=keep))
        except (OSError, ssl.SSLError):
            keep = False  # the client went away or did not read its answer in time
        except Exception:
            log.exception("%s: serving a request failed", self.name)
            keep = False
        finally:
            self._back.put((conn, keep, ready.extra))
            self._wake()


def bind_error(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (None: it can). Checked before a server
    starts: a listener that fails inside the worker would make gunicorn restart the
    worker for ever."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return f"cannot listen on {host}:{port}: {e.strerror or e}"
    return None
