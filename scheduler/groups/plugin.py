"""LLM groups as one participant at the extender's extension points (as coscheduling is
one plugin of kube-scheduler): filter, prioritize, reserve (the bind's GPUs), unreserve
and preempt, for group members.

Each point asks :class:`~scheduler.groups.loop.ReservationBook` for the member's group
(running its reconcile first on the leader, so a new group's room exists before its
first pod is answered) and steers the member to its reserved room: filter keeps only the
reserved node, prioritize gives it 10, reserve swaps the member's hold for the pod at
the reserved GPUs, unreserve holds the room again after a refused Binding, preempt
proposes the fewest lower-priority pods that free room for the whole group in one
domain. Each returns None for a pod that is not a group member (the default verbs
answer it). What it reads of the pod comes from the request's
:class:`~scheduler.extender.cycle.Cycle` (read once for all the points). The app answers
nothing before the book is ready and leading.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kube.assumptions import AssumeError
from kube.groups.reservations import ReservationRecord
from packing.groups.members import is_reservation
from packing.groups.placement import EvictionCandidate, group_victims
from packing.model import Placement, PodRequest, exclusive_key
from packing.status import Code, Status
from scheduler.extender.cycle import Cycle
from scheduler.extender.view_lag import ViewLag
from scheduler.extender.wire import (
    MAX_PRIORITY,
    ExtenderArgs,
    FilterResult,
    HostPriority,
    MetaVictims,
    PreemptionArgs,
    PreemptionResult,
)
from scheduler.groups.decide import HiddenNodes, Member, group_slots
from scheduler.groups.facts import judge
from scheduler.groups.keys import hold_key, looks_grouped
from scheduler.groups.loop import ReservationBook

# Checks of a refused group member (Status.check).
BOOK_READY = "ReservationsRebuilt"  # the book has not read its records back yet
GROUP_WAITS = "GroupWaits"  # the group holds no room (the reason says why)
GROUP_FULL = "GroupFull"  # every member slot of the group is taken
RESERVED_NODE = "ReservedNode"  # the member's room is on another node
ASSUME = "Assume"  # the room could not be assumed for the pod
POD_UNSEEN = "PodNotSeen"  # the watch has not shown this pod (this uid) yet: an error

# kube-scheduler stops filtering once it has found this many feasible nodes or more
# (percentageOfNodesToScore, which never asks for fewer than 100): a longer candidate list
# may be a sample that merely skipped a node; a shorter one holds every node that passed.
SAMPLED_MIN = 100


class GroupVerbs:
    """The groups' participant at the extension points, over one reservation book
    (a :class:`scheduler.extender.cycle.Participant`)."""

    def __init__(self, book: ReservationBook, lag: ViewLag | None = None) -> None:
        self.book = book
        self.lag = lag  # how long an unseen member is an error (None: unbounded)

    def status(self, pod: PodRequest) -> ReservationRecord | Status:
        """The group's record (the pod has a slot in it), or why it waits (check
        BOOK_READY, GROUP_WAITS, GROUP_FULL), or the error POD_UNSEEN.

        The book knows a group's members from the cache's watch, which may lag
        kube-scheduler's informer by the very pod asked about. Judging such a pod
        (no slot of the record names it, or its group not tried yet) would reject it as
        unschedulable, and kube-scheduler would then park it until some later cluster
        event, up to its five-minute flush when the pod was the last one created. An
        error instead makes kube-scheduler try it again after its backoff, by when the
        watch has shown it."""
        assert pod.group is not None
        key = pod.group.key
        with self.book.cache.lock:
            if not self.book.ready:
                # Not synced: an error, retried (the app answers 503 before this point;
                # a book becoming ready is no event kube-scheduler would see).
                return Status.error(
                    BOOK_READY,
                    f"group {key} waits: gpupack has not rebuilt its reservations yet")
            seen = self.book.cache.pod_entry(pod.key)
            unseen = seen is None or bool(pod.uid and seen.uid and seen.uid != pod.uid)
            if unseen and (self.lag is None
                           or self.lag.behind(f"pod/{pod.key}/{pod.uid}", "pod")):
                return Status.error(
                    POD_UNSEEN, f"group {key}: gpupack's watch has not shown pod {pod.key} "
                    f"(uid {pod.uid or 'unknown'}) yet; try again")
            self.book.step()
            r = self.book.records.get(key)
            if r is None:
                w = self.book.waiting.get(key)
                why = w.reason if w is not None else f"group {key} waits: not placed yet"
                self.book.note_refused(pod.key)
                return Status.unschedulable(GROUP_WAITS, why)
            if self.book.slot_of(r, pod.key) is None:
                self.book.note_refused(pod.key)
                if r.size < pod_group_size(self.book, key):
                    # Room for the group's minimum only (all it could get): the others
                    # wait until those are bound (then they are placed beside them).
                    return Status.unschedulable(
                        GROUP_FULL, f"group {key} holds room for its minimum of {r.size} "
                        f"members, not for pod {pod.key}: it waits until they are bound")
                return Status.unresolvable(GROUP_FULL,
                                           f"group {key} already has all {r.size} members")
            return r

    def member(self, args: ExtenderArgs | PreemptionArgs, cycle: Cycle | None
               ) -> PodRequest | None:
        """The request's pod when it is a group member (None for any other pod, and for
        a basic PodGroup's: placed alone), read once per cycle; the cheap look at its
        labels first, so a pod of no group is never read here."""
        if not looks_grouped(args.pod):
            return None
        pod = (cycle or Cycle.of(args.pod)).req
        if pod.group is None:
            return None
        with self.book.cache.lock:
            return pod if self.book.is_gang(pod.group) else None

    def filter(self, args: ExtenderArgs, cycle: Cycle | None = None) -> FilterResult | None:
        """The answer for a group member (None for any other pod: the default verb)."""
        pod = self.member(args, cycle)
        if pod is None or pod.group is None:
            return None
        names = args.candidate_names
        got = self.status(pod)
        keep: tuple[str, ...] = ()
        if isinstance(got, Status) and got.code is Code.ERROR:
            return FilterResult(error=got.message)
        if isinstance(got, Status):
            failed = {n: got.message for n in names}
        else:
            slot = self.book.slot_of(got, pod.key)
            assert slot is not None
            node = got.slots[slot].node
            keep = (node,) if node in names else ()
            why = f"group {got.group}: member {slot} has room reserved on {node}"
            failed = {n: why for n in names if n != node}
            with self.book.cache.lock:
                if keep:
                    self.book.nodes_offered(pod.key, names)
                else:  # kube-scheduler ruled the room's node out: refused, woken if moved
                    self.book.note_refused(pod.key)
                    # Not on a node that changed a moment ago: kube-scheduler's view may
                    # still hold what just left it (a pod evicted to free this very room),
                    # and it would be ruled out for a lag, not for a rule.
                    if (every_feasible_node(args.pod, names)
                            and self.book.cache.quiet_s(node) >= self.book.view_settle_s):
                        self.book.rule_out(pod.key, got.group, names)
        if args.node_cache_capable:
            return FilterResult(node_names=keep, failed=failed)
        nodes = tuple(n for n in args.nodes or () if n["metadata"]["name"] in keep)
        return FilterResult(nodes=nodes, failed=failed)

    def prioritize(self, args: ExtenderArgs, cycle: Cycle | None = None
                   ) -> list[HostPriority] | None:
        pod = self.member(args, cycle)
        if pod is None or pod.group is None:
            return None
        with self.book.cache.lock:
            r = self.book.records.get(pod.group.key)
            slot = None if r is None else self.book.slot_of(r, pod.key)
            if r is None or slot is None:
                return None
            node = r.slots[slot].node
        return [HostPriority(n, MAX_PRIORITY if n == node else 0)
                for n in args.candidate_names]

    def reserve(self, pod: PodRequest, uid: str, node: str) -> Placement | Status | None:
        """Bind path (under the cache lock): swap the member's hold for the pod at its
        reserved GPUs and assume it. None: not a group member (bind as usual); a Status:
        why the bind is refused (the status's checks, RESERVED_NODE, ASSUME)."""
        if pod.group is None:
            return None
        with self.book.cache.lock:
            if not self.book.is_gang(pod.group):
                return None
            got = self.status(pod)
            if isinstance(got, Status):
                return got
            slot = self.book.slot_of(got, pod.key)
            assert slot is not None
            reserved = got.slots[slot]
            if reserved.node != node:
                return Status.unschedulable(
                    RESERVED_NODE, f"group {got.group}: member {slot} has room reserved on "
                    f"{reserved.node}, not {node}")
            counted = self.book.cache.counted(pod.key)
            if counted is not None:
                return Status.unschedulable(
                    ASSUME, f"pod {pod.key} is already counted on {counted}")
            hk = hold_key(got.group, slot)
            held = self.book.cache.counted(hk)
            placement = replace(held[1] if held is not None else reserved, pod=pod.key)
            self.book.cache.unhold(hk)
            try:
                self.book.cache.assume(pod, uid, placement)
            except AssumeError as e:
                if held is not None:
                    self.book.cache.hold(*held)
                return Status.unschedulable(ASSUME, f"group {got.group}: {e}")
            return placement

    def unreserve(self, key: str) -> None:
        """The Binding of ``key`` failed and its assumption is gone (under the cache
        lock): a group member's room is held again at once, so no other pod takes it."""
        self.book.rehold(key)

    def preempt(self, args: PreemptionArgs, cycle: Cycle | None = None
                ) -> PreemptionResult | None:
        """For a group member: per proposed node, the proposed victims among the fewest
        lower-priority pods that free room for the whole group in one domain.

        kube-scheduler evicts the victims of one node per attempt, so a group spanning
        several nodes frees its domain over successive attempts (its pods are retried
        after each eviction)."""
        pod = self.member(args, cycle)
        if pod is None or pod.group is None:
            return None
        key = pod.group.key
        with self.book.cache.lock:
            self.book.step()
            if key in self.book.records:
                return PreemptionResult({})  # it has room: nothing to evict
            # Nothing is evicted for a group that may not be reserved, nor on nodes it
            # may not use.
            book = self.book
            rights = judge(book.cache, book.inputs, book.rights, [key], book.records
                           ).rights.get(key)
            if rights is not None and rights.refused is not None:
                return PreemptionResult({})
            all_members = self.book.members()
            members = list(all_members.get(key, []))
            if all(m.req.key != pod.key for m in members):
                members.append(Member(pod))
            _, _, to_place, _ = group_slots(self.book.cache.state, key, members,
                                            rights.size if rights is not None else None)
            taken = {(exclusive_key(r.group, r.topology_key), r.domain)
                     for r in self.book.records.values()
                     if r.exclusive and r.topology_key and r.domain is not None}
            cands = [
                EvictionCandidate(req.uid, req, pl)
                for req, pl in self.book.cache.snapshot().running
                if req.uid and not is_reservation(req.key)
            ]
            allowed = None if rights is None or rights.allowed is None else rights.allowed
            hidden = HiddenNodes(self.book.cache.state,
                                 None if allowed is None else (lambda _g, n: n in allowed),
                                 key)
            try:
                chosen = group_victims(
                    self.book.cache.state, to_place, self.book.scorer(), cands,
                    {(k, d) for k, d in taken if k is not None and d is not None})
            finally:
                hidden.restore()
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


def pod_group_size(book: ReservationBook, key: str) -> int:
    """How many pods of group ``key`` the watch shows (not finished)."""
    return sum(1 for e in book.cache.group_pods(key) if not e.finished)


def every_feasible_node(pod: Mapping[str, Any], names: Sequence[str]) -> bool:
    """Whether ``names`` holds every node that passed kube-scheduler's filters for
    ``pod``, so a node missing from it was ruled out: not a sample (see SAMPLED_MIN), and
    not the first try of a nominated pod, which offers its nominated node alone and,
    refused there, every node next."""
    if len(names) >= SAMPLED_MIN:
        return False
    status = pod.get("status")
    nominated = status.get("nominatedNodeName") if isinstance(status, Mapping) else None
    return not (nominated and tuple(names) == (nominated,))
