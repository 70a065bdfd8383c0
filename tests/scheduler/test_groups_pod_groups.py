"""LLM groups named by kube-scheduler's own Workload API (issue 39): a pod's
``spec.schedulingGroup`` names a PodGroup, whose gang ``minCount`` makes the group whole.
Through the reservation book and the groups' participant: the same rooms, rights,
quota and one-writer rules as groups named by labels; a group whole at its minimum; a
basic PodGroup's pods placed alone; an unknown PodGroup waits; no source lets a pod
join another namespace's group."""

from __future__ import annotations

from typing import Any

import pytest
from sched_builders import filter_args, node, whole_pod
from test_extender_groups import bind, gpu_owners
from test_groups_builders import Rig, lws_pod, rig

from kube.groups.inputs import GroupInputs
from kube.groups.workload_api import PODGROUPS, WORKLOADS
from packing.status import Code
from scheduler.extender.wire import ExtenderArgs
from scheduler.groups.plugin import GROUP_FULL, GROUP_WAITS, GroupVerbs

CLIQUE = "nvidia.com/gpu.clique"
PG = "llm/pg"
LWS = "leaderworkerset.sigs.k8s.io/"


def cliques(a: int = 2, b: int = 2) -> list[dict[str, Any]]:
    return ([node(f"a{i}", reconfigurable=False, labels={CLIQUE: "ca"}) for i in range(a)]
            + [node(f"b{i}", reconfigurable=False, labels={CLIQUE: "cb"}) for i in range(b)])


def member(name: str, gpus: int = 8, group: str = "pg", namespace: str = "llm",
           **kw: Any) -> dict[str, Any]:
    p = whole_pod(name, gpus, namespace=namespace, **kw)
    p["spec"]["schedulingGroup"] = {"podGroupName": group}
    return p


def pod_group(name: str = "pg", min_count: int | None = 2, namespace: str = "llm",
              **spec: Any) -> dict[str, Any]:
    policy: dict[str, Any] = ({"basic": {}} if min_count is None
                              else {"gang": {"minCount": min_count}})
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"schedulingPolicy": policy, **spec}}


def inputs(*objs: dict[str, Any], workloads: tuple[dict[str, Any], ...] = (),
           lws: tuple[dict[str, Any], ...] = ()) -> GroupInputs:
    out = GroupInputs(quotas_listed=True, lws_listed=True)
    out.replace_workload_objects(PODGROUPS, list(objs), served=True)
    out.replace_workload_objects(WORKLOADS, list(workloads), served=True)
    if lws:
        out.replace_lws(list(lws), installed=True)
    return out


def fargs(pod: dict[str, Any], r: Rig) -> ExtenderArgs:
    return ExtenderArgs.decode(filter_args(pod, sorted(r.cache.node_names())))


def nodes_of(r: Rig, group: str) -> set[str]:
    return {p.node for p in r.book.reservations[group].slots.values()}


def refusal(r: Rig, pod: dict[str, Any]) -> str:
    got = GroupVerbs(r.book).filter(fargs(pod, r))
    assert got is not None and got.node_names == (), got
    (why,) = set(got.failed.values())
    return why


# ---- a gang PodGroup is a group -------------------------------------------------------------


def test_a_gang_is_reserved_whole_in_one_clique_and_each_member_steered() -> None:
    pods = [member("m0"), member("m1")]
    r = rig(cliques(), pods, inputs=inputs(pod_group()))
    rec = r.book.reservations[PG]
    assert rec.size == 2 and len(nodes_of(r, PG)) == 2
    assert nodes_of(r, PG) in ({"a0", "a1"}, {"b0", "b1"})
    verbs = GroupVerbs(r.book)
    for p in pods:
        got = verbs.filter(fargs(p, r))
        assert got is not None and len(got.node_names) == 1
        assert got.node_names[0] in nodes_of(r, PG)
    for p in pods:
        bind(r, p, rec.slots[r.book.slot_of(rec, f"llm/{p['metadata']['name']}") or 0].node)
    assert r.book.reservations == {}
    assert len(gpu_owners(r.cache)) == 16


def test_rooms_are_held_for_members_not_created_yet_up_to_the_min_count() -> None:
    r = rig(cliques(a=3), [member("m0")], inputs=inputs(pod_group(min_count=3)))
    rec = r.book.reservations[PG]
    assert rec.size == 3 and rec.domain == "ca"  # only clique a has three nodes
    assert r.held(PG) == [0, 1, 2]


def test_the_pod_group_wins_over_lws_labels_and_gpupack_annotations() -> None:
    """A pod of a LeaderWorkerSet whose controller made a PodGroup (lws#982) carries both:
    the PodGroup names the group (kube-scheduler's gang), so the LWS size annotation,
    which says 4 here, does not."""
    pods = []
    for w in range(2):
        p = lws_pod("vllm", w, 4, 8, annotations={"gpupack.io/group": "other",
                                                   "gpupack.io/group-size": "3"})
        p["spec"]["schedulingGroup"] = {"podGroupName": "pg"}
        pods.append(p)
    r = rig(cliques(), pods, inputs=inputs(pod_group()))
    assert set(r.book.reservations) == {PG}
    assert r.book.reservations[PG].size == 2


def test_the_pod_groups_topology_constraint_is_the_domain() -> None:
    zones = [node(f"z{i}", reconfigurable=False,
                  labels={"zone": "z1" if i < 2 else "z2", CLIQUE: f"c{i}"}) for i in range(4)]
    pg = pod_group(schedulingConstraints={"topology": [{"key": "zone"}]})
    r = rig(zones, [member("m0"), member("m1")], inputs=inputs(pg))
    rec = r.book.reservations[PG]
    assert rec.topology_key == "zone" and rec.domain in ("z1", "z2")


def test_a_basic_pod_group_is_no_group_its_pods_are_placed_alone() -> None:
    p = member("m0")
    r = rig(cliques(), [p, member("m1")], inputs=inputs(pod_group(min_count=None)))
    assert r.book.reservations == {} and r.book.waiting == {}
    verbs = GroupVerbs(r.book)
    assert verbs.filter(fargs(p, r)) is None  # the default verbs answer it
    req = r.cache.pending_pod("llm/m0")
    assert req is not None and verbs.reserve(req, req.uid, "a0") is None


def test_a_pod_group_not_seen_yet_waits_holding_nothing_then_is_reserved() -> None:
    """As kube-scheduler's PreEnqueue holds a pod whose PodGroup it has not seen."""
    box = inputs()
    p = member("m0")
    r = rig(cliques(), [p, member("m1")], inputs=box)
    assert r.book.reservations == {} and r.held(PG) == []
    assert "PodGroup llm/pg" in refusal(r, p) and "not seen it" in refusal(r, p)
    box.upsert_workload_object(PODGROUPS, pod_group())
    r.clock.advance(1.0)  # a group refused its rights is tried again after a second
    r.sync()
    assert r.book.reservations[PG].size == 2
    # The members it refused are woken (kube-scheduler parked them; a book that has
    # just become the leader counts every pending member as refused).
    assert {k for k, _ in r.requeue.writes} == {"llm/m0", "llm/m1"}


def test_not_served_says_so() -> None:
    box = GroupInputs(quotas_listed=True, lws_listed=True)
    box.replace_workload_objects(PODGROUPS, [], served=False)
    p = member("m0")
    r = rig(cliques(), [p], inputs=box)
    assert "does not serve scheduling.k8s.io/v1beta1" in refusal(r, p)


def test_a_pod_group_deleted_releases_its_room() -> None:
    box = inputs(pod_group())
    r = rig(cliques(), [member("m0"), member("m1")], inputs=box)
    assert PG in r.book.reservations
    box.delete_workload_object(PODGROUPS, pod_group())
    r.sync()
    assert r.book.reservations == {} and r.held(PG) == []
    assert r.book.waiting[PG].category == "no_rights"


# ---- minCount ----------------------------------------------------------------------------------


def test_a_group_that_fits_only_at_its_minimum_is_reserved_for_it_and_complete_there() -> None:
    """Three pods name a gang of minCount 2; clique a holds two 8-GPU members, clique b
    one: the whole group of three fits nowhere, its minimum does. kube-scheduler admits
    the gang at two; gpupack reserves those two (one clique), the third waits (not
    refused for good), and the group is complete once the two are bound."""
    seen: list[float] = []
    pods = [member(f"m{i}") for i in range(3)]
    r = rig(cliques(a=2, b=1), pods, inputs=inputs(pod_group()))
    r.book.on_complete = seen.append
    rec = r.book.reservations[PG]
    assert rec.size == 2 and rec.domain == "ca" and nodes_of(r, PG) == {"a0", "a1"}
    named = set(rec.pods.values())
    (extra,) = [p for p in pods if f"llm/{p['metadata']['name']}" not in named]
    got = GroupVerbs(r.book).filter(fargs(extra, r))
    assert got is not None and got.node_names == ()
    assert "room for its minimum of 2" in next(iter(got.failed.values()))
    req = r.cache.pending_pod(f"llm/{extra['metadata']['name']}")
    assert req is not None
    status = GroupVerbs(r.book).status(req)
    assert not isinstance(status, type(rec)) and status.check == GROUP_FULL
    assert status.code is Code.UNSCHEDULABLE  # retried, not unresolvable
    for p in pods:
        key = f"llm/{p['metadata']['name']}"
        if key in named:
            bind(r, p, rec.slots[r.book.slot_of(rec, key) or 0].node)
    assert seen == [0.0]  # complete at its minimum (no time passed on the fake clock)
    # The third waits for room beside the two (their clique is full), and gets it there
    # when a node joins that clique, not in clique b where it alone would fit.
    assert PG not in r.book.reservations and r.book.waiting[PG].category == "no_room"
    r.tap.upsert_node(node("a2", reconfigurable=False, labels={CLIQUE: "ca"}))
    r.sync()
    rec = r.book.reservations[PG]
    assert rec.size == 3 and rec.domain == "ca" and nodes_of(r, PG) == {"a0", "a1", "a2"}
    assert r.held(PG) == [s for s, k in rec.pods.items() if k == f"llm/{extra['metadata']['name']}"]


def test_no_smaller_room_below_the_minimum() -> None:
    r = rig(cliques(a=1, b=1), [member("m0"), member("m1")], inputs=inputs(pod_group()))
    assert r.book.reservations == {}
    assert r.book.waiting[PG].category in ("no_room", "no_domain")


def test_min_count_lowered_makes_a_waiting_gang_fit() -> None:
    box = inputs(pod_group(min_count=3))
    r = rig(cliques(a=2, b=2), [member("m0"), member("m1")], inputs=box)
    assert r.book.reservations == {}  # three 8-GPU members fit no clique
    box.upsert_workload_object(PODGROUPS, pod_group(min_count=2))
    r.clock.advance(1.0)
    r.sync()
    assert r.book.reservations[PG].size == 2


# ---- rights and tenants -------------------------------------------------------------------------


def test_a_pod_never_joins_another_namespaces_pod_group() -> None:
    """Tenant ``evil`` names the PodGroup ``pg`` that team ``llm`` made: it is looked up in
    ``evil`` only, where none exists; the llm group keeps its two members and its room."""
    evil = member("x", namespace="evil")
    r = rig(cliques(a=3), [member("m0"), member("m1"), evil], inputs=inputs(pod_group()))
    assert set(r.book.reservations) == {PG}
    assert set(r.book.reservations[PG].pods.values()) == {"llm/m0", "llm/m1"}
    assert "PodGroup evil/pg" in refusal(r, evil)
    # Nor do forged LWS labels or gpupack annotations of llm's names reach across.
    forged = lws_pod("vllm", 1, 2, 8, namespace="evil")
    forged["metadata"]["annotations"]["gpupack.io/group"] = "pg"
    req_ns = {k.split("/", 1)[0] for k in r.book.members()}
    r.tap.upsert_pod(forged)
    r.sync()
    assert set(r.book.reservations[PG].pods.values()) == {"llm/m0", "llm/m1"}
    assert req_ns <= {"llm", "evil"}
    assert all(g.startswith("evil/") for g in r.book.members() if "evil" in g)


def test_a_group_named_in_two_ways_is_refused() -> None:
    """A PodGroup and a gpupack.io/group annotation of the same name in one namespace:
    kube-scheduler gangs only the first; gpupack refuses the mix rather than guess."""
    other = whole_pod("ann", 8, namespace="llm",
                      annotations={"gpupack.io/group": "pg", "gpupack.io/group-size": "2"})
    p = member("m0")
    r = rig(cliques(), [p, other], inputs=inputs(pod_group()))
    assert r.book.reservations == {}
    assert "name it in different ways" in refusal(r, p)


@pytest.mark.parametrize("min_count, gpus, refused", [
    (8, 8, False),  # 64 GPUs: at the cap
    (9, 8, True),  # 72 GPUs from a PodGroup: a PodGroup costs no more than a label
])
def test_a_pod_group_is_capped_like_a_group_sized_by_labels(min_count: int, gpus: int,
                                                            refused: bool) -> None:
    nodes = [node(f"n{i}", reconfigurable=False, labels={CLIQUE: "c"}) for i in range(9)]
    r = rig(nodes, [member("m0", gpus)], inputs=inputs(pod_group(min_count=min_count)))
    if refused:
        assert r.book.reservations == {}
        assert "--max-group-gpus" in refusal(r, member("m0", gpus))
    else:
        assert r.book.reservations[PG].size == min_count


def test_quota_counts_a_pod_groups_members_not_created_yet() -> None:
    quota = {"metadata": {"namespace": "llm", "name": "gpus"},
             "spec": {"hard": {"requests.nvidia.com/gpu": "16"}}}
    box = inputs(pod_group(min_count=3))
    box.replace([quota])
    p = member("m0")
    r = rig(cliques(a=3), [p], inputs=box)
    assert r.book.reservations == {}
    assert "ResourceQuota llm/gpus allows (16)" in refusal(r, p)


def test_members_not_created_yet_keep_to_the_lws_worker_template_through_the_workload(
        ) -> None:
    """The PodGroup's Workload names its LeaderWorkerSet as controller: the worker
    template's nodeSelector bounds the rooms held for the workers not created yet."""
    lws = {"metadata": {"namespace": "llm", "name": "vllm"},
           "spec": {"replicas": 1, "leaderWorkerTemplate": {
               "size": 2, "workerTemplate": {"spec": {"nodeSelector": {CLIQUE: "cb"}}}}}}
    wl = {"metadata": {"namespace": "llm", "name": "w"},
          "spec": {"controllerRef": {"apiGroup": "leaderworkerset.x-k8s.io",
                                     "kind": "LeaderWorkerSet", "name": "vllm"}}}
    pg = pod_group(workloadRef={"workloadName": "w", "templateName": "replica"})
    r = rig(cliques(a=2, b=2), [member("m0")], inputs=inputs(pg, workloads=(wl,), lws=(lws,)))
    assert nodes_of(r, PG) == {"b0", "b1"}
    # Without the Workload, clique a (first best fit by name) would do as well.
    r2 = rig(cliques(a=2, b=2), [member("m0")], inputs=inputs(pod_group()))
    assert PG in r2.book.reservations


def test_a_member_of_another_scheduler_is_refused_as_for_any_group() -> None:
    p = member("m0")
    q = member("m1")
    q["spec"]["schedulerName"] = "default-scheduler"
    r = rig(cliques(), [p, q], inputs=inputs(pod_group()))
    assert r.book.reservations == {}
    assert "scheduled by 'default-scheduler'" in refusal(r, p)


def test_waiting_members_are_refused_with_the_groups_reason() -> None:
    r = rig(cliques(a=1, b=1), [member("m0"), member("m1")], inputs=inputs(pod_group()))
    got = GroupVerbs(r.book).filter(fargs(member("m0"), r))
    assert got is not None and got.node_names == ()
    req = r.cache.pending_pod("llm/m0")
    assert req is not None
    status = GroupVerbs(r.book).status(req)
    assert not isinstance(status, type(None)) and getattr(status, "check", "") == GROUP_WAITS
