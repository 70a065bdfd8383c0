"""scheduler.engine: the one loop engine of the background handlers, and the leader gate.

A real thread on real events (no sleeps to pass: every wait is bounded and ends on what
the test does), and a table of the gate's transitions."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from scheduler.engine import Lead, LeaderGate, Loop, LoopMetrics, Outcome


class Steps:
    """A step that records when it ran, answers from a script, and signals each run."""

    def __init__(self, *answers: Outcome | Exception | None) -> None:
        self.answers = list(answers)
        self.at: list[float] = []
        self.ran = threading.Semaphore(0)

    def __call__(self) -> Outcome | None:
        self.at.append(time.monotonic())
        answer = self.answers.pop(0) if self.answers else None
        self.ran.release()
        if isinstance(answer, Exception):
            raise answer
        return answer

    def wait(self, n: int = 1, timeout: float = 5.0) -> bool:
        return all(self.ran.acquire(timeout=timeout) for _ in range(n))


def started(loop: Loop) -> Loop:
    loop.start()
    return loop


def test_a_wake_runs_one_step_and_a_burst_settles_into_one() -> None:
    steps = Steps()
    loop = started(Loop("t", steps, settle_s=0.2))
    try:
        for _ in range(20):
            loop.wake()
        assert steps.wait(1)
        assert not steps.wait(1, timeout=0.4)  # the burst was one step
        assert len(steps.at) == 1
    finally:
        loop.stop()
        assert loop.join(5)


def test_poll_steps_without_a_wake_and_none_waits_for_one() -> None:
    polled = Steps()
    a = started(Loop("a", polled, poll_s=0.05))
    woken = Steps()
    b = started(Loop("b", woken))
    try:
        assert polled.wait(3)
        assert not woken.wait(1, timeout=0.3)
        b.wake()
        assert woken.wait(1)
    finally:
        for loop in (a, b):
            loop.stop()
            assert loop.join(5)


def test_steps_begin_at_most_every_min_interval() -> None:
    steps = Steps()
    loop = started(Loop("t", steps, min_interval_s=0.3))
    try:
        for _ in range(3):
            loop.wake()
            assert steps.wait(1)
    finally:
        loop.stop()
        assert loop.join(5)
    gaps = [b - a for a, b in zip(steps.at, steps.at[1:], strict=False)]
    assert all(g >= 0.29 for g in gaps), gaps


@pytest.mark.parametrize(("answers", "rested"), [
    ((None, None, None), True),  # a step that acted: rest x its duration before the next
    ((Outcome.IDLE, None), False),  # one that could not act is not rested after
])
def test_a_step_is_followed_by_rest_times_its_duration(
        answers: tuple[Outcome | None, ...], rested: bool) -> None:
    """A step of d seconds, then no step for rest x d: the loop's share of the time stays
    at most 1 / (1 + rest), however often it is woken (the planner in a burst)."""
    inner = Steps(*answers)

    def slow() -> Outcome | None:
        answer = inner()
        time.sleep(0.1)  # d = 0.1 s
        return answer

    loop = started(Loop("t", slow, rest=3.0))
    try:
        for _ in answers:
            loop.wake()
            assert inner.wait(1)
            loop.wake()  # woken again at once, as every bind of a burst wakes it
    finally:
        loop.stop()
        assert loop.join(5)
    gaps = [b - a for a, b in zip(inner.at, inner.at[1:], strict=False)]
    if rested:
        assert all(g >= 0.1 + 0.3 - 0.01 for g in gaps), gaps
    else:
        assert gaps[0] < 0.35, gaps


def test_an_idle_step_does_not_delay_the_next() -> None:
    steps = Steps(Outcome.IDLE, None)
    loop = started(Loop("t", steps, min_interval_s=30.0))
    try:
        loop.wake()
        assert steps.wait(1)
        loop.wake()
        assert steps.wait(1, timeout=2.0)  # not 30 s later
    finally:
        loop.stop()
        assert loop.join(5)


def test_stop_ends_every_wait_at_once_and_no_step_begins_after_it() -> None:
    steps = Steps()
    loop = started(Loop("t", steps, poll_s=3600.0, settle_s=3600.0, min_interval_s=3600.0))
    loop.wake()  # now in its hour-long settle
    time.sleep(0.05)
    began = time.monotonic()
    loop.stop()
    assert loop.join(5)
    assert time.monotonic() - began < 2.0
    assert steps.at == []


def test_join_is_bounded_while_a_step_is_in_progress() -> None:
    release = threading.Event()
    entered = threading.Event()

    def slow() -> None:
        entered.set()
        release.wait(10)

    loop = started(Loop("t", slow))
    loop.wake()
    assert entered.wait(5)
    loop.stop()
    began = time.monotonic()
    assert not loop.join(0.2)  # still in its step
    assert time.monotonic() - began < 2.0
    release.set()
    assert loop.join(5)
    assert Loop("never", slow).join(0.0)  # never started: nothing to wait for


def test_a_failed_step_is_logged_counted_and_the_loop_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    steps = Steps(RuntimeError("boom"), RuntimeError("boom"), None)
    failures: list[int] = []
    loop = started(Loop("t", steps, on_failure=lambda e, n: failures.append(n)))
    try:
        for _ in range(3):
            loop.wake()
            assert steps.wait(1)
        deadline = time.monotonic() + 5
        while loop.failures and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        loop.stop()
        assert loop.join(5)
    assert failures == [1, 2]
    assert loop.failures == 0 and loop.steps == 3
    assert sum("t: step failed" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.parametrize("retry", [True, False])
def test_backoff_waits_per_failure_and_retry_tries_again_unwoken(retry: bool) -> None:
    steps = Steps(RuntimeError("a"), RuntimeError("b"), None)
    asked: list[int] = []

    def backoff(n: int) -> float:
        asked.append(n)
        return 0.1 * n

    loop = started(Loop("t", steps, backoff=backoff, retry=retry))
    try:
        loop.wake()
        if retry:
            assert steps.wait(3)  # one wake: the retries come on their own
            assert asked == [1, 2]
            gaps = [b - a for a, b in zip(steps.at, steps.at[1:], strict=False)]
            assert gaps[0] >= 0.09 and gaps[1] >= 0.19, gaps
        else:
            assert steps.wait(1)
            assert not steps.wait(1, timeout=0.4)  # waits for the next change
            assert asked == [1]
    finally:
        loop.stop()
        assert loop.join(5)


def test_a_failing_error_path_does_not_end_the_loop() -> None:
    steps = Steps(RuntimeError("a"), None)

    def bad(e: Exception, n: int) -> None:
        raise ValueError("the handler's own error path")

    loop = started(Loop("t", steps, on_failure=bad))
    try:
        loop.wake()
        assert steps.wait(1)
        loop.wake()
        assert steps.wait(1)
    finally:
        loop.stop()
        assert loop.join(5)


def test_on_exit_runs_however_the_thread_ends() -> None:
    exited = threading.Event()
    loop = started(Loop("t", Steps(), on_exit=exited.set))
    loop.stop()
    assert loop.join(5) and exited.is_set()


def test_outcomes_and_seconds_are_counted_per_loop() -> None:
    registry = CollectorRegistry()
    metrics = LoopMetrics(registry)
    loop = Loop("book", Steps(None, Outcome.STANDBY, Outcome.IDLE, RuntimeError("x")),
                metrics=metrics)
    other = Loop("planner", Steps(), metrics=metrics)
    for _ in range(4):
        loop.run_step()
    other.run_step()

    def count(name: str, outcome: str) -> float | None:
        return registry.get_sample_value("gpupack_loop_steps_total",
                                         {"loop": name, "outcome": outcome})

    assert [count("book", o.value) for o in Outcome] == [1.0, 1.0, 1.0, 1.0]
    assert count("planner", "done") == 1.0 and count("planner", "failed") == 0.0
    assert registry.get_sample_value("gpupack_loop_step_seconds_count",
                                     {"loop": "book"}) == 4.0


# ---- the leader gate ----------------------------------------------------------------------------

GateRow = tuple[str, list[tuple[bool, bool]], list[Lead]]
# (case, per step: (is_leader, the step acts), the gate's answers)
GATE: list[GateRow] = [
    ("a standby stays standby", [(False, False), (False, False)], [Lead.STANDBY, Lead.STANDBY]),
    ("the first leading step gains", [(True, True), (True, True)], [Lead.GAINED, Lead.LEADS]),
    ("leading without acting gains again", [(True, False), (True, True)],
     [Lead.GAINED, Lead.GAINED]),
    ("the lease lost after acting is told once", [(True, True), (False, False), (False, False)],
     [Lead.GAINED, Lead.LOST, Lead.STANDBY]),
    ("lost without having acted: nothing to give back", [(True, False), (False, False)],
     [Lead.GAINED, Lead.STANDBY]),
    ("leading again after a loss gains again", [(True, True), (False, False), (True, True)],
     [Lead.GAINED, Lead.LOST, Lead.GAINED]),
]


@pytest.mark.parametrize(("case", "script", "want"), GATE, ids=[r[0] for r in GATE])
def test_leader_gate_transitions(case: str, script: list[tuple[bool, bool]],
                                 want: list[Lead]) -> None:
    lead = [False]
    gate = LeaderGate(lambda: lead[0])
    got = []
    for leads, acts in script:
        lead[0] = leads
        got.append(gate.step())
        if acts:
            gate.act()
    assert got == want
    assert [g.leading for g in got] == [leads for leads, _ in script]


def test_the_gate_asks_again_before_each_write_and_its_check_may_be_replaced() -> None:
    calls: list[str] = []

    def check(name: str) -> Callable[[], bool]:
        def ask() -> bool:
            calls.append(name)
            return name == "new"
        return ask

    gate = LeaderGate(check("old"))
    assert not gate()
    gate.is_leader = check("new")
    assert gate() and gate.step() is Lead.GAINED
    assert calls == ["old", "new", "new"]
