"""``gpupack serve``'s garbage-collector keeper (gpupack/gc_keeper.py): its steps freeze
without a full scan except every ``--gc-full-every``, come at doubling intervals up to
``--gc-freeze-every``, wait (boundedly) for no request in flight; the flags are checked
and reach the keeper; and in a real interpreter a step leaves the oldest generation
empty, so the interpreter's own full collections have nothing old left to scan."""

from __future__ import annotations

import argparse
import gc
from typing import Any

import pytest

from gpupack.gc_keeper import GcKeeper
from gpupack.serve_cmd import add_arguments, check_args


class Recorder:
    """The ``gc`` calls a keeper makes, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def collect(self, generation: int = 2) -> int:
        self.calls.append(f"collect({generation})")
        return 0

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def keeper(**kw: Any) -> tuple[GcKeeper, Recorder, Clock]:
    rec, clock = Recorder(), Clock()
    k = GcKeeper(collector=rec, clock=clock, sleep=clock.sleep, **kw)
    return k, rec, clock


def test_a_step_collects_young_and_freezes_without_a_full_scan() -> None:
    k, rec, clock = keeper(every_s=30, full_every_s=3600)
    clock.now = 10
    k.step()
    assert rec.calls == ["collect(1)", "freeze"]
    assert (k.freezes, k.full) == (1, 0)


def test_every_full_every_s_a_step_unfreezes_and_scans_everything() -> None:
    k, rec, clock = keeper(every_s=30, full_every_s=100)
    steps = []
    for t in (30, 60, 90, 100, 130, 199, 200):
        clock.now = t
        rec.calls.clear()
        k.step()
        steps.append(tuple(rec.calls))
    young, full = ("collect(1)", "freeze"), ("unfreeze", "collect(2)", "freeze")
    assert steps == [young, young, young, full, young, young, full]
    assert k.full == 2


def test_no_full_scan_when_full_every_is_0() -> None:
    k, rec, clock = keeper(every_s=30, full_every_s=0)
    for t in (1e3, 1e5, 1e7):
        clock.now = t
        k.step()
    assert "unfreeze" not in rec.calls


def test_steps_come_at_doubling_intervals_up_to_every_s() -> None:
    k, _, _ = keeper(every_s=30, first_s=1)
    waits = [k.loop.poll_s]
    for _ in range(8):
        k.step()
        waits.append(k.loop.poll_s)
    assert waits == [1, 2, 4, 8, 16, 30, 30, 30, 30]


@pytest.mark.parametrize("busy_for, slept", [
    (0, 0.0),  # idle: at once
    (3, 0.06),  # three tries 20 ms apart, then the requests are done
    (1000, 1.0),  # busy throughout: runs anyway after 50 tries
])
def test_a_step_waits_boundedly_for_no_request_in_flight(busy_for: int,
                                                         slept: float) -> None:
    answers = iter([True] * busy_for + [False] * 100)
    k, rec, clock = keeper(busy=lambda: next(answers))
    k.step()
    assert clock.now == pytest.approx(slept)
    assert rec.calls == ["collect(1)", "freeze"]


def test_a_real_step_leaves_the_oldest_generation_empty() -> None:
    """In this interpreter: objects made and promoted since the last freeze are frozen
    by a step (counted by gc.get_freeze_count), so none is left for a full scan."""
    gc.collect()
    kept = [{"node": i, "gpus": [[j] for j in range(4)]} for i in range(5000)]
    gc.collect()  # promote them to the oldest generation
    before = gc.get_freeze_count()
    assert len(gc.get_objects(2)) >= 5000
    k = GcKeeper(every_s=30, full_every_s=0)
    try:
        k.step()
        assert gc.get_freeze_count() - before >= 5 * 5000
        assert len(gc.get_objects(2)) == 0
        assert kept[-1]["node"] == 4999
    finally:
        gc.unfreeze()  # leave the test process as it was


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_the_flags_default_to_30_s_and_an_hour() -> None:
    a = _args()
    assert (a.gc_freeze_every, a.gc_full_every) == (30.0, 3600.0)
    assert check_args(a) is None


@pytest.mark.parametrize("flag, value, why", [
    ("--gc-freeze-every", "0", None),
    ("--gc-freeze-every", "5", None),
    ("--gc-full-every", "0", None),
    ("--gc-freeze-every", "-1", "--gc-freeze-every -1: must be 0 or a positive number of "
                                "seconds"),
    ("--gc-full-every", "nan", "--gc-full-every nan: must be 0 or a positive number of "
                               "seconds"),
    ("--gc-full-every", "inf", "--gc-full-every inf: must be 0 or a positive number of "
                               "seconds"),
])
def test_the_flags_are_checked(flag: str, value: str, why: str | None) -> None:
    assert check_args(_args(flag, value)) == why


def test_freeze_every_0_starts_no_thread() -> None:
    k = GcKeeper(every_s=0, collector=Recorder())
    k.start()
    assert not k.loop.started


def test_serve_builds_its_keeper_from_the_flags_and_starts_it_once_synced() -> None:
    """The wiring: gpupack serve's keeper takes the flags and the app's requests in
    flight; once the first lists are in, one full collection and freeze, then the
    keeper's thread (bundled example cluster, static: synced at once)."""
    from gpupack.serve_cmd import Components

    c = Components(_args("--gc-freeze-every", "7", "--gc-full-every", "70", "--no-warm",
                         "--no-planner"))
    k = c.gc_keeper
    assert (k.every_s, k.full_every_s) == (7.0, 70.0)
    assert k.busy == c.app.extensions["gpupack.inflight"].busy
    rec = Recorder()
    k.gc = rec
    c.source.start(c.tap, c.tap, c.inputs, c.cache)
    try:
        c._freeze_when_synced()
        assert rec.calls == ["collect(2)", "freeze"]
        assert k.loop.started
    finally:
        k.stop()
        k.loop.join(2)
