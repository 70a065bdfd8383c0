"""What a snapshot offers small pods, per GPU model: MIG slices and time-sliced room.

The webhook answers per pod in well under a millisecond even at thousands of nodes, so
it never walks the nodes per request: :class:`ClusterView` condenses a
:class:`~packing.model.Snapshot` once (through :class:`~packing.state.ClusterState`, the
same accounting the scheduler uses) into per-model counts that a decision reads in
O(models x profiles). Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kube import annotations as A
from packing.catalog import GpuModel, get_model
from packing.mig import MigSlot, free_starts
from packing.model import GPU_MILLI, GpuMode, MigReconfigure, Snapshot
from packing.state import ClusterState, GpuState


@dataclass(frozen=True)
class ModelCapacity:
    """One GPU model as present in the cluster."""

    model: GpuModel
    products: tuple[str, ...]  # nvidia.com/gpu.product values of nodes with this model
    gpus: int
    mig_gpus: int  # GPUs in MIG mode, or idle whole GPUs that may be switched to MIG now
    # profile -> free instances that exist now.
    mig_free: Mapping[str, int]
    shared_gpus: int  # time-sliced GPUs
    # (free MiB, free milli-GPU) of time-sliced GPUs with a replica left -> how many GPUs.
    shared_room: Mapping[tuple[int, int], int]
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
            for (mem, milli), n in self.shared_room.items()
            if mem >= memory_mib and milli >= compute_milli
        )


@dataclass(frozen=True)
class ClusterView:
    """Per-model capacity of a snapshot; build with :meth:`of`."""

    models: Mapping[str, ModelCapacity]  # by catalog model name, sorted by name

    @classmethod
    def of(cls, snapshot: Snapshot) -> ClusterView:
        state = ClusterState(snapshot)
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
        shared_room: dict[str, Counter[tuple[int, int]]] = {}
        for node in state.nodes.values():
            info = node.info
            product = info.labels.get(A.PRODUCT)
            unreported_node = all(g.info.inferred and not g.instances for g in node.gpus
                                  if g.info.mode is GpuMode.MIG)
            for g in node.gpus:
                name = g.info.model
                gpus[name] += 1
                if product:
                    products.setdefault(name, set()).add(product)
                if info.unschedulable:
                    continue  # present, but offers nothing until uncordoned
                if g.mode is GpuMode.MIG or g.convertible:
                    mig_gpus[name] += 1
                    layout = tuple(sorted((start, prof, owner is None)
                                          for start, (prof, owner) in g.instances.items()))
                    creatable = info.mig_reconfigurable or g.convertible
                    mig_states[(name, creatable, layout)] += 1
                    if creatable:
                        changeable[name] += 1
                    elif unreported_node:
                        unreported[name] += 1
                    else:
                        fixed.setdefault(name, Counter())[info.mig_reconfigure] += 1
                elif get_model(name).mig is not None:
                    off.setdefault(name, Counter())[info.mig_reconfigure] += 1
                if g.mode is GpuMode.SHARED:
                    shared_gpus[name] += 1
                    room = _shared_room(g)
                    if room is not None:
                        shared_room.setdefault(name, Counter())[room] += 1
        free: dict[str, Counter[str]] = {}
        creatable_n: dict[str, Counter[str]] = {}
        existing: dict[str, Counter[str]] = {}
        for (name, creatable, layout), count in mig_states.items():
            f, c, e = _mig_counts(name, creatable, layout)
            for into, counts in ((free, f), (creatable_n, c), (existing, e)):
                acc = into.setdefault(name, Counter())
                for profile, n in counts.items():
                    acc[profile] += n * count

        def frozen(d: dict[str, Counter[str]], name: str) -> Mapping[str, int]:
            return MappingProxyType(dict(d.get(name, {})))

        models = {
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
            )
            for name in sorted(gpus)
        }
        return cls(MappingProxyType(models))

    def largest(self) -> ModelCapacity | None:
        """The model with the most memory (ties: name order)."""
        if not self.models:
            return None
        return max(self.models.values(), key=lambda m: (m.model.memory_mib, m.model.name))


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


def _shared_room(g: GpuState) -> tuple[int, int] | None:
    """(free MiB, free milli) of a time-sliced GPU, None when no replica is left."""
    if g.whole_owner is not None:
        return None
    if g.info.replicas and len(g.shared_owners) >= g.info.replicas:
        return None
    return g.info.memory_mib - g.shared_memory_used, GPU_MILLI - g.used_milli
