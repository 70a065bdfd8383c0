"""LLM leader/worker groups in the extender: the reservation book (a thin handler). The
verbs' answers for group members are :mod:`scheduler.groups.plugin`.

When the first pod of a group (LeaderWorkerSet, or ``gpupack.io/group`` +
``group-size``) is seen pending, the whole group is placed at once and its room
*reserved*: a record (one ConfigMap per group in gpupack's namespace,
:mod:`kube.groups.reservations`) says which node and GPUs each member slot gets. Every member
not bound yet is *held* in the cache under a synthetic key ``<group>#reserve-<slot>``
(:meth:`ClusterCache.hold`), so filter, prioritize, bind and the planner see those GPUs
as taken. Members are steered to their room: filter keeps only the reserved node,
prioritize gives it 10, bind swaps the member's hold for the pod at the reserved GPUs.
If the group does not fit, its pods are rejected saying so and nothing is held.

Who decides what: the decisions are one pure function,
:func:`scheduler.groups.decide.reconcile` (records, pods, holds, now -> records to
write or release, waiting groups). This handler

* mirrors the records it is told about (the record watch) and holds what they ask for,
  on every replica, so a standby's cache is warm and equal to the leader's;
* runs ``reconcile`` and applies its decision (local records at once, the API writes
  queued for :class:`kube.record_writer.RecordWriter`) **only on the leader**
  (``is_leader``) and only once :meth:`synced` has rebuilt the holds from the first
  full lists of nodes, pods and records. No read (a view, a snapshot, a scrape) ever
  reserves or writes anything;
* runs from :meth:`step`: the background keeper thread calls it when the cache changes
  or a deadline passes, and the verbs call it for a group member first (the leader's
  acting path), so a new group's room exists before its first pod is answered.

Restart and failover: records live in the API; the new leader's holds are already
derived from them (warm standby), and its first reconcile keeps every room still free,
takes members bound anywhere as the truth, and places again only the rooms that went.

The clock is injected (wall-clock seconds: expiries are written to the API and must
survive a restart). A step of that clock backwards moves every deadline the book keeps in
memory (expiries, retry times, first-seen times) back by the same step, so a reservation
never outlives ``ttl`` and a waiting group is not stalled by it (see :meth:`_now`).

Past 600 lines as one handler: mirroring the records the watch reports, holding their
rooms, applying the decision and writing again what a lapse of the lease dropped all
change the same books (records, revisions, waiting groups, ruled-out nodes) under the
cache lock; the decision is :mod:`scheduler.groups.decide`, the rights
:mod:`scheduler.groups.rights`, the answers to members :mod:`scheduler.groups.plugin`.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from kube.cache import ClusterCache
from kube.groups.inputs import GroupInputs
from kube.groups.reservations import (
    ReservationError,
    ReservationRecord,
    record_name,
    record_object,
    record_of,
)
from kube.pod_conditions import room_reserved
from kube.record_writer import RecordWriter, Submitter
from packing.groups.members import is_reservation
from packing.model import GroupRef, Placement, PodRequest, RequestKind
from packing.policies.scores import bestfit
from packing.scoring import Scorer
from scheduler.engine import GatedHandler, Lead, LeaderGate, Loop, LoopMetrics, Outcome
from scheduler.groups.decide import (
    BookState,
    GroupDecision,
    GroupSettings,
    Member,
    Waiting,
    members_of,
    order_key,
    reconcile,
    wanted_group_holds,
)
from scheduler.groups.facts import RightsPass, judge
from scheduler.groups.keys import WAIT_REASONS, hold_key
from scheduler.groups.namespace_cap import ReservedCap
from scheduler.groups.pod_groups import is_gang, resolve_members, resolve_requests
from scheduler.groups.rights import RightsSettings

__all__ = ["DEFAULT_TTL", "WAIT_REASONS", "ReservationBook", "hold_key"]

log = logging.getLogger("gpupack.scheduler.groups")

Clock = Callable[[], float]
DEFAULT_TTL = 600.0
# How long the nodes kube-scheduler ruled out for a member keep its group off them.
DEFAULT_RULED_OUT_S = 120.0
# A node whose state changed less than this long ago is not taken as ruled out by
# kube-scheduler: its informer (or a pod still terminating there) may lag gpupack's view.
DEFAULT_VIEW_SETTLE_S = 10.0
MAX_RULED_OUT = 4096  # members with nodes ruled out remembered at once
MAX_RETIRED = 1024  # groups whose last revision is remembered after they went


class NullWriter:
    """Writes nowhere (a book without an API: unit tests, tools)."""

    dropped = 0  # writes dropped because this replica did not lead (never, here)

    def submit(self, name: str, obj: object) -> None:
        del name, obj


@dataclass(frozen=True)
class RuledOut:
    """A pending member kube-scheduler refused its room to: the only nodes it offered
    for the member since (every other node is ruled out for it), until ``until``."""

    group: str
    offered: frozenset[str]
    until: float


class ReservationBook(GatedHandler):
    """Records mirrored, holds derived, decisions applied on the leader; see the module
    docstring."""

    def __init__(
        self,
        cache: ClusterCache,
        ttl: float = DEFAULT_TTL,
        clock: Clock = time.time,
        writer: RecordWriter | NullWriter | None = None,
        scorer: Callable[[], Scorer] | None = None,
        retry_s: float = 1.0,
        cooldown_s: float = 30.0,
        is_leader: Callable[[], bool] = lambda: True,
        namespace: str = "gpupack",
        records_listed: bool = False,
        inputs: GroupInputs | None = None,
        max_group_gpus: int = 64,
        namespace_cap: ReservedCap | None = None,
        requeue: Submitter | None = None,
        ruled_out_s: float = DEFAULT_RULED_OUT_S,
        view_settle_s: float = DEFAULT_VIEW_SETTLE_S,
        loop_metrics: LoopMetrics | None = None,
    ) -> None:
        """``records_listed``: no source of records will report (a book without an API,
        whose records start empty): ready as soon as the cache is synced. ``inputs``:
        the ResourceQuotas and LeaderWorkerSets groups are bound by (default: none, and
        nothing will report any); ``max_group_gpus``: the most GPUs a group may reserve
        (:mod:`scheduler.groups.rights`); ``namespace_cap``: the most one namespace's
        reservations may hold (:mod:`scheduler.groups.namespace_cap`; None: no cap).
        ``requeue``: where the
        leader queues the status patches that wake members it refused once their room is
        reserved (:mod:`kube.pod_conditions`; default: nowhere). ``ruled_out_s``: how long
        the nodes kube-scheduler ruled out for a member keep its group off them (see
        :meth:`rule_out`); ``view_settle_s``: a node whose state changed less long ago is
        never taken as ruled out (kube-scheduler's view may lag the change).
        ``loop_metrics``: where the keeper thread's steps are counted (:mod:`scheduler.
        engine`)."""
        self.cache = cache
        self.ttl = ttl
        self.clock = clock
        self.writer = writer if writer is not None else NullWriter()
        self.requeue: Submitter = requeue if requeue is not None else NullWriter()
        # Members a verb refused (kube-scheduler has parked them): woken when a record
        # gives them a room (see _wake_refused).
        self.refused: set[str] = set()
        self.woken = 0
        self.scorer = scorer or (lambda: bestfit)
        self.settings = GroupSettings(ttl=ttl, retry_s=retry_s, cooldown_s=cooldown_s)
        self.gate = LeaderGate(is_leader)
        self.namespace = namespace
        self.inputs = inputs if inputs is not None else GroupInputs(True, True)
        self.rights = RightsSettings(max_group_gpus=max_group_gpus,
                                     scheduler_name=cache.scheduler_name,
                                     namespace_cap=namespace_cap)
        self.records: dict[str, ReservationRecord] = {}
        self.waiting: dict[str, Waiting] = {}
        self.first_seen: dict[str, float] = {}
        self.strikes: dict[str, int] = {}  # group -> expiries in a row (groups.decide)
        self.released: Counter[str] = Counter()  # reason -> count
        self.bad_records = 0
        self.on_complete: Callable[[float], None] | None = None
        self.ready = False  # first lists in and holds rebuilt: the verbs may answer
        self._rebuilt = False  # holds rebuilt: step() may act (ready follows its first step)
        # Moves whenever a record from the API changes what is held: a step must then
        # hold it, however recent the last one (see _version).
        self._record_gen = 0
        # Per group, the highest revision this replica wrote or released as the leader.
        self._own_revs: dict[str, int] = {}
        self._listed = records_listed
        self._revs: dict[str, int] = {}
        # Groups gone (no record, no pods, none in the API), with the highest revision
        # either map above had: a late echo of an old write is still known as one, and a
        # group that comes back writes above it. Bounded (oldest forgotten first).
        self._retired: OrderedDict[str, int] = OrderedDict()
        self._names: dict[str, str] = {}  # record name -> group
        # Writes the writer dropped while this replica did not lead, as last acted on.
        self._drops_seen = 0
        # Pending member -> the nodes kube-scheduler still offers for it (see rule_out).
        self.ruled_out_s = ruled_out_s
        self.view_settle_s = view_settle_s
        self._ruled: dict[str, RuledOut] = {}
        self._ruled_gen = 0  # moves whenever _ruled changes what a reconcile decides
        self._last_now: float | None = None  # the clock at the last step (see _now)
        self._seen_version = -1
        self._next_due = -math.inf
        # The keeper thread (scheduler.engine): a step on every cache change, and at
        # least every poll_s (deadlines, and a change of leader).
        self.loop = Loop("reservation-book", self.step, poll_s=1.0, log=log,
                         metrics=loop_metrics)
        cache.add_pending_filter(self.held_members)
        cache.on_pod_gone(self._member_gone)
        cache.subscribe(self.loop.wake)

    # ---- what others read ------------------------------------------------------------------


    @property
    def reservations(self) -> Mapping[str, ReservationRecord]:
        return self.records

    def held_members(self) -> set[str]:
        """Member pods whose room a record holds (under the lock). The cache leaves them
        out of the planner's snapshot: their room is already counted as taken."""
        return {k for r in self.records.values() for k in r.pods.values()}

    def slot_of(self, rec: ReservationRecord, pod: str) -> int | None:
        return next((s for s, k in rec.pods.items() if k == pod), None)

    # ---- records from the watch (kube.groups.reservations.ReservationTap) ------------------------

    def record_seen(self, name: str, obj: Mapping[str, object] | None) -> None:
        with self.cache.lock:
            now = self._now()
            if obj is None:
                group = self._names.pop(name, None)
                if self.is_leader():
                    # The leader trusts its memory: the echo of its own delete, or a
                    # late delete of a replica that led before, of a record it holds
                    # (then written again: the API must not lack it at a failover).
                    self._repair(name)
                elif group is not None and self.records.pop(group, None) is not None:
                    self._record_gen += 1  # a standby mirrors the API
                self.loop.wake()
                return
            try:
                rec = record_of(obj)
            except ReservationError as e:
                self.bad_records += 1
                log.warning("ignoring record %s: %s", name, e)
                return
            self._names[name] = rec.group
            self._revs[rec.group] = max(self._revs.get(rec.group, 0), rec.rev)
            own = self._own_revs.get(rec.group, self._retired.get(rec.group))
            if own is not None and rec.rev <= own and self.is_leader():
                # Not above what we wrote: the echo of a write of ours, or a late write
                # of a replica that led before. Memory wins (a late echo must not bring
                # a released reservation back); the API is set to it again unless it
                # already shows exactly what memory holds.
                if self.records.get(rec.group) != rec:
                    self._repair(name, rec.group)
                return
            if rec.expires > now + self.ttl:
                # No record a leader writes outlives now + ttl: a later expiry is corrupt
                # (or a clock gone backwards) and would hold the GPUs as long as it says.
                log.warning("record of group %s expires in %.0fs, more than the TTL %.0fs; "
                            "capped at the TTL", rec.group, rec.expires - now, self.ttl)
                rec = replace(rec, expires=now + self.ttl)
            if self.records.get(rec.group) != rec:
                self.records[rec.group] = rec
                self._record_gen += 1
            self.loop.wake()

    def records_listed(self, objs: Iterable[Mapping[str, object]]) -> None:
        with self.cache.lock:
            listed: set[str] = set()
            for obj in objs:
                meta = obj.get("metadata")
                name = meta.get("name") if isinstance(meta, Mapping) else None
                if isinstance(name, str):
                    listed.add(name)
                    self.record_seen(name, obj)
            for name in [n for n in self._names if n not in listed]:
                self.record_seen(name, None)
            self._listed = True

    def synced(self) -> None:
        """The first lists of nodes, pods and records are in: rebuild the holds, then
        answer (until now every verb answered 'not synced')."""
        with self.cache.lock:
            self._listed = True
            self._rebuild()

    def check_ready(self) -> bool:
        """Whether the verbs may be answered; rebuilds first when everything is listed."""
        if not self.ready:
            with self.cache.lock:
                self._rebuild()
        return self.ready

    def _rebuild(self) -> None:
        """Under the lock, once everything is listed: hold what the records ask for and
        take the first step, and only then say ready (whoever sees ``ready`` sees the
        rebuilt book)."""
        if self.ready or not (self._listed and self.cache.synced and self.inputs.listed()):
            return
        self._apply_holds()
        self._rebuilt = True
        self.step(force=True)
        self.ready = True
        log.info("reservation book rebuilt from %d records", len(self.records))

    # ---- the handler -----------------------------------------------------------------------

    def members(self) -> dict[str, list[Member]]:
        """Every group's pods: counted ones with where (and whether only assumed: a
        group is complete once the watch confirms every bind), pending ones."""
        counted, pending = self.cache.group_requests()
        pods: list[tuple[PodRequest, Placement | None]] = list(counted)
        assumed = {req.key for req, _ in pods if self.cache.is_assumed(req.key)}
        pods += [(p, None) for p in pending]
        # PodGroup members as their PodGroup says now (scheduler.groups.pod_groups).
        return resolve_members(members_of(pods, assumed), self.inputs.pod_group)

    def resolved(self, pods: Sequence[PodRequest]) -> tuple[PodRequest, ...]:
        """Pending pods with their PodGroups' sizes (scheduler.groups.pod_groups), for
        the rooms that plan for waiting groups beside the book."""
        return resolve_requests(pods, self.inputs.pod_group)

    def is_gang(self, ref: GroupRef) -> bool:
        """Whether a member of ``ref`` is in an all-or-nothing group (not a basic
        PodGroup's pod, which is placed alone)."""
        return is_gang(ref, self.inputs.pod_group)

    def _apply_holds(self, members: Mapping[str, list[Member]] | None = None) -> None:
        """Hold what the records ask for (records in priority order; a room that is not
        free is left unheld, and the leader's reconcile places it again)."""
        members = self.members() if members is None else members
        wanted: dict[str, tuple[PodRequest, Placement]] = {}
        for rec in sorted(self.records.values(), key=order_key):
            wanted.update(wanted_group_holds(rec, members.get(rec.group, [])))
        for hk, (req, p) in self.cache.holds().items():
            if not is_reservation(hk):
                continue  # another keeper's hold (the defragmenter's): not the book's
            w = wanted.get(hk)
            if w is None or w[0] != req or w[1].node != p.node or w[1].gpus != p.gpus:
                self.cache.unhold(hk)
        for hk, (req, p) in wanted.items():
            if self.cache.counted(hk) is None:
                why = self.cache.hold(req, p)
                if why is not None:
                    log.info("room of %s not held: %s", hk, why)

    def _member_gone(self, key: str) -> None:
        """A counted pod was deleted or finished (under the cache lock, before the change
        is published). When it was a member of a reserved group, the book steps at once
        rather than on the keeper's next turn: the member's room is held again (or, on
        the leader, the group released if its leader went) before any other pod is
        answered, so none takes the room in between."""
        if self._rebuilt and any(key in r.pods.values() for r in self.records.values()):
            self.step(force=True)

    def step(self, force: bool = False) -> Outcome:
        """Hold what the records ask for; on the leader, reconcile and apply."""
        with self.cache.lock:
            if not self._rebuilt:
                return Outcome.IDLE
            now = self._now()
            lead = self.gate.step()
            leader = lead.leading
            if (not force and lead in (Lead.LEADS, Lead.STANDBY) and self._version() ==
                    self._seen_version and now < self._next_due
                    and not (leader and self._writes_dropped())):
                return Outcome.DONE if leader else Outcome.STANDBY
            self._forget_ruled_out(now)
            members = self.members()
            if lead is Lead.GAINED:
                log.info("leading: acting on %d records", len(self.records))
                # The last leader may have refused any pending member (kube-scheduler
                # parked it): each is woken when a record of this leader names it.
                self.refused |= {m.req.key for ms in members.values() for m in ms
                                 if not m.bound}
            if leader:
                self.gate.act()
            self._apply_holds(members)
            if leader:
                decision = reconcile(self._state(members, now), self.cache.state,
                                     self.scorer(), self.settings, now)
                self._apply(decision)
                if decision.put or decision.release:
                    self._apply_holds()
                self._rewrite_dropped()
            self._retire(members)
            if self.refused and leader:
                self.refused = {k for k in self.refused
                                if self.cache.pending_pod(k) is not None}
            self._seen_version = self._version()
            self.waiting = {g: (replace(w, seen=self._seen_version) if w.seen == -1 else w)
                            for g, w in self.waiting.items()}
            self._next_due = self._due()
            return Outcome.DONE if leader else Outcome.STANDBY

    def _version(self) -> int:
        """Moves on every change that could change a decision: the cache's, the records
        the API reports, the nodes ruled out for members, and the quotas' and
        LeaderWorkerSets' (each only grows)."""
        return self.cache.version + self._record_gen + self._ruled_gen + self.inputs.version

    def _now(self) -> float:
        """The clock, once per step. When it went back since the last step (an NTP step,
        an operator), every deadline held in memory goes back by as much: expiries,
        retry times, first-seen times and ruled-out nodes are wall-clock times, and left
        as they were an expiry would outlive the TTL and a waiting group's next try lie
        in the future by the size of the step. (A record read back from the API is
        capped at now + TTL in :meth:`record_seen`; a step forward only ends waits
        early.)"""
        now = self.clock()
        if self._last_now is not None and now < self._last_now:
            back = self._last_now - now
            log.warning("the clock went back %.3fs: moving the reservations' deadlines "
                        "back as much", back)
            self._shift(-back)
        self._last_now = now
        return now

    def _shift(self, by: float) -> None:
        """Every in-memory deadline moved by ``by`` seconds (see :meth:`_now`)."""
        self.records = {g: replace(r, expires=r.expires + by, first_seen=r.first_seen + by)
                        for g, r in self.records.items()}
        self.waiting = {g: replace(w, next_try=w.next_try + by)
                        for g, w in self.waiting.items()}
        self.first_seen = {g: t + by for g, t in self.first_seen.items()}
        self._ruled = {k: replace(m, until=m.until + by) for k, m in self._ruled.items()}
        self._next_due += by

    # ---- writes dropped during a lapse of the lease ------------------------------------------

    def _writes_dropped(self) -> bool:
        """Whether the writer dropped writes (this replica did not lead when it drained)
        since :meth:`_rewrite_dropped` last ran."""
        return int(getattr(self.writer, "dropped", 0)) != self._drops_seen

    def _rewrite_dropped(self) -> None:
        """On the leader, after the writer dropped writes: write every record held in
        memory again, and delete again every record the API still shows that this leader
        released. A replica that loses the lease for a moment and leads again is never
        told so by ``is_leader`` in between (or not before its queued writes are
        dropped), and nothing else would write those again: the API would lack records
        the leader acts on, and a failover would lose them."""
        if not self._writes_dropped():
            return
        self._drops_seen = int(getattr(self.writer, "dropped", 0))
        log.info("writes were dropped while not leading: writing %d records again",
                 len(self.records))
        for g, rec in sorted(self.records.items()):
            # Its echo is ours (ignored), whoever wrote this revision first.
            self._own_revs[g] = max(self._own_revs.get(g, 0), rec.rev)
            self.writer.submit(record_name(g), record_object(rec, self.namespace))
        for name, g in sorted(self._names.items()):
            if g not in self.records:
                self.writer.submit(name, None)

    def _repair(self, name: str, group: str | None = None) -> None:
        """On the leader, under the lock: the API showed record ``name`` other than memory
        has it (deleted, or another revision): queue memory's record again, or its delete
        when memory holds none. The echo of that write equals memory and ends it; an echo
        of an older write of ours costs one write more (the writer keeps the latest per
        record). Nothing else would write it again: a failover would find the API's."""
        if group is None:
            group = next((g for g in self.records if record_name(g) == name), None)
        rec = self.records.get(group) if group is not None else None
        if rec is not None:
            log.info("record of group %s differs in the API from this leader's: written "
                     "again", rec.group)
            self._own_revs[rec.group] = max(self._own_revs.get(rec.group, 0), rec.rev)
            self.writer.submit(name, record_object(rec, self.namespace))
        elif group is not None:
            log.info("record of group %s is in the API, released here: deleted again", group)
            self.writer.submit(name, None)

    def _retire(self, members: Mapping[str, list[Member]]) -> None:
        """Forget the revisions of groups that are gone: no record here or in the API
        (its delete echoed, or never written) and no pod. Their highest revision moves
        to the bounded ``_retired`` (what the late-echo check and the next revision of a
        group that comes back need)."""
        live = set(self.records) | set(members) | set(self._names.values())
        for g in [g for g in self._revs.keys() | self._own_revs.keys() if g not in live]:
            last = max(self._revs.pop(g, 0), self._own_revs.pop(g, 0),
                       self._retired.pop(g, 0))
            self._retired[g] = last
        while len(self._retired) > MAX_RETIRED:
            self._retired.popitem(last=False)

    # ---- nodes kube-scheduler ruled out for a member -----------------------------------------

    def rule_out(self, key: str, group: str, offered: Iterable[str]) -> None:
        """kube-scheduler offered only ``offered`` for pending member ``key`` of
        ``group``, every node that passed its filters, and the node of the member's room
        is not among them (under the lock; the verbs tell). Rules gpupack's rights do not
        judge (pod anti-affinity, a volume's zone, topology spread) keep the member off
        that room for as long as they hold: left reserved, the room would hold the
        group's GPUs until the TTL and then be chosen again. So the member's room counts
        as lost, and no room of its group is placed outside ``offered`` for
        ``ruled_out_s`` (each new refusal starts that again)."""
        now = self._now()
        old = self._ruled.get(key)
        mark = RuledOut(group, frozenset(offered), now + self.ruled_out_s)
        self._ruled[key] = mark
        if old is None or old.offered != mark.offered:
            self._ruled_gen += 1
        while len(self._ruled) > MAX_RULED_OUT:
            del self._ruled[min(self._ruled, key=lambda k: self._ruled[k].until)]
        self.loop.wake()

    def nodes_offered(self, key: str, names: Iterable[str]) -> None:
        """kube-scheduler offered ``names`` for member ``key``, its room's node among them
        (under the lock): they are not ruled out for it any more."""
        old = self._ruled.get(key)
        if old is None:
            return
        offered = old.offered | frozenset(names)
        if offered != old.offered:
            self._ruled[key] = replace(old, offered=offered)
            self._ruled_gen += 1

    def _forget_ruled_out(self, now: float) -> None:
        """Marks past their time, or of members no longer pending, go."""
        gone = [k for k, m in self._ruled.items()
                if m.until <= now or self.cache.pending_pod(k) is None]
        for k in gone:
            del self._ruled[k]
        if gone:
            self._ruled_gen += 1

    def _judge(self, members: Mapping[str, list[Member]], now: float) -> RightsPass:
        """The rights of the groups this pass can act on: those with a record, and
        those the reconcile will try to place now."""
        version = self._version()
        groups = set(self.records)
        for g, ms in members.items():
            w = self.waiting.get(g)
            if g not in self.records and any(not m.bound for m in ms) and (
                    w is None or w.due(now, version) or w.grew(len(ms))):
                groups.add(g)
        return judge(self.cache, self.inputs, self.rights, groups, self.records)

    def _state(self, members: Mapping[str, list[Member]], now: float) -> BookState:
        rights = self._judge(members, now)
        return BookState(records=dict(self.records), members=members,
                         holds={k: v for k, v in self.cache.holds().items() if is_reservation(k)},
                         waiting=dict(self.waiting),
                         first_seen=dict(self.first_seen),
                         revs=self._all_revs(),
                         offered={k: m.offered for k, m in self._ruled.items()},
                         version=self._version(), allowed=rights.allowed(),
                         refused=rights.refused(), never=rights.never(),
                         sizes=rights.sizes(), quota_left=rights.quota_left,
                         claims=rights.claims(), not_exclusive=rights.not_exclusive(),
                         strikes=dict(self.strikes))

    def _all_revs(self) -> dict[str, int]:
        """The highest revision known per group, retired groups included (a group that
        comes back writes above any revision a late echo may still carry)."""
        revs = dict(self._retired)
        for g, rev in self._revs.items():
            revs[g] = max(rev, revs.get(g, 0))
        return revs

    def _apply(self, d: GroupDecision) -> None:
        for rel in d.release:
            rec = self.records.pop(rel.group, None)
            if rec is not None:
                self._own_revs[rel.group] = max(self._own_revs.get(rel.group, 0), rec.rev)
            self.released[rel.reason] += 1
            self.writer.submit(record_name(rel.group), None)
            log.info("released the reservation of group %s (%s)", rel.group, rel.reason)
        for rec in d.put:
            if rec.group not in self.records:
                log.info("reserved room for group %s (%d members) on %s", rec.group, rec.size,
                         ", ".join(sorted({p.node for p in rec.slots.values()})))
            self.records[rec.group] = rec
            self._revs[rec.group] = max(self._revs.get(rec.group, 0), rec.rev)
            self._own_revs[rec.group] = max(self._own_revs.get(rec.group, 0), rec.rev)
            self.writer.submit(record_name(rec.group), record_object(rec, self.namespace))
        if self.refused:
            self._wake_refused(d.put)
        self.waiting = dict(d.waiting)
        self.first_seen = dict(d.first_seen)
        self.strikes = dict(d.strikes)
        for _, seconds in d.completed:
            if self.on_complete is not None:
                self.on_complete(seconds)

    def note_refused(self, key: str) -> None:
        """A verb refused member ``key`` (under the lock): kube-scheduler parks it until an
        event, which a reservation made later on gpupack's own clock is not."""
        self.refused.add(key)

    def _wake_refused(self, put: Iterable[ReservationRecord]) -> None:
        """Queue the status patch that requeues each refused member a record now names
        (one write per member and refusal; kube.pod_conditions says why)."""
        for rec in put:
            for slot, key in rec.pods.items():
                if key not in self.refused or self.cache.pending_pod(key) is None:
                    continue
                self.refused.discard(key)
                node = rec.slots[slot].node if slot in rec.slots else "?"
                now = dt.datetime.fromtimestamp(self.clock(), dt.UTC)
                self.requeue.submit(key, room_reserved(key, rec.group, slot, node, rec.rev, now))
                self.woken += 1

    def _due(self) -> float:
        times = [r.expires for r in self.records.values()]
        times += [w.next_try for w in self.waiting.values() if w.seen != self._seen_version]
        times += [m.until for m in self._ruled.values()]
        return min(times, default=math.inf)

    def retry_now(self, group: str) -> bool:
        """Try to reserve ``group`` at once, whatever its waiting entry says (the
        defragmenter hands it room it freed, under the same lock); on the leader only.
        True when the group holds a reservation afterwards."""
        with self.cache.lock:
            if not self._rebuilt or not self.is_leader():
                return False
            self.waiting.pop(group, None)
            self.step(force=True)
            return group in self.records

    # ---- the keeper thread -----------------------------------------------------------------


    def forget(self, key: str) -> None:
        """The bind of ``key`` failed: drop its assumption and, for a group member, hold
        its room again at once (under the same lock, so no other pod takes it meanwhile;
        the room was the member's until the bind failed)."""
        with self.cache.lock:
            self.cache.forget(key)
            self.rehold(key)

    def rehold(self, key: str) -> None:
        """``key``'s assumption is gone (a failed bind): when it is a group member, its
        room is held again at once (call under the cache lock)."""
        with self.cache.lock:
            if self._rebuilt and any(key in r.pods.values() for r in self.records.values()):
                self._apply_holds()

    # ---- figures ---------------------------------------------------------------------------

    def figures(self) -> tuple[int, int, dict[str, int]]:
        """(active reservations, GPUs held for members not bound, waiting groups by reason)."""
        with self.cache.lock:
            gpus = sum(len(p.gpus) for hk, (req, p) in self.cache.holds().items()
                       if req.kind is RequestKind.WHOLE and is_reservation(hk))
            waiting = Counter(w.category for w in self.waiting.values())
            return len(self.records), gpus, dict(waiting)
