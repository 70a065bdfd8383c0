"""Properties of every policy on random clusters and workloads (Hypothesis)."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packing_builders import cpu_pod, group, mig, node, shared, whole

from packing.cpsat import SolverParams
from packing.model import GpuMode, NodeInfo, PodRequest, Snapshot
from packing.policies import get_policy, policy_names
from packing.policies.gpupack import GpupackPolicy, objective_key
from packing.validate import validate

FAST = SolverParams(max_time_s=0.5, workers=1, seed=1)


@st.composite
def nodes(draw: st.DrawFn) -> list[NodeInfo]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["mig", "whole", "shared", "a100"]))
        n = draw(st.integers(1, 4))
        labels = {"clique": draw(st.sampled_from(["a", "b"]))}
        if kind == "mig":
            out.append(node(f"n{i}", n, mode=GpuMode.MIG, labels=labels))
        elif kind == "whole":
            out.append(node(f"n{i}", n, labels=labels, cpu=draw(st.sampled_from([8000, 64000]))))
        elif kind == "shared":
            out.append(node(f"n{i}", n, model="L40S", mode=GpuMode.SHARED, labels=labels))
        else:
            out.append(node(f"n{i}", n, model="A100-40GB", mode=GpuMode.MIG, labels=labels))
    return out


@st.composite
def workloads(draw: st.DrawFn) -> list[PodRequest]:
    pods: list[PodRequest] = []
    for i in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["mig", "mig", "shared", "whole", "cpu", "group"]))
        prio = draw(st.sampled_from([0, 0, 100]))
        if kind == "mig":
            prof = draw(st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "1g.5gb", "4g.20gb"]))
            pods.append(mig(f"p{i}", prof, prio=prio))
        elif kind == "shared":
            pods.append(
                shared(
                    f"p{i}",
                    draw(st.sampled_from([100, 250, 500])),
                    draw(st.sampled_from([4096, 16384, 30000])),
                )
            )
        elif kind == "whole":
            pods.append(whole(f"p{i}", draw(st.integers(1, 4)), prio=prio))
        elif kind == "cpu":
            pods.append(cpu_pod(f"p{i}", draw(st.sampled_from([1000, 6000]))))
        else:
            pods.extend(
                group(
                    f"g{i}",
                    draw(st.integers(1, 3)),
                    draw(st.sampled_from([None, "clique"])),
                    count=draw(st.integers(1, 4)),
                )
            )
    return pods


SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _plan(name: str, snap: Snapshot):  # type: ignore[no-untyped-def]
    policy = GpupackPolicy(FAST) if name == "gpupack" else get_policy(name)
    return policy.plan(snap)


@SETTINGS
@given(nodes(), workloads())
def test_every_policy_is_valid_and_groups_all_or_nothing(
    ns: list[NodeInfo], pods: list[PodRequest]
) -> None:
    snap = Snapshot(tuple(ns), pending=tuple(pods))
    for name in policy_names():
        result = _plan(name, snap)
        assert validate(snap, result.placements) == [], name
        placed = {p.pod for p in result.placements}
        unplaced = {u.pod for u in result.unschedulable}
        assert placed | unplaced == {p.key for p in pods} and not placed & unplaced, name
        members: dict[str, list[bool]] = defaultdict(list)
        for p in pods:
            if p.group is not None:
                members[p.group.key].append(p.key in placed)
        for key, flags in members.items():
            assert all(flags) or not any(flags), (name, key)


@SETTINGS
@given(nodes(), workloads())
def test_gpupack_never_worse_than_bestfit(ns: list[NodeInfo], pods: list[PodRequest]) -> None:
    """gpupack places at least as many pods as best fit, and on equal pods placed keeps at
    least as many whole nodes, then whole GPUs, free. Documented exception: when it places
    more pods (or keeps more whole nodes) it may keep fewer whole GPUs."""
    snap = Snapshot(tuple(ns), pending=tuple(pods))
    gp = _plan("gpupack", snap)
    bf = _plan("bestfit", snap)
    assert len(gp.placements) >= len(bf.placements)
    assert objective_key(snap, gp.placements) >= objective_key(snap, bf.placements)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes(), workloads())
def test_same_seed_same_answer(ns: list[NodeInfo], pods: list[PodRequest]) -> None:
    snap = Snapshot(tuple(ns), pending=tuple(pods))
    for name in ("gpupack", "fgd", "random"):
        assert _plan(name, snap).placements == _plan(name, snap).placements, name


@SETTINGS
@given(running=workloads(), pending=workloads(), nodes_=nodes())
def test_a_shape_workload_makes_the_same_scorer(running: list[PodRequest],
                                                pending: list[PodRequest],
                                                nodes_: list[NodeInfo]) -> None:
    """What the warm child gets instead of every pod (issue 17 item 6): the same typical
    shapes, so every policy's scorer rates every option as the one made from the pods."""
    import pickle

    from packing.model import Placement
    from packing.policies.fgd import shape_workload, typical_shapes, workload_of
    from packing.state import ClusterState

    full = Snapshot(tuple(nodes_), tuple((p, Placement(p.key, nodes_[0].name))
                                         for p in running), tuple(pending))
    small = pickle.loads(pickle.dumps(shape_workload(full)))
    assert typical_shapes(workload_of(small)) == typical_shapes(workload_of(full))
    state = ClusterState(Snapshot(tuple(nodes_)))
    for name in ("gpupack-greedy", "fgd", "bestfit"):
        a, b = get_policy(name).make_scorer(full), get_policy(name).make_scorer(small)
        for pod in pending[:3]:
            for n in nodes_:
                for option in state.options(pod, n.name)[:4]:
                    assert a(state, pod, option) == b(state, pod, option)
