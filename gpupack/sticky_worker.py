"""A gunicorn worker that serves a busy keep-alive connection on one thread.

It is :class:`serving.gunicorn_worker.GatedThreadWorker` (threads only ever see whole
requests, read by the main loop under deadlines, so no client can stall the extender),
plus this: the stock worker hands every request of a kept-alive connection across
threads twice (the main loop reads it and submits it to the pool; the pool thread
answers and posts the connection back through a pipe). kube-scheduler sends filter,
prioritize and bind back to back on one connection, so each request would pay both
hand-offs, and each hand-off can wait for the GIL while another thread holds it.

Here the pool thread, after answering, reads the next request on the same connection
itself, for up to ``STICKY_S``, with the same gate (same limits) the main loop uses. A
whole request in time is served on this thread; otherwise the connection and whatever
arrived of its request go back to the main loop, so idle keep-alive connections hold
no thread and a slow client holds one for at most ``STICKY_S``. Fairness is kept: a
thread stays with its connection only while no other connection waits for a thread,
so a busy client cannot starve the others. HTTP/2 connections are left to the stock
code.

Written against gunicorn 27, whose ``ThreadWorker.handle`` returns True for a
connection to keep alive.
"""

from __future__ import annotations

import select
import time
from typing import Any

from serving.gate import ByteBudget, Gate, Ready, Wait
from serving.gunicorn_worker import GatedThreadWorker

# How long a pool thread waits for the next request on the connection it just served.
# kube-scheduler's next request on a connection comes within a few milliseconds while
# it is scheduling; 50 ms keeps that path on one thread and frees the thread soon after.
STICKY_S = 0.05


def _wait_readable(sock: Any, timeout_s: float) -> bool:
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(max(timeout_s, 0.0) * 1000.0))
    except (OSError, ValueError):
        return False  # closed meanwhile: let the main loop clean up


class StickyThreadWorker(GatedThreadWorker):
    """The gated gthread, with the next request of a busy connection served on the same
    thread."""

    sticky_s = STICKY_S

    def _others_waiting(self) -> bool:
        """Connections queued for a thread (ThreadPoolExecutor's queue); True when that
        cannot be seen, so the worker then behaves like the stock one."""
        queue = getattr(getattr(self, "tpool", None), "_work_queue", None)
        return queue is None or queue.qsize() > 0

    def handle(self, conn: Any) -> Any:
        result = self.serve_one(conn)
        while (result is True and self.alive and not getattr(conn, "is_http2", False)
               and not self._others_waiting() and self._next_request(conn)):
            result = self.serve_one(conn)
        return result

    def _next_request(self, conn: Any) -> bool:
        """Read the connection's next request into its parser, for up to ``sticky_s``;
        True when it is all there. Otherwise the bytes read stay in the parser's buffer,
        where the main loop's gate takes them up."""
        unreader = conn.parser.unreader
        sock = conn.sock
        try:
            sock.setblocking(False)
        except OSError:
            return False
        now = time.monotonic()
        # This thread's own budget: the listener's is the main loop's alone (no lock).
        # One request's worth, which this thread holds anyway when it serves it.
        limits = self.limits
        gate = Gate(sock, limits, ByteBudget(limits.max_head + limits.max_body + 1), now,
                    idle=True, buffered=unreader.take_buffered(), oversize=self.oversize)
        until = now + self.sticky_s
        while True:
            step = gate.step(now)
            if isinstance(step, Ready) and step.complete and self.own_lane(step) is None:
                unreader.unread(step.data)
                conn.data_ready = True
                conn.gated_incomplete = False
                return True
            if not isinstance(step, Wait) or now >= until:
                # Done waiting, or something for the main loop to answer (a refusal, an
                # oversize body, a health check or scrape for its own thread, a closed
                # client).
                unreader.unread(bytes(gate.buf))
                return False
            _wait_readable(sock, until - now)
            now = time.monotonic()
