"""A stopped RecordWriter flushes what it holds before its thread ends (a shutdown), but
only while this replica leads and only for a bounded time (kube.groups.reservations)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube.record_writer import RecordWriter, StaticRecordStore


def obj(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": {}}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SlowStore(StaticRecordStore):
    """Each write takes ``took`` seconds of the injected clock."""

    def __init__(self, clock: Clock, took: float) -> None:
        super().__init__()
        self.clock = clock
        self.took = took

    def put(self, o: Mapping[str, Any]) -> None:
        super().put(o)
        self.clock.now += self.took


class FailingStore(StaticRecordStore):
    def put(self, o: Mapping[str, Any]) -> None:
        raise RuntimeError("503")


def test_stop_writes_what_is_queued_before_the_thread_ends() -> None:
    store = StaticRecordStore()
    w = RecordWriter(store, sleep=lambda s: None)
    w.submit("gpupack-group-x", obj("gpupack-group-x"))
    w.submit("gpupack-group-y", None)
    w.stop()
    w.start()  # the thread finds it stopped: flushes, then ends
    assert w.join(5)
    assert "gpupack-group-x" in store.objects and w.writes == 2


def test_stop_writes_what_waits_to_be_tried_again() -> None:
    clock = Clock()
    store = FailingStore()
    w = RecordWriter(store, sleep=lambda s: None, retries=0, clock=clock)
    w.submit("a", obj("a"))
    w.drain()  # fails: kept for later_s on
    assert w.later() == {"a": obj("a")}
    store.put = StaticRecordStore.put.__get__(store)  # type: ignore[method-assign]
    w.stop()
    w.start()
    assert w.join(5)
    assert "a" in store.objects and w.later() == {}


def test_a_replica_no_longer_leading_writes_nothing_on_stop() -> None:
    store = StaticRecordStore()
    w = RecordWriter(store, is_leader=lambda: False, sleep=lambda s: None)
    w.submit("a", obj("a"))
    w.stop()
    w.start()
    assert w.join(5)
    assert store.objects == {} and w.dropped == 1


def test_the_flush_on_stop_is_bounded() -> None:
    clock = Clock()
    store = SlowStore(clock, took=2.0)
    w = RecordWriter(store, sleep=lambda s: None, clock=clock)
    for name in "abcd":
        w.submit(name, obj(name))
    w.stop(drain_s=3.0)
    w.start()
    assert w.join(5)
    assert sorted(store.objects) == ["a", "b"]  # then out of time: c and d not tried


def test_a_failed_write_on_stop_does_not_stop_the_others() -> None:
    class OneFails(StaticRecordStore):
        def put(self, o: Mapping[str, Any]) -> None:
            if o["metadata"]["name"] == "a":
                raise RuntimeError("500")
            super().put(o)

    store = OneFails()
    w = RecordWriter(store, sleep=lambda s: None)
    w.submit("a", obj("a"))
    w.submit("b", obj("b"))
    w.stop()
    w.start()
    assert w.join(5)
    assert sorted(store.objects) == ["b"] and w.failures == 1


def test_join_without_a_thread_is_immediate() -> None:
    assert RecordWriter(StaticRecordStore()).join(0.1)
