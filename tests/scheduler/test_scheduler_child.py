"""scheduler.child: the child-process helper under the solver and the memo warmer, with
real spawned children (answers, errors, a stuck child, a dead one, restarts)."""

from __future__ import annotations

import os
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import pytest

from scheduler.child import ChildGone, ChildProcess, ChildTimeout, serve_messages


def _handle(msg: tuple[Any, ...]) -> Any:
    kind = msg[0]
    if kind == "echo":
        return msg[1]
    if kind == "pid":
        return os.getpid()
    if kind == "sleep":
        time.sleep(msg[1])
        return None
    if kind == "exit":
        os._exit(3)
    raise ValueError(f"unknown {kind!r}")


def echo_main(conn: Connection) -> None:
    serve_messages(conn, _handle)


class Refused(RuntimeError):
    pass


class Counting(ChildProcess):
    def __init__(self) -> None:
        super().__init__(echo_main, "gpupack-test-child", error=Refused)
        self.fresh = 0

    def started(self) -> None:
        self.fresh += 1


@pytest.fixture
def child() -> Any:
    c = Counting()
    yield c
    c.close()


def test_started_on_first_use_and_kept(child: Counting) -> None:
    assert child.pid is None and child.starts == 0
    assert child.request(("echo", [1, "a"]), 30.0) == [1, "a"]
    pid = child.request(("pid",), 30.0)
    assert pid == child.pid and pid != os.getpid()
    assert (child.starts, child.fresh) == (1, 1)


def test_an_error_answer_raises_the_callers_error_and_keeps_the_child(child: Counting) -> None:
    pid = child.request(("pid",), 30.0)
    with pytest.raises(Refused, match=r"ValueError: unknown 'nope'"):
        child.request(("nope",), 30.0)
    assert child.request(("pid",), 30.0) == pid and child.starts == 1


def test_a_child_without_an_answer_in_time_is_stopped_and_replaced(child: Counting) -> None:
    first = child.request(("pid",), 30.0)
    with pytest.raises(ChildTimeout, match="no answer in 0 s"):
        child.request(("sleep", 30.0), 0.2)
    assert child.pid is None  # stopped, not left running
    assert child.request(("pid",), 30.0) not in (first, None)
    assert (child.starts, child.fresh) == (2, 2)


def test_a_child_that_dies_is_reported_then_restarted(child: Counting) -> None:
    child.request(("pid",), 30.0)
    with pytest.raises(ChildGone):
        child.request(("exit",), 30.0)
    assert child.pid is None
    assert child.request(("echo", 7), 30.0) == 7 and child.starts == 2


def test_close_stops_the_child(child: Counting) -> None:
    pid = child.request(("pid",), 30.0)
    child.close()
    assert child.pid is None and not child.running()
    with pytest.raises(ProcessLookupError):
        for _ in range(50):  # reaped by join; the pid is gone
            os.kill(pid, 0)
            time.sleep(0.1)


def test_shutdown_stops_the_child_for_good(child: Counting) -> None:
    # An owner stopping while another thread may still be about to call (the planner's
    # stop()): close() let that call start a fresh child nobody stopped.
    child.request(("pid",), 30.0)
    child.shutdown()
    assert child.pid is None and not child.running()
    with pytest.raises(Refused, match="shut down"):
        child.request(("echo", 1), 30.0)
    assert child.pid is None and child.starts == 1


def deaf_main(conn: Connection) -> None:
    """A child alive but never reading (stuck before its loop)."""
    time.sleep(3600)


def test_a_send_the_child_never_reads_times_out_and_stops_it() -> None:
    # A pipe holds 64 KiB: a larger message to a child that never reads blocked the
    # caller (the planner's or warmer's thread) in send() for ever, past any timeout.
    deaf = ChildProcess(deaf_main, "gpupack-test-deaf", error=Refused)
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            deaf.exchange(("echo", b"x" * 1_000_000), 0.5)
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=call, daemon=True)
    try:
        t.start()
        t.join(20)
        assert not t.is_alive(), "exchange still blocked in send"
        assert len(outcome) == 1 and isinstance(outcome[0], ChildTimeout)
        assert deaf.pid is None and not deaf.running()
    finally:
        deaf.close()


def test_a_large_message_goes_through_once_the_child_reads(child: Counting) -> None:
    big = b"y" * 3_000_000  # many pipe buffers: the send waits on the child's reads
    assert child.request(("echo", big), 30.0) == big
    assert child.starts == 1


def test_a_small_message_is_sent_without_a_helper_thread(child: Counting,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    # A thread per exchange cost ten times the exchange (the warmer sends many small
    # batches); a message the empty pipe holds cannot block.
    import scheduler.child as module

    child.request(("echo", 0), 30.0)

    def no_thread(*a: Any, **k: Any) -> None:
        raise AssertionError("a helper thread for a small message")

    monkeypatch.setattr(module.threading, "Thread", no_thread)
    small = b"s" * (module.DIRECT_SEND_BYTES - 100)
    assert child.request(("echo", small), 30.0) == small
