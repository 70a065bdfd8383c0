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
from packing.model import GPU_MILLI, GpuMode, Snapshot
from packing.state import ClusterState, GpuState


@dataclass(frozen=True)
class ModelCapacity:
    """One GPU model as present in the cluster."""

    model: GpuModel
    products: tuple[str, ...]  # nvidia.com/gpu.product values of nodes with this model
    gpus: int
    mig_gpus: int  # GPUs in MIG mode, or idle whole GPUs the rebalancer may switch to MIG
    # profile -> instances a pod could take now: free existing ones plus creatable starts.
    mig_free: Mapping[str, int]
    shared_gpus: int  # time-sliced GPUs
    # (free MiB, free milli-GPU) of time-sliced GPUs with a replica left -> how many GPUs.
    shared_room: Mapping[tuple[int, int], int]

    def mig_available(self, profile: str) -> int:
        return self.mig_free.get(profile, 0)

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
        shared_gpus: Counter[str] = Counter()
        # Thousands of GPUs share a handful of (model, layout, used-or-free) states: count
        # the states first, then do the MIG arithmetic once per distinct state.
        mig_states: Counter[tuple[str, bool, tuple[tuple[int, str, bool], ...]]] = Counter()
        shared_room: dict[str, Counter[tuple[int, int]]] = {}
        for node in state.nodes.values():
            info = node.info
            product = info.labels.get(A.PRODUCT)
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
                    mig_states[(name, info.mig_reconfigurable or g.convertible, layout)] += 1
                elif g.mode is GpuMode.SHARED:
                    shared_gpus[name] += 1
                    room = _shared_room(g)
                    if room is not None:
                        shared_room.setdefault(name, Counter())[room] += 1
        mig_free: dict[str, Counter[str]] = {}
        for (name, creatable, layout), count in mig_states.items():
            free = mig_free.setdefault(name, Counter())
            for profile, n in _mig_free(name, creatable, layout).items():
                free[profile] += n * count
        models = {
            name: ModelCapacity(
                model=get_model(name),
                products=tuple(sorted(products.get(name, ()))),
                gpus=gpus[name],
                mig_gpus=mig_gpus[name],
                mig_free=MappingProxyType(dict(mig_free.get(name, {}))),
                shared_gpus=shared_gpus[name],
                shared_room=MappingProxyType(dict(shared_room.get(name, {}))),
            )
            for name in sorted(gpus)
        }
        return cls(MappingProxyType(models))

    def largest(self) -> ModelCapacity | None:
        """The model with the most memory (ties: name order)."""
        if not self.models:
            return None
        return max(self.models.values(), key=lambda m: (m.model.memory_mib, m.model.name))


def _mig_free(model: str, creatable: bool, layout: tuple[tuple[int, str, bool], ...]
              ) -> Counter[str]:
    """Instances per profile a pod could take on one MIG (or convertible) GPU.

    ``layout``: (start, profile, free) per existing instance. Mirrors
    ``ClusterState._gpu_options``: free existing instances of the profile, plus new ones
    at free valid starts when the node's layouts may change.
    """
    geom = get_model(model).mig
    out: Counter[str] = Counter()
    if geom is None:
        return out
    slots = [MigSlot(prof, start) for start, prof, _ in layout]
    for p in geom.classic:
        n = sum(1 for _, prof, free in layout if free and prof == p.name)
        if creatable:
            n += len(free_starts(geom, slots, p.name))
        if n:
            out[p.name] = n
    return out


def _shared_room(g: GpuState) -> tuple[int, int] | None:
    """(free MiB, free milli) of a time-sliced GPU, None when no replica is left."""
    if g.whole_owner is not None:
        return None
    if g.info.replicas and len(g.shared_owners) >= g.info.replicas:
        return None
    return g.info.memory_mib - g.shared_memory_used, GPU_MILLI - g.used_milli
