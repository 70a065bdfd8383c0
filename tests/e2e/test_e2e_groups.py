"""LLM groups on the real control plane: a reservation uses only nodes every member could
run on, a group its namespace's ResourceQuota cannot hold is refused and holds nothing,
a group refused while another held the room binds as soon as that room is reserved
for it, though no cluster event told kube-scheduler (an expiry), and a member's room on a
node kube-scheduler rules out is placed again where kube-scheduler would send it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from cluster import (
    MANUAL_SCHEDULER,
    bind_with_records,
    bound,
    create_nodes,
    create_pods,
    group_outcomes,
    h100_whole,
    lws_member,
    pending_report,
    pod,
    pods_in,
    wait_for,
)
from conftest import Space
from controlplane import E2E_GROUP_TTL_S, NAMESPACE
from kubernetes.client.rest import ApiException

from kube.pod_conditions import ROOM_RESERVED
from scheduler.groups.loop import DEFAULT_VIEW_SETTLE_S

RECORDS = "app.kubernetes.io/managed-by=gpupack,app.kubernetes.io/component=group-reservation"
ZONE = "topology.kubernetes.io/zone"


def records(core: Any) -> list[Any]:
    return list(core.list_namespaced_config_map(NAMESPACE, label_selector=RECORDS).items)


def record_text(core: Any, ns: str) -> list[str]:
    """The reservation records of groups of namespace ``ns``, as text."""
    out = []
    for cm in records(core):
        text = str(cm.data)
        if ns in text:
            out.append(text)
    return out


def _zoned(spec: Any, zone: str) -> Any:
    return type(spec)(spec.name, {**spec.labels, ZONE: zone}, spec.allocatable)


def test_reservation_only_on_nodes_every_member_may_use(space: Space, core: Any) -> None:
    ns = space.namespace()
    p = space.name
    zone_a = [_zoned(h100_whole(f"{p}-a-{i}", p, clique=f"{p}-a"), "a") for i in range(3)]
    zone_b = [_zoned(h100_whole(f"{p}-b-{i}", p, clique=f"{p}-b"), "b") for i in range(2)]
    space.nodes += create_nodes(core, [*zone_a, *zone_b])
    members = [lws_member("llm", w, 2, 8, p) for w in range(2)]
    for m in members:
        m["spec"]["nodeSelector"][ZONE] = "b"
    create_pods(core, ns, members[:1])
    wait_for(lambda: bound(pods_in(core, ns)).get("llm-0"), 60, "the leader's bind")
    texts = wait_for(lambda: record_text(core, ns), 30, "the group's reservation record")
    for text in texts:
        assert not any(n.name in text for n in zone_a), text
    create_pods(core, ns, members[1:])
    pods = wait_for(lambda: (lambda ps: ps if len(bound(ps)) == 2 else None)(
        pods_in(core, ns)), 60, "the worker's bind")
    group = group_outcomes(core, pods)["llm"]
    assert set(group.nodes) <= {n.name for n in zone_b}, group.nodes


def test_group_over_its_quota_is_refused_and_holds_nothing(space: Space, core: Any) -> None:
    ns = space.namespace()
    p = space.name
    space.nodes += create_nodes(core, [h100_whole(f"{p}-a-{i}", p, clique=f"{p}-a")
                                       for i in range(3)])
    hard = {"requests.nvidia.com/gpu": "8"}
    core.create_namespaced_resource_quota(ns, {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus"},
        "spec": {"hard": hard}})
    # No kube-controller-manager computes the quota's status; the API server's quota
    # admission needs it, so it is set as the quota controller would.
    core.patch_namespaced_resource_quota_status("gpus", ns, {
        "status": {"hard": hard, "used": {"requests.nvidia.com/gpu": "0"}}})
    leader, worker = (lws_member("llm", w, 2, 8, p) for w in range(2))
    wait_for(lambda: _created(core, ns, leader), 30, "quota admission to accept the leader")
    # The API server's own quota admission refuses the worker (8 + 8 > 8) ...
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, worker)
    assert err.value.status == 403 and "exceeded quota" in str(err.value.body)
    # ... and gpupack refuses the whole group at its leader: no room is held for it.
    time.sleep(5)
    assert "llm-0" not in bound(pods_in(core, ns)), "the leader of an impossible group bound"
    assert record_text(core, ns) == [], "a record holds room for a group that cannot fit"
    report = pending_report(core, ns)
    assert "ResourceQuota" in report or "quota" in report.lower(), report


def _created(core: Any, ns: str, body: dict[str, Any]) -> bool:
    try:
        core.create_namespaced_pod(ns, body)
    except ApiException as e:
        if e.status == 409:
            return True
        if "status unknown for quota" in str(e.body):
            return False  # the quota's status is not seen by admission yet
        raise
    return True


def _room_condition(core: Any, ns: str, name: str) -> Any:
    p = core.read_namespaced_pod(name, ns)
    return next((c for c in p.status.conditions or [] if c.type == ROOM_RESERVED), None)


def test_a_refused_group_binds_when_an_expiry_frees_its_room(space: Space, core: Any) -> None:
    """Group a holds room for a worker that never comes; group b, refused meanwhile, is
    parked by kube-scheduler. When a's reservation expires (gpupack's clock, no cluster
    event) b is reserved there, and the status condition gpupack writes on b's refused
    members requeues them: they bind at once, not at kube-scheduler's five-minute flush."""
    ns = space.namespace()
    p = space.name
    space.nodes += create_nodes(core, [h100_whole(f"{p}-a-{i}", p, clique=f"{p}-a")
                                       for i in range(3)])
    create_pods(core, ns, [lws_member("llm-a", 0, 2, 8, p)])
    wait_for(lambda: "llm-a-0" in bound(pods_in(core, ns)), 30, "group a's leader to bind")
    start = time.monotonic()
    b = [lws_member("llm-b", w, 2, 8, p) for w in range(2)]
    create_pods(core, ns, b)
    wait_for(lambda: "waits whole" in pending_report(core, ns), 30,
             "kube-scheduler to refuse group b (a holds the room)")
    got = wait_for(lambda: {"llm-b-0", "llm-b-0-1"} <= set(bound(pods_in(core, ns))),
                   E2E_GROUP_TTL_S + 30, "group b to bind after a's reservation expired")
    assert got
    # Woken by gpupack, not by some other event: the refused members carry its condition.
    woken = [n for n in ("llm-b-0", "llm-b-0-1") if _room_condition(core, ns, n) is not None]
    assert woken, "no refused member of b got the RoomReserved condition"
    cond = _room_condition(core, ns, woken[0])
    assert cond.status == "True" and "group " in cond.message
    # a's leader stayed where it was; b took the rest of the clique, after the expiry.
    placed = bound(pods_in(core, ns))
    assert len({placed["llm-a-0"], placed["llm-b-0"], placed["llm-b-0-1"]}) == 3
    assert time.monotonic() - start >= E2E_GROUP_TTL_S - 10


def test_a_room_kube_scheduler_rules_out_is_placed_again(space: Space, core: Any) -> None:
    """kube-scheduler judges rules gpupack does not (here a worker's pod anti-affinity):
    when it leaves a member's reserved node out of the candidates it sends, gpupack places
    that room again on a node it did send, and the member binds there well before the
    reservation would expire (without that, the same room was refused until the TTL and
    then reserved on the same node again)."""
    ns = space.namespace()
    p = space.name
    first = [h100_whole(f"{p}-n-{i}", p) for i in range(2)]
    space.nodes += create_nodes(core, first)
    # A pod on one of the two nodes that the worker must not share a node with.
    blocker = pod("blocker", labels={"e2e.gpupack.io/blocker": "yes"}, cpu="10m",
                  memory="16Mi", scheduler=MANUAL_SCHEDULER)
    create_pods(core, ns, [blocker])
    members = [lws_member("llm", w, 2, 8, p) for w in range(2)]
    leader, worker = members
    create_pods(core, ns, [leader])
    placed = wait_for(lambda: bound(pods_in(core, ns)).get("llm-0"), 60, "the leader's bind")
    room = next(n.name for n in first if n.name != placed)
    # Only now the blocker goes where the worker's room is (bound by hand, no scheduler).
    bind_with_records(core, ns, "blocker", room, {})
    worker["spec"]["affinity"] = {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"e2e.gpupack.io/blocker": "yes"}},
            "topologyKey": "kubernetes.io/hostname"}]}}
    # A third node for kube-scheduler to offer instead.
    third = f"{p}-n-2"
    space.nodes += create_nodes(core, [h100_whole(third, p)])
    # A node that changed a moment ago is never taken as ruled out (kube-scheduler's
    # view may lag the change): the blocker must have been there a while.
    time.sleep(DEFAULT_VIEW_SETTLE_S + 1)
    start = time.monotonic()
    create_pods(core, ns, [worker])
    got = wait_for(lambda: bound(pods_in(core, ns)).get("llm-0-1"), E2E_GROUP_TTL_S - 20,
                   "the worker to bind on the node kube-scheduler offered "
                   f"({pending_report(core, ns)})")
    assert got == third
    assert time.monotonic() - start < E2E_GROUP_TTL_S - 20
