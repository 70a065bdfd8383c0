"""A gunicorn ``gthread`` worker that serves a busy keep-alive connection on one thread.

The stock worker hands every request of a kept-alive connection across threads twice:
the main loop polls the socket and submits it to the thread pool; the pool thread
answers and posts the connection back through a pipe; the main loop registers it for
polling again. kube-scheduler sends filter, prioritize and bind back to back on one
connection, so each request pays both hand-offs, and each hand-off can wait for the GIL
while the other thread (or the extender's background threads) holds it.

Here the pool thread, after answering, waits up to ``STICKY_S`` for the next request on
the same connection and serves it itself. A connection idle for longer goes back to the
main loop exactly as before, so idle keep-alive connections hold no thread, and a slow
client holds one for at most ``STICKY_S`` between requests. Fairness is kept: a thread
stays with its connection only while no other connection waits for a thread, so a busy
client cannot starve the others (a waiting one is served at the next request boundary,
as with the stock worker). HTTP/2 connections are left to the stock code.

Written against gunicorn 27, whose ``ThreadWorker.handle`` returns True for a connection
to keep alive. Older releases return a ``(keepalive, conn)`` tuple there; this worker then
never keeps a connection and behaves exactly like the stock one.
"""

from __future__ import annotations

import select
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

# How long a pool thread waits for the next request on the connection it just served.
# kube-scheduler's next request on a connection comes within a few milliseconds while
# it is scheduling; 50 ms keeps that path on one thread and frees the thread soon after.
STICKY_S = 0.05


def _buffered(conn: Any) -> bool:
    """Bytes of the next request already read into the parser (pipelining, a body
    drained past its end): the socket will not signal them."""
    unreader = getattr(getattr(conn, "parser", None), "unreader", None)
    buf = getattr(unreader, "buf", None)
    return bool(buf is not None and buf.getbuffer().nbytes)


def _readable(sock: Any, timeout_s: float) -> bool:
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(timeout_s * 1000.0))
    except (OSError, ValueError):
        return False  # closed meanwhile: let the main loop clean up


class StickyThreadWorker(ThreadWorker):
    """gthread, with the next request of a busy connection served on the same thread."""

    sticky_s = STICKY_S

    def _others_waiting(self) -> bool:
        """Connections queued for a thread (ThreadPoolExecutor's queue); True when that
        cannot be seen, so the worker then behaves like the stock one."""
        queue = getattr(getattr(self, "tpool", None), "_work_queue", None)
        return queue is None or queue.qsize() > 0

    def handle(self, conn: Any) -> Any:
        result = super().handle(conn)
        while (result is True and self.alive and not getattr(conn, "is_http2", False)
               and not self._others_waiting()
               and (_buffered(conn) or _readable(conn.sock, self.sticky_s))):
            result = super().handle(conn)
        return result
