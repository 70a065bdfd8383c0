"""Fragmentation gradient descent (FGD; Weng et al., USENIX ATC'23) on snapshots.

Written from the paper's description (``shared/reference/performance-anchors.md``) and
generalised to MIG and time-sliced GPUs.

The workload is summarised by its *typical shapes* m (the most frequent pod shapes that
cover 95% of pods) with frequencies p_m. For a node N and a shape m:

  fragment_m(N) = sum of free GPU milli on N            if N cannot host m at all
                                                         (a CPU-only m: always)
                  sum of free milli of GPUs that cannot  otherwise
                  serve m (too little free, wrong model,
                  wrong mode, no placeable MIG slice)

  F(N) = sum_m p_m * fragment_m(N)

FGD puts each pod where F grows least: score(option) = F(N after) - F(N before).
F itself is :func:`packing.fragmentation.fragment_value`, the formula the openb replay and
gpupack's placement score use; this module decides, per GPU and shape, whether the GPU
serves the shape (MIG layouts, time-sliced memory and replicas included).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from packing.catalog import get_model
from packing.fragmentation import fragment_value
from packing.mig.layout import MigSlot, free_starts
from packing.model import (
    GPU_MILLI,
    GpuMode,
    GroupRef,
    NodeInfo,
    Placement,
    PodRequest,
    RequestKind,
    Snapshot,
)
from packing.policies.lookahead import keeps_whole_nodes
from packing.policies.scores import bestfit
from packing.scoring import Score, Scorer
from packing.state import ClusterState, GpuState, NodeState

COVERAGE = 0.95


@dataclass(frozen=True)
class Shape:
    """A pod shape as FGD counts it (names and groups do not matter)."""

    kind: RequestKind
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_milli: int
    gpu_memory_mib: int
    mig_profile: str | None
    gpu_models: frozenset[str]

    @staticmethod
    def of(pod: PodRequest) -> Shape:
        return Shape(
            pod.kind,
            pod.cpu_milli,
            pod.memory_mib,
            pod.gpu_count,
            pod.gpu_milli,
            pod.gpu_memory_mib,
            pod.mig_profile,
            pod.gpu_models,
        )


def typical_shapes(
    pods: Iterable[PodRequest], coverage: float = COVERAGE
) -> list[tuple[Shape, float]]:
    """The most common shapes covering ``coverage`` of pods, with renormalised weights."""
    return typical_of(Counter(Shape.of(p) for p in pods), coverage)


def shape_census(pods: Iterable[PodRequest]) -> tuple[Counter[Shape], list[PodRequest]]:
    """How many pods of each :class:`Shape` (:func:`typical_of` reads it) and one pod of
    each, in one pass over the pods."""
    counts: Counter[Shape] = Counter()
    reps: dict[Shape, PodRequest] = {}
    for p in pods:
        shape = Shape.of(p)
        counts[shape] += 1
        reps.setdefault(shape, p)
    return counts, list(reps.values())


def typical_of(counts: Counter[Shape], coverage: float = COVERAGE
               ) -> list[tuple[Shape, float]]:
    """:func:`typical_shapes` of pods counted by shape."""
    total = sum(counts.values())
    if not total:
        return []
    chosen: list[tuple[Shape, int]] = []
    covered = 0
    # Ties broken by a stable textual key so the result does not depend on input order.
    for shape, n in sorted(counts.items(), key=lambda kv: (-kv[1], repr(kv[0]))):
        chosen.append((shape, n))
        covered += n
        if covered >= coverage * total:
            break
    norm = sum(n for _, n in chosen)
    return [(s, n / norm) for s, n in chosen]


def gpu_serves(g: GpuState, shape: Shape) -> bool:
    """Can this GPU, as it is now, serve (its part of) a pod of ``shape``?"""
    if shape.gpu_models and g.info.model not in shape.gpu_models:
        return False
    mode = g.mode
    if shape.kind is RequestKind.WHOLE:
        return g.idle and mode in (GpuMode.WHOLE, GpuMode.FRACTIONAL)
    if shape.kind is RequestKind.SHARED:
        if mode not in (GpuMode.SHARED, GpuMode.FRACTIONAL) or g.whole_owner is not None:
            return False
        if mode is GpuMode.SHARED:
            if g.info.replicas and len(g.shared_owners) >= g.info.replicas:
                return False
            if g.shared_memory_used + shape.gpu_memory_mib > g.info.memory_mib:
                return False
        return g.used_milli + shape.gpu_milli <= GPU_MILLI
    if shape.kind is RequestKind.MIG:
        geom = get_model(g.info.model).mig
        if (
            (mode is not GpuMode.MIG and not g.convertible)
            or geom is None
            or shape.mig_profile is None
        ):
            return False
        if shape.mig_profile not in {p.name for p in geom.profiles}:
            return False
        if any(p == shape.mig_profile and o is None for p, o in g.instances.values()):
            return True
        layout = tuple(sorted((p, s) for s, (p, _) in g.instances.items()))
        return _placeable(g.info.model, layout, shape.mig_profile)
    return True


@lru_cache(maxsize=65536)
def _placeable(model: str, layout: tuple[tuple[str, int], ...], profile: str) -> bool:
    """Can one more ``profile`` instance be created on this layout? (memoised: the same
    few layouts recur on every GPU of a model, and this is FGD's hot path)."""
    geom = get_model(model).mig
    assert geom is not None
    return bool(free_starts(geom, [MigSlot(p, s) for p, s in layout], profile))


def node_fragmentation(node: NodeState, shapes: Sequence[tuple[Shape, float]]) -> float:
    """F(N) = sum_m p_m * fragment_m(N)."""
    return node_figures(node, shapes).value


def cluster_fragmentation(state: ClusterState, shapes: Sequence[tuple[Shape, float]]) -> float:
    """Share of idle GPU capacity that the typical pods cannot use, in [0, 1]."""
    idle = sum(g.free_milli for n in state.nodes.values() for g in n.gpus)
    if idle == 0:
        return 0.0
    return sum(node_fragmentation(n, shapes) for n in state.nodes.values()) / idle


# Entries kept by a scorer's memo of per-node figures (see fragmentation_delta).
MEMO_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class NodeFigures:
    """What F(N) is made of, kept per node state: each GPU's free milli and, per typical
    shape, whether each GPU serves it. An option changes only its own GPUs' entries."""

    value: float  # F(N)
    free: tuple[int, ...]
    serving: tuple[tuple[bool, ...], ...]  # [shape][gpu position]


def _value(node: NodeState, shapes: Sequence[tuple[Shape, float]], free: Sequence[int],
           serving: Sequence[Sequence[bool]]) -> float:
    """F(N) from per-GPU figures, by :func:`packing.fragmentation.fragment_value` (the one
    definition of F) with one group per shape: cnt_m = GPUs that serve m, small_m = free
    milli of the GPUs that do not, B_m = p_m if m asks for GPUs and the node has its CPU
    and memory (a CPU-only shape's term stays p_m * T, as in the published simulator)."""
    total = sum(free)
    if total == 0 or not shapes:
        return 0.0
    cnt = [sum(serves) for serves in serving]
    small = [sum(f for f, ok in zip(free, serves, strict=True) if not ok) for serves in serving]
    weights = [p if shape.kind is not RequestKind.NONE and node.cpu_free >= shape.cpu_milli
               and node.mem_free >= shape.memory_mib else 0.0 for shape, p in shapes]
    need = [max(1, shape.gpu_count) if shape.kind is RequestKind.WHOLE else 1
            for shape, _ in shapes]
    return float(fragment_value(total, cnt, small, weights, need, sum(p for _, p in shapes)))


# Equal figure tuples share one object: a memo holds up to MEMO_LIMIT entries, and the
# nodes' GPUs are in few distinct states (~1.5 kB an entry otherwise, ~100 B shared).
_SHARED: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _shared(t: tuple[Any, ...]) -> Any:
    if len(_SHARED) >= MEMO_LIMIT:
        _SHARED.clear()
    return _SHARED.setdefault(t, t)


def node_figures(node: NodeState, shapes: Sequence[tuple[Shape, float]]) -> NodeFigures:
    free: tuple[int, ...] = _shared(tuple(g.free_milli for g in node.gpus))
    serving: tuple[tuple[bool, ...], ...] = _shared(
        tuple(tuple(gpu_serves(g, s) for g in node.gpus) for s, _ in shapes))
    return NodeFigures(_value(node, shapes, free, serving), free, serving)


def fragmentation_delta(
    state: ClusterState, pod: PodRequest, option: Placement, shapes: Sequence[tuple[Shape, float]],
    memo: dict[int, NodeFigures] | None = None,
) -> float:
    """F(N after the option) - F(N before), computed by applying and undoing it.

    ``memo``: the node's figures by :attr:`NodeState.version`, kept by the scorer across
    calls (its shapes never change). Every option of a node shares the same "before", so
    a scan over a node's options computes it once; and "after" re-evaluates only the
    GPUs the option takes (a GPU's serving flags depend on that GPU alone; the node's
    CPU and memory are read afresh)."""
    node = state.nodes[option.node]
    if memo is None:
        before_value = node_fragmentation(node, shapes)
        state.apply(pod, option, allow_overcommit=True)
        try:
            return node_fragmentation(node, shapes) - before_value
        finally:
            state.undo(pod, option)
    before = memo.get(node.version)
    if before is None:
        before = node_figures(node, shapes)
        if len(memo) >= MEMO_LIMIT:
            memo.clear()
        memo[node.version] = before
    touched = [i for i, g in enumerate(node.gpus) if g.info.index in option.gpus]
    version = node.version
    state.apply(pod, option, allow_overcommit=True)
    try:
        free = list(before.free)
        serving = [list(row) for row in before.serving]
        for i in touched:
            g = node.gpus[i]
            free[i] = g.free_milli
            for row, (shape, _) in zip(serving, shapes, strict=True):
                row[i] = gpu_serves(g, shape)
        after = _value(node, shapes, free, serving)
    finally:
        state.undo(pod, option)
        # undo restores exactly the state before apply: give it back its number, so the
        # next option of this node finds its "before" in the memo.
        node.version = version
    return after - before.value


def workload_of(snapshot: Snapshot) -> list[PodRequest]:
    return [p for p, _ in snapshot.running] + list(snapshot.pending)


def shape_workload(snapshot: Snapshot) -> Snapshot:
    """A snapshot with the same workload as far as any scorer can tell: every pod stands
    for its :class:`Shape` through one shared pod of that shape (and one shared
    placement), so :func:`typical_shapes` counts exactly as on ``snapshot``, and
    :func:`~packing.policies.lookahead.keeps_whole_nodes` answers the same; every node
    for its capacity class (:func:`capacity_classes`); the whole thing pickles to a few
    kB for another process (50,000 running pods: ~10 MB)."""
    reps: dict[Shape, PodRequest] = {}
    # The gpupack scorer's one input beyond the shapes (whether whole nodes are kept for
    # groups: group pods or NVLink cliques) travels on the stand-ins: each carries a
    # group of its own exactly when the snapshot keeps whole nodes.
    keep = keeps_whole_nodes(snapshot)

    def rep(p: PodRequest) -> PodRequest:
        shape = Shape.of(p)
        kept = reps.get(shape)
        if kept is None:
            key = f"shape/{len(reps)}"
            kept = reps[shape] = PodRequest(
                key, p.cpu_milli, p.memory_mib, p.kind, p.gpu_count,
                p.mig_profile, p.gpu_milli, p.gpu_memory_mib, p.gpu_models,
                group=GroupRef(key, 1) if keep else None)
        return kept

    nowhere = Placement("shape/", "")
    return Snapshot(tuple(n for n, count in capacity_classes(snapshot.nodes)
                          for _ in range(count)),
                    tuple((rep(p), nowhere) for p, _ in snapshot.running),
                    tuple(rep(p) for p in snapshot.pending))


def _capacity_class(n: NodeInfo) -> tuple[object, ...]:
    return (n.cpu_milli, n.memory_mib, tuple((g.model, g.mode) for g in n.gpus),
            n.mig_reconfigure)


def capacity_classes(nodes: Iterable[NodeInfo]) -> tuple[tuple[NodeInfo, int], ...]:
    """The nodes by what a scorer reads of their capacity (cpu, memory, GPUs with their
    model and mode, MIG reconfiguration: the rare-shape price,
    :mod:`packing.policies.rare`): one stand-in NodeInfo per class (no labels, taints
    or name of a real node) and how many nodes it stands for. A shape workload
    (:func:`shape_workload`) repeats each stand-in, one shared object, so it pickles to
    a reference per node."""
    found: dict[tuple[object, ...], list[Any]] = {}
    for n in nodes:
        key = _capacity_class(n)
        kept = found.get(key)
        if kept is None:
            kept = found[key] = [NodeInfo(f"class/{len(found)}", n.cpu_milli, n.memory_mib,
                                          n.gpus, mig_reconfigure=n.mig_reconfigure), 0]
        kept[1] += 1
    return tuple((n, count) for n, count in found.values())


def make_fgd_scorer(snapshot: Snapshot) -> Scorer:
    shapes = typical_shapes(workload_of(snapshot))
    memo: dict[int, NodeFigures] = {}

    def score(state: ClusterState, pod: PodRequest, option: Placement) -> Score:
        delta = fragmentation_delta(state, pod, option, shapes, memo)
        return (round(delta, 6), *bestfit(state, pod, option))

    return score
