"""FGD's GPU fragmentation measure (Weng et al., "Beware of Fragmentation", USENIX ATC'23).

One definition, vectorized over any leading batch shape (nodes, or nodes x candidate GPUs),
used by gpupack's placement score (``packing.policies.lookahead``: the extender's scorer
and the openb replay) and the replay's FGD policy (``sim.openb``).

The math, as the published simulator computes it (``kubernetes-scheduler-simulator``,
``pkg/utils/frag.go``: ``NodeGpuShareFragAmount``, ``GetTypicalPods``). Let the *typical
shapes* m = 1..S be the most common pod request tuples (cpu, num_gpu, gpu_milli,
gpu_spec) covering 95% of the trace's pods, with frequencies p_m renormalised over the
chosen shapes (sum p_m = 1). For a node with per-GPU free compute f_1..f_G (milli), free
CPU c and GPU model mu:

    T          = sum_g f_g                                   idle GPU capacity
    can_m      = m requests GPUs, model mu allowed by m, c >= cpu_m and
                 #{g : f_g >= milli_m} >= num_gpu_m           m fits on the node at all
    frag_m     = sum_{g : f_g < milli_m} f_g   if can_m       GPUs too small for m
               = T                             otherwise      nothing there is usable by m
    F(node)    = sum_m p_m * frag_m

A CPU-only shape (num_gpu 0) never uses a GPU, so for it *all* idle GPU capacity is
fragment, whether its CPU fits or not (the simulator files it as "XL satisfied" / "XR
lack CPU", both summed into the fragment). Memory plays no part (the simulator's shape
tuple has none). FGD places each pod where F grows least.

For speed the shapes are grouped by their GPU part j = (milli_j, num_gpu_j); the GPU
statistics of a node depend on j only:

    cnt_j   = #{g : f_g >= milli_j}       small_j = sum_{g : f_g < milli_j} f_g

and the CPU/memory/model part folds into one weight per group,

    B_j     = sum_{m in group j, m not CPU-only} p_m * [model ok, c >= cpu_m, r >= mem_m]

so that, with P = sum_m p_m,

    F = P*T - sum_j B_j * [cnt_j >= num_gpu_j] * (T - small_j).

(Each GPU shape that fits turns its term p_m*T into p_m*small_j; CPU-only shapes keep
p_m*T.) A candidate placement only changes one GPU and the node's CPU, so the after-state
statistics are a cheap update of cached ones (:func:`fragment_delta`); all of them end in
:func:`fragment_value`, the one place where F is defined.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from packing.model import GPU_MILLI

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

DEFAULT_COVERAGE = 0.95


@dataclass(frozen=True)
class ShapeKey:
    """The part of a pod request that FGD's typical shapes distinguish."""

    cpu_milli: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str]
    memory_mib: int = 0  # the paper's tuple has no memory; a snapshot packer may add it


@dataclass(frozen=True, eq=False)
class TypicalShapes:
    """Typical pod shapes as arrays; see the module docstring for the symbols."""

    keys: tuple[ShapeKey, ...]
    freq: FloatArray  # [S] p_m
    cpu_milli: IntArray  # [S]
    memory_mib: IntArray  # [S]
    model_ok: BoolArray  # [S, n_models] shape m may run on GPU model id mu
    group: IntArray  # [S] j(m)
    group_milli: IntArray  # [J]
    group_num_gpu: IntArray  # [J]
    group_onehot_p: FloatArray  # [S, J] p_m where j(m) = j, else 0

    @property
    def total_freq(self) -> float:
        return float(self.freq.sum())


def make_shapes(counts: Sequence[tuple[ShapeKey, float]], models: Sequence[str]) -> TypicalShapes:
    """Shapes with explicit frequencies (in the given order); ``models`` indexes model ids."""
    keys = tuple(k for k, _ in counts)
    freq = np.array([p for _, p in counts], dtype=np.float64)
    model_ok = np.zeros((len(keys), len(models)), dtype=bool)
    for s, k in enumerate(keys):
        for mu, name in enumerate(models):
            # A CPU-only shape has no model restriction; an empty gpu_spec means any model.
            model_ok[s, mu] = k.num_gpu == 0 or not k.gpu_spec or name in k.gpu_spec
    groups: dict[tuple[int, int], int] = {}
    group = np.zeros(len(keys), dtype=np.int64)
    for s, k in enumerate(keys):
        group[s] = groups.setdefault((k.gpu_milli, k.num_gpu), len(groups))
    gm = np.array([m for m, _ in groups], dtype=np.int64)
    gn = np.array([n for _, n in groups], dtype=np.int64)
    onehot = np.zeros((len(keys), len(groups)), dtype=np.float64)
    # A CPU-only shape never "fits" in the fragment sense: its term stays p_m * T.
    gpu_shape = np.array([k.num_gpu > 0 for k in keys], dtype=bool)
    onehot[np.arange(len(keys)), group] = np.where(gpu_shape, freq, 0.0)
    return TypicalShapes(
        keys=keys,
        freq=freq,
        cpu_milli=np.array([k.cpu_milli for k in keys], dtype=np.int64),
        memory_mib=np.array([k.memory_mib for k in keys], dtype=np.int64),
        model_ok=model_ok,
        group=group,
        group_milli=gm,
        group_num_gpu=gn,
        group_onehot_p=onehot,
    )


def typical_shape_table(
    pods: Iterable[ShapeKey],
    models: Sequence[str],
    coverage: float = DEFAULT_COVERAGE,
    renormalize: bool = True,
) -> TypicalShapes:
    """The most common shapes whose cumulative share first reaches ``coverage``.

    Frequencies are count / total, then (``renormalize``, as the published simulator
    does after chopping the tail) divided by the chosen shapes' share so they sum to 1.
    Equal counts are ordered by the key's fields, descending, like the simulator's
    ``sort.Reverse`` over (cpu, gpu milli, GPU count, GPU type).
    """
    counter = Counter(pods)
    total = sum(counter.values())
    if total == 0:
        return make_shapes([], models)
    # Descending by (count, cpu, milli, num_gpu, spec), as the simulator's
    # sort.Reverse(TargetPodList) orders them.
    ranked = sorted(
        counter.items(),
        key=lambda kv: (
            kv[1],
            kv[0].cpu_milli,
            kv[0].gpu_milli,
            kv[0].num_gpu,
            "|".join(sorted(kv[0].gpu_spec)),
            kv[0].memory_mib,
        ),
        reverse=True,
    )
    chosen: list[tuple[ShapeKey, float]] = []
    acc = 0
    for key, n in ranked:
        chosen.append((key, n / total))
        acc += n
        if acc >= coverage * total:
            break
    if renormalize and acc:
        chosen = [(k, p * total / acc) for k, p in chosen]
    return make_shapes(chosen, models)


def gpu_stats(
    free_milli: npt.ArrayLike, shapes: TypicalShapes
) -> tuple[FloatArray, IntArray, FloatArray]:
    """(T [...], cnt [..., J], small [..., J]) of per-GPU free milli ``[..., G]``.

    Absent GPUs (padding) must be given as 0 free: they then count as neither usable nor
    idle, exactly like a fully allocated GPU.
    """
    f = np.asarray(free_milli, dtype=np.int64)[..., None]  # [..., G, 1]
    ge = f >= shapes.group_milli  # [..., G, J]
    total = f[..., 0].sum(axis=-1).astype(np.float64)
    cnt = ge.sum(axis=-2).astype(np.int64)
    small = np.where(ge, 0, f).sum(axis=-2).astype(np.float64)
    return total, cnt, small


def shape_weights(
    free_cpu: npt.ArrayLike,
    free_mem: npt.ArrayLike,
    model_ids: npt.ArrayLike,
    shapes: TypicalShapes,
) -> FloatArray:
    """B [..., J]: summed p_m of the shapes whose CPU, memory and model the node allows."""
    cpu = np.asarray(free_cpu, dtype=np.int64)[..., None]
    mem = np.asarray(free_mem, dtype=np.int64)[..., None]
    mid = np.asarray(model_ids, dtype=np.int64)
    ok = (cpu >= shapes.cpu_milli) & (mem >= shapes.memory_mib)  # [..., S]
    ok &= np.moveaxis(shapes.model_ok[:, mid], 0, -1)  # [..., S]
    return ok.astype(np.float64) @ shapes.group_onehot_p  # [..., J]


def fragment_value(
    total: npt.ArrayLike,
    cnt: npt.ArrayLike,
    small: npt.ArrayLike,
    weights: npt.ArrayLike,
    num_gpu: npt.ArrayLike,
    total_freq: float,
) -> FloatArray:
    """F = P*T - sum_j B_j [cnt_j >= num_gpu_j] (T - small_j), broadcasting leading dims:
    the one place where F is defined. ``j`` ranges over shape groups (here) or over single
    shapes (``packing.policies.fgd``, whose per-GPU "serves" test also knows MIG layouts
    and share memory)."""
    t = np.asarray(total, dtype=np.float64)
    fits = np.asarray(cnt) >= np.asarray(num_gpu)  # [..., J]
    usable = (t[..., None] - np.asarray(small, dtype=np.float64)) * fits
    return np.asarray(
        total_freq * t - (usable * np.asarray(weights, dtype=np.float64)).sum(axis=-1),
        dtype=np.float64,
    )


def fragmentation_from_stats(
    total: npt.ArrayLike,
    cnt: npt.ArrayLike,
    small: npt.ArrayLike,
    weights: npt.ArrayLike,
    shapes: TypicalShapes,
) -> FloatArray:
    """:func:`fragment_value` over the shape groups of ``shapes``."""
    return fragment_value(total, cnt, small, weights, shapes.group_num_gpu, shapes.total_freq)


def fragmentation_of(
    free_milli: npt.ArrayLike,
    free_cpu: npt.ArrayLike,
    free_mem: npt.ArrayLike,
    model_ids: npt.ArrayLike,
    shapes: TypicalShapes,
) -> FloatArray:
    """FGD fragment F of each node (milli-GPUs), for nodes batched on leading dims.

    ``free_milli`` is ``[..., G]`` (absent GPUs 0); the other arrays are ``[...]``;
    ``model_ids`` index the ``models`` the shapes were built with.
    """
    total, cnt, small = gpu_stats(free_milli, shapes)
    weights = shape_weights(free_cpu, free_mem, model_ids, shapes)
    return fragmentation_from_stats(total, cnt, small, weights, shapes)


@dataclass(frozen=True)
class MilliRequest:
    """A pod request in the units of this module: CPU milli, memory MiB, GPU count and
    milli-GPU per GPU (1000 for whole GPUs), the models it may use, and an id that is the
    same for equal requests (a cache key)."""

    cpu: int
    mem: int
    num_gpu: int
    milli: int  # per GPU; GPU_MILLI for whole GPUs
    model_ok: BoolArray  # [n_models]
    rid: int = 0

    @property
    def shared(self) -> bool:
        return 0 < self.milli < GPU_MILLI

    @property
    def demand(self) -> int:
        return self.num_gpu * self.milli


@dataclass(frozen=True, eq=False)
class FragmentStats:
    """Per-node FGD statistics (rows aligned with the nodes): T, cnt_j, small_j, F."""

    total: FloatArray  # [n]
    cnt: IntArray  # [n, J]
    small: FloatArray  # [n, J]
    frag: FloatArray  # [n]


def fragment_stats(free_milli: IntArray, free_cpu: IntArray, free_mem: IntArray,
                   model_ids: IntArray, shapes: TypicalShapes) -> FragmentStats:
    """The statistics of nodes ``[n]`` with per-GPU free milli ``[n, G]``."""
    total, cnt, small = gpu_stats(free_milli, shapes)
    weights = shape_weights(free_cpu, free_mem, model_ids, shapes)
    return FragmentStats(total, cnt, small,
                         fragmentation_from_stats(total, cnt, small, weights, shapes))


def fragment_delta(stats: FragmentStats, free_milli: IntArray, free_cpu: IntArray,
                   free_mem: IntArray, model_ids: IntArray, req: MilliRequest,
                   shapes: TypicalShapes) -> FloatArray:
    """Increase of F per candidate node: ``[n]`` for CPU-only/whole requests, ``[n, G]``
    for fractional ones (one column per GPU; +inf where the GPU cannot take the share).

    After-state statistics are updates of ``stats`` (the nodes' current ones): CPU and
    memory drop by the request on every candidate; k whole GPUs go 1000 -> 0, so cnt_j
    drops by k for every j with milli_j > 0 and small_j is unchanged (a 0-free GPU adds
    0); a share d moves one GPU f -> f - d, so cnt_j changes by [f-d >= m_j] - [f >= m_j]
    and small_j by the matching terms.
    """
    sh = shapes
    weights = shape_weights(free_cpu - req.cpu, free_mem - req.mem, model_ids, sh)
    before = stats.frag
    total, cnt, small = stats.total, stats.cnt, stats.small
    if req.num_gpu == 0:
        return fragmentation_from_stats(total, cnt, small, weights, sh) - before
    if not req.shared:
        k = req.num_gpu
        cnt2 = cnt - k * (sh.group_milli > 0)
        after = fragmentation_from_stats(total - k * GPU_MILLI, cnt2, small, weights, sh)
        return after - before
    d = req.milli
    f = free_milli[..., None]  # [n, G, 1]
    f2 = f - d
    gm = sh.group_milli
    ge1, ge2 = f >= gm, f2 >= gm  # [n, G, J]
    cnt2 = cnt[:, None, :] - ge1 + ge2
    small2 = small[:, None, :] - np.where(ge1, 0, f) + np.where(ge2, 0, f2)
    after = fragmentation_from_stats((total - d)[:, None], cnt2, small2, weights[:, None, :], sh)
    out = after - before[:, None]
    return np.asarray(np.where(f[..., 0] >= d, out, np.inf), dtype=np.float64)
