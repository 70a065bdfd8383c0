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

*Dynamic Resource Allocation*: a node whose GPUs are devices of ResourceSlices gets them
from its slices (:func:`packing.dra.inventory.with_dra_gpus`), what allocated claims
hold there (allocations the extender assumed included) is counted as the claims' own
entries beside its pods (which hold CPU and memory there), and its claims' entries never
displace a hold or an assumption (:meth:`ClusterCache._dra_apply`). The objects
themselves are :class:`kube.dra_store.DraObjects`.

:class:`ClusterCache` is one class of about 1,200 lines on purpose: every handler (a
node, a pod, a hold, an assumption, a DRA object) changes the same indexes and the one
:class:`~packing.state.ClusterState` under one lock, keeping one invariant (each pod and
each claim counted once, where it holds what it holds). What needs none of that state is
its own module: where a bound pod is counted and what the node agents observed
(:mod:`kube.observations`), node shapes (:mod:`kube.node_shapes`), the trust in agent
inventories by age (:mod:`kube.inventory_age`), assumed binds (:mod:`kube.assumptions`),
state signatures (:mod:`kube.signatures`), the DRA objects (:mod:`kube.dra_store`) and
what a pod asks of them (:mod:`kube.dra_pods`).
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Set
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from kube.assumptions import AssumedBinds, AssumeError, Assumption, same_uid
from kube.constraints import PodConstraints, Taint, node_taints, pod_constraints
from kube.dra_pods import read_pod_claims
from kube.dra_store import DraObjects
from kube.grouped import GroupTally
from kube.inventory_age import (
    InventoryAge,
    InventoryTrust,
    steady_clock,
    without_inventory,
    written_at,
)
from kube.node_objects import (
    UNREADABLE_TAINTS,
    NodeObservation,
    advertises_gpus,
    inventory_text,
)
from kube.node_shapes import NodeShapes
from kube.objects import (
    ObjectError,
    bound_node,
    is_finished,
    object_name,
    pod_key,
    pod_request,
    recorded_placement,
    started_at,
)
from kube.observations import Observations, PodEntry, as_counted, same_slot
from kube.signatures import SignatureBook
from kube.worst_case import message as worst_case_message
from kube.worst_case import unreadable_input, worst_case_request
from packing.dra.inventory import (
    USE_MARK,
    DraInventory,
    claim_uses,
    taint_uses,
    whole_gpu_demand,
    with_dra_gpus,
)
from packing.dra.objects import AllocatedDevice
from packing.dra.world import DraWorld
from packing.model import NodeInfo, Placement, PodRequest, RequestKind, Snapshot
from packing.state import (
    ClusterState,
    PlacementError,
)

log = logging.getLogger("gpupack.kube.cache")
CONSTRAINTS_CAP = 10_000  # distinct pod constraints shared (see _shared_constraints)


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
        # Which nodes' inventories are trusted, until when, and what to re-read each node
        # from once its inventory expires.
        self._trust = InventoryTrust(inventory_age)
        # Whether MIG layouts of nodes that opt in may change (kube.node_objects.node_info).
        self.mig_actuator = mig_actuator
        self.lock = threading.RLock()
        self.state = ClusterState(Snapshot(nodes=()))
        self.synced = False
        self._infos: dict[str, NodeInfo] = {}
        self._pods: dict[str, PodEntry] = {}
        self._assumed = AssumedBinds()
        # Everything applied to ``state``: watch-bound pods and assumed ones.
        self._counted: GroupTally[str, tuple[PodRequest, Placement]] = GroupTally(
            lambda e: e[0].group is not None)
        self._on_node: dict[str, set[str]] = {}
        self._touched_at: dict[str, float] = {}  # node -> monotonic time of its last change
        self._uid_key: dict[str, str] = {}
        # Ours, unbound, not assumed; arrival order.
        self._pending: GroupTally[str, PodRequest] = GroupTally(lambda r: r.group is not None)
        self._gen: dict[str, int] = {}
        self._next_gen = 0
        self.version = 0  # changes on every change that could change a plan
        self.bad_objects = 0  # objects that could not be read (logged, skipped)
        # Bound pods counted at their worst (kube.worst_case): key -> (uid, why, message).
        self._worst: dict[str, tuple[str, str, str]] = {}
        self._listeners: list[Callable[[], None]] = []
        self._shapes = NodeShapes(mig_actuator)  # node_info memoized per node shape
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
        # What each node's agent observed, and where a bound pod is counted.
        self.observed = Observations()
        # Nodes the watch showed whose objects could not be read, never read before: not
        # "unseen" (see unreadable_node), so a filter does not wait for them.
        self._unreadable: set[str] = set()
        # Dynamic Resource Allocation: the resource.k8s.io objects (kube.dra_store); each
        # node as its Node object reads, before the GPUs of its slices are added; the
        # nodes whose GPUs are DRA devices (their pods hold GPUs through claims, so a
        # pod is counted there with CPU and memory only); and per node, the keys of what
        # claims hold there, counted like holds (packing.dra.inventory.claim_uses).
        self.dra = DraObjects()
        self._base_infos: dict[str, NodeInfo] = {}
        self._device_plugin: set[str] = set()  # nodes whose allocatable has GPU resources
        self._dra_nodes: set[str] = set()
        self._dra_keys: dict[str, set[str]] = {}
        self._dra_want: dict[str, dict[str, tuple[PodRequest, Placement]]] = {}
        self._dra_inv: dict[str, DraInventory] = {}  # DRA nodes' inventories
        # Nodes where a claim entry is counted without its GPUs: another entry (a group's
        # hold, an assumed bind with GPUs) held them when the claim's allocation came.
        self._dra_degraded: set[str] = set()
        self._dra_retrying = False
        # Group members whose claims (or templates) the watch has not shown yet: read
        # again when it does (their GPU demand comes from their claims).
        self._dra_waiting: dict[str, Mapping[str, Any]] = {}

    # ---- listeners and views ---------------------------------------------------------------

    def subscribe(self, fn: Callable[[], None]) -> None:
        """``fn`` is called (under the lock: keep it tiny) after every change."""
        self._listeners.append(fn)

    def _changed(self) -> None:
        if self._dra_degraded and not self._dra_retrying:
            # Claim entries counted without their GPUs (another entry held them): tried
            # again after every change, until what held the GPUs lets go.
            self._dra_retrying = True
            try:
                self._dra_sync_nodes(set(self._dra_degraded))
            finally:
                self._dra_retrying = False
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
        if entry.req.group is not None and not (add and key in self._dra_waiting):
            # A member whose claims are not seen yet is not shown to the book: its GPU
            # demand is not known (an unseen member is one the filter answers with an
            # error, retried).
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
        return self.observed.of(node)

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

    def group_requests(self) -> tuple[list[tuple[PodRequest, Placement]], list[PodRequest]]:
        """The counted entries (bound, assumed, held) and the pending pods whose request
        is in a group, each in the order :meth:`snapshot` and :meth:`pending` list them;
        no pass over the pods when none is (the reservation book's every step)."""
        with self.lock:
            counted = ([e for e in self._counted.values() if e[0].group is not None]
                       if self._counted.grouped_count else [])
            pending = ([p for p in self._pending.values() if p.group is not None]
                       if self._pending.grouped_count else [])
            return counted, pending

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
                self.dra_world(),
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
        guess = self.observed.is_guess(req, p, self.state)
        self.state.apply(req, p, allow_overcommit=True, unsure=guess)
        self._record(req, p)

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

    def _reaccount_node(self, name: str) -> None:
        """Count the bound pods of ``name`` anew when where they should be counted (the
        node agent's observation, their observed peaks) changed: all of them, the
        observed ones first, so no stale record holds a GPU the observation gives to
        another pod."""
        obs = self.observed
        bound = [self._pods[k] for k in sorted(self._on_node.get(name, ()))
                 if k in self._pods and self._pods[k].node == name and k not in self._assumed
                 and k not in self._holds]
        stale = False
        for entry in bound:
            req, p = self._counted[entry.req.key]
            obs.note_observation(entry, p, self.state)
            if req != obs.effective(entry).req or not obs.agrees(entry, p, self.state):
                stale = True
        if not stale:
            return
        for entry in bound:
            self._unapply(entry.req.key)
        for entry in sorted(bound, key=lambda e: obs.observed_placement(e, self.state) is None):
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
                self.observed.note_observation(entry, assumption.placement, self.state)
                current = self._counted.get(key)
                obs = self.observed
                if current is not None and (
                        current[0] != obs.effective(entry).req
                        or (entry.node in self._dra_nodes and current[1].gpus)
                        or (obs.observed_placement(entry, self.state) is not None
                            and not obs.agrees(entry, current[1], self.state))):
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
            if entry.scheduler == self.scheduler_name and key not in self._dra_waiting:
                self._pending[key] = entry.req
            return
        current = self._counted.get(key)
        if (current is not None and current[1].node == entry.node
                and current[0] == self.observed.effective(entry).req
                and not (entry.node in self._dra_nodes and current[1].gpus)
                and self.observed.agrees(entry, current[1], self.state)):
            return  # unchanged binding: nothing to redo (a new record is read below)
        self.observed.note_observation(entry, None if current is None else current[1],
                                       self.state)
        self._unapply(key)
        self._count_bound(entry)

    def _count_bound(self, entry: PodEntry) -> None:
        """Count a pod the API shows bound. It is the truth: a group's hold on the GPUs
        gpupack recorded for it is given up first (the leader's reconcile places that
        room again), so the pod gets its own GPUs, no GPU is counted for both, and giving
        the hold back later cannot free GPUs the pod holds."""
        entry = self.observed.effective(entry)
        rec = self.observed.observed_placement(entry, self.state) or entry.recorded
        overlapping: list[str] = []
        if rec is not None and rec.node == entry.node and rec.gpus:
            gpus = set(rec.gpus)
            overlapping = [k for k in sorted(self._on_node.get(rec.node, ()))
                           if k in self._holds and k not in self._pods
                           and k not in self._assumed and gpus & set(self._counted[k][1].gpus)]
        kept = [self._counted[k] for k in overlapping]
        for k in overlapping:
            self._unapply(k)
        p = self._placement_for(entry, self.state)
        if p is not None:
            self._apply(entry.req, p)
        for hreq, hp in kept:
            if self._room_free(hreq, hp):
                self._apply(hreq, hp)
            else:
                self._holds.discard(hreq.key)
                log.info("hold %s on %s given up: pod %s is bound there", hreq.key, hp.node,
                         entry.req.key)

    def _placement_for(self, entry: PodEntry, state: ClusterState) -> Placement | None:
        """Where a bound pod is counted (:meth:`Observations.placement_for`), but on a
        DRA node with CPU and memory only: its GPUs are its claims' devices, counted as
        the claims' own entries (a pod asking ``nvidia.com/gpu`` there is served by DRA,
        KEP-5004)."""
        if entry.node in self._dra_nodes and entry.node in state.nodes:
            return Placement(entry.req.key, entry.node)
        return self.observed.placement_for(entry, state)

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

    def upsert_node(self, obj: Mapping[str, Any]) -> bool:
        """Add or update a Node object; False when it cannot be read (logged, skipped).

        With an ``inventory_age``, a node whose agent inventory was not rewritten within
        the limit is read as if it had none (``kube.inventory_age``). A node with GPUs
        in ResourceSlices gets them, and what its claims hold, after it is read."""
        ok = self._upsert_node(obj)
        name = object_name(obj)
        if ok and isinstance(name, str):
            with self.lock:
                if self._dra_sync_nodes({name}):
                    self._changed()
        return ok

    def _upsert_node(self, obj: Mapping[str, Any]) -> bool:
        age = self.inventory_age
        text = inventory_text(obj)
        # The inventory's ts, read once for both looks at its age (None: no limit).
        ts = written_at(text) if age is not None else None
        name = object_name(obj)
        stale = self._trust.stale(name, ts, self._clock()) is not None
        try:
            info = self._shapes.info(without_inventory(obj) if stale else obj)
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
                why = self._trust.stale(name, ts, self._clock(), record=True)
                if (why is not None) != stale:
                    stale = why is not None
                    info = replace(self._shapes.info(without_inventory(obj) if stale else obj),
                                   taints=taints)
                self._trust.note(info.name, obj, why)
            if stale:
                text = None  # no peaks, shares or device owners from a stale inventory
            self._unreadable.discard(info.name)
            self._base_infos[info.name] = info
            if advertises_gpus(obj):
                self._device_plugin.add(info.name)
            else:
                self._device_plugin.discard(info.name)
            if self._dra_relevant(info.name):
                info = self._dra_info(info, self.dra.node_views([info.name])[info.name][0])
            seen = self.observed.update(info.name, text)
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

    def expire_inventories(self) -> list[str]:
        """Read again, as inventory-less, every node whose inventory has just passed the
        age limit (no watch event comes when a node agent stops). The nodes re-read; one
        that fails is logged and left out of the next passes."""
        if self.inventory_age is None:
            return []
        with self.lock:
            done = []
            for name, doc in self._trust.due(self._clock()):
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
        return self._trust.stale_count

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
                observed = self.observed.observed_placement(entry, scratch)
                on_dra = name in self._dra_nodes
                if fits and (p.gpus or req.kind is RequestKind.NONE or on_dra) and not (
                        on_dra and p.gpus) and (
                        same_slot(observed, p) if observed is not None
                        else entry.recorded is None or same_slot(entry.recorded, p)):
                    p = as_counted(scratch, p)
                    scratch.apply(req, p, allow_overcommit=True,
                                  unsure=self.observed.is_guess(req, p, scratch))
                    kept.append((req, p))
                else:
                    self.observed.note_observation(entry, p, scratch)
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
                                  unsure=self.observed.is_guess(req, p, scratch))
                    kept.append((req, p))
                else:
                    redo.append(key)
        refit.sort(key=lambda e: self.observed.observed_placement(e, scratch) is None)
        for entry in refit:
            entry = self.observed.effective(entry)
            fresh = self._placement_for(entry, scratch)
            assert fresh is not None  # the node is in scratch
            fresh = as_counted(scratch, fresh)
            scratch.apply(entry.req, fresh, allow_overcommit=True,
                          unsure=self.observed.is_guess(entry.req, fresh, scratch))
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
            self._base_infos.pop(name, None)
            self._device_plugin.discard(name)
            self._dra_nodes.discard(name)
            self._dra_keys.pop(name, None)
            self._dra_want.pop(name, None)
            self._dra_inv.pop(name, None)
            self._dra_degraded.discard(name)
            self.observed.forget_node(name)
            self._trust.forget(name)
            del self._infos[name]
            self._touched_at.pop(name, None)
            del self.state.nodes[name]
            self._touch(name)
            for key in keys:  # bound pods wait for the node; assumed ones stay assumed
                self._account(key)
            self._changed()

    # ---- pods ------------------------------------------------------------------------------

    def upsert_pod(self, obj: Mapping[str, Any]) -> bool:
        """Add or update a Pod object; False when it cannot be read (logged, skipped).
        A bound pod whose gpupack inputs cannot be read is counted at its worst instead
        (kube.worst_case), never skipped: it holds its devices whatever they say."""
        unreadable: str | None = None
        node: str | None = None
        try:
            node = bound_node(obj)
            req = pod_request(obj, strict=node is None)
            spec = obj.get("spec") or {}
            # Read as declaring nothing, an unreadable size would count a share as free.
            why = unreadable_input(obj) if node else None
            if why is not None:
                raise ObjectError(why)
        except (ObjectError, AttributeError) as e:
            worst = worst_case_request(obj, self._largest_gpu_mib(node)) if node else None
            if worst is None:
                log.warning("skipping pod %s: %s", pod_key(obj), e)
                with self.lock:
                    self.bad_objects += 1
                return False
            req, unreadable = worst, str(e)
            spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
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
            unreadable=unreadable,
        )
        with self.lock:
            if req.group is not None and req.kind is RequestKind.NONE and isinstance(
                    spec, Mapping) and spec.get("resourceClaims"):
                entry.req = self._dra_member_request(obj, req)
            old = self._pods.get(req.key)
            if old == entry:
                return True
            self._note_worst(req, unreadable)
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

    def _largest_gpu_mib(self, node: str | None) -> int | None:
        """The memory of the largest GPU of ``node`` as the cache knows it (None: the node
        or its GPUs unknown)."""
        with self.lock:
            info = self._infos.get(node or "")
            return max((g.memory_mib for g in info.gpus), default=None) if info else None

    def _note_worst(self, req: PodRequest, why: str | None) -> None:
        """Keep the book of pods counted at their worst (under the lock)."""
        if why is None:
            self._worst.pop(req.key, None)
            return
        if self._worst.get(req.key, ("", "", ""))[:2] != (req.uid, why):
            text = worst_case_message(why, req)
            log.warning("pod %s: %s", req.key, text)
            self._worst[req.key] = (req.uid, why, text)

    def worst_case_pods(self) -> dict[str, tuple[str, str, str]]:
        """Bound pods counted at their worst: key -> (uid, why, the message naming it)."""
        with self.lock:
            return dict(self._worst)

    def _dra_member_request(self, obj: Mapping[str, Any], req: PodRequest) -> PodRequest:
        """A group member asking GPUs through its claims: the whole GPUs they ask for
        (:func:`packing.dra.inventory.whole_gpu_demand`) as its request, so the
        reservation book places its group as it places members asking ``nvidia.com/gpu``.
        A member whose claims are not seen yet is read again when they are."""
        pc = read_pod_claims(obj, self.dra)
        if pc.behind:
            self._dra_waiting[req.key] = obj
        else:
            self._dra_waiting.pop(req.key, None)
        n = whole_gpu_demand([c for _, c in pc.own], self.dra.classes)
        if not n:
            return req
        return replace(req, kind=RequestKind.WHOLE, gpu_count=n)

    def delete_pod(self, key: str) -> None:
        """The watch's DELETED (or a list without the pod). It is the incarnation the
        watch showed last (events of one name come in order); an assumption made for
        another UID is left alone and stays counted (kube.assumptions)."""
        with self.lock:
            self._worst.pop(key, None)
            self._dra_waiting.pop(key, None)
            entry = self._pods.pop(key, None)
            self._index(key, entry, add=False)
            self.observed.forget_pod(key)
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

    # ---- Dynamic Resource Allocation ---------------------------------------------------------

    def upsert_dra(self, kind: str, obj: Mapping[str, Any]) -> bool:
        """Add or update a ``resource.k8s.io`` object of ``kind`` (kube.dra_store.KINDS);
        False when it cannot be read (logged, counted, its previous version dropped)."""
        with self.lock:
            ok = self.dra.upsert(kind, obj)
            if not ok:
                self.bad_objects += 1
            self._dra_changed()
            return ok

    def delete_dra(self, kind: str, key: str) -> None:
        """The watch's DELETED (``key``: name, or namespace/name for claims and
        templates)."""
        with self.lock:
            self.dra.delete(kind, key)
            self._dra_changed()

    def replace_dra(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list of ``kind``: objects not listed are gone."""
        with self.lock:
            before = self.dra.bad_objects
            self.dra.replace(kind, objs)
            self.bad_objects += self.dra.bad_objects - before
            self._dra_changed()

    def dra_world(self) -> DraWorld | None:
        """The cluster's DRA objects for predictions; None when it has none."""
        with self.lock:
            return None if self.dra.empty else self.dra.world()

    def is_dra_node(self, name: str) -> bool:
        """Whether ``name``'s GPUs are devices of its ResourceSlices."""
        return name in self._dra_nodes

    def dra_nodes(self) -> frozenset[str]:
        return frozenset(self._dra_nodes)

    def dra_inventory(self, name: str) -> DraInventory | None:
        """A DRA node's GPUs as its slices publish them (None: not a DRA node)."""
        return self._dra_inv.get(name)

    def assume_dra(self, pod: str, claims: Mapping[str, tuple[AllocatedDevice, ...]]) -> None:
        """Count the allocations predicted for ``pod``'s claims (claim key -> devices) as
        held until the claim watch shows them (kube-scheduler's PreBind writes them just
        before the extender's bind): an assumed pod's claims, as an assumed bind is."""
        with self.lock:
            self.dra.assume(pod, claims)
            self._dra_changed()

    def forget_dra(self, pod: str) -> None:
        with self.lock:
            self.dra.forget(pod)
            self._dra_changed()

    def _dra_changed(self) -> None:
        dirty = self.dra.take_dirty()
        if dirty is None:
            dirty = set(self._dra_nodes) | self.dra.slice_nodes()
        self._dra_sync_nodes(dirty)
        for obj in list(self._dra_waiting.values()):
            self.upsert_pod(obj)  # its claims may be seen now
        self._changed()

    def _dra_relevant(self, name: str) -> bool:
        return (name in self._dra_nodes or bool(self._dra_keys.get(name))
                or self.dra.has_slices(name))

    def _dra_info(self, base: NodeInfo, inventory: DraInventory | None) -> NodeInfo:
        """``base`` with its slices' GPUs (membership of ``_dra_nodes`` updated)."""
        info, is_dra = with_dra_gpus(base, inventory,
                                     device_plugin=base.name in self._device_plugin)
        if is_dra:
            self._dra_nodes.add(base.name)
        else:
            self._dra_nodes.discard(base.name)
        return info

    def _dra_sync_nodes(self, names: Iterable[str]) -> bool:
        """Bring the GPUs and claim entries of ``names`` in line with the DRA objects;
        whether anything changed. Nodes the Node watch has not shown wait for it."""
        relevant = {n for n in names if n in self._base_infos and self._dra_relevant(n)}
        if not relevant:
            return False
        views = self.dra.node_views(relevant)
        changed = False
        for name in sorted(relevant):
            inventory, uses = views[name]
            changed |= self._dra_apply(name, inventory, uses)
        return changed

    def _dra_apply(self, name: str, inventory: DraInventory | None,
                   uses: list[tuple[str, tuple[AllocatedDevice, ...]]]) -> bool:
        info = self._dra_info(self._base_infos[name], inventory)
        want: dict[str, tuple[PodRequest, Placement]] = {}
        self._dra_inv.pop(name, None)
        if name in self._dra_nodes:
            assert inventory is not None
            self._dra_inv[name] = inventory
            held: set[int] = set()
            for key, results in uses:
                for req, p in claim_uses(inventory, key, results):
                    want.setdefault(req.key, (req, p))  # a shared MIG device: once
                    held.update(p.gpus)
            for req, p in taint_uses(inventory, held):
                want[req.key] = (req, p)
        if (info == self._infos.get(name) and want == self._dra_want.get(name, {})
                and name not in self._dra_degraded and all(k in self._counted for k in want)):
            return False
        for key in self._dra_keys.pop(name, set()):
            self._unapply(key)
        rebuilt = info != self._infos.get(name)
        if rebuilt:
            self._rebuild_node(info)
            self._reaccount_node(name)
        degraded = False
        for req, p in want.values():
            # What the API shows allocated is the truth, but so is what holds the GPUs
            # now (a group's hold, a bind assumed with GPUs): neither is displaced; the
            # claim's entry counts without GPUs until the other lets go (_changed).
            if self.state.shape_error(req, p) is not None:
                log.debug("claim entry %s on %s: its GPUs are held; counted without them "
                          "for now", req.key, name)
                p = Placement(req.key, name)
                degraded = True
            self.state.apply(req, p, allow_overcommit=True)
            self._record(req, p)
        if degraded:
            self._dra_degraded.add(name)
        else:
            self._dra_degraded.discard(name)
        self._dra_keys[name] = set(want)
        self._dra_want[name] = want
        self._touch(name)
        if rebuilt:
            for fn in self._node_hooks:
                fn(name)
        return True

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
            if self._claims_hold(placement):
                # On a DRA node, GPUs its claims' entries hold already (kube-scheduler's
                # PreBind wrote the allocation before this bind): the pod holds CPU and
                # memory, the claims the GPUs (a group member's room, say).
                req = replace(req, kind=RequestKind.NONE, gpu_count=0, mig_profile=None,
                              gpu_milli=0, gpu_memory_mib=0)
                placement = Placement(req.key, placement.node)
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

    def _claims_hold(self, p: Placement) -> bool:
        """Whether ``p`` names GPUs of a DRA node that claim entries hold, each of them."""
        if not p.gpus or p.node not in self._dra_nodes:
            return False
        for i in p.gpus:
            try:
                g = self.state.gpu(p.node, i)
            except KeyError:
                return False
            owners = {g.whole_owner, *(o for _, o in g.instances.values()), *g.shared_owners}
            owners.discard(None)
            if not owners or not all(o is not None and USE_MARK in o for o in owners):
                return False
        return True

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

    @property
    def disagreements(self) -> dict[str, int]:
        """Pods the node agent saw elsewhere than gpupack counted them, by kind (shared,
        mig): :attr:`kube.observations.Observations.disagreements`."""
        return self.observed.disagreements
