"""Reservations within the group's rights (issue 15, item 4), through the reservation
book: only nodes every member could run on, within the namespace's ResourceQuota, the
size from the LeaderWorkerSet object or the labels capped by --max-group-gpus; a group
that can never fit is refused with that reason (filter says it) and holds nothing."""

from __future__ import annotations

from typing import Any

from sched_builders import filter_args, node, whole_pod
from test_groups_builders import Rig, lws_pod, rig

from kube.groups.inputs import GroupInputs
from kube.groups.reservations import record_object
from packing.groups.members import RESERVE_MARK
from scheduler.extender.wire import ExtenderArgs, PreemptionArgs
from scheduler.groups.plugin import GroupVerbs

ZONE = "topology.kubernetes.io/zone"
A = "llm/a/0"


def zoned(name: str, zone: str, taint: str | None = None) -> dict[str, Any]:
    n = node(name, labels={ZONE: zone}, reconfigurable=False)
    if taint:
        n["spec"] = {"taints": [{"key": taint, "value": "yes", "effect": "NoSchedule"}]}
    return n


def with_spec(pod: dict[str, Any], **spec: Any) -> dict[str, Any]:
    pod["spec"].update(spec)
    return pod


def held_gpus(r: Rig) -> dict[str, int]:
    """GPUs held by reservations, per node."""
    out: dict[str, int] = {}
    for n, s in r.cache.state.nodes.items():
        k = sum(1 for g in s.gpus if g.whole_owner is not None and RESERVE_MARK in g.whole_owner)
        if k:
            out[n] = k
    return out


def reason(r: Rig, pod: dict[str, Any]) -> str:
    args = ExtenderArgs.decode(filter_args(pod, list(r.cache.node_names())))
    res = GroupVerbs(r.book).filter(args)
    assert res is not None and res.node_names == ()
    reasons = set(res.failed.values())
    assert len(reasons) == 1
    return reasons.pop()


IN_ZONE_B = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [
        {"key": ZONE, "operator": "In", "values": ["b"]}]}]}}}


def test_required_node_affinity_keeps_the_reservation_in_its_zone() -> None:
    nodes = [zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b"), zoned("b2", "b")]
    r = rig(nodes, [with_spec(lws_pod("a", 0, 2, 8), affinity=IN_ZONE_B)])
    assert set(held_gpus(r)) == {"b1", "b2"}


def test_taints_the_members_do_not_tolerate_are_avoided() -> None:
    nodes = [zoned("a1", "a", taint="maint"), zoned("a2", "a"), zoned("a3", "a")]
    r = rig(nodes, [lws_pod("a", 0, 2, 8)])
    assert set(held_gpus(r)) == {"a2", "a3"}
    tolerant = with_spec(lws_pod("b", 0, 1, 8), tolerations=[{"key": "maint",
                                                            "operator": "Exists"}])
    r.tap.upsert_pod(tolerant)
    r.sync()
    assert held_gpus(r) == {"a1": 8, "a2": 8, "a3": 8}


def test_a_worker_that_does_not_tolerate_the_taint_counts_too() -> None:
    nodes = [zoned("a1", "a", taint="maint"), zoned("a2", "a", taint="maint"), zoned("a3", "a")]
    tol = [{"key": "maint", "operator": "Exists"}]
    r = rig(nodes, [with_spec(lws_pod("a", 0, 2, 8), tolerations=tol), lws_pod("a", 1, 2, 8)])
    assert held_gpus(r) == {}  # only a3 takes both; the group needs two nodes
    assert r.book.waiting[A].category == "no_room"


def test_a_group_no_node_allows_waits_with_that_reason_and_holds_nothing() -> None:
    nodes = [zoned("a1", "a"), zoned("a2", "a")]
    p = with_spec(lws_pod("a", 0, 2, 8), affinity=IN_ZONE_B)
    r = rig(nodes, [p])
    assert held_gpus(r) == {} and A not in r.book.reservations
    assert "no node is one every member could run on" in reason(r, p)
    assert r.book.waiting[A].category == "no_rights"


def test_label_sized_group_over_max_group_gpus_is_refused_and_holds_nothing_ever() -> None:
    nodes = [zoned(f"n{i}", "a") for i in range(4)]
    forged = whole_pod("big", 8, namespace="x",
                       annotations={"gpupack.io/group": "g", "gpupack.io/group-size": "4"})
    r = rig(nodes, [forged], max_group_gpus=16)
    assert held_gpus(r) == {}
    assert "--max-group-gpus 16" in reason(r, forged)
    for _ in range(3):  # nothing changes it: it stays refused after every TTL
        r.clock.advance(200)
        r.tap.upsert_pod(whole_pod(f"filler-{_}", 0, namespace="y"))
        r.sync()
        assert held_gpus(r) == {}


def quota(hard: str, ns: str = "llm", name: str = "gpus") -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name},
            "spec": {"hard": {"requests.nvidia.com/gpu": hard}}}


def inputs(*objs: dict[str, Any], lws: list[dict[str, Any]] | None = None) -> GroupInputs:
    i = GroupInputs()
    i.replace(list(objs))
    i.replace_lws(lws or [], installed=lws is not None)
    i.lws_listed()
    return i


def test_a_group_over_its_quota_hard_limit_is_refused() -> None:
    nodes = [zoned(f"n{i}", "a") for i in range(4)]
    p = lws_pod("a", 0, 4, 8)
    r = rig(nodes, [p], inputs=inputs(quota("16")))
    assert held_gpus(r) == {}
    assert "ResourceQuota llm/gpus allows (16)" in reason(r, p)


def test_a_group_waits_for_what_its_quota_has_left_then_reserves() -> None:
    nodes = [zoned(f"n{i}", "a") for i in range(4)]
    other = whole_pod("other", 8, namespace="llm", node="n3")
    p = lws_pod("a", 0, 2, 8)
    r = rig(nodes, [other, p], inputs=inputs(quota("16")))
    assert held_gpus(r) == {}
    assert ("ResourceQuota llm/gpus has 0 nvidia.com/gpu left; the group needs 8 more"
            in reason(r, p))
    r.tap.delete_pod("llm/other")
    r.clock.advance(1)  # refused groups are tried again at most every second
    r.sync()
    assert sum(held_gpus(r).values()) == 16


def test_two_groups_of_one_namespace_share_its_quota_in_one_pass() -> None:
    nodes = [zoned(f"n{i}", "a") for i in range(4)]
    r = rig(nodes, [lws_pod("a", 0, 2, 8), lws_pod("b", 0, 2, 8)], inputs=inputs(quota("24")))
    assert sum(held_gpus(r).values()) == 16  # one group whole; the other would pass 24
    assert len(r.book.reservations) == 1
    waiting = next(iter(r.book.waiting.values()))
    assert waiting.category == "no_rights" and "left" in waiting.reason


def test_a_quota_in_another_namespace_does_not_count() -> None:
    nodes = [zoned(f"n{i}", "a") for i in range(2)]
    r = rig(nodes, [lws_pod("a", 0, 2, 8)], inputs=inputs(quota("0", ns="other")))
    assert sum(held_gpus(r).values()) == 16


def lws_object(size: int, replicas: int = 1, **tmpl: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "llm", "name": "a"},
            "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": size, **tmpl}}}


def test_the_leaderworkerset_object_gives_the_size() -> None:
    nodes = [zoned(f"n{i}", "a") for i in range(4)]
    forged = lws_pod("a", 0, 4, 8)  # its annotation says 4 (32 GPUs); the object says 2
    r = rig(nodes, [forged], inputs=inputs(lws=[lws_object(2)]), max_group_gpus=16)
    assert sum(held_gpus(r).values()) == 16
    assert r.book.reservations[A].size == 2


def test_the_worker_template_binds_members_not_created_yet() -> None:
    nodes = [zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b"), zoned("b2", "b")]
    worker = {"spec": {"nodeSelector": {ZONE: "b"}, "containers": []}}
    r = rig(nodes, [lws_pod("a", 0, 2, 8)],
            inputs=inputs(lws=[lws_object(2, workerTemplate=worker)]))
    assert set(held_gpus(r)) == {"b1", "b2"}


def test_a_group_being_scaled_away_is_refused() -> None:
    nodes = [zoned(f"n{i}", "a") for i in range(2)]
    r = rig(nodes, [lws_pod("a", 0, 2, 8, group=1)],
            inputs=inputs(lws=[lws_object(2, replicas=1)]))
    assert held_gpus(r) == {}
    assert "scaled away" in r.book.waiting["llm/a/1"].reason


def test_a_member_of_another_scheduler_makes_the_group_refused() -> None:
    nodes = [zoned(f"n{i}", "a") for i in range(2)]
    worker = lws_pod("a", 1, 2, 8, scheduler="default-scheduler")
    leader = lws_pod("a", 0, 2, 8)
    r = rig(nodes, [leader, worker])
    assert held_gpus(r) == {}
    assert "scheduled by 'default-scheduler'" in reason(r, leader)


def test_a_record_of_a_group_now_refused_for_good_is_released() -> None:
    nodes = [zoned(f"n{i}", "a") for i in range(4)]
    qi = inputs()
    r = rig(nodes, [lws_pod("a", 0, 2, 8)], inputs=qi)
    assert sum(held_gpus(r).values()) == 16
    rec = r.book.reservations[A]
    qi.upsert(quota("8"))
    r.sync()
    assert held_gpus(r) == {} and A not in r.book.reservations
    assert r.book.released["no_rights"] == 1
    assert r.writer.last(A) is None and record_object(rec, "gpupack")  # deleted


def test_no_victims_are_proposed_for_a_refused_group() -> None:
    nodes = [zoned("n0", "a")]
    low = whole_pod("low", 8, namespace="x", node="n0", priority=0)
    p = with_spec(lws_pod("a", 0, 1, 8, priority=100), affinity=IN_ZONE_B)
    r = rig(nodes, [low, p])
    uid = low["metadata"]["uid"]
    args = PreemptionArgs.decode({"Pod": p, "NodeNameToMetaVictims": {
        "n0": {"Pods": [{"UID": uid}], "NumPDBViolations": 0}}})
    got = GroupVerbs(r.book).preempt(args)
    assert got is not None and got.victims == {}
    # The same group allowed on n0 gets its victim.
    p2 = lws_pod("c", 0, 1, 8, priority=100)
    r.tap.upsert_pod(p2)
    r.sync()
    args2 = PreemptionArgs.decode({"Pod": p2, "NodeNameToMetaVictims": {
        "n0": {"Pods": [{"UID": uid}], "NumPDBViolations": 0}}})
    got2 = GroupVerbs(r.book).preempt(args2)
    assert got2 is not None and set(got2.victims) == {"n0"}
