"""The device plugin model (packing.device_plugin) and the packing state that follows it:
table cases, a replay of recorded PodResources sequences, and properties."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packing_builders import node, shared

from packing.device_plugin import (
    AllocationPolicy,
    PluginRefusal,
    ReplicatedGpu,
    plugin_allocation,
)
from packing.model import GpuMode, Placement, Snapshot
from packing.state import ClusterState, plugin_pick
from packing.validate import validate

FIXTURE = Path(__file__).parent / "fixtures" / "device_plugin_replay.json"

D, P, S = AllocationPolicy.DISTRIBUTED, AllocationPolicy.PACKED, AllocationPolicy.SPREAD


def gpus(*allocated: int, replicas: int = 4) -> list[ReplicatedGpu]:
    return [ReplicatedGpu(i, replicas, a) for i, a in enumerate(allocated)]


@pytest.mark.parametrize(
    ("gpu_list", "size", "policy", "want", "possible"),
    [
        (gpus(0, 0), 1, D, (0,), ({0, 1},)),  # a tie: either GPU
        (gpus(1, 0), 1, D, (1,), ({1},)),
        (gpus(3, 1, 2), 1, D, (1,), ({1},)),
        (gpus(4, 3), 1, D, (1,), ({1},)),  # GPU 0 has no free replica
        (gpus(1, 0), 1, P, (0,), ({0},)),  # packed: most in use first
        (gpus(4, 1), 1, P, (1,), ({1},)),  # ... among GPUs with a free replica
        (gpus(0, 0), 2, D, (0, 1), ({0, 1}, {1})),  # pickedFrom rotates on a tie
        (gpus(0, 3), 2, D, (0, 0), ({0}, {0})),  # two replicas on one GPU
        (gpus(0, 3), 2, S, (0, 1), ({0}, {1})),  # spread: another GPU first
        (gpus(0, 0, replicas=0), 1, D, (0,), ({0, 1},)),  # unlimited replicas
    ],
)
def test_plugin_allocation(gpu_list: list[ReplicatedGpu], size: int, policy: AllocationPolicy,
                           want: tuple[int, ...], possible: tuple[set[int], ...]) -> None:
    got = plugin_allocation(gpu_list, size, policy=policy, fail_requests_greater_than_one=False)
    assert got.gpus == want
    assert [set(p) for p in got.possible] == [set(p) for p in possible]


@pytest.mark.parametrize(
    ("gpu_list", "size", "fail", "message"),
    [
        (gpus(0, 0), 2, True, "maximum request size for shared resources is 1"),
        (gpus(4, 4), 1, True, "requested 1, available 0"),
        (gpus(3, 4), 2, False, "requested 2, available 1"),
        ([], 1, True, "available 0"),
    ],
)
def test_plugin_refusals(gpu_list: list[ReplicatedGpu], size: int, fail: bool,
                         message: str) -> None:
    with pytest.raises(PluginRefusal, match=message):
        plugin_allocation(gpu_list, size, fail_requests_greater_than_one=fail)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        plugin_allocation(gpus(0), 0)
    with pytest.raises(ValueError, match="listed twice"):
        plugin_allocation([ReplicatedGpu(0, 4, 0), ReplicatedGpu(0, 4, 1)])


# ---- replay of recorded PodResources sequences ------------------------------------------


def _scenarios() -> list[dict[str, Any]]:
    return list(json.loads(FIXTURE.read_text())["scenarios"])


@pytest.mark.parametrize("scenario", _scenarios(), ids=lambda s: s["name"])
def test_replay_recorded_assignments(scenario: dict[str, Any]) -> None:
    """At every allocation the model names the recorded GPU as possible, and as its
    prediction whenever the plugin had no tie; refused requests are refused."""
    uuids = [g["uuid"] for g in scenario["gpus"]]
    replicas = {g["uuid"]: g["replicas"] for g in scenario["gpus"]}
    in_use: dict[str, int] = dict.fromkeys(uuids, 0)
    held: dict[str, list[str]] = {}
    policy = AllocationPolicy(scenario["policy"])
    fail = scenario["failRequestsGreaterThanOne"]
    certain_steps = 0
    for event in scenario["events"]:
        state = [ReplicatedGpu(i, replicas[u], in_use[u]) for i, u in enumerate(uuids)]
        if event["op"] == "release":
            for u in held.pop(event["pod"]):
                in_use[u] -= 1
            continue
        if event["op"] == "refused":
            with pytest.raises(PluginRefusal):
                plugin_allocation(state, event["size"], policy=policy,
                                  fail_requests_greater_than_one=fail)
            continue
        got = [d.split("::")[0] for d in event["devices"]]
        choice = plugin_allocation(state, len(got), policy=policy,
                                   fail_requests_greater_than_one=fail)
        for step, u in enumerate(got):
            assert uuids.index(u) in choice.possible[step], (event, choice)
            if len(choice.possible[step]) == 1:
                assert choice.gpus[step] == uuids.index(u), (event, choice)
                certain_steps += 1
        held[event["pod"]] = got
        for u in got:
            in_use[u] += 1
    assert certain_steps >= 1  # every scenario pins the model down somewhere


# ---- the packing state follows the plugin ---------------------------------------------------


def l40s_node(gpus: int = 2, memory: int = 46_068, replicas: int = 4) -> Any:
    n = node("a", gpus, model="L40S", mode=GpuMode.SHARED, replicas=replicas)
    return replace(n, gpus=tuple(replace(g, memory_mib=memory) for g in n.gpus))


def test_share_is_counted_on_the_gpu_the_plugin_picks() -> None:
    state = ClusterState(Snapshot((l40s_node(),)))
    big = shared("big", milli=0, gmem=30_000)
    state.apply(big, state.options(big, "a")[0])
    small = shared("small", milli=0, gmem=8_000)
    # gpupack used to stack the small one beside the big one (GPU by GPU, by memory);
    # the plugin hands it GPU 1 (no replica in use there).
    assert state.options(small, "a") == [Placement("small", "a", (1,))]


def test_share_refused_when_the_plugins_gpu_has_no_room_even_if_another_has() -> None:
    state = ClusterState(Snapshot((l40s_node(),)))
    state.apply(shared("big", milli=0, gmem=40_000), Placement("big", "a", (0,)))
    state.apply(shared("s1", milli=0, gmem=8_000), Placement("s1", "a", (1,)))
    pod = shared("s2", milli=0, gmem=8_000)
    # One replica in use on each GPU: the plugin may hand out GPU 0 (40,000 + 8,000 over
    # 46,068 MiB) as well as GPU 1, so the share must not come here.
    assert plugin_pick(state.nodes["a"]) is not None
    assert state.options(pod, "a") == []
    assert "GPU 0 has 6068Mi of 46068Mi" in state.reason(pod, "a")
    # Two replicas in use on GPU 0: now the plugin picks GPU 1 only.
    state.apply(shared("s3", milli=0, gmem=1_000), Placement("s3", "a", (0,)))
    assert state.options(pod, "a") == [Placement("s2", "a", (1,))]


def test_batch_solver_follows_the_plugin_sequence() -> None:
    from packing.cpsat import SolverParams, solve_batch

    snap = Snapshot((l40s_node(gpus=2, memory=48_000),),
                    pending=tuple(shared(f"p{i}", milli=0, gmem=g)
                                  for i, g in enumerate((30_000, 20_000, 20_000, 10_000))))
    state = ClusterState(snap)
    result = solve_batch(state, snap.pending, params=SolverParams(max_time_s=5, workers=1))
    assert result.placements
    # Replayed one by one in the solver's order, every share is where the plugin puts it.
    assert validate(snap, result.placements) == []


# ---- property: nothing a share is booked or observed on runs out of memory ---------------

arrival = st.tuples(st.sampled_from([2_000, 6_000, 12_000, 20_000, 30_000]),
                    st.integers(0, 7))  # (memory, which tie member the plugin picks)


@settings(max_examples=150, deadline=None)
@given(
    n_gpus=st.integers(1, 3),
    replicas=st.integers(2, 6),
    policy=st.sampled_from(list(AllocationPolicy)),
    events=st.lists(st.one_of(arrival, st.integers(0, 30)), max_size=30),
)
def test_predicted_and_observed_memory_never_exceed_the_gpu(
        n_gpus: int, replicas: int, policy: AllocationPolicy, events: list[Any]) -> None:
    """Arrivals and departures in any order. gpupack books each share where
    :meth:`ClusterState.options` says (the plugin's prediction); the simulated plugin
    then picks any GPU it may (ties broken by the drawn number); the agent reports it
    and the observation replaces the booking. Neither view ever overfills a GPU."""
    memory = 46_068
    info = replace(l40s_node(n_gpus, memory, replicas), share_policy=policy)
    state = ClusterState(Snapshot((info,)))
    observed: dict[int, dict[str, int]] = {g.index: {} for g in info.gpus}
    placed: dict[str, Any] = {}
    for k, e in enumerate(events):
        if isinstance(e, int):  # a departure (of the e-th pod still running)
            if placed:
                key = sorted(placed)[e % len(placed)]
                pod, p = placed.pop(key)
                state.undo(pod, p)
                del observed[p.gpus[0]][key]
            continue
        mem, tie = e
        pod = shared(f"p{k}", milli=0, gmem=mem)
        options = state.options(pod, "a")
        if not options:
            continue
        predicted = options[0]
        pick = plugin_pick(state.nodes["a"])
        assert pick is not None and predicted.gpus == (pick.first,)
        state.apply(pod, predicted)
        for g in state.nodes["a"].gpus:  # the prediction fits
            assert g.shared_memory_used <= g.info.memory_mib
        real = sorted(pick.possible[0])[tie % len(pick.possible[0])]
        observed[real][pod.key] = mem
        assert sum(observed[real].values()) <= memory  # the node never runs out
        # The observation wins over the booking.
        state.undo(pod, predicted)
        p = Placement(pod.key, "a", (real,))
        state.apply(pod, p, allow_overcommit=True)
        placed[pod.key] = (pod, p)
        for g in state.nodes["a"].gpus:
            assert g.shared_memory_used == sum(observed[g.info.index].values()) <= memory
