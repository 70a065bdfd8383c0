"""The batch model's limits (packing/cpsat.py): ``max_variables`` holds for every batch,
whole-GPU pods' included, and the lexicographic objective's weights stay within the
integers CP-SAT accepts, or the model is not built and the status says why."""

from __future__ import annotations

import pytest
from packing_builders import mig, node, whole

import packing.cpsat as cpsat
from packing.cpsat import SolverParams, build_batch_model, solve_batch
from packing.model import Snapshot
from packing.policies.gpupack import GpupackPolicy
from packing.state import ClusterState

FAST = SolverParams(max_time_s=0.2, workers=1)


def _state(n: int, reconfigurable: bool = True) -> ClusterState:
    return ClusterState(Snapshot(tuple(node(f"n{i}", reconfigurable=reconfigurable)
                                       for i in range(n))))


def test_a_whole_gpu_only_batch_respects_max_variables() -> None:
    # 8 whole-GPU pods x 8 nodes = 64 placement variables, against a cap of 10: the check
    # came only after small pods, and a whole-GPU batch was built at any size.
    state = _state(8, reconfigurable=False)
    pods = [whole(f"p{i}", 1) for i in range(8)]
    assert build_batch_model(state, pods, params=SolverParams(max_variables=10)) is None
    assert solve_batch(state, pods, params=SolverParams(max_variables=10)).status == \
        "TOO_LARGE"
    assert build_batch_model(state, pods, params=SolverParams(max_variables=64)) is not None
    # the same cap for MIG pods (on MIG-capable nodes: they have options there)
    small = [mig(f"m{i}") for i in range(8)]
    assert build_batch_model(_state(8), small, params=SolverParams(max_variables=10)) is None


def test_the_objective_of_a_large_batch_is_within_cp_sats_integers() -> None:
    # `gpupack plan` on a 1,000-pod backlog (5 priorities, 8-GPU pods) on 4 nodes: the
    # weights were bounded by the batch alone (A ~ pods^3 x GPUs) and the objective
    # passed int64: MODEL_INVALID, the greedy answer every time, silently.
    state = _state(4, reconfigurable=False)
    pods = [whole(f"p{i}", 8, prio=i % 5) for i in range(1000)]
    built = build_batch_model(state, pods)
    assert built is not None
    assert built.model.validate() == ""


def test_an_objective_past_the_limit_is_not_solved_and_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state(2, reconfigurable=False)
    pods = [whole(f"p{i}", 2, prio=i) for i in range(4)]
    assert solve_batch(state, pods, params=FAST).status == "OPTIMAL"
    monkeypatch.setattr(cpsat, "OBJECTIVE_LIMIT", 1000)
    assert build_batch_model(state, pods, params=FAST) is None
    assert solve_batch(state, pods, params=FAST).status == "TOO_LARGE-objective"
    # the policy keeps its greedy answer, and its status names the reason
    nodes = tuple(n.info for n in state.nodes.values())
    plan = GpupackPolicy(FAST).plan(Snapshot(nodes, (), tuple(pods)))
    assert plan.solver_status == "TOO_LARGE-objective/fallback-greedy"
    assert len(plan.placements) == 4


def test_the_tighter_weights_keep_the_lexicographic_order() -> None:
    # One 8-GPU node: two 4-GPU pods at priority 0 beat one 6-GPU pod at 5 (more pods
    # first); with room for one of two, the higher priority; two 1-GPU pods on two idle
    # nodes share one (a whole node kept free).
    state = _state(1, reconfigurable=False)
    got = solve_batch(state, [whole("hi", 6, prio=5), whole("lo1", 4), whole("lo2", 4)],
                      params=FAST)
    assert got.status == "OPTIMAL" and {p.pod for p in got.placements} == {"lo1", "lo2"}
    got = solve_batch(state, [whole("hi", 6, prio=5), whole("lo", 4)], params=FAST)
    assert {p.pod for p in got.placements} == {"hi"}
    got = solve_batch(_state(2, reconfigurable=False), [whole("a", 1), whole("b", 1)],
                      params=FAST)
    assert got.status == "OPTIMAL" and len({p.node for p in got.placements}) == 1
