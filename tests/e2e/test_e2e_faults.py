"""Faults on the real control plane: the extender killed in the middle of a group,
kube-scheduler and kube-apiserver restarted in the middle of a batch. Nothing may be lost
(every pod ends bound) and nothing double-booked (no node's GPUs over-committed as the
API server counts them, no GPU or slice recorded for two pods)."""

from __future__ import annotations

from typing import Any

import pytest
from cluster import (
    GPU,
    bound,
    create_nodes,
    create_pods,
    double_bookings,
    group_outcomes,
    h100_mig,
    h100_whole,
    l40s_shared,
    lws_member,
    overcommits,
    pending_report,
    pod,
    pods_in,
    wait_for,
    wait_for_webhook,
)
from conftest import Space
from controlplane import Stack, active_replica


def _all_bound(core: Any, ns: str, n: int) -> Any:
    pods = pods_in(core, ns)
    return pods if len(bound(pods)) == n else None


def wait_all_bound(core: Any, ns: str, n: int, timeout_s: float, what: str) -> Any:
    try:
        return wait_for(lambda: _all_bound(core, ns, n), timeout_s, what)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{pending_report(core, ns)}") from None


def test_extender_killed_after_a_leader_is_bound(space: Space, core: Any, admin: Any,
                                                 stack: Stack) -> None:
    ns = space.namespace()
    p = space.name
    space.nodes += create_nodes(core, [
        *[h100_whole(f"{p}-a-{i}", p, clique=f"{p}-a") for i in range(2)],
        *[h100_whole(f"{p}-b-{i}", p, clique=f"{p}-b") for i in range(3)]])
    leader = lws_member("llm", 0, 2, 8, p)
    create_pods(core, ns, [leader])
    where = wait_for(lambda: bound(pods_in(core, ns)).get("llm-0"), 60, "the leader's bind")
    extender = "extender" + active_replica(stack, admin)
    stack.kill(extender)
    # While the extender is down: the worker and whole-GPU fillers that could take its
    # room arrive; kube-scheduler cannot place them (the extender is not ignorable).
    fillers = [pod(f"filler-{i}", pool=p, limits={GPU: "4"}) for i in range(4)]
    create_pods(core, ns, [lws_member("llm", 1, 2, 8, p), *fillers])
    stack.start(extender)
    pods = wait_all_bound(core, ns, 6, 120, "every pod bound after the restart")
    group = group_outcomes(core, pods)["llm"]
    assert group.one_clique, f"leader on {where}, group on {group.nodes} ({group.cliques})"
    assert overcommits(core, pods) == []
    assert double_bookings(pods) == []


def _batch(pool: str) -> list[dict[str, Any]]:
    """18 ASR pods (1g.10gb), 6 TTS (2g.20gb) and 12 embedders (shares), interleaved.
    Isolation is explicit: which kind the webhook picks for "any" is not under test here."""
    asr = {"gpupack.io/class": "asr", "gpupack.io/gpu-memory": "8Gi",
           "gpupack.io/isolation": "mig"}
    tts = {"gpupack.io/class": "tts", "gpupack.io/gpu-memory": "16Gi",
           "gpupack.io/isolation": "mig"}
    embed = {"gpupack.io/gpu-memory": "6Gi", "gpupack.io/isolation": "shared"}
    kinds = [asr, embed, asr, tts, asr, embed] * 6
    return [pod(f"p-{i}", pool=pool, annotations=k) for i, k in enumerate(kinds)]


def _restart_mid_batch(space: Space, core: Any, stack: Stack, component: str) -> None:
    """Restart ``component`` once a third of a 36-pod batch is bound, then create the
    rest."""
    ns = space.namespace()
    p = space.name
    space.nodes += create_nodes(core, [
        h100_mig(f"{p}-mig-0", p, {"1g.10gb": 14, "2g.20gb": 6, "3g.40gb": 2}),
        h100_mig(f"{p}-mig-1", p, {"1g.10gb": 28}),
        l40s_shared(f"{p}-l40s-0", p)])
    probe = pod("probe", pool=p, annotations={"gpupack.io/gpu-memory": "8Gi"})
    wait_for_webhook(core, ns, probe, "nvidia.com/mig-")
    batch = _batch(p)
    create_pods(core, ns, batch[:18])
    wait_for(lambda: len(bound(pods_in(core, ns))) >= 6, 60, "the batch to start binding")
    stack.restart(component)
    create_pods(core, ns, batch[18:])
    pods = wait_all_bound(core, ns, len(batch), 180,
                          f"every pod bound after the {component} restart")
    assert overcommits(core, pods) == []
    assert double_bookings(pods) == []


def test_scheduler_restarted_mid_batch(space: Space, core: Any, admin: Any,
                                       stack: Stack) -> None:
    _restart_mid_batch(space, core, stack, "scheduler" + active_replica(stack, admin))


def test_apiserver_restarted_mid_batch(space: Space, core: Any, stack: Stack) -> None:
    _restart_mid_batch(space, core, stack, "apiserver")


def test_failover_mid_group(space: Space, core: Any, admin: Any, stack: Stack) -> None:
    """Two replicas of kube-scheduler + extender (the chart's default). The active pair is
    SIGKILLed just after a group's leader is bound; the standby takes kube-scheduler's
    Lease, its extender becomes the one writer, and the group completes in the leader's
    domain with nothing else in the worker's room."""
    if "-b" not in stack.state().get("replicas", []):
        pytest.skip("the standby replica needs root and unshare(1) for a host name of its own")
    ns = space.namespace()
    p = space.name
    space.nodes += create_nodes(core, [
        *[h100_whole(f"{p}-a-{i}", p, clique=f"{p}-a") for i in range(2)],
        *[h100_whole(f"{p}-b-{i}", p, clique=f"{p}-b") for i in range(3)]])
    create_pods(core, ns, [lws_member("llm", 0, 2, 8, p)])
    where = wait_for(lambda: bound(pods_in(core, ns)).get("llm-0"), 60, "the leader's bind")
    active = active_replica(stack, admin)
    standby = "-b" if active == "" else ""
    stack.kill("scheduler" + active)
    stack.kill("extender" + active)
    fillers = [pod(f"filler-{i}", pool=p, limits={GPU: "4"}) for i in range(4)]
    create_pods(core, ns, [lws_member("llm", 1, 2, 8, p), *fillers])
    try:
        # kube-scheduler's lease lasts 15 s; the standby takes it after that.
        wait_for(lambda: active_replica(stack, admin) == standby, 60, "the standby's lease")
        pods = wait_all_bound(core, ns, 6, 120, "every pod bound after the failover")
    finally:
        stack.start("extender" + active)
        stack.start("scheduler" + active)
    group = group_outcomes(core, pods)["llm"]
    assert group.one_clique, f"leader on {where}, group on {group.nodes} ({group.cliques})"
    assert overcommits(core, pods) == []
    assert double_bookings(pods) == []
