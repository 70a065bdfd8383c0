"""Placement policies of the openb replay, vectorized over candidate nodes.

A policy scores every feasible node for one request (higher is better) and, for a
fractional request, names the GPU it would use on that node. Scores depend only on the
node's own state and the request, so the simulator may cache them per (node, request id)
and recompute only nodes that changed since (``cacheable``). Ties are broken uniformly at
random when ``random_ties`` (kube-scheduler's selectHost does that), otherwise by the
lowest node index.

Whole-GPU requests always take the first fully free GPUs of the chosen node (as the
published simulator does), so a policy only chooses the node for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from packing.fragmentation import (
    TypicalShapes,
    fragmentation_from_stats,
    gpu_stats,
    shape_weights,
)
from packing.model import GPU_MILLI
from packing.openb.cluster import ClusterState

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

INFEASIBLE = np.inf


@dataclass(frozen=True)
class Request:
    cpu: int
    mem: int
    num_gpu: int
    milli: int  # per GPU; 1000 for whole GPUs
    model_ok: BoolArray  # [n_models]
    rid: int  # request id (cache key)

    @property
    def shared(self) -> bool:
        return 0 < self.milli < GPU_MILLI

    @property
    def demand(self) -> int:
        return self.num_gpu * self.milli


class Policy:
    """Base: subclasses implement :meth:`evaluate`."""

    name = "base"
    cacheable = True
    random_ties = True

    def reset(
        self,
        state: ClusterState,
        shapes: TypicalShapes,
        all_shapes: TypicalShapes | None = None,
        seed: int = 0,
    ) -> None:
        """``shapes``: FGD's typical shapes (95%); ``all_shapes``: every shape of the
        workload; ``seed``: the run's seed (for policies with a per-run node order)."""
        self.seed = seed
        self.state = state
        self.shapes = shapes
        self.all_shapes = all_shapes if all_shapes is not None else shapes

    def placed(self, node: int) -> None:
        """Node ``node`` changed (a pod was placed on it)."""

    def evaluate(self, idx: IntArray, req: Request) -> tuple[FloatArray, IntArray]:
        """Scores (higher better) and chosen GPU (-1: n/a) for candidate nodes ``idx``."""
        raise NotImplementedError


def best_fit_gpu(free: IntArray, milli: int) -> IntArray:
    """Per row, the GPU with the least free compute that still fits ``milli`` (first on ties)."""
    masked = np.where(free >= milli, free, np.iinfo(np.int64).max)
    return np.asarray(masked.argmin(axis=1), dtype=np.int64)


def _no_gpu(idx: IntArray) -> IntArray:
    return np.full(len(idx), -1, dtype=np.int64)


class RandomPolicy(Policy):
    """Uniformly random feasible node; fractional pods best-fit a GPU inside it."""

    name = "random"

    def evaluate(self, idx: IntArray, req: Request) -> tuple[FloatArray, IntArray]:
        gpu = best_fit_gpu(self.state.free_gpu[idx], req.milli) if req.shared else _no_gpu(idx)
        return np.zeros(len(idx)), gpu


def _leftover(state: ClusterState, idx: IntArray, req: Request) -> tuple[FloatArray, FloatArray]:
    """Fractions of the node's CPU and GPU capacity left after placing ``req``."""
    nodes = state.nodes
    cpu_left = (state.free_cpu[idx] - req.cpu) / np.maximum(nodes.cpu_milli[idx], 1)
    gpu_cap = np.maximum(nodes.gpu_count[idx] * GPU_MILLI, 1)
    gpu_left = (state.free_gpu[idx].sum(axis=1) - req.demand) / gpu_cap
    return cpu_left, gpu_left


class BestFitPolicy(Policy):
    """Least leftover: minimise the node's remaining CPU share + GPU share after placing."""

    name = "bestfit"

    def evaluate(self, idx: IntArray, req: Request) -> tuple[FloatArray, IntArray]:
        cpu_left, gpu_left = _leftover(self.state, idx, req)
        gpu = best_fit_gpu(self.state.free_gpu[idx], req.milli) if req.shared else _no_gpu(idx)
        return -(cpu_left + gpu_left), gpu


class DotProductPolicy(Policy):
    """Tetris-style alignment: maximise <request, free> with both normalised by capacity."""

    name = "dotproduct"

    def evaluate(self, idx: IntArray, req: Request) -> tuple[FloatArray, IntArray]:
        nodes = self.state.nodes
        cap_cpu = np.maximum(nodes.cpu_milli[idx], 1)
        cap_gpu = np.maximum(nodes.gpu_count[idx] * GPU_MILLI, 1)
        score = (req.cpu / cap_cpu) * (self.state.free_cpu[idx] / cap_cpu) + (
            req.demand / cap_gpu
        ) * (self.state.free_gpu[idx].sum(axis=1) / cap_gpu)
        gpu = best_fit_gpu(self.state.free_gpu[idx], req.milli) if req.shared else _no_gpu(idx)
        return score, gpu


class PackingPolicy(Policy):
    """GPU packing: fill partly used GPUs first, then partly used nodes, then idle nodes."""

    name = "packing"

    def evaluate(self, idx: IntArray, req: Request) -> tuple[FloatArray, IntArray]:
        free = self.state.free_gpu[idx]
        cap = self.state.nodes.gpu_count[idx] * GPU_MILLI
        used_node = free.sum(axis=1) < cap
        if req.shared:
            partial = (free >= req.milli) & (free < GPU_MILLI)
            tier = np.where(partial.any(axis=1), 2.0, np.where(used_node, 1.0, 0.0))
            gpu = best_fit_gpu(free, req.milli)
        else:
            tier = np.where(used_node, 1.0, 0.0)
            gpu = _no_gpu(idx)
        return tier, gpu


class FragmentationState:
    """Cached FGD statistics of every node, refreshed row by row as nodes change."""

    def __init__(self, state: ClusterState, shapes: TypicalShapes) -> None:
        self.state = state
        self.shapes = shapes
        self.total, self.cnt, self.small = gpu_stats(state.free_gpu, shapes)
        self.frag = self._frag(np.arange(state.nodes.size))

    def _frag(self, idx: IntArray) -> FloatArray:
        s = self.state
        weights = shape_weights(
            s.free_cpu[idx], s.free_mem[idx], s.nodes.model_id[idx], self.shapes
        )
        return fragmentation_from_stats(
            self.total[idx], self.cnt[idx], self.small[idx], weights, self.shapes
        )

    def refresh(self, node: int) -> None:
        t, c, sm = gpu_stats(self.state.free_gpu[node], self.shapes)
        self.total[node], self.cnt[node], self.small[node] = t, c, sm
        self.frag[node] = self._frag(np.array([node]))[0]

    def delta(self, idx: IntArray, req: Request) -> FloatArray:
        """Increase of F per candidate: ``[n]`` for CPU-only/whole requests, ``[n, G]`` for
        fractional ones (one column per GPU; +inf where the GPU cannot take the share).

        After-state statistics are updates of the cached ones (math in
        ``packing.fragmentation``): CPU/memory drop by the request on every candidate;
        k whole GPUs go 1000 -> 0, so cnt_j drops by k for every j with milli_j > 0 and
        small_j is unchanged (a 0-free GPU adds 0); a share d moves one GPU f -> f - d,
        so cnt_j changes by [f-d >= m_j] - [f >= m_j] and small_j by the matching terms.
        """
        s, sh = self.state, self.shapes
        weights = shape_weights(
            s.free_cpu[idx] - req.cpu, s.free_mem[idx] - req.mem, s.nodes.model_id[idx], sh
        )
        before = self.frag[idx]
        total, cnt, small = self.total[idx], self.cnt[idx], self.small[idx]
        if req.num_gpu == 0:
            return fragmentation_from_stats(total, cnt, small, weights, sh) - before
        if not req.shared:
            k = req.num_gpu
            cnt2 = cnt - k * (sh.group_milli > 0)
            after = fragmentation_from_stats(total - k * GPU_MILLI, cnt2, small, weights, sh)
            return after - before
        d = req.milli
        f = s.free_gpu[idx][..., None]  # [n, G, 1]
        f2 = f - d
        gm = sh.group_milli
        ge1, ge2 = f >= gm, f2 >= gm  # [n, G, J]
        cnt2 = cnt[:, None, :] - ge1 + ge2
        small2 = small[:, None, :] - np.where(ge1, 0, f) + np.where(ge2, 0, f2)
        after = fragmentation_from_stats(
            (total - d)[:, None], cnt2, small2, weights[:, None, :], sh
        )
        out = after - before[:, None]
        return np.where(f[..., 0] >= d, out, INFEASIBLE)


def _sigmoid(x: FloatArray) -> FloatArray:
    return np.asarray(1.0 / (1.0 + np.exp(-x)), dtype=np.float64)


def fgd_level(delta: FloatArray, levels: int = 100) -> FloatArray:
    """FGD's kube-scheduler score of a fragment increase ``delta`` (milli-GPU):
    ``floor(levels * sigmoid(-delta / 1000))``, an integer 0..levels (the published
    simulator uses 100); +inf (does not fit) scores 0."""
    with np.errstate(over="ignore"):
        return np.floor(_sigmoid(-delta / 1000.0) * levels)


class FgdPolicy(Policy):
    """Fragmentation Gradient Descent, as in the published simulator.

    The simulator turns the fragment decrease into a kube-scheduler score
    ``int64(sigmoid((F_before - F_after) / 1000) * 100)``: an integer 0..100, so changes
    below about 40 milli-GPU (the sigmoid's slope at 0 is 1/4 per GPU) tie. A fractional
    pod takes the GPU of the node with the best such score, the lowest index on ties
    (``calculateGpuShareFragExtendScore``). Ties between nodes (``tie``):

    * ``order`` (default, the reproduction): the first node in a node order drawn at
      random once per run (seed). The simulator prefixes every node name with a random
      permutation index per seed and its kube-scheduler is a fork; ties broken uniformly
      at random per pod (``random``) spread 1-GPU pods over the empty 8-GPU nodes and
      fail the 8-GPU pods from ~40% load (91.3% on ``default`` seed 42), which the
      published curves never do, while a fixed per-run order reproduces them.
    * ``bestfit``: the node the pod fills best (least leftover CPU + GPU share).
    * ``random``: uniformly at random per pod (stock kube-scheduler ``selectHost``).
    * ``first``: the lowest node index.

    ``exact`` drops the integer rounding (argmin of the raw delta).
    """

    name = "fgd"

    def __init__(self, exact: bool = False, tie: str = "order") -> None:
        if tie not in ("order", "bestfit", "random", "first"):
            raise ValueError(f"unknown tie rule {tie!r}")
        self.exact = exact
        self.tie = tie
        if exact:
            self.name = "fgd-exact"
        self.random_ties = tie == "random"

    def reset(
        self,
        state: ClusterState,
        shapes: TypicalShapes,
        all_shapes: TypicalShapes | None = None,
        seed: int = 0,
    ) -> None:
        super().reset(state, shapes, all_shapes, seed)
        self.fs = FragmentationState(state, shapes)
        n = state.nodes.size
        # rank in the run's node order, scaled into [0, 1): breaks integer-score ties only
        perm = np.random.default_rng(seed + 104729).permutation(n)
        self.order_bonus = np.asarray((n - perm) / (n + 1.0), dtype=np.float64)

    def placed(self, node: int) -> None:
        self.fs.refresh(node)

    def _score(self, delta: FloatArray) -> FloatArray:
        return -delta if self.exact else fgd_level(delta)

    def evaluate(self, idx: IntArray, req: Request) -> tuple[FloatArray, IntArray]:
        delta = self.fs.delta(idx, req)
        if not req.shared:
            score, gpu = self._score(delta), _no_gpu(idx)
        else:
            full = np.where(np.isfinite(delta), self._score(delta), -np.inf)
            gpu = np.asarray(full.argmax(axis=1), dtype=np.int64)  # first GPU on ties
            score = full[np.arange(len(idx)), gpu]
        if self.tie == "bestfit":
            cpu_left, gpu_left = _leftover(self.state, idx, req)
            score = score + (1.0 - (cpu_left + gpu_left) / 2.0) * 0.999
        elif self.tie == "order":
            score = score + self.order_bonus[idx]
        return score, gpu


class CapacityState:
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

    def __init__(self, state: ClusterState, shapes: TypicalShapes) -> None:
        self.state = state
        keep = np.array([k.num_gpu > 0 for k in shapes.keys], dtype=bool)
        self.gm = shapes.group_milli
        self.gn = shapes.group_num_gpu
        self.frac = (self.gm > 0) & (self.gm < GPU_MILLI)
        self.whole = self.gm >= GPU_MILLI
        self.shape_group = shapes.group[keep]
        self.shape_cpu = shapes.cpu_milli[keep]
        demand = np.array([k.num_gpu * k.gpu_milli for k in shapes.keys], dtype=np.float64)
        ok = shapes.model_ok[keep][:, state.nodes.model_id].T  # [n, S]
        self.weight = (shapes.freq[keep] * demand[keep])[None, :] * ok  # [n, S]

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

    def loss(self, idx: IntArray, req: Request) -> FloatArray:
        """V_before - V_after per candidate: ``[n]``, or ``[n, G]`` for a share (+inf
        where the GPU cannot take it). Whole GPUs: the first ``num_gpu`` fully free."""
        st = self.state
        f = st.free_gpu[idx]
        c = st.free_cpu[idx]
        w = self.weight[idx]
        before = self.value(self.gpu_counts(f), c, w)
        c2 = c - req.cpu
        if req.num_gpu == 0:
            return before - self.value(self.gpu_counts(f), c2, w)
        if not req.shared:
            isfull = f == GPU_MILLI
            taken = isfull & (np.cumsum(isfull, axis=1) <= req.num_gpu)
            f2 = np.where(taken, 0, f)
            return before - self.value(self.gpu_counts(f2), c2, w)
        g = f.shape[1]
        eye = np.eye(g, dtype=np.int64) * req.milli
        f2 = f[:, None, :] - eye[None, :, :]  # [n, candidate GPU, G]
        after = self.value(self.gpu_counts(f2), c2[:, None], w[:, None, :])
        out = before[:, None] - after
        return np.where(f >= req.milli, out, INFEASIBLE)


class GpupackPolicy(Policy):
    """gpupack's online policy: FGD's gradient at a finer grid, then capacity lookahead.

    With ``dF`` the FGD fragment increase of a placement (typical shapes, unrounded) and
    ``loss`` the drop of the node's servable workload demand V (:class:`CapacityState`,
    over FGD's typical shapes, or every shape with ``coverage_all``)::

        level = floor(levels * sigmoid(-dF / 1000))        (FGD: 100 levels)
        score = level - capacity_weight * (loss + fgd_weight * dF)

    The level is the kube-scheduler score FGD ranks by, at ``levels`` steps instead of
    100 (200: one step is ~20 milli-GPU of fragment change near 0, the sigmoid's slope
    being 1/4 per GPU). Where FGD is indifferent (same level) it falls back on an
    arbitrary node order; gpupack ranks those placements by how much of the workload's
    demand they take away from the node instead. ``capacity_weight`` (per milli-GPU)
    also lets a large capacity loss outweigh a level: at 0.003 a placement one level
    worse in fragment wins only if it keeps 333 milli-GPU more servable demand. The
    level already ranks by dF, so inside the cost dF counts half (``fgd_weight`` 0.5;
    with 1.0 ten of 17 openb traces were 0.01-0.09 points lower and three 0.01 higher,
    see ``bench/README.md``).

    ``levels=None`` drops the level term: score = -(loss + fgd_weight * dF), the
    continuous cost alone (``gpupack-capacity``, with ``fgd_weight`` 1.0; ahead of FGD on
    CPU-heavy and model-restricted traces, behind it on multi-GPU ones, see
    ``bench/README.md``).

    A share goes to the GPU with the best score, then the least free compute (also
    between nodes); remaining node ties to the lowest index.
    """

    name = "gpupack"
    random_ties = False

    def __init__(
        self,
        levels: int | None = 200,
        capacity_weight: float = 0.003,
        fgd_weight: float = 0.5,
        coverage_all: bool = False,
    ) -> None:
        if levels is not None and levels < 1:
            raise ValueError(f"levels must be >= 1, got {levels}")
        if not capacity_weight > 0:
            raise ValueError(f"capacity_weight must be > 0, got {capacity_weight}")
        self.levels = levels
        self.capacity_weight = capacity_weight
        self.fgd_weight = fgd_weight
        self.coverage_all = coverage_all
        if levels is None:
            self.name = "gpupack-capacity"

    def reset(
        self,
        state: ClusterState,
        shapes: TypicalShapes,
        all_shapes: TypicalShapes | None = None,
        seed: int = 0,
    ) -> None:
        super().reset(state, shapes, all_shapes, seed)
        self.cap = CapacityState(state, self.all_shapes if self.coverage_all else shapes)
        self.fs = FragmentationState(state, shapes)

    def placed(self, node: int) -> None:
        self.fs.refresh(node)

    def evaluate(self, idx: IntArray, req: Request) -> tuple[FloatArray, IntArray]:
        delta = self.fs.delta(idx, req)
        fits = np.isfinite(delta)  # False where a share does not fit the GPU
        cost = self.cap.loss(idx, req) + self.fgd_weight * np.where(fits, delta, 0.0)
        if self.levels is None:
            score = -cost
        else:
            score = fgd_level(delta, self.levels) - self.capacity_weight * cost
        score = np.where(fits, score, -np.inf)
        if not req.shared:
            return score, _no_gpu(idx)
        # best score, then least free compute, within the node and between nodes: free
        # <= 1000, so the term stays under 1e-3 milli-GPU of cost (1e-6 of a level)
        tie = 1.0e6 if self.levels is None else 1.0e9
        keyed = score - self.state.free_gpu[idx] / tie
        gpu = np.asarray(keyed.argmax(axis=1), dtype=np.int64)
        return keyed[np.arange(len(idx)), gpu], gpu


POLICIES = (
    "random",
    "dotproduct",
    "packing",
    "bestfit",
    "fgd",
    "fgd-bestfit",
    "fgd-random",
    "gpupack",
    "gpupack-capacity",
)


def make(name: str) -> Policy:
    """A fresh policy by name (see ``POLICIES``).

    ``fgd`` is the reproduction of the published FGD: integer kube-scheduler scores, ties
    between nodes to the first in a per-run random node order (see :class:`FgdPolicy`).
    ``fgd-bestfit`` breaks them by BestFit's least leftover, ``fgd-random`` uniformly at
    random per pod (plain kube-scheduler selectHost). ``fgd-exact`` drops the integer
    rounding.
    """
    if name == "random":
        return RandomPolicy()
    if name == "dotproduct":
        return DotProductPolicy()
    if name == "packing":
        return PackingPolicy()
    if name == "bestfit":
        return BestFitPolicy()
    if name == "fgd":
        return FgdPolicy(tie="order")
    if name in ("fgd-bestfit", "fgd-random"):
        p = FgdPolicy(tie=name.split("-")[1])
        p.name = name
        return p
    if name == "fgd-exact":
        return FgdPolicy(exact=True, tie="order")
    if name == "gpupack":
        return GpupackPolicy()
    if name == "gpupack-capacity":
        return GpupackPolicy(levels=None, fgd_weight=1.0)
    raise KeyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}, fgd-exact")
