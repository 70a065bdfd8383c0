"""ClusterState.shape_error and over-committed apply/undo: what may be *recorded* for a
pod that is already bound, whatever the state thinks of its room."""

from __future__ import annotations

import copy

import pytest
from packing_builders import cpu_pod, mig, node, shared, whole

from packing.model import GpuMode, NodeInfo, Placement, PodRequest, Snapshot
from packing.state import ClusterState, PlacementError


def state(*nodes: NodeInfo) -> ClusterState:
    return ClusterState(Snapshot(tuple(nodes)))


MIGN = node("a", 2, mode=GpuMode.MIG, layouts={0: [("3g.40gb", 4)]})
WHOLE = node("a", 2)
L40S = node("a", 2, model="L40S")
SHARED = node("a", 1, mode=GpuMode.SHARED, replicas=2)


@pytest.mark.parametrize(
    ("info", "pod", "placement", "error"),
    [
        # Accepted: what the device plugin could really have handed out.
        (WHOLE, whole("p", 2), Placement("p", "a", (0, 1)), None),
        (MIGN, mig("p", "3g.40gb"), Placement("p", "a", (0,), "3g.40gb", 4), None),
        (MIGN, mig("p", "3g.40gb"), Placement("p", "a", (0,), "3g.40gb", 0), None),
        (MIGN, mig("p", "1g.10gb"), Placement("p", "a", (1,), "1g.10gb", 6, True), None),
        (SHARED, shared("p"), Placement("p", "a", (0,)), None),
        # Without GPUs: CPU and memory only, for every kind.
        (WHOLE, whole("p", 2), Placement("p", "a"), None),
        (MIGN, mig("p"), Placement("p", "a"), None),
        (SHARED, shared("p"), Placement("p", "a"), None),
        (WHOLE, cpu_pod("p"), Placement("p", "a"), None),
        # Refused.
        (WHOLE, whole("p", 1), Placement("p", "b", (0,)), "unknown node b"),
        (WHOLE, whole("p", 1), Placement("p", "a", (5,)), "has no GPU 5"),
        (WHOLE, whole("p", 1), Placement("p", "a", (0, 1)), "needs 1 distinct GPUs"),
        (WHOLE, whole("p", 2), Placement("p", "a", (0, 0)), "needs 2 distinct GPUs"),
        (MIGN, whole("p", 1), Placement("p", "a", (0,)), "is in MIG mode"),
        (WHOLE, cpu_pod("p"), Placement("p", "a", (0,)), "asks for no GPU"),
        (MIGN, mig("p"), Placement("p", "a", (0,)), "placement gives None@None"),
        (MIGN, mig("p"), Placement("p", "a", (), "1g.10gb", 0), "without its GPU"),
        (MIGN, mig("p", "1g.10gb"), Placement("p", "a", (0,), "3g.40gb", 4), "asks for MIG 1g"),
        (MIGN, mig("p", "3g.40gb"), Placement("p", "a", (1,), "3g.40gb", 2), "start 2 is not"),
        (MIGN, mig("p", "1g.10gb"), Placement("p", "a", (0,), "1g.10gb", 5), "overlaps 3g"),
        (MIGN, mig("p", "1g.10gb"), Placement("p", "a", (0,), "1g.10gb", 4), "has 3g.40gb@4"),
        (MIGN, mig("p", "3g.40gb"), Placement("p", "a", (0,), "3g.40gb", 4, True), "already"),
        (MIGN, mig("p", "1g.10gb"), Placement("p", "a", (0, 1), "1g.10gb", 0), "one GPU"),
        (L40S, mig("p", "1g.10gb"), Placement("p", "a", (0,), "1g.10gb", 0), "has no MIG"),
        (SHARED, shared("p"), Placement("p", "a", (0,), "1g.10gb", 0), "as a MIG slice"),
        (MIGN, shared("p"), Placement("p", "a", (0,)), "is not shared"),
    ],
)
def test_shape_error(info: NodeInfo, pod: PodRequest, placement: Placement,
                     error: str | None) -> None:
    s = state(info)
    why = s.shape_error(pod, placement)
    if error is None:
        assert why is None
        s.apply(pod, placement, allow_overcommit=True)
        s.undo(pod, placement)
        assert s.nodes["a"].cpu_free == info.cpu_milli
    else:
        assert why is not None and error in why
        before = copy.deepcopy(s.nodes)
        with pytest.raises(PlacementError, match="p: "):
            s.apply(pod, placement, allow_overcommit=True)
        assert s.nodes == before  # refused before anything changed


def test_a_gpu_less_placement_counts_cpu_and_memory_only_and_undoes_cleanly() -> None:
    s = state(MIGN)
    taken = mig("q", "3g.40gb")
    s.apply(taken, Placement("q", "a", (0,), "3g.40gb", 4))
    over = mig("p", "3g.40gb", cpu=5000)
    s.apply(over, Placement("p", "a"), allow_overcommit=True)
    n = s.nodes["a"]
    assert n.cpu_free == MIGN.cpu_milli - 1000 - 5000
    assert n.gpus[0].instances == {4: ("3g.40gb", "q")}
    s.undo(over, Placement("p", "a"))
    assert n.cpu_free == MIGN.cpu_milli - 1000
    assert n.gpus[0].instances == {4: ("3g.40gb", "q")}
    with pytest.raises(KeyError):
        s.undo(over, Placement("p", "a"))


def test_strict_apply_refuses_a_gpu_less_placement_of_a_gpu_pod() -> None:
    with pytest.raises(PlacementError, match="no such free resource"):
        state(SHARED).apply(shared("p"), Placement("p", "a"))
