"""gunicorn's ``gthread`` worker with every request read whole by the main loop first.

The stock worker hands a connection to a pool thread as soon as its first byte arrives
(or after waiting 5 s on the thread for that byte); the thread then reads the TLS
handshake, the head and the body with no timeout. Eight clients that send slowly (as
many as ``--threads``) therefore stop the server, health checks included.

Here the main loop reads each request through a :class:`serving.gate.Gate` (TLS
handshake too, without blocking) under the deadlines of :attr:`limits`, and a thread is
given only a connection whose whole request is buffered. Health paths go to a thread of
their own, and so do scrapes of ``/metrics``. A thread writes the answer with a timeout.
Connections that close are drained for a moment by the main loop, not a thread. At
``limits.max_connections`` the oldest idle or unfinished connection is closed to make
room for a new one.

Configure by subclassing (:meth:`GatedThreadWorker.configured`): gunicorn builds the
worker from its class, and the settings here are not gunicorn's own.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
import threading
import time
from concurrent import futures
from functools import partial
from typing import Any, ClassVar

from gunicorn import http
from gunicorn import sock as gsock
from gunicorn.workers.gthread import TConn, ThreadWorker

from serving.client_auth import PEER_CERT, peer_certificate
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


class GatedThreadWorker(ThreadWorker):
    """gthread whose threads only ever see complete requests (see the module docstring).

    ``oversize``: "dispatch" hands a request whose declared body is over
    ``limits.max_body`` to the application unread (it answers, the connection then
    closes); "refuse" answers 413 from the main loop."""

    limits: ClassVar[Limits] = Limits()
    oversize: ClassVar[str] = "dispatch"
    health_paths: ClassVar[frozenset[str]] = HEALTH_PATHS
    # Served by one thread of their own too, so scrapes (paced, see
    # scheduler.extender.metrics.Exposition) never take the request threads.
    side_paths: ClassVar[frozenset[str]] = frozenset({"/metrics"})

    @classmethod
    def configured(cls, limits: Limits, oversize: str = "dispatch") -> type[GatedThreadWorker]:
        """A subclass with these settings, to give gunicorn as ``worker_class``."""
        if oversize not in ("dispatch", "refuse"):
            raise ValueError(f"oversize must be dispatch or refuse, not {oversize!r}")
        return type(cls.__name__, (cls,), {"limits": limits, "oversize": oversize,
                                           "__module__": cls.__module__})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # One more than the cap: accepting stays on, and accept() makes room instead.
        self.worker_connections = self.limits.max_connections + 1
        self.budget = ByteBudget(self.limits.buffer_budget)
        self.gates: dict[TConn, Gate] = {}
        self.lingering: dict[TConn, float] = {}
        self.evicted = 0
        self.lane: futures.ThreadPoolExecutor | None = None
        self.side: futures.ThreadPoolExecutor | None = None

    def init_process(self) -> None:
        self.lane = futures.ThreadPoolExecutor(1, thread_name_prefix="gpupack-health")
        self.side = futures.ThreadPoolExecutor(1, thread_name_prefix="gpupack-scrape")
        super().init_process()  # runs the loop

    # ---- main loop --------------------------------------------------------------------

    def accept(self, listener: Any) -> None:
        try:
            client, addr = listener.accept()
        except OSError:
            return  # EAGAIN, or a connection reset before it was accepted
        self.nr_conns += 1
        if self.nr_conns > self.limits.max_connections:
            self._evict()
        with contextlib.suppress(OSError):  # no answer waits behind Nagle for an ACK
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = TConn(self.cfg, client, addr, listener.getsockname())  # non-blocking
        handshake = False
        if self.cfg.is_ssl:
            try:
                conn.sock = gsock.ssl_context(self.cfg).wrap_socket(
                    client, server_side=True, do_handshake_on_connect=False,
                    suppress_ragged_eofs=self.cfg.suppress_ragged_eofs)
            except (OSError, ssl.SSLError) as e:
                self.log.warning("no TLS context for a new connection: %s", e)
                self._drop(conn)
                return
            handshake = True
        now = time.monotonic()
        self._gate(conn, Gate(conn.sock, self.limits, self.budget, now, handshake=handshake,
                              oversize=self.oversize))

    def _gate(self, conn: TConn, gate: Gate) -> None:
        self.gates[conn] = gate
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_gate, conn))
        if gate.buf:  # bytes already read (pipelined): the socket may not signal them
            self._on_gate(conn, conn.sock)

    def _on_gate(self, conn: TConn, _fileobj: Any) -> None:
        gate = self.gates.get(conn)
        if gate is None:
            return
        self._after(conn, gate, gate.step(time.monotonic()))

    def _after(self, conn: TConn, gate: Gate, step: Step) -> None:
        if isinstance(step, Wait):
            self.poller.modify(conn.sock, selectors.EVENT_WRITE if step.writable
                               else selectors.EVENT_READ, partial(self._on_gate, conn))
            return
        self._ungate(conn)
        if isinstance(step, Closed):
            self._drop(conn)
        elif isinstance(step, Refused):
            send_nowait(conn.sock, error_response(step.status, step.why))
            self._linger(conn)
        else:
            self._dispatch(conn, step)

    def _ungate(self, conn: TConn) -> None:
        gate = self.gates.pop(conn, None)
        if gate is not None:
            gate.release()
        with contextlib.suppress(KeyError, ValueError):
            self.poller.unregister(conn.sock)

    def _dispatch(self, conn: TConn, ready: Ready) -> None:
        if conn.parser is None:
            # The handshake (if any) is done: what TConn.init would do, without its
            # blocking TLS wrap.
            conn.initialized = True
            conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
        conn.parser.unreader.unread(ready.data)
        conn.data_ready = True
        conn.gated_incomplete = not ready.complete
        lane = self.own_lane(ready)
        if lane is not None:
            fs = lane.submit(self.serve_one, conn)
            fs.add_done_callback(
                lambda fut: self.method_queue.defer(self.finish_request, conn, fut))
            return
        self.enqueue_req(conn)

    def own_lane(self, ready: Ready) -> futures.ThreadPoolExecutor | None:
        """The thread of its own a request goes to (health, scrapes), or None."""
        head = ready.head
        if head.method not in ("GET", "HEAD"):
            return None
        if head.path in self.health_paths:
            return self.lane
        if head.path in self.side_paths:
            return self.side
        return None

    def finish_request(self, conn: TConn, fs: Any) -> None:
        """Back from a thread (main loop): keep-alive connections are read by a gate
        again (with any bytes the thread read ahead); others are closed lingering."""
        try:
            keep = bool(fs.result()) if not fs.cancelled() else False
        except Exception:
            keep = False
        if not keep or not self.alive or conn.parser is None:
            self._linger(conn)
            return
        try:
            conn.sock.setblocking(False)
        except OSError:
            self._drop(conn)
            return
        buffered = conn.parser.unreader.take_buffered()
        self.budget.used += len(buffered)
        gate = Gate(conn.sock, self.limits, self.budget, time.monotonic(), idle=True,
                    buffered=buffered, oversize=self.oversize)
        gate.held = len(buffered)
        self._gate(conn, gate)

    def _linger(self, conn: TConn) -> None:
        """Half-close and drop what the client still sends, in the main loop (gunicorn
        drains for up to 2 s in whichever thread closes)."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
            conn.sock.setblocking(False)
            self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_linger, conn))
        except (OSError, KeyError, ValueError):
            self._drop(conn)
            return
        self.lingering[conn] = time.monotonic() + self.limits.linger_s

    def _on_linger(self, conn: TConn, _fileobj: Any) -> None:
        if drain(conn.sock):
            self._unlinger(conn)
            self._drop(conn)

    def _unlinger(self, conn: TConn) -> None:
        self.lingering.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self.poller.unregister(conn.sock)

    def _drop(self, conn: TConn) -> None:
        self.nr_conns -= 1
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _evict(self) -> None:
        """Close the lingering, idle-longest or slowest unfinished connection."""
        if self.lingering:
            conn = min(self.lingering, key=self.lingering.__getitem__)
            self._unlinger(conn)
            self._drop(conn)
            self.evicted += 1
            return
        if self.gates:
            conn = min(self.gates, key=lambda c: (self.gates[c].started,
                                                  self.gates[c].deadline))
            self._ungate(conn)
            self._drop(conn)
            self.evicted += 1

    def murder_pending(self) -> None:
        """Every loop turn (at most a second apart): cut connections past a deadline."""
        super().murder_pending()
        now = time.monotonic()
        for conn, until in list(self.lingering.items()):
            if now >= until:
                self._unlinger(conn)
                self._drop(conn)
        for conn, gate in list(self.gates.items()):
            if now < gate.deadline and (self.alive or gate.started):
                continue  # (stopping: idle kept-alive connections go at once)
            answer = late_answer(gate)
            self._ungate(conn)
            if answer is not None:
                send_nowait(conn.sock, answer)
                self._linger(conn)
            else:
                self._drop(conn)

    # ---- request threads ---------------------------------------------------------------

    def serve_one(self, conn: TConn) -> Any:
        """One buffered request, as the stock worker serves it."""
        return ThreadWorker.handle(self, conn)

    def handle_request(self, req: Any, conn: TConn) -> Any:
        # Blocking from here on, each write bounded: a client that does not read its
        # answer is cut instead of holding the thread.
        conn.sock.settimeout(self.limits.write_s)
        # The client certificate verified in the handshake, for the app (serving.
        # client_auth): gunicorn's environ has no place for it, so it rides on the thread
        # that calls the app.
        _peer.cert = peer_certificate(conn.sock)
        try:
            return super().handle_request(req, conn)
        finally:
            _peer.cert = None

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self.wsgi = _with_peer_cert(getattr(self, "wsgi"))  # noqa: B009 (gunicorn's, untyped)

    def _keepalive_after(self, conn: TConn, keepalive: Any) -> bool:
        if getattr(conn, "gated_incomplete", False):
            return False  # its body was never read: where the next request starts is unknown
        return bool(super()._keepalive_after(conn, keepalive))


_peer = threading.local()


def _with_peer_cert(app: Any) -> Any:
    def wrapped(environ: dict[str, Any], start_response: Any) -> Any:
        environ[PEER_CERT] = getattr(_peer, "cert", None)
        return app(environ, start_response)

    return wrapped
