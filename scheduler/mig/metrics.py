"""The MIG actuator's metrics (registered by every extender: zero when it is off), and
``gpupack_mig_slices{profile,state}``: the actuator's last decision's figures when it
acts, else computed from the cache at most every 15 s (:class:`SliceFigures`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily

from kube.cache import ClusterCache
from packing.model import RequestKind
from scheduler.mig.decide import (
    ActuatorState,
    MigDecision,
    MigPod,
    waiting_demand,
)
from scheduler.mig.views import Views

Clock = Callable[[], float]
# What a MIG change ends as (gpupack_mig_reconfigurations{result}).
RESULTS = ("started", "success", "failed", "timeout", "superseded", "error")


class Acting(Protocol):
    """What the slice figures read of the actuator (:class:`scheduler.mig.loop.
    MigActuator`): its last decision, and whether this replica leads."""

    @property
    def last(self) -> MigDecision | None: ...

    @property
    def is_leader(self) -> Callable[[], bool]: ...


class MigMetrics:
    """``gpupack_mig_*`` on the extender's registry: registered by every extender (zero
    when the actuator is off), so the dashboards and alerts have series everywhere.
    ``gpupack_mig_slices{profile,state}`` is computed at scrape time (:class:`SliceFigures`)."""

    def __init__(self, registry: Any, slices: SliceFigures | None = None) -> None:
        from prometheus_client import Counter, Gauge

        self.reconfigurations = Counter(
            "gpupack_mig_reconfigurations", "MIG layout changes by result (started, "
            "success, failed, timeout, superseded, error = not handed over)",
            ["result"], registry=registry)
        for r in RESULTS:
            self.reconfigurations.labels(r)
        self.in_flight = Gauge("gpupack_mig_reconfigurations_in_flight",
                               "MIG layout changes handed to the MIG manager, not ended",
                               registry=registry)
        self.converted = Counter(
            "gpupack_mig_gpus_converted", "GPUs whose layout a successful change set, by "
            "what they became (mig, whole)", ["to"], registry=registry)
        for t in ("mig", "whole"):
            self.converted.labels(t)
        if slices is not None:
            registry.register(slices)
        self.backoff = Gauge("gpupack_mig_nodes_backed_off",
                             "nodes the MIG actuator leaves alone after a failed change",
                             registry=registry)
        self.held = Gauge("gpupack_mig_gpus_held",
                          "GPUs held for MIG changes in flight", registry=registry)
        self.requeued = Counter(
            "gpupack_mig_pods_requeued", "Pending pods given a status condition when a MIG "
            "change made what they wait for, so kube-scheduler tries them again",
            registry=registry)


def slice_figures(cache: ClusterCache, views: Views | None = None
                  ) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    """(free, waiting) slices per (model, profile) from the cache: what
    :func:`~scheduler.mig.decide.waiting_demand` says without changes in flight."""
    with cache.lock:
        nodes = (views or Views(cache)).all()
        pods = tuple(MigPod(p.key, p.mig_profile, p.gpu_models) for p in cache.pending()
                     if p.kind is RequestKind.MIG and p.mig_profile)
    waiting, free = waiting_demand(ActuatorState(tuple(nodes), mig_pods=pods))
    return free, waiting


class SliceFigures:
    """Collector of ``gpupack_mig_slices{profile,state}``: the actuator's last decision
    when it acts (its figures count slices being created), else computed from the cache
    at most every ``max_age_s`` (a pass over every GPU, kept off the scrape path)."""

    def __init__(self, cache: ClusterCache, actuator: Callable[[], Acting | None],
                 max_age_s: float = 15.0, clock: Clock = time.monotonic) -> None:
        self.cache = cache
        self.actuator = actuator
        self.max_age_s = max_age_s
        self.clock = clock
        self._at = -math.inf
        self._views = Views(cache)
        self._figures: tuple[Mapping[tuple[str, str], int], Mapping[tuple[str, str], int]] = (
            {}, {})

    def figures(self) -> tuple[Mapping[tuple[str, str], int], Mapping[tuple[str, str], int]]:
        act = self.actuator()
        if act is not None and act.last is not None and act.is_leader():
            return act.last.free, act.last.waiting
        if self.clock() - self._at >= self.max_age_s:
            self._figures = slice_figures(self.cache, self._views)
            self._at = self.clock()
        return self._figures

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The family without samples: registering computes nothing."""
        yield self._family()

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily("gpupack_mig_slices", "MIG slices per profile: free (exist, "
                              "no one holds them) and waiting (pending pods that no free "
                              "slice and no slice being created serves)",
                              labels=["profile", "state"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = self._family()
        free, waiting = self.figures()
        for state, figures in (("free", free), ("waiting", waiting)):
            per_profile: dict[str, int] = {}
            for (_, p), n in figures.items():
                per_profile[p] = per_profile.get(p, 0) + n
            for p, n in sorted(per_profile.items()):
                g.add_metric([p, state], n)
        yield g
