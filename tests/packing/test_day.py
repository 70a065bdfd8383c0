"""The day replay (packing/day.py): controllers, queue, waits, groups, over-commit and
sizing, on small days built here; and plain kube-scheduler's score (kube_default)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packing_builders import node

from packing.day import (
    Create,
    Day,
    DayPod,
    Delete,
    Pool,
    Rollout,
    Scale,
    Workload,
    p99,
    replay,
)
from packing.day_sizing import size_cluster
from packing.model import (
    GpuMode,
    GroupRef,
    NodeInfo,
    Placement,
    PodRequest,
    RequestKind,
    Snapshot,
)
from packing.policies.kube_default import (
    balanced_allocation,
    default_scores,
    extender_priorities,
    kube_fits,
    least_allocated,
    least_requested,
    select_host,
    spread_scores,
)
from packing.policies.placers import GpupackPlacer, KubeSchedulerPlacer
from packing.state import ClusterState
from packing.validate import validate

DAY = 24 * 3600.0


def deployment(name: str, req: PodRequest) -> Workload:
    ns = "ns"

    def make(pod: str, group: int, worker: int, rev: int) -> DayPod:
        del group, worker, rev
        return DayPod(f"{ns}/{pod}", f"{ns}/{name}", replace(req, key=f"{ns}/{pod}"))

    return Workload(f"{ns}/{name}", "deployment", make)


def lws(name: str, size: int, gpus: int = 8, cpu: int = 1000) -> Workload:
    ns = "ns"

    def make(pod: str, group: int, worker: int, rev: int) -> DayPod:
        del rev
        ref = GroupRef(f"{ns}/{name}/{group}", size, worker)
        req = PodRequest(f"{ns}/{pod}", cpu, 1024, RequestKind.WHOLE, gpu_count=gpus,
                         group=ref, klass="llm")
        return DayPod(req.key, f"{ns}/{name}", req)

    return Workload(f"{ns}/{name}", "lws", make, size)


def one_gpu(key: str = "x", cpu: int = 1000) -> PodRequest:
    return PodRequest(key, cpu, 1024, RequestKind.WHOLE, gpu_count=1, klass="llm")


def make_day(nodes: Sequence[NodeInfo], workloads: Sequence[Workload], events: Sequence,
             end: float = DAY) -> Day:
    pool = Pool("pool", tuple(nodes), len(nodes))
    return Day(tuple(nodes), {w.name: w for w in workloads}, tuple(events), end, (pool,))


PLACERS = [lambda: KubeSchedulerPlacer(1), lambda: GpupackPlacer(seed=1)]


# ---- controllers and the queue ------------------------------------------------------


@pytest.mark.parametrize("make_placer", PLACERS, ids=["kube-scheduler", "gpupack"])
def test_a_pod_that_finds_no_room_waits_until_a_deletion_frees_some(make_placer) -> None:
    nodes = [node("n0", gpus=1)]
    a, b = deployment("a", one_gpu()), deployment("b", one_gpu())
    day = make_day(nodes, [a, b], [Scale(0, a.name, 1), Scale(100, b.name, 1),
                                   Scale(400, a.name, 0)], end=1000)
    r = replay(day, make_placer())
    assert r.pods_created == 2
    assert r.pods_waiting_peak == 1
    assert [w.seconds for w in r.waited] == [300.0]  # created at 100, started at 400
    assert r.wait_p99_s == 300.0
    assert r.overcommitted == 0
    assert [s.pending for s in r.series] == [0, 1, 0]


def test_a_pod_still_waiting_at_the_end_counts_what_it_waited() -> None:
    nodes = [node("n0", gpus=1)]
    a = deployment("a", one_gpu())
    day = make_day(nodes, [a], [Scale(0, a.name, 2)], end=500)
    r = replay(day, KubeSchedulerPlacer())
    assert [w.seconds for w in r.waited] == [500.0]
    assert not r.served


def test_scale_down_deletes_a_waiting_pod_first_then_the_most_doubled_up() -> None:
    # Two 2-GPU nodes and 5 pods: four run, the fifth waits. Scaling to 4 deletes the
    # waiting one (it waited 60 s); scaling to 2 then deletes running ones.
    nodes = [node("n0", gpus=2), node("n1", gpus=2)]
    a = deployment("a", one_gpu())
    day = make_day(nodes, [a], [Scale(0, a.name, 5), Scale(60, a.name, 4),
                                Scale(120, a.name, 2)], end=200)
    r = replay(day, KubeSchedulerPlacer(3))
    assert r.pods_waiting_peak == 1
    assert [w.seconds for w in r.waited] == [60.0]  # deleted while waiting, at 60
    # At 120 the two deleted pods are those on the node holding more of them: the two
    # left run on different nodes.
    running = {p.node for _, p in r.busiest} if r.busiest else set()
    assert running  # the busiest moment (t=0) was kept
    assert r.series[-1].gpus_in_use == 2 and r.series[-1].nodes_in_use == 2


def test_scale_down_victims_follow_replicaset_ranking() -> None:
    nodes = [node("n0", gpus=4), node("n1", gpus=4)]
    a = deployment("a", one_gpu())

    class Fixed(KubeSchedulerPlacer):
        """Three pods on n0, one on n1, in creation order."""

        def place(self, state: ClusterState, pod: PodRequest) -> Placement | None:
            n = sum(len(x.pods) for x in state.nodes.values())
            name = "n1" if n == 3 else "n0"
            free = [g.info.index for g in state.nodes[name].gpus if g.whole_free]
            return Placement(pod.key, name, (free[0],))

    day = make_day(nodes, [a], [Scale(0, a.name, 4), Scale(100, a.name, 2)], end=200)
    r = replay(day, Fixed())
    final = r.series[-1]
    assert final.gpus_in_use == 2
    # The deleted two came from n0 (3 pods there against 1): n0 and n1 keep one each.
    assert final.nodes_in_use == 2


def test_create_and_delete_events_replay_a_recorded_cluster() -> None:
    nodes = [node("n0", gpus=1)]
    p1 = DayPod("ns/p1", "", one_gpu("ns/p1"))
    p2 = DayPod("ns/p2", "", one_gpu("ns/p2"))
    day = make_day(nodes, [], [Create(0, (p1,)), Create(10, (p2,)), Delete(50, ("ns/p1",))],
                   end=60)
    r = replay(day, GpupackPlacer())
    assert [(w.key, w.seconds) for w in r.waited] == [("ns/p2", 40.0)]


# ---- groups --------------------------------------------------------------------------


def test_kube_scheduler_runs_a_group_in_part_gpupack_all_or_nothing() -> None:
    # One whole node free and one half-used: kube-scheduler places the leader and its
    # worker waits holding the node; gpupack places neither and holds nothing.
    nodes = [node("n0", gpus=8), node("n1", gpus=8)]
    small = deployment("small", one_gpu())
    big = lws("big", 2)
    events = [Scale(0, small.name, 1), Scale(10, big.name, 1)]
    kube = replay(make_day(nodes, [small, big], events, end=100), KubeSchedulerPlacer(0))
    gp = replay(make_day(nodes, [small, big], events, end=100), GpupackPlacer())
    assert kube.groups_waiting_peak == 1 and gp.groups_waiting_peak == 1
    assert kube.series[-1].gpus_in_use == 9  # the leader holds a node while its worker waits
    assert gp.series[-1].gpus_in_use == 1
    assert kube.groups_waited == (("ns/big/0", 90.0),)


def test_rollout_replaces_groups_one_at_a_time_highest_index_first() -> None:
    nodes = [node(f"n{i}", gpus=8) for i in range(4)]
    big = lws("big", 2)
    day = make_day(nodes, [big], [Scale(0, big.name, 2), Rollout(100, big.name)], end=200)
    r = replay(day, GpupackPlacer())
    assert r.groups_created == 4  # two groups, then their new revisions
    assert r.groups_waiting_peak == 0
    keys = sorted(req.key for req, _ in r.busiest)
    assert keys == ["ns/big-0-1-r0", "ns/big-0-r0", "ns/big-1-1-r0", "ns/big-1-r0"]


def test_a_rollout_that_cannot_place_the_new_group_stalls_with_the_old_one_gone() -> None:
    # Three nodes: two groups of two 8-GPU pods need four. Group 1 waits from the start;
    # the rollout replaces group 1 first (highest index) and waits for it to run, so
    # group 0 keeps its old revision all day.
    nodes = [node(f"n{i}", gpus=8) for i in range(3)]
    big = lws("big", 2)
    day = make_day(nodes, [big], [Scale(0, big.name, 2), Rollout(100, big.name)], end=300)
    r = replay(day, GpupackPlacer())
    assert r.groups_created == 3
    assert r.groups_waiting_peak == 1
    assert {req.key for req, _ in replay(day, GpupackPlacer()).busiest} == {
        "ns/big-0-r0", "ns/big-0-1-r0"}


# ---- over-commit ---------------------------------------------------------------------


def test_time_sliced_memory_over_commit_is_counted_by_the_validator() -> None:
    # One L40S (48 GB), 4 replicas; each pod really uses 16 GiB. kube-scheduler counts
    # replicas only: the fourth share over-commits the GPU's memory.
    nodes = [node("l40s", gpus=1, model="L40S", mode=GpuMode.SHARED, replicas=4)]
    req = PodRequest("x", 1000, 1024, RequestKind.SHARED, gpu_memory_mib=16 * 1024)
    a = deployment("emb", req)
    day = make_day(nodes, [a], [Scale(0, a.name, 4)], end=10)
    kube = replay(day, KubeSchedulerPlacer())
    assert kube.overcommitted == 1
    assert "emb" in kube.overcommit_examples[0]
    # gpupack's extender filter knows the memory: the fourth waits instead.
    gp = replay(day, GpupackPlacer())
    assert gp.overcommitted == 0 and gp.pods_waiting_peak == 1


# ---- sizing --------------------------------------------------------------------------


def test_sizing_finds_the_fewest_nodes_on_which_nobody_waits() -> None:
    nodes = [node(f"n{i}", gpus=2) for i in range(6)]
    a = deployment("a", one_gpu())
    pool = Pool("p", tuple(nodes), 3)  # the cluster has 3; the search may add 3 more
    day = Day(tuple(nodes[:3]), {a.name: a}, (Scale(0, a.name, 7),), 100, (pool,))
    for make in PLACERS:
        z = size_cluster(day, make)
        assert z.served and z.counts == {"p": 4} and z.gpus == 8 and z.nodes == 4
    big = replace(day, events=(Scale(0, a.name, 13),))
    assert not size_cluster(big, PLACERS[0]).served


# ---- kube-scheduler's default score ----------------------------------------------------


def test_least_allocated_and_balanced_allocation_as_go_computes_them() -> None:
    n = node("n", gpus=0, cpu=10_000, mem=10_000)
    state = state_of([n])
    pod = PodRequest("p", 2_500, 5_000)
    assert least_requested(2_500, 10_000) == 75
    assert least_requested(11, 10) == 0
    assert least_allocated(state.nodes["n"], pod) == (75 + 50) // 2
    # Empty node: balance without = 100; with: 1 - |0.25 - 0.5| / 2 = 0.875 -> 87.
    assert balanced_allocation(state.nodes["n"], pod) == 50 + (50 + 87 - 100) // 2


def test_spread_prefers_nodes_without_the_workloads_pods() -> None:
    nodes = [node("a", gpus=2), node("b", gpus=2)]
    state = state_of(nodes)
    state.apply(one_gpu("ns/w-0"), Placement("ns/w-0", "a", (0,)))
    scores = spread_scores(state, "ns/w", ["a", "b"], lambda k: "ns/w")
    # raw: a = round(1 * ln(4) + 2) = 3, b = 2; normalised 100 * (3 + 2 - s) // 3.
    assert scores == {"a": 66, "b": 100}
    assert spread_scores(state, "", ["a", "b"], lambda k: "") == {"a": 0, "b": 0}


def test_select_host_is_uniform_among_the_best() -> None:
    rng = random.Random(5)
    picks = {select_host({"a": 3, "b": 3, "c": 1}, rng) for _ in range(50)}
    assert picks == {"a", "b"}


def test_kube_fits_counts_devices_not_memory() -> None:
    nodes = [node("l40s", gpus=1, model="L40S", mode=GpuMode.SHARED, replicas=2),
             node("mig", gpus=1, mode=GpuMode.MIG, layouts={0: [("3g.40gb", 0)]},
                  reconfigurable=False)]
    state = state_of(nodes)
    huge = PodRequest("s", 1000, 1024, RequestKind.SHARED, gpu_memory_mib=100_000)
    assert kube_fits(state, huge, "l40s")  # the scheduler does not see a share's memory
    asr = PodRequest("m", 1000, 1024, RequestKind.MIG, mig_profile="1g.10gb")
    assert not kube_fits(state, asr, "mig")  # no 1g.10gb instance, and none is created
    assert kube_fits(state, replace(asr, mig_profile="3g.40gb"), "mig")


def test_default_scores_weigh_spread_twice() -> None:
    nodes = [node("a", gpus=2), node("b", gpus=2)]
    state = state_of(nodes)
    state.apply(one_gpu("ns/w-0"), Placement("ns/w-0", "a", (0,)))
    pod = one_gpu("ns/w-1")
    total = default_scores(state, pod, ["a", "b"], "ns/w", lambda k: "ns/w")
    spread = spread_scores(state, "ns/w", ["a", "b"], lambda k: "ns/w")
    for n in ("a", "b"):
        ns = state.nodes[n]
        assert total[n] == (least_allocated(ns, pod) + balanced_allocation(ns, pod)
                            + 2 * spread[n])
    assert total["b"] > total["a"]


@pytest.mark.parametrize(("prefs", "expected"), [
    ({}, {"a": 0, "b": 0}),
    ({"a": (1,)}, {"a": 10, "b": 0}),
    ({"b": (1,)}, {"a": 0, "b": 10}),
    # Equal preferences: one winner (the node in use first, then the name), the other 9.
    ({"a": (1,), "b": (1,)}, {"a": 10, "b": 9}),
    ({"a": (1,), "b": (2,)}, {"a": 10, "b": 0}),
    ({"a": (2,), "b": (1,)}, {"a": 0, "b": 10}),
])
def test_extender_priorities_rank_the_preferences(prefs, expected) -> None:
    state = ClusterState(Snapshot(nodes=(node("a"), node("b"))))
    assert extender_priorities(prefs, ["a", "b"], state) == expected


def test_p99_by_nearest_rank() -> None:
    assert p99([]) == 0.0
    assert p99([5.0]) == 5.0
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([0.0] * 99 + [7.0]) == 0.0


def state_of(nodes: Sequence[NodeInfo]) -> ClusterState:
    return ClusterState(Snapshot(tuple(nodes)))


# ---- properties ------------------------------------------------------------------------

SERVICES = st.lists(
    st.tuples(st.sampled_from(["whole1", "whole2", "mig1", "mig3", "share"]),
              st.lists(st.integers(0, 6), min_size=1, max_size=5)),
    min_size=1, max_size=4)


def _request(kind: str) -> PodRequest:
    return {
        "whole1": one_gpu(),
        "whole2": PodRequest("x", 1000, 1024, RequestKind.WHOLE, gpu_count=2),
        "mig1": PodRequest("x", 1000, 1024, RequestKind.MIG, mig_profile="1g.10gb"),
        "mig3": PodRequest("x", 1000, 1024, RequestKind.MIG, mig_profile="3g.40gb"),
        "share": PodRequest("x", 1000, 1024, RequestKind.SHARED, gpu_memory_mib=20_000),
    }[kind]


@settings(max_examples=25, deadline=None)
@given(SERVICES, st.integers(1, 3), st.integers(0, 5))
def test_any_day_gpupack_never_over_commits_and_runs_groups_whole(
        services: list[tuple[str, list[int]]], groups: int, seed: int) -> None:
    layout = {g: [("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)]
              for g in range(4)}
    nodes = [node("mig-0", gpus=4, mode=GpuMode.MIG, layouts=layout, reconfigurable=False),
             node("l40s-0", gpus=2, model="L40S", mode=GpuMode.SHARED, replicas=4),
             node("h-0", gpus=8), node("h-1", gpus=8)]
    workloads = [deployment(f"s{i}", _request(kind)) for i, (kind, _) in enumerate(services)]
    events: list = []
    for i, (_, counts) in enumerate(services):
        events += [Scale(600.0 * k, f"ns/s{i}", n) for k, n in enumerate(counts)]
    big = lws("big", 2)
    workloads.append(big)
    events += [Scale(300.0, big.name, groups), Rollout(900.0, big.name)]
    events.sort(key=lambda e: e.t)
    day = make_day(nodes, workloads, events, end=4000)
    gp = replay(day, GpupackPlacer(seed=seed))
    assert gp.overcommitted == 0
    kube = replay(day, KubeSchedulerPlacer(seed))
    for r in (gp, kube):
        assert r.pods_created >= sum(max(c) for _, c in services)
        assert all(s.pending >= 0 and s.gpus_in_use <= 22 for s in r.series)
        # The busiest moment's placements are valid on the nodes (shares aside: the
        # plugin's pick depends on pods since gone, so only gpupack's are replayed).
    errors = validate(replace_snapshot(nodes, gp.busiest), ())
    assert not [e for e in errors if not e.startswith("group ")
                and "no such free resource" not in e]
    # gpupack never holds a group in part: whole or not at all.
    for req, _ in gp.busiest:
        if req.group is not None:
            members = [q for q, _ in gp.busiest if q.group and q.group.key == req.group.key]
            assert len(members) == req.group.size


def replace_snapshot(nodes: Sequence[NodeInfo],
                     running: Sequence[tuple[PodRequest, Placement]]) -> Snapshot:
    return Snapshot(tuple(nodes), tuple(running))


def test_replays_are_deterministic_for_a_seed() -> None:
    nodes = [node(f"n{i}", gpus=8) for i in range(3)]
    a = deployment("a", one_gpu())
    day = make_day(nodes, [a], [Scale(0, a.name, 5), Scale(50, a.name, 9),
                                Scale(90, a.name, 3)], end=100)
    one, two = replay(day, KubeSchedulerPlacer(4)), replay(day, KubeSchedulerPlacer(4))
    assert one.busiest == two.busiest and one.series == two.series
