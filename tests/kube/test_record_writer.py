"""The background writer of records, wakes and memories (kube.record_writer.RecordWriter):
a write that fails all its quick retries is tried again later, with a doubling delay,
until it passes, a newer object replaces it, the replica stops leading, or the API says
it never will."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from kube.record_writer import RecordWriter


class ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"({status})")
        self.status = status


class FlakyStore:
    """Fails the next ``fail`` calls with ``status``, then writes."""

    def __init__(self, fail: int = 0, status: int = 503) -> None:
        self.fail = fail
        self.status = status
        self.calls = 0
        self.objects: dict[str, Mapping[str, Any]] = {}
        self.written = threading.Event()

    def put(self, obj: Mapping[str, Any]) -> None:
        self.calls += 1
        if self.fail > 0:
            self.fail -= 1
            raise ApiError(self.status)
        self.objects[obj["metadata"]["name"]] = obj
        self.written.set()

    def delete(self, name: str) -> None:
        self.put({"metadata": {"name": name}, "deleted": True})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def obj(name: str, v: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name}, "v": v}


def writer(store: FlakyStore, clock: Clock, leader: list[bool] | None = None
           ) -> RecordWriter:
    lead = leader if leader is not None else [True]
    return RecordWriter(store, is_leader=lambda: lead[0], retries=1, sleep=lambda s: None,
                        later_s=5.0, later_max_s=12.0, clock=clock)


def test_a_write_that_keeps_failing_is_tried_again_later_until_it_passes() -> None:
    store, clock = FlakyStore(fail=4), Clock()
    w = writer(store, clock)
    w.submit("r", obj("r"))
    assert w.drain() == 0 and store.calls == 2 and "r" in w.later()
    clock.now = 4.9
    assert w.drain() == 0 and store.calls == 2  # not due yet
    clock.now = 5.0
    assert w.drain() == 0 and store.calls == 4  # failed again: 10 s on now
    clock.now = 14.9
    assert w.drain() == 0 and store.calls == 4
    clock.now = 15.0
    assert w.drain() == 1 and store.objects["r"] == obj("r") and w.later() == {}
    assert w.failures == 2 and w.writes == 1


def test_the_delay_doubles_up_to_its_cap() -> None:
    store, clock = FlakyStore(fail=100), Clock()
    w = writer(store, clock)
    w.submit("r", obj("r"))
    tries = []
    for _ in range(60):
        before = store.calls
        w.drain()
        if store.calls > before:
            tries.append(clock.now)
        clock.now += 1
    assert tries[:5] == [0.0, 5.0, 15.0, 27.0, 39.0]  # 5, 10, then 12 (the cap)


def test_a_newer_object_replaces_the_failed_one() -> None:
    store, clock = FlakyStore(fail=2), Clock()
    w = writer(store, clock)
    w.submit("r", obj("r", 1))
    w.drain()
    w.submit("r", obj("r", 2))
    assert w.later() == {}
    assert w.drain() == 1 and store.objects["r"]["v"] == 2
    clock.now = 100
    assert w.drain() == 0 and store.calls == 3  # the old one is never written


@pytest.mark.parametrize("status", [400, 422])
def test_what_the_api_will_never_take_is_dropped(status: int) -> None:
    store, clock = FlakyStore(fail=1, status=status), Clock()
    w = writer(store, clock)
    w.submit("r", obj("r"))
    assert w.drain() == 0 and store.calls == 1 and w.later() == {} and w.given_up == 1


def test_a_replica_that_stopped_leading_does_not_write_what_failed_before() -> None:
    store, clock, lead = FlakyStore(fail=2), Clock(), [True]
    w = writer(store, clock, lead)
    w.submit("r", obj("r"))
    w.drain()
    lead[0] = False
    clock.now = 5
    assert w.drain() == 0 and w.dropped == 1 and w.later() == {} and store.calls == 2


def test_the_writer_thread_wakes_for_a_write_tried_again_later() -> None:
    store = FlakyStore(fail=1)
    w = RecordWriter(store, retries=0, later_s=0.05)
    w.start()
    try:
        w.submit("r", obj("r"))
        assert store.written.wait(5.0), "the failed write was not tried again"
        assert store.calls == 2
    finally:
        w.stop()
        time.sleep(0)


def test_the_writers_counts_are_metrics() -> None:
    from prometheus_client import CollectorRegistry

    from kube.writer_metrics import register_writers

    store, clock, lead = FlakyStore(fail=2), Clock(), [True]
    w = writer(store, clock, lead)
    w.what = "group record"
    registry = CollectorRegistry()
    register_writers(registry, lambda: (w, None))

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"what": "group record", **labels})

    assert sample("gpupack_record_writes_total", outcome="written") == 0
    w.submit("r", obj("r"))
    w.drain()
    assert sample("gpupack_record_writes_total", outcome="retried_later") == 1
    assert sample("gpupack_record_writes_waiting") == 1
    clock.now = 5
    w.drain()
    assert sample("gpupack_record_writes_total", outcome="written") == 1
    assert sample("gpupack_record_writes_waiting") == 0
    lead[0] = False
    w.submit("s", obj("s"))
    w.drain()
    assert sample("gpupack_record_writes_total", outcome="dropped") == 1
    assert sample("gpupack_record_writes_total", outcome="given_up") == 0


class FlakyLeader:
    """A leader check that raises on the calls numbered in ``raises`` (from 1)."""

    def __init__(self, raises: set[int]) -> None:
        self.raises = raises
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        if self.calls in self.raises:
            raise OverflowError("int too large to convert to float")
        return True


@pytest.mark.parametrize(("raises", "later"), [
    ({1}, {"a"}),  # the first write's check raised: kept for later, the next written
    ({2}, {"b"}),
    ({1, 2}, {"a", "b"}),
])
def test_a_leader_check_that_raises_keeps_the_write_for_later(raises: set[int],
                                                              later: set[str]) -> None:
    store, clock = FlakyStore(), Clock()
    w = RecordWriter(store, is_leader=FlakyLeader(raises), retries=1, sleep=lambda s: None,
                     later_s=5.0, clock=clock)
    w.submit("a", obj("a"))
    w.submit("b", obj("b"))
    assert w.drain() == 2 - len(later)
    assert set(w.later()) == later and w.failures == len(later)
    clock.now = 5.0
    assert w.drain() == len(later)
    assert set(store.objects) == {"a", "b"} and w.later() == {}


def test_the_writer_thread_survives_a_leader_check_that_raises() -> None:
    store = FlakyStore()
    w = RecordWriter(store, is_leader=FlakyLeader({1}), later_s=0.05)
    w.start()
    try:
        w.submit("a", obj("a"))
        assert store.written.wait(5.0), "the write was never made"
        store.written.clear()
        w.submit("b", obj("b"))
        assert store.written.wait(5.0), "the writer thread died"
        assert set(store.objects) == {"a", "b"}
        assert w._thread is not None and w._thread.is_alive()
    finally:
        w.stop()
