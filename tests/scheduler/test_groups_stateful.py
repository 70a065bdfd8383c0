"""A Hypothesis state machine of two extender replicas over one cluster (issue 15, item
8): group arrivals (some forged too big for their labels), member binds, filler pods,
deletions, the clock, restarts (a replica rebuilt from the records), failovers (the
Lease changes hands), stalled watches (each replica's events are delivered only when a
rule says so) and forged ``gpupack.io/reservation`` annotations on users' pods; and a
group kube-scheduler gangs itself (issue 39): pods whose ``spec.schedulingGroup`` names
PodGroup ``llm/pg`` (three members of 4 GPUs: whole in no clique, whole at a ``minCount``
of 2 in either), its ``minCount`` changed or the PodGroup deleted at any time, and a pod
of namespace ``evil`` naming a PodGroup of the same name.

After every step:

* **no over-commit**: in the API (the world), no GPU is bound to two pods; in each
  replica's cache, no GPU is counted twice (pods, assumptions and holds together);
* **every group whole or holding nothing**: on the leader, each record's every slot is
  either its member, bound, or a room held; a group without a record holds nothing;
  the bound members of a group are in one NVLink clique;
* **one writer**: every record write reached the API from the replica leading then;
* a forged annotation changes no replica's records;
* **no group across namespaces**: every pod a record names is of the group's namespace;
* **no member parked for nothing**: kube-scheduler parks a member the leader's filter
  refused until an event it sees (any pod change, here); a pending member a leader's
  record names is not parked, or the leader has its waking status patch queued
  (records, the clock and failovers are no events kube-scheduler sees).

The pieces are the real ones (cache, reservation book, tap, record writer) fed as the
API source feeds them; the API is a dict. One modelling assumption: at a failover the
new leader's watch has delivered what the API had (a Lease lasts seconds, a watch lags
milliseconds: kube-scheduler's own failover makes the same one), and the old leader's
keeper has stepped once since it lost the Lease (it steps at least every second; a
Lease lasts 15 s); stalls within a term, on the leader or the standby, are arbitrary.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from sched_builders import FakeClock, node, pod, whole_pod
from test_groups_builders import bound, lws_pod

from kube.annotations import GPUS, placement_annotations
from kube.cache import ClusterCache
from kube.groups.inputs import GroupInputs
from kube.groups.reservations import RESERVATION, ReservationTap, record_of
from kube.groups.workload_api import PODGROUPS
from kube.objects import pod_request
from kube.record_writer import RecordWriter
from packing.groups.members import RESERVE_MARK
from packing.status import Status
from scheduler.extender.wire import ExtenderArgs
from scheduler.groups.loop import ReservationBook, hold_key
from scheduler.groups.plugin import GroupVerbs

CLIQUE = "nvidia.com/gpu.clique"
NODES = [node(f"n{i}", gpus=4, reconfigurable=False,
              labels={CLIQUE: "A" if i < 2 else "B"}) for i in range(4)]
CLIQUE_OF = {f"n{i}": ("A" if i < 2 else "B") for i in range(4)}
# name -> (size the labels say, GPUs per member); "big" asks 4 x 4 = 16 > the cap of 12.
GROUPS = {"a": (2, 4), "b": (2, 2), "c": (1, 4), "big": (4, 4)}
MAX_GROUP_GPUS = 12
PG_MEMBERS = 3  # pods naming PodGroup llm/pg, 4 GPUs each


def pg_member(i: int, namespace: str = "llm") -> dict[str, Any]:
    p = whole_pod(f"pgm-{i}", 4, namespace=namespace, uid=f"uid-{namespace}-pgm-{i}")
    p["spec"]["schedulingGroup"] = {"podGroupName": "pg"}
    return p


def pg_object(min_count: int) -> dict[str, Any]:
    return {"metadata": {"namespace": "llm", "name": "pg"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}}


def member_key(g: str, i: int) -> str:
    return f"llm/{g}-0" if i == 0 else f"llm/{g}-0-{i}"


class World:
    """The API server: pods, record ConfigMaps, the Lease, and every watcher's queue."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.records: dict[str, dict[str, Any]] = {}
        self.leader = 0
        self.clock = FakeClock()
        self.queues: dict[int, list[tuple[str, Any]]] = {}
        self.pod_group: dict[str, Any] | None = None  # PodGroup llm/pg
        self.bad_writes: list[str] = []
        # Members kube-scheduler parked after a refusal; any pod event requeues them all
        # (the refusal's "Extender" rejector matches every event), a status patch its pod.
        self.parked: set[str] = set()

    def emit(self, event: tuple[str, Any]) -> None:
        for q in self.queues.values():
            q.append(event)

    def put_pod(self, obj: dict[str, Any]) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        self.pods[key] = obj
        self.emit(("pod", copy.deepcopy(obj)))
        self.parked.clear()

    def delete_pod(self, key: str) -> None:
        if self.pods.pop(key, None) is not None:
            self.emit(("pod-", key))
            self.parked.clear()


class Store:
    """A replica's record store: writes go to the world; a write from a replica that
    does not lead is a broken invariant (RecordWriter must have dropped it)."""

    def __init__(self, world: World, rid: int) -> None:
        self.world = world
        self.rid = rid

    def put(self, obj: Any) -> None:
        if self.world.leader != self.rid:
            self.world.bad_writes.append(f"replica {self.rid} wrote while not leading")
        stored = json.loads(json.dumps(obj))
        self.world.records[stored["metadata"]["name"]] = stored
        self.world.emit(("record", stored))

    def delete(self, name: str) -> None:
        if self.world.leader != self.rid:
            self.world.bad_writes.append(f"replica {self.rid} deleted while not leading")
        if self.world.records.pop(name, None) is not None:
            self.world.emit(("record-", name))


class StatusStore:
    """The leader's pod status patches (kube.pod_conditions): an update of the pod, which
    requeues it in kube-scheduler (and is no event for the others)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def put(self, obj: Any) -> None:
        meta = obj["metadata"]
        self.world.parked.discard(f"{meta['namespace']}/{meta['name']}")

    def delete(self, name: str) -> None:
        del name


class Replica:
    """One extender process, started fresh from a full list of the world."""

    def __init__(self, world: World, rid: int) -> None:
        self.world = world
        self.rid = rid
        world.queues[rid] = []

        def leads() -> bool:
            return world.leader == rid

        self.cache = ClusterCache("gpupack")
        self.writer = RecordWriter(Store(world, rid), is_leader=leads, retries=0)
        self.requeue = RecordWriter(StatusStore(world), is_leader=leads, retries=0,
                                    what="pod condition")
        self.inputs = GroupInputs(quotas_listed=True, lws_listed=True)
        self.book = ReservationBook(self.cache, ttl=60, clock=world.clock, writer=self.writer,
                                    retry_s=0, cooldown_s=10, is_leader=leads,
                                    max_group_gpus=MAX_GROUP_GPUS, requeue=self.requeue,
                                    inputs=self.inputs)
        self.tap = ReservationTap(self.cache, self.book)
        self.inputs.replace_workload_objects(
            PODGROUPS, [copy.deepcopy(world.pod_group)] if world.pod_group else [], True)
        self.tap.replace_records(copy.deepcopy(list(world.records.values())))
        self.tap.replace(NODES, copy.deepcopy(list(world.pods.values())))
        self.tap.mark_synced()
        assert self.book.ready

    def deliver(self, n: int | None = None) -> None:
        q = self.world.queues[self.rid]
        cut = len(q) if n is None else n
        todo = q[:cut]
        del q[:cut]
        for kind, what in todo:
            if kind == "pod":
                self.tap.upsert_pod(what)
            elif kind == "pod-":
                self.tap.delete_pod(what)
            elif kind == "podgroup":
                self.inputs.upsert_workload_object(PODGROUPS, what)
            elif kind == "podgroup-":
                self.inputs.delete_workload_object(PODGROUPS, what)
            elif kind == "record":
                self.tap.upsert_record(what)
            else:
                self.tap.delete_record(what)

    def step(self) -> None:
        self.book.step()
        self.writer.drain()
        self.requeue.drain()


class Cluster(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World()
        self.replicas = [Replica(self.world, 0), Replica(self.world, 1)]
        self.fillers = 0
        self.forged = 0

    @property
    def leader(self) -> Replica:
        return self.replicas[self.world.leader]

    @initialize(groups=st.lists(st.sampled_from(sorted(GROUPS)), min_size=1, max_size=3,
                                unique=True), workers=st.booleans(),
                pg_members=st.integers(0, PG_MEMBERS))
    def groups_already_there(self, groups: list[str], workers: bool, pg_members: int) -> None:
        """Start mid-life: some groups (and their workers) seen by both replicas, and
        the leader's first decisions taken; perhaps PodGroup llm/pg and members of it."""
        for g in groups:
            size, gpus = GROUPS[g]
            for i in range(size if workers else 1):
                self.world.put_pod(lws_pod(g, i, size, gpus))
        if pg_members:
            self.pod_group_min_count(2)
            for i in range(pg_members):
                self.world.put_pod(pg_member(i))
        for r in self.replicas:
            r.deliver()
        self.leader.step()
        for r in self.replicas:
            r.deliver()

    # ---- arrivals and departures ------------------------------------------------------------

    @rule(g=st.sampled_from(sorted(GROUPS)), prio=st.integers(0, 2))
    def group_arrives(self, g: str, prio: int) -> None:
        if member_key(g, 0) not in self.world.pods:
            size, gpus = GROUPS[g]
            self.world.put_pod(lws_pod(g, 0, size, gpus, priority=prio))

    @rule(g=st.sampled_from(sorted(GROUPS)), i=st.integers(1, 3))
    def worker_arrives(self, g: str, i: int) -> None:
        size, gpus = GROUPS[g]
        if i < size and member_key(g, 0) in self.world.pods and \
                member_key(g, i) not in self.world.pods:
            self.world.put_pod(lws_pod(g, i, size, gpus))

    @rule(g=st.sampled_from(sorted(GROUPS)), i=st.integers(0, 3))
    def member_deleted(self, g: str, i: int) -> None:
        self.world.delete_pod(member_key(g, i))

    @rule(i=st.integers(0, PG_MEMBERS - 1), ns=st.sampled_from(("llm", "llm", "evil")))
    def pod_group_member_arrives(self, i: int, ns: str) -> None:
        if f"{ns}/pgm-{i}" not in self.world.pods:
            self.world.put_pod(pg_member(i, ns))

    @rule(i=st.integers(0, PG_MEMBERS - 1))
    def pod_group_member_deleted(self, i: int) -> None:
        self.world.delete_pod(f"llm/pgm-{i}")

    @rule(min_count=st.integers(1, PG_MEMBERS))
    def pod_group_min_count(self, min_count: int) -> None:
        """The PodGroup created, or its minCount changed (it is mutable)."""
        self.world.pod_group = pg_object(min_count)
        self.world.emit(("podgroup", copy.deepcopy(self.world.pod_group)))

    @rule()
    def pod_group_deleted(self) -> None:
        if self.world.pod_group is not None:
            self.world.emit(("podgroup-", self.world.pod_group))
            self.world.pod_group = None

    @rule(i=st.integers(0, 5))
    def filler_deleted(self, i: int) -> None:
        self.world.delete_pod(f"x/filler-{i}")

    # ---- the leader acts --------------------------------------------------------------------

    def _bind(self, r: Replica, key: str, placement: Any) -> None:
        """The API server's side of a Binding: refused when the pod is gone or bound."""
        current = self.world.pods.get(key)
        if current is None or current["spec"].get("nodeName"):
            r.book.forget(key)  # what the app does when the Binding is refused
            return
        self.world.put_pod(bound(current, placement.node,
                                 placement_annotations(placement, "gpupack")))

    @rule(pick=st.integers(0, 7))
    def member_bound(self, pick: int) -> None:
        """kube-scheduler binds one of the pending members the leader has a room for."""
        r = self.leader
        ready = sorted((key, rec.group, slot) for rec in r.book.reservations.values()
                       for slot, key in rec.pods.items() if r.cache.pending_pod(key))
        if not ready:
            return
        key, group, slot = ready[pick % len(ready)]
        req = r.cache.pending_pod(key)
        assert req is not None
        node = r.book.reservations[group].slots[slot].node
        got = GroupVerbs(r.book).reserve(req, req.uid, node)
        if got is not None and not isinstance(got, Status):
            event("a member bound to its room")
            self._bind(r, key, got)

    @rule(pick=st.integers(0, 7))
    def member_filtered(self, pick: int) -> None:
        """kube-scheduler tries a pending member: the leader's filter keeps its room's node,
        refuses it (parked), or answers an error (retried after backoff: not parked)."""
        r = self.leader
        pending = sorted(k for k, p in self.world.pods.items()
                         if k.startswith("llm/") and not p["spec"].get("nodeName"))
        if not pending:
            return
        key = pending[pick % len(pending)]
        args = ExtenderArgs.decode({"Pod": copy.deepcopy(self.world.pods[key]), "Nodes": None,
                                    "NodeNames": [n["metadata"]["name"] for n in NODES]})
        got = GroupVerbs(r.book).filter(args)
        assert got is not None
        if not got.error and not got.node_names:
            event("a member refused and parked")
            self.world.parked.add(key)

    @rule(gpus=st.integers(1, 2))
    def filler_bound(self, gpus: int) -> None:
        """A small pod gpupack binds where its leader's cache says there is room."""
        r = self.leader
        name = f"filler-{self.fillers % 6}"
        self.fillers += 1
        if f"x/{name}" in self.world.pods:
            return
        p = whole_pod(name, gpus, namespace="x", uid=f"uid-{name}-{self.fillers}")
        self.world.put_pod(p)
        r.deliver()  # the pod must be known to be bound (kube-scheduler sends it)
        req = pod_request(p)
        with r.cache.view() as view:
            option = next((o for n in sorted(view.node_names())
                           for o in view.state.options(req, n)), None)
            if option is None:
                return
            view.assume(req, req.uid, option)
        self._bind(r, f"x/{name}", option)

    @rule(rid=st.integers(0, 1))
    def step(self, rid: int) -> None:
        book = self.replicas[rid].book
        done = book.released["complete"]
        self.replicas[rid].step()
        if book.reservations:
            event("a replica holds a reservation")
        if book.released["complete"] > done:
            event("a group completed")

    # ---- time, watches, restarts, failovers ---------------------------------------------------

    @rule(seconds=st.sampled_from((1, 15, 70)))
    def tick(self, seconds: int) -> None:
        self.world.clock.advance(seconds)

    @rule(rid=st.integers(0, 1), n=st.one_of(st.none(), st.integers(1, 3)))
    def watch_delivers(self, rid: int, n: int | None) -> None:
        """Not called: the watch is stalled. Called: some or all of its events arrive."""
        self.replicas[rid].deliver(n)

    @rule(rid=st.integers(0, 1))
    def restart(self, rid: int) -> None:
        self.replicas[rid] = Replica(self.world, rid)
        self.replicas[rid].step()

    @rule()
    def failover(self) -> None:
        new = 1 - self.world.leader
        self.replicas[new].deliver()  # see the module docstring
        self.world.leader = new
        self.replicas[1 - new].step()  # the old leader's keeper sees it lost the Lease
        self.replicas[new].step()

    # ---- forgery ------------------------------------------------------------------------------

    @rule(rev=st.integers(1, 1000), node_name=st.sampled_from([f"n{i}" for i in range(4)]))
    def forged_annotation(self, rev: int, node_name: str) -> None:
        """A user's pod carrying another group's record, moved and with a higher rev."""
        if not self.world.records:
            return
        self._settle()
        if not self.world.records:
            return  # they expired meanwhile
        event("a forged annotation")
        before = [dict(r.book.records) for r in self.replicas]
        victim = record_of(next(iter(self.world.records.values())))
        body = {"v": 1, "g": victim.group, "s": victim.size, "pr": 1000, "t": None,
                "x": False, "d": None, "at": 0, "exp": self.world.clock.now + 1e6,
                "rev": victim.rev + rev,
                "m": {str(s): {"n": node_name, "g": [0, 1, 2, 3]} for s in victim.slots}}
        self.forged += 1
        evil = pod(f"evil-{self.forged}", namespace="evil",
                   annotations={RESERVATION: json.dumps(body),
                                "gpupack.io/group-key": victim.group})
        self.world.put_pod(evil)
        self._settle()
        assert [dict(r.book.records) for r in self.replicas] == before

    def _settle(self) -> None:
        """Every watch delivered and every replica stepped until nothing moves (the
        leader's writes reach the standby one round later)."""
        for _ in range(5):
            seen = [dict(r.book.records) for r in self.replicas]
            for r in self.replicas:
                r.deliver()
                r.step()
            if all(not q for q in self.world.queues.values()) and seen == [
                    dict(r.book.records) for r in self.replicas]:
                return
        raise AssertionError("the replicas did not settle")

    # ---- invariants ---------------------------------------------------------------------------

    @invariant()
    def one_writer(self) -> None:
        assert self.world.bad_writes == []

    @invariant()
    def no_gpu_bound_twice_in_the_api(self) -> None:
        seen: dict[tuple[str, int], str] = {}
        for key, p in self.world.pods.items():
            n = p["spec"].get("nodeName")
            if not n:
                continue
            for i in (p["metadata"].get("annotations") or {}).get(GPUS, "").split(","):
                if i:
                    assert (n, int(i)) not in seen, f"GPU {n}/{i}: {seen[(n, int(i))]}, {key}"
                    seen[(n, int(i))] = key

    @invariant()
    def no_gpu_counted_twice_in_a_cache(self) -> None:
        for r in self.replicas:
            seen: dict[tuple[str, int], str] = {}
            for req, p in r.cache.snapshot().running:
                for i in p.gpus:
                    assert (p.node, i) not in seen, (
                        f"replica {r.rid}: GPU {p.node}/{i}: {seen[(p.node, i)]} and {req.key}")
                    seen[(p.node, i)] = req.key

    @invariant()
    def groups_whole_or_holding_nothing(self) -> None:
        r = self.leader
        for key, rec in r.book.reservations.items():
            for slot in range(rec.size):
                member = rec.pods.get(slot)
                entry = r.cache.pod_entry(member) if member else None
                member_bound = entry is not None and r.cache.counted(member or "") is not None
                held = r.cache.counted(hold_key(key, slot)) is not None
                assert member_bound or held, f"group {key} slot {slot} neither bound nor held"
        for hk in r.cache.holds():
            assert hk.split(RESERVE_MARK)[0] in r.book.reservations, f"{hk} held for nothing"
        for prefix in [f"llm/{g}-0" for g in GROUPS] + ["llm/pgm-"]:
            cliques = {CLIQUE_OF[p["spec"]["nodeName"]] for k, p in self.world.pods.items()
                       if k.startswith(prefix) and p["spec"].get("nodeName")}
            assert len(cliques) <= 1, f"group {prefix} split across cliques {cliques}"

    @invariant()
    def no_group_across_namespaces(self) -> None:
        for r in self.replicas:
            for g, rec in r.book.reservations.items():
                ns = g.split("/", 1)[0]
                assert all(k.split("/", 1)[0] == ns for k in rec.pods.values()), (g, rec.pods)
            assert all(not k.startswith("evil/") for k in r.book.reservations), "evil reserved"
        if self.leader.book.reservations.get("llm/pg") is not None:
            event("a PodGroup's group holds a reservation")

    @invariant()
    def no_member_parked_for_nothing(self) -> None:
        r = self.leader
        queued = set(r.requeue.pending())
        for rec in r.book.reservations.values():
            for key in rec.pods.values():
                p = self.world.pods.get(key)
                if p is None or p["spec"].get("nodeName") or r.cache.pending_pod(key) is None:
                    continue
                assert key not in self.world.parked or key in queued, (
                    f"{key} parked though record {rec.group} names it")

    @invariant()
    def a_group_over_the_cap_holds_nothing(self) -> None:
        for r in self.replicas:
            assert "llm/big/0" not in r.book.reservations


Cluster.TestCase.settings = settings(max_examples=50, stateful_step_count=50, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])
TestGroupsStateful = Cluster.TestCase
