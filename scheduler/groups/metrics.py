"""The reservation book's metrics (``gpupack serve``): reservations, GPUs held, groups
waiting by reason, members requeued, and how long a group takes to be whole. On the
leader only (a standby's figures would double the cluster's); registered by the command
layer on the extender's registry.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduler.groups.keys import WAIT_REASONS
from scheduler.groups.loop import ReservationBook

# First member seen -> all members bound: seconds to tens of minutes (LeaderReady groups
# wait for the leader to load its model before the workers exist).
GROUP_BUCKETS = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)


class GroupMetrics:
    """``gpupack_group_reservations``, ``gpupack_group_reserved_gpus``,
    ``gpupack_groups_waiting{reason}`` (bounded: :data:`scheduler.groups.keys.WAIT_REASONS`)
    and the ``gpupack_group_complete_seconds`` histogram, fed by the book."""

    def __init__(self, registry: CollectorRegistry, book: ReservationBook) -> None:
        self.complete = Histogram(
            "gpupack_group_complete_seconds",
            "Seconds from a group's first pod seen pending to all its members bound",
            buckets=GROUP_BUCKETS, registry=registry,
        )
        book.on_complete = self.complete.observe
        registry.register(GroupCollector(book))


class GroupCollector(Collector):
    def __init__(self, book: ReservationBook) -> None:
        self.book = book

    def collect(self) -> Iterator[Metric]:
        if not self.book.is_leader():
            return  # a standby: the leader's figures are the cluster's (see ExtenderMetrics)
        active, gpus, waiting = self.book.figures()
        g = GaugeMetricFamily("gpupack_group_reservations",
                              "Groups holding room for their members (active reservations)")
        g.add_metric([], active)
        yield g
        g = GaugeMetricFamily("gpupack_group_reserved_gpus",
                              "Whole GPUs held for group members not bound yet")
        g.add_metric([], gpus)
        yield g
        fam = GaugeMetricFamily("gpupack_groups_waiting",
                                "Groups waiting whole (holding nothing), by reason",
                                labels=["reason"])
        for reason in WAIT_REASONS:
            fam.add_metric([reason], waiting.get(reason, 0))
        yield fam
        c = CounterMetricFamily(
            "gpupack_group_members_requeued",
            "Refused group members given a status condition when their room was reserved, "
            "so kube-scheduler tries them again (kube/pod_conditions.py)")
        c.add_metric([], self.book.woken)
        yield c
