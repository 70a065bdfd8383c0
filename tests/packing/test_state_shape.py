"""ClusterState.shape_error and over-committed apply/undo: what may be *recorded* for a
pod that is already bound, whatever the state thinks of its room."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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
        (MIGN, whole("p", 1), Placement("p", "a", (0,)), "is in mig mode"),
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
        # The GPU's mode must be able to hold it.
        (WHOLE, shared("p"), Placement("p", "a", (0,)), "is not shared (whole)"),
        (SHARED, whole("p", 1), Placement("p", "a", (0,)), "in shared mode"),
        (SHARED, mig("p"), Placement("p", "a", (0,), "1g.10gb", 0, True), "shared mode"),
        (WHOLE, mig("p"), Placement("p", "a", (0,), "1g.10gb", 0), "whole mode, not MIG"),
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


@pytest.mark.parametrize(
    ("info", "first", "second"),
    [
        (WHOLE, Placement("q", "a", (0,)), Placement("p", "a", (0,))),
        (MIGN, Placement("q", "a", (0,), "3g.40gb", 4), Placement("p", "a", (0,), "3g.40gb", 4)),
    ],
)
def test_a_gpu_or_slice_another_pod_holds_cannot_be_recorded_again(
    info: NodeInfo, first: Placement, second: Placement
) -> None:
    # Counting both would let the second's undo free the GPU under the first.
    s = state(info)
    kind = whole if first.mig_profile is None else (lambda k, _n: mig(k, "3g.40gb"))
    s.apply(kind("q", 1), first)
    why = s.shape_error(kind("p", 1), second)
    assert why is not None and "held by another pod" in why


def test_a_share_on_a_whole_gpu_makes_it_no_longer_convertible_to_mig() -> None:
    s = state(WHOLE)
    s.apply(shared("s"), Placement("s", "a", (0,)), allow_overcommit=True)
    assert not s.nodes["a"].gpus[0].convertible
    assert all(o.gpus != (0,) for o in s.options(mig("m"), "a"))


NODES = [MIGN, WHOLE, L40S, SHARED, node("a", 2, mode=GpuMode.FRACTIONAL),
         node("a", 1, model="A30-24GB", mode=GpuMode.MIG, layouts={0: [("2g.12gb", 0)]})]
PODS = [whole("p", 1), whole("p", 2), mig("p", "1g.10gb"), mig("p", "3g.40gb"),
        mig("p", "1g.10gb+me"), mig("p", "1g.6gb"), shared("p", milli=300), cpu_pod("p")]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NODES), st.lists(st.sampled_from(PODS), max_size=6),
       st.sampled_from(PODS), st.randoms(use_true_random=False))
def test_every_option_can_be_recorded(info: NodeInfo, before: list[PodRequest],
                                      pod: PodRequest, rng: random.Random) -> None:
    """What options() offers in any reachable state passes shape_error (the cache records
    bound pods through it, and re-fits them from options)."""
    s = state(info)
    for i, b in enumerate(before):
        b = replace(b, key=f"b{i}")
        opts = s.options(b, "a")
        if opts:
            s.apply(b, rng.choice(opts))
    for o in s.options(pod, "a"):
        assert s.shape_error(pod, o) is None, o

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
