"""A burst through the real kube-scheduler and gpupack's extender packs node after node
(issue 38 item 4; bench/README.md, "Where a burst's packing was lost").

kube-scheduler schedules the next pod before the previous pod's bind reaches the
extender, and breaks equal totals at random. The extender's filter hands back the one
node the policy places the pod on (``--filter-top 1``), ties among equal nodes broken
in a fixed order with nodes in use first, so pods in flight land on the same node until
kube-scheduler's own Filter finds it full. A pod that declares soft preferences gets
every fitting node, for kube-scheduler's score plugins to weigh.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cluster import (
    GPU,
    SHARED,
    bound_in,
    create_nodes,
    h100_whole,
    l40s_shared,
    pod,
)
from conftest import Space
from controlplane import SCHEDULER_NAME


def test_a_burst_fills_node_after_node(space: Space, core: Any) -> None:
    # Two bursts on two sets of nodes: the second meets the scorer made from the first's
    # workload (time-sliced shares and one-GPU pods, the first burst's pods still
    # running), as a cluster in use does; the first may still meet the scorer of an
    # empty workload, which rates every node equal.
    for burst in range(2):
        ns = space.namespace(f"r{burst}")
        prefix = f"{space.name}-r{burst}"
        space.nodes += create_nodes(core, [
            *(l40s_shared(f"{prefix}-l40s-{i}", prefix) for i in range(5)),
            *(h100_whole(f"{prefix}-whole-{i}", prefix) for i in range(5)),
        ])
        # 32 shares (16 per L40S node: 4 GPUs x 4 replicas) and 16 one-GPU pods (8 per
        # node), interleaved and created at once, each burst on its own pool of nodes:
        # the fewest nodes are 2 + 2.
        bodies = [pod(f"b-{i:02d}", pool=prefix, scheduler=SCHEDULER_NAME,
                      limits={SHARED if i % 3 else GPU: "1"}, cpu="100m", memory="256Mi")
                  for i in range(48)]
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda b, ns=ns: core.create_namespaced_pod(ns, b), bodies))
        where = bound_in(core, ns, len(bodies))
        kinds: dict[str, Counter[str]] = {SHARED: Counter(), GPU: Counter()}
        for b in bodies:
            (resource,) = b["spec"]["containers"][0]["resources"]["limits"]
            node = where[b["metadata"]["name"]]
            assert node.startswith(prefix), (burst, node)
            kinds[resource][node] += 1
        # The fewest nodes, 2 + 2. Plain kube-scheduler's random tie-break among equal
        # totals spreads the same burst over all 5 nodes of a kind. Before the scorer
        # counted a share only on GPUs that take shares (packing/policies/gpupack.py,
        # served_kinds), the second burst's one-GPU pods went 6 / 6 / 4 or 7 / 7 / 2:
        # the shares' capacity on a whole-GPU node's free GPUs made its last GPUs cost
        # more than a fresh node's.
        assert sorted(kinds[SHARED].values()) == [16, 16], (burst, kinds[SHARED])
        assert sorted(kinds[GPU].values()) == [8, 8], (burst, kinds[GPU])


def test_a_pod_with_soft_preferences_gets_them_weighed(space: Space, core: Any) -> None:
    ns = space.namespace()
    names = create_nodes(core, [l40s_shared(f"{space.name}-l40s-{i}", space.name)
                                for i in range(3)])
    space.nodes += names
    # All three empty: the policy rates them equal, and its winner (the first name) leads
    # by one extender point (50); the preferred node affinity (weight 2 x 100) outweighs it,
    # but only if kube-scheduler gets more than the one node to score.
    picky = pod("picky", pool=space.name, scheduler=SCHEDULER_NAME, limits={SHARED: "1"},
                cpu="100m", memory="256Mi")
    picky["spec"]["affinity"] = {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {
            "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                  "values": [names[2]]}]}}]}}
    core.create_namespaced_pod(ns, picky)
    assert bound_in(core, ns, 1) == {"picky": names[2]}
    # The next pod, without preferences, joins the node in use rather than the first name.
    core.create_namespaced_pod(ns, pod("plain", pool=space.name, scheduler=SCHEDULER_NAME,
                                       limits={SHARED: "1"}, cpu="100m", memory="256Mi"))
    assert bound_in(core, ns, 2)["plain"] == names[2]
