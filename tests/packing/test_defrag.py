"""Defragmentation plans (packing/defrag/plan.py): what is and is never evicted, PDB limits,
landing, several groups in one plan; and the planner against brute force (Hypothesis)."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from packing_builders import cpu_pod, group, node, whole

from packing.defrag.plan import (
    GROUP_KIND,
    NO_LANDING,
    NO_MOVE,
    DefragParams,
    DefragPlan,
    DisruptionBudget,
    Evictability,
    eviction_cost,
    plan_defrag,
    priority_tiers,
)
from packing.model import GroupRef, NodeInfo, Placement, PodRequest, Snapshot
from packing.scoring import topology_domains
from packing.state import ClusterState
from packing.validate import validate

CLIQUE = "nvidia.com/gpu.clique"
Running = list[tuple[PodRequest, Placement]]


def on(pod: PodRequest, node_name: str, gpus: Sequence[int] = ()) -> tuple[PodRequest, Placement]:
    return pod, Placement(pod.key, node_name, tuple(gpus))


def owned(*pods: tuple[PodRequest, Placement]) -> dict[str, str]:
    return {p.key: "ReplicaSet/rs" for p, _ in pods}


def snap(nodes: Sequence[NodeInfo], running: Running, pending: Sequence[PodRequest]) -> Snapshot:
    return Snapshot(tuple(nodes), tuple(running), tuple(pending))


def evicted(plan: DefragPlan) -> list[str]:
    return sorted(e.pod for m in plan.moves for e in m.evictions)


def check_landed(s: Snapshot, plan: DefragPlan) -> None:
    """Independently of the planner's own check: the evicted pods and the groups placed
    where the plan says, on the cluster without the evicted pods, validate."""
    gone = set(evicted(plan))
    pods = {p.key: p for p, _ in s.running} | {p.key: p for p in s.pending}
    placements = [e.to for m in plan.moves for e in m.evictions]
    placements += [p for m in plan.moves for p in m.room if p.pod in pods]
    pending = tuple(pods[p.pod] for p in placements)
    errors = validate(replace(s, running=tuple(r for r in s.running if r[0].key not in gone),
                              pending=pending), placements)
    assert errors == []
    for m in plan.moves:
        for e in m.evictions:
            assert e.to != dict((p.key, pl) for p, pl in s.running)[e.pod]


# ---- what is evicted, what never is ------------------------------------------------------


def two_nodes_each_with_one_pod() -> tuple[list[NodeInfo], Running]:
    nodes = [node("n0", 8), node("n1", 8), node("n2", 8)]
    run = [on(whole("ml/a"), "n0", [0]), on(whole("ml/b"), "n1", [3]),
           on(whole("ml/c", 6), "n2", range(6))]
    return nodes, run


def test_evicts_the_cheapest_pods_and_lands_them_elsewhere() -> None:
    nodes, run = two_nodes_each_with_one_pod()
    s = snap(nodes, run, group("llm/g", 2))
    plan = plan_defrag(s, Evictability(owned(*run)))
    assert plan.waiting == ()
    (move,) = plan.moves
    assert move.group == "llm/g"
    assert evicted(plan) == ["ml/a", "ml/b"]  # not the 6-GPU pod on n2
    assert all(e.to.node == "n2" for e in move.evictions)  # the only room left
    assert move.frees() == {"n0": list(range(8)), "n1": list(range(8))}
    assert move.cost == 2 * (1000 + 1000)
    check_landed(s, plan)


@pytest.mark.parametrize(
    ("case", "pod", "group_prio", "expect_evicted"),
    [
        ("recreated, same priority", whole("ml/a"), 0, True),
        ("lower priority", whole("ml/a", prio=-5), 0, True),
        ("higher priority", whole("ml/a", prio=10), 0, False),
        ("higher than a high group", whole("ml/a", prio=10), 100, True),
        ("of another group", whole("ml/a", group=GroupRef("other/g", 1)), 0, False),
    ],
)
def test_who_may_be_evicted(case: str, pod: PodRequest, group_prio: int,
                            expect_evicted: bool) -> None:
    nodes = [node("n0", 8), node("n1", 4)]
    run = [on(pod, "n0", [0])]
    members = [replace(m, priority=group_prio) for m in group("llm/g", 1)]
    plan = plan_defrag(snap(nodes, run, members), Evictability(owned(*run)))
    assert (evicted(plan) == ["ml/a"]) is expect_evicted, case
    if not expect_evicted:
        (w,) = plan.waiting
        assert "no eviction set" in w.reason and w.check == NO_MOVE


@pytest.mark.parametrize(
    ("ev", "reason"),
    [
        (Evictability({}), "1 without a controller that recreates them"),
        (Evictability({"ml/a": "ReplicaSet/rs"}, blocked={"ml/a": "already terminating"}),
         "1 already terminating"),
        (Evictability({"ml/a": "ReplicaSet/rs"},
                      (DisruptionBudget("ml/pdb", 0, frozenset({"ml/a"})),)),
         "1 at their PodDisruptionBudget's limit"),
        (Evictability({"ml/a": "ReplicaSet/rs"},
                      (DisruptionBudget("ml/p1", 5, frozenset({"ml/a"})),
                       DisruptionBudget("ml/p2", 5, frozenset({"ml/a"})))),
         "1 covered by more than one PodDisruptionBudget"),
    ],
)
def test_pods_never_chosen_leave_the_group_waiting_with_the_reason(
        ev: Evictability, reason: str) -> None:
    nodes = [node("n0", 8), node("n1", 4)]
    run = [on(whole("ml/a"), "n0", [0])]
    plan = plan_defrag(snap(nodes, run, group("llm/g", 1)), ev)
    assert plan.moves == ()
    (w,) = plan.waiting
    assert w.group == "llm/g" and reason in w.reason


def test_budget_limits_disruptions_across_nodes() -> None:
    # Two pods of one app, one on each of n0/n1; its budget allows one disruption, so the
    # group goes to n1+n2 (n2 holds a pod of another app) rather than n0+n1.
    nodes = [node(f"n{i}", 8) for i in range(4)]
    run = [on(whole("web/a0"), "n0", [0]), on(whole("web/a1"), "n1", [0]),
           on(whole("api/b", 2), "n2", [0, 1]), on(whole("ml/full", 5), "n3", range(5))]
    budget = DisruptionBudget("web/pdb", 1, frozenset({"web/a0", "web/a1"}))
    s = snap(nodes, run, group("llm/g", 2))
    plan = plan_defrag(s, Evictability(owned(*run), (budget,)))
    got = evicted(plan)
    assert len(set(got) & {"web/a0", "web/a1"}) == 1 and "api/b" in got
    check_landed(s, plan)
    unlimited = plan_defrag(s, Evictability(owned(*run)))
    assert evicted(unlimited) == ["web/a0", "web/a1"]  # cheaper when the budget allows


def test_evicted_pods_that_fit_nowhere_else_keep_the_group_waiting() -> None:
    nodes = [node("n0", 8), node("n1", 8)]
    run = [on(whole("ml/a", 4), "n0", range(4)), on(whole("ml/b", 4), "n0", range(4, 8)),
           on(whole("ml/c", 8), "n1", range(8))]
    s = snap(nodes, run, group("llm/g", 1))
    # The exact search tries the eviction sets and finds their pods land nowhere; the
    # screened one does not consider pods that fit no other node now.
    plan = plan_defrag(s, Evictability(owned(*run)), DefragParams.exact())
    assert plan.moves == ()
    assert "would not all fit elsewhere" in plan.waiting[0].reason
    assert plan.waiting[0].check == NO_LANDING
    plan = plan_defrag(s, Evictability(owned(*run)))
    assert plan.moves == ()
    assert "3 with no room on another node now" in plan.waiting[0].reason


def test_prefers_fewer_smaller_lower_priority_evictions() -> None:
    nodes = [node("n0", 8), node("n1", 8), node("n2", 8), node("n3", 8)]
    run = [on(whole("ml/a"), "n0", [0]), on(whole("ml/b"), "n0", [1]),  # two pods
           on(whole("ml/c", 2), "n1", [0, 1]),  # one pod, two GPUs
           on(whole("ml/d", prio=5), "n2", [0])]  # one pod, higher priority
    s = snap(nodes, run, [replace(m, priority=5) for m in group("llm/g", 1)])
    plan = plan_defrag(s, Evictability(owned(*run)))
    assert evicted(plan) == []  # n3 is whole: the group fits now
    run.append(on(whole("ml/e", 3), "n3", range(3)))
    s = snap(nodes, run, [replace(m, priority=5) for m in group("llm/g", 1)])
    plan = plan_defrag(s, Evictability(owned(*run)))
    # costs: n0 2 x 2000, n1 3000, n2 (1 + tier 1) x 2000 = 4000, n3 4000
    assert evicted(plan) == ["ml/c"]
    assert plan.moves[0].cost == 3000
    check_landed(s, plan)


def test_a_group_that_fits_now_gets_a_move_without_evictions() -> None:
    nodes = [node("n0", 8), node("n1", 8)]
    plan = plan_defrag(snap(nodes, [], group("llm/g", 2)), Evictability())
    (move,) = plan.moves
    assert move.evictions == () and move.cost == 0
    assert move.frees() == {"n0": list(range(8)), "n1": list(range(8))}


def test_topology_domains_and_exclusive_domains_held_by_other_groups() -> None:
    a = [node(f"a{i}", 8, labels={CLIQUE: "a"}) for i in range(2)]
    b = [node(f"b{i}", 8, labels={CLIQUE: "b"}) for i in range(3)]
    holder = whole("llm/other-0", 1, group=GroupRef("llm/other", 1, 0, CLIQUE, True))
    # Clique a would be cheapest (one pod) but another exclusive group holds it.
    run = [on(holder, "a0", [0]), on(whole("ml/x"), "a1", [0]),
           on(whole("ml/y"), "b0", [0]), on(whole("ml/z"), "b1", [0])]
    members = group("llm/g", 2, CLIQUE, exclusive=True)
    s = snap([*a, *b], run, members)
    plan = plan_defrag(s, Evictability(owned(*run)))
    (move,) = plan.moves
    assert set(move.frees()) <= {"b0", "b1", "b2"}
    assert evicted(plan) in (["ml/y"], ["ml/z"])  # b2 is whole: one eviction suffices
    check_landed(s, plan)


def test_cpu_on_the_member_node_is_freed_by_evicting_a_cpu_pod() -> None:
    nodes = [node("n0", 8, cpu=8000), node("n1", 4, cpu=64_000)]
    run = [on(cpu_pod("batch/cpu", 6000), "n0")]
    members = group("llm/g", 1, cpu=4000)
    s = snap(nodes, run, members)
    plan = plan_defrag(s, Evictability(owned(*run)))
    assert evicted(plan) == ["batch/cpu"]
    assert plan.moves[0].evictions[0].to.node == "n1"
    check_landed(s, plan)


def test_several_groups_in_one_plan_share_no_pods_room_or_budget() -> None:
    nodes = [node(f"n{i}", 8) for i in range(5)]
    run = [on(whole(f"ml/p{i}"), f"n{i}", [0]) for i in range(4)]
    g1 = [replace(m, priority=10) for m in group("llm/g1", 2)]
    g2 = group("llm/g2", 2)
    s = snap(nodes, run, [*g1, *g2])
    budget = DisruptionBudget("ml/pdb", 3, frozenset(f"ml/p{i}" for i in range(4)))
    plan = plan_defrag(s, Evictability(owned(*run), (budget,)))
    # g1 first (higher priority): n4 and one freed node; g2: two more freed nodes, its
    # evicted pods landing beside the pod g1 moved, which is never moved again.
    assert [m.group for m in plan.moves] == ["llm/g1", "llm/g2"]
    assert [len(m.evictions) for m in plan.moves] == [1, 2]
    assert len(set(evicted(plan))) == 3
    rooms = [p.node for m in plan.moves for p in m.room]
    assert len(rooms) == len(set(rooms)) == 4
    check_landed(s, plan)
    # With two disruptions allowed, g1 uses one and g2 waits, saying why.
    budget = DisruptionBudget("ml/pdb", 2, frozenset(f"ml/p{i}" for i in range(4)))
    plan = plan_defrag(s, Evictability(owned(*run), (budget,)))
    assert [m.group for m in plan.moves] == ["llm/g1"]
    (w,) = plan.waiting
    assert w.group == "llm/g2" and "allow only 1 more disruption(s)" in w.reason


def test_only_whole_gpu_groups_are_planned() -> None:
    from packing_builders import mig
    members = [replace(mig("s/m0"), group=GroupRef("s/g", 2, 0)),
               replace(mig("s/m1"), group=GroupRef("s/g", 2, 1))]
    plan = plan_defrag(snap([node("n0", 2)], [], members), Evictability())
    assert plan.waiting[0].reason.startswith("only groups of whole-GPU pods")
    assert plan.waiting[0].check == GROUP_KIND
    assert plan.waiting[0].to_json()["check"] == GROUP_KIND


def test_missing_workers_are_reserved_with_the_leader() -> None:
    nodes = [node("n0", 8), node("n1", 8), node("n2", 8)]
    run = [on(whole("ml/a"), "n0", [0]), on(whole("ml/b"), "n1", [0])]
    leader = group("llm/g", 2)[0]  # only the leader exists
    s = snap(nodes, run, [leader])
    plan = plan_defrag(s, Evictability(owned(*run)))
    (move,) = plan.moves
    assert len(move.room) == 2 and len(move.frees()) == 2
    assert len(move.evictions) == 1  # n2 is whole, one more node freed


# ---- against brute force ------------------------------------------------------------------


def brute_force(s: Snapshot, ev: Evictability) -> int | None:
    """Least cost of a move for the one waiting group by trying every member placement
    and every eviction set on the members' nodes, landing the evicted pods by trying every
    option; None when there is none."""
    members = sorted(s.pending, key=lambda m: -m.gpu_count)
    prio = max(m.priority for m in members)
    base = ClusterState(s)
    tiers = priority_tiers([p for p, _ in s.running])
    where = {p.key: (p, pl) for p, pl in s.running}
    ref = members[0].group
    assert ref is not None
    covers = {k: [b for b in ev.budgets if k in b.pods] for k in where}

    def may(p: PodRequest) -> bool:
        cov = covers[p.key]
        return (p.group is None and p.priority <= prio and p.key in ev.recreated_by
                and p.key not in ev.blocked and len(cov) <= 1
                and all(b.allowed > 0 for b in cov))

    best: int | None = None
    for domain in topology_domains(base, ref):
        for nodes in itertools.product(domain, repeat=len(members)):
            pool = [k for k, (p, pl) in where.items() if pl.node in nodes and may(p)]
            for r in range(len(pool) + 1):
                for chosen in itertools.combinations(pool, r):
                    cost = sum(eviction_cost(base, *where[k], tiers.get(where[k][0].priority, 0))
                               for k in chosen)
                    if best is not None and cost >= best:
                        continue
                    if any(sum(1 for k in chosen if k in b.pods) > b.allowed
                           for b in ev.budgets):
                        continue
                    if feasible(base, members, nodes, [where[k] for k in chosen]):
                        best = cost
    return best


def feasible(base: ClusterState, members: Sequence[PodRequest], nodes: Sequence[str],
             victims: Sequence[tuple[PodRequest, Placement]]) -> bool:
    state = copy.deepcopy(base)
    for p, pl in victims:
        state.undo(p, pl)
    for m, n in zip(members, nodes, strict=True):
        opts = state.options(m, n)
        if not opts:
            return False
        state.apply(m, opts[0])

    def land(i: int) -> bool:
        if i == len(victims):
            return True
        p, old = victims[i]
        for n in state.nodes:
            for o in state.options(p, n):
                if o == old:
                    continue
                state.apply(p, o)
                if land(i + 1):
                    return True
                state.undo(p, o)
        return False

    return land(0)


@st.composite
def small_cluster(draw: st.DrawFn) -> tuple[Snapshot, Evictability]:
    n_nodes = draw(st.integers(2, 4))
    topo = draw(st.booleans())
    gpus = draw(st.sampled_from([4, 8]))
    nodes = [node(f"n{i}", gpus, cpu=draw(st.sampled_from([8000, 32_000])),
                  labels={CLIQUE: "ab"[i % 2]} if topo else None) for i in range(n_nodes)]
    state = ClusterState(Snapshot(tuple(nodes)))
    run: Running = []
    for i in range(draw(st.integers(n_nodes - 1, 9))):
        pod = whole(f"ml/p{i}", draw(st.sampled_from([1, 1, 2, 3])),
                    cpu=draw(st.sampled_from([1000, 4000])), prio=draw(st.integers(0, 2)))
        if draw(st.integers(0, 5)) == 0:
            pod = replace(pod, group=GroupRef(f"other/{i}", 1))
        # Mostly spread over every node, as churn leaves a cluster: the group must evict.
        n = nodes[i % n_nodes].name if draw(st.integers(0, 4)) else draw(
            st.sampled_from([n.name for n in nodes]))
        opts = state.options(pod, n)
        if opts:
            state.apply(pod, opts[0])
            run.append((pod, opts[0]))
    recreated = {p.key: "ReplicaSet/rs" for p, _ in run if draw(st.integers(0, 4)) > 0}
    budgets = []
    keys = [p.key for p, _ in run]
    if keys and draw(st.integers(0, 3)) > 0:
        covered = draw(st.sets(st.sampled_from(keys), min_size=1))
        budgets.append(DisruptionBudget("ml/pdb", draw(st.integers(0, 2)), frozenset(covered)))
    k = draw(st.sampled_from([g for g in (2, 4, gpus, gpus, gpus) if g <= gpus]))
    size = draw(st.integers(1, 2))
    members = [replace(m, priority=draw(st.integers(0, 2)))
               for m in group("llm/g", size, CLIQUE if topo else None, count=k, cpu=2000)]
    prio = max(m.priority for m in members)
    members = [replace(m, priority=prio) for m in members]
    return snap(nodes, run, members), Evictability(recreated, tuple(budgets))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_cluster())
def test_exact_planner_cost_is_the_brute_force_optimum(case: tuple[Snapshot, Evictability]) -> None:
    s, ev = case
    want = brute_force(s, ev)
    for params in (DefragParams.exact(), DefragParams()):
        plan = plan_defrag(s, ev, params)
        got = plan.moves[0].cost if plan.moves else None
        if params.screen:
            # Screening may miss the optimum (a pod that fits no other node now is not
            # considered), never beat it; bench/defrag.py measures how far it stays.
            assert got is None or (want is not None and got >= want), (params, plan)
        else:
            assert got == want, (params, plan)
        event(f"evictions: {len(plan.moves[0].evictions) if plan.moves else 'none possible'}")
        if plan.moves:
            check_landed(s, plan)
            for e in plan.moves[0].evictions:
                assert e.pod in ev.recreated_by
            for b in ev.budgets:
                assert sum(1 for k in evicted(plan) if k in b.pods) <= b.allowed
