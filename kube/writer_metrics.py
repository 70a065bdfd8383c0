"""What the background writers (:class:`kube.record_writer.RecordWriter`) did, as metrics.

``gpupack_record_writes_total{what, outcome}``: ``written``; ``retried_later`` (failed its
quick retries, tried again later); ``dropped`` (this replica stopped leading before it was
written); ``given_up`` (the API answered 400 or 422: it never will take it).
``gpupack_record_writes_waiting{what}``: failed writes waiting to be tried again.

``what`` names the writer: ``group record`` (group reservations), ``pod condition`` (the
wakes of parked pods), ``compaction memory`` (MIG compaction across leaders). A write
that keeps failing loses what it carries on the next failover (a reservation, the
compaction budget) or leaves a pod parked until kube-scheduler's next event: the alert
``GpupackRecordWritesFailing`` watches ``retried_later`` and ``given_up``.

A collector reads the writers' own counters at scrape time, so the writers need no
metrics library.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kube.record_writer import RecordWriter

OUTCOMES = ("written", "retried_later", "dropped", "given_up")


class WriterCollector(Collector):
    """The writers' counters (``writers`` is called at every scrape: writers made after
    registration are counted too)."""

    def __init__(self, writers: Callable[[], Iterable[RecordWriter | None]]) -> None:
        self.writers = writers

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def _families(self) -> tuple[CounterMetricFamily, GaugeMetricFamily]:
        return (CounterMetricFamily("gpupack_record_writes", "Writes of gpupack's records "
                                    "(group reservations, pod conditions, compaction "
                                    "memory) by outcome", labels=["what", "outcome"]),
                GaugeMetricFamily("gpupack_record_writes_waiting", "Failed writes waiting "
                                  "to be tried again", labels=["what"]))

    def collect(self) -> Iterator[Metric]:
        total, waiting = self._families()
        for w in self.writers():
            if w is None:
                continue
            counts = {"written": w.writes, "retried_later": w.failures,
                      "dropped": w.dropped, "given_up": w.given_up}
            for outcome in OUTCOMES:
                total.add_metric([w.what, outcome], counts[outcome])
            waiting.add_metric([w.what], len(w.later()))
        yield total
        yield waiting


def register_writers(registry: Any, writers: Callable[[], Iterable[RecordWriter | None]]
                     ) -> WriterCollector:
    collector = WriterCollector(writers)
    registry.register(collector)
    return collector


__all__ = ["OUTCOMES", "WriterCollector", "register_writers"]
