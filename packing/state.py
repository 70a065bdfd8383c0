"""Mutable working state of a cluster for the solvers: what is free where.

``ClusterState`` is built from a :class:`~packing.model.Snapshot` (its running pods
applied) and then placements are applied or undone one at a time. ``options`` lists
every concrete way one pod can go on one node (which GPU, which MIG start); policies
score those options. Everything is in-process and deterministic; nothing here is shared
between threads.

Past 600 lines as one class: applying, undoing and listing options keep the same
per-GPU book (instances, shares, whole owners, unsure shares) consistent, and every
solver and the validator build on it; the device plugin's choice is
:mod:`packing.device_plugin`, MIG geometry :mod:`packing.mig.layout`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from packing.catalog import get_model, mps_client_mib
from packing.constraints import selector_miss
from packing.device_plugin import (
    AllocationPolicy,
    PluginChoice,
    PluginRefusal,
    ReplicatedGpu,
    plugin_allocation,
)
from packing.mig.layout import MigSlot, free_starts, memory_range
from packing.model import (
    GPU_MILLI,
    MODE_SERVES,
    GpuInfo,
    GpuMode,
    MigReconfigure,
    NodeInfo,
    Placement,
    PodRequest,
    RequestKind,
    Snapshot,
)


@dataclass
class GpuState:
    """Free/used accounting of one GPU."""

    info: GpuInfo
    whole_owner: str | None = None  # WHOLE (or FRACTIONAL taken whole)
    # MIG: instances by start -> (profile, owner); owner None = created but free.
    instances: dict[int, tuple[str, str | None]] = field(default_factory=dict)
    shared_owners: dict[str, tuple[int, int]] = field(default_factory=dict)  # pod -> (milli, MiB)
    # A whole-mode, MIG-capable GPU on a reconfigurable node may be switched to MIG for
    # small pods while idle (the rebalancer asks the MIG manager); ``converted`` marks it.
    reconfigurable: bool = False
    converted: bool = False
    # Starts of instances a placement of this pass creates (mig_created): the GPU's new
    # layout is still being chosen, so more may be created beside them.
    created: set[int] = field(default_factory=set)

    @property
    def mode(self) -> GpuMode:
        return GpuMode.MIG if self.converted else self.info.mode

    @property
    def convertible(self) -> bool:
        """Idle whole GPU that could become a MIG GPU for a small pod."""
        return (
            self.reconfigurable
            and self.info.mode is GpuMode.WHOLE
            and not self.converted
            and self.whole_owner is None
            and not self.shared_owners
            and get_model(self.info.model).mig is not None
        )

    @property
    def used_milli(self) -> int:
        if self.whole_owner is not None:
            return GPU_MILLI
        if self.mode is GpuMode.MIG:
            geom = get_model(self.info.model).mig
            assert geom is not None
            used = 0
            for start, (profile, owner) in self.instances.items():
                del start
                if owner is not None:
                    used += geom.profile(profile).memory_slices
            return used * GPU_MILLI // geom.memory_slices
        return sum(m for m, _ in self.shared_owners.values())

    @property
    def free_milli(self) -> int:
        return GPU_MILLI - self.used_milli

    @property
    def idle(self) -> bool:
        """Nobody uses this GPU: it could serve a whole-GPU pod (after MIG is undone)."""
        if self.whole_owner is not None or self.shared_owners:
            return False
        return all(owner is None for _, owner in self.instances.values())

    @property
    def whole_free(self) -> bool:
        """Idle and usable by a whole-GPU pod right now (not in MIG or time-sliced mode)."""
        return self.idle and self.mode in (GpuMode.WHOLE, GpuMode.FRACTIONAL)

    @property
    def shared_memory_used(self) -> int:
        return sum(mem for _, mem in self.shared_owners.values())

    def mig_slots(self) -> list[MigSlot]:
        return [MigSlot(p, s) for s, (p, _) in self.instances.items()]


# Source of NodeState.version: never repeats within a process.
_VERSIONS = itertools.count(1)


@dataclass
class NodeState:
    info: NodeInfo
    cpu_free: int
    mem_free: int
    gpus: list[GpuState]
    pods: dict[str, Placement] = field(default_factory=dict)
    # Time-sliced shares whose GPU is gpupack's prediction, not yet seen by the node agent,
    # placed under a tie of the device plugin or after such a guess: pod -> GPU memory.
    # Where they really are is any GPU the counts allow (see worst_case_fits).
    unsure: dict[str, int] = field(default_factory=dict)
    # A number no other node state of this process has had: new at construction, at every
    # apply and undo, and on copy or unpickling. So equal numbers mean the same state, and
    # scorers can memoise per-node figures on it (see packing.policies.fgd).
    version: int = field(default_factory=lambda: next(_VERSIONS), init=False,
                         compare=False, repr=False)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.version = next(_VERSIONS)  # a copy may change apart from its original

    @property
    def idle(self) -> bool:
        return all(g.idle for g in self.gpus)

    @property
    def whole_free(self) -> bool:
        """A GPU node every GPU of which could serve a whole-GPU pod now: room for an LLM."""
        return bool(self.gpus) and all(g.whole_free for g in self.gpus)


def creatable(node: NodeState, g: GpuState) -> bool:
    """Whether a new MIG instance may be counted on ``g``: the MIG manager (mig-parted)
    re-lays a GPU only while no instance of it is in use, and switches a GPU's MIG mode
    only while no GPU of the node is in use (its mode step clears every MIG GPU of the
    node and may reset them all). A GPU converted or re-laid in this same pass (a plan
    being built) counts as idle for both: its layout is still being chosen."""
    if not node.info.mig_reconfigurable or get_model(g.info.model).mig is None:
        return False
    if g.converted:
        return True
    if g.info.mode is GpuMode.MIG:
        return _idle_but_this_pass(g)
    return g.convertible and all(o.converted or _idle_but_this_pass(o) for o in node.gpus)


def _idle_but_this_pass(g: GpuState) -> bool:
    """Idle, but for instances created in this pass."""
    return (g.whole_owner is None and not g.shared_owners
            and all(o is None or s in g.created for s, (_, o) in g.instances.items()))


class PlacementError(ValueError):
    """A placement that does not fit the current state."""


def fits_node(pod: PodRequest, node: NodeState) -> str | None:
    """Reason the node cannot take the pod at all (ignoring GPUs), or None."""
    info = node.info
    if info.unschedulable:
        return "node is cordoned"
    miss = selector_miss(pod.node_selector.items(), info.labels)
    if miss is not None:
        return f"node selector {miss[0]}={miss[1]} does not match"
    if pod.cpu_milli > node.cpu_free:
        return f"insufficient cpu ({node.cpu_free}m free, {pod.cpu_milli}m asked)"
    if pod.memory_mib > node.mem_free:
        return f"insufficient memory ({node.mem_free}Mi free, {pod.memory_mib}Mi asked)"
    return None


class ClusterState:
    """Free capacity per node and GPU; apply and undo placements."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.nodes: dict[str, NodeState] = {}
        for n in snapshot.nodes:
            gpus = [GpuState(info=g, reconfigurable=n.mig_reconfigurable) for g in n.gpus]
            for g in gpus:
                for inst in g.info.mig:
                    g.instances[inst.start] = (inst.profile, None)
            self.nodes[n.name] = NodeState(n, n.cpu_milli, n.memory_mib, gpus)
        # Running pods: the owners recorded in MIG layouts are superseded by placements.
        for pod, placement in snapshot.running:
            self.apply(pod, placement, allow_overcommit=True)

    # -- queries -------------------------------------------------------------------------

    def gpu(self, node: str, index: int) -> GpuState:
        for g in self.nodes[node].gpus:
            if g.info.index == index:
                return g
        raise KeyError(f"node {node} has no GPU {index}")

    def options(self, pod: PodRequest, node_name: str, *, dedupe: bool = False,
                gpus_only: bool = False) -> list[Placement]:
        """Every concrete placement of ``pod`` on the node, in a deterministic order.

        ``dedupe``: idle GPUs of one node with the same model, mode and layout are
        interchangeable for a single pod, so only the first of them is offered. Greedy
        policies use this (far fewer options to score); batch solvers must not, since
        several pods of a batch may need several of those GPUs.
        ``gpus_only``: ignore cordon, selectors, CPU and memory (where a pod that is
        already bound could be holding GPUs).
        """
        node = self.nodes[node_name]
        if not gpus_only and fits_node(pod, node) is not None:
            return []
        options = self._gpu_options(pod, node)
        if not dedupe or pod.kind in (RequestKind.NONE, RequestKind.WHOLE):
            return list(options)
        seen: set[tuple[object, ...]] = set()
        out = []
        for o in options:
            g = self.gpu(node_name, o.gpus[0])
            if g.idle:
                sig = (
                    g.info.model,
                    g.info.mode,
                    tuple(sorted(g.instances.items())),
                    o.mig_profile,
                    o.mig_start,
                    o.mig_created,
                )
                if sig in seen:
                    continue
                seen.add(sig)
            out.append(o)
        return out

    def share_sequence(self, node_name: str, count: int) -> tuple[int, ...]:
        """The GPUs the device plugin hands the next ``count`` one-replica shares of this
        node to, one after another (fewer when the node runs out of replicas): where a
        batch of shares lands, whichever pods they are."""
        gpus = replicated_gpus(self.nodes[node_name])
        policy = self.nodes[node_name].info.share_policy
        out: list[int] = []
        for _ in range(count):
            try:
                pick = plugin_allocation(gpus, 1, policy=policy).first
            except PluginRefusal:
                break
            out.append(pick)
            gpus = [replace(g, allocated=g.allocated + 1) if g.index == pick else g
                    for g in gpus]
        return tuple(out)

    def share_options(self, pod: PodRequest, node_name: str, gpus: Iterable[int]
                      ) -> list[Placement]:
        """Placements of share ``pod`` on each of ``gpus`` (time-sliced GPUs of the node
        it may use and that have room for it now), for batch solvers that follow the
        plugin's sequence themselves (:meth:`share_sequence`)."""
        node = self.nodes[node_name]
        if fits_node(pod, node) is not None or pod.kind is not RequestKind.SHARED:
            return []
        allowed = {g.info.index: g for g in self._allowed_gpus(pod, node)
                   if g.mode is GpuMode.SHARED and g.whole_owner is None}
        return [Placement(pod.key, node_name, (i,)) for i in sorted(set(gpus))
                if i in allowed and _share_fits(allowed[i], pod)]

    def reason(self, pod: PodRequest, node_name: str) -> str:
        """Why the pod does not fit the node now (for people)."""
        node = self.nodes[node_name]
        why = fits_node(pod, node)
        if why is not None:
            return why
        allowed = self._allowed_gpus(pod, node)
        if pod.kind is RequestKind.NONE:
            return "fits"
        if not allowed:
            why = unusable_gpus(pod, node.gpus, node.info.mig_reconfigure)
            return f"no GPU of a usable kind ({why})"
        if pod.kind is RequestKind.WHOLE:
            free = sum(1 for g in allowed if g.idle)
            return f"{free} whole GPU(s) free, {pod.gpu_count} needed"
        if pod.kind is RequestKind.MIG:
            fixed = node.info.mig_reconfigure.why_fixed
            # "no free" leads: callers append what is placeable after it.
            return f"no free {pod.mig_profile} slice on any GPU" + (
                f", and none is created here: {fixed}" if fixed else "")
        pick = plugin_pick(node)
        if pick is not None:
            for i in sorted(pick.possible[0]):
                g = self.gpu(node_name, i)
                if not _share_fits(g, pod) or g not in allowed:
                    return (f"no GPU share with {pod.gpu_milli}m/{pod.gpu_memory_mib}Mi free on "
                            f"the GPU the device plugin would hand out: GPU {i} has "
                            f"{g.info.memory_mib - g.shared_memory_used}Mi of "
                            f"{g.info.memory_mib}Mi and {g.free_milli}m free, "
                            f"{len(g.shared_owners)} replica(s) in use")
        best = max((g.free_milli for g in allowed), default=0)
        return f"no GPU share with {pod.gpu_milli}m/{pod.gpu_memory_mib}Mi free (largest {best}m)"

    def unresolvable(self, pod: PodRequest, node_name: str) -> str | None:
        """A reason the node can never take the pod, even with every pod evicted."""
        info = self.nodes[node_name].info
        if pod.kind is RequestKind.NONE:
            return None
        fresh = NodeState(
            info,
            info.cpu_milli,
            info.memory_mib,
            [GpuState(g, reconfigurable=info.mig_reconfigurable) for g in info.gpus],
        )
        allowed = self._allowed_gpus(pod, fresh)
        if not allowed:
            why = unusable_gpus(pod, fresh.gpus, info.mig_reconfigure)
            return f"no GPU of a usable kind ({why})"
        if pod.kind is RequestKind.WHOLE and len(allowed) < pod.gpu_count:
            return f"node has {len(allowed)} usable GPU(s), pod needs {pod.gpu_count}"
        if pod.cpu_milli > info.cpu_milli or pod.memory_mib > info.memory_mib:
            return "node is too small for the pod's cpu/memory"
        return None

    # -- options -------------------------------------------------------------------------

    def _allowed_gpus(self, pod: PodRequest, node: NodeState) -> list[GpuState]:
        out = []
        for g in node.gpus:
            if pod.gpu_models and g.info.model not in pod.gpu_models:
                continue
            if (pod.kind in (RequestKind.WHOLE, RequestKind.SHARED)
                    and pod.kind not in MODE_SERVES[g.mode]):
                continue
            if pod.kind is RequestKind.MIG:
                geom = get_model(g.info.model).mig
                if geom is None or (g.mode is not GpuMode.MIG and not creatable(node, g)):
                    continue
                if pod.mig_profile not in {p.name for p in geom.profiles}:
                    continue
            out.append(g)
        return out

    def _gpu_options(self, pod: PodRequest, node: NodeState) -> Iterator[Placement]:
        name = node.info.name
        if pod.kind is RequestKind.NONE:
            yield Placement(pod.key, name)
            return
        allowed = self._allowed_gpus(pod, node)
        if pod.kind is RequestKind.WHOLE:
            free = [g.info.index for g in allowed if g.idle]
            if len(free) >= pod.gpu_count:
                yield Placement(pod.key, name, tuple(free[: pod.gpu_count]))
            return
        if pod.kind is RequestKind.MIG:
            assert pod.mig_profile is not None
            for g in allowed:
                for start, (profile, owner) in sorted(g.instances.items()):
                    if profile == pod.mig_profile and owner is None:
                        yield Placement(pod.key, name, (g.info.index,), profile, start, False)
                # A GPU not in MIG mode is allowed only when creatable already.
                if g.mode is not GpuMode.MIG or creatable(node, g):
                    geom = get_model(g.info.model).mig
                    assert geom is not None
                    for start in free_starts(geom, g.mig_slots(), pod.mig_profile):
                        yield Placement(
                            pod.key, name, (g.info.index,), pod.mig_profile, start, True
                        )
            return
        # SHARED. A time-sliced GPU is not gpupack's to choose: the device plugin hands out
        # the replica (packing.device_plugin). The share goes where the plugin will put it,
        # and only if every GPU the plugin may pick (a tie is broken at random) has room.
        pick = plugin_pick(node)
        if pick is not None:
            usable = {g.info.index: g for g in allowed}
            if all(i in usable and _share_fits(usable[i], pod) for i in pick.possible[0]) \
                    and worst_case_fits(node, pod):
                yield Placement(pod.key, name, (pick.first,))
        for g in allowed:  # FRACTIONAL (trace replay): gpupack's own choice
            if g.mode is GpuMode.FRACTIONAL and g.whole_owner is None \
                    and _share_fits(g, pod):
                yield Placement(pod.key, name, (g.info.index,))

    # -- mutation ------------------------------------------------------------------------

    def check(self, pod: PodRequest, p: Placement) -> str | None:
        """Why placement ``p`` of ``pod`` is not possible now, or None when it is."""
        if p.node not in self.nodes:
            return f"unknown node {p.node}"
        node = self.nodes[p.node]
        if p.pod in node.pods:
            return f"pod {p.pod} already placed on {p.node}"
        why = fits_node(pod, node)
        if why is not None:
            return why
        opts = self._gpu_options(pod, node)
        if pod.kind is RequestKind.WHOLE:
            allowed = {g.info.index: g for g in self._allowed_gpus(pod, node)}
            if len(p.gpus) != pod.gpu_count or len(set(p.gpus)) != len(p.gpus):
                return f"pod needs {pod.gpu_count} distinct GPUs, placement gives {list(p.gpus)}"
            for i in p.gpus:
                if i not in allowed:
                    return f"GPU {i} of {p.node} cannot serve whole-GPU pods of this kind"
                if not allowed[i].idle:
                    return f"GPU {i} of {p.node} is in use"
            return None
        if any(o == p for o in opts):
            return None
        return f"no such free resource on {p.node}: {p.to_json()}"

    def shape_error(self, pod: PodRequest, p: Placement) -> str | None:
        """Why ``p`` cannot even be *recorded* for ``pod``, free or not, or None.

        Over-committed placements (a bound pod the cache's view has no room for) are
        applied anyway, so this is the check they must pass: the GPUs exist, the
        placement matches the request (count of whole GPUs; one GPU for a share or a
        slice; the pod's MIG profile at an allowed start of that GPU's geometry, not
        overlapping another instance), the GPU's mode can hold it, and no other pod
        holds the same whole GPU or MIG slice (counting both would let one's undo free
        it under the other). A placement without GPUs is always recordable: it counts
        CPU and memory only, for a pod whose GPUs are unknown.
        """
        node = self.nodes.get(p.node)
        if node is None:
            return f"unknown node {p.node}"
        if pod.key in node.pods:
            return f"pod {pod.key} already placed on {p.node}"
        if not p.gpus:
            if p.mig_profile is not None or p.mig_start is not None:
                return "MIG slice named without its GPU"
            return None
        if pod.kind is RequestKind.NONE:
            return f"pod asks for no GPU, placement names GPUs {list(p.gpus)}"
        by_index = {g.info.index: g for g in node.gpus}
        for i in p.gpus:
            if i not in by_index:
                return f"node {p.node} has no GPU {i}"
        if pod.kind is RequestKind.WHOLE:
            if len(p.gpus) != pod.gpu_count or len(set(p.gpus)) != len(p.gpus):
                return f"pod needs {pod.gpu_count} distinct GPUs, placement gives {list(p.gpus)}"
            for i in p.gpus:
                g = by_index[i]
                if g.mode not in (GpuMode.WHOLE, GpuMode.FRACTIONAL):
                    return f"GPU {i} of {p.node} is in {g.mode.value} mode, not a whole GPU"
                if not g.idle:
                    # Two records on one GPU: counting both would let the first undo free
                    # the GPU under the other.
                    return f"GPU {i} of {p.node} is held by another pod"
            return None
        if len(p.gpus) != 1:
            return f"pod takes one GPU, placement gives {list(p.gpus)}"
        g = by_index[p.gpus[0]]
        if pod.kind is RequestKind.SHARED:
            if p.mig_profile is not None:
                return "a GPU share placed as a MIG slice"
            if g.mode not in (GpuMode.SHARED, GpuMode.FRACTIONAL) or g.whole_owner is not None:
                return f"GPU {g.info.index} of {p.node} is not shared ({g.mode.value})"
            return None
        return self._mig_shape_error(pod, p, g, creatable(self.nodes[p.node], g))

    @staticmethod
    def _mig_shape_error(pod: PodRequest, p: Placement, g: GpuState,
                         can_create: bool) -> str | None:
        where = f"GPU {g.info.index} of {p.node}"
        if p.mig_profile is None or p.mig_profile != pod.mig_profile or p.mig_start is None:
            return (f"pod asks for MIG {pod.mig_profile}, placement gives "
                    f"{p.mig_profile}@{p.mig_start}")
        geom = get_model(g.info.model).mig
        if geom is None:
            return f"{where} ({g.info.model}) has no MIG"
        if not geom.has_profile(p.mig_profile):
            return f"{where} ({g.info.model}) has no MIG profile {p.mig_profile}"
        if p.mig_start not in geom.profile(p.mig_profile).starts:
            return f"start {p.mig_start} is not allowed for {p.mig_profile} on {g.info.model}"
        if g.mode is not GpuMode.MIG and not (p.mig_created and can_create):
            # A slice that exists is on a MIG GPU; one to be created needs an idle GPU
            # that may be switched to MIG (on a node in use by no one: see creatable).
            return f"{where} is in {g.mode.value} mode, not MIG"
        if p.mig_created and not can_create:
            return f"{where}: its MIG layout cannot change now (in use, or not opted in)"
        held = g.instances.get(p.mig_start)
        if held is not None:
            if held[0] != p.mig_profile:
                return f"{where} has {held[0]}@{p.mig_start}, not {p.mig_profile}"
            if p.mig_created:
                return f"{where} already has {p.mig_profile}@{p.mig_start}"
            if held[1] is not None:
                return f"{p.mig_profile}@{p.mig_start} on {where} is held by another pod"
            return None
        mine = memory_range(geom, MigSlot(p.mig_profile, p.mig_start))
        for start, (profile, _) in g.instances.items():
            theirs = memory_range(geom, MigSlot(profile, start))
            if theirs.start < mine.stop and mine.start < theirs.stop:
                return f"{p.mig_profile}@{p.mig_start} overlaps {profile}@{start} on {where}"
        return None

    def apply(self, pod: PodRequest, p: Placement, *, allow_overcommit: bool = False,
              unsure: bool = False) -> None:
        """Take the resources of placement ``p``; PlacementError when they are not free.

        ``allow_overcommit``: take them unchecked. For replaying what was applied before
        (a snapshot's running pods, a placement undone for a moment, a scorer's trial),
        and for records of bound pods that passed :meth:`shape_error` (which the cache
        and the snapshot builder check first). A placement without GPUs takes CPU and
        memory only. ``unsure``: a time-sliced share whose GPU is a guess
        (``NodeState.unsure``). Nothing is changed when PlacementError is raised."""
        if not allow_overcommit:
            why = self.check(pod, p)
            if why is not None:
                raise PlacementError(f"{pod.key}: {why}")
        node = self.nodes[p.node]
        node.version = next(_VERSIONS)
        node.cpu_free -= pod.cpu_milli
        node.mem_free -= pod.memory_mib
        node.pods[pod.key] = p
        if not p.gpus:
            return  # GPUs unknown (over-committed bound pod): CPU and memory only
        if pod.kind is RequestKind.WHOLE:
            for i in p.gpus:
                self.gpu(p.node, i).whole_owner = pod.key
        elif pod.kind is RequestKind.MIG:
            g = self.gpu(p.node, p.gpus[0])
            assert p.mig_profile is not None and p.mig_start is not None
            if g.info.mode is GpuMode.WHOLE:
                g.converted = True
            g.instances[p.mig_start] = (p.mig_profile, pod.key)
            if p.mig_created:
                g.created.add(p.mig_start)
        elif pod.kind is RequestKind.SHARED:
            g = self.gpu(p.node, p.gpus[0])
            g.shared_owners[pod.key] = (pod.gpu_milli, pod.gpu_memory_mib)
            if unsure and g.mode is GpuMode.SHARED:
                node.unsure[pod.key] = pod.gpu_memory_mib

    def undo(self, pod: PodRequest, p: Placement) -> None:
        """Give back what :meth:`apply` took (a created MIG instance is removed again).

        KeyError, with nothing changed, when the pod is not on the node: a pod undone
        twice must not hand its CPU and memory back twice."""
        node = self.nodes[p.node]
        if pod.key not in node.pods:
            raise KeyError(f"{pod.key} is not placed on {p.node}")
        node.version = next(_VERSIONS)
        node.cpu_free += pod.cpu_milli
        node.mem_free += pod.memory_mib
        del node.pods[pod.key]
        if not p.gpus:
            return  # applied without GPUs: there is nothing else to give back
        if pod.kind is RequestKind.WHOLE:
            for i in p.gpus:
                g = self.gpu(p.node, i)
                if g.whole_owner == pod.key:  # never free a GPU another pod holds
                    g.whole_owner = None
        elif pod.kind is RequestKind.MIG:
            g = self.gpu(p.node, p.gpus[0])
            assert p.mig_start is not None and p.mig_profile is not None
            held = g.instances.get(p.mig_start)
            if held is not None and held[1] not in (pod.key, None):
                pass  # the slice is another pod's (two records claimed it): keep it
            elif p.mig_created:
                del g.instances[p.mig_start]
                g.created.discard(p.mig_start)
                if g.converted and not g.instances:
                    g.converted = False
            else:
                g.instances[p.mig_start] = (p.mig_profile, None)
        elif pod.kind is RequestKind.SHARED:
            del self.gpu(p.node, p.gpus[0]).shared_owners[pod.key]
            node.unsure.pop(pod.key, None)

    # -- summary -------------------------------------------------------------------------

    def whole_gpus_free(self) -> int:
        """GPUs a whole-GPU pod could take now."""
        return sum(1 for n in self.nodes.values() for g in n.gpus if g.whole_free)

    def whole_nodes_free(self) -> int:
        """GPU nodes whose every GPU a whole-GPU pod could take now."""
        return sum(1 for n in self.nodes.values() if n.whole_free)


def replicated_gpus(node: NodeState) -> list[ReplicatedGpu]:
    """The node's time-sliced GPUs as the device plugin counts them: replicas in use."""
    return [ReplicatedGpu(g.info.index, g.info.replicas, len(g.shared_owners))
            for g in node.gpus if g.mode is GpuMode.SHARED and g.whole_owner is None]


def plugin_pick(node: NodeState) -> PluginChoice | None:
    """Which GPU the device plugin hands the next one-replica share on this node (and
    which it may, on a tie); None when the node has no free replica."""
    gpus = replicated_gpus(node)
    if not gpus:
        return None
    try:
        return plugin_allocation(gpus, 1, policy=node.info.share_policy)
    except PluginRefusal:
        return None


def share_is_a_guess(node: NodeState, p: Placement) -> bool:
    """Whether a share about to be counted at ``p`` (not observed) is a guess: the node
    already has guesses (the counts are then a permutation of the real ones), or the
    plugin may pick another GPU than ``p``'s now (a tie)."""
    if node.unsure:
        return True
    pick = plugin_pick(node)
    return pick is not None and len(pick.possible[0]) > 1 and p.gpus[0] in pick.possible[0]


def worst_case_fits(node: NodeState, pod: PodRequest) -> bool:
    """Whether share ``pod`` fits wherever the plugin really puts it while some shares'
    GPUs are guesses (``node.unsure``: the plugin broke a tie its own way, or a guess
    before it shifted the counts).

    The total number of shares on the node is known; where the guessed ones are is not.
    ``distributed`` (and ``spread``, for one replica) hands out a GPU with the fewest
    shares among those with a free replica, so one holding at most K = total // GPUs
    (the fewest is at most the mean, and a full GPU, out of the running, holds at
    least the mean); ``packed`` one holding at most replicas - 1. On the GPU handed out
    are its sure shares and, at worst, the largest guessed ones up to that count: every
    GPU that can be the one must have room."""
    if not node.unsure:
        return True
    gpus = [g for g in node.gpus if g.mode is GpuMode.SHARED and g.whole_owner is None]
    total = sum(len(g.shared_owners) for g in gpus)
    floating = sorted(node.unsure.values(), reverse=True)
    for g in gpus:
        replicas = g.info.replicas
        if node.info.share_policy is AllocationPolicy.PACKED:
            most = replicas - 1 if replicas else total
        else:
            most = total // len(gpus)
        if replicas:
            most = min(most, replicas - 1)
        sure = [mem for key, (_, mem) in g.shared_owners.items() if key not in node.unsure]
        if len(sure) > most:
            continue  # holds more than the GPU handed out can
        worst = sum(sure) + sum(floating[: most - len(sure)])
        if worst + pod.gpu_memory_mib > g.info.memory_mib:
            return False
    return True


def _share_fits(g: GpuState, pod: PodRequest) -> bool:
    """Room for the share on this GPU: a replica, its memory and its compute."""
    if g.mode is GpuMode.SHARED:
        replicas = g.info.replicas
        if replicas and len(g.shared_owners) >= replicas:
            return False
        if g.shared_memory_used + pod.gpu_memory_mib > g.info.memory_mib:
            return False
        if g.info.mps and pod.gpu_memory_mib > mps_client_mib(g.info.memory_mib, replicas):
            return False  # MPS caps each client at the GPU's memory / replicas
    return g.used_milli + pod.gpu_milli <= GPU_MILLI


MODE_WORDS = {GpuMode.WHOLE: "whole-GPU mode", GpuMode.MIG: "MIG mode",
              GpuMode.SHARED: "time-sliced mode", GpuMode.FRACTIONAL: "fractional mode"}


def unusable_gpus(pod: PodRequest, gpus: list[GpuState],
                  reconfigure: MigReconfigure = MigReconfigure.NOT_OPTED_IN) -> str:
    """Why none of ``gpus`` (of a node whose MIG layouts change as ``reconfigure`` says)
    can serve ``pod``, naming the GPUs' model and mode (a bare "node has H100; pod needs
    MIG" reads as a contradiction when MIG is merely off) and, for a MIG pod, which case
    keeps MIG off."""
    if not gpus:
        return f"node has no GPUs; pod needs {describe(pod)}"
    kinds: dict[tuple[str, GpuMode, bool], int] = {}
    for g in gpus:
        key = (g.info.model, g.mode, g.reconfigurable)
        kinds[key] = kinds.get(key, 0) + 1
    have = ", ".join(f"{n} {model} in {MODE_WORDS[mode]}"
                     for (model, mode, _), n in sorted(kinds.items()))
    models = {model for model, _, _ in kinds}
    if pod.gpu_models and not models & pod.gpu_models:
        why = f"pod is limited to {'|'.join(sorted(pod.gpu_models))}"
    elif pod.kind is RequestKind.MIG:
        capable = {m for m in models if get_model(m).mig is not None}
        with_profile = {m for m in capable if (geom := get_model(m).mig) is not None
                        and pod.mig_profile in {p.name for p in geom.profiles}}
        if not capable:
            why = "these GPU models have no MIG"
        elif not with_profile:
            why = f"these GPU models have no {pod.mig_profile} profile"
        else:
            why = mig_off_reason(reconfigure)
    elif pod.kind is RequestKind.WHOLE:
        why = "no GPU here is advertised whole (nvidia.com/gpu)"
    elif pod.kind is RequestKind.SHARED:
        why = "no GPU here is time-sliced (nvidia.com/gpu.shared)"
    else:
        why = "no usable GPU"
    return f"node has {have}: {why}; pod needs {describe(pod)}"


def mig_off_reason(reconfigure: MigReconfigure) -> str:
    """Why MIG-capable GPUs in another mode cannot serve a MIG pod on such a node."""
    if reconfigure is MigReconfigure.ON:
        return "MIG is off on these GPUs and they are in use, so none may be switched to MIG"
    if reconfigure is MigReconfigure.ACTUATOR_OFF:
        return ("MIG is off on this node; it opts in to reconfiguration but the MIG "
                "actuator is off")
    if reconfigure is MigReconfigure.FROZEN:
        return ('MIG is off on this node and it freezes its MIG layout '
                '(gpupack.io/mig-reconfigure: "false")')
    return ('MIG is off on this node and it does not opt in to reconfiguration '
            '(gpupack.io/mig-reconfigure: "true")')


def describe(pod: PodRequest) -> str:
    """A short human description of a pod's GPU need."""
    models = f" on {'|'.join(sorted(pod.gpu_models))}" if pod.gpu_models else ""
    if pod.kind is RequestKind.WHOLE:
        return f"{pod.gpu_count} whole GPU(s){models}"
    if pod.kind is RequestKind.MIG:
        return f"MIG {pod.mig_profile}{models}"
    if pod.kind is RequestKind.SHARED:
        return f"GPU share {pod.gpu_milli}m/{pod.gpu_memory_mib}Mi{models}"
    return "no GPU"
