"""ClusterState: options, apply/undo and reasons, table-driven."""

from __future__ import annotations

import pytest
from packing_builders import cpu_pod, mig, node, shared, whole

from packing.model import GpuMode, Placement, Snapshot
from packing.state import ClusterState, PlacementError


def state(*nodes: object) -> ClusterState:
    return ClusterState(Snapshot(tuple(nodes)))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("nodes", "pod", "count"),
    [
        ([node("a", 4)], whole("p", 2), 1),  # one canonical choice of GPUs per node
        ([node("a", 1)], whole("p", 2), 0),
        ([node("a", 2, mode=GpuMode.MIG)], whole("p", 1), 0),  # MIG GPUs serve no whole pod
        ([node("a", 1, mode=GpuMode.MIG)], mig("p", "1g.10gb"), 7),  # 7 starts on an empty GPU
        ([node("a", 1, mode=GpuMode.MIG)], mig("p", "3g.40gb"), 2),
        ([node("a", 1, mode=GpuMode.MIG)], mig("p", "7g.80gb"), 1),
        (
            [
                node(
                    "a",
                    1,
                    mode=GpuMode.MIG,
                    reconfigurable=False,
                    layouts={0: [("3g.40gb", 4), ("1g.10gb", 0)]},
                )
            ],
            mig("p", "1g.10gb"),
            1,
        ),
        (
            [node("a", 1, mode=GpuMode.MIG, reconfigurable=False, layouts={0: [("3g.40gb", 4)]})],
            mig("p", "1g.10gb"),
            0,
        ),
        ([node("a", 1, model="L40S", mode=GpuMode.MIG)], mig("p"), 0),  # L40S has no MIG
        # The device plugin, not gpupack, picks the GPU of a share: one option.
        ([node("a", 2, model="L40S", mode=GpuMode.SHARED)], shared("p"), 1),
        ([node("a", 1, model="L40S", mode=GpuMode.SHARED)], shared("p", gmem=60_000), 0),
        ([node("a", 2, model="L40S", mode=GpuMode.SHARED)], whole("p"), 0),
        ([node("a", 1, cpu=500)], cpu_pod("p", 1000), 0),
        ([node("a", 1)], cpu_pod("p", 1000), 1),
        ([node("a", 1)], mig("p"), 7),  # an idle whole H100 may be switched to MIG
        ([node("a", 1, reconfigurable=False)], mig("p"), 0),
    ],
)
def test_options(nodes: list, pod, count: int) -> None:  # type: ignore[no-untyped-def]
    assert len(state(*nodes).options(pod, "a")) == count


def test_dedupe_offers_one_idle_gpu_per_signature() -> None:
    s = state(node("a", 8, mode=GpuMode.MIG))
    assert len(s.options(mig("p"), "a")) == 56
    assert len(s.options(mig("p"), "a", dedupe=True)) == 7


def test_apply_then_undo_restores_everything() -> None:
    s = state(node("a", 2))
    before = (s.whole_gpus_free(), s.nodes["a"].cpu_free)
    p = mig("m")
    o = s.options(p, "a")[0]
    s.apply(p, o)
    assert s.gpu("a", 0).converted and s.whole_gpus_free() == 1
    s.undo(p, o)
    assert (s.whole_gpus_free(), s.nodes["a"].cpu_free) == before
    assert not s.gpu("a", 0).converted and not s.gpu("a", 0).instances


def test_apply_refuses_a_busy_gpu() -> None:
    s = state(node("a", 1))
    s.apply(whole("w1"), Placement("w1", "a", (0,)))
    with pytest.raises(PlacementError, match="in use"):
        s.apply(whole("w2"), Placement("w2", "a", (0,)))


def test_shared_gpu_replicas_and_memory_bound() -> None:
    s = state(node("a", 1, model="L40S", mode=GpuMode.SHARED, replicas=2))
    for i in range(2):
        s.apply(shared(f"s{i}", 100, 1000), s.options(shared(f"s{i}", 100, 1000), "a")[0])
    assert s.options(shared("s3", 100, 1000), "a") == []


@pytest.mark.parametrize(
    ("pod", "text"),
    [
        (whole("p", 9), "usable GPU"),
        (mig("p", "1g.10gb"), "no GPU of a usable kind"),
    ],
)
def test_unresolvable_reasons(pod, text: str) -> None:  # type: ignore[no-untyped-def]
    s = state(node("a", 8, model="L40S", mode=GpuMode.SHARED))
    if pod.kind.value == "whole":
        s = state(node("a", 8))
    why = s.unresolvable(pod, "a")
    assert why is not None and text in why


@pytest.mark.parametrize("pod", [whole("w", 2), cpu_pod("c"), shared("s")])
def test_undo_of_a_pod_not_on_the_node_changes_nothing(pod) -> None:  # type: ignore[no-untyped-def]
    state = ClusterState(Snapshot((node("n", 2, mode=GpuMode.SHARED if pod.key == "s" else
                                        GpuMode.WHOLE),)))
    p = state.options(pod, "n")[0]
    state.apply(pod, p)
    state.undo(pod, p)
    free = (state.nodes["n"].cpu_free, state.nodes["n"].mem_free)
    with pytest.raises(KeyError, match="not placed on n"):
        state.undo(pod, p)  # twice: the second must not give CPU and memory back again
    assert (state.nodes["n"].cpu_free, state.nodes["n"].mem_free) == free


def test_undo_never_frees_a_gpu_another_pod_now_holds() -> None:
    # Two records claimed GPU 0 (a relist placed an unannotated pod first): removing the
    # one that lost the GPU must not free it under the other.
    state = ClusterState(Snapshot((node("n", 2),)))
    a, b = whole("a", 1), whole("b", 1)
    state.apply(a, Placement("a", "n", (0,)))
    state.apply(b, Placement("b", "n", (0,)), allow_overcommit=True)
    state.undo(a, Placement("a", "n", (0,)))
    assert state.gpu("n", 0).whole_owner == "b" and state.whole_gpus_free() == 1
