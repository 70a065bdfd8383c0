"""What a snapshot offers small pods, per GPU model: MIG slices and time-sliced room.

The webhook answers per pod in well under a millisecond even at thousands of nodes, so
it never walks the nodes per request: :class:`ClusterView` condenses a
:class:`~packing.model.Snapshot` once (through :class:`~packing.state.ClusterState`, the
same accounting the scheduler uses) into per-model counts that a decision reads in
O(models x profiles).

Only the nodes a pod can reach count. The view :meth:`ClusterView.of` returns covers the
nodes a pod without node-level constraints can run on (no NoSchedule/NoExecute taint);
a pod with a node selector, required node affinity or tolerations of taints some node
has gets :meth:`ClusterView.scoped`: the same counts over the nodes
:func:`packing.constraints.exclusion` lets it reach, condensed once per distinct constraint
signature and view (LRU of :data:`SCOPES_KEPT`) and then kept up to date as claims are
added. A claim records the nodes its pod could reach and is taken only from views that
share a node with them. DRA nodes are counted from their devices
(:mod:`webhook.dra_view`), a claim taken there placed as the allocator would. Pure: no
I/O. It runs past 600 lines as one purpose: the view and the claims that update it share
the private reach state (``_Root``), DRA nodes included.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from kube import annotations as A
from packing.catalog import GpuModel, get_model, mps_client_mib
from packing.constraints import BLOCKING, NodeLevel, exclusion, reach_text, tolerates
from packing.dra.world import DraWorld
from packing.mig.layout import MigSlot, free_starts
from packing.model import (
    GPU_MILLI,
    GpuInfo,
    GpuMode,
    MigReconfigure,
    NodeInfo,
    PodRequest,
    RequestKind,
    Snapshot,
    Taint,
)
from packing.state import ClusterState, GpuState, creatable
from webhook.dra_view import DraMemo, DraModelOffer, DraNode, DraView, Take, dra_view


@dataclass(frozen=True)
class ModelCapacity:
    """One GPU model as present in the cluster."""

    model: GpuModel
    products: tuple[str, ...]  # nvidia.com/gpu.product values of nodes with this model
    gpus: int
    mig_gpus: int  # GPUs in MIG mode, or idle whole GPUs that may be switched to MIG now
    # profile -> free instances that exist now.
    mig_free: Mapping[str, int]
    shared_gpus: int  # time-sliced GPUs (MPS ones are counted in mps_gpus)
    # (free MiB, free milli-GPU, replicas left) of time-sliced GPUs with a replica left ->
    # how many GPUs. Replicas left is UNLIMITED where the GPU sets no replica count.
    shared_room: Mapping[tuple[int, int, int], int]
    # profile -> new instances that could be made now at free starts, on nodes whose
    # layouts may change (they opt in and the MIG actuator is on).
    mig_creatable: Mapping[str, int]
    # profile -> instances that exist, free or in use: a pod may wait for one of these.
    mig_existing: Mapping[str, int]
    # Of mig_gpus, those on nodes whose layouts may change: any profile may appear there.
    mig_changeable_gpus: int
    # Of mig_gpus, those of nodes that report no MIG instance at all yet (labels say MIG,
    # the device plugin has advertised no slice, no agent inventory): a node coming up,
    # whose layout is unknown, so any profile may still appear there. (A node that
    # reports some instances has reported its layout: its other GPUs add nothing.)
    mig_unreported_gpus: int
    # MIG-capable GPUs that serve no MIG pod and never will until something changes, by
    # why: MIG mode on a node whose layout is fixed (``mig_fixed``), or another mode on a
    # node that may not be switched (``mig_off``; ON there means every such GPU is busy).
    mig_fixed: Mapping[MigReconfigure, int]
    mig_off: Mapping[MigReconfigure, int]
    # MPS-shared GPUs (the device plugin's sharing.mps: each client capped at the GPU's
    # memory / replicas), their client sizes in MiB (free or not), and
    # (client MiB, free milli-GPU, replicas left) of those with a replica left -> GPUs.
    mps_gpus: int = 0
    mps_clients: frozenset[int] = frozenset()
    mps_room: Mapping[tuple[int, int, int], int] = field(
        default_factory=lambda: MappingProxyType({}))
    # profile -> MIG instances on cordoned nodes (in reach): none free, none counted
    # above; the last place a pod may wait for, when nothing on a live node holds it.
    mig_cordoned: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    cordoned_gpus: int = 0  # GPUs of this model on cordoned nodes (in reach), any mode
    # DRA nodes (webhook.dra_view): whole GPUs the allocator serves nvidia.com/gpu from,
    # free now and in all, for a small pod's last resort there. Their MIG devices and
    # shares are counted above, with the device plugin's.
    whole_free: int = 0
    whole_gpus: int = 0
    dra_gpus: int = 0  # of ``gpus``, those on DRA nodes
    # Of ``mig_free`` and ``shared_room``, what DRA nodes offer: a claim taken there is
    # placed on one of them as the allocator would (webhook.dra_view.DraView.after),
    # since a DRA device of one profile may share memory slices with another's.
    dra_mig_free: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    dra_shared_room: Mapping[tuple[int, int, int], int] = field(
        default_factory=lambda: MappingProxyType({}))
    # Some node of this model carries no nvidia.com/gpu.product label (a DRA node without
    # GPU Feature Discovery): pinning a pod to ``products`` would keep it off that node.
    unlabelled: bool = False

    def mig_available(self, profile: str) -> int:
        """Instances of ``profile`` a pod could take now: free ones and creatable ones."""
        return self.mig_free.get(profile, 0) + self.mig_creatable.get(profile, 0)

    def mig_possible(self, profile: str) -> bool:
        """Whether a pod asking for ``profile`` here can ever be served: an instance
        exists (free or in use), or layouts may change on some of this model's GPUs."""
        return (self.mig_existing.get(profile, 0) > 0 or self.mig_changeable_gpus > 0
                or self.mig_unreported_gpus > 0)

    def shared_available(self, memory_mib: int, compute_milli: int) -> int:
        """Time-sliced GPUs of this model with room for the share now."""
        return sum(
            n
            for (mem, milli, _), n in self.shared_room.items()
            if mem >= memory_mib and milli >= compute_milli
        )

    def mps_available(self, memory_mib: int, compute_milli: int) -> int:
        """MPS GPUs of this model with a free replica whose memory cap holds the share."""
        return sum(
            n
            for (client, milli, _), n in self.mps_room.items()
            if client >= memory_mib and milli >= compute_milli
        )

    def mps_possible(self, memory_mib: int) -> bool:
        """Whether some MPS replica of this model, free or not, holds ``memory_mib``."""
        return any(c >= memory_mib for c in self.mps_clients)


# Scoped views kept per view (distinct node-level constraints of the pods reviewed).
SCOPES_KEPT = 32
_OVERLAPS_KEPT = 4096


# The taint the node lifecycle controller puts on a cordoned node. The cordon itself is
# judged in _condense (nothing free; its MIG instances kept apart), so the taint does not
# also take the node out of reach: a pod would be refused for not tolerating it.
UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"


def _reach_taints(info: NodeInfo) -> tuple[Taint, ...]:
    if not info.unschedulable or not info.taints:
        return info.taints
    return tuple(t for t in info.taints if t.key != UNSCHEDULABLE_TAINT_KEY)


class _Root:
    """What every view derived from one snapshot shares: the accounting to condense
    scoped views from, and their cache (LRU, one per distinct node-level constraint)."""

    def __init__(self, state: ClusterState, seen: frozenset[str],
                 dra: DraView | None = None) -> None:
        self.state = state
        self.seen = seen
        self.dra = dra if dra is not None else DraView()
        self.lock = threading.RLock()
        self.scoped: OrderedDict[NodeLevel, ClusterView] = OrderedDict()
        # (id(claim reach), id(view reach)) -> (both sets, whether they share a node).
        self.overlaps: dict[tuple[int, int],
                            tuple[frozenset[str], frozenset[str], bool]] = {}
        self.base_reach: frozenset[str] = frozenset()
        self.base_models: Mapping[str, ModelCapacity] = MappingProxyType({})
        # Every NoSchedule/NoExecute taint some node has.
        self.taints = frozenset(t for node in state.nodes.values()
                                for t in _reach_taints(node.info) if t.effect in BLOCKING)
        self.selector_reach: dict[tuple[tuple[str, str], ...], frozenset[str] | None] = {}

    def dra_in(self, reach: Iterable[str]) -> Mapping[str, DraNode]:
        """The DRA nodes among ``reach``."""
        nodes = self.dra.nodes
        return MappingProxyType({n: nodes[n] for n in reach if n in nodes})

    def normalize(self, level: NodeLevel) -> NodeLevel:
        """``level`` without the tolerations that tolerate no taint any node has: the API
        server gives every pod some (DefaultTolerationSeconds: not-ready, unreachable),
        and a pod whose tolerations change nothing keeps the unconstrained fast path."""
        if not level.tolerations:
            return level
        useful = tuple(t for t in level.tolerations
                       if any(tolerates((t,), taint) for taint in self.taints))
        return level if useful == level.tolerations else replace(level, tolerations=useful)

    def reach(self, level: NodeLevel) -> tuple[list[str], dict[str, str]]:
        """(nodes a pod with ``level`` can reach, in the state's order, which condenses
        faster than a set's; model -> the pod's field that excludes a node of that
        model), by :func:`packing.constraints.exclusion`."""
        nodes: list[str] = []
        excluded: dict[str, str] = {}
        for name, node in self.state.nodes.items():
            info = node.info
            taints = _reach_taints(info)
            if level.empty and not taints:
                nodes.append(name)  # the common case, without a call
                continue
            e = exclusion(level, name, info.labels, taints)
            if e is None:
                nodes.append(name)
            else:
                dra = self.dra.nodes.get(name)
                for model in (dra.models if dra is not None else
                              (g.model for g in info.gpus)):
                    excluded.setdefault(model, e.field)
        return nodes, excluded

    def of_selector(self, selector: tuple[tuple[str, str], ...]) -> frozenset[str] | None:
        """Nodes whose labels match a pending pod's node selector (None: no selector)."""
        if not selector:
            return None
        hit = self.selector_reach.get(selector)
        if hit is None:
            hit = frozenset(n for n, node in self.state.nodes.items()
                            if all(node.info.labels.get(k) == v for k, v in selector))
            self.selector_reach[selector] = hit
        return hit

    def overlap(self, a: frozenset[str], b: frozenset[str]) -> bool:
        key = (id(a), id(b))
        hit = self.overlaps.get(key)
        if hit is not None and hit[0] is a and hit[1] is b:
            return hit[2]
        if len(self.overlaps) >= _OVERLAPS_KEPT:
            self.overlaps.clear()
        out = not a.isdisjoint(b)
        self.overlaps[key] = (a, b, out)
        return out


@dataclass(frozen=True)
class ClusterView:
    """Per-model capacity of a snapshot; build with :meth:`of`.

    The counts cover the nodes in ``reach``: those a pod without node-level constraints
    can run on (no NoSchedule/NoExecute taint) for the view :meth:`of` returns, or
    those a pod's own constraints allow for :meth:`scoped` (None: every node, a view
    built by hand). Cordoned nodes in reach are present but offer nothing.
    """

    models: Mapping[str, ModelCapacity]  # by catalog model name, sorted by name
    # Admission ids (PodRequest.admission) of the pods this view counts, bound or
    # pending: a claim the webhook holds for one of them is counted here already.
    seen: frozenset[str] = frozenset()
    reach: frozenset[str] | None = None
    # The pod's fields that restrict the reach ("" for the unconstrained view), and per
    # model of a GPU out of reach, the field (or taint) that keeps it out.
    scope: str = ""
    excluded: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    _root: _Root | None = field(default=None, compare=False, repr=False)
    # The claims taken since the condensation, _history[:_upto]: views taken one from the
    # other in a line (as the app's claims grow) share one list, appended to.
    _history: list[Claim] = field(default_factory=list, compare=False, repr=False)
    _upto: int = field(default=0, compare=False, repr=False)
    _scopes: OrderedDict[NodeLevel, ClusterView] = field(
        default_factory=OrderedDict, compare=False, repr=False)
    # The DRA nodes of ``reach`` as this view's claims left them.
    _dra: Mapping[str, DraNode] = field(default_factory=lambda: MappingProxyType({}),
                                        compare=False, repr=False)

    @classmethod
    def of(cls, snapshot: Snapshot, dra: DraWorld | None = None,
           shared_resource: str = A.SHARED_RESOURCE,
           memo: DraMemo | None = None) -> ClusterView:
        """``dra``: the cluster's DRA objects (default: the snapshot's, ``Snapshot.dra``;
        None there: no DRA); ``shared_resource``: the resource the webhook writes for a
        share (whose DeviceClass serves it on DRA nodes); ``memo``: what the previous
        view judged of each DRA node (:class:`webhook.dra_view.DraMemo`)."""
        if dra is None:
            dra = snapshot.dra
        seen = frozenset(
            [req.admission for req, _ in snapshot.running if req.admission]
            + [req.admission for req in snapshot.pending if req.admission]
        )
        return cls.of_state(ClusterState(snapshot), snapshot.pending, seen, dra=dra,
                            shared_resource=shared_resource, memo=memo)

    @classmethod
    def of_state(cls, state: ClusterState, pending: Iterable[PodRequest],
                 seen: frozenset[str] = frozenset(), *, dra: DraWorld | None = None,
                 shared_resource: str = A.SHARED_RESOURCE,
                 memo: DraMemo | None = None) -> ClusterView:
        """The view of ``state`` (its running pods applied) with ``pending`` waiting for
        the scheduler, and the DRA nodes of ``dra`` (see :meth:`of`). The view reads
        ``state`` while it is used (its scoped views condense from it): the caller must
        not change ``state`` meanwhile (the day replay asks one admission at a time,
        between placements)."""
        dra_nodes = (dra_view(dra, {n: s.info for n, s in state.nodes.items()},
                              shared_resource, memo) if dra is not None else None)
        root = _Root(state, seen, dra_nodes)
        reach, excluded = root.reach(NodeLevel())
        root.base_reach, root.base_models = frozenset(reach), _condense(state, reach, root.dra)
        view = cls(root.base_models, seen, root.base_reach, "",
                   MappingProxyType(dict(sorted(excluded.items()))), _root=root,
                   _dra=root.dra_in(reach))
        # Pods waiting for the scheduler hold no GPU in the snapshot yet, but each will
        # take the slice or share it asks for: a burst the webhook sized must not be
        # offered the same free slice again.
        return view.with_claims(pending_claims(pending, root.of_selector))

    def scoped(self, level: NodeLevel) -> ClusterView:
        """This view restricted to the nodes a pod with node-level constraints ``level``
        can reach (packing.constraints), with the claims of this view that may land there.
        The same view when ``level`` is empty; cached per distinct ``level`` (LRU of
        :data:`SCOPES_KEPT`)."""
        root = self._root
        if level.empty or root is None:
            return self
        level = root.normalize(level)
        if level.empty:
            return self
        with root.lock:
            hit = self._scopes.get(level)
            if hit is not None:
                self._scopes.move_to_end(level)
                return hit
            if level in root.scoped:
                condensed = root.scoped[level]
                root.scoped.move_to_end(level)
            else:
                nodes, excluded = root.reach(level)
                reach = frozenset(nodes)
                # The same nodes as a pod without constraints reaches: the same counts
                # (not condensed again), but the messages name this pod's fields.
                same = reach == root.base_reach
                condensed = ClusterView(
                    root.base_models if same else _condense(root.state, nodes, root.dra),
                    root.seen,
                    root.base_reach if same else reach, reach_text(level),
                    MappingProxyType(dict(sorted(excluded.items()))), _root=root,
                    _dra=root.dra_in(nodes))
                root.scoped[level] = condensed
                while len(root.scoped) > SCOPES_KEPT:
                    root.scoped.popitem(last=False)
            out = condensed.with_claims(self._history[:self._upto])
            self._scopes[level] = out
            while len(self._scopes) > SCOPES_KEPT:
                self._scopes.popitem(last=False)
            return out

    def levels(self) -> list[NodeLevel]:
        """The node-level constraints scoped on this snapshot's views, least recently
        used first (to warm the next snapshot's view with)."""
        root = self._root
        if root is None:
            return []
        with root.lock:
            return list(root.scoped)

    def warm(self, levels: Iterable[NodeLevel]) -> None:
        """Condense the scopes of ``levels`` now (a view rebuilt in the background warms
        the scopes its predecessor served, so no review pays for them)."""
        for level in levels:
            self.scoped(level)

    def applies(self, claim: Claim) -> bool:
        """Whether ``claim`` may land on a node this view counts."""
        if claim.reach is None or self.reach is None or claim.reach is self.reach:
            return True
        if self._root is None:
            return not claim.reach.isdisjoint(self.reach)
        return self._root.overlap(claim.reach, self.reach)

    def with_claims(self, claims: Iterable[Claim]) -> ClusterView:
        """This view with ``claims`` taken out of the free counts (in order), those that
        may land on its nodes (a claim made for pool A leaves pool B as it is; one that
        may land on both is taken from both, as it may take either)."""
        added = tuple(claims)
        if not added:
            return self
        root = self._root
        with root.lock if root is not None else nullcontext():
            models = dict(self.models)
            dra = dict(self._dra)
            for c in added:
                if self.applies(c):
                    _claim_one(models, c, dra, root.dra if root is not None else None)
            if len(self._history) == self._upto:
                history = self._history  # this view is the tip of its line: extend it
                history.extend(added)
            else:
                history = self._history[:self._upto] + list(added)
            out = ClusterView(MappingProxyType(models), self.seen, self.reach, self.scope,
                              self.excluded, _root=root, _history=history,
                              _upto=len(history), _dra=MappingProxyType(dra))
            for level, view in self._scopes.items():  # kept scopes follow, incrementally
                out._scopes[level] = view.with_claims(added)
            return out

    def largest(self) -> ModelCapacity | None:
        """The model with the most memory (ties: name order)."""
        if not self.models:
            return None
        return max(self.models.values(), key=lambda m: (m.model.memory_mib, m.model.name))


def _condense(state: ClusterState, reach: Collection[str],
              dra: DraView | None = None) -> Mapping[str, ModelCapacity]:
    """Per-model capacity of the nodes of ``state`` in ``reach``; a DRA node's from its
    devices (``dra``), its device-plugin GPUs left out."""
    products: dict[str, set[str]] = {}
    gpus: Counter[str] = Counter()
    mig_gpus: Counter[str] = Counter()
    changeable: Counter[str] = Counter()
    unreported: Counter[str] = Counter()
    shared_gpus: Counter[str] = Counter()
    fixed: dict[str, Counter[MigReconfigure]] = {}
    off: dict[str, Counter[MigReconfigure]] = {}
    # Thousands of GPUs share a handful of (model, layout, used-or-free) states: count
    # the states first, then do the MIG arithmetic once per distinct state.
    mig_states: Counter[tuple[str, bool, tuple[tuple[int, str, bool], ...]]] = Counter()
    cordoned: dict[str, Counter[str]] = {}  # model -> MIG instances on cordoned nodes
    cordoned_n: Counter[str] = Counter()  # model -> GPUs on cordoned nodes
    shared_room: dict[str, Counter[tuple[int, int, int]]] = {}
    mps_gpus: Counter[str] = Counter()
    mps_clients: dict[str, set[int]] = {}
    mps_room: dict[str, Counter[tuple[int, int, int]]] = {}
    dra_free: dict[str, Counter[str]] = {}
    dra_existing: dict[str, Counter[str]] = {}
    dra_room: dict[str, Counter[tuple[int, int, int]]] = {}
    whole_free: Counter[str] = Counter()
    whole_gpus: Counter[str] = Counter()
    dra_gpus: Counter[str] = Counter()
    unlabelled: set[str] = set()
    nodes = state.nodes
    dra_nodes = dra.nodes if dra is not None else {}
    for name in reach:
        node = nodes[name]
        info = node.info
        product = info.labels.get(A.PRODUCT)
        on_dra = dra_nodes.get(name)
        if on_dra is not None:
            for model, o in on_dra.models.items():
                gpus[model] += o.gpus
                dra_gpus[model] += o.gpus
                if product:
                    products.setdefault(model, set()).add(product)
                else:
                    unlabelled.add(model)
                if info.unschedulable:
                    cordoned_n[model] += o.gpus
                    cordoned.setdefault(model, Counter()).update(o.mig_existing)
                    continue
                mig_gpus[model] += o.mig_gpus
                dra_free.setdefault(model, Counter()).update(o.mig_free)
                dra_existing.setdefault(model, Counter()).update(o.mig_existing)
                shared_gpus[model] += o.shared_gpus
                shared_room.setdefault(model, Counter()).update(o.shared_room)
                dra_room.setdefault(model, Counter()).update(o.shared_room)
                whole_free[model] += o.whole_free
                whole_gpus[model] += o.whole_gpus
            continue
        unreported_node = all(g.info.inferred and not g.instances for g in node.gpus
                              if g.info.mode is GpuMode.MIG)
        for g in node.gpus:
            model = g.info.model
            gpus[model] += 1
            if product:
                products.setdefault(model, set()).add(product)
            if info.unschedulable:
                cordoned_n[model] += 1
                # Present, but offers nothing until uncordoned; its MIG instances are
                # kept apart (mig_cordoned): a pod no live node can ever serve may wait
                # for them rather than be refused.
                if g.mode is GpuMode.MIG:
                    cordoned.setdefault(model, Counter()).update(
                        prof for prof, _ in g.instances.values())
                continue
            can_create = creatable(node, g)
            if g.mode is GpuMode.MIG or can_create:
                mig_gpus[model] += 1
                layout = tuple(sorted((start, prof, owner is None)
                                      for start, (prof, owner) in g.instances.items()))
                mig_states[(model, can_create, layout)] += 1
                if can_create:
                    changeable[model] += 1
                elif unreported_node:
                    unreported[model] += 1
                else:
                    fixed.setdefault(model, Counter())[info.mig_reconfigure] += 1
            elif get_model(model).mig is not None:
                off.setdefault(model, Counter())[info.mig_reconfigure] += 1
            if g.mode is GpuMode.SHARED and g.info.mps:
                mps_gpus[model] += 1
                mps_clients.setdefault(model, set()).add(_client_mib(g.info))
                room = _shared_room(g)
                if room is not None:
                    key = (_client_mib(g.info), room[1], room[2])
                    mps_room.setdefault(model, Counter())[key] += 1
            elif g.mode is GpuMode.SHARED:
                shared_gpus[model] += 1
                room = _shared_room(g)
                if room is not None:
                    shared_room.setdefault(model, Counter())[room] += 1
    free: dict[str, Counter[str]] = {}
    creatable_n: dict[str, Counter[str]] = {}
    existing: dict[str, Counter[str]] = {}
    for (model, may_create, layout), count in mig_states.items():
        f, c, e = _mig_counts(model, may_create, layout)
        for into, counts in ((free, f), (creatable_n, c), (existing, e)):
            acc = into.setdefault(model, Counter())
            for profile, n in counts.items():
                acc[profile] += n * count
    for into, counted in ((free, dra_free), (existing, dra_existing)):
        for model, by_profile in counted.items():
            into.setdefault(model, Counter()).update(by_profile)

    def frozen(d: dict[str, Counter[str]], name: str) -> Mapping[str, int]:
        return MappingProxyType(dict(d.get(name, {})))

    return MappingProxyType({
        name: ModelCapacity(
            model=get_model(name),
            products=tuple(sorted(products.get(name, ()))),
            gpus=gpus[name],
            mig_gpus=mig_gpus[name],
            mig_free=frozen(free, name),
            shared_gpus=shared_gpus[name],
            shared_room=MappingProxyType(dict(shared_room.get(name, {}))),
            mig_creatable=frozen(creatable_n, name),
            mig_existing=frozen(existing, name),
            mig_changeable_gpus=changeable[name],
            mig_unreported_gpus=unreported[name],
            mig_fixed=MappingProxyType(dict(sorted(fixed.get(name, {}).items()))),
            mig_off=MappingProxyType(dict(sorted(off.get(name, {}).items()))),
            mps_gpus=mps_gpus[name],
            mps_clients=frozenset(mps_clients.get(name, ())),
            mps_room=MappingProxyType(dict(mps_room.get(name, {}))),
            mig_cordoned=frozen(cordoned, name),
            cordoned_gpus=cordoned_n[name],
            whole_free=whole_free[name],
            whole_gpus=whole_gpus[name],
            dra_gpus=dra_gpus[name],
            unlabelled=name in unlabelled,
            dra_mig_free=frozen(dra_free, name),
            dra_shared_room=MappingProxyType(dict(dra_room.get(name, {}))),
        )
        for name in sorted(gpus)
    })


def _mig_counts(model: str, creatable: bool, layout: tuple[tuple[int, str, bool], ...]
                ) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """(free, creatable, existing) instances per profile of one MIG (or convertible) GPU.

    ``layout``: (start, profile, free) per existing instance. Mirrors
    ``ClusterState._gpu_options``: free existing instances of the profile, plus new ones
    at free valid starts only when the node's layouts may change.
    """
    geom = get_model(model).mig
    free: Counter[str] = Counter()
    new: Counter[str] = Counter()
    existing: Counter[str] = Counter(prof for _, prof, _ in layout)
    if geom is None:
        return free, new, existing
    slots = [MigSlot(prof, start) for start, prof, _ in layout]
    for p in geom.classic:
        n = sum(1 for _, prof, is_free in layout if is_free and prof == p.name)
        if n:
            free[p.name] = n
        if creatable:
            m = len(free_starts(geom, slots, p.name))
            if m:
                new[p.name] = m
    return free, new, existing


# Replicas left on a shared GPU that sets no replica count (replicas 0).
UNLIMITED = 1 << 20


def _client_mib(info: GpuInfo) -> int:
    return mps_client_mib(info.memory_mib, info.replicas)


def _shared_room(g: GpuState) -> tuple[int, int, int] | None:
    """(free MiB, free milli, replicas left) of a shared GPU, None when no replica is
    left."""
    if g.whole_owner is not None:
        return None
    if g.info.replicas and len(g.shared_owners) >= g.info.replicas:
        return None
    left = g.info.replicas - len(g.shared_owners) if g.info.replicas else UNLIMITED
    return g.info.memory_mib - g.shared_memory_used, GPU_MILLI - g.used_milli, left


class ShareKind(StrEnum):
    """What a claim takes: a MIG slice, a time-sliced share, an MPS replica, or a share
    of either kind."""

    MIG = "mig"
    SHARED = "shared"  # a time-sliced share (the webhook pins it off MPS GPUs)
    MPS = "mps"
    SHARE = "share"  # a pending pod's share: MPS or time-sliced, whichever holds it
    GPU = "gpu"  # a whole GPU of a DRA node (a sized pod's last resort there)


@dataclass(frozen=True)
class Claim:
    """A slice or share that a pod will take but that the view does not count yet: a
    pending pod of the snapshot, or an admission the watch has not delivered."""

    kind: ShareKind
    models: tuple[str, ...]  # catalog models it may land on; empty: any
    memory_mib: int
    compute_milli: int = 0
    profile: str | None = None  # MIG
    # The nodes the pod can reach (None: any): a view of other nodes is left as it is.
    reach: frozenset[str] | None = field(default=None, compare=False)


def pending_claims(
    pending: Iterable[PodRequest],
    reach: Callable[[tuple[tuple[str, str], ...]], frozenset[str] | None] = lambda _: None,
) -> list[Claim]:
    """The claims of pending small pods. A share's kind (MPS or time-sliced) is not in
    the request (the webhook pins it by node affinity): it is taken from an MPS replica
    when one holds it, as the webhook would choose, else from a time-sliced GPU.
    ``reach``: the nodes a pod's node selector allows (the request carries no other
    node-level constraint)."""
    out = []
    for req in pending:
        nodes = reach(tuple(sorted(req.node_selector.items())))
        if req.kind is RequestKind.MIG and req.mig_profile is not None:
            out.append(Claim(ShareKind.MIG, tuple(sorted(req.gpu_models)), 0,
                             profile=req.mig_profile, reach=nodes))
        elif req.kind is RequestKind.SHARED:
            out.append(Claim(ShareKind.SHARE, tuple(sorted(req.gpu_models)),
                             req.gpu_memory_mib, req.gpu_milli, reach=nodes))
        elif req.kind is RequestKind.WHOLE and req.gpu_count == 1 and req.gpu_memory_mib:
            # A sized pod given a whole GPU (Kind.GPU): one of the DRA nodes' whole GPUs.
            out.append(Claim(ShareKind.GPU, tuple(sorted(req.gpu_models)),
                             req.gpu_memory_mib, reach=nodes))
    return out


def _take(room: Mapping[tuple[int, int, int], int], memory_mib: int, compute_milli: int,
          *, memory_capped: bool = False) -> Mapping[tuple[int, int, int], int] | None:
    """``room`` after one share of (memory, compute) is taken from its tightest GPU (the
    best fit, as the scheduler packs), or None when no GPU has room. A time-sliced GPU
    keeps the memory the share did not take; with ``memory_capped`` (an MPS replica) the
    key's memory is the per-client cap, the same for every replica left."""
    fits = [k for k, n in room.items() if n > 0 and k[0] >= memory_mib and k[1] >= compute_milli]
    if not fits:
        return None
    key = min(fits)
    out = dict(room)
    out[key] -= 1
    if not out[key]:
        del out[key]
    left = key[2] - 1 if key[2] < UNLIMITED else UNLIMITED
    if left > 0:
        after = (key[0] if memory_capped else key[0] - memory_mib, key[1] - compute_milli, left)
        out[after] = out.get(after, 0) + 1
    return MappingProxyType(out)


def _claim_one(models: dict[str, ModelCapacity], c: Claim,
               dra: dict[str, DraNode] | None = None, view: DraView | None = None) -> None:
    """Take ``c`` from a model that has it free; nothing when none has (the pod waits for
    one, which a view of free capacity does not show). On a DRA node (``dra``: those of
    the view's reach, replaced as claims land there) the claim takes the device the
    allocator would give it on the first node in name order that has one, and the
    node's offers are counted again (one device may hold memory slices that others
    of the GPU share)."""
    names = [m for m in (c.models or tuple(models)) if m in models]
    dra = dra if dra is not None else {}

    def on_dra(take: Take, model: str, fits: Callable[[DraNode], bool]) -> bool:
        if view is None:
            return False
        for name in sorted(dra):
            node = dra[name]
            if c.reach is not None and name not in c.reach:
                continue
            if model not in node.models or not fits(node):
                continue
            after = view.after(node, take, model, c.profile, c.memory_mib)
            if after is None:
                continue
            for m in set(node.models) & set(models):
                models[m] = _moved(models[m], node.models[m], after.models[m])
            dra[name] = after
            return True
        return False

    if c.kind is ShareKind.GPU:
        free = [m for m in names if models[m].whole_free > 0
                and models[m].model.memory_mib >= c.memory_mib]
        if free:
            best = max(free, key=lambda m: (models[m].whole_free, m))
            on_dra(Take.GPU, best, lambda n: n.models[best].whole_free > 0)
        return
    if c.kind is ShareKind.MIG:
        assert c.profile is not None
        prof = c.profile
        # The model with the most free instances; a slice the actuator would create is
        # taken only when none exists free.
        free = [m for m in names if models[m].mig_free.get(prof, 0) > 0]
        if free:
            best = max(free, key=lambda m: (models[m].mig_free[prof], m))
            on_node = models[best].dra_mig_free.get(prof, 0)
            if on_node and on_dra(Take.MIG, best,
                                  lambda n: n.models[best].mig_free.get(prof, 0) > 0):
                return
            if models[best].mig_free[prof] > on_node:  # a device plugin's slice is free
                models[best] = replace(models[best],
                                       mig_free=_less(models[best].mig_free, prof))
            return
        new = [m for m in names if models[m].mig_creatable.get(prof, 0) > 0]
        if new:
            best = max(new, key=lambda m: (models[m].mig_creatable[prof], m))
            models[best] = replace(models[best],
                                   mig_creatable=_less(models[best].mig_creatable, prof))
        return
    if c.kind in (ShareKind.MPS, ShareKind.SHARE):
        for m in names:
            after = _take(models[m].mps_room, c.memory_mib, c.compute_milli, memory_capped=True)
            if after is not None:
                models[m] = replace(models[m], mps_room=after)
                return
    if c.kind in (ShareKind.SHARED, ShareKind.SHARE):
        for m in names:
            def has_room(n: DraNode, m: str = m) -> bool:
                return _take(n.models[m].shared_room, c.memory_mib, c.compute_milli) is not None

            if _take(models[m].dra_shared_room, c.memory_mib, c.compute_milli) is not None \
                    and on_dra(Take.SHARED, m, has_room):
                return
            plugin = Counter(models[m].shared_room)
            plugin.subtract(models[m].dra_shared_room)
            after = _take({k: n for k, n in plugin.items() if n > 0}, c.memory_mib,
                          c.compute_milli)
            if after is not None:
                room = Counter(after)
                room.update(models[m].dra_shared_room)
                models[m] = replace(models[m], shared_room=MappingProxyType(dict(room)))
                return


def _moved(cap: ModelCapacity, before: DraModelOffer, after: DraModelOffer) -> ModelCapacity:
    """``cap`` with one DRA node's offers of its model replaced (``before`` by
    ``after``): free MIG devices, share room and whole GPUs."""
    def swap(total: Mapping[Any, int], old: Mapping[Any, int], new: Mapping[Any, int]
             ) -> Mapping[Any, int]:
        out = Counter(total)
        out.subtract(old)
        out.update(new)
        return MappingProxyType({k: n for k, n in out.items() if n > 0})

    return replace(
        cap,
        mig_free=swap(cap.mig_free, before.mig_free, after.mig_free),
        dra_mig_free=swap(cap.dra_mig_free, before.mig_free, after.mig_free),
        shared_room=swap(cap.shared_room, before.shared_room, after.shared_room),
        dra_shared_room=swap(cap.dra_shared_room, before.shared_room, after.shared_room),
        whole_free=cap.whole_free - before.whole_free + after.whole_free,
    )


def _less(counts: Mapping[str, int], key: str) -> Mapping[str, int]:
    out = dict(counts)
    out[key] -= 1
    return MappingProxyType(out)
