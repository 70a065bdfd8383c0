"""The background planner: plans pending pods, bounded batches, scorer refresh, age."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from sched_builders import FakeClock, make_cache, mig_pod, node, shared_pod, whole_pod

from packing.cpsat import SolverParams
from packing.validate import validate
from scheduler.memo.decide import holding, make_policy
from scheduler.planner.loop import Planner
from scheduler.planner.solve import (
    SnapshotPacker,
    SolveJob,
    expand_workload,
    scored_by,
    solve,
    solve_packed,
    unpack,
)


def test_solve_once_plans_every_pending_pod_validly() -> None:
    clock = FakeClock()
    cache = make_cache([node("m", mig={"1g.10gb": 7}), node("w", gpus=8, reconfigurable=False)],
                       [mig_pod("a"), mig_pod("b"), whole_pod("llm", 4, priority=10)], clock)
    planner = Planner(cache, "gpupack", SolverParams(max_time_s=0.5, workers=1), clock=clock,
                      in_process=True)
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
    planner = Planner(cache, "gpupack-greedy", max_batch=2, in_process=True)
    plan = planner.solve_once()
    assert set(plan.placements) == {"default/p5", "default/p4"}


def test_scorer_is_replaced_only_when_the_workload_shape_moves() -> None:
    cache = make_cache([node("w", gpus=8, reconfigurable=False)], [whole_pod("a", 1)])
    planner = Planner(cache, "gpupack-greedy", in_process=True)
    planner.solve_once()
    gen = planner.scorer.gen
    planner.solve_once()
    assert planner.scorer.gen == gen
    cache.upsert_pod(mig_pod("new"))
    planner.solve_once()
    assert planner.scorer.gen == gen + 1


def test_scorer_is_replaced_when_whole_nodes_start_to_be_kept() -> None:
    # Same workload shapes, but a node joins an NVLink clique: the scorer must start
    # keeping whole nodes for groups (packing.policies.gpupack.keeps_whole_nodes).
    cache = make_cache([node("w", gpus=8, reconfigurable=False)], [whole_pod("a", 1)])
    planner = Planner(cache, "gpupack", SolverParams(max_time_s=0.2, workers=1),
                      in_process=True)
    planner.solve_once()
    gen = planner.scorer.gen
    assert planner.scorer.scorer.keep_whole_nodes is False  # type: ignore[attr-defined]
    cache.upsert_node(node("c", gpus=8, reconfigurable=False,
                           labels={"nvidia.com/gpu.clique": "clique-a"}))
    planner.solve_once()
    assert planner.scorer.gen == gen + 1
    assert planner.scorer.scorer.keep_whole_nodes is True  # type: ignore[attr-defined]


def test_scorer_is_replaced_when_the_rare_shapes_change() -> None:
    # gpupack's rare-shape price (packing.policies.rare) reads every shape of the
    # workload and the nodes' capacity: a new scorer when a node that alone hosts a
    # shape joins, or when such a shape first appears, though the typical shapes (the
    # 8-GPU pod is one of 41) do not move; a node like those there changes nothing.
    nodes = [node(f"w{i:02d}", gpus=8, cpu="96", reconfigurable=False) for i in range(23)]
    cache = make_cache(nodes, [whole_pod(f"a{i}", 1) for i in range(40)]
                       + [whole_pod("llm", 8, cpu="120")])
    planner = Planner(cache, "gpupack", SolverParams(max_time_s=0.2, workers=1),
                      in_process=True)
    planner.solve_once()
    gen = planner.scorer.gen
    assert not planner.scorer.scorer.rules.rare.active  # type: ignore[attr-defined]
    cache.upsert_node(node("w23", gpus=8, cpu="96", reconfigurable=False))
    planner.solve_once()
    assert planner.scorer.gen == gen
    cache.upsert_node(node("big", gpus=8, cpu="128", reconfigurable=False))
    planner.solve_once()
    assert planner.scorer.gen == gen + 1
    assert planner.replacements["rare_shapes"] == 1
    rare = planner.scorer.scorer.rules.rare  # type: ignore[attr-defined]
    assert rare is not None and rare.active and rare.cpu.tolist() == [120_000]
    cache.upsert_pod(whole_pod("llm-2", 8, cpu="124"))  # another shape only "big" hosts
    planner.solve_once()
    assert planner.scorer.gen == gen + 2
    rare = planner.scorer.scorer.rules.rare  # type: ignore[attr-defined]
    assert sorted(rare.cpu.tolist()) == [120_000, 124_000]


def test_thread_replans_after_events() -> None:
    cache = make_cache([node("w", gpus=8, reconfigurable=False)], [])
    planner = Planner(cache, "gpupack-greedy", debounce_s=0.01, min_interval_s=0.01,
                      in_process=True)
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


def test_snapshot_travels_in_pieces_and_unchanged_nodes_are_not_repickled() -> None:
    cache = make_cache([node("m", mig={"1g.10gb": 7}), node("w", gpus=8, reconfigurable=False)],
                       [mig_pod("a"), whole_pod("r", 2, node="w")])
    snap = cache.snapshot()
    job = SolveJob("gpupack-greedy", SolverParams(), snap, snap.pending)
    packer = SnapshotPacker()
    first = packer.pack(job)
    assert unpack(first) == job
    cache.upsert_pod(whole_pod("r2", 1, node="w"))  # pods change, nodes do not
    snap2 = cache.snapshot()
    second = packer.pack(SolveJob("gpupack-greedy", SolverParams(), snap2, ()))
    assert all(a is b for a, b in zip(first[2], second[2], strict=True))
    assert unpack(second).snapshot == snap2


@pytest.mark.parametrize("per_class", [0, 1])
def test_a_packed_job_solves_as_the_job_itself(per_class: int) -> None:
    # The solver child gets the job in pickled pieces (solve_packed): the answer is the
    # one solve() gives, candidate nodes or the whole cluster.
    nodes = [node(f"w{i}", gpus=8, reconfigurable=False) for i in range(6)]
    nodes += [node(f"m{i}", mig={"1g.10gb": 7}) for i in range(4)]
    running = [whole_pod(f"r{i}", 1 + i % 3, node=f"w{i % 6}") for i in range(300)]
    running += [mig_pod(f"s{i}", node=f"m{i % 4}") for i in range(20)]
    pending = [whole_pod(f"p{i}", 1 + i % 2) for i in range(5)] + [mig_pod("q")]
    cache = make_cache(nodes, running + pending)
    planner = Planner(cache, "gpupack-greedy", in_process=True, per_class=per_class)
    job, _, _ = planner.make_job()
    assert len(job.snapshot.running) > 128 or per_class  # more than one pickled chunk
    assert job.workload  # the cluster's shapes travel for the scorer
    direct, packed = solve(job), solve_packed(SnapshotPacker().pack(job))
    assert direct.placements and packed.placements == direct.placements
    assert (packed.unschedulable, packed.status) == (direct.unschedulable, direct.status)


def test_solves_run_in_a_child_process_that_is_restarted_when_it_dies() -> None:
    # The thread path: the planner thread only waits for the solver process.
    cache = make_cache([node("w", gpus=8, reconfigurable=False)], [whole_pod("a", 2)])
    planner = Planner(cache, "gpupack", SolverParams(max_time_s=0.5, workers=1),
                      debounce_s=0.01, min_interval_s=0.01)
    try:
        plan = planner.solve_once()
        assert set(plan.placements) == {"default/a"}
        pid = planner.solver_pid
        assert pid is not None and pid != os.getpid()
        os.kill(pid, 9)
        time.sleep(0.2)
        planner.start()
        cache.upsert_pod(whole_pod("b", 1))
        deadline = time.monotonic() + 60
        while "default/b" not in planner.plan.placements:
            assert time.monotonic() < deadline, planner.plan
            time.sleep(0.05)
        assert planner.solver_pid not in (None, pid)
        assert planner.plan.status.split("/")[0] in ("OPTIMAL", "FEASIBLE", "greedy")
    finally:
        planner.stop()


def test_plan_over_candidate_nodes_keeps_a_few_of_each_class_of_equal_nodes() -> None:
    nodes = [node(f"w{i}", gpus=8, reconfigurable=False) for i in range(6)]
    pods = [whole_pod("a", 8), whole_pod("b", 8), whole_pod("c", 8), whole_pod("huge", 9)]
    cache = make_cache([*nodes, node("m", mig={"1g.10gb": 7})], pods)
    planner = Planner(cache, "gpupack-greedy", in_process=True, per_class=2)
    plan = planner.solve_once()
    assert len(plan.placements) == 2  # two nodes of the six equal ones were planned over
    assert validate(cache.snapshot(), plan.placements.values()) == []
    assert set(plan.unschedulable) == {"default/huge"}  # fits no node at all
    everything = Planner(cache, "gpupack-greedy", in_process=True, per_class=0).solve_once()
    assert len(everything.placements) == 3


class _Unstartable:
    """A process whose start() fails, as spawn does when the main module is importing."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.started = False

    def start(self) -> None:
        raise RuntimeError("an attempt has been made to start a new process too early")

    def is_alive(self) -> bool:
        return False


@pytest.mark.parametrize("which", ["solver", "warm"])
def test_a_child_that_cannot_start_is_reported_and_retried_not_half_kept(
    which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduler.memo.loop import WarmChild
    from scheduler.planner.solve import SolverError, SolverProcess

    child: Any = SolverProcess() if which == "solver" else WarmChild()
    monkeypatch.setattr(child._ctx, "Process", _Unstartable)
    job = SolveJob("gpupack-greedy", SolverParams(), make_cache([], []).snapshot(), (), ())
    for _ in range(2):  # the second try must fail the same way, not on the first's remains
        with pytest.raises((SolverError, RuntimeError), match="did not start"):
            child.solve(job, 5.0) if which == "solver" else child.call(("ping",))
        assert child.pid is None
    child.close()  # nothing to stop


def test_the_scorer_holds_the_clusters_free_sizes_and_replaces_them_past_the_drift() -> None:
    # gpupack's sum-of-squares price (packing.policies.squares) is on where whole-GPU
    # pods ask 0.6-0.72 of the GPU demand: 13 one-GPU pods against 13 shares of half a
    # GPU (w 0.67). Two running shares leave GPUs of the time-sliced node part free.
    pods = ([whole_pod(f"w{i}") for i in range(13)]
            + [shared_pod(f"s{i}", compute="0.5") for i in range(13)]
            + [shared_pod("r0", compute="0.25", node="s"),
               shared_pod("r1", compute="0.5", node="s")])
    cache = make_cache([node("w", gpus=8, reconfigurable=False),
                        node("s", gpus=4, shared_replicas=4, reconfigurable=False)], pods)
    planner = Planner(cache, "gpupack-greedy", in_process=True)
    job, _, _ = planner.make_job()
    ref = planner.scorer
    rules = ref.scorer.rules  # type: ignore[attr-defined]
    assert rules.squares is not None and rules.squares.active
    # The first job finds GPUs partly used where the scorer held none: replaced.
    assert ref.free_sizes is not None and ref.gen == 2
    counts, gpus = ref.free_sizes
    # The solve's scorer holds it too, in the solver child as well.
    assert job.batch and job.free_sizes == ref.free_sizes
    assert unpack(SnapshotPacker().pack(job)).free_sizes == ref.free_sizes
    solver = scored_by(make_policy("gpupack-greedy", SolverParams()),
                       expand_workload(job.workload), job.free_sizes)
    held = solver.make_scorer(job.snapshot).rules.squares  # type: ignore[attr-defined]
    assert list(held.counts) == list(counts)
    assert gpus == 4 and sum(counts) >= 1
    assert list(rules.squares.counts) == list(counts)
    # The warm child and the planner's own scorer rebuild it holding the same histogram.
    assert ref.source is not None
    rebuilt = holding(make_policy("gpupack-greedy", SolverParams()).make_scorer(ref.source),
                      ref.free_sizes)
    assert list(rebuilt.rules.squares.counts) == list(counts)  # type: ignore[attr-defined]
    # Nothing moved: no new generation.
    planner.make_job()
    assert planner.scorer.gen == ref.gen
    # Another share bound moves a GPU to another bucket (drift 2 > 0.03 x 4): replaced
    # (the workload's shapes moved too: that generation keeps the held histogram, and
    # the next one holds the new).
    cache.upsert_pod(shared_pod("r2", compute="0.25", node="s"))
    planner.make_job()
    now = planner.scorer
    assert now.gen == ref.gen + 2 and now.free_sizes != ref.free_sizes
    assert now.free_sizes is not None
    assert list(now.scorer.rules.squares.counts) == list(now.free_sizes[0])  # type: ignore[attr-defined]
