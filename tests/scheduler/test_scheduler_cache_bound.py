"""Bound pods that do not fit the cache's view of their node (a pod the device plugin
gave what our view lacks, a recorded placement that disagrees with the request, a node
that shrank under its pods): each is still counted, nothing crashes, and the books of
the cache and of the packing state stay in step."""

from __future__ import annotations

from typing import Any

import pytest
from sched_builders import L40S, make_cache, mig_pod, node, pod, shared_pod, whole_pod

from packing.model import RequestKind


def consistent(cache: Any) -> None:
    """Every counted pod is on its node in the packing state, with its CPU taken."""
    for name, n in cache.state.nodes.items():
        counted = {k for k, (_, p) in cache._counted.items() if p.node == name}
        assert set(n.pods) == counted == cache._on_node.get(name, set())
        cpu = sum(cache._counted[k][0].cpu_milli for k in counted)
        assert n.cpu_free == n.info.cpu_milli - cpu
        for g in n.gpus:  # every owner recorded on a GPU is a pod counted there
            owners = {o for _, o in g.instances.values() if o} | set(g.shared_owners)
            if g.whole_owner:
                owners.add(g.whole_owner)
            assert owners <= counted


def ann(gpus: str, mig: str | None = None) -> dict[str, str]:
    out = {"gpupack.io/gpus": gpus}
    if mig is not None:
        out["gpupack.io/mig"] = mig
    return out


MIG_NODE = node("w", gpus=1, mig={"3g.40gb": 2}, reconfigurable=False)


@pytest.mark.parametrize(
    ("nodes", "pods", "gpu_less"),
    [
        # A MIG pod on a node whose GPUs have no MIG.
        ([node("w", product=L40S, gpus=1)], [mig_pod("m", node="w", scheduler="x")], 1),
        # A third share on a GPU time-sliced two ways.
        ([node("w", gpus=1, shared_replicas=2)],
         [shared_pod(f"s{i}", node="w", scheduler="x") for i in range(3)], 1),
        # Recorded on a GPU the node does not have: re-fitted to one it has.
        ([node("w", gpus=2, reconfigurable=False)],
         [whole_pod("a", 1, node="w", annotations=ann("5"))], 0),
        # Recorded with more GPUs than it asks for.
        ([node("w", gpus=2, reconfigurable=False)],
         [whole_pod("a", 1, node="w", annotations=ann("0,1"))], 0),
        # A MIG pod recorded with a GPU but no slice.
        ([MIG_NODE], [mig_pod("m", "3g.40gb", node="w", annotations=ann("0"))], 0),
        # A slice at a start its profile does not allow, and one of another profile.
        ([MIG_NODE], [mig_pod("m", "3g.40gb", node="w", annotations=ann("0", "3g.40gb@2"))], 0),
        ([MIG_NODE], [mig_pod("m", "3g.40gb", node="w", annotations=ann("0", "1g.10gb@0"))], 0),
        # Three 3g pods on a GPU with two 3g slices: the third holds CPU only.
        ([MIG_NODE], [mig_pod(f"m{i}", "3g.40gb", node="w", scheduler="x") for i in range(3)], 1),
    ],
)
def test_bound_pods_the_view_has_no_room_for_are_counted(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], gpu_less: int
) -> None:
    cache = make_cache(nodes)
    for p in pods:
        assert cache.upsert_pod(p)
    consistent(cache)
    assert cache.counts()["counted"] == len(pods)
    items = [cache.counted(f"default/{p['metadata']['name']}") for p in pods]
    assert sum(1 for req, pl in items
               if req.kind is not RequestKind.NONE and not pl.gpus) == gpu_less
    for p in pods:  # and each goes away cleanly
        cache.delete_pod(f"default/{p['metadata']['name']}")
        consistent(cache)
    n = cache.state.nodes["w"]
    assert n.cpu_free == n.info.cpu_milli and all(g.idle for g in n.gpus)


def test_a_node_that_shrinks_under_its_pods_keeps_counting_all_of_them() -> None:
    cache = make_cache([node("w", gpus=4, reconfigurable=False)])
    for i in range(4):
        assert cache.upsert_pod(whole_pod(f"a{i}", 1, node="w", annotations=ann(str(i))))
    assert cache.upsert_pod(pod("cpu", node="w", cpu="2"))
    cache.upsert_node(node("w", gpus=2, reconfigurable=False))
    consistent(cache)
    assert cache.counts()["counted"] == 5
    assert cache.state.nodes["w"].cpu_free == 64_000 - 4 * 1000 - 2000
    held = sorted(p.gpus for _, p in (cache.counted(f"default/a{i}") for i in range(4)))
    assert held == [(), (), (0,), (1,)]
    cache.upsert_node(node("w", gpus=4, reconfigurable=False))  # and grows back
    consistent(cache)
    assert cache.state.whole_gpus_free() == 0


def test_a_mig_node_relaid_out_under_bound_slices_keeps_counting_them() -> None:
    cache = make_cache([node("w", gpus=1, mig={"1g.10gb": 7}, reconfigurable=False)])
    for i in range(3):
        assert cache.upsert_pod(
            mig_pod(f"m{i}", node="w", annotations=ann("0", f"1g.10gb@{i}"))
        )
    cache.upsert_node(node("w", gpus=1, mig={"7g.80gb": 1}, reconfigurable=False))
    consistent(cache)
    assert cache.counts()["counted"] == 3
    cache.upsert_node(node("w", gpus=1, mig={"1g.10gb": 7}, reconfigurable=False))
    consistent(cache)
    assert [cache.counted(f"default/m{i}")[1].mig_start for i in range(3)] == [0, 1, 2]


def test_events_a_source_skips_count_as_bad_objects() -> None:
    cache = make_cache([node("w", gpus=1)])
    cache.note_bad_object()
    assert cache.bad_objects == 1
