"""What the watched cluster cache (:class:`kube.cache.ClusterCache`) holds, as metrics.

Every process that watches the cluster exports these from its own cache, so an alert
sees each one: the extender (``gpupack serve``) and the standalone webhook
(``gpupack webhook --kubeconfig/--in-cluster``), which keeps a cache of its own.

``gpupack_cache_nodes``, ``gpupack_cache_pods``, ``gpupack_cache_assumed_pods``,
``gpupack_cache_synced`` (1 once the first list is in), ``gpupack_cache_bad_objects``
(objects skipped as unreadable), ``gpupack_node_inventories_stale`` (nodes whose agent
inventory aged past ``--inventory-max-age`` and is ignored),
``gpupack_device_plugin_disagreements_total{kind}``, ``gpupack_pods_counted_worst_case``
(bound pods whose gpupack inputs cannot be read, counted at their worst:
:mod:`kube.worst_case`) and ``gpupack_pod_counted_worst_case{namespace,pod}`` naming each
(at most :data:`NAMED_WORST_CASE` of them, by name); with DRA objects,
``gpupack_dra_predictions_checked_total{outcome}`` (each allocation assumed at bind
compared with the one kube-scheduler wrote: ``agree`` or ``disagree``, each disagreement
logged with both device lists) and ``gpupack_dra_nodes`` (nodes whose GPUs are
ResourceSlices).

A collector reads the cache under its lock at scrape time: a handful of counters, so a
scrape costs the verbs nothing measurable.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kube.cache import ClusterCache

DISAGREEMENT_KINDS = ("shared", "mig")
# Pods named one by one in gpupack_pod_counted_worst_case (a bounded number of series).
NAMED_WORST_CASE = 100


def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    """One unlabelled gauge sample (also the extender's cluster figures')."""
    g = GaugeMetricFamily(name, doc)
    g.add_metric([], value)
    return g


class CacheCollector(Collector):
    """The cache's own figures, read at each scrape."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        cache = self.cache
        with cache.lock:
            counts = cache.counts()
            synced = cache.synced
            bad = cache.bad_objects
            stale = cache.stale_inventories
            disagreements = dict(cache.disagreements)
            worst = sorted(cache.worst_case_pods())
            checked = (cache.dra.agreements, cache.dra.disagreements)
            dra_nodes = len(cache.dra_nodes())
        yield gauge("gpupack_cache_nodes", "Nodes in this process's cache", counts["nodes"])
        yield gauge("gpupack_cache_pods", "Pods in this process's cache", counts["pods"])
        yield gauge("gpupack_cache_assumed_pods",
                    "Pods bound by gpupack, not yet seen bound", counts["assumed"])
        yield gauge("gpupack_cache_synced", "1 once the first list of nodes and pods is in",
                    1.0 if synced else 0.0)
        yield gauge("gpupack_cache_bad_objects",
                    "Objects the cache could not read (skipped)", bad)
        yield gauge("gpupack_node_inventories_stale",
                    "Nodes whose node agent inventory was not rewritten for "
                    "--inventory-max-age and is ignored (their GPUs inferred from "
                    "allocatable and labels)", stale)
        fam = CounterMetricFamily(
            "gpupack_device_plugin_disagreements",
            "Pods the node agent saw on another GPU or MIG slice than gpupack predicted or "
            "recorded (the observation is counted), by kind (shared, mig)", labels=["kind"])
        for kind in DISAGREEMENT_KINDS:
            fam.add_metric([kind], disagreements.get(kind, 0))
        yield fam
        yield gauge("gpupack_pods_counted_worst_case",
                    "Bound pods whose gpupack inputs cannot be read, counted at their worst "
                    "(their whole declared resource, a share as its whole GPU)", len(worst))
        named = GaugeMetricFamily(
            "gpupack_pod_counted_worst_case",
            "1 for each bound pod counted at its worst because its gpupack inputs cannot be "
            f"read (the first {NAMED_WORST_CASE} by name)", labels=["namespace", "pod"])
        for key in worst[:NAMED_WORST_CASE]:
            ns, _, name = key.partition("/")
            named.add_metric([ns, name], 1.0)
        yield named
        fam = CounterMetricFamily(
            "gpupack_dra_predictions_checked",
            "Claim allocations gpupack assumed at bind, compared with the one kube-scheduler "
            "wrote into status.allocation, by outcome (agree, disagree)", labels=["outcome"])
        fam.add_metric(["agree"], checked[0])
        fam.add_metric(["disagree"], checked[1])
        yield fam
        yield gauge("gpupack_dra_nodes", "Nodes whose GPUs are devices of ResourceSlices "
                    "(Dynamic Resource Allocation)", dra_nodes)
