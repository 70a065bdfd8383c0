"""The reservation book's decisions as one pure function: ``reconcile(state, now)``.

Input (:class:`BookState`): the reservation records (what the API holds, plus the
leader's own writes), every group's pods as the cache counts them (bound or assumed
with their placement, or pending), the holds now counted for the records, the waiting
groups, and the cluster (a :class:`~packing.state.ClusterState` with the holds counted,
left exactly as it was). Output (:class:`GroupDecision`): records to write, records to
release (delete) and why, the new waiting and first-seen books, and the groups that
completed. A thin handler (:class:`scheduler.groups.loop.ReservationBook`) applies it, on
the leader only; nothing here does I/O, takes a lock or reads a clock.

Rules, per record (groups by priority, higher first, then first seen, then key):

* every pod of the group gone, or its leader pod deleted: released;
* every member bound and each bind confirmed by the watch (not only assumed: a Binding
  in flight may yet fail, and its room is held again only while a record names it):
  complete, released;
* expired (``now >= expires``) with members not bound: released, and the group waits
  so other groups get a turn (:func:`scheduler.groups.keys.expiry_wait`: longer after
  each expiry in a row, unless it gains member pods);
* members are matched to slots: the record's own pod names first; a bound member the
  record does not name goes to the slot whose room is on its node (bound members are
  the truth, wherever they are); a pending one to its worker index, else a free slot;
* a slot whose room could not be held (taken meanwhile, its node gone, the member
  grew), or whose pending member kube-scheduler lately refused that node to
  (``offered``), is placed again inside the group's domain; the slots still free are
  kept (a restart never drops a reservation just because one room went); when a lost
  room finds no new place, the reservation is released and the group waits, whole.

Then every group with pending pods and no record, in the same order, unless it waits:
the whole group is placed at once (:func:`packing.groups.placement.place_members`) or
waits holding nothing; a higher-priority group that does not fit may displace
lower-priority records none of whose members is bound. A group whole at fewer members
than it has (a PodGroup's ``minCount``, :attr:`packing.model.GroupRef.min_count`) that
does not fit whole is reserved for that minimum alone, if that fits: its record is the
minimum's, and the other members are placed beside it once it completes.

Rights (:mod:`scheduler.groups.rights`, judged by the handler): a refused group waits
(``no_rights``) holding nothing, and a record of a group refused for good (``never``)
is released; new placements and re-placed rooms use only the nodes ``allowed``; a
group's quota claims (ResourceQuotas, :mod:`scheduler.groups.namespace_cap`) must fit
in what is left after the groups reserved before it in the same pass, and are charged
when it is reserved; a group in ``not_exclusive`` is placed without exclusivity.

Past 600 lines as one module: the rules for existing records and for new groups (the
minimum's fallback included) act on one overlay of holds and one set of books in a
single pass, and the slot helpers here are what the handler and the participant share
with it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from kube.groups.reservations import ReservationRecord
from packing.groups.members import RESERVE_MARK, with_reservations
from packing.groups.placement import GroupFit, domain_of, effective_ref, place_members
from packing.model import GroupRef, Placement, PodRequest, Snapshot, exclusive_key
from packing.scoring import Scorer
from packing.state import ClusterState, NodeState
from packing.status import Status
from scheduler.groups.keys import Waiting, expiry_wait, hold_key, split_hold_key, wait_category
from scheduler.groups.namespace_cap import short_message

# Status.check of a room that changed under the reconciler while it placed a member.
ROOM_CHANGED = "RoomChanged"


@dataclass(frozen=True)
class Member:
    """A pod of a group: its request, and where it is counted (None: pending)."""

    req: PodRequest
    placement: Placement | None = None
    # Counted only because gpupack assumed it: its Binding may still fail.
    assumed: bool = False

    @property
    def bound(self) -> bool:
        """Counted on a node (bound, or its bind in flight): it takes its own room."""
        return self.placement is not None

    @property
    def confirmed(self) -> bool:
        """The watch shows it bound: no failed Binding can give its room back any more."""
        return self.placement is not None and not self.assumed


@dataclass(frozen=True)
class GroupSettings:
    ttl: float = 600.0
    retry_s: float = 1.0
    cooldown_s: float = 30.0
    max_backoff_s: float = 3600.0  # the longest wait after expiries in a row


@dataclass(frozen=True)
class BookState:
    records: Mapping[str, ReservationRecord]
    members: Mapping[str, Sequence[Member]]  # group key -> its pods
    holds: Mapping[str, tuple[PodRequest, Placement]]  # hold key -> what is counted
    waiting: Mapping[str, Waiting] = field(default_factory=dict)
    first_seen: Mapping[str, float] = field(default_factory=dict)
    revs: Mapping[str, int] = field(default_factory=dict)  # highest revision per group
    version: int = 0  # the cache's, for Waiting.due
    # Whether the group may use a node (its pods' selectors, affinity, tolerations...);
    # None: every node. Applied to new placements only.
    allowed: Callable[[str, str], bool] | None = None
    # Why a group cannot be reserved (scheduler.groups.rights): it waits with that reason
    # and holds nothing. Groups in ``never`` are refused for what they are (over their
    # quota's hard limit, bigger than allowed...): their record, if any, is released.
    refused: Mapping[str, str] = field(default_factory=dict)
    never: frozenset[str] = frozenset()
    sizes: Mapping[str, int] = field(default_factory=dict)  # group -> size from its rights
    # What each (quota, GPU resource) has left, and each group's claim on it: (the whole
    # group's demand, what its existing pods count already). A group is reserved only if
    # the rest of its claim fits in what is left after the groups reserved before it.
    quota_left: Mapping[tuple[str, str], int] = field(default_factory=dict)
    claims: Mapping[str, Mapping[tuple[str, str], tuple[int, int]]] = field(
        default_factory=dict)
    # Pending members kube-scheduler refused their room lately (pod key -> the only nodes
    # it offered for them since), for rules gpupack does not judge (pod anti-affinity, a
    # volume's zone, topology spread): a member's room on a node not offered is lost, and
    # no room of its group is placed on such a node.
    offered: Mapping[str, frozenset[str]] = field(default_factory=dict)
    not_exclusive: frozenset[str] = frozenset()  # exclusive pods, no LWS object saying so
    strikes: Mapping[str, int] = field(default_factory=dict)  # group -> expiries in a row


@dataclass(frozen=True)
class Release:
    group: str
    # complete | expired | leader_deleted | no_pods | room_lost | displaced | no_rights
    reason: str


@dataclass(frozen=True)
class GroupDecision:
    put: tuple[ReservationRecord, ...] = ()
    release: tuple[Release, ...] = ()
    waiting: Mapping[str, Waiting] = field(default_factory=dict)
    first_seen: Mapping[str, float] = field(default_factory=dict)
    completed: tuple[tuple[str, float], ...] = ()  # (group, seconds since first seen)
    strikes: Mapping[str, int] = field(default_factory=dict)


def order_key(rec: ReservationRecord) -> tuple[int, float, str]:
    return (-rec.priority, rec.first_seen, rec.group)


# ---- slots and holds (shared with the handler) ------------------------------------------------


def assign_slots(rec: ReservationRecord, members: Sequence[Member]) -> dict[int, Member]:
    """Which member fills which slot of the record (see the module docstring)."""
    by_key = {m.req.key: m for m in members}
    out: dict[int, Member] = {}
    for slot, key in sorted(rec.pods.items()):
        m = by_key.get(key)
        if m is not None and slot in rec.slots and m not in out.values():
            out[slot] = m
    rest = [m for m in sorted(members, key=lambda m: (not m.bound, m.req.key))
            if m not in out.values()]
    for m in rest:
        free = [s for s in sorted(rec.slots) if s not in out]
        if not free:
            break
        chosen: int | None = None
        if m.placement is not None:
            node = m.placement.node
            chosen = next((s for s in free if rec.slots[s].node == node), None)
        if chosen is None:
            idx = m.req.group.index if m.req.group is not None else -1
            chosen = idx if idx in free else free[0]
        out[chosen] = m
    return out


def template(members: Sequence[Member]) -> PodRequest | None:
    """The largest known member: the shape of the rooms held for pods not created yet."""
    if not members:
        return None
    return max((m.req for m in members),
               key=lambda p: (p.gpu_demand_milli, p.cpu_milli, p.memory_mib, p.key))


def record_ref(rec: ReservationRecord, shape: PodRequest) -> GroupRef:
    base = shape.group or GroupRef(key=rec.group, size=rec.size)
    return replace(base, size=rec.size, topology_key=rec.topology_key,
                   exclusive=rec.exclusive, index=0)


def wanted_group_holds(rec: ReservationRecord, members: Sequence[Member]
                 ) -> dict[str, tuple[PodRequest, Placement]]:
    """The holds a record asks for: one per slot whose member is not bound, shaped like
    its pending pod (else like the largest member), at the record's room."""
    shape = template(members)
    if shape is None:
        return {}
    ref = record_ref(rec, shape)
    assigned = assign_slots(rec, members)
    out: dict[str, tuple[PodRequest, Placement]] = {}
    for slot, room in sorted(rec.slots.items()):
        m = assigned.get(slot)
        if m is not None and m.bound:
            continue
        hk = hold_key(rec.group, slot)
        req = m.req if m is not None else shape
        out[hk] = (replace(req, key=hk, uid="", group=replace(ref, index=slot)),
                   replace(room, pod=hk))
    return out


# ---- a scratch copy of holds on the cluster -------------------------------------------------


class Overlay:
    """Holds taken off and put on ``state`` while deciding; :meth:`restore` puts the
    state back exactly as it was."""

    def __init__(self, state: ClusterState, holds: Mapping[str, tuple[PodRequest, Placement]]
                 ) -> None:
        self.state = state
        self.holds = dict(holds)  # what is counted now, as the decisions go
        self._log: list[tuple[bool, PodRequest, Placement]] = []  # (applied?, req, p)

    def drop_group(self, group: str) -> None:
        # Exact group, not a prefix: group "a" must not drop the holds of group
        # "a#reserve-1" (group names are not validated).
        for hk in [k for k in self.holds if (split_hold_key(k) or ("",))[0] == group]:
            req, p = self.holds.pop(hk)
            if p.node in self.state.nodes:
                self.state.undo(req, p)
                self._log.append((False, req, p))

    def hold(self, req: PodRequest, p: Placement) -> bool:
        if self.state.check(req, p) is not None:
            return False
        self.state.apply(req, p, allow_overcommit=True)
        self._log.append((True, req, p))
        self.holds[req.key] = (req, p)
        return True

    def restore(self) -> None:
        for applied, req, p in reversed(self._log):
            if applied:
                self.state.undo(req, p)
            else:
                self.state.apply(req, p, allow_overcommit=True)
        self._log.clear()


# ---- reconcile ------------------------------------------------------------------------------


def reconcile(state: BookState, cluster: ClusterState, scorer: Scorer, settings: GroupSettings,
              now: float) -> GroupDecision:
    """What the leader does now; ``cluster`` is left as it was."""
    overlay = Overlay(cluster, state.holds)
    try:
        return _Reconcile(state, overlay, scorer, settings, now).run()
    finally:
        overlay.restore()


class _Reconcile:
    def __init__(self, state: BookState, overlay: Overlay, scorer: Scorer, settings: GroupSettings,
                 now: float) -> None:
        self.s = state
        self.o = overlay
        self.scorer = scorer
        self.cfg = settings
        self.now = now
        self.records = dict(state.records)
        self.waiting = dict(state.waiting)
        self.first_seen = dict(state.first_seen)
        self.strikes = dict(state.strikes)
        self.put: dict[str, ReservationRecord] = {}
        self.release: list[Release] = []
        self.completed: list[tuple[str, float]] = []
        self.quota_left = dict(state.quota_left)

    def run(self) -> GroupDecision:
        members = self.s.members
        pending = {g for g, ms in members.items() if any(not m.bound for m in ms)}
        for g in pending:
            self.first_seen.setdefault(g, self.now)
        for rec in sorted(self.s.records.values(), key=order_key):
            self._keep_or_release(rec, members.get(rec.group, ()))
        for g in pending:  # a record complete at its minimum leaves members pending
            self.first_seen.setdefault(g, self.now)
        for g in list(self.waiting):
            if g not in pending and g not in self.records:
                del self.waiting[g]
        for g in list(self.first_seen):
            if g not in pending and g not in self.records:
                del self.first_seen[g]
        for g in list(self.strikes):
            if g not in members:
                del self.strikes[g]  # its pods are gone: a new group starts afresh
        order = sorted((g for g in pending if g not in self.records),
                       key=lambda g: (-max(m.req.priority for m in members[g]),
                                      self.first_seen[g], g))
        for g in order:
            w = self.waiting.get(g)
            if w is not None and not w.due(self.now, self.s.version) and not w.grew(
                    min(len(members[g]), self.s.sizes.get(g, len(members[g])))):
                continue
            self._attempt(g, members[g])
        return GroupDecision(tuple(self.put.values()), tuple(self.release), self.waiting,
                        self.first_seen, tuple(self.completed), self.strikes)

    # ---- existing records ------------------------------------------------------------------

    def _drop(self, group: str, reason: str) -> None:
        self.o.drop_group(group)
        self.records.pop(group, None)
        self.put.pop(group, None)
        self.release.append(Release(group, reason))

    def _keep_or_release(self, rec: ReservationRecord, members: Sequence[Member]) -> None:
        g = rec.group
        if not members:
            self._drop(g, "no_pods")
            return
        if g in self.s.never:
            self._drop(g, "no_rights")
            self.waiting[g] = Waiting(
                f"group {g} waits, holding nothing: {self.s.refused.get(g, 'no rights')}",
                "no_rights", self.now + max(self.cfg.retry_s, 1.0))
            return
        leader = rec.pods.get(0)
        if leader is not None and all(m.req.key != leader for m in members):
            self._drop(g, "leader_deleted")
            return
        assigned = assign_slots(rec, members)
        all_bound = all(s in assigned and assigned[s].bound for s in rec.slots)
        if all_bound and all(assigned[s].confirmed for s in rec.slots):
            self._drop(g, "complete")
            self.completed.append((g, max(0.0, self.now - rec.first_seen)))
            self.first_seen.pop(g, None)
            self.strikes.pop(g, None)
            return
        # Every member bound but some Binding still in flight: not complete yet, and not
        # expired either. The record stays until the watch confirms each bind, so a bind
        # that fails has its room held again (ReservationBook.forget needs a record that
        # names the pod); released now, the group would be left half placed.
        if not all_bound and self.now >= rec.expires:
            self._drop(g, "expired")
            strikes = self.strikes[g] = self.strikes.get(g, 0) + 1
            self.waiting[g] = expiry_wait(g, strikes, min(len(members), rec.size), self.now,
                                          self.cfg.ttl, self.cfg.cooldown_s,
                                          self.cfg.max_backoff_s)
            return
        slots = dict(rec.slots)
        for slot, m in assigned.items():
            if m.placement is not None:  # bound members are the truth, wherever they are
                slots[slot] = replace(m.placement, pod="")
        wanted = wanted_group_holds(replace(rec, slots=slots), members)
        lost = [hk for hk, (req, p) in wanted.items() if not _counted_as(self.o.holds.get(hk),
                                                                          req, p)]
        lost += [hk for hk in self._ruled_out_rooms(g, slots, assigned)
                 if hk in wanted and hk not in lost]
        if lost:
            placed = self._replace_rooms(rec, wanted, lost)
            if isinstance(placed, Status):
                self._drop(g, "room_lost")
                self.waiting[g] = Waiting(f"group {g} waits whole, holding nothing: {placed}",
                                          wait_category(placed), self.now + self.cfg.retry_s)
                return
            slots.update(placed)
        pods = {s: m.req.key for s, m in assigned.items()}
        if slots != dict(rec.slots) or pods != dict(rec.pods):
            new = replace(rec, slots=slots, pods=pods, rev=rec.rev + 1)
            self.records[g] = self.put[g] = new

    def _ruled_out_rooms(self, g: str, slots: Mapping[int, Placement],
                         assigned: Mapping[int, Member]) -> list[str]:
        """Holds of pending members whose room is on a node kube-scheduler ruled out for
        them: the member cannot take it, so it is lost (placed again elsewhere)."""
        return [hold_key(g, slot) for slot, m in sorted(assigned.items())
                if not m.bound and slot in slots and m.req.key in self.s.offered
                and slots[slot].node not in self.s.offered[m.req.key]]

    def _replace_rooms(self, rec: ReservationRecord,
                       wanted: Mapping[str, tuple[PodRequest, Placement]], lost: Sequence[str]
                       ) -> dict[int, Placement] | Status:
        """New rooms for the lost slots, inside the record's domain; the other holds stay."""
        # Holds of this group that are counted but no longer wanted as they are go first.
        for hk in lost:
            if hk in self.o.holds:
                req, p = self.o.holds.pop(hk)
                if p.node in self.o.state.nodes:
                    self.o.state.undo(req, p)
                    self.o._log.append((False, req, p))
        reqs = [wanted[hk][0] for hk in lost]
        taken = self._taken(rec.group)
        domain = rec.domain if rec.topology_key is not None else None
        hidden = self._hide_forbidden(rec.group)
        try:
            got = place_members(self.o.state, reqs, self.scorer, taken, domain)
        finally:
            hidden.restore()
        if isinstance(got, Status):
            return got
        placements, _ = got
        out: dict[int, Placement] = {}
        for req, p in zip(reqs, placements, strict=True):
            assert req.group is not None
            if not self.o.hold(req, p):
                return Status.unschedulable(
                    ROOM_CHANGED, f"room for member {req.group.index} changed while placing it")
            out[req.group.index] = replace(p, pod="")
        return out

    # ---- new groups ------------------------------------------------------------------------

    def _taken(self, group: str) -> set[tuple[str, str]]:
        """Exclusive topology domains other groups use (their records, and bound members
        of groups without one)."""
        taken: set[tuple[str, str]] = set()
        for g, rec in self.records.items():
            if g != group and rec.exclusive and rec.topology_key and rec.domain is not None:
                taken.add((exclusive_key(g, rec.topology_key), rec.domain))
        for g, ms in self.s.members.items():
            if g == group or g in self.records or g in self.s.not_exclusive:
                continue
            for m in ms:
                ref = m.req.group
                if m.placement is not None and ref is not None and ref.exclusive \
                        and ref.topology_key is not None:
                    value = domain_of(self.o.state, ref, m.placement.node)
                    if value is not None:
                        taken.add((ref.exclusive_key, value))
        return taken

    def _attempt(self, g: str, members: Sequence[Member]) -> None:
        why = self.s.refused.get(g)
        if why is not None:
            self.waiting[g] = Waiting(f"group {g} waits, holding nothing: {why}", "no_rights",
                                      self.now + max(self.cfg.retry_s, 1.0))
            return
        short = self._quota_short(g)
        if short is not None:
            self.waiting[g] = Waiting(f"group {g} waits, holding nothing: {short}", "no_rights",
                                      self.now + max(self.cfg.retry_s, 1.0))
            return
        ref, slots, to_place, domain = group_slots(self.o.state, g, members,
                                                   self.s.sizes.get(g))
        if ref.exclusive and g in self.s.not_exclusive:
            # Its pods' exclusive placement is not its LeaderWorkerSet's: placed without.
            ref = replace(ref, exclusive=False)
            to_place = [replace(p, group=replace(p.group, exclusive=False))
                        if p.group is not None else p for p in to_place]
        taken = self._taken(g)
        prio = max(m.req.priority for m in members)
        hidden = self._hide_forbidden(g)
        try:
            got = place_members(self.o.state, to_place, self.scorer, taken, domain)
            displaced: list[str] = []
            if isinstance(got, Status):
                displaced, got = self._displace(to_place, taken, domain, prio, got)
            if isinstance(got, Status):
                smaller = self._at_minimum(g, members, ref, taken)
                if smaller is not None:
                    ref, slots, to_place, domain, got = smaller
        finally:
            hidden.restore()
        if isinstance(got, Status):
            self.waiting[g] = Waiting(f"group {g} waits whole, holding nothing: {got}",
                                      wait_category(got), self.now + self.cfg.retry_s)
            return
        for d in displaced:
            self._drop(d, "displaced")
            self.waiting[d] = Waiting(
                f"group {d} waits whole: its reservation went to higher-priority group {g}",
                "displaced", self.now + self.cfg.retry_s, None)
        placements, value = got
        room = {req.group.index: replace(p, pod="")
                for req, p in zip(to_place, placements, strict=True) if req.group is not None}
        for s, m in slots.items():
            if m.placement is not None:
                room[s] = replace(m.placement, pod="")
        rec = ReservationRecord(
            group=g, size=ref.size, priority=prio, topology_key=ref.topology_key,
            exclusive=ref.exclusive, domain=value, first_seen=self.first_seen.get(g, self.now),
            expires=self.now + self.cfg.ttl, rev=self.s.revs.get(g, 0) + 1,
            slots=room, pods={s: m.req.key for s, m in slots.items()})
        for hk, (req, p) in wanted_group_holds(rec, members).items():
            if not self.o.hold(req, p):  # cannot happen: placed on this very state just now
                self.o.drop_group(g)
                self.waiting[g] = Waiting(f"group {g} waits whole: room changed while "
                                          f"reserving ({hk})", "other",
                                          self.now + self.cfg.retry_s)
                return
        self.records[g] = self.put[g] = rec
        self.waiting.pop(g, None)
        for qk, (total, existing) in self.s.claims.get(g, {}).items():
            if qk in self.quota_left:
                self.quota_left[qk] -= total - existing

    def _at_minimum(self, g: str, members: Sequence[Member], ref: GroupRef,
                    taken: set[tuple[str, str]]
                    ) -> tuple[GroupRef, dict[int, Member], list[PodRequest], str | None,
                               GroupFit] | None:
        """When the whole group does not fit but it is whole at fewer members (a
        PodGroup's ``minCount``, below the pods naming it): room for that minimum alone,
        its bound members first, then its pending ones by worker index, then rooms for
        pods not created yet. The record is then that minimum's (the others wait until
        it completes, and are then placed beside it). None: no smaller group, or it does
        not fit either."""
        need = ref.min_count
        bound = [m for m in members if m.bound]
        if need >= ref.size or len(bound) >= need:
            return None
        pending = sorted((m for m in members if not m.bound),
                         key=lambda m: (m.req.group.index if m.req.group else 0, m.req.key))
        sub_ref, slots, to_place, domain = group_slots(
            self.o.state, g, bound + pending[:need - len(bound)], need)
        got = place_members(self.o.state, to_place, self.scorer, taken, domain)
        if isinstance(got, Status):
            return None
        return sub_ref, slots, to_place, domain, got

    def _quota_short(self, g: str) -> str | None:
        """Why the rest of the group's quota claim does not fit in what is left now."""
        for (quota, res), (total, existing) in sorted(self.s.claims.get(g, {}).items()):
            left = self.quota_left.get((quota, res))
            if left is not None and total - existing > left:
                return short_message(quota, res, left, total - existing)
        return None

    def _hide_forbidden(self, group: str) -> HiddenNodes:
        """Nodes the group has no right to, and those kube-scheduler ruled out for any of
        its members lately, out of the cluster while it is placed."""
        offered = [self.s.offered[m.req.key] for m in self.s.members.get(group, ())
                   if m.req.key in self.s.offered]
        ruled = [n for n in self.o.state.nodes if any(n not in o for o in offered)]
        return HiddenNodes(self.o.state, self.s.allowed, group, ruled)

    def _displace(self, members: Sequence[PodRequest], taken: set[tuple[str, str]],
                  domain: str | None, prio: int, reason: Status,
                  ) -> tuple[list[str], GroupFit | Status]:
        """Lower-priority records with no member bound give way, lowest first."""
        cands = sorted(
            (r for r in self.records.values() if r.priority < prio and not any(
                m.bound for m in self.s.members.get(r.group, ()))),
            key=lambda r: (r.priority, -r.first_seen, r.group))
        scratch = Overlay(self.o.state, self.o.holds)
        used: list[str] = []
        try:
            for r in cands:
                scratch.drop_group(r.group)
                used.append(r.group)
                got = place_members(self.o.state, members, self.scorer, taken, domain)
                if not isinstance(got, Status):
                    return used, got
        finally:
            scratch.restore()
        return [], reason


def _counted_as(held: tuple[PodRequest, Placement] | None, req: PodRequest, p: Placement
                ) -> bool:
    """Whether the hold counted now is the one wanted (a MIG slice counted as existing
    rather than created is the same room)."""
    return held is not None and held[0] == req and held[1].node == p.node \
        and held[1].gpus == p.gpus and held[1].mig_start == p.mig_start


class HiddenNodes:
    """Takes the nodes a group may not use out of ``state.nodes`` until :meth:`restore`."""

    def __init__(self, state: ClusterState, allowed: Callable[[str, str], bool] | None,
                 group: str, excluded: Collection[str] = ()) -> None:
        self.state = state
        self.removed: dict[str, NodeState] = {}
        for name in [n for n in excluded if n in state.nodes]:
            self.removed[name] = state.nodes.pop(name)
        if allowed is None:
            return
        for name in list(state.nodes):
            if not allowed(group, name):
                self.removed[name] = state.nodes.pop(name)

    def restore(self) -> None:
        self.state.nodes.update(self.removed)
        self.removed.clear()


def group_slots(state: ClusterState, g: str, members: Sequence[Member], size: int | None = None
                ) -> tuple[GroupRef, dict[int, Member], list[PodRequest], str | None]:
    """A group without a record, made ready to place: its reference (topology resolved),
    a slot per known member (bound ones first), the members still to place (pending
    pods and a room for each pod not created yet, keyed by hold key), and the domain its
    bound members already fix. ``size``: the group's size as its rights say
    (:mod:`scheduler.groups.rights`: the LeaderWorkerSet object's), else the first
    member's."""
    pending = [m.req for m in members if not m.bound]
    bound = [m for m in members if m.bound]
    first = (pending or [m.req for m in members])[0]
    base = first.group or GroupRef(key=g, size=1)
    ref = effective_ref(state, replace(base, size=size) if size else base)
    slots: dict[int, Member] = {}
    for m in sorted(bound, key=lambda m: m.req.key) + [Member(p) for p in pending]:
        idx = m.req.group.index if m.req.group is not None else 0
        if idx in slots or idx >= ref.size:
            idx = next((s for s in range(ref.size) if s not in slots), -1)
        if idx >= 0:
            slots[idx] = m
    norm = {s: replace(m.req, key=hold_key(g, s), uid="", group=replace(ref, index=s))
            for s, m in slots.items()}
    full = with_reservations(Snapshot(
        nodes=(),
        running=tuple((norm[s], Placement(norm[s].key, "")) for s, m in slots.items()
                      if m.bound),
        pending=tuple(norm[s] for s, m in slots.items() if not m.bound)))
    domain = None
    if ref.topology_key is not None:
        nodes = sorted(m.placement.node for m in bound if m.placement is not None)
        domain = next((domain_of(state, ref, n) for n in nodes), None)
    return ref, slots, list(full.pending), domain


def members_of(pods: Iterable[tuple[PodRequest, Placement | None]],
               assumed: Container[str] = frozenset()) -> dict[str, list[Member]]:
    """Group key -> members, from (request, counted placement or None) pairs; ``assumed``:
    the pods counted only because their bind is in flight."""
    out: dict[str, list[Member]] = {}
    for req, p in pods:
        if req.group is not None and RESERVE_MARK not in req.key:
            member = Member(req, p, p is not None and req.key in assumed)
            out.setdefault(req.group.key, []).append(member)
    return out
