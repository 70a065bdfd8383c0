"""gpupack's placement score: FGD's gradient at a finer grid, then capacity lookahead.

This is the product policy's ranking, written once over arrays so that the extender's
scorer (:mod:`packing.policies.gpupack`, one node at a time) and the openb trace replay
(:mod:`sim.openb.policies`, every candidate node at once) compute the same numbers
with the same code. The callers only differ in how they read a node's state into arrays.

Symbols, per candidate node (batched on leading dims):

* ``free`` ``[..., G]``: each GPU's free compute in milli-GPUs (absent GPUs 0; an idle GPU
  that cannot be taken whole, e.g. one in MIG or time-sliced mode, at most 999);
* ``cpu``, ``mem``: the node's free CPU (milli) and memory (MiB); ``model``: its GPU
  model id in the shapes' model list;
* ``dF``: the FGD fragment increase of the placement (:mod:`packing.fragmentation`, the
  one definition of F);
* ``loss``: the drop of the demand the node can still serve (:class:`CapacityModel`).

The score of a placement (higher is better) is::

    level = floor(levels * sigmoid(-dF / 1000))        (FGD ranks by this at 100 levels)
    score = level - capacity_weight * (loss + fgd_weight * dF)

The level is the kube-scheduler score FGD ranks by, at ``levels`` steps instead of 100
(200: one step is ~20 milli-GPU of fragment change near 0, the sigmoid's slope being 1/4
per GPU). Where FGD is indifferent (same level) it falls back on an arbitrary node order;
gpupack ranks those placements by how much of the workload's demand they take away from
the node instead. ``capacity_weight`` (per milli-GPU) also lets a large capacity loss
outweigh a level: at 0.003 a placement one level worse in fragment wins only if it keeps
333 milli-GPU more servable demand. The level already ranks by dF, so inside the cost dF
counts half (``fgd_weight`` 0.5). ``levels=None`` drops the level: score = -(loss +
fgd_weight * dF), the continuous cost alone.

The workload sets six more terms (each measured on the openb traces, bench/README.md,
"Packing quality"): on a cpu-bound workload (CPU-only pods ask more than
``CPU_BOUND_GATE`` times the cores of the GPU pods) the score has no level
(:func:`workload_weights`); elsewhere a GPU pod's score loses ``CORE_DEFICIT_WEIGHT``
levels (``CORE_DEFICIT_WEIGHT_SHARES`` on share-heavy workloads) per GPU of free
capacity it leaves without cores (:class:`CoreDeficitRule`), and,
where whole-GPU pods ask most of the GPU demand, a share's score loses ``SLIVER_WEIGHT``
levels per GPU of dead sliver it leaves on its GPU (:class:`SliverRule`) and, where the
clean-node form below is off, the sum-of-squares price of the cluster's free sizes
(:class:`~packing.policies.squares.SquaresRule`: the one term that reads other nodes,
through a histogram the rules hold and the callers replace as it drifts); where the score
has levels, any pod's score loses ``RARE_WEIGHT`` levels where it takes from a node the
last of its room for a shape that few nodes can host
(:class:`~packing.policies.rare.RareShapeRule`: read from every shape of the workload and
the cluster's nodes, so the callers pass both); and two lexicographic rules come before
everything (:class:`FreshGpuRule` for shares, :class:`KeepCoresRule` for CPU-only pods).

The module is past 600 lines because the workload's rules live beside the score they
enter: both callers import this one module, which is what keeps them one policy.

Ties: :func:`rank_value` rounds the score to 1e-6 and then prefers the GPU left with the
least free compute (best fit), so float noise never decides; nodes of equal rank go to
the one left with the least free GPU capacity (:func:`node_free_after`, best fit on the
node: a pod that the workload's shapes are indifferent about fills a used node before it
opens an idle one), then the first in the caller's order. Both callers break ties alike.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from packing.fragmentation import (
    BoolArray,
    FloatArray,
    FragmentStats,
    IntArray,
    MilliRequest,
    TypicalShapes,
    fragment_delta,
)
from packing.groups.members import CLIQUE_LABEL, KEEP_WHOLE_NODES_LABEL
from packing.model import GPU_MILLI, Snapshot
from packing.policies.rare import NodeCapacity, RareShapeRule
from packing.policies.squares import SquaresRule

# A share that does not fit a GPU scores this (never chosen).
INFEASIBLE = -np.inf


@dataclass(frozen=True)
class GpupackWeights:
    """The policy's three numbers (see the module docstring)."""

    levels: int | None = 200
    capacity_weight: float = 0.003
    fgd_weight: float = 0.5

    def __post_init__(self) -> None:
        if self.levels is not None and self.levels < 1:
            raise ValueError(f"levels must be >= 1, got {self.levels}")
        if not self.capacity_weight > 0:
            raise ValueError(f"capacity_weight must be > 0, got {self.capacity_weight}")


def _sigmoid(x: FloatArray) -> FloatArray:
    return np.asarray(1.0 / (1.0 + np.exp(-x)), dtype=np.float64)


def fgd_level(delta: npt.ArrayLike, levels: int = 100) -> FloatArray:
    """FGD's kube-scheduler score of a fragment increase ``delta`` (milli-GPU):
    ``floor(levels * sigmoid(-delta / 1000))``, an integer 0..levels (the published
    simulator uses 100); +inf (does not fit) scores 0."""
    with np.errstate(over="ignore"):
        return np.floor(_sigmoid(-np.asarray(delta, dtype=np.float64) / 1000.0) * levels)


class CapacityModel:
    """How much GPU demand of the workload's shapes a node can still serve.

    For a node with per-GPU free compute f_g, free CPU c and model mu, and every GPU
    shape s of the workload (frequency p_s, GPU demand d_s = num_gpu_s x milli_s,
    CPU cpu_s):

        gpu_n_s = sum_g floor(f_g / milli_s)         (fractional s: shares that fit)
                = floor(#{g : f_g = 1000} / num_gpu_s)            (whole-GPU s)
        cpu_n_s = floor(c / cpu_s)                   (no CPU request: unbounded)
        V(node) = sum_s p_s * d_s * [model ok] * min(gpu_n_s, cpu_n_s)

    V is the expected GPU demand the node can still absorb if the next pods were all of
    one shape drawn from the workload: a one-step lookahead that sees CPU and GPU
    together, so a placement that leaves GPUs without the CPU to use them (or the
    reverse) loses value, and a CPU-only pod costs nothing on a node whose GPUs are
    already spoken for. The loss V_before - V_after of a placement is what gpupack
    minimises. Memory plays no part (as in FGD).
    """

    def __init__(self, shapes: TypicalShapes) -> None:
        keep = np.array([k.num_gpu > 0 for k in shapes.keys], dtype=bool)
        self.gm = shapes.group_milli
        self.gn = shapes.group_num_gpu
        self.frac = (self.gm > 0) & (self.gm < GPU_MILLI)
        self.whole = self.gm >= GPU_MILLI
        self.shape_group = shapes.group[keep]
        self.shape_cpu = shapes.cpu_milli[keep]
        demand = np.array([k.num_gpu * k.gpu_milli for k in shapes.keys], dtype=np.float64)
        self._model_ok = shapes.model_ok[keep]  # [S', n_models]
        self._demand = (shapes.freq[keep] * demand[keep]) if keep.any() else np.zeros(0)

    def weights(self, model_ids: npt.ArrayLike) -> FloatArray:
        """p_s * d_s * [model ok] per node ``[..., S']`` for nodes of model ``model_ids``."""
        mid = np.asarray(model_ids, dtype=np.int64)
        ok = np.moveaxis(self._model_ok[:, mid], 0, -1)  # [..., S']
        return np.asarray(self._demand * ok, dtype=np.float64)

    def gpu_counts(self, free: IntArray) -> IntArray:
        """gpu_n per shape group ``[..., J]`` of per-GPU free milli ``[..., G]``."""
        f = free[..., None]
        shares = np.where(self.frac, f // np.maximum(self.gm, 1), 0).sum(axis=-2)
        full = (free == GPU_MILLI).sum(axis=-1)[..., None]
        whole = np.where(self.whole, full // np.maximum(self.gn, 1), 0)
        return np.asarray(np.where(self.frac, shares, whole), dtype=np.int64)

    def value(self, gcnt: IntArray, cpu: IntArray, weight: FloatArray) -> FloatArray:
        cpu_n = cpu[..., None] // np.maximum(self.shape_cpu, 1)
        cpu_n = np.where(self.shape_cpu > 0, cpu_n, np.iinfo(np.int32).max)
        n = np.minimum(gcnt[..., self.shape_group], cpu_n)
        return np.asarray((weight * n).sum(axis=-1), dtype=np.float64)

    def loss(self, free: IntArray, cpu: IntArray, weight: FloatArray,
             req: MilliRequest) -> FloatArray:
        """V_before - V_after per candidate: ``[n]``, or ``[n, G]`` for a share (+inf
        where the GPU cannot take it). Whole GPUs: the first ``num_gpu`` fully free."""
        before = self.value(self.gpu_counts(free), cpu, weight)
        c2 = cpu - req.cpu
        if req.num_gpu == 0:
            return before - self.value(self.gpu_counts(free), c2, weight)
        if not req.shared:
            isfull = free == GPU_MILLI
            taken = isfull & (np.cumsum(isfull, axis=-1) <= req.num_gpu)
            f2 = np.where(taken, 0, free)
            return before - self.value(self.gpu_counts(f2), c2, weight)
        g = free.shape[-1]
        eye = np.eye(g, dtype=np.int64) * req.milli
        f2 = free[:, None, :] - eye[None, :, :]  # [n, candidate GPU, G]
        after = self.value(self.gpu_counts(f2), c2[:, None], weight[:, None, :])
        out = before[:, None] - after
        return np.where(free >= req.milli, out, np.inf)


# The fresh-GPU rule is on where whole-GPU pods ask less than this share of the
# workload's GPU demand (measured: 0.40 gains, 0.60 loses; module docstring).
FRESH_GPU_GATE = 0.5
# The node keeps FRESH_GPU_CORES x (1 + 4 w^2) times the workload's cores per GPU of
# demand for each GPU it leaves fully free, w the whole-GPU pods' share of the demand.
FRESH_GPU_CORES = 2.0
# Beside the sliver price the rule's clean-node form is on only from this w (measured:
# 0.69-0.70 lost or did nothing, 0.74-0.81 gained; it rests on those openb traces).
CLEAN_NODES_GATE = 0.72


@dataclass(frozen=True)
class FreshGpuRule:
    """When a share should take a fully free GPU rather than fill a used one.

    Under the openb protocol a pod is placed whenever it fits, so the workload's most
    common large share m* (810 milli on the openb traces) lands on every GPU that still
    has m* free and leaves a 1000 - m* sliver there that only the rare shares of at most
    1000 - m* can use. Best fit keeps fully free GPUs for exactly those pods. Where
    whole-GPU pods ask little of the workload's GPU demand (below ``FRESH_GPU_GATE``),
    a fully free GPU is not worth keeping: a share too large for m*'s sliver and smaller
    than m* (``lo`` <= milli <= ``hi``) takes one instead, on a node that keeps
    ``cores`` of cpu per GPU still fully free after it (so the GPUs it leaves whole keep
    the cpu to be used; more of it the more whole-GPU pods there are, which need such
    GPUs: measured on gpushare60, w = 0.4, 2 x the cores per GPU lost 4 points, 3 to 5 x
    gained 0.5-0.6, while gpushare80/100 gained most at 2 x), and m* finds no GPU
    sooner. The rule is a lexicographic term:
    such an option outranks every option that is not one (``bonus`` > any level step).
    Measured on the openb gpushare traces (bench/README.md, "Packing quality").

    Where whole-GPU pods ask more (w >= ``FRESH_GPU_GATE``) the rule takes its
    clean-node form (``clean_nodes``): the bonus goes only to the fully free GPUs of
    nodes that have no partially used GPU (each GPU either fully free or fully taken;
    an idle node counts). Opening fresh GPUs everywhere there leaves more holes than the
    shares after saturation can fill (default: 89.5 against 96.1, seed 42); one hole
    per node at a time spreads the mid-size shares so that later ones find a GPU they
    fill closely (multigpu50, seed 42: 320 + 470 pairs, which leave a dead 210, 35 ->
    12 GPUs; GPUs without the cores for a share 24.5 -> 14.7 GPUs idle).
    :meth:`WorkloadRules.of` turns it on where the score has levels, except where the
    :class:`SliverRule` is on and w < ``CLEAN_NODES_GATE``: there (the openb default,
    cpu and gpuspec traces, w 0.69-0.70) it lost up to 0.15 (cpu200, gpuspec33, seeds
    42-44) or gained nothing beyond noise (default), while above the gate, beside the
    price, it gained (multigpu20-40, w 0.74-0.81, 10 seeds); on among the openb traces:
    gpushare40 and multigpu20-50 (bench/README.md, "Packing quality", issue 38 item 2).
    Off where whole nodes are kept for LLM groups (:func:`keeps_whole_nodes`): an idle
    node is clean, and a share must not break the whole nodes a group needs.
    """

    active: bool
    lo: int = GPU_MILLI
    hi: int = 0
    cores: int = 0
    bonus: float = 1000.0
    clean_nodes: bool = False

    @staticmethod
    def of(shapes: TypicalShapes, clean_nodes: bool = False) -> FreshGpuRule:
        """The rule for a workload's typical shapes: m* the most frequent share above
        half a GPU, the gate on whole-GPU pods' share w of the GPU demand (at or above
        it the clean-node form where ``clean_nodes``, which :meth:`WorkloadRules.of`
        decides; else off), and ``cores`` =
        FRESH_GPU_CORES (1 + 4 w^2) x the workload's cpu per GPU of demand (GPU shapes
        only)."""
        if not any(k.num_gpu > 0 for k in shapes.keys):
            return FreshGpuRule(active=False)
        whole_share = whole_gpu_share(shapes)
        by_size = {m: p for m, p in share_sizes(shapes).items() if m > GPU_MILLI // 2}
        clean = whole_share >= FRESH_GPU_GATE
        if not by_size or (clean and not clean_nodes):
            return FreshGpuRule(active=False)
        m_star = max(by_size, key=lambda m: (by_size[m], m))
        cpu_per_gpu = cores_per_gpu(shapes)
        factor = FRESH_GPU_CORES * (1.0 + 4.0 * whole_share ** 2)
        return FreshGpuRule(active=True, lo=GPU_MILLI - m_star + 1, hi=m_star - 1,
                            cores=int(factor * cpu_per_gpu), clean_nodes=clean)

    def applies(self, req: MilliRequest) -> bool:
        return self.active and req.shared and self.lo <= req.milli <= self.hi

    def bonus_of(self, free: IntArray, cpu: IntArray, req: MilliRequest) -> FloatArray:
        """``[n, G]``: ``bonus`` on the fully free GPUs of nodes that keep ``cores`` per
        GPU still fully free after ``req`` takes one (with ``clean_nodes``: and have no
        partially used GPU), else 0."""
        fresh = free == GPU_MILLI
        left_whole = np.maximum(fresh.sum(axis=-1) - 1, 0)
        keeps = (cpu - req.cpu) >= self.cores * left_whole
        if self.clean_nodes:
            keeps &= ~((free > 0) & (free < GPU_MILLI)).any(axis=-1)
        return np.asarray(np.where(fresh & keeps[:, None], self.bonus, 0.0), dtype=np.float64)


def share_sizes(shapes: TypicalShapes) -> dict[int, float]:
    """The frequency of each share size (milli of one GPU, 0 < milli < 1000) among the
    workload's typical shapes."""
    out: dict[int, float] = {}
    for k, p in zip(shapes.keys, shapes.freq, strict=True):
        if 0 < k.gpu_milli < GPU_MILLI and k.num_gpu == 1:
            out[k.gpu_milli] = out.get(k.gpu_milli, 0.0) + float(p)
    return out


def whole_gpu_share(shapes: TypicalShapes) -> float:
    """w, the whole-GPU pods' share of the workload's GPU demand:
    sum_{s whole} p_s d_s / sum_{s GPU} p_s d_s (0 without GPU shapes)."""
    demand = np.array([k.num_gpu * k.gpu_milli for k in shapes.keys], dtype=np.float64)
    weight = shapes.freq * demand
    whole = np.array([k.gpu_milli >= GPU_MILLI for k in shapes.keys], dtype=bool)
    total = float(weight.sum())
    return float(weight[whole].sum()) / total if total > 0 else 0.0


def cores_per_gpu(shapes: TypicalShapes) -> float:
    """The workload's cpu (milli) per GPU of demand, over its GPU shapes:
    sum_s p_s cpu_s / sum_s p_s d_s x 1000 (0 without GPU shapes)."""
    gpu = np.array([k.num_gpu > 0 for k in shapes.keys], dtype=bool)
    if not gpu.any():
        return 0.0
    demand = np.array([k.num_gpu * k.gpu_milli for k in shapes.keys], dtype=np.float64)
    return (float((shapes.freq * shapes.cpu_milli)[gpu].sum())
            / max(float((shapes.freq * demand)[gpu].sum()), 1e-12) * GPU_MILLI)


@dataclass(frozen=True)
class KeepCoresRule:
    """Where a CPU-only pod takes its cores: first from nodes that keep enough for their
    fully free GPUs.

    Under the openb protocol CPU-only pods take whatever cores fit; on a CPU-scarce
    workload (cpu250: 701 CPU-only pods failed while 115 fully free G2 GPUs idled for
    want of cores, seed 42) they strand GPUs. The capacity loss sees this only at its
    small weight under the FGD level. The rule is a lexicographic term like
    :class:`FreshGpuRule`'s: a CPU-only option outranks every other one (``bonus``) on a
    node that keeps, after it, ``cores`` (the workload's cpu per GPU of demand,
    :func:`cores_per_gpu`) for each fully free GPU; a node without fully free GPUs
    always keeps. So CPU-only pods fill nodes whose GPUs are spoken for (or which have
    none) before they eat into the cores a free GPU needs. Measured (bench/README.md,
    "Packing quality"): cpu250 +0.38 on seeds 42-44 (1 x the cores; 2 x: +0.34; per free
    milli instead of per fully free GPU: +0.19); no change on cpu050-200, default,
    gpushare100 (there it never decides against the rank). Off without GPU shapes.
    """

    active: bool
    cores: int = 0
    bonus: float = 1000.0

    @staticmethod
    def of(shapes: TypicalShapes) -> KeepCoresRule:
        cpg = cores_per_gpu(shapes)
        return KeepCoresRule(active=cpg > 0, cores=int(cpg))

    def applies(self, req: MilliRequest) -> bool:
        return self.active and req.num_gpu == 0

    def bonus_of(self, free: IntArray, cpu: IntArray, req: MilliRequest) -> FloatArray:
        """``[n]``: ``bonus`` on nodes that keep ``cores`` per fully free GPU after
        ``req``, else 0."""
        keeps = (cpu - req.cpu) >= self.cores * (free == GPU_MILLI).sum(axis=-1)
        return np.asarray(np.where(keeps, self.bonus, 0.0), dtype=np.float64)


# Where CPU-only pods ask more than this share of the cores the GPU pods ask (the
# workload's typical shapes), cores, not GPUs, run out first: the score drops the FGD level
# (``GpupackWeights.levels`` None, the continuous cost alone). Measured on the openb cpu
# traces (bench/README.md, "Packing quality"): cpu250 (0.68) +0.73 over the level on seeds
# 42-47, cpu200 (0.51) -0.23 on seeds 42-44; the other traces lie at 0.11-0.46.
CPU_BOUND_GATE = 0.6


def cpu_bound(shapes: TypicalShapes) -> bool:
    """Whether the workload's CPU-only pods ask more than ``CPU_BOUND_GATE`` times the
    cores its GPU pods ask: sum_{s CPU-only} p_s cpu_s > gate x sum_{s GPU} p_s cpu_s."""
    gpu = np.array([k.num_gpu > 0 for k in shapes.keys], dtype=bool)
    cores = shapes.freq * shapes.cpu_milli
    gpu_cores = float(cores[gpu].sum())
    return gpu_cores > 0 and float(cores[~gpu].sum()) > CPU_BOUND_GATE * gpu_cores


def workload_weights(shapes: TypicalShapes, weights: GpupackWeights | None = None
                     ) -> GpupackWeights:
    """The weights gpupack ranks a workload's pods with: ``weights`` (default
    :class:`GpupackWeights`), without the FGD level where the workload is
    :func:`cpu_bound`."""
    w = weights or GpupackWeights()
    return replace(w, levels=None) if cpu_bound(shapes) else w


# Levels a GPU pod's placement loses per GPU of core deficit it adds (CoreDeficitRule):
# CORE_DEFICIT_WEIGHT where whole-GPU pods ask at least FRESH_GPU_GATE of the workload's
# GPU demand, CORE_DEFICIT_WEIGHT_SHARES where they ask less (the plain fresh-GPU rule's
# workloads; measured in the rule's docstring).
CORE_DEFICIT_WEIGHT = 80.0
CORE_DEFICIT_WEIGHT_SHARES = 20.0


@dataclass(frozen=True)
class CoreDeficitRule:
    """A price, in FGD levels, for the GPU capacity a GPU pod leaves without cores.

    A node's core deficit, in GPUs, with f_g its GPUs' free milli, c its free cpu and k
    the workload's cpu per GPU of demand (:func:`cores_per_gpu`)::

        D(node) = max(0, k x sum_g f_g / 1000 - c) / k

    is the free GPU capacity the node's free cores cannot serve at the workload's mix.
    A GPU pod's placement scores ``weight`` x (D_after - D_before) lower: a pod that asks
    many cores per GPU goes where cores are spare (nodes rich in cores per GPU, such as
    the openb traces' T4 nodes), one that asks few where they are short, so GPUs and
    cores run out together. At 80 levels per GPU (``CORE_DEFICIT_WEIGHT``) a placement
    that adds a GPU of deficit must save ~1,600 milli of fragment to win (one level is
    ~20 milli near 0); at 20 (``CORE_DEFICIT_WEIGHT_SHARES``), ~400. Measured on the
    openb traces (bench/README.md, "Packing quality"): at 20 levels, before the later
    rules (seeds 42-44), gpuspec33 +0.70, multigpu20 +0.35, cpu050-200 +0.12-0.18,
    default +0.09, gpushare40 +0.08, gpushare100 and multigpu50 +-0.01; flat between 10
    and 50 levels; counting only fully free GPUs, or CPU-only pods too, did worse. Beside
    the later rules (the clean-node form, the sliver and sum-of-squares prices; issue 38,
    2026-12-07, seeds 42-46, against 20 levels) a heavier price pays where whole-GPU pods
    ask most of the demand: 40 / 80 / 120 / 160 levels gave multigpu20-50 +0.06-0.10 /
    +0.12-0.15 / +0.11-0.13 / +0.09-0.17, and 80 gave default +0.04 and cpu100-200
    +0.06-0.07; on the share-heavy workloads where the plain fresh-GPU rule is on (w below
    ``FRESH_GPU_GATE``) 80 lost (gpushare80 -0.05, gpushare100 -0.03): that rule already
    keeps cores per fresh GPU, and there the weight stays 20. Off without GPU shapes, and
    where the score has no level (:func:`workload_weights`: on cpu-bound workloads; there
    it made no difference).
    """

    active: bool
    cores: float = 0.0
    weight: float = CORE_DEFICIT_WEIGHT

    @staticmethod
    def of(shapes: TypicalShapes, weights: GpupackWeights) -> CoreDeficitRule:
        k = cores_per_gpu(shapes)
        weight = (CORE_DEFICIT_WEIGHT if whole_gpu_share(shapes) >= FRESH_GPU_GATE
                  else CORE_DEFICIT_WEIGHT_SHARES)
        return CoreDeficitRule(active=k > 0 and weights.levels is not None, cores=k,
                               weight=weight)

    def applies(self, req: MilliRequest) -> bool:
        return self.active and req.num_gpu > 0

    def deficit(self, free: IntArray, cpu: npt.ArrayLike) -> FloatArray:
        """D of the module-level formula, per row (``free`` ``[..., G]``)."""
        need = self.cores * free.sum(axis=-1) / GPU_MILLI
        return np.asarray(np.maximum(0.0, need - np.asarray(cpu)) / self.cores,
                          dtype=np.float64)

    def penalty_of(self, free: IntArray, cpu: IntArray, req: MilliRequest) -> FloatArray:
        """``weight`` x (D_after - D_before): ``[n]`` for a whole-GPU request (it takes
        the first fully free GPUs), ``[n, G]`` for a share (one per GPU it may take)."""
        before = self.deficit(free, cpu)
        c2 = cpu - req.cpu
        if not req.shared:
            isfull = free == GPU_MILLI
            taken = isfull & (np.cumsum(isfull, axis=-1) <= req.num_gpu)
            after = self.deficit(np.where(taken, 0, free), c2)
            return np.asarray(self.weight * (after - before), dtype=np.float64)
        g = free.shape[-1]
        f2 = free[:, None, :] - np.eye(g, dtype=np.int64)[None, :, :] * req.milli
        after = self.deficit(f2, c2[:, None])
        return np.asarray(self.weight * (after - before[:, None]), dtype=np.float64)


# The sliver price (SliverRule): on where whole-GPU pods ask at least SLIVER_GATE and
# less than SLIVER_GATE_HIGH of the workload's GPU demand; a share size counts as common
# from SLIVER_MIN_FREQ; the price in levels per GPU (1000 milli) of dead sliver a share
# leaves.
SLIVER_GATE = 0.6
SLIVER_GATE_HIGH = 0.83
SLIVER_MIN_FREQ = 0.01
SLIVER_WEIGHT = 200.0


@dataclass(frozen=True)
class SliverRule:
    """A price, in FGD levels, for the dead sliver a share leaves on its GPU.

    With s_min the smallest share size of at least ``SLIVER_MIN_FREQ`` of the
    workload's pods (one-GPU shares, typical shapes) and r = f_g - milli the compute a
    share leaves on the GPU it takes, the sliver is dead when 0 < r < s_min: no common
    share fits it any more, and under the openb protocol only the rare small shares ever
    will. The share's score on that GPU loses ``weight`` x r / 1000 levels; a GPU left
    exactly full, or with room for a common share, pays nothing. So a share prefers to
    finish a GPU, or to leave it usable, and of two dead slivers the smaller (on the
    openb traces an 810-milli share takes a GPU with a small share on it, leaving ~10-90
    milli, rather than a fully free one, leaving 190, when FGD's level is close). Only
    the share's own GPU is charged, one subtraction per GPU.

    On where whole-GPU pods ask at least ``SLIVER_GATE`` and less than
    ``SLIVER_GATE_HIGH`` of the GPU demand (w of :func:`whole_gpu_share`) and the score
    has levels. Measured on the openb traces (bench/README.md, "Packing quality"):
    seeds 42-44, 200 levels per GPU gained 0.11-0.14 on cpu050-200 and default, ~0.1 on
    gpuspec, 0.01-0.05 on multigpu; 50 and 100 levels less, 400 as much, 800 lost ~2
    points (the price then outweighs the FGD level's steps); a flat price per dead sliver
    less; s_min at 0.5% or 2% frequency nothing. On the share-heavy traces (gpushare, w
    <= 0.57) it lost 0.5-2 points, hence the lower gate; on the cpu-bound one (no levels)
    it is off. 10 seeds: +0.09 to +0.13 on cpu050-200, default and gpuspec (w ~0.7),
    +0.01 to +0.04 on multigpu20-40 (w 0.74-0.81), -0.035 (s.e. 0.030) on multigpu50 (w
    0.85), hence the upper gate: it rests on that one trace, where few shares are left
    for the price to steer, and that loss may be noise.
    """

    active: bool
    smallest: int = 0
    weight: float = SLIVER_WEIGHT

    @staticmethod
    def of(shapes: TypicalShapes, weights: GpupackWeights) -> SliverRule:
        common = [m for m, p in share_sizes(shapes).items() if p >= SLIVER_MIN_FREQ]
        w = whole_gpu_share(shapes)
        if (not common or weights.levels is None
                or not SLIVER_GATE <= w < SLIVER_GATE_HIGH):
            return SliverRule(active=False)
        return SliverRule(active=True, smallest=min(common))

    def applies(self, req: MilliRequest) -> bool:
        return self.active and req.shared

    def penalty_of(self, free: IntArray, req: MilliRequest) -> FloatArray:
        """``[n, G]``: ``weight`` x r / 1000 where 0 < r = free - milli < ``smallest``,
        else 0."""
        left = free - req.milli
        dead = (left > 0) & (left < self.smallest)
        return np.asarray(np.where(dead, self.weight * left / GPU_MILLI, 0.0),
                          dtype=np.float64)


def placement_score(delta: FloatArray, loss: FloatArray, weights: GpupackWeights) -> FloatArray:
    """The score of the module docstring; INFEASIBLE where ``delta`` is +inf (no fit)."""
    fits = np.isfinite(delta)
    cost = loss + weights.fgd_weight * np.where(fits, delta, 0.0)
    if weights.levels is None:
        score = -cost
    else:
        score = fgd_level(delta, weights.levels) - weights.capacity_weight * cost
    return np.asarray(np.where(fits, score, INFEASIBLE), dtype=np.float64)


def rank_value(score: FloatArray, gpu_free_after: npt.ArrayLike = 0) -> FloatArray:
    """The score as both callers rank it: rounded to 1e-6, then the least free compute
    left on the GPU (at most 1000 milli, so the term stays under 1e-6)."""
    return np.asarray(
        np.round(score, 6) - np.asarray(gpu_free_after, dtype=np.float64) * 1e-10,
        dtype=np.float64,
    )


def opens_whole_node(n_full: npt.ArrayLike, gpu_count: npt.ArrayLike, req: MilliRequest
                     ) -> BoolArray:
    """Whether ``req`` breaks a whole node on each node: a whole-GPU request for fewer
    GPUs than the node has, on a node all of whose GPUs are free (``n_full`` of
    ``gpu_count``). Whole nodes are the room of LLM groups (a leader or a worker takes a
    node's GPUs, often all of them), so gpupack opens one for a smaller pod only where no
    node in use fits it: the first, lexicographic term of the extender's key and of the
    replay's score. The rank alone cannot keep them: it values capacity for the shapes of
    the pods that exist, and before a group's pods exist an empty node and a used one may
    rank within one FGD level of each other."""
    full = np.asarray(n_full)
    count = np.asarray(gpu_count)
    if req.num_gpu <= 0 or req.milli < GPU_MILLI:
        return np.zeros(np.shape(full), dtype=np.bool_)
    return np.asarray((count > 0) & (full == count) & (req.num_gpu < count), dtype=np.bool_)


def keeps_whole_nodes(snapshot: Snapshot) -> bool:
    """Whether whole nodes are kept for LLM groups on this cluster: some pod (running or
    pending) belongs to a group, some node is in an NVLink clique (GFD's
    ``nvidia.com/gpu.clique``, where groups are placed whole), or some node is labelled
    ``gpupack.io/keep-whole-nodes: "true"`` (an operator's word that groups will come, on
    plain nodes, before their first pod).

    Then a whole-GPU pod breaks a node all of whose GPUs are free only where no node in
    use fits it. The rank alone does not keep them: it values capacity for the shapes of
    the pods that exist, and before a group's pods exist (a cold start, a redeploy) an
    empty node and a used node's free GPU can rank within one FGD level of each other;
    kube-scheduler then sent single-GPU pods to whole nodes on the real control plane,
    and the group that came next found none. Elsewhere the rank decides alone: on
    clusters without groups, such as the openb traces, keeping nodes whole costs
    allocation (measured with the term always on, 10 seeds at 130% load: 0.10-0.48
    points on the cpu, default, gpuspec and multigpu traces, none on gpushare; FGD then
    led on three multigpu traces)."""
    pods = [p for p, _ in snapshot.running] + list(snapshot.pending)
    return (any(p.group is not None for p in pods)
            or any(CLIQUE_LABEL in n.labels
                   or n.labels.get(KEEP_WHOLE_NODES_LABEL) == "true" for n in snapshot.nodes))


def node_free_after(free: IntArray, req: MilliRequest) -> IntArray:
    """GPU capacity (milli) left on each node ``[n]`` after ``req``: the node tie-break."""
    return np.asarray(free.sum(axis=-1) - req.demand, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class NodeArrays:
    """Candidate nodes read into arrays (see the module docstring), with their FGD
    statistics (``stats``, rows aligned with the nodes)."""

    free: IntArray  # [n, G]
    cpu: IntArray  # [n]
    mem: IntArray  # [n]
    model: IntArray  # [n]
    stats: FragmentStats
    # Each GPU's free milli as the sum-of-squares price counts it (an idle GPU 1000 even
    # where ``free`` shows 999 because it cannot be taken whole); None: ``free``.
    share_free: IntArray | None = None


@dataclass(frozen=True, eq=False)
class WorkloadRules:
    """What the score takes from one workload, built once (:meth:`of`): the extender's
    scorer and the replay each hold one, so they are one policy by construction.
    ``weights``: after :func:`workload_weights`; a rule left ``None`` adds no term."""

    shapes: TypicalShapes
    cap: CapacityModel
    weights: GpupackWeights
    fresh: FreshGpuRule | None = None
    keep: KeepCoresRule | None = None
    deficit: CoreDeficitRule | None = None
    sliver: SliverRule | None = None
    squares: SquaresRule | None = None
    rare: RareShapeRule | None = None

    @staticmethod
    def of(shapes: TypicalShapes, weights: GpupackWeights | None = None, *,
           cap_shapes: TypicalShapes | None = None, fresh: bool = True, keep: bool = True,
           deficit: bool = True, cpu_bound_cost: bool = True, sliver: bool = True,
           fresh_clean: bool = True, keep_whole_nodes: bool = False,
           squares: bool = True, all_shapes: TypicalShapes | None = None,
           nodes: NodeCapacity | None = None) -> WorkloadRules:
        """The rules gpupack ships for ``shapes`` (a flag turns one off: the replay's
        comparisons; ``fresh_clean`` the fresh-GPU rule's clean-node form);
        ``cap_shapes``: what the capacity model counts, if not ``shapes``;
        ``keep_whole_nodes``: whether whole nodes are kept for LLM groups
        (:func:`keeps_whole_nodes`; then the clean-node form is off, as it is on
        cpu-bound workloads and where the sliver price is on below
        ``CLEAN_NODES_GATE``); ``squares``: the sum-of-squares price
        (:mod:`packing.policies.squares`: on where the sliver price is on and the
        clean-node form off), holding an empty histogram until :meth:`at_free_sizes`;
        ``all_shapes`` (every shape of the workload) and ``nodes`` (the cluster's
        capacity): the rare-shape price (:mod:`packing.policies.rare`), off without
        them and where the score has no level."""
        w = workload_weights(shapes, weights) if cpu_bound_cost else (weights or GpupackWeights())
        # The fresh-GPU rule's clean-node form where the score has levels, except where
        # the sliver price is on and w < CLEAN_NODES_GATE (FreshGpuRule).
        slivers = SliverRule.of(shapes, w)
        clean = (fresh_clean and not keep_whole_nodes and w.levels is not None
                 and (not slivers.active or whole_gpu_share(shapes) >= CLEAN_NODES_GATE))
        fresh_rule = FreshGpuRule.of(shapes, clean_nodes=clean) if fresh else None
        # The sum-of-squares price where the clean-node form is not in effect (off, or
        # the fresh-GPU rule itself off for these shapes): it pulls shares apart.
        clean_in_effect = (fresh_rule is not None and fresh_rule.active
                           and fresh_rule.clean_nodes)
        return WorkloadRules(
            shapes=shapes,
            cap=CapacityModel(cap_shapes if cap_shapes is not None else shapes),
            weights=w,
            fresh=fresh_rule,
            keep=KeepCoresRule.of(shapes) if keep else None,
            deficit=CoreDeficitRule.of(shapes, w) if deficit else None,
            sliver=slivers if sliver else None,
            squares=(SquaresRule.of(slivers.active and sliver, clean_in_effect)
                     if squares else None),
            # The rare-shape price is in levels: off where the score has none (as the
            # core-deficit price).
            rare=(RareShapeRule.of(all_shapes, nodes)
                  if all_shapes is not None and nodes is not None and w.levels is not None
                  else None))

    def at_free_sizes(self, counts: IntArray, gpus: int) -> WorkloadRules:
        """These rules with the sum-of-squares price holding the cluster's histogram of
        free sizes ``counts`` over ``gpus`` GPUs (:meth:`SquaresRule.at`)."""
        if self.squares is None:
            return self
        return replace(self, squares=self.squares.at(counts, gpus))

    def free_sizes_due(self, counts: IntArray, gpus: int) -> bool:
        """Whether the held histogram should be replaced by ``counts``
        (:meth:`SquaresRule.due`; never where the price is off)."""
        return self.squares is not None and self.squares.due(counts, gpus)


def ranks(nodes: NodeArrays, req: MilliRequest, rules: WorkloadRules) -> FloatArray:
    """Rank values (higher better) of placing ``req`` on each node: ``[n]`` for
    whole-GPU and CPU-only requests (they take the first fully free GPUs, or none),
    ``[n, G]`` for a share (one per GPU). INFEASIBLE where the request does not fit.
    The workload's :class:`FreshGpuRule` and :class:`KeepCoresRule` terms come first;
    its :class:`CoreDeficitRule` and :class:`SliverRule` are prices in levels, inside
    the score."""
    delta = fragment_delta(nodes.stats, nodes.free, nodes.cpu, nodes.mem, nodes.model, req,
                           rules.shapes)
    cap = rules.cap
    loss = cap.loss(nodes.free, nodes.cpu, cap.weights(nodes.model), req)
    score = placement_score(delta, loss, rules.weights)
    if (deficit := rules.deficit) is not None and deficit.applies(req):
        score = score - deficit.penalty_of(nodes.free, nodes.cpu, req)
    if (rare := rules.rare) is not None and rare.applies(req):
        score = score - rare.penalty_of(nodes.free, nodes.cpu, nodes.mem, nodes.model, req)
    if (keep := rules.keep) is not None and keep.applies(req):
        score = score + keep.bonus_of(nodes.free, nodes.cpu, req)
    if not req.shared:
        return rank_value(score)
    if (sliver := rules.sliver) is not None and sliver.applies(req):
        score = score - sliver.penalty_of(nodes.free, req)
    if (squares := rules.squares) is not None and squares.applies(req):
        score = score - squares.penalty_of(
            nodes.free if nodes.share_free is None else nodes.share_free, req)
    if (fresh := rules.fresh) is not None and fresh.applies(req):
        score = score + fresh.bonus_of(nodes.free, nodes.cpu, req)
    return rank_value(score, nodes.free - req.milli)


def best_on_nodes(nodes: NodeArrays, req: MilliRequest, rules: WorkloadRules
                  ) -> tuple[FloatArray, IntArray]:
    """Each node's best rank value and the GPU a share takes there (the first on ties;
    -1 for whole-GPU and CPU-only requests)."""
    r = ranks(nodes, req, rules)
    if not req.shared:
        return r, np.full(len(nodes.cpu), -1, dtype=np.int64)
    gpu = np.asarray(r.argmax(axis=1), dtype=np.int64)
    return r[np.arange(len(gpu)), gpu], gpu
