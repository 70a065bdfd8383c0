"""LLM leader/worker groups in the extender: whole-group reservations.

When the first pod of a group (LeaderWorkerSet, or ``gpupack.io/group`` +
``group-size``) is seen pending, the :class:`ReservationBook` places the *whole* group at
once: the known members plus a reservation member for every pod not created yet
(:func:`packing.groups.with_reservations`), all inside one domain of the topology key
(the LWS ``exclusive-topology`` annotation, else ``nvidia.com/gpu.clique`` when nodes
carry it), one group per domain when exclusive. The room is then *held*: every member
not bound yet is counted in the cache under a synthetic key ``<group>#reserve-<slot>``
(:meth:`ClusterCache.hold`), so filter, prioritize, bind and the planner see those GPUs
as taken, and no other pod (a small one included) can get them.
If the group does not fit, its pods are rejected saying so and nothing is held.

Members are steered to their room: filter keeps only the reserved node, prioritize gives
it 10, bind swaps the member's hold for the pod itself at the reserved GPUs (under the
cache lock, so nothing can slip in between).

Release: a reservation whose members are not all bound within ``ttl`` seconds is
released (and the group waits ``ttl`` before it may reserve again, so others get a
turn); a group whose leader pod is deleted is released at once; a reservation whose
room is no longer free (its node went away) or whose pods turn out larger than the room
is released and the group placed again.

No deadlock: groups are considered whole, in order of priority (higher first), then of
first sight (older first). A group either gets all its room or none, so two groups that
together do not fit never both hold part: the first reserves whole, the other waits
whole. A higher-priority group that does not fit may displace lower-priority
reservations none of whose members is bound yet (those wait again, whole).

Restart: every reservation is written to the API (``gpupack.io/reservation`` on the
leader, by a JSON merge patch from a background writer, and on each member's Binding);
on start the book reads them back from the cache's pods and holds the room of every
member not bound yet, after checking it is still free (see :mod:`kube.reservations`
for why an annotation). A record that is unreadable, expired, or whose room is taken
is logged and ignored, and the group is placed afresh.

Everything runs under the cache lock: :meth:`ReservationBook.sync` is a view hook of
the cache (run at every verb and planner snapshot), and does real work only when the
cache changed or a deadline passed. The clock is injected (wall-clock seconds, since
expiries are written to the API and must survive a restart).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kube import annotations as A
from kube.reservations import RESERVATION, ReservationError, ReservationRecord, decode, encode
from packing.group_solver import GroupSolverParams, applicable, solve_group
from packing.groups import RESERVE_MARK, is_reservation, with_reservations
from packing.model import GroupRef, Placement, PodRequest, RequestKind, Snapshot
from packing.policies.greedy import Scorer, best_option, topology_domains
from packing.policies.scores import bestfit
from packing.state import ClusterState
from scheduler.cache import AssumeError, ClusterCache
from scheduler.verbs import read_pod
from scheduler.wire import (
    MAX_PRIORITY,
    ExtenderArgs,
    FilterResult,
    HostPriority,
    MetaVictims,
    PreemptionArgs,
    PreemptionResult,
)

log = logging.getLogger("gpupack.scheduler.groups")

Clock = Callable[[], float]
DEFAULT_TTL = 600.0
# Bounded reasons of gpupack_groups_waiting.
WAIT_REASONS = ("no_room", "no_domain", "exclusive_taken", "expired", "displaced", "other")


def hold_key(group: str, slot: int) -> str:
    return f"{group}{RESERVE_MARK}{slot}"


def wait_category(reason: str) -> str:
    r = reason.lower()
    if "carries the topology label" in r:
        return "no_domain"
    if "exclusive" in r and "taken" in r:
        return "exclusive_taken"
    if "fit" in r:
        return "no_room"
    return "other"


def looks_grouped(pod: Mapping[str, Any]) -> bool:
    """Cheap pre-check on a raw pod: could it be a group member at all?"""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    if not isinstance(meta, Mapping):
        return False
    labels = meta.get("labels")
    ann = meta.get("annotations")
    return (isinstance(labels, Mapping) and A.LWS_NAME in labels) or (
        isinstance(ann, Mapping) and A.GROUP in ann
    )


# ---- pure placement -----------------------------------------------------------------------


def effective_ref(state: ClusterState, ref: GroupRef) -> GroupRef:
    """The group's topology: its own key, else the NVLink clique label when nodes carry it."""
    if ref.topology_key is not None:
        return ref
    if any(A.CLIQUE in n.info.labels for n in state.nodes.values()):
        return replace(ref, topology_key=A.CLIQUE)
    return ref


def domain_of(state: ClusterState, ref: GroupRef, node: str) -> str | None:
    if ref.topology_key is None or node not in state.nodes:
        return None
    return state.nodes[node].info.labels.get(ref.topology_key)


def place_members(
    state: ClusterState,
    members: Sequence[PodRequest],
    scorer: Scorer,
    taken: set[tuple[str, str]],
    domain: str | None = None,
    solver_params: GroupSolverParams | None = None,
    exact: bool = True,
) -> tuple[list[Placement], str | None] | str:
    """Place every member inside one topology domain, or none; ``state`` is left as it
    was. Returns (placements in the order of ``members``, domain) or the reason it does
    not fit.

    ``domain``: only that domain (a group some of whose members are already bound).
    Whole-GPU groups are solved with CP-SAT (:func:`packing.group_solver.solve_group`:
    the domain and nodes best for the whole group); others, or when the solver has no
    answer in time, member by member in the first domain that takes them all.
    ``exact=False``: greedy only (whether a group fits, asked many times over by the
    preemption search, where the best layout does not matter).
    """
    ref = members[0].group
    assert ref is not None
    ordered = sorted(members, key=lambda p: (-p.gpu_demand_milli, p.group.index if p.group else 0))
    domains = topology_domains(state, ref)
    if not domains or not any(domains):
        return f"no node carries the topology label {ref.topology_key}"
    skipped = 0
    eligible: list[tuple[list[str], str | None]] = []
    for nodes in domains:
        value = domain_of(state, ref, nodes[0])
        if domain is not None and value != domain:
            continue
        if ref.exclusive and ref.topology_key is not None and (ref.topology_key, value) in taken:
            skipped += 1
            continue
        eligible.append((nodes, value))
    if exact and applicable(members) and eligible:
        # Whole-GPU groups: CP-SAT picks the domain and every member's node together
        # (packing/group_solver.py); greedy below when it has no answer in time.
        solved = solve_group(state, members, [nodes for nodes, _ in eligible], solver_params)
        if solved.placements is not None and solved.domain is not None:
            return list(solved.placements), eligible[solved.domain][1]
        # INFEASIBLE: the greedy pass below fails too and says how close it came.
    found = _greedy_in(state, ordered, scorer, eligible)
    if not isinstance(found, int):
        placements, value = found
        by_key = {p.pod: p for p in placements}
        return [by_key[m.key] for m in members], value
    return _no_fit(ref, members, domain, skipped, len(domains), found)


def _greedy_in(
    state: ClusterState, ordered: Sequence[PodRequest], scorer: Scorer,
    eligible: Sequence[tuple[list[str], str | None]],
) -> tuple[list[Placement], str | None] | int:
    """Member by member, largest first, in the first domain that takes them all (as
    :func:`packing.policies.greedy.place_group`); else the most members any domain
    took. ``state`` is left as it was."""
    best_fit = 0
    for nodes, value in eligible:
        done: list[tuple[PodRequest, Placement]] = []
        for pod in ordered:
            choice = best_option(state, pod, scorer, nodes)
            if choice is None:
                break
            state.apply(pod, choice)
            done.append((pod, choice))
        for pod, p in reversed(done):
            state.undo(pod, p)
        if len(done) == len(ordered):
            return [p for _, p in done], value
        best_fit = max(best_fit, len(done))
    return best_fit


def _no_fit(ref: GroupRef, members: Sequence[PodRequest], domain: str | None, skipped: int,
            n_domains: int, best_fit: int) -> str:
    if skipped and skipped == n_domains:
        return f"every {ref.topology_key} domain is taken by another exclusive group"
    where = f"any {ref.topology_key} domain" if ref.topology_key else "the cluster"
    if domain is not None:
        where = f"{ref.topology_key}={domain}, where its bound members are"
    return (f"the whole group of {ref.size} does not fit in {where} "
            f"(at most {best_fit} of the {len(members)} members still to place fit)")


@dataclass(frozen=True)
class Candidate:
    """A pod that could be evicted: its request and where it is counted."""

    uid: str
    req: PodRequest
    placement: Placement


def group_victims(
    state: ClusterState,
    members: Sequence[PodRequest],
    scorer: Scorer,
    candidates: Iterable[Candidate],
    taken: set[tuple[str, str]],
) -> list[Candidate] | None:
    """The fewest lower-priority pods whose eviction lets the whole group fit in one
    domain (then the lowest total priority); None when no domain works. ``state`` is
    left exactly as it was."""
    ref = members[0].group
    assert ref is not None
    prio = max(m.priority for m in members)
    usable = [c for c in candidates if c.req.priority < prio and not is_reservation(c.req.key)]
    best: list[Candidate] | None = None
    for nodes in topology_domains(state, ref):
        value = domain_of(state, ref, nodes[0])
        if ref.exclusive and ref.topology_key is not None and (ref.topology_key, value) in taken:
            continue
        names = set(nodes)
        inside = [c for c in usable if c.placement.node in names]
        per_node = Counter(c.placement.node for c in inside)
        # Lowest priority first; then nodes with the fewest pods to evict (an emptied
        # node is what a whole-GPU member needs), a node's pods together.
        local = sorted(inside, key=lambda c: (
            c.req.priority, per_node[c.placement.node], c.placement.node, c.req.key))
        chosen = _victims_in(state, members, scorer, taken, value, local)
        if chosen is None:
            continue
        rank = (len(chosen), sum(c.req.priority for c in chosen))
        if best is None or rank < (len(best), sum(c.req.priority for c in best)):
            best = chosen
    return best


def _victims_in(
    state: ClusterState, members: Sequence[PodRequest], scorer: Scorer,
    taken: set[tuple[str, str]], domain: str | None, ordered: Sequence[Candidate],
) -> list[Candidate] | None:
    removed: list[Candidate] = []
    try:
        fits = not isinstance(place_members(state, members, scorer, taken, domain,
                                                exact=False), str)
        for c in ordered:
            if fits:
                break
            state.undo(c.req, c.placement)
            removed.append(c)
            fits = not isinstance(place_members(state, members, scorer, taken, domain,
                                                exact=False), str)
        if not fits:
            return None
        # Keep back every victim the group turns out not to need (highest priority first).
        for c in sorted(removed, key=lambda c: -c.req.priority):
            state.apply(c.req, c.placement, allow_overcommit=True)
            if isinstance(place_members(state, members, scorer, taken, domain,
                                        exact=False), str):
                state.undo(c.req, c.placement)
            else:
                removed.remove(c)
        return list(removed)
    finally:
        for c in removed:
            state.apply(c.req, c.placement, allow_overcommit=True)


# ---- the book -----------------------------------------------------------------------------


@dataclass
class Reservation:
    """Room held for one group: a placement per member slot."""

    group: str
    ref: GroupRef  # effective: topology key resolved
    priority: int
    slots: dict[int, Placement]  # slot -> placement (pod = hold key)
    reqs: dict[int, PodRequest]  # slot -> request held (key = hold key)
    first_seen: float
    expires: float
    domain: str | None = None
    pods: dict[str, int] = field(default_factory=dict)  # member pod key -> slot
    rev: int = 1

    @property
    def size(self) -> int:
        return self.ref.size

    def pod_of(self, slot: int) -> str | None:
        for k, s in self.pods.items():
            if s == slot:
                return k
        return None

    @property
    def leader(self) -> str | None:
        return self.pod_of(0)

    @property
    def anchor(self) -> str | None:
        """The pod that carries the annotation: the leader, else the first known member."""
        if not self.pods:
            return None
        return self.leader or min(self.pods, key=lambda k: (self.pods[k], k))

    def record(self) -> ReservationRecord:
        return ReservationRecord(
            group=self.group, size=self.size, priority=self.priority,
            topology_key=self.ref.topology_key, exclusive=self.ref.exclusive,
            domain=self.domain, first_seen=self.first_seen, expires=self.expires,
            rev=self.rev,
            slots={s: replace(p, pod="") for s, p in self.slots.items()},
            pods={s: k for k, s in self.pods.items()},
        )


@dataclass
class Waiting:
    reason: str  # for people
    category: str  # one of WAIT_REASONS
    next_try: float
    # Cache version when the attempt failed: a group that did not fit is tried again only
    # once the cluster changed (-1: set at the end of this sync; None: time alone).
    seen: int | None = -1

    def due(self, now: float, version: int) -> bool:
        return now >= self.next_try and self.seen != version


class Submitter:
    """Where annotation writes go (kube.reservations.ReservationWriter); a no-op here."""

    def submit(self, pod: str, text: str | None) -> None:
        del pod, text


class ReservationBook:
    """Reservations of whole groups, held in the cache; see the module docstring."""

    def __init__(
        self,
        cache: ClusterCache,
        ttl: float = DEFAULT_TTL,
        clock: Clock = time.time,
        writer: Any = None,
        scorer: Callable[[], Scorer] | None = None,
        retry_s: float = 1.0,
        cooldown_s: float = 30.0,
    ) -> None:
        self.cache = cache
        self.ttl = ttl
        self.clock = clock
        self.writer = writer if writer is not None else Submitter()
        self.scorer = scorer or (lambda: bestfit)
        self.retry_s = retry_s
        self.cooldown_s = cooldown_s  # an expired group waits this long before reserving again
        self.reservations: dict[str, Reservation] = {}
        self.waiting: dict[str, Waiting] = {}
        self.first_seen: dict[str, float] = {}
        self.released: Counter[str] = Counter()  # reason -> count
        self.on_complete: Callable[[float], None] | None = None
        self._notes: dict[str, str] = {}  # pod key -> reservation annotation text
        self._rebuilt = False
        self._busy = False
        self._seen_version = -1
        self._next_due = -math.inf
        cache.add_view_hook(self.sync)
        cache.add_pending_filter(self.held_members)

    def held_members(self) -> set[str]:
        """Member pods whose room a reservation holds (under the lock). The cache leaves
        them out of the planner's snapshot: their room is already counted as taken, and
        planning them again would count it twice."""
        return {k for r in self.reservations.values() for k in r.pods}

    # ---- notes from the watch (kube.reservations.ReservationTap) ---------------------------

    def note(self, pod: str, text: str | None) -> None:
        with self.cache.lock:
            if text is None:
                self._notes.pop(pod, None)
            else:
                self._notes[pod] = text

    def pod_deleted(self, pod: str) -> None:
        """A deleted leader releases its group at once."""
        with self.cache.lock:
            for r in list(self.reservations.values()):
                if r.leader == pod:
                    self._release(r, "leader_deleted", write=False)

    # ---- sync ------------------------------------------------------------------------------

    def sync(self) -> None:
        """Bring reservations in line with the cache (a view hook: under the lock)."""
        if self._busy:
            return
        with self.cache.lock:
            now = self.clock()
            if self.cache.version == self._seen_version and now < self._next_due:
                return
            self._busy = True
            try:
                self._sync(now)
            finally:
                self._busy = False
                self._seen_version = self.cache.version
                for w in self.waiting.values():
                    if w.seen == -1:
                        w.seen = self._seen_version
                self._next_due = self._due()

    def _due(self) -> float:
        times = [r.expires for r in self.reservations.values()]
        times += [w.next_try for w in self.waiting.values() if w.seen != self._seen_version]
        return min(times, default=math.inf)

    def _running(self) -> tuple[tuple[PodRequest, Placement], ...]:
        """Counted pods (bound, assumed, held) without re-entering :meth:`sync`."""
        busy, self._busy = self._busy, True
        try:
            return self.cache.snapshot().running
        finally:
            self._busy = busy

    def _pending_groups(self) -> dict[str, list[PodRequest]]:
        out: dict[str, list[PodRequest]] = defaultdict(list)
        for p in self.cache.pending():
            if p.group is not None:
                out[p.group.key].append(p)
        return out

    def _sync(self, now: float) -> None:
        if not self.cache.synced:
            return  # nothing is placed before the first full list (and the rebuild)
        if not self._rebuilt:
            self._rebuilt = True
            self._rebuild(now)
        pending = self._pending_groups()
        for key in pending:
            self.first_seen.setdefault(key, now)
        for r in list(self.reservations.values()):
            self._reconcile(r, pending.get(r.group, []), now)
        for key in list(self.waiting):
            if key not in pending and key not in self.reservations:
                del self.waiting[key]
        for key in list(self.first_seen):
            if key not in pending and key not in self.reservations:
                del self.first_seen[key]
        order = sorted(
            (k for k in pending if k not in self.reservations),
            key=lambda k: (-max(p.priority for p in pending[k]), self.first_seen[k], k),
        )
        for key in order:
            w = self.waiting.get(key)
            if w is not None and not w.due(now, self.cache.version):
                continue
            self._attempt(key, pending[key], now)

    def _reconcile(self, r: Reservation, pending: Sequence[PodRequest], now: float) -> None:
        cache = self.cache
        leader = r.leader
        if leader is not None and cache.pod_entry(leader) is None:
            self._release(r, "leader_deleted", write=False)
            return
        if now >= r.expires:
            log.info("reservation of group %s expired before all members were bound", r.group)
            self._release(r, "expired")
            self.waiting[r.group] = Waiting(
                f"group {r.group} waits whole: its reservation expired after {self.ttl:.0f}s "
                "without all members bound; other groups go first", "expired",
                now + self.cooldown_s, None)
            return
        changed = False
        for k in [k for k in r.pods if k != leader and cache.pod_entry(k) is None]:
            del r.pods[k]  # a worker deleted before it was bound: its slot is held again
            changed = True
        for p in pending:
            if p.key not in r.pods:
                slot = self._free_slot(r, p)
                if slot is None:
                    continue  # more pods than the group's size: not ours to place
                r.pods[p.key] = slot
                changed = True
            slot = r.pods[p.key]
            if not self._fit_slot(r, slot, p):
                log.info("group %s: pod %s does not fit its reserved room; placing the group "
                         "again", r.group, p.key)
                self._release(r, "shape_changed")
                return
        bound = 0
        for slot, placement in r.slots.items():
            hk = hold_key(r.group, slot)
            pod = r.pod_of(slot)
            if pod is not None and cache.counted(pod) is not None:
                cache.unhold(hk)
                bound += 1
                continue
            if cache.counted(hk) is None:
                why = cache.hold(r.reqs[slot], placement)
                if why is not None:
                    log.info("group %s: reserved room of member %d is gone (%s); placing the "
                             "group again", r.group, slot, why)
                    self._release(r, "room_lost")
                    return
        if bound == len(r.slots):
            del self.reservations[r.group]
            self.first_seen.pop(r.group, None)
            if self.on_complete is not None:
                self.on_complete(max(0.0, now - r.first_seen))
            self._write(r, remove=True)
            log.info("group %s complete: all %d members bound", r.group, r.size)
        elif changed:
            r.rev += 1
            self._write(r)

    def _free_slot(self, r: Reservation, pod: PodRequest) -> int | None:
        used = set(r.pods.values())
        assert pod.group is not None
        if pod.group.index < r.size and pod.group.index not in used:
            return pod.group.index
        return next((s for s in range(r.size) if s not in used), None)

    def _fit_slot(self, r: Reservation, slot: int, pod: PodRequest) -> bool:
        """Does the real pod fit the room held for its slot? Holds the pod's own shape."""
        held = r.reqs[slot]
        mine = replace(pod, key=held.key, uid="", group=held.group)
        if mine == held:
            return True
        hk = held.key
        state = self.cache.state
        was_held = self.cache.counted(hk) is not None
        if was_held:
            self.cache.unhold(hk)
        why = state.check(mine, r.slots[slot])
        if why is None:
            r.reqs[slot] = mine
        if was_held:
            self.cache.hold(r.reqs[slot], r.slots[slot])
        return why is None

    def _release(self, r: Reservation, reason: str, *, write: bool = True) -> None:
        for slot in r.slots:
            self.cache.unhold(hold_key(r.group, slot))
        self.reservations.pop(r.group, None)
        self.released[reason] += 1
        if write:
            self._write(r, remove=True)
        log.info("released the reservation of group %s (%s)", r.group, reason)

    def _write(self, r: Reservation, *, remove: bool = False) -> None:
        anchor = r.anchor
        if anchor is None:
            return
        self.writer.submit(anchor, None if remove else encode(r.record()))

    # ---- placing ---------------------------------------------------------------------------

    def _members(self, key: str, pending: Sequence[PodRequest]) -> tuple[
        GroupRef, dict[int, str], list[PodRequest], list[PodRequest], set[tuple[str, str]]
    ]:
        """The group's slots: bound members, pending members, reservation members for the
        rest, all keyed by hold key; plus the exclusive domains other groups use."""
        state = self.cache.state
        running = self._running()
        ref0 = pending[0].group if pending else None
        bound: list[PodRequest] = []
        taken: set[tuple[str, str]] = set()
        for req, pl in running:
            g = req.group
            if g is None:
                continue
            if g.key == key and not is_reservation(req.key):
                bound.append(req)
            elif g.exclusive and g.topology_key is not None:
                value = domain_of(state, g, pl.node)
                if value is not None:
                    taken.add((g.topology_key, value))
        assert ref0 is not None
        ref = effective_ref(state, ref0)
        pods: dict[int, str] = {}
        normal: list[PodRequest] = []
        bound_norm: list[PodRequest] = []
        for group_list, out in ((sorted(bound, key=lambda p: p.key), bound_norm),
                                (list(pending), normal)):
            for p in group_list:
                assert p.group is not None
                slot = p.group.index
                if slot in pods or slot >= ref.size:
                    slot = next((s for s in range(ref.size) if s not in pods), -1)
                if slot < 0:
                    continue
                pods[slot] = p.key
                out.append(replace(p, key=hold_key(key, slot), uid="",
                                   group=replace(ref, index=slot)))
        full = with_reservations(Snapshot(
            nodes=(), running=tuple((b, Placement(b.key, "")) for b in bound_norm),
            pending=tuple(normal)))
        return ref, pods, bound_norm, list(full.pending), taken

    def _attempt(self, key: str, pending: Sequence[PodRequest], now: float) -> Reservation | str:
        if not pending:
            return f"group {key} has no pending member"
        ref, pods, bound, members, taken = self._members(key, pending)
        domain = None
        if bound and ref.topology_key is not None:
            counted = [self.cache.counted(pods[b.group.index]) for b in bound if b.group]
            nodes = {c[1].node for c in counted if c is not None}
            domain = next((domain_of(self.cache.state, ref, n) for n in sorted(nodes)), None)
        prio = max(p.priority for p in pending)
        scorer = self.scorer()
        result = place_members(self.cache.state, members, scorer, taken, domain)
        displaced: list[Reservation] = []
        if isinstance(result, str):
            displaced, result = self._try_displace(members, scorer, taken, domain, prio, result)
        if isinstance(result, str):
            reason = f"group {key} waits whole, holding nothing: {result}"
            self.waiting[key] = Waiting(reason, wait_category(result), now + self.retry_s)
            return reason
        for r in displaced:
            self._release(r, "displaced")
            self.waiting[r.group] = Waiting(
                f"group {r.group} waits whole: its reservation went to higher-priority group "
                f"{key}", "displaced", now + self.retry_s, None)
        placements, value = result
        by_key = {m.key: m for m in members}
        r = Reservation(
            group=key, ref=ref, priority=prio, slots={}, reqs={},
            first_seen=self.first_seen.get(key, now), expires=now + self.ttl, domain=value,
            pods={k: s for s, k in pods.items()},
        )
        for p in placements:
            req = by_key[p.pod]
            assert req.group is not None
            r.slots[req.group.index] = p
            r.reqs[req.group.index] = req
        for b in bound:  # bound members keep their own room: no hold
            assert b.group is not None
            c = self.cache.counted(pods[b.group.index])
            if c is not None:
                r.slots[b.group.index] = replace(c[1], pod=b.key)
                r.reqs[b.group.index] = b
        held: list[str] = []
        for slot, p in r.slots.items():
            if p.pod == r.reqs[slot].key and (r.pod_of(slot) is None
                                              or self.cache.counted(r.pod_of(slot) or "") is None):
                why = self.cache.hold(r.reqs[slot], p)
                if why is not None:  # cannot happen: placed on this very state just now
                    for hk in held:
                        self.cache.unhold(hk)
                    reason = f"group {key} waits whole: room changed while reserving ({why})"
                    self.waiting[key] = Waiting(reason, "other", now + self.retry_s)
                    return reason
                held.append(p.pod)
        self.reservations[key] = r
        self.waiting.pop(key, None)
        self._write(r)
        log.info("reserved room for group %s (%d members) on %s", key, ref.size,
                 ", ".join(sorted({p.node for p in r.slots.values()})))
        return r

    def _try_displace(
        self, members: Sequence[PodRequest], scorer: Scorer, taken: set[tuple[str, str]],
        domain: str | None, prio: int, reason: str,
    ) -> tuple[list[Reservation], tuple[list[Placement], str | None] | str]:
        """Lower-priority reservations with no member bound give way, lowest first."""
        cands = sorted(
            (r for r in self.reservations.values() if r.priority < prio and not any(
                (k := r.pod_of(s)) is not None and self.cache.counted(k) is not None
                for s in r.slots)),
            key=lambda r: (r.priority, -r.first_seen, r.group),
        )
        state = self.cache.state
        removed: list[tuple[PodRequest, Placement]] = []
        used: list[Reservation] = []
        result: tuple[list[Placement], str | None] | str = reason
        try:
            for r in cands:
                for slot in r.slots:
                    c = self.cache.counted(hold_key(r.group, slot))
                    if c is not None:
                        state.undo(c[0], c[1])
                        removed.append(c)
                used.append(r)
                result = place_members(state, members, scorer, taken, domain)
                if not isinstance(result, str):
                    break
        finally:
            for req, p in reversed(removed):
                state.apply(req, p, allow_overcommit=True)
        if isinstance(result, str):
            return [], reason
        return used, result

    # ---- verbs -----------------------------------------------------------------------------

    def status(self, pod: PodRequest) -> Reservation | str:
        """The group's reservation (the pod assigned a slot), or why it waits."""
        assert pod.group is not None
        key = pod.group.key
        with self.cache.lock:
            self.sync()
            if not self.cache.synced:
                return f"group {key} waits: gpupack's cache has not listed the cluster yet"
            r = self.reservations.get(key)
            if r is None:
                w = self.waiting.get(key)
                if w is not None and not w.due(self.clock(), self.cache.version):
                    return w.reason
                now = self.clock()
                self.first_seen.setdefault(key, now)
                members = {p.key: p for p in self._pending_groups().get(key, [])}
                members.setdefault(pod.key, pod)
                got = self._attempt(key, list(members.values()), now)
                if isinstance(got, str):
                    return got
                r = got
            if pod.key not in r.pods:
                slot = self._free_slot(r, pod)
                if slot is None:
                    return f"group {key} already has all {r.size} members"
                r.pods[pod.key] = slot
                r.rev += 1
                self._write(r)
            return r

    def filter(self, args: ExtenderArgs) -> FilterResult | None:
        """The answer for a group member (None for any other pod: the normal path)."""
        if not looks_grouped(args.pod):
            return None
        pod = read_pod(args.pod)
        if pod.group is None:
            return None
        names = args.candidate_names
        got = self.status(pod)
        keep: tuple[str, ...] = ()
        if isinstance(got, str):
            failed = {n: got for n in names}
        else:
            node = got.slots[got.pods[pod.key]].node
            keep = (node,) if node in names else ()
            why = f"group {got.group}: member {got.pods[pod.key]} has room reserved on {node}"
            failed = {n: why for n in names if n != node}
        if args.node_cache_capable:
            return FilterResult(node_names=keep, failed=failed)
        nodes = tuple(n for n in args.nodes or () if n["metadata"]["name"] in keep)
        return FilterResult(nodes=nodes, failed=failed)

    def prioritize(self, args: ExtenderArgs) -> list[HostPriority] | None:
        if not looks_grouped(args.pod):
            return None
        pod = read_pod(args.pod)
        if pod.group is None:
            return None
        with self.cache.lock:
            self.sync()
            r = self.reservations.get(pod.group.key)
            if r is None or pod.key not in r.pods:
                return None
            node = r.slots[r.pods[pod.key]].node
        return [HostPriority(n, MAX_PRIORITY if n == node else 0)
                for n in args.candidate_names]

    def bind_member(self, pod: PodRequest, uid: str, node: str) -> Placement | str | None:
        """Bind path (under the cache lock): swap the member's hold for the pod at its
        reserved GPUs and assume it. None: not a group member (bind as usual); a string:
        why the bind is refused."""
        if pod.group is None:
            return None
        with self.cache.lock:
            got = self.status(pod)
            if isinstance(got, str):
                return got
            slot = got.pods[pod.key]
            reserved = got.slots[slot]
            if reserved.node != node:
                return (f"group {got.group}: member {slot} has room reserved on "
                        f"{reserved.node}, not {node}")
            if self.cache.counted(pod.key) is not None:
                return f"pod {pod.key} is already counted on {self.cache.counted(pod.key)}"
            hk = hold_key(got.group, slot)
            placement = replace(reserved, pod=pod.key)
            self.cache.unhold(hk)
            try:
                self.cache.assume(pod, uid, placement)
            except AssumeError as e:
                self.cache.hold(got.reqs[slot], reserved)
                return f"group {got.group}: {e}"
            got.rev += 1
            return placement

    def bind_annotations(self, pod: PodRequest) -> dict[str, str]:
        """The reservation record for the member's Binding (written with the bind)."""
        if pod.group is None:
            return {}
        with self.cache.lock:
            r = self.reservations.get(pod.group.key)
            return {} if r is None else {RESERVATION: encode(r.record())}

    def preempt(self, args: PreemptionArgs) -> PreemptionResult | None:
        """For a group member: per proposed node, the proposed victims among the fewest
        lower-priority pods that free room for the whole group in one domain.

        kube-scheduler evicts the victims of one node per attempt, so a group spanning
        several nodes frees its domain over successive attempts (its pods are retried
        after each eviction)."""
        if not looks_grouped(args.pod):
            return None
        pod = read_pod(args.pod)
        if pod.group is None:
            return None
        key = pod.group.key
        with self.cache.lock:
            self.sync()
            if key in self.reservations:
                return PreemptionResult({})  # it has room: nothing to evict
            pending = {p.key: p for p in self._pending_groups().get(key, [])}
            pending.setdefault(pod.key, pod)
            _, _, bound, members, taken = self._members(key, list(pending.values()))
            del bound
            cands = [
                Candidate(req.uid, req, pl) for req, pl in self._running()
                if req.uid and not is_reservation(req.key)
            ]
            chosen = group_victims(self.cache.state, members, self.scorer(), cands, taken)
        if not chosen:
            return PreemptionResult({})
        by_node: dict[str, set[str]] = defaultdict(set)
        for c in chosen:
            by_node[c.placement.node].add(c.uid)
        out: dict[str, MetaVictims] = {}
        for node, proposed in args.victims.items():
            mine = [u for u in proposed.uids if u in by_node.get(node, set())]
            if mine:
                out[node] = MetaVictims(tuple(mine), proposed.num_pdb_violations)
        return PreemptionResult(out)

    # ---- restart ---------------------------------------------------------------------------

    def _rebuild(self, now: float) -> None:
        """Reservations from the pods' annotations (the newest record of each group)."""
        best: dict[str, ReservationRecord] = {}
        for pod, text in list(self._notes.items()):
            try:
                rec = decode(text)
            except ReservationError as e:
                log.warning("pod %s: ignoring its %s: %s", pod, RESERVATION, e)
                continue
            if now >= rec.expires:
                log.info("pod %s: reservation of group %s expired; ignored", pod, rec.group)
                continue
            if rec.expires > now + self.ttl:
                # No reservation this book writes outlives now + ttl: a later expiry is a
                # corrupt or hostile record (or a clock gone backwards), and trusting it
                # would hold the group's GPUs for as long as it says.
                log.warning("pod %s: reservation of group %s expires in %.0fs, more than the "
                            "TTL %.0fs; capped at the TTL", pod, rec.group, rec.expires - now,
                            self.ttl)
                rec = replace(rec, expires=now + self.ttl)
            old = best.get(rec.group)
            if old is None or rec.rev > old.rev:
                best[rec.group] = rec
        if not best:
            return
        members: dict[str, list[PodRequest]] = defaultdict(list)
        for req, _ in self._running():
            if req.group is not None and not is_reservation(req.key):
                members[req.group.key].append(req)
        for p in self.cache.pending():
            if p.group is not None:
                members[p.group.key].append(p)
        for key, rec in sorted(best.items()):
            if key in self.reservations:
                continue
            why = self._restore(rec, members.get(key, []))
            if why is not None:
                log.warning("group %s: reservation from the API not restored (%s); the group "
                            "will be placed again", key, why)

    def _restore(self, rec: ReservationRecord, known: Sequence[PodRequest]) -> str | None:
        if not known:
            return "no pod of the group exists"
        template = max(known, key=lambda p: (p.gpu_demand_milli, p.cpu_milli, p.memory_mib))
        assert template.group is not None
        ref = replace(template.group, size=rec.size, topology_key=rec.topology_key,
                      exclusive=rec.exclusive, index=0)
        if len(rec.slots) != rec.size:
            return f"record has {len(rec.slots)} members for a group of {rec.size}"
        by_key = {p.key: p for p in known}
        r = Reservation(group=rec.group, ref=ref, priority=rec.priority, slots={}, reqs={},
                        first_seen=rec.first_seen, expires=rec.expires, domain=rec.domain,
                        rev=rec.rev + 1)
        for slot, pk in rec.pods.items():
            if pk in by_key:
                r.pods[pk] = slot
        for slot, p in rec.slots.items():
            hk = hold_key(rec.group, slot)
            member = r.pod_of(slot)
            shape = by_key[member] if member is not None else template
            r.slots[slot] = replace(p, pod=hk)
            r.reqs[slot] = replace(shape, key=hk, uid="", group=replace(ref, index=slot))
        held: list[str] = []
        for slot, p in r.slots.items():
            member = r.pod_of(slot)
            if member is not None and self.cache.counted(member) is not None:
                continue  # bound already: its own placement counts
            why = self.cache.hold(r.reqs[slot], p)
            if why is not None:
                for hk in held:
                    self.cache.unhold(hk)
                return f"room of member {slot} is not free: {why}"
            held.append(p.pod)
        self.reservations[rec.group] = r
        self.first_seen[rec.group] = rec.first_seen
        log.info("group %s: reservation restored from the API (%d members held)",
                 rec.group, len(held))
        return None

    # ---- figures ---------------------------------------------------------------------------

    def figures(self) -> tuple[int, int, dict[str, int]]:
        """(active reservations, GPUs held for members not bound, waiting groups by reason)."""
        with self.cache.lock:
            gpus = 0
            for r in self.reservations.values():
                for slot, p in r.slots.items():
                    if self.cache.counted(hold_key(r.group, slot)) is not None:
                        req = r.reqs[slot]
                        gpus += len(p.gpus) if req.kind is RequestKind.WHOLE else 0
            waiting = Counter(w.category for w in self.waiting.values())
            return len(self.reservations), gpus, dict(waiting)
