"""`gpupack serve` stops cleanly: gunicorn's worker_exit hook stops the loops that queue
API writes, then lets the writers flush what they hold, within a bounded time
(gpupack/serve_cmd.py)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gpupack.serve_cmd import SHUTDOWN_S, Components, ExtenderServer, add_arguments


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_shutdown_stops_the_loops_then_flushes_the_writers() -> None:
    c = Components(_args())
    order: list[str] = []
    stop_book = c.groups.stop
    stop_writer = c.group_writer.stop

    def book_stop() -> None:
        order.append("book")
        stop_book()

    def writer_stop(drain_s: float = 3.0) -> None:
        order.append("writer")
        stop_writer(drain_s)

    c.groups.stop = book_stop  # type: ignore[method-assign]
    c.group_writer.stop = writer_stop  # type: ignore[method-assign]
    assert c.static_records is not None
    c.group_writer.start()
    # Queued just before the shutdown (the writer thread is waiting for the next submit).
    name = "gpupack-group-x"
    with c.group_writer._cond:  # queued without waking the thread: it must be the flush
        c.group_writer._queue[name] = {"metadata": {"name": name}, "data": {}}
    started = time.monotonic()
    c.shutdown(budget_s=2.0)
    assert time.monotonic() - started < 2.5
    assert order == ["book", "writer"]
    assert name in c.static_records.objects
    assert c.group_writer.join(0)


def test_shutdown_is_bounded_when_a_writer_hangs() -> None:
    c = Components(_args())

    class Hanging:
        def put(self, obj: Any) -> None:
            time.sleep(30)

        def delete(self, name: str) -> None:
            time.sleep(30)

    c.group_writer.store = Hanging()
    c.group_writer.start()
    c.group_writer.submit("gpupack-group-x", {"metadata": {"name": "gpupack-group-x"}})
    time.sleep(0.05)
    started = time.monotonic()
    c.shutdown(budget_s=0.5)
    assert time.monotonic() - started < 1.5


def test_gunicorn_calls_the_shutdown_from_the_worker_exit_hook() -> None:
    server = ExtenderServer(_args())
    assert server.cfg.worker_exit == server.worker_exit
    server.cfg.worker_exit(None, None)  # the app never loaded: nothing to do
    calls: list[float] = []

    class Parts:
        def shutdown(self, budget_s: float = SHUTDOWN_S) -> None:
            calls.append(budget_s)

    server.parts = Parts()  # type: ignore[assignment]
    server.cfg.worker_exit(None, None)
    assert calls == [SHUTDOWN_S]
    assert server.cfg.graceful_timeout > SHUTDOWN_S  # inside gunicorn's grace
