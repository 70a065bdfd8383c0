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
from packing.mig import free_starts
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
        mig_free: dict[str, Counter[str]] = {}
        shared_room: dict[str, Counter[tuple[int, int]]] = {}
        # Thousands of GPUs share a handful of (model, mode, layout) states; the MIG
        # arithmetic is done once per distinct state.
        memo: dict[tuple[object, ...], Counter[str]] = {}
        for node in state.nodes.values():
            info = node.info
            product = info.labels.get(A.PRODUCT)
            for g in node.gpus:
                name = g.info.model
                gpus[name] += 1
                mig_free.setdefault(name, Counter())
                shared_room.setdefault(name, Counter())
                if product:
                    products.setdefault(name, set()).add(product)
                if info.unschedulable:
                    continue  # present, but offers nothing until uncordoned
                if g.mode is GpuMode.MIG or g.convertible:
                    mig_gpus[name] += 1
                    mig_free[name].update(_mig_free(g, info.mig_reconfigurable, memo))
                elif g.mode is GpuMode.SHARED:
                    shared_gpus[name] += 1
                    room = _shared_room(g)
                    if room is not None:
                        shared_room[name][room] += 1
        models = {
            name: ModelCapacity(
                model=get_model(name),
                products=tuple(sorted(products.get(name, ()))),
                gpus=gpus[name],
                mig_gpus=mig_gpus[name],
                mig_free=MappingProxyType(dict(mig_free[name])),
                shared_gpus=shared_gpus[name],
                shared_room=MappingProxyType(dict(shared_room[name])),
            )
            for name in sorted(gpus)
        }
        return cls(MappingProxyType(models))

    def largest(self) -> ModelCapacity | None:
        """The model with the most memory (ties: name order)."""
        if not self.models:
            return None
        return max(self.models.values(), key=lambda m: (m.model.memory_mib, m.model.name))


def _mig_free(g: GpuState, reconfigurable: bool, memo: dict[tuple[object, ...], Counter[str]]
              ) -> Counter[str]:
    """Instances per profile a pod could take on one MIG (or convertible) GPU.

    Mirrors ``ClusterState._gpu_options``: free existing instances of the profile, plus
    new ones at free valid starts when the node's layouts may change.
    """
    creatable = reconfigurable or g.convertible
    key = (g.info.model, creatable, tuple(sorted(g.instances.items())))
    cached = memo.get(key)
    if cached is not None:
        return cached
    geom = get_model(g.info.model).mig
    out: Counter[str] = Counter()
    if geom is not None:
        slots = g.mig_slots()
        for p in geom.classic:
            n = sum(1 for prof, owner in g.instances.values() if prof == p.name and owner is None)
            if creatable:
                n += len(free_starts(geom, slots, p.name))
            if n:
                out[p.name] = n
    memo[key] = out
    return out


def _shared_room(g: GpuState) -> tuple[int, int] | None:
    """(free MiB, free milli) of a time-sliced GPU, None when no replica is left."""
    if g.whole_owner is not None:
        return None
    if g.info.replicas and len(g.shared_owners) >= g.info.replicas:
        return None
    return g.info.memory_mib - g.shared_memory_used, GPU_MILLI - g.used_milli
