"""LLM leader/worker groups: whole-group reservations in the extender (scheduler/groups/loop.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry
from sched_builders import FakeClock, filter_args, mig_pod, node, whole_pod
from test_groups_builders import (
    RecordingWriter,
    bound,
    lws_inputs,
    lws_object,
    lws_pod,
    rig,
)

from gpupack.extender_app import create_extender_app
from kube.annotations import placement_annotations
from kube.cache import ClusterCache
from kube.groups.reservations import record_name, record_object, record_of
from kube.pod_conditions import ROOM_RESERVED
from kube.record_writer import RecordWriter, StaticRecordStore
from kube.source import StaticSource
from packing.model import PodRequest
from packing.status import Status
from scheduler.extender.app import AppConfig
from scheduler.extender.metrics import ExtenderMetrics
from scheduler.extender.wire import ExtenderArgs, PreemptionArgs
from scheduler.groups.loop import ReservationBook, hold_key
from scheduler.groups.plugin import RESERVED_NODE, GroupVerbs
from scheduler.planner.loop import Planner

TWO = [node("n1", reconfigurable=False), node("n2", reconfigurable=False)]
A, B = "llm/a/0", "llm/b/0"


def fargs(pod: dict[str, Any], names: list[str]) -> ExtenderArgs:
    return ExtenderArgs.decode(filter_args(pod, names))


def gpu_owners(cache: ClusterCache) -> dict[tuple[str, int], str]:
    return {(n, g.info.index): g.whole_owner for n, s in cache.state.nodes.items()
            for g in s.gpus if g.whole_owner is not None}


def req_of(r: Any, pod: dict[str, Any]) -> PodRequest:
    key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    found = r.cache.pending_pod(key)
    assert found is not None
    return found


def bind(r: Any, pod: dict[str, Any], node_name: str) -> None:
    """Bind through the book (as the app's bind does) and confirm it through the watch."""
    req = req_of(r, pod)
    placement = GroupVerbs(r.book).reserve(req, req.uid, node_name)
    assert not isinstance(placement, Status) and placement is not None, placement
    r.tap.upsert_pod(bound(pod, node_name, placement_annotations(placement, "gpupack")))
    r.sync()


# ---- no deadlock ---------------------------------------------------------------------------


def test_two_groups_that_together_do_not_fit_one_reserves_whole_other_waits_whole() -> None:
    r = rig(TWO, [lws_pod("a", 0, 2, 8), lws_pod("b", 0, 2, 8)])
    assert set(r.book.reservations) == {A}
    assert r.held(A) == [0, 1]  # the leader's room and the worker not created yet
    assert r.held(B) == []
    assert r.book.waiting[B].category == "no_room"
    res = GroupVerbs(r.book).filter(fargs(lws_pod("b", 0, 2, 8), ["n1", "n2"]))
    assert res is not None and res.node_names == ()
    assert all("waits whole, holding nothing" in why for why in res.failed.values())
    # The worker of A comes later and is steered to the other node.
    r.tap.upsert_pod(lws_pod("a", 1, 2, 8))
    r.sync()
    leader_node = r.book.reservations[A].slots[0].node
    worker = GroupVerbs(r.book).filter(fargs(lws_pod("a", 1, 2, 8), ["n1", "n2"]))
    assert worker is not None and worker.node_names == tuple({"n1", "n2"} - {leader_node})


def test_higher_priority_group_first_seen_together_wins() -> None:
    r = rig(TWO, [lws_pod("a", 0, 2, 8, priority=0), lws_pod("b", 0, 2, 8, priority=10)])
    assert set(r.book.reservations) == {B}
    assert r.held(A) == []


def test_older_group_wins_when_priorities_are_equal() -> None:
    r = rig(TWO, [lws_pod("b", 0, 2, 8)])
    r.clock.advance(5)
    r.tap.upsert_pod(lws_pod("a", 0, 2, 8))
    r.sync()
    assert set(r.book.reservations) == {B}
    assert r.book.waiting[A].reason.startswith("group llm/a/0 waits whole")


def test_higher_priority_group_displaces_an_unbound_lower_reservation() -> None:
    r = rig(TWO, [lws_pod("a", 0, 2, 8, priority=0)])
    assert set(r.book.reservations) == {A}
    r.tap.upsert_pod(lws_pod("b", 0, 2, 8, priority=100))
    r.sync()
    assert set(r.book.reservations) == {B}
    assert r.held(A) == [] and r.held(B) == [0, 1]
    assert r.book.waiting[A].category == "displaced"


def test_a_reservation_with_a_bound_member_is_not_displaced() -> None:
    r = rig(TWO, [lws_pod("a", 0, 2, 8, priority=0)])
    bind(r, lws_pod("a", 0, 2, 8, priority=0), r.book.reservations[A].slots[0].node)
    r.tap.upsert_pod(lws_pod("b", 0, 2, 8, priority=100))
    r.sync()
    assert set(r.book.reservations) == {A}
    assert r.held(B) == []


# ---- holding nothing / holding against everyone ----------------------------------------------


def test_a_group_that_does_not_fit_holds_nothing() -> None:
    r = rig(TWO, [lws_pod("a", 0, 3, 8)])
    assert r.book.reservations == {}
    assert r.held(A) == []
    assert r.cache.state.whole_gpus_free() == 16
    assert "does not fit" in r.book.waiting[A].reason
    # Other pods still get the room.
    assert r.cache.state.options(PodRequest("x/y", kind=whole_pod_kind(), gpu_count=8), "n1")


def whole_pod_kind() -> Any:
    from packing.model import RequestKind

    return RequestKind.WHOLE


def test_small_pods_cannot_take_reserved_gpus() -> None:
    nodes = [node("n1")]  # MIG-reconfigurable: an idle whole GPU could become MIG slices
    r = rig(nodes, [lws_pod("a", 0, 2, 4), mig_pod("asr"), whole_pod("one", 1)])
    assert r.held(A) == [0, 1]
    assert r.cache.state.whole_gpus_free() == 0
    from kube.objects import pod_request

    for p in (mig_pod("asr"), whole_pod("one", 1)):
        assert r.cache.state.options(pod_request(p), "n1") == []


def test_small_pods_are_refused_through_the_http_filter() -> None:
    r = rig([node("n1", gpus=4, reconfigurable=False)], [lws_pod("a", 0, 2, 2)])
    client = app_client(r)
    status, body = post(client, "/filter", filter_args(whole_pod("one", 1), ["n1"]))
    assert status == 200 and body["NodeNames"] == []
    status, body = post(client, "/filter", filter_args(lws_pod("a", 0, 2, 2), ["n1"]))
    assert body["NodeNames"] == ["n1"]
    status, body = post(client, "/prioritize", filter_args(lws_pod("a", 0, 2, 2), ["n1"]))
    assert body == [{"Host": "n1", "Score": 10}]
    status, metrics = client.get("/metrics").status_code, client.get("/metrics").text
    assert "gpupack_group_reservations 1.0" in metrics
    assert "gpupack_group_reserved_gpus 4.0" in metrics
    assert 'gpupack_groups_waiting{reason="no_room"} 0.0' in metrics


def test_a_member_the_watch_has_not_shown_is_an_error_kube_scheduler_retries() -> None:
    """kube-scheduler's informer may show a member before gpupack's watch does. Judged
    then, the worker would be refused as unschedulable (no slot names it): kube-scheduler
    parks such a pod until some later cluster event, for good when it was the last pod
    created. The answer is an error (retried after backoff), and once the watch shows the
    pod, its reserved node."""
    r = rig(TWO, [lws_pod("a", 0, 2, 8)])
    client = app_client(r)
    worker = lws_pod("a", 1, 2, 8)
    status, body = post(client, "/filter", filter_args(worker, ["n1", "n2"]))
    assert status == 200
    assert "llm/a-0-1" in body["Error"] and "not shown" in body["Error"], body
    assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}
    status, bound_body = post(client, "/bind", {"PodName": "a-0-1", "PodNamespace": "llm",
                                                "PodUID": "uid-llm-a-0-1", "Node": "n1"})
    assert bound_body["Error"] and client.binder.calls == []
    r.tap.upsert_pod(worker)
    r.sync()
    status, body = post(client, "/filter", filter_args(worker, ["n1", "n2"]))
    assert body["Error"] == "" and body["NodeNames"] == [r.book.reservations[A].slots[1].node]


def test_a_member_recreated_under_the_same_name_is_unseen_until_the_watch_shows_it() -> None:
    r = rig(TWO, [lws_pod("a", 0, 2, 8)])
    again = lws_pod("a", 0, 2, 8, uid="uid-second")
    got = GroupVerbs(r.book).filter(fargs(again, ["n1", "n2"]))
    assert got is not None and "uid-second" in got.error and not got.node_names
    first = GroupVerbs(r.book).filter(fargs(lws_pod("a", 0, 2, 8), ["n1", "n2"]))
    assert first is not None and first.error == "" and len(first.node_names or ()) == 1


def test_a_refused_member_is_woken_when_its_room_is_reserved_on_a_timer() -> None:
    """B waits while A holds the room; A's reservation expires (no cluster event
    kube-scheduler sees), B is reserved, and B's refused leader gets the status condition
    that requeues it. A member never refused, and a refused pod that went, get none."""
    r = rig(TWO, [lws_pod("a", 0, 2, 8), lws_pod("b", 0, 2, 8), lws_pod("b", 1, 2, 8),
                  whole_pod("gone", 8, namespace="llm")])
    # Its first step as the leader woke the pending members its record names (a's);
    # since then it knows exactly whom it refused.
    assert [name for name, _ in r.requeue.writes] == ["llm/a-0"]
    r.requeue.writes.clear()
    r.book.refused.clear()
    verbs = GroupVerbs(r.book)
    refused = verbs.filter(fargs(lws_pod("b", 0, 2, 8), ["n1", "n2"]))
    assert refused is not None and refused.node_names == () and refused.error == ""
    r.book.note_refused("llm/gone")  # refused once, then deleted
    r.tap.delete_pod("llm/gone")
    assert r.requeue.writes == []
    r.clock.advance(101)  # past A's ttl
    r.sync()
    assert set(r.book.reservations) == {B}
    rec = r.book.reservations[B]
    assert [name for name, _ in r.requeue.writes] == ["llm/b-0"]
    patch = r.requeue.writes[0][1]
    assert patch["metadata"] == {"namespace": "llm", "name": "b-0"}
    (cond,) = patch["status"]["conditions"]
    assert cond["type"] == ROOM_RESERVED and cond["status"] == "True"
    slot = next(s for s, k in rec.pods.items() if k == "llm/b-0")
    assert f"member {slot} of group {B} on node {rec.slots[slot].node}" in cond["message"]
    r.clock.advance(1)
    r.sync()
    assert len(r.requeue.writes) == 1  # once per refusal
    assert r.book.refused == set()
    # Two in all: a's leader at the first step, b's now.
    assert "gpupack_group_members_requeued_total 2.0" in app_client(r).get("/metrics").text


def test_a_new_leader_wakes_the_pending_members_its_records_name() -> None:
    """The last leader may have refused them (parked in kube-scheduler); the new one
    cannot know which, so each pending member named by one of its records is woken."""
    leading = [False]
    r = rig(TWO, [lws_pod("a", 0, 2, 8), lws_pod("a", 1, 2, 8)],
            leader=lambda: leading[0])
    assert r.book.reservations == {} and r.requeue.writes == []
    leading[0] = True
    r.book.step(force=True)
    assert set(r.book.reservations) == {A}
    assert sorted(name for name, _ in r.requeue.writes) == ["llm/a-0", "llm/a-0-1"]


def test_a_book_that_is_not_ready_answers_an_error_not_a_refusal() -> None:
    r = rig(TWO, [lws_pod("a", 0, 2, 8)])
    r.book.ready = False
    got = GroupVerbs(r.book).filter(fargs(lws_pod("a", 0, 2, 8), ["n1", "n2"]))
    assert got is not None and "not rebuilt" in got.error and r.book.refused == set()


def app_client(r: Any) -> Any:
    class Binder:
        def __init__(self) -> None:
            self.calls: list[tuple[str, str, dict[str, str]]] = []

        def bind(self, namespace: str, name: str, uid: str, node_name: str,
                 annotations: Any, pod: Any = None) -> None:
            self.calls.append((f"{namespace}/{name}", node_name, dict(annotations)))

    binder = Binder()
    app = create_extender_app(r.cache, Planner(r.cache), binder, CollectorRegistry(),
                     AppConfig(warm=False), groups=r.book)
    client = app.test_client()
    client.binder = binder
    return client


def test_planner_leaves_reserved_members_out_and_counts_their_room_once() -> None:
    # Two 8-GPU nodes: group a (2 x 4 GPUs) reserves room on them; a pending 8-GPU pod
    # still fits the node the group does not use, so the plan must place it there and
    # must not place the group's leader a second time.
    r = rig([node("n1", reconfigurable=False), node("n2", reconfigurable=False)],
            [lws_pod("a", 0, 2, 4), whole_pod("big", 8, namespace="x")])
    res = r.book.reservations[A]
    used = {p.node for p in res.slots.values()}
    assert len(used) == 1  # CP-SAT keeps the other node whole
    planner = Planner(r.cache, in_process=True)
    snap = r.cache.snapshot()
    assert [p.key for p in snap.pending] == ["x/big"]  # llm/a-0's room is held already
    plan = planner.solve_once()
    assert set(plan.placements) == {"x/big"}
    assert plan.placements["x/big"].node not in used
    text = ExtenderMetrics(CollectorRegistry(), r.cache, planner).exposition().decode()
    pending = sorted(ln for ln in text.splitlines()
                     if ln.startswith("gpupack_pending_pods{") and not ln.endswith(" 0.0"))
    assert pending == ['gpupack_pending_pods{class="whole",reason="group"} 1.0',
                       'gpupack_pending_pods{class="whole",reason="planned"} 1.0']


def post(client: Any, path: str, obj: Any) -> tuple[int, Any]:
    resp = client.post(path, data=json.dumps(obj), content_type="application/json")
    return resp.status_code, resp.get_json()


def test_http_bind_of_members_uses_the_reserved_gpus_and_records_the_reservation() -> None:
    r = rig([node("n1", gpus=4, reconfigurable=False)],
            [lws_pod("a", 0, 2, 2), whole_pod("other", 2, priority=0)])
    client = app_client(r)
    slots = r.book.reservations[A].slots
    status, body = post(client, "/bind", {"PodName": "a-0", "PodNamespace": "llm",
                                          "PodUID": "uid-llm-a-0", "Node": "n1"})
    assert status == 200 and body == {"Error": ""}, body
    key, node_name, ann = client.binder.calls[-1]
    assert (key, node_name) == ("llm/a-0", "n1")
    assert ann["gpupack.io/gpus"] == ",".join(str(i) for i in slots[0].gpus)
    assert set(ann) == {"gpupack.io/gpus", "gpupack.io/policy"} or "gpupack.io/reservation" \
        not in ann  # the Binding carries the placement only, never a reservation
    assert r.book.reservations[A].pods[0] == "llm/a-0"
    # The other 2-GPU pod finds no room: the worker's GPUs are still held.
    status, body = post(client, "/filter", filter_args(whole_pod("other", 2), ["n1"]))
    assert body["NodeNames"] == []


# ---- release -----------------------------------------------------------------------------------


def test_reservation_expires_after_the_ttl() -> None:
    writer = RecordingWriter()
    r = rig(TWO, [lws_pod("a", 0, 2, 8)], ttl=60, writer=writer)
    assert writer.last(A) is not None
    r.clock.advance(59)
    r.sync()
    assert A in r.book.reservations
    r.clock.advance(2)
    r.sync()
    assert r.book.reservations == {}
    assert r.held(A) == []
    assert r.book.waiting[A].category == "expired"
    assert writer.writes[-1] == (record_name(A), None)  # the record is deleted
    assert r.book.released["expired"] == 1
    # After the cool-down the group may reserve again.
    r.clock.advance(11)
    r.sync()
    assert A in r.book.reservations


def test_deleting_the_leader_releases_at_once() -> None:
    r = rig(TWO, [lws_pod("a", 0, 2, 8), lws_pod("b", 0, 2, 8)])
    assert set(r.book.reservations) == {A}
    r.tap.delete_pod("llm/a-0")
    r.sync()  # the keeper's next step (it wakes on the change)
    assert A not in r.book.reservations
    assert set(r.book.reservations) == {B}  # the waiting group gets the room
    assert set(r.book.reservations) == {B}


def test_completion_drops_the_reservation_and_is_observed() -> None:
    seen: list[float] = []
    r = rig(TWO, [lws_pod("a", 0, 2, 8)])
    r.book.on_complete = seen.append
    bind(r, lws_pod("a", 0, 2, 8), r.book.reservations[A].slots[0].node)
    r.clock.advance(30)
    worker = lws_pod("a", 1, 2, 8)
    r.tap.upsert_pod(worker)
    r.sync()
    bind(r, worker, r.book.reservations[A].slots[1].node)
    assert r.book.reservations == {} and seen == [30.0]
    assert len(gpu_owners(r.cache)) == 16
    assert all("#reserve" not in o for o in gpu_owners(r.cache).values())


def test_bind_elsewhere_is_refused() -> None:
    r = rig(TWO, [lws_pod("a", 0, 2, 8)])
    reserved = r.book.reservations[A].slots[0].node
    other = "n2" if reserved == "n1" else "n1"
    got = GroupVerbs(r.book).reserve(req_of(r, lws_pod("a", 0, 2, 8)), "", other)
    assert isinstance(got, Status) and got.check == RESERVED_NODE and "reserved on" in got.message


# ---- topology --------------------------------------------------------------------------------


def racks() -> list[dict[str, Any]]:
    return [node(f"n{i}", gpus=8, reconfigurable=False, labels={"rack": r})
            for i, r in ((1, "r1"), (2, "r1"), (3, "r2"), (4, "r2"))]


def test_exclusive_topology_one_group_per_domain() -> None:
    pods = [lws_pod(n, 0, 2, 1, exclusive="rack") for n in ("a", "b", "c")]
    r = rig(racks(), pods,
            inputs=lws_inputs(*(lws_object(n, 2, exclusive="rack") for n in "abc")))
    got = {g: res.domain for g, res in r.book.reservations.items()}
    assert got == {A: "r1", B: "r2"}
    assert r.book.waiting["llm/c/0"].category == "exclusive_taken"
    for g in (A, B):
        nodes = {p.node for p in r.book.reservations[g].slots.values()}
        assert len({ {"n1": "r1", "n2": "r1", "n3": "r2", "n4": "r2"}[n] for n in nodes}) == 1


def test_nvlink_clique_is_the_default_domain() -> None:
    nodes = [node("n1", reconfigurable=False, labels={"nvidia.com/gpu.clique": "c1"}),
             node("n2", reconfigurable=False, labels={"nvidia.com/gpu.clique": "c2"}),
             node("n3", reconfigurable=False, labels={"nvidia.com/gpu.clique": "c1"})]
    r = rig(nodes, [whole_pod("busy", 1, node="n1", namespace="x"), lws_pod("a", 0, 2, 4)])
    # A 2 x 4-GPU group fits n1 (7 free) alone or across n1+n3; never on n2 with n1.
    res = r.book.reservations[A]
    assert res.domain in ("c1", "c2")
    assert {p.node for p in res.slots.values()} <= ({"n1", "n3"} if res.domain == "c1"
                                                     else {"n2"})


def test_group_gets_the_best_fit_clique_not_the_first_one() -> None:
    # Clique c1 (first by name) has three whole nodes, c2 exactly the two the group needs:
    # the reservation (CP-SAT, packing/groups/solver.py) takes c2 and leaves c1 whole for
    # a bigger group; a member-by-member first-fit pass would have broken into c1.
    nodes = [node(f"a{i}", reconfigurable=False, labels={"nvidia.com/gpu.clique": "c1"})
             for i in range(3)]
    nodes += [node(f"b{i}", reconfigurable=False, labels={"nvidia.com/gpu.clique": "c2"})
              for i in range(2)]
    r = rig(nodes, [lws_pod("a", 0, 2, 8)])
    res = r.book.reservations[A]
    assert res.domain == "c2"
    assert sorted(p.node for p in res.slots.values()) == ["b0", "b1"]
    r.tap.upsert_pod(lws_pod("c", 0, 3, 8))  # a group of three still finds c1 whole
    r.sync()
    assert r.book.reservations["llm/c/0"].domain == "c1"


# ---- preemption ------------------------------------------------------------------------------


def test_group_preemption_proposes_the_fewest_lower_priority_victims() -> None:
    nodes = [node(f"n{i}", reconfigurable=False) for i in (1, 2, 3)]
    running = [
        whole_pod("low-1", 1, node="n1", namespace="b", priority=0,
                  annotations={"gpupack.io/gpus": "0"}),
        whole_pod("low-2a", 1, node="n2", namespace="b", priority=0,
                  annotations={"gpupack.io/gpus": "0"}),
        whole_pod("low-2b", 1, node="n2", namespace="b", priority=0,
                  annotations={"gpupack.io/gpus": "1"}),
        whole_pod("low-3", 1, node="n3", namespace="b", priority=0,
                  annotations={"gpupack.io/gpus": "0"}),
    ]
    leader = lws_pod("a", 0, 2, 8, priority=100)
    r = rig(nodes, [*running, leader])
    assert r.book.reservations == {}
    proposed = {n: {"Pods": [{"UID": f"uid-b-{p}"} for p in ps], "NumPDBViolations": 0}
                for n, ps in (("n1", ["low-1"]), ("n2", ["low-2a", "low-2b"]),
                              ("n3", ["low-3"]))}
    args = PreemptionArgs.decode({"Pod": leader, "NodeNameToMetaVictims": proposed})
    result = GroupVerbs(r.book).preempt(args)
    assert result is not None
    got = {n: set(v.uids) for n, v in result.victims.items()}
    assert got == {"n1": {"uid-b-low-1"}, "n3": {"uid-b-low-3"}}
    # Nothing was changed by the search.
    assert len(gpu_owners(r.cache)) == 4


def test_group_preemption_never_picks_higher_priority_pods() -> None:
    running = [whole_pod("vip", 1, node=n, namespace="b", priority=1000,
                         annotations={"gpupack.io/gpus": "0"}) for n in ("n1",)]
    leader = lws_pod("a", 0, 2, 8, priority=100)
    r = rig(TWO, [*running, leader])
    args = PreemptionArgs.decode({"Pod": leader, "NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": "uid-b-vip"}], "NumPDBViolations": 0}}})
    result = GroupVerbs(r.book).preempt(args)
    assert result is not None and result.victims == {}


# ---- restart ---------------------------------------------------------------------------------


def start(source: StaticSource, records: StaticRecordStore, clock: FakeClock
          ) -> tuple[Any, RecordWriter]:
    """An extender process on this static world: records listed, then nodes and pods."""
    writer = RecordWriter(records, retries=0)
    r = rig([], [], clock=clock, writer=writer, sync=False)
    records.start(r.tap)
    source.start(r.tap)
    r.sync()
    return r, writer


def test_restart_mid_group_restores_the_reservation_without_double_booking() -> None:
    clock = FakeClock()
    source = StaticSource([dict(n) for n in TWO], [lws_pod("a", 0, 2, 8)])
    records = StaticRecordStore()
    r1, writer = start(source, records, clock)
    assert writer.drain() == 1
    assert record_of(records.objects[record_name(A)]).group == A
    res = r1.book.reservations[A]
    leader_node, worker_node = res.slots[0].node, res.slots[1].node
    # The leader is bound, then the extender restarts.
    req = req_of(r1, lws_pod("a", 0, 2, 8))
    placement = GroupVerbs(r1.book).reserve(req, req.uid, leader_node)
    assert placement is not None and not isinstance(placement, Status)
    source.binder().bind("llm", "a-0", req.uid, leader_node,
                         placement_annotations(placement, "gpupack"))
    clock.advance(5)
    again = StaticSource([dict(n) for n in TWO], list(source.pods.values()))
    again.pods["llm/a-0-1"] = lws_pod("a", 1, 2, 8)  # the worker, created meanwhile
    records2 = StaticRecordStore()
    records2.objects = dict(records.objects)
    r2, _ = start(again, records2, clock)
    assert set(r2.book.reservations) == {A}
    got = r2.book.reservations[A]
    assert got.slots[1].node == worker_node and r2.held(A) == [1]
    owners = gpu_owners(r2.cache)
    assert len(owners) == 16  # 8 for the bound leader, 8 held for the worker: once each
    assert sum(1 for o in owners.values() if o == "llm/a-0") == 8
    # Another 8-GPU pod finds no room anywhere.
    assert not any(r2.cache.state.options(pod_req(whole_pod("x", 8)), n) for n in ("n1", "n2"))
    # The worker is steered to its room and binds there.
    res2 = GroupVerbs(r2.book).filter(fargs(lws_pod("a", 1, 2, 8), ["n1", "n2"]))
    assert res2 is not None and res2.node_names == (worker_node,)


def pod_req(p: dict[str, Any]) -> PodRequest:
    from kube.objects import pod_request

    return pod_request(p)


def with_record(r0: Any, pods: list[dict[str, Any]], clock: FakeClock, **kw: Any) -> Any:
    """A fresh extender on the same nodes whose record list holds r0's last record of A."""
    obj = r0.book.writer.last(A)
    assert obj is not None
    r = rig(TWO, pods, clock=clock, sync=False, records=[obj], **kw)
    r.sync()
    return r


def test_a_record_that_cannot_be_read_is_ignored_and_the_group_placed_again() -> None:
    bad = record_object(record_of(record_object_for_test()), "gpupack")
    bad["data"]["reservation"] = "{not json"
    r = rig(TWO, [lws_pod("a", 0, 2, 8)], records=[bad])
    assert A in r.book.reservations and r.held(A) == [0, 1]
    assert r.book.bad_records == 1


def record_object_for_test() -> dict[str, Any]:
    r0 = rig(TWO, [lws_pod("a", 0, 2, 8)])
    obj = r0.book.writer.last(A)
    assert obj is not None
    return dict(obj)


def test_a_restored_room_that_was_taken_is_placed_again_and_the_free_rooms_kept() -> None:
    clock = FakeClock()
    r0 = rig(TWO, [lws_pod("a", 0, 2, 4)], clock=clock)
    rec = record_of(r0.book.writer.last(A))
    room0, room1 = rec.slots[0], rec.slots[1]
    # Meanwhile another pod was bound onto the worker's GPUs.
    squatter = whole_pod("squat", len(room1.gpus), node=room1.node, namespace="x",
                         annotations={"gpupack.io/gpus": ",".join(map(str, room1.gpus))})
    r = with_record(r0, [lws_pod("a", 0, 2, 4), squatter], clock)
    owners = gpu_owners(r.cache)
    assert all(owners.get((room1.node, g)) == "x/squat" for g in room1.gpus)
    got = r.book.reservations[A]
    assert got.slots[0] == room0  # the room still free is kept: never all or nothing
    assert got.slots[1] != room1 and r.held(A) == [0, 1]
    assert got.rev == rec.rev + 1


def test_an_expired_record_is_released() -> None:
    clock = FakeClock()
    r0 = rig(TWO, [lws_pod("a", 0, 2, 8)], clock=clock, ttl=10)
    clock.advance(20)
    r = with_record(r0, [lws_pod("a", 0, 2, 8)], clock)
    assert r.book.released["expired"] == 1
    assert r.book.waiting[A].category == "expired"


def test_a_plain_gpupack_group_gets_one_slot_per_pod() -> None:
    def plain(name: str) -> dict[str, Any]:
        return whole_pod(name, 8, namespace="llm",
                         annotations={"gpupack.io/group": "g", "gpupack.io/group-size": "2"})

    r = rig(TWO, [plain("p-0"), plain("p-1")])
    res = r.book.reservations["llm/g"]
    assert sorted(res.pods) == [0, 1]
    nodes = {res.slots[s].node for s in (0, 1)}
    assert nodes == {"n1", "n2"}


def test_book_works_without_a_tap_or_writer() -> None:
    cache = ClusterCache("gpupack")
    book = ReservationBook(cache, clock=FakeClock(), records_listed=True)
    cache.replace(TWO, [lws_pod("a", 0, 1, 8)])
    cache.mark_synced()
    assert book.check_ready()
    assert A in book.reservations
    assert cache.counted(hold_key(A, 0)) is not None


def test_a_waiting_group_is_tried_again_only_after_the_cluster_changed() -> None:
    r = rig(TWO, [lws_pod("a", 0, 2, 8), lws_pod("b", 0, 2, 8)])
    first = r.book.waiting[B]
    r.clock.advance(5)
    r.sync()
    assert r.book.waiting[B] is first  # nothing changed: not placed again
    r.tap.upsert_pod(whole_pod("unrelated", 0, namespace="x"))
    r.sync()
    assert r.book.waiting[B] is not first  # tried again, still waits whole
    assert r.held(B) == []


# ---- one writer: reads never write, a standby writes nothing ----------------------------------


def test_reads_never_reserve_or_write() -> None:
    r = rig(TWO, [])
    r.tap.upsert_pod(lws_pod("a", 0, 2, 8))  # a new group, no step run yet
    r.cache.snapshot()  # the planner's read
    with r.cache.view():  # a verb's or a scrape's read
        pass
    Planner(r.cache, in_process=True).solve_once()
    assert r.book.reservations == {} and r.writer.writes == []
    assert r.held(A) == []
    r.sync()  # the handler's step acts
    assert A in r.book.reservations and r.writer.last(A) is not None


def test_a_standby_mirrors_records_and_holds_them_but_writes_nothing() -> None:
    leading = rig(TWO, [lws_pod("a", 0, 2, 8)])
    obj = leading.writer.last(A)
    standby = rig(TWO, [lws_pod("a", 0, 2, 8), lws_pod("b", 0, 2, 8, priority=5)],
                  records=[obj], leader=lambda: False)
    standby.clock.advance(1000)  # past the record's expiry: only a leader releases
    standby.sync()
    assert standby.writer.writes == []
    assert set(standby.book.reservations) == {A}  # b is not placed by a standby
    assert standby.held(A) == [0, 1]  # warm: the leader's room is held here too


def test_verbs_answer_503_until_synced_and_rebuilt_then_answer() -> None:
    r = rig(TWO, [lws_pod("a", 0, 2, 8)], sync=False)
    r.book.ready = False  # as a fresh process before its record list came in
    r.book._listed = False
    client = app_client(r)
    for path, body in (("/filter", filter_args(lws_pod("a", 0, 2, 8), ["n1", "n2"])),
                       ("/prioritize", filter_args(whole_pod("x", 1), ["n1"])),
                       ("/bind", {"PodName": "a-0", "PodNamespace": "llm",
                                  "PodUID": "uid-llm-a-0", "Node": "n1"}),
                       ("/preempt", {"Pod": whole_pod("x", 1), "NodeNameToMetaVictims": {}})):
        status, out = post(client, path, body)
        assert status == 503 and "not synced" in out["error"], (path, out)
    assert client.get("/readyz").status_code == 503
    assert client.binder.calls == []
    r.tap.replace_records([])
    r.tap.mark_synced()
    assert client.get("/readyz").status_code == 200
    status, out = post(client, "/filter", filter_args(lws_pod("a", 0, 2, 8), ["n1", "n2"]))
    assert status == 200 and len(out["NodeNames"]) == 1


def test_a_standby_refuses_the_verbs() -> None:
    r = rig(TWO, [], leader=lambda: False)
    client = app_client(r)
    status, out = post(client, "/filter", filter_args(whole_pod("x", 1), ["n1"]))
    assert status == 503 and "not the leader" in out["error"]
    assert client.get("/readyz").status_code == 200  # warm and ready to take over
    text = client.get("/metrics").text
    assert "gpupack_leader 0.0" in text
    assert "gpupack_whole_gpus_free" not in text and "gpupack_gpu_allocated{" not in text


def test_a_pod_seen_bound_over_a_held_room_takes_it_and_frees_nothing_under_it() -> None:
    """Found by the stateful test: a standby held a member's room; the leader bound the
    member there; the watch showed the pod over the hold (counted twice), and giving the
    hold back freed GPUs the pod holds, so a filler got them. Bound pods are the truth:
    the hold they overlap is given up at once (the leader places that room again)."""
    from kube.objects import pod_request

    r = rig(TWO, [lws_pod("a", 0, 2, 8)], leader=lambda: False)  # a standby: it only holds
    leader = rig(TWO, [lws_pod("a", 0, 2, 8)])
    rec = leader.book.reservations[A]
    r.tap.upsert_record(record_object(rec, "gpupack"))
    r.sync()
    assert r.held(A) == [0, 1]
    room = rec.slots[0]
    r.tap.upsert_pod(bound(lws_pod("a", 0, 2, 8), room.node,
                           placement_annotations(replace(room, pod="llm/a-0"), "gpupack")))
    owners = gpu_owners(r.cache)
    assert all(owners[(room.node, i)] == "llm/a-0" for i in room.gpus)
    assert r.cache.counted(hold_key(A, 0)) is None  # the overlapped hold is gone
    r.sync()
    filler = pod_request(whole_pod("filler", 1, namespace="x"))
    assert r.cache.state.options(filler, room.node) == []  # nothing freed under the pod


def test_a_member_whose_bind_fails_has_its_room_held_again_at_once() -> None:
    """Found by the stateful test: the member's hold was given up for its bind; the API
    refused the Binding (the pod was deleted meanwhile) and the room stayed free until
    the next step, for any other pod to take."""
    r = rig(TWO, [lws_pod("a", 0, 2, 8)])
    req = req_of(r, lws_pod("a", 0, 2, 8))
    node_name = r.book.reservations[A].slots[0].node
    got = GroupVerbs(r.book).reserve(req, req.uid, node_name)
    assert got is not None and not isinstance(got, Status)
    assert r.held(A) == [1]
    r.book.forget(req.key)  # what the app does when the Binding is refused
    assert r.held(A) == [0, 1]
    assert r.cache.counted(req.key) is None


def test_a_bound_member_deleted_has_its_room_held_again_before_any_step() -> None:
    """Found by the stateful test: a bound worker was deleted; until the book's next
    step its room was free, and a filler answered in between took it."""
    r = rig(TWO, [lws_pod("a", 0, 2, 8), lws_pod("a", 1, 2, 8)])
    worker = lws_pod("a", 1, 2, 8)
    bind(r, worker, r.book.reservations[A].slots[1].node)
    assert r.held(A) == [0]
    r.tap.delete_pod("llm/a-0-1")  # no step after it
    assert r.held(A) == [0, 1]


def test_the_leader_does_not_bring_back_a_record_it_released_from_a_late_echo() -> None:
    """Found by the stateful test: the watch delivered the echo of the leader's own
    write after the leader had released that reservation; the leader took it as a live
    record again (steering members to rooms nobody held)."""
    r = rig(TWO, [lws_pod("a", 0, 2, 8)], ttl=100)
    written = r.writer.last(A)
    assert written is not None
    r.clock.advance(200)
    r.sync()
    assert A not in r.book.reservations  # expired, released
    r.tap.upsert_record(written)  # the late echo of the first write
    assert A not in r.book.reservations
    # A newer record (another leader's, after a failover) is still taken.
    newer = record_object(replace(record_of(written), rev=r.book._revs[A] + 1,
                                  expires=r.clock.now + 50), "gpupack")
    r.tap.upsert_record(newer)
    assert A in r.book.reservations
