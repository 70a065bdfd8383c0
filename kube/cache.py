"""The cluster cache: nodes and pods kept incrementally, plus assumed binds; the extender
and the webhook (in its own process or inside ``gpupack serve``) both read it.

Sources (the API watch, or static files) feed Node and Pod objects in as add/update/
delete events; the cache keeps a :class:`~packing.state.ClusterState` that is updated in
place, one placement or one node at a time, so no request ever rebuilds the cluster.

*Assume*: a pod the extender has just bound is counted on its node at once, before the
watch reports the binding (:mod:`kube.assumptions`: the book of assumptions, which never
expire).

Concurrency: one re-entrant lock guards everything. Verbs run under it; the reservation
in :meth:`ClusterCache.assume` checks and takes the resources under it, so two racing
binds can never both get the same GPU. Each node has a generation number that changes
whenever anything on it changes.

*Signatures*: each node also has a state signature (:mod:`kube.signatures`), a small
integer naming everything a verb's answer for the node can depend on except its name and
labels. Nodes in the same state share a signature, so the verbs memoize answers per (pod
shape, signature): thousands of nodes of a few kinds in a few states cost a handful of
evaluations. Signatures are recomputed only for the nodes an event touched, before the
change is published.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Set
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from kube import annotations as A
from kube.assumptions import AssumedBinds, AssumeError, Assumption, same_uid
from kube.constraints import PodConstraints, Taint, node_taints, pod_constraints
from kube.inventory_age import (
    InventoryAge,
    essentials,
    steady_clock,
    without_inventory,
    written_at,
)
from kube.objects import (
    NO_OBSERVATION,
    UNREADABLE_TAINTS,
    NodeObservation,
    ObjectError,
    bound_node,
    inventory_text,
    is_finished,
    node_info,
    object_name,
    observation_of,
    pod_key,
    pod_request,
    recorded_placement,
    started_at,
)
from kube.signatures import SignatureBook
from kube.snapshot import observed_share, owned_instance, with_observed_peak
from packing.model import NodeInfo, Placement, PodRequest, RequestKind, Snapshot
from packing.state import (
    ClusterState,
    PlacementError,
    plugin_pick,
    share_is_a_guess,
)

log = logging.getLogger("gpupack.kube.cache")
IGNORED_NOTES_CAP = 10_000  # distinct ignored placements remembered (see _note_ignored)
CONSTRAINTS_CAP = 10_000  # distinct pod constraints shared (see _shared_constraints)

# Label and annotation prefixes node_info reads to find a node's GPUs.
_GPU_LABELS = ("nvidia.com/", "gpupack.io/")

def as_counted(state: ClusterState, p: Placement) -> Placement:
    """``p`` as the cache counts it: a MIG slice the view's layout does not have yet is
    counted as created (so giving it back removes it again, instead of leaving a free
    slice that does not exist); one it has, as existing."""
    if p.mig_profile is None or p.mig_start is None or not p.gpus:
        return p
    exists = p.mig_start in state.gpu(p.node, p.gpus[0]).instances
    return p if p.mig_created != exists else replace(p, mig_created=not exists)


def same_slot(a: Placement | None, b: Placement) -> bool:
    """Equal placements, whether or not the slice was counted as created."""
    return a is not None and replace(a, mig_created=False) == replace(b, mig_created=False)


@dataclass(slots=True)
class PodEntry:
    """A pod as the watch last showed it."""

    req: PodRequest
    uid: str
    node: str | None  # spec.nodeName
    scheduler: str
    finished: bool
    recorded: Placement | None  # the placement gpupack recorded in the pod's annotations
    # Where it may run and which quota scopes cover it (kube.constraints), read for GPU
    # pods and group members only (what a group's rights depend on); a string says why
    # it could not be read.
    constraints: PodConstraints | str | None = None
    started: float | None = None  # status.startTime (kube.objects.started_at)


class ClusterCache:
    """Nodes, pods, assumed binds and the packing state derived from them."""

    def __init__(self, scheduler_name: str = "gpupack", *, mig_actuator: bool = False,
                 inventory_age: InventoryAge | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.scheduler_name = scheduler_name
        # The age limit on node agent inventories (None: none, as for files that no agent
        # refreshes), and the wall clock their ``ts`` is compared with (by default one
        # that system clock steps do not move: kube.inventory_age.steady_clock).
        self.inventory_age = inventory_age
        self._clock = clock if clock is not None else steady_clock()
        self._stale_inventories: set[str] = set()
        # node -> (ts, expiry) of the last inventory seen on it, stale ones included.
        self._inventory_seen: dict[str, tuple[int, float]] = {}
        # Nodes whose inventory is trusted now: what to re-read each from once it expires.
        self._inventory_nodes: dict[str, dict[str, Any]] = {}
        # Whether MIG layouts of nodes that opt in may change (kube.objects.node_info).
        self.mig_actuator = mig_actuator
        self.lock = threading.RLock()
        self.state = ClusterState(Snapshot(nodes=()))
        self.synced = False
        self._infos: dict[str, NodeInfo] = {}
        self._pods: dict[str, PodEntry] = {}
        self._assumed = AssumedBinds()
        # Everything applied to ``state``: watch-bound pods and assumed ones.
        self._counted: dict[str, tuple[PodRequest, Placement]] = {}
        self._on_node: dict[str, set[str]] = {}
        self._touched_at: dict[str, float] = {}  # node -> monotonic time of its last change
        self._uid_key: dict[str, str] = {}
        self._pending: dict[str, PodRequest] = {}  # ours, unbound, not assumed; arrival order
        self._gen: dict[str, int] = {}
        self._next_gen = 0
        self.version = 0  # changes on every change that could change a plan
        self.bad_objects = 0  # objects that could not be read (logged, skipped)
        # Placements already reported as ignored: a node is re-counted on every change of
        # it, and the same mismatch must not fill the log each time (bounded: forgotten
        # wholesale past a cap, so a mismatch is at worst reported again).
        self._ignored_noted: set[tuple[str, str, str]] = set()
        self._listeners: list[Callable[[], None]] = []
        self._shapes: dict[str, NodeInfo] = {}  # node shape -> NodeInfo (see _node_info)
        self._signatures = SignatureBook()
        self._holds: set[str] = set()  # keys hold() counted (some may be gone since)
        self._planned_elsewhere: list[Callable[[], Set[str]]] = []  # see add_pending_filter
        # For group rights (scheduler.groups.rights): node taints, the pods of each group
        # (any scheduler, bound or not), and the GPU pods of each namespace (quota use).
        self._taints: dict[str, tuple[Taint, ...]] = {}
        self._group_pods: dict[str, set[str]] = {}
        self._gpu_pods: dict[str, set[str]] = {}
        # Equal constraints share one object: pods of one template read the same (a
        # toleration tuple, selectors, affinity terms), 50,000 copies otherwise.
        self._constraints: dict[PodConstraints, PodConstraints] = {}
        self._gone_hooks: list[Callable[[str], None]] = []  # see on_pod_gone
        self._node_hooks: list[Callable[[str], None]] = []  # see on_node_changed
        # What each node's agent observed (kube.objects.NodeObservation), by node, with
        # the inventory text it was read from (read again only when that changes).
        self._obs: dict[str, NodeObservation] = {}
        self._obs_text: dict[str, str | None] = {}
        # Nodes the watch showed whose objects could not be read, never read before: not
        # "unseen" (see unreadable_node), so a filter does not wait for them.
        self._unreadable: set[str] = set()
        # The observed placement of each pod last compared with gpupack's, and the
        # disagreements found (by kind: shared, mig): the device plugin or the node
        # put a pod elsewhere than gpupack predicted or recorded.
        self._seen_obs: dict[str, Placement] = {}
        self.disagreements: dict[str, int] = {"shared": 0, "mig": 0}

    # ---- listeners and views ---------------------------------------------------------------

    def subscribe(self, fn: Callable[[], None]) -> None:
        """``fn`` is called (under the lock: keep it tiny) after every change."""
        self._listeners.append(fn)

    def _changed(self) -> None:
        self._refresh_signatures()
        self.version += 1
        for fn in self._listeners:
            fn()

    def _touch(self, node: str) -> None:
        self._next_gen += 1
        self._gen[node] = self._next_gen
        self._touched_at[node] = time.monotonic()
        self._signatures.touch(node)

    def quiet_s(self, node: str) -> float:
        """Seconds since this view of ``node`` (its pods, GPUs, allocatable) last changed;
        infinite when it never did. kube-scheduler's own view may lag a change by a
        moment (its informer, a pod still terminating there), so an answer of its that
        contradicts a change this recent is no verdict (scheduler.groups.plugin)."""
        at = self._touched_at.get(node)
        return math.inf if at is None else max(0.0, time.monotonic() - at)

    def _refresh_signatures(self) -> None:
        self._signatures.refresh(self.state.nodes)

    def drain_signature_changes(self) -> list[tuple[str, int]] | None:
        """(node, signature) of the nodes whose signature changed since the last call, or
        None when too many changed to list (look at :meth:`signatures` instead)."""
        with self.lock:
            return self._signatures.drain(self.state.nodes)

    def signatures(self) -> Mapping[str, int]:
        """Node name -> state signature id, for every node in the cache (call under the
        lock). Equal ids mean equal states; an id is never reused for another state."""
        return self._signatures.current(self.state.nodes)

    def intern_signature(self, key: tuple[Any, ...]) -> int:
        """The id of a node state (:func:`node_signature`) before any node is in it: the
        warmer fills the memo for states a bind is about to create, and the node that
        reaches such a state gets this id, so its answers are found."""
        with self.lock:
            return self._signatures.intern(key)

    def signature_count(self) -> int:
        """Distinct signatures among the nodes now."""
        with self.lock:
            return len(set(self.signatures().values()))

    def gen(self, node: str) -> int:
        """Generation of a node: equal numbers mean nothing on the node changed."""
        return self._gen.get(node, -1)

    def on_pod_gone(self, fn: Callable[[str], None]) -> None:
        """``fn(key)`` is called (under the lock) when a counted pod stops counting
        because it was deleted or finished, before the change is published: what its
        room was kept for (a group's reservation) can take it back at once, before any
        other pod is answered."""
        self._gone_hooks.append(fn)

    def on_node_changed(self, fn: Callable[[str], None]) -> None:
        """``fn(name)`` is called (under the lock) when a Node object brings something the
        packer sees (its GPUs, labels, allocatable, taints), not on heartbeats; also for
        a node added."""
        self._node_hooks.append(fn)

    def add_pending_filter(self, fn: Callable[[], Set[str]]) -> None:
        """Pending pods whose keys ``fn`` returns (under the lock) are left out of
        :meth:`snapshot`: someone else has placed them already (a group's reserved
        members, whose room is counted as held), so the planner must not place them
        again."""
        self._planned_elsewhere.append(fn)

    @contextmanager
    def view(self) -> Iterator[ClusterCache]:
        """The cache under its lock. A read: it changes nothing (no hook runs here)."""
        with self.lock:
            yield self

    def has_node(self, name: str) -> bool:
        return name in self.state.nodes

    def node_names(self) -> list[str]:
        return list(self.state.nodes)

    def unreadable_node(self, name: str) -> bool:
        """The watch showed ``name`` but its object could not be read (and never could):
        absent from the cache for good, unlike a node the watch has not shown yet."""
        return name in self._unreadable

    def unreadable_nodes(self) -> frozenset[str]:
        """Every node :meth:`unreadable_node` says so of."""
        return frozenset(self._unreadable)

    def taints(self, node: str) -> tuple[Taint, ...]:
        return self._taints.get(node, ())

    def node_labels(self, node: str) -> Mapping[str, str]:
        info = self._infos.get(node)
        return info.labels if info is not None else {}

    def group_pods(self, group: str) -> list[PodEntry]:
        """Every pod of ``group`` the watch shows (any scheduler, bound or pending)."""
        return [self._pods[k] for k in sorted(self._group_pods.get(group, ()))]

    def gpu_pods(self, namespace: str) -> list[PodEntry]:
        """Every pod of ``namespace`` that asks for a GPU resource."""
        return [self._pods[k] for k in sorted(self._gpu_pods.get(namespace, ()))]

    def _index(self, key: str, entry: PodEntry | None, add: bool) -> None:
        if entry is None:
            return
        ns = key.split("/", 1)[0]
        books = []
        if entry.req.group is not None:
            books.append((self._group_pods, entry.req.group.key))
        if entry.req.kind is not RequestKind.NONE:
            books.append((self._gpu_pods, ns))
        for book, k in books:
            if add:
                book.setdefault(k, set()).add(key)
            else:
                members = book.get(k)
                if members is not None:
                    members.discard(key)
                    if not members:
                        del book[k]

    def observation(self, node: str) -> NodeObservation:
        """What the node agent last reported for ``node`` (empty without an agent)."""
        return self._obs.get(node, NO_OBSERVATION)

    def pending_pod(self, key: str) -> PodRequest | None:
        entry = self._pods.get(key)
        if entry is None or entry.finished or entry.node is not None:
            return None
        return entry.req

    def pod_entry(self, key: str) -> PodEntry | None:
        return self._pods.get(key)

    def counted(self, key: str) -> tuple[PodRequest, Placement] | None:
        return self._counted.get(key)

    def key_of_uid(self, uid: str) -> str | None:
        return self._uid_key.get(uid)

    def pods_on(self, node: str) -> list[tuple[PodRequest, Placement]]:
        return [self._counted[k] for k in self._on_node.get(node, ())]

    def assumed_keys(self) -> list[str]:
        return self._assumed.keys()

    def is_assumed(self, key: str, uid: str | None = None) -> bool:
        """Whether a bind of ``key`` is assumed; with ``uid``, a bind of that incarnation
        (the one made with that UID; see :func:`kube.assumptions.same_uid`)."""
        a = self._assumed.get(key)
        return a is not None and (uid is None or same_uid(a.uid, uid))

    def pending(self) -> list[PodRequest]:
        return list(self._pending.values())

    def counts(self) -> dict[str, int]:
        return {
            "nodes": len(self._infos),
            "pods": len(self._pods),
            "counted": len(self._counted),
            "assumed": len(self._assumed),
            "pending": len(self._pending),
        }

    def snapshot(self) -> Snapshot:
        """Nodes, counted pods (bound and assumed) and our pending pods, for the planner."""
        with self.lock:
            skip: set[str] = set()
            for f in self._planned_elsewhere:
                skip |= f()
            return Snapshot(
                tuple(self._infos.values()),
                tuple(self._counted.values()),
                tuple(p for k, p in self._pending.items() if k not in skip),
            )

    # ---- accounting ------------------------------------------------------------------------

    def _apply(self, req: PodRequest, p: Placement) -> None:
        """Count ``p``; a placement that cannot be recorded as it is (see
        :meth:`ClusterState.shape_error`) is counted without GPUs instead, so nothing a
        watch event says can corrupt the packing state or escape as an exception."""
        why = self.state.shape_error(req, p)
        if why is not None:
            log.warning("pod %s on %s: %s; counted without GPUs", req.key, p.node, why)
            p = Placement(req.key, p.node)
        p = as_counted(self.state, p)
        self.state.apply(req, p, allow_overcommit=True, unsure=self._is_guess(req, p))
        self._record(req, p)

    def _is_guess(self, req: PodRequest, p: Placement, state: ClusterState | None = None
                  ) -> bool:
        """Whether share ``req`` counted at ``p`` is gpupack's guess of where the device
        plugin put it (packing.state.share_is_a_guess) on a node whose agent will say:
        then it counts at its worst for later shares until the agent has seen it. On a
        node without an agent the prediction is all there is."""
        state = self.state if state is None else state
        if req.kind is not RequestKind.SHARED or not p.gpus or p.node not in state.nodes:
            return False
        if self._obs_text.get(p.node) is None:
            return False
        if observed_share(self._obs.get(p.node), p.node, req) is not None:
            return False
        return share_is_a_guess(state.nodes[p.node], p)

    def _record(self, req: PodRequest, p: Placement) -> None:
        """Book-keeping of a placement already applied to ``state``."""
        self._counted[req.key] = (req, p)
        self._on_node.setdefault(p.node, set()).add(req.key)
        if req.uid:
            self._uid_key[req.uid] = req.key
        self._touch(p.node)

    def _unapply(self, key: str) -> None:
        item = self._counted.pop(key, None)
        if item is None:
            return
        req, p = item
        if req.uid and self._uid_key.get(req.uid) == key:
            del self._uid_key[req.uid]
        self._on_node.get(p.node, set()).discard(key)
        if p.node in self.state.nodes:
            self.state.undo(req, p)
            self._touch(p.node)

    def _placement_for(
        self, entry: PodEntry, state: ClusterState | None = None
    ) -> Placement | None:
        """Where a bound pod sits in ``state`` (default: the cache's): where the node
        agent saw it (its time-sliced GPU, its MIG instance), else what gpupack
        recorded, else the first free fit (the GPU the device plugin would pick), else
        CPU and memory only. The answer can
        always be applied to ``state`` with over-commit; None when the node is unknown."""
        assert entry.node is not None
        state = self.state if state is None else state
        if entry.node not in state.nodes:
            return None
        # What the node agent observed wins over any record: the device plugin picked
        # the replica, and the pod holds the MIG slice it holds.
        candidates = (
            (self._observed_placement(entry, state), "placement the node agent observed"),
            (entry.recorded, "recorded placement"),
        )
        for p, what in candidates:
            if p is None:
                continue
            why = state.shape_error(entry.req, p)
            if why is None:
                return p
            self._note_ignored(entry, what, p, why)
        # Where it could be holding GPUs: a cordoned or CPU-full node still has them.
        options = state.options(entry.req, entry.node, gpus_only=True)
        if options:
            return options[0]
        # A share nobody has seen yet is where the device plugin put it, room or not.
        pick = plugin_pick(state.nodes[entry.node]) if entry.req.kind is RequestKind.SHARED \
            else None
        if pick is not None:
            return Placement(entry.req.key, entry.node, (pick.first,))
        # Bound by someone else with no room we can see (our view lags, the node over-
        # commits, or its devices do not match what we know of the node): count its CPU
        # and memory at least, GPUs unknown.
        return Placement(entry.req.key, entry.node)

    def _note_ignored(self, entry: PodEntry, what: str, p: Placement, why: str) -> None:
        """Log once per pod, source and placement that a placement was ignored, and why."""
        key = (entry.req.key, what, str(p.to_json()))
        if key in self._ignored_noted:
            return
        if len(self._ignored_noted) >= IGNORED_NOTES_CAP:
            self._ignored_noted.clear()
        self._ignored_noted.add(key)
        log.warning("pod %s on %s: %s %s ignored: %s", entry.req.key, entry.node, what,
                    p.to_json(), why)

    def _observed_placement(self, entry: PodEntry, state: ClusterState | None = None
                            ) -> Placement | None:
        """Where the node agent saw bound pod ``entry``: the GPU of its time-sliced
        replica, or the MIG instance it owns (None when not seen)."""
        assert entry.node is not None
        state = self.state if state is None else state
        n = state.nodes.get(entry.node)
        if n is None:
            return None
        if entry.req.kind is RequestKind.MIG:
            return owned_instance(n.info, entry.req)
        return observed_share(self._obs.get(entry.node), entry.node, entry.req)

    def _effective(self, entry: PodEntry) -> PodEntry:
        """``entry`` with its GPU memory as counted: a time-sliced pod's declared need or
        its observed peak plus headroom, whichever is larger (the rule of ``plan``)."""
        obs = self._obs.get(entry.node or "")
        if obs is None or entry.req.kind is not RequestKind.SHARED:
            return entry
        req = with_observed_peak(entry.req, obs.peaks.get(entry.req.key))
        return entry if req is entry.req else replace(entry, req=req)

    def _agrees(self, entry: PodEntry, p: Placement) -> bool:
        """Whether ``p`` is where the pod should be counted: where the node agent saw it,
        else (not seen) where gpupack recorded it, if it did."""
        observed = self._observed_placement(entry)
        if observed is not None:
            node = self.state.nodes.get(p.node)
            if node is not None and entry.req.key in node.unsure:
                return False  # a guess the agent has now seen: count it as seen
            return same_slot(observed, p)
        return entry.recorded is None or same_slot(entry.recorded, p)

    def _note_observation(self, entry: PodEntry, before: Placement | None,
                          state: ClusterState | None = None) -> None:
        """Count a disagreement when the node agent's first sight of a pod's placement
        (or a changed one) differs from where gpupack counted (predicted) it."""
        observed = self._observed_placement(entry, state)
        key = entry.req.key
        if observed is None or self._seen_obs.get(key) == observed:
            return
        self._seen_obs[key] = observed
        before = before if before is not None and before.gpus else entry.recorded
        if before is not None and before.gpus and not same_slot(observed, before):
            kind = "mig" if entry.req.kind is RequestKind.MIG else "shared"
            self.disagreements[kind] += 1
            log.info("pod %s on %s: the node agent saw %s, gpupack counted %s; counting "
                     "the observation", key, entry.node, observed.to_json(), before.to_json())

    def _reaccount_node(self, name: str) -> None:
        """Count the bound pods of ``name`` anew when where they should be counted (the
        node agent's observation, their observed peaks) changed: all of them, the
        observed ones first, so no stale record holds a GPU the observation gives to
        another pod."""
        bound = [self._pods[k] for k in sorted(self._on_node.get(name, ()))
                 if k in self._pods and self._pods[k].node == name and k not in self._assumed
                 and k not in self._holds]
        stale = False
        for entry in bound:
            req, p = self._counted[entry.req.key]
            self._note_observation(entry, p)
            if req != self._effective(entry).req or not self._agrees(entry, p):
                stale = True
        if not stale:
            return
        for entry in bound:
            self._unapply(entry.req.key)
        for entry in sorted(bound, key=lambda e: self._observed_placement(e) is None):
            self._count_bound(entry)

    def _account(self, key: str) -> None:
        """Bring ``key``'s accounting in line with its entry and assumption."""
        entry = self._pods.get(key)
        assumption = self._assumed.get(key)
        self._pending.pop(key, None)
        if entry is not None and assumption is not None:
            if not same_uid(entry.uid, assumption.uid):
                # Another incarnation: a lagging watch still showing the old pod while the
                # new one's Binding is in flight, or the new pod while the old one's bind
                # is (it fails on the UID precondition and is forgotten then). Neither
                # ends the assumption, and the entry is not counted meanwhile: the name
                # has one count, the assumption's (kube.assumptions).
                return
            if entry.finished or entry.node not in (None, assumption.placement.node):
                self._drop_assumption(key)  # bound elsewhere by someone else, or gone
                assumption = None
            elif entry.node == assumption.placement.node:
                # Confirmed: the assumed placement is already applied; it becomes the
                # pod's own accounting (annotations, when present, say the same), unless
                # the node agent has already seen the pod elsewhere.
                self._assumed.drop(key)
                self._note_observation(entry, assumption.placement)
                current = self._counted.get(key)
                if current is not None and (current[0] != self._effective(entry).req
                                            or (self._observed_placement(entry) is not None
                                            and not self._agrees(entry, current[1]))):
                    self._unapply(key)
                    self._count_bound(entry)
                return
        if assumption is not None:
            return  # still assumed and not yet seen bound: stays counted as assumed
        if entry is None or entry.finished:
            counted = key in self._counted
            self._unapply(key)
            if counted:
                for fn in self._gone_hooks:
                    fn(key)
            return
        if entry.node is None:
            self._unapply(key)
            if entry.scheduler == self.scheduler_name:
                self._pending[key] = entry.req
            return
        current = self._counted.get(key)
        if (current is not None and current[1].node == entry.node
                and current[0] == self._effective(entry).req
                and self._agrees(entry, current[1])):
            return  # unchanged binding: nothing to redo (a new record is read below)
        self._note_observation(entry, current[1] if current is not None else None)
        self._unapply(key)
        self._count_bound(entry)

    def _count_bound(self, entry: PodEntry) -> None:
        """Count a pod the API shows bound. It is the truth: a group's hold on the GPUs
        gpupack recorded for it is given up first (the leader's reconcile places that
        room again), so the pod gets its own GPUs, no GPU is counted for both, and giving
        the hold back later cannot free GPUs the pod holds."""
        entry = self._effective(entry)
        rec = self._observed_placement(entry) or entry.recorded
        overlapping: list[str] = []
        if rec is not None and rec.node == entry.node and rec.gpus:
            gpus = set(rec.gpus)
            overlapping = [k for k in sorted(self._on_node.get(rec.node, ()))
                           if k in self._holds and k not in self._pods
                           and k not in self._assumed and gpus & set(self._counted[k][1].gpus)]
        kept = [self._counted[k] for k in overlapping]
        for k in overlapping:
            self._unapply(k)
        p = self._placement_for(entry)
        if p is not None:
            self._apply(entry.req, p)
        for hreq, hp in kept:
            if self._room_free(hreq, hp):
                self._apply(hreq, hp)
            else:
                self._holds.discard(hreq.key)
                log.info("hold %s on %s given up: pod %s is bound there", hreq.key, hp.node,
                         entry.req.key)

    def _room_free(self, req: PodRequest, p: Placement) -> bool:
        """Whether ``p``'s GPUs are free for ``req`` (cordons, CPU and memory aside: a
        hold keeps a room whatever else changed on the node)."""
        if req.kind is RequestKind.WHOLE:
            return all(self.state.gpu(p.node, i).idle for i in p.gpus)
        return any(same_slot(o, p)
                   for o in self.state.options(req, p.node, gpus_only=True))

    def _drop_assumption(self, key: str) -> None:
        self._assumed.drop(key)
        self._unapply(key)

    # ---- nodes -----------------------------------------------------------------------------

    def _node_info(self, obj: Mapping[str, Any]) -> NodeInfo:
        """``node_info`` memoized by what decides a node's GPUs.

        Inferring MIG layouts from allocatable counts is a search that can take a tenth
        of a second per node, and large clusters are made of few node shapes: nodes that
        agree on allocatable, cordon, and the NVIDIA/gpupack labels and annotations get
        the same GPUs, so the inference runs once per shape and the rest is a copy with
        the node's own name and labels.
        """
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping) or not isinstance(meta.get("labels") or {}, Mapping):
            return node_info(obj, mig_actuator=self.mig_actuator)
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if isinstance(annotations, Mapping) and A.INVENTORY in annotations:
            # A node agent's inventory is the node's own (it names the node) and changes
            # with every write (its ts): no other node shares that shape, and keeping it
            # would only fill the memo. Reading it is a decode, not an inference.
            return node_info(obj, mig_actuator=self.mig_actuator)
        status = obj.get("status") or {}
        spec = obj.get("spec") or {}
        try:
            key = repr((
                sorted((k, v) for k, v in labels.items() if k.startswith(_GPU_LABELS)),
                sorted((k, v) for k, v in annotations.items() if k.startswith(_GPU_LABELS))
                if isinstance(annotations, Mapping) else annotations,
                sorted(status.get("allocatable", {}).items())
                if isinstance(status, Mapping) and isinstance(status.get("allocatable"), Mapping)
                else None,
                spec.get("unschedulable") if isinstance(spec, Mapping) else spec,
            ))
        except (AttributeError, TypeError):
            return node_info(obj, mig_actuator=self.mig_actuator)
        shape = self._shapes.get(key)
        if shape is None:
            info = node_info(obj, mig_actuator=self.mig_actuator)
            if len(self._shapes) < 10_000:
                self._shapes[key] = info
            return info
        mine = node_info({"metadata": {"name": meta.get("name"), "labels": labels}})
        return replace(shape, name=mine.name, labels=mine.labels)

    def upsert_node(self, obj: Mapping[str, Any]) -> bool:
        """Add or update a Node object; False when it cannot be read (logged, skipped).

        With an ``inventory_age``, a node whose agent inventory was not rewritten within
        the limit is read as if it had none (``kube.inventory_age``)."""
        age = self.inventory_age
        text = inventory_text(obj)
        # The inventory's ts, read once for both looks at its age (None: no limit).
        ts = written_at(text) if age is not None else None
        name = object_name(obj)
        stale = self._inventory_stale(name, ts, self._clock()) is not None
        try:
            info = self._node_info(without_inventory(obj) if stale else obj)
        except ObjectError as e:
            log.warning("skipping node: %s", e)
            with self.lock:
                self.bad_objects += 1
                if name is not None and name not in self._infos:
                    self._unreadable.add(name)
            return False
        try:
            taints = node_taints(obj)
        except ObjectError as e:
            # The node is usable for pods kube-scheduler places; groups cannot know which
            # of their members tolerate it, so it counts as tainted for every group.
            log.warning("node %s: %s; no group will reserve room on it", info.name, e)
            taints = (UNREADABLE_TAINTS,)
        info = replace(info, taints=taints)  # the shapes cache shares NodeInfos by shape
        with self.lock:
            if age is not None:
                # Decided again under the lock, where expire_inventories runs: an
                # inventory that crossed the limit since (or a clock stepped back) is
                # applied as it is now, not as the first look found it.
                why = self._inventory_stale(name, ts, self._clock(), record=True)
                if (why is not None) != stale:
                    stale = why is not None
                    info = replace(self._node_info(without_inventory(obj) if stale else obj),
                                   taints=taints)
                self._note_age(info.name, obj, why)
            if stale:
                text = None  # no peaks, shares or device owners from a stale inventory
            self._unreadable.discard(info.name)
            seen = self._obs_text.get(info.name, None) == text and info.name in self._obs_text
            if not seen:
                self._obs_text[info.name] = text
                obs = observation_of(text, info.name)
                seen = self._obs.get(info.name, NO_OBSERVATION) == obs
                self._obs[info.name] = obs
            if self._taints.get(info.name, ()) != taints:
                self._taints[info.name] = taints
                old = self._infos.get(info.name)
                if old is not None and replace(old, taints=taints) == info:
                    # Only the taints changed: the next snapshot carries them (the
                    # webhook's capacity scopes read them); the packing state is as it was.
                    self._infos[info.name] = info
                    if not seen:
                        self._observed_changed(info.name)
                    self._changed()
                    for fn in self._node_hooks:
                        fn(info.name)
                    return True
            if self._infos.get(info.name) == info:
                if not seen:  # the agent saw something new: pods, peaks, memory in use
                    self._observed_changed(info.name)
                    self._changed()
                return True  # heartbeat-style update: nothing the packer sees changed
            self._rebuild_node(info)
            self._reaccount_node(info.name)
            self._changed()
            for fn in self._node_hooks:
                fn(info.name)
        return True

    def _inventory_stale(self, name: str | None, ts: int | None, now: float,
                         record: bool = False) -> str | None:
        """Why node ``name``'s inventory, written with ``ts``, is not trusted at ``now``
        (None: it is, or there is no limit, or it has no ``ts``); ``record`` (under the
        lock) keeps its (ts, expiry) for the node."""
        age = self.inventory_age
        if age is None or name is None:
            return None
        if ts is None:
            if record:
                self._inventory_seen.pop(name, None)
            return None
        end = age.expires(ts, now, self._inventory_seen.get(name))
        if record:
            self._inventory_seen[name] = (ts, end)
        return age.reason(ts, end, now)

    def _note_age(self, name: str, obj: Mapping[str, Any], why: str | None) -> None:
        """Which nodes' inventories are stale, and what to re-read each trusted one's node
        from once it expires (under the lock)."""
        if why is not None:
            if name not in self._stale_inventories:
                log.warning("node %s: %s", name, why)
            self._stale_inventories.add(name)
            self._inventory_nodes.pop(name, None)
            return
        if name in self._stale_inventories:
            if name in self._inventory_seen:
                log.info("node %s: the node agent's inventory is fresh again", name)
            else:
                log.info("node %s: its stale node agent inventory was removed", name)
            self._stale_inventories.discard(name)
        if name in self._inventory_seen:
            self._inventory_nodes[name] = essentials(obj)
        else:
            self._inventory_nodes.pop(name, None)

    def expire_inventories(self) -> list[str]:
        """Read again, as inventory-less, every node whose inventory has just passed the
        age limit (no watch event comes when a node agent stops). The nodes re-read; one
        that fails is logged and left out of the next passes."""
        if self.inventory_age is None:
            return []
        with self.lock:
            now = self._clock()
            due = sorted(n for n in self._inventory_nodes
                         if self._inventory_seen.get(n, (0, math.inf))[1] <= now)
            done = []
            for name in due:
                doc = self._inventory_nodes.pop(name)
                try:
                    self.upsert_node(doc)
                except Exception:
                    log.exception("node %s: reading it again without its expired inventory "
                                  "failed", name)
                    continue
                done.append(name)
            return done

    @property
    def stale_inventories(self) -> int:
        """Nodes whose agent inventory is ignored as older than the age limit."""
        return len(self._stale_inventories)

    def _observed_changed(self, name: str) -> None:
        if name in self.state.nodes:
            self._touch(name)  # per-GPU figures (memory observed) are re-rendered
            self._reaccount_node(name)

    def _rebuild_node(self, info: NodeInfo) -> None:
        """Replace one node's state and re-apply the pods counted on it (only this node).

        The new node state is computed in full on a scratch state first; only then is
        anything in the cache changed, so a surprise midway cannot leave pods uncounted.
        Assumptions stay whatever the node now says (see :meth:`_recount_assumption`).
        """
        name = info.name
        scratch = ClusterState(Snapshot(nodes=(info,)))
        kept: list[tuple[PodRequest, Placement]] = []
        redo: list[str] = []  # holds that no longer fit: dropped (their keeper re-places)
        refit: list[PodEntry] = []  # bound pods placed afresh, after those that keep theirs
        existing: dict[str, Placement] = {}  # assumptions now counted differently
        counted = {k: self._counted[k] for k in self._on_node.get(name, set())}
        # A node deleted and added again: the assumptions delete_node kept count again.
        for a in self._assumed.on_node(name):
            counted.setdefault(a.req.key, (a.req, a.placement))
        # Bound pods first, then assumptions, then holds: what the API shows bound is
        # the truth, and a hold must never push a bound pod off its recorded GPUs.
        for key in sorted(counted, key=lambda k: (k in self._holds, k in self._assumed, k)):
            req, p = counted[key]
            entry = self._pods.get(key)
            fits = scratch.shape_error(req, p) is None
            if entry is not None and entry.node == name and key not in self._assumed:
                # A bound pod keeps where it was counted unless that is gone from the node,
                # was counted without GPUs, or was a stand-in for its recorded placement.
                observed = self._observed_placement(entry, scratch)
                if fits and (p.gpus or req.kind is RequestKind.NONE) and (
                        same_slot(observed, p) if observed is not None
                        else entry.recorded is None or same_slot(entry.recorded, p)):
                    p = as_counted(scratch, p)
                    scratch.apply(req, p, allow_overcommit=True,
                                  unsure=self._is_guess(req, p, scratch))
                    kept.append((req, p))
                else:
                    self._note_observation(entry, p, scratch)
                    refit.append(entry)
            else:
                # An assumption or a hold. Its slice "to be created" may have appeared in
                # the node's new layout meanwhile (the bind went through): it is then the
                # existing slice.
                if not fits and p.mig_created:
                    q = replace(p, mig_created=False)
                    if scratch.shape_error(req, q) is None:
                        p, fits = q, True
                if not fits and key in self._assumed:
                    p, fits = self._recount_assumption(req, p), True
                if fits:
                    p = as_counted(scratch, p)
                    if key in self._assumed and p != counted[key][1]:
                        existing[key] = p
                    scratch.apply(req, p, allow_overcommit=True,
                                  unsure=self._is_guess(req, p, scratch))
                    kept.append((req, p))
                else:
                    redo.append(key)
        refit.sort(key=lambda e: self._observed_placement(e, scratch) is None)
        for entry in refit:
            entry = self._effective(entry)
            fresh = self._placement_for(entry, scratch)
            assert fresh is not None  # the node is in scratch
            fresh = as_counted(scratch, fresh)
            scratch.apply(entry.req, fresh, allow_overcommit=True,
                          unsure=self._is_guess(entry.req, fresh, scratch))
            kept.append((entry.req, fresh))
        # Commit: nothing below can fail.
        for key in self._on_node.get(name, set()):
            req, _ = self._counted.pop(key)
            if req.uid and self._uid_key.get(req.uid) == key:
                del self._uid_key[req.uid]
        self._infos[name] = info
        self.state.nodes[name] = scratch.nodes[name]
        self._on_node[name] = set()
        self._touch(name)
        for req, q in kept:
            self._record(req, q)
        for key, q in existing.items():
            self._assumed.move(key, q)
        for key in redo:
            self._account(key)
        # Pods bound to this node before it was known are accounted now.
        for key, entry in self._pods.items():
            if entry.node == name and key not in self._counted and not entry.finished:
                self._account(key)

    @staticmethod
    def _recount_assumption(req: PodRequest, p: Placement) -> Placement:
        """Where an assumption is counted when the node's new state has no room to record
        ``p`` (fewer GPUs, another MIG layout): on the node without GPUs (CPU and memory).
        Its bind may be in flight or done, and the pod then holds what it holds: the
        assumption stays until the bind is confirmed or forgotten, as kube-scheduler
        keeps an assumed pod on its node whatever the node's allocatable now says."""
        log.info("pod %s: the GPUs of its bind to %s are gone from the node; counted "
                 "without GPUs until the bind is confirmed or fails", req.key, p.node)
        return Placement(req.key, p.node)

    def delete_node(self, name: str) -> None:
        """The node is gone: its pods stop counting. Assumptions stay in the book,
        uncounted, until their bind is confirmed or forgotten; if the node comes back
        meanwhile they count on it again (kube-scheduler keeps a removed node's assumed
        pods the same way), so no pod is handed the GPUs of a bind in flight."""
        with self.lock:
            self._unreadable.discard(name)
            if name not in self._infos:
                return
            keys = list(self._on_node.get(name, set()))
            for key in keys:
                req, _ = self._counted.pop(key)
                if req.uid and self._uid_key.get(req.uid) == key:
                    del self._uid_key[req.uid]
            self._on_node.pop(name, None)
            self._taints.pop(name, None)
            self._obs.pop(name, None)
            self._obs_text.pop(name, None)
            self._stale_inventories.discard(name)
            self._inventory_seen.pop(name, None)
            self._inventory_nodes.pop(name, None)
            del self._infos[name]
            self._touched_at.pop(name, None)
            del self.state.nodes[name]
            self._touch(name)
            for key in keys:  # bound pods wait for the node; assumed ones stay assumed
                self._account(key)
            self._changed()

    # ---- pods ------------------------------------------------------------------------------

    def upsert_pod(self, obj: Mapping[str, Any]) -> bool:
        """Add or update a Pod object; False when it cannot be read (logged, skipped)."""
        try:
            node = bound_node(obj)
            req = pod_request(obj, strict=node is None)
            spec = obj.get("spec") or {}
        except (ObjectError, AttributeError) as e:
            log.warning("skipping pod %s: %s", pod_key(obj), e)
            with self.lock:
                self.bad_objects += 1
            return False
        recorded = self._recorded(obj, req.key, node)
        constraints: PodConstraints | str | None = None
        if req.group is not None or req.kind is not RequestKind.NONE:
            try:
                constraints = self._shared_constraints(pod_constraints(obj))
            except ObjectError as e:
                constraints = str(e)
        entry = PodEntry(
            req=req,
            uid=req.uid,
            node=node,
            scheduler=sys.intern(str(spec.get("schedulerName") or "default-scheduler")),
            finished=is_finished(obj),
            recorded=recorded,
            constraints=constraints,
            started=started_at(obj),
        )
        with self.lock:
            old = self._pods.get(req.key)
            if old == entry:
                return True
            try:
                self._store(req.key, old, entry)
            except Exception:
                # A bug in the accounting must neither kill the watch nor leave the pod
                # stored but uncounted: a relist would find the entry unchanged and skip
                # it for ever, its GPUs free for the next pod.
                log.exception("pod %s: counting the update failed; kept as it was", req.key)
                self.bad_objects += 1
                self._restore(req.key, old, entry)
                self._changed()
                return False
            self._changed()
        return True

    @staticmethod
    def _recorded(obj: Mapping[str, Any], key: str, node: str | None) -> Placement | None:
        """The placement recorded on bound pod ``obj``; None when unbound or when the
        record cannot be read (logged). A bound pod holds what it holds whatever its
        annotations say: skipping it would free its GPUs for the next pod, so it is
        counted where the node agent saw it or where it fits instead."""
        if not node:
            return None
        try:
            return recorded_placement(obj, node)
        except (ObjectError, AttributeError) as e:
            log.warning("%s; pod %s counted without its recorded placement", e, key)
            return None

    def _store(self, key: str, old: PodEntry | None, entry: PodEntry) -> None:
        """Replace pod ``key``'s entry ``old`` with ``entry`` and count it anew."""
        self._index(key, old, add=False)
        self._index(key, entry, add=True)
        gone = False
        if old is not None and old.uid != entry.uid:
            # Same name, another UID: the old pod was deleted (a relist after 410 Gone
            # shows the new one without the DELETED). Its count goes, with any assumption
            # made for it, as delete_pod would; an assumption of another incarnation
            # (the new pod's bind, or this object's when it only gained its UID) stays.
            a = self._assumed.get(key)
            if a is None or (same_uid(a.uid, old.uid) and not (a.uid and a.uid == entry.uid)):
                gone = key in self._counted
                self._assumed.drop(key)
                self._unapply(key)
        self._pods[key] = entry
        self._account(key)
        if gone:  # as delete_pod: a group member's room is held again at once
            for fn in self._gone_hooks:
                fn(key)

    def _restore(self, key: str, old: PodEntry | None, entry: PodEntry) -> None:
        """After :meth:`_store` failed midway: ``old`` stored and counted again (it was
        counted before), else no entry at all, so the next event or relist for the pod
        is read afresh rather than found unchanged."""
        self._index(key, entry, add=False)
        self._pods.pop(key, None)
        if old is not None:
            self._index(key, old, add=True)
            self._pods[key] = old
            try:
                self._account(key)
                return
            except Exception:
                log.exception("pod %s: counting it as it was failed too; dropped until "
                              "the next event or relist", key)
                self._index(key, old, add=False)
                self._pods.pop(key, None)
        self._pending.pop(key, None)
        if key not in self._assumed:  # an assumption keeps its count until bind or forget
            try:
                self._unapply(key)
            except Exception:  # the state is what the next rebuild of the node repairs
                log.exception("pod %s: its count could not be taken back", key)

    def _shared_constraints(self, c: PodConstraints) -> PodConstraints:
        """The one object equal to ``c`` (bounded: past the cap the table starts over)."""
        with self.lock:
            kept = self._constraints.get(c)
            if kept is None:
                if len(self._constraints) >= CONSTRAINTS_CAP:
                    self._constraints.clear()
                kept = self._constraints[c] = c
            return kept

    def note_bad_object(self) -> None:
        """An object a source skipped before it reached the cache (a malformed watch
        event): counted with the cache's own in ``bad_objects``."""
        with self.lock:
            self.bad_objects += 1

    def delete_pod(self, key: str) -> None:
        """The watch's DELETED (or a list without the pod). It is the incarnation the
        watch showed last (events of one name come in order); an assumption made for
        another UID is left alone and stays counted (kube.assumptions)."""
        with self.lock:
            entry = self._pods.pop(key, None)
            self._index(key, entry, add=False)
            self._seen_obs.pop(key, None)
            self._pending.pop(key, None)
            a = self._assumed.get(key)
            if a is not None and entry is not None and not same_uid(a.uid, entry.uid):
                # Another incarnation's DELETED: its entry was never counted (the name's
                # one count is the assumption's, see _account), and the bind stays.
                self._changed()
                return
            self._assumed.drop(key)
            counted = key in self._counted
            self._unapply(key)
            if counted:
                for fn in self._gone_hooks:
                    fn(key)
            self._changed()

    def replace(self, nodes: Iterable[Mapping[str, Any]] | None,
                pods: Iterable[Mapping[str, Any]] | None) -> None:
        """A fresh list (start-up or after 410 Gone): objects not listed are deleted.

        Assumptions survive: a bind may not be visible in the list yet.
        """
        with self.lock:
            # A re-iterable collection is read twice rather than copied (a static source
            # decodes its objects one at a time; see kube.source.Decoded).
            if nodes is not None:
                node_list = nodes if isinstance(nodes, Collection) else list(nodes)
                names = {object_name(n) for n in node_list}
                for gone in [n for n in self._infos if n not in names]:
                    self.delete_node(gone)
                self._unreadable &= names
                for n in node_list:
                    self.upsert_node(n)
            if pods is not None:
                pod_list = pods if isinstance(pods, Collection) else list(pods)
                keys = {pod_key(p) for p in pod_list if isinstance(p, Mapping)}
                for gone in [k for k in self._pods if k not in keys]:
                    self.delete_pod(gone)
                for p in pod_list:
                    self.upsert_pod(p)

    def mark_synced(self) -> None:
        with self.lock:
            self.synced = True
            self._changed()

    # ---- group reservation holds (scheduler/groups/loop.py) -----------------------------------

    def hold(self, req: PodRequest, placement: Placement) -> str | None:
        """Count a group reservation member (a synthetic key, never a pod's) on its node,
        so no other pod gets its GPUs; returns why not when the room is no longer free."""
        with self.lock:
            if req.key in self._pods:
                return f"{req.key} is a pod, not a reservation member"
            why = self.state.check(req, placement)
            if why is not None and placement.mig_created:
                # The slice the reservation was to create exists now (and is free).
                existing = replace(placement, mig_created=False)
                if self.state.check(req, existing) is None:
                    placement, why = existing, None
            if why is None:
                self._apply(req, placement)
                self._holds.add(req.key)
                self._changed()
            return why

    def unhold(self, key: str) -> None:
        """Give back what :meth:`hold` took for ``key``."""
        with self.lock:
            self._holds.discard(key)
            if key in self._counted and key not in self._pods and key not in self._assumed:
                self._unapply(key)
                self._changed()

    def holds(self) -> dict[str, tuple[PodRequest, Placement]]:
        """What :meth:`hold` counts now, by hold key (a node rebuild may have dropped a
        hold that no longer fits)."""
        with self.lock:
            gone = [k for k in self._holds if k not in self._counted]
            self._holds.difference_update(gone)
            return {k: self._counted[k] for k in self._holds}

    # ---- assume ----------------------------------------------------------------------------

    def assume(self, req: PodRequest, uid: str, placement: Placement) -> None:
        """Reserve ``placement`` for pending ``req``; AssumeError when it cannot be had.

        Check and take happen under the one lock: of two racing binds for the same GPU,
        the second finds it taken.
        """
        with self.lock:
            held = self._assumed.get(req.key)
            if held is not None:
                raise AssumeError(f"pod {req.key} is already being bound to "
                                  f"{held.placement.node}")
            entry = self._pods.get(req.key)
            if entry is not None and entry.node is not None:
                raise AssumeError(f"pod {req.key} is already bound to {entry.node}")
            if entry is not None and uid and entry.uid and entry.uid != uid:
                raise AssumeError(f"pod {req.key} has UID {entry.uid}, not {uid}")
            why = self.state.check(req, placement)
            if why is not None:
                raise AssumeError(f"pod {req.key}: {why}")
            self._pending.pop(req.key, None)
            self._assumed.add(Assumption(req, uid, placement))
            try:
                self._apply(req, placement)
            except PlacementError as e:  # check passed, so this is a bug; undo the record
                self._assumed.drop(req.key)
                raise AssumeError(str(e)) from None
            self._changed()

    def forget(self, key: str, uid: str | None = None) -> None:
        """Drop an assumption (the bind failed): the resources are free again.

        With ``uid``, only the assumption made with that UID: the failed bind of a pod
        deleted and recreated under the same name must not end the new pod's (whose GPUs
        would be handed out again while its Binding holds them). Without, whichever
        assumption ``key`` has."""
        with self.lock:
            if not self.is_assumed(key, uid):
                return
            self._drop_assumption(key)
            self._account(key)
            self._changed()
