"""The MIG actuator's view of the extender's cache: every node as
:func:`scheduler.mig.decide.decide_mig` sees it (:class:`~scheduler.mig.decide.NodeView`:
its GPUs, their MIG layouts and who holds each, its opt-in, labels and taints; a DRA
node's partitionable GPUs marked DynamicMIG), rebuilt only for the nodes that changed.
"""

from __future__ import annotations

from typing import Any

from kube.cache import ClusterCache
from scheduler.mig.decide import (
    CONFIG_LABEL,
    STATE_LABEL,
    NodeView,
    gpu_view,
)


def node_view(cache: ClusterCache, name: str) -> NodeView:
    ns = cache.state.nodes[name]
    info = ns.info
    inventory = cache.dra_inventory(name)
    dynamic = inventory.partitionable if inventory is not None else frozenset()
    gpus = tuple(gpu_view(g, g.info.index in dynamic) for g in ns.gpus)
    tainted = any(t.effect in ("NoSchedule", "NoExecute") for t in cache.taints(name))
    return NodeView(name, info.mig_reconfigure, gpus, info.unschedulable,
                    info.labels.get(CONFIG_LABEL), info.labels.get(STATE_LABEL), tainted)


class Views:
    """Every node as :func:`decide_mig` sees it, rebuilt only for the nodes whose generation
    (anything on the node) or taints changed since the last call: a pass over a
    5,000-node cache is then a dictionary lookup per node, not 40,000 GPU views."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self._memo: dict[str, tuple[tuple[int, Any], NodeView]] = {}

    def all(self) -> list[NodeView]:
        """Call under the cache lock."""
        cache = self.cache
        out = []
        names = cache.state.nodes
        for name in names:
            key = (cache.gen(name), cache.taints(name))
            hit = self._memo.get(name)
            if hit is None or hit[0] != key:
                hit = (key, node_view(cache, name))
                self._memo[name] = hit
            out.append(hit[1])
        if len(self._memo) > len(names):
            for gone in [n for n in self._memo if n not in names]:
                del self._memo[gone]
        return out
