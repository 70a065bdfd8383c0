"""The rare-shape price on the real control plane (packing.policies.rare; issue 38 item
2, idea 9): the one node that can host a workload's rare shape is kept for it.

25 H100 nodes, one with 128 cores and 24 with 96: an 8-GPU pod asking 120 cores fits only
the first. The workload holds such a pod beside 48 one-GPU pods, all pending in a pool
with no node, so the 8-GPU shape is not one of FGD's typical shapes (2% of the pods).
The planner must build a new scorer when that shape appears, though the typical shapes do
not move (``gpupack_scorer_replacements{reason="rare_shapes"}``); the one-GPU pods then
leave the 128-core node to the 8-GPU pod that comes next.

Without the price (``RARE_WEIGHT`` 0, checked on a copy of the tree) the first one-GPU
pod goes to the 128-core node: the scorer rates it best (the core-deficit price charges
the 96-core nodes), and the planner's plan now takes the scorer's answer on a tie of its
objective (before, the solver's arbitrary pick won, and the pods went elsewhere with or
without the price).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cluster import GPU, bound_in, create_nodes, h100_whole, pod, wait_for
from conftest import Space
from controlplane import SCHEDULER_NAME, Stack, extender_metrics, metric_sample


def _replaced(stack: Stack, admin: Any, scraper: str, reason: str) -> float | None:
    fams = extender_metrics(stack, admin, scraper)
    return None if fams is None else metric_sample(fams, "gpupack_scorer_replacements",
                                                   reason=reason)


def _planned(stack: Stack, admin: Any, scraper: str, count: int) -> bool:
    """Whether the latest plan covered ``count`` pending pods (placed or refused): the
    planner has seen them all, and built its scorer from a workload holding them."""
    fams = extender_metrics(stack, admin, scraper)
    if fams is None or "gpupack_pending_pods" not in fams:
        return False
    return sum(x.value for x in fams["gpupack_pending_pods"].samples
               if x.labels.get("reason") != "not_planned_yet") == count


def test_the_node_a_rare_shape_needs_is_kept(stack: Stack, admin: Any, core: Any,
                                             space: Space, scraper: str) -> None:
    ns, waiting = space.namespace(), space.namespace("-w")
    later = f"{space.name}-later"  # a pool without nodes: these pods stay pending
    small = [replace(h100_whole(f"{space.name}-n{i:02d}", space.name),
                     allocatable={GPU: "8", "cpu": "96"}) for i in range(24)]
    big = replace(h100_whole(f"{space.name}-big", space.name),
                  allocatable={GPU: "8", "cpu": "128"})
    space.nodes += create_nodes(core, [*small, big])
    for i in range(48):
        core.create_namespaced_pod(waiting, pod(
            f"w-{i:02d}", pool=later, scheduler=SCHEDULER_NAME, limits={GPU: "1"},
            cpu="14" if i % 2 else "12", memory="8Gi"))
    wait_for(lambda: _planned(stack, admin, scraper, 48), 120, "a plan over the 48 pods")
    # The 8-GPU pod, 1 of 49: the typical shapes do not move, the rare shapes do, and the
    # planner builds the verbs a scorer that prices the 128-core node.
    rare = _replaced(stack, admin, scraper, "rare_shapes") or 0
    core.create_namespaced_pod(waiting, pod("llm-0", pool=later, scheduler=SCHEDULER_NAME,
                                            limits={GPU: "8"}, cpu="120", memory="64Gi"))
    wait_for(lambda: (_replaced(stack, admin, scraper, "rare_shapes") or 0) > rare, 60,
             "a scorer that knows the rare shape")
    for i in range(16):
        core.create_namespaced_pod(ns, pod(f"g-{i:02d}", pool=space.name,
                                           scheduler=SCHEDULER_NAME, limits={GPU: "1"},
                                           cpu="14", memory="8Gi"))
        where = bound_in(core, ns, i + 1)
        assert big.name not in where.values(), where
    core.create_namespaced_pod(ns, pod("llm-1", pool=space.name, scheduler=SCHEDULER_NAME,
                                       limits={GPU: "8"}, cpu="120", memory="64Gi"))
    assert bound_in(core, ns, 17)["llm-1"] == big.name
