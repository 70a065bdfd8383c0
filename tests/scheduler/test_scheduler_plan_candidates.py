"""The planner plans over candidate nodes it picks itself (issue 17, item 6): the job the
solver child gets holds at most ``max_nodes`` nodes and their pods, however many nodes
and classes of equal nodes the cluster has; the batch is still placed where it fits;
the fragmentation figure is the whole cluster's."""

from __future__ import annotations

from typing import Any

import pytest
from sched_builders import make_cache, mig_pod, node, pod, whole_pod

from packing.cpsat import SolverParams
from packing.policies.fgd import (
    Shape,
    cluster_fragmentation,
    shape_workload,
    typical_shapes,
    workload_of,
)
from packing.state import ClusterState
from packing.validate import validate
from scheduler.planner.decide import pick_candidates
from scheduler.planner.loop import Planner
from scheduler.planner.solve import compact_workload, expand_workload, solve


def diverse(n: int, used: int = 1) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``n`` 8-GPU nodes, each in a state of its own: node i runs ``used`` GPUs for a pod
    asking i+1 CPUs (so every node is a class of its own)."""
    nodes = [node(f"w{i:03d}", gpus=8, reconfigurable=False, cpu="256") for i in range(n)]
    running = [whole_pod(f"r{i}", used, node=f"w{i:03d}", cpu=str(i + 1)) for i in range(n)]
    return nodes, running


def test_the_job_holds_at_most_max_nodes_nodes_and_only_their_pods() -> None:
    nodes, running = diverse(60)
    pending = [whole_pod(f"p{i}", 1 + i % 2) for i in range(10)]
    cache = make_cache(nodes, running + pending)
    assert cache.signature_count() == 60
    planner = Planner(cache, "gpupack", SolverParams(max_time_s=0.5, workers=1),
                      in_process=True, per_class=16, max_nodes=8)
    job, _, _ = planner.make_job()
    names = {n.name for n in job.snapshot.nodes}
    assert 1 <= len(names) <= 8
    assert {p.node for _, p in job.snapshot.running} <= names
    assert len(job.snapshot.running) == len(names)  # each picked node's one running pod
    assert job.unplaceable == frozenset()
    plan = planner.solve_once()
    assert set(plan.placements) == {f"default/p{i}" for i in range(10)}
    assert {p.node for p in plan.placements.values()} <= names
    assert validate(cache.snapshot(), plan.placements.values()) == []
    # per_class 0: the whole cluster, as before.
    everything = Planner(cache, "gpupack-greedy", in_process=True, per_class=0)
    assert len(everything.make_job()[0].snapshot.nodes) == 60


def test_a_capped_plan_still_places_the_batch_where_it_fits() -> None:
    # 40 full nodes (every GPU used, each in its own state) and two with room: the
    # candidates are the two, not the first nodes met, and every pod that fits is planned.
    nodes, running = diverse(40, used=8)
    nodes += [node("room", gpus=8, reconfigurable=False), node("m", mig={"1g.10gb": 7})]
    running += [whole_pod("half", 4, node="room")]
    pending = [whole_pod("a", 2), whole_pod("b", 2), mig_pod("s"), whole_pod("huge", 9)]
    cache = make_cache(nodes, running + pending)
    planner = Planner(cache, "gpupack", SolverParams(max_time_s=0.5, workers=1),
                      in_process=True, max_nodes=2)
    job, _, _ = planner.make_job()
    assert {n.name for n in job.snapshot.nodes} == {"room", "m"}
    assert job.unplaceable == frozenset({"default/huge"})
    plan = planner.solve_once()
    assert {k: p.node for k, p in plan.placements.items()} == {
        "default/a": "room", "default/b": "room", "default/s": "m"}
    assert set(plan.unschedulable) == {"default/huge"}
    assert validate(cache.snapshot(), plan.placements.values()) == []


def test_a_pod_left_out_of_a_capped_plan_is_not_called_unschedulable() -> None:
    # One node may be planned over; two pods of 8 GPUs each fit a node of their own.
    nodes = [node(f"w{i}", gpus=8, reconfigurable=False) for i in range(3)]
    cache = make_cache(nodes, [whole_pod("a", 8), whole_pod("b", 8)])
    planner = Planner(cache, "gpupack-greedy", in_process=True, max_nodes=1)
    plan = planner.solve_once()
    assert len(plan.placements) == 1
    assert plan.unschedulable == {}


def test_candidates_honour_node_selectors() -> None:
    # Twenty equal nodes, one of them in zone b: the only candidate a zone-b pod gets.
    nodes = [node(f"n{i:02d}", gpus=8, reconfigurable=False,
                  labels={"zone": "b" if i == 13 else "a"}) for i in range(20)]
    p = whole_pod("zb", 1)
    p["spec"]["nodeSelector"] = {"zone": "b"}
    cache = make_cache(nodes, [p])
    planner = Planner(cache, "gpupack-greedy", in_process=True, per_class=4, max_nodes=4)
    job, _, _ = planner.make_job()
    assert [n.name for n in job.snapshot.nodes] == ["n13"]
    assert planner.solve_once().placements["default/zb"].node == "n13"


def test_the_best_classes_come_first() -> None:
    # A 2-GPU pod: gpupack's scorer prefers the node it fills (6 of 8 GPUs used) to the
    # twenty empty ones; with room for one node that is the one planned over.
    nodes = [node(f"e{i:02d}", gpus=8, reconfigurable=False) for i in range(20)]
    nodes.append(node("busy", gpus=8, reconfigurable=False))
    cache = make_cache(nodes, [whole_pod("six", 6, node="busy"), whole_pod("p", 2)])
    planner = Planner(cache, "gpupack", SolverParams(max_time_s=0.5, workers=1),
                      in_process=True, max_nodes=1)
    job, _, _ = planner.make_job()
    assert [n.name for n in job.snapshot.nodes] == ["busy"]
    assert planner.solve_once().placements["default/p"].node == "busy"


def test_every_shape_gets_its_best_class_before_any_shape_gets_a_second() -> None:
    # Round by round: the 1g pod's MIG node is picked though the whole-GPU pods alone
    # could fill the cap with their own classes.
    nodes, running = diverse(10)
    nodes.append(node("m", mig={"1g.10gb": 7}))
    pending = [whole_pod(f"p{i}", 1) for i in range(8)] + [mig_pod("s")]
    cache = make_cache(nodes, running + pending)
    state = cache.state
    picked, placeable = pick_candidates(
        lambda m: state.nodes[m].info.labels, cache.signatures(), cache.snapshot().pending,
        per_class=16, max_nodes=2,
        rank=lambda p, _sid, n: ((0,), 8) if state.options(p, n, dedupe=True) else None)
    assert "m" in picked and len(picked) == 2
    assert placeable == {f"default/p{i}" for i in range(8)} | {"default/s"}


def test_group_batches_are_planned_over_every_node() -> None:
    nodes = [node(f"w{i}", gpus=8, reconfigurable=False) for i in range(5)]
    members = [pod(f"g{i}", {"nvidia.com/gpu": "8"},
                   annotations={"gpupack.io/group": "g", "gpupack.io/group-size": "2"})
               for i in range(2)]
    cache = make_cache(nodes, members)
    planner = Planner(cache, "gpupack-greedy", in_process=True, max_nodes=1)
    job, _, _ = planner.make_job()
    assert len(job.snapshot.nodes) == 5 and job.unplaceable is None
    assert len(planner.solve_once().placements) == 2


@pytest.mark.parametrize("max_nodes", [2, 0])
def test_the_fragmentation_figure_is_the_whole_clusters(max_nodes: int) -> None:
    nodes, running = diverse(12, used=3)
    nodes += [node(f"m{i}", mig={"1g.10gb": 7}) for i in range(3)]
    running += [mig_pod(f"s{i}", node=f"m{i % 3}") for i in range(5)]
    cache = make_cache(nodes, [*running, whole_pod("p", 1), mig_pod("q")])
    planner = Planner(cache, "gpupack-greedy", in_process=True, max_nodes=max_nodes)
    plan = planner.solve_once()
    snap = cache.snapshot()
    shapes = typical_shapes(workload_of(snap))
    expected = cluster_fragmentation(ClusterState(snap), shapes)
    assert expected > 0
    assert plan.fragmentation == pytest.approx(expected)
    cache.upsert_pod(whole_pod("more", 2, node="w000"))  # one node changes state
    again = planner.solve_once()
    snap = cache.snapshot()
    assert again.fragmentation == pytest.approx(cluster_fragmentation(ClusterState(snap),
                                                                      shapes))


def test_the_plans_scorer_sees_the_whole_clusters_shapes() -> None:
    nodes, running = diverse(6)
    nodes += [node("m", mig={"1g.10gb": 7})]
    running += [mig_pod(f"s{i}", node="m") for i in range(5)]
    cache = make_cache(nodes, [*running, whole_pod("p", 1)])
    snap = cache.snapshot()
    workload = compact_workload(shape_workload(snap))
    assert sum(r + q for _, r, q in workload) == len(snap.running) + len(snap.pending)
    assert len(workload) == len({Shape.of(p) for p in workload_of(snap)})  # one a shape
    assert typical_shapes(workload_of(expand_workload(workload))) == \
        typical_shapes(workload_of(snap))
    # The job over one candidate node carries the cluster's shapes for its scorer.
    planner = Planner(cache, "gpupack-greedy", in_process=True, max_nodes=1)
    job, _, _ = planner.make_job()
    assert len(job.snapshot.nodes) == 1
    assert typical_shapes(workload_of(expand_workload(job.workload))) == \
        typical_shapes(workload_of(snap))
    assert solve(job).placements


def test_the_planners_cp_sat_search_is_not_interleaved() -> None:
    # Interleaved search holds every subsolver's copy of the model at once (~90 MiB more
    # at 64 nodes); the planner keeps the other settings as given.
    from scheduler.planner.solve import planner_params

    given = SolverParams(max_time_s=1.5, workers=2, seed=7, max_wall_s=1.5)
    params = planner_params(given)
    assert (params.max_time_s, params.workers, params.seed, params.max_wall_s) == \
        (1.5, 2, 7, 1.5)
    assert given.solver().parameters.interleave_search
    solver = params.solver()
    assert not solver.parameters.interleave_search
    assert solver.parameters.num_workers == 2
    # Presolve lean at every size (else it ate the budget of ~6,700-variable models).
    assert (solver.parameters.symmetry_level, solver.parameters.cp_model_probing_level,
            solver.parameters.max_presolve_iterations) == (0, 0, 1)


def test_nothing_pending_sends_no_nodes_and_starts_no_child() -> None:
    # Once every pending pod is bound the plan is idle: the job holds no nodes (it held
    # the whole cluster: the solver child unpickled 5,000 nodes and 50,000 pods to say so).
    nodes, running = diverse(12, used=3)
    nodes += [node(f"m{i}", mig={"1g.10gb": 7}) for i in range(3)]
    running += [mig_pod(f"s{i}", node=f"m{i % 3}") for i in range(5)]
    cache = make_cache(nodes, running)
    planner = Planner(cache, "gpupack", SolverParams(max_time_s=0.5, workers=1))
    try:
        job, _, _ = planner.make_job()
        assert job.batch == () and job.snapshot.nodes == () and job.snapshot.running == ()
        plan = planner.solve_once()
        assert plan.status == "idle" and planner.solver_pid is None
        assert plan.fragmentation > 0  # the figure is still the cluster's
    finally:
        planner.stop()


def test_a_shape_gets_nodes_for_all_its_pods_before_others_get_more_choice() -> None:
    # Three 2-GPU pods, and six nodes with room for one each, every one a class of its
    # own; one 1g pod, ten MIG nodes in states of their own. Four nodes may be picked:
    # three for the 2-GPU pods (one each) and one MIG node, not two and two.
    nodes = [node(f"a{i}", gpus=8, reconfigurable=False, cpu="256") for i in range(6)]
    running = [whole_pod(f"r{i}", 6, node=f"a{i}", cpu=str(i + 1)) for i in range(6)]
    nodes += [node(f"m{i}", mig={"1g.10gb": 7}) for i in range(10)]
    running += [mig_pod(f"s{i}-{j}", node=f"m{i}") for i in range(10) for j in range(i)]
    pending = [whole_pod(f"p{i}", 2) for i in range(3)] + [mig_pod("q")]
    cache = make_cache(nodes, running + pending)
    planner = Planner(cache, "gpupack", SolverParams(max_time_s=0.5, workers=1),
                      in_process=True, max_nodes=4)
    job, _, _ = planner.make_job()
    picked = [n.name for n in job.snapshot.nodes]
    assert sorted(n[0] for n in picked) == ["a", "a", "a", "m"], picked
    plan = planner.solve_once()
    assert set(plan.placements) == {"default/p0", "default/p1", "default/p2", "default/q"}
    assert validate(cache.snapshot(), plan.placements.values()) == []


def test_node_capacity_counts_pods_one_after_another() -> None:
    from scheduler.planner.decide import node_capacity

    cache = make_cache([node("w", gpus=8, reconfigurable=False)],
                       [whole_pod("six", 5, node="w"), whole_pod("p", 1)])
    info = cache.state.nodes["w"].info
    pod = cache.pending()[0]
    assert node_capacity(info, cache.pods_on("w"), pod) == 3
    assert node_capacity(info, cache.pods_on("w"), pod, limit=2) == 2
    assert node_capacity(info, (), pod) == 8
