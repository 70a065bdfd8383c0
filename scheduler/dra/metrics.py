"""The DRA participant's figures and the devices of DRA nodes, as Prometheus metrics.

* ``gpupack_dra_devices{model,profile,state}``: devices published in ResourceSlices by
  GPU model, profile (a MIG profile, ``gpu`` for a whole GPU) and state (``used``,
  ``free``, ``unavailable``: :func:`packing.dra.inventory.device_states`). Each node's
  counts are kept for its generation in the cache and recomputed only for nodes that
  changed, so a scrape costs a lookup per DRA node under the cache lock.
* ``gpupack_dra_node_answers_total{verdict}``: the nodes the participant judged, by the
  allocator's predicted verdict (``allocated``, ``unschedulable``, ``error``,
  ``unknown``, ``kept``: allocated, but on room kept for a group).

Label sets are bounded: models and profiles come from the GPU catalog, states and
verdicts are fixed lists.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kube.cache import ClusterCache
from packing.dra.inventory import device_states
from scheduler.dra.plugin import DraVerbs

VERDICTS = ("allocated", "unschedulable", "error", "unknown", "kept")
STATES = ("used", "free", "unavailable")


class DraCollector(Collector):
    def __init__(self, cache: ClusterCache, verbs: DraVerbs) -> None:
        self.cache = cache
        self.verbs = verbs
        self._nodes: dict[str, tuple[int, dict[tuple[str, str, str], int]]] = {}

    def collect(self) -> Iterator[Metric]:
        cache = self.cache
        total: dict[tuple[str, str, str], int] = {}
        with cache.lock:
            names = cache.dra_nodes()
            held = cache.dra.world().allocated.in_use if names else frozenset()
            for name in names:
                gen = cache.gen(name)
                kept = self._nodes.get(name)
                if kept is None or kept[0] != gen:
                    inv = cache.dra_inventory(name)
                    kept = (gen, {} if inv is None else device_states(
                        inv, {d for d in inv.devices if d in held}))
                    self._nodes[name] = kept
                for k, v in kept[1].items():
                    total[k] = total.get(k, 0) + v
            for gone in [n for n in self._nodes if n not in names]:
                del self._nodes[gone]
            verdicts = dict(self.verbs.verdicts)
        fam = GaugeMetricFamily("gpupack_dra_devices",
                                "Devices of DRA nodes by GPU model, profile (gpu: a whole "
                                "GPU) and state (used, free, unavailable)",
                                labels=["model", "profile", "state"])
        for (model, profile, state), n in sorted(total.items()):
            fam.add_metric([model, profile, state], n)
        yield fam
        answers = CounterMetricFamily("gpupack_dra_node_answers",
                                      "Nodes judged for pods with claims, by the allocator's "
                                      "predicted verdict", labels=["verdict"])
        for verdict in VERDICTS:
            answers.add_metric([verdict], verdicts.get(verdict, 0))
        yield answers
