"""The background planner: plans pending pods, bounded batches, scorer refresh, age."""

from __future__ import annotations

import time

from sched_builders import FakeClock, make_cache, mig_pod, node, whole_pod

from packing.cpsat import SolverParams
from packing.validate import validate
from scheduler.planner import Planner


def test_solve_once_plans_every_pending_pod_validly() -> None:
    clock = FakeClock()
    cache = make_cache([node("m", mig={"1g.10gb": 7}), node("w", gpus=8, reconfigurable=False)],
                       [mig_pod("a"), mig_pod("b"), whole_pod("llm", 4, priority=10)], clock)
    planner = Planner(cache, "gpupack", SolverParams(max_time_s=0.5, workers=1), clock=clock)
    assert planner.age() is None
    plan = planner.solve_once()
    assert set(plan.placements) == {"default/a", "default/b", "default/llm"}
    assert plan.placements["default/llm"].node == "w"
    assert validate(cache.snapshot(), plan.placements.values()) == []
    assert plan.status.split("/")[0] in ("OPTIMAL", "FEASIBLE", "greedy")
    clock.advance(3)
    assert planner.age() == 3


def test_batch_is_bounded_and_highest_priority_first() -> None:
    pods = [whole_pod(f"p{i}", 1, priority=i) for i in range(6)]
    cache = make_cache([node("w", gpus=8, reconfigurable=False)], pods)
    planner = Planner(cache, "gpupack-greedy", max_batch=2)
    plan = planner.solve_once()
    assert set(plan.placements) == {"default/p5", "default/p4"}


def test_scorer_is_replaced_only_when_the_workload_shape_moves() -> None:
    cache = make_cache([node("w", gpus=8, reconfigurable=False)], [whole_pod("a", 1)])
    planner = Planner(cache, "gpupack-greedy")
    planner.solve_once()
    gen = planner.scorer.gen
    planner.solve_once()
    assert planner.scorer.gen == gen
    cache.upsert_pod(mig_pod("new"))
    planner.solve_once()
    assert planner.scorer.gen == gen + 1


def test_thread_replans_after_events() -> None:
    cache = make_cache([node("w", gpus=8, reconfigurable=False)], [])
    planner = Planner(cache, "gpupack-greedy", debounce_s=0.01, min_interval_s=0.01)
    planner.start()
    try:
        cache.upsert_pod(whole_pod("late", 2))
        deadline = time.monotonic() + 10
        while "default/late" not in planner.plan.placements:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        planner.stop()


def test_nodes_of_one_shape_share_inference_but_keep_their_names() -> None:
    a, b = node("a", mig={"1g.10gb": 7}), node("b", mig={"1g.10gb": 7})
    cache = make_cache([a, b])
    ia, ib = cache.state.nodes["a"].info, cache.state.nodes["b"].info
    assert (ia.name, ib.name) == ("a", "b")
    assert ia.labels["kubernetes.io/hostname"] == "a" and ib.labels["kubernetes.io/hostname"] == "b"
    assert ia.gpus == ib.gpus
