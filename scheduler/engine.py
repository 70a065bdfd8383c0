"""One engine for the background work beside the extender: a step run again and again in
a daemon thread, with what every such loop needs and none should write twice.

kopf runs every daemon and timer of an operator on one engine; here the reservation
book, the MIG actuator (and the compaction it runs), defragmentation, the planner and the
memo warmer each hand a :class:`Loop` their step and keep only their own logic. A loop

* **wakes** when :meth:`Loop.wake` is called (a handler subscribes it to the cache's
  changes) and at least every ``poll_s`` seconds (deadlines; None: only when woken);
* **settles** ``settle_s`` after a wake (a burst of watch events becomes one step), and
  begins a step at most every ``min_interval_s`` (a step may be a long solve); with
  ``rest``, a step of d seconds is followed by at least ``rest`` x d seconds without one,
  so the loop takes at most 1 / (1 + ``rest``) of the time however often it is woken (a
  step that could not act, or failed, is not rested after: backoff rules failures);
* **stops** on :meth:`Loop.stop`, which ends any wait at once; a step in progress ends on
  its own, and :meth:`Loop.join` waits for it a bounded time (the shutdown then flushes
  the writers); ``on_exit`` runs when the thread ends, however it ends;
* **outlives its faults**: an exception from a step is logged and counted, never ends the
  thread; with ``backoff`` the next step waits ``backoff(failures in a row)`` seconds
  (:func:`scheduler.backoff.doubling` is the rule every handler uses), and with
  ``retry`` it is tried then without waiting for a wake;
* **counts** every step's :class:`Outcome` (``gpupack_loop_steps_total{loop,outcome}``)
  and its seconds (``gpupack_loop_step_seconds{loop}``) when given :class:`LoopMetrics`.

Its clock (monotonic seconds, for the interval between steps) is injected; the waits
themselves are on events, so a stop is never late.

:class:`LeaderGate` is the other half: the leader check of a handler that acts only on
the replica that leads, asked once at the start of each step (which also says whether
this replica just stopped leading, so it gives back what it held once) and again right
before each write of a step that may outlive the lease.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

Clock = Callable[[], float]


class Outcome(enum.StrEnum):
    """What one step did (the ``outcome`` label)."""

    DONE = "done"  # it acted (or looked and found nothing to change)
    IDLE = "idle"  # it could not act yet: the cache or the book not synced
    STANDBY = "standby"  # this replica does not lead: nothing done
    FAILED = "failed"  # it raised (logged; the loop goes on)


class LoopMetrics:
    """``gpupack_loop_steps_total{loop,outcome}`` and ``gpupack_loop_step_seconds{loop}``,
    shared by every loop of a process (one registry)."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Histogram

        self.steps = Counter("gpupack_loop_steps", "Steps of gpupack's background loops, "
                             "by loop and outcome (done, idle, standby, failed)",
                             ["loop", "outcome"], registry=registry)
        self.seconds = Histogram("gpupack_loop_step_seconds",
                                 "Seconds one step of a background loop took", ["loop"],
                                 buckets=(0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60),
                                 registry=registry)

    def series(self, loop: str) -> None:
        """Every outcome of ``loop`` at zero, so a rate exists before the first step."""
        for o in Outcome:
            self.steps.labels(loop, o.value)
        self.seconds.labels(loop)


class Loop:
    """One handler's step in a daemon thread; see the module docstring."""

    def __init__(
        self,
        name: str,
        step: Callable[[], Outcome | None],
        *,
        poll_s: float | None = None,
        settle_s: float = 0.0,
        min_interval_s: float = 0.0,
        rest: float = 0.0,
        backoff: Callable[[int], float] | None = None,
        retry: bool = False,
        on_failure: Callable[[Exception, int], None] | None = None,
        on_exit: Callable[[], None] | None = None,
        log: logging.Logger | None = None,
        clock: Clock = time.monotonic,
        metrics: LoopMetrics | None = None,
    ) -> None:
        """``step`` returns its outcome (None: done). ``on_failure(error, failures in a
        row)`` runs after a failed step is logged (a handler publishes the failure);
        ``log``: the handler's logger (the failures are logged there)."""
        self.name = name
        self.step = step
        self.poll_s = poll_s
        self.settle_s = settle_s
        self.min_interval_s = min_interval_s
        self.rest = rest
        self.backoff = backoff
        self.retry = retry
        self.on_failure = on_failure
        self.on_exit = on_exit
        self.log = log or logging.getLogger(f"gpupack.scheduler.{name}")
        self.clock = clock
        self.metrics = metrics
        if metrics is not None:
            metrics.series(name)
        self.failures = 0  # steps failed in a row
        self.steps = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (once; a second call does nothing)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=f"gpupack-{self.name}",
                                            daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """Step soon (after ``settle_s`` and ``min_interval_s``): something changed."""
        self._wake.set()

    def stop(self) -> None:
        """End every wait at once; no step begins after this."""
        self._stop.set()
        self._wake.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds (none if negative) for the thread, stopped, to
        end its step in progress; whether it has ended (or never ran)."""
        t = self._thread
        if t is not None:
            t.join(max(0.0, timeout_s))
            return not t.is_alive()
        return True

    @property
    def started(self) -> bool:
        return self._thread is not None

    # ---- the thread ------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._run()
        finally:
            if self.on_exit is not None:
                self.on_exit()

    def _run(self) -> None:
        last = -math.inf
        rested = -math.inf  # no step begins before this (``rest``)
        while not self._stop.is_set():
            self._wake.wait(self.poll_s)
            if self._stop.is_set():
                return
            if self.settle_s > 0:
                self._stop.wait(self.settle_s)  # let a burst of events land first
            wait = max(last + self.min_interval_s, rested) - self.clock()
            if wait > 0:
                self._stop.wait(wait)
            if self._stop.is_set():
                return
            self._wake.clear()
            began = self.clock()
            outcome = self.run_step()
            if outcome is not Outcome.IDLE:
                last = began  # a step that could not act does not delay the next
            if outcome is Outcome.DONE and self.rest > 0:
                ended = self.clock()
                rested = ended + self.rest * max(0.0, ended - began)
            if outcome is Outcome.FAILED and self.backoff is not None:
                if self._stop.wait(self.backoff(self.failures)):
                    return
                if self.retry:
                    self._wake.set()  # tried again without waiting for a change

    def run_step(self) -> Outcome:
        """One step, guarded and counted (the thread's; tests call it too)."""
        started = time.perf_counter()
        try:
            outcome = self.step() or Outcome.DONE
        except Exception as e:  # a bug in a step must never end the loop
            self.failures += 1
            outcome = Outcome.FAILED
            self.log.exception("%s: step failed (%d in a row)", self.name, self.failures)
            if self.on_failure is not None:
                try:
                    self.on_failure(e, self.failures)
                except Exception:  # the loop outlives its own error path
                    self.log.exception("%s: handling a failed step failed", self.name)
        else:
            self.failures = 0
        self.steps += 1
        if self.metrics is not None:
            self.metrics.steps.labels(self.name, outcome.value).inc()
            self.metrics.seconds.labels(self.name).observe(time.perf_counter() - started)
        return outcome


class Lead(enum.Enum):
    """Where a step stands with the lease (:meth:`LeaderGate.step`)."""

    GAINED = "gained"  # leads, and had not acted as the leader before (or since it lost)
    LEADS = "leads"  # leads, and acted as the leader before
    LOST = "lost"  # does not lead, and acted as the leader before: give back what it held
    STANDBY = "standby"  # does not lead, and has nothing to give back

    @property
    def leading(self) -> bool:
        return self in (Lead.GAINED, Lead.LEADS)


class LeaderGate:
    """The leader check of a handler that acts only where this replica leads.

    :meth:`step` is asked once at the start of a step: whether the replica leads, and
    whether it led (and acted, :meth:`act`) since it last stopped, so a step that finds it
    lost the lease gives back what it held exactly once. Calling the gate (``gate()``) is
    the check right before a write: the decision may take a second and each write up to
    ten, and a replica whose lease ran out meanwhile must not write. ``is_leader`` may be
    replaced (the command layer hands the lease's check in after the handler is made)."""

    def __init__(self, is_leader: Callable[[], bool] = lambda: True) -> None:
        self.is_leader = is_leader
        self.acting = False  # acted as the leader since it last stopped leading

    def __call__(self) -> bool:
        return self.is_leader()

    def step(self) -> Lead:
        if self.is_leader():
            return Lead.LEADS if self.acting else Lead.GAINED
        if self.acting:
            self.acting = False
            return Lead.LOST
        return Lead.STANDBY

    def act(self) -> None:
        """This step acts as the leader (a later :meth:`step` that finds the lease gone
        answers LOST)."""
        self.acting = True


class GatedHandler:
    """What a leader-gated handler on the engine shows the command layer: its thread
    (:meth:`start`, :meth:`stop`, :meth:`join`) and its leader check (``is_leader``, which
    the command layer replaces with the lease's once the handler is made). A subclass sets
    ``loop`` and ``gate`` in its constructor and ``default_poll_s``: how often it steps at
    least without a wake (its deadlines and a change of leader)."""

    loop: Loop
    gate: LeaderGate
    default_poll_s = 1.0

    def start(self, poll_s: float | None = None) -> None:
        """Step in the background: on every wake, and at least every ``poll_s``."""
        self.loop.poll_s = self.default_poll_s if poll_s is None else poll_s
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop()

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the thread (stopped) to end its step in
        progress; whether it has (or never ran). A shutdown then flushes the writers."""
        return self.loop.join(timeout_s)

    @property
    def is_leader(self) -> Callable[[], bool]:
        """Whether this replica leads (the gate's check; may be replaced)."""
        return self.gate.is_leader

    @is_leader.setter
    def is_leader(self, check: Callable[[], bool]) -> None:
        self.gate.is_leader = check


__all__ = ["GatedHandler", "Lead", "LeaderGate", "Loop", "LoopMetrics", "Outcome"]
