"""Scorers of the greedy policies: a sort key per option, lower is better.

Each scorer looks at the state *after* the option would be applied. Keys are tuples so
that objectives apply in strict priority order (lexicographic), which keeps every
trade-off explicit instead of hiding it in weights.
"""

from __future__ import annotations

import zlib

from packing.catalog import get_model
from packing.mig.dynamic import largest_run
from packing.mig.layout import MigSlot
from packing.model import GPU_MILLI, GpuMode, Placement, PodRequest, RequestKind
from packing.scoring import Score
from packing.state import ClusterState, GpuState, NodeState


def node_free_milli(node: NodeState) -> int:
    return sum(g.free_milli for g in node.gpus)


def node_gpu_total(node: NodeState) -> int:
    return GPU_MILLI * len(node.gpus)


def _ratio(free: int, total: int) -> float:
    return free / total if total else 1.0


def spread(state: ClusterState, pod: PodRequest, option: Placement) -> Score:
    """kube-scheduler's LeastAllocated: the emptiest node wins.

    score(node) = mean over (cpu, memory, gpu) of free_after / allocatable; we negate it
    because lower keys win.
    """
    node = state.nodes[option.node]
    cpu = _ratio(node.cpu_free - pod.cpu_milli, node.info.cpu_milli)
    mem = _ratio(node.mem_free - pod.memory_mib, node.info.memory_mib)
    gpu = _ratio(node_free_milli(node) - pod_milli_on(state, pod, option), node_gpu_total(node))
    return (-(cpu + mem + gpu) / 3, option.node, option.gpus, option.mig_start or 0)


def pod_milli_on(state: ClusterState, pod: PodRequest, option: Placement) -> int:
    """GPU capacity (milli) the option takes; a MIG instance counts by memory slices."""
    if pod.kind is RequestKind.MIG:
        g = state.gpu(option.node, option.gpus[0])
        geom = get_model(g.info.model).mig
        assert geom is not None and option.mig_profile is not None
        return geom.profile(option.mig_profile).memory_slices * GPU_MILLI // geom.memory_slices
    return pod.gpu_demand_milli


def bestfit(state: ClusterState, pod: PodRequest, option: Placement) -> Score:
    """Best fit: the option that leaves the least free capacity where it lands.

    Key: (free GPU milli of the node after, free CPU share of the node after, free milli
    of the chosen GPU after, node, GPU). CPU-only pods compare on CPU first.
    """
    node = state.nodes[option.node]
    take = pod_milli_on(state, pod, option)
    node_after = node_free_milli(node) - take
    cpu_after = _ratio(node.cpu_free - pod.cpu_milli, node.info.cpu_milli)
    gpu_after = state.gpu(option.node, option.gpus[0]).free_milli - take if option.gpus else 0
    if pod.kind is RequestKind.NONE:
        return (cpu_after, node_after, 0, option.node, option.gpus)
    return (node_after, cpu_after, gpu_after, option.node, option.gpus, option.mig_start or 0)


def _largest_placeable(g: GpuState, extra_start: int, extra_profile: str) -> tuple[int, int]:
    """After adding an instance: (largest memory slices still placeable, count of starts)."""
    geom = get_model(g.info.model).mig
    assert geom is not None
    return largest_run(geom, [*g.mig_slots(), MigSlot(extra_profile, extra_start)])


def mig_preference(state: ClusterState, pod: PodRequest, option: Placement) -> Score:
    """gpupack's preference between MIG options, before its placement score (lower wins):

    1. do not break a whole node (every GPU idle and usable whole) for a MIG pod, nor a
       whole GPU (idle, not in MIG mode: one the MIG actuator would have to convert);
    2. use an instance that already exists before creating one; use one on a GPU that
       already hosts pods before one on an idle MIG GPU (an idle GPU is what the MIG
       actuator may re-lay out or turn whole);
    3. of existing instances, the one on the GPU with the fewest free memory slices
       (best fit by GPU): pods gather on the fullest GPUs, so the emptiest ones empty as
       pods leave (and MIG compaction has the fewest pods to move). On bench/mig.py's
       speech stream this alone took gpupack from 1.25x to 1.20x the slice bound;
    4. create it where the largest profile stays placeable, then where most starts
       stay free.
    """
    node = state.nodes[option.node]
    g = state.gpu(option.node, option.gpus[0])
    created = 0
    opens_idle_mig = 0
    free_slices = 0
    mig_keep: tuple[int, int] = (0, 0)
    if g.mode is GpuMode.MIG:
        assert option.mig_start is not None and option.mig_profile is not None
        created = 1 if option.mig_created else 0
        opens_idle_mig = 1 if g.idle else 0
        if option.mig_created:
            largest, starts = _largest_placeable(g, option.mig_start, option.mig_profile)
            mig_keep = (-largest, -starts)
        else:
            free_slices = _free_memory_slices(g)
    return (1 if node.whole_free else 0, 1 if g.whole_free else 0, created, opens_idle_mig,
            free_slices, mig_keep)


def _free_memory_slices(g: GpuState) -> int:
    """Memory slices of a MIG GPU's instances that no one holds."""
    geom = get_model(g.info.model).mig
    if geom is None:
        return 0
    return sum(geom.profile(p).memory_slices for p, owner in g.instances.values()
               if owner is None)


def random_scorer(state: ClusterState, pod: PodRequest, option: Placement) -> Score:
    """A seeded random choice: a stable hash of (pod, option) as the key.

    Deterministic for the same input, uncorrelated with capacity: the baseline every
    packing policy must beat.
    """
    text = f"{pod.key}|{option.node}|{option.gpus}|{option.mig_start}"
    return (zlib.crc32(text.encode()),)
