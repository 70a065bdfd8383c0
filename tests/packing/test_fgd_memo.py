"""NodeState.version and the F(N) memo of the FGD-based scorers: a memoised delta must
equal a fresh one after any sequence of applies and undos, copies and pickling."""

from __future__ import annotations

import copy
import pickle
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packing_builders import mig, node, shared, whole

from packing.model import GpuMode, Placement, PodRequest, Snapshot
from packing.policies.fgd import NodeFigures, fragmentation_delta, typical_shapes
from packing.state import ClusterState

NODES = (node("w", 4), node("m", 2, mode=GpuMode.MIG), node("s", 2, mode=GpuMode.SHARED))
PODS: tuple[PodRequest, ...] = (
    whole("a", 1), whole("b", 2), mig("c", "1g.10gb"), mig("d", "3g.40gb"),
    shared("e", 250), shared("f", 500),
)


def test_version_is_new_after_apply_undo_copy_and_pickle() -> None:
    state = ClusterState(Snapshot(NODES))
    n = state.nodes["w"]
    seen = {n.version}
    p = state.options(PODS[0], "w")[0]
    state.apply(PODS[0], p)
    assert n.version not in seen
    seen.add(n.version)
    state.undo(PODS[0], p)
    assert n.version not in seen
    seen.add(n.version)
    for other in (copy.deepcopy(n), copy.copy(n), pickle.loads(pickle.dumps(n)), replace(n)):
        assert other.version not in seen and other == n  # same state, its own number
        seen.add(other.version)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.integers(0, len(PODS) - 1), st.sampled_from("wms"),
                                st.integers(0, 7), st.booleans()), max_size=25))
def test_memoised_delta_equals_a_fresh_one(steps: list[tuple[int, str, int, bool]]) -> None:
    shapes = typical_shapes(PODS)
    state = ClusterState(Snapshot(NODES))
    memo: dict[int, NodeFigures] = {}
    placed: list[tuple[PodRequest, Placement]] = []
    for i, (k, name, choice, undo) in enumerate(steps):
        if undo and placed:
            pod, p = placed.pop()
            state.undo(pod, p)
            continue
        pod = replace(PODS[k], key=f"p{i}")
        options = state.options(pod, name)
        for o in options:  # every option of the node, as a scorer's scan does
            assert fragmentation_delta(state, pod, o, shapes, memo) == \
                fragmentation_delta(state, pod, o, shapes)
        if options:
            p = options[choice % len(options)]
            state.apply(pod, p)
            placed.append((pod, p))
        if i % 5 == 4:  # a copy of the state is scored with the same memo
            state = ClusterState(Snapshot(NODES))
            placed.clear()
