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

from abc import ABC, abstractmethod

import numpy as np

from packing.fragmentation import (
    FloatArray,
    FragmentStats,
    IntArray,
    MilliRequest,
    TypicalShapes,
    fragment_delta,
    fragment_stats,
)
from packing.model import GPU_MILLI
from packing.policies.lookahead import (
    GpupackWeights,
    NodeArrays,
    WorkloadRules,
    best_on_nodes,
    fgd_level,
    node_free_after,
    opens_whole_node,
    ranks,
)
from packing.policies.rare import NodeCapacity
from packing.policies.squares import SQUARES_WEIGHT, SquaresRule, free_size_counts
from sim.openb.cluster import ReplayState


class ReplayPolicy(ABC):
    """Base: subclasses implement :meth:`evaluate`."""

    name = "base"
    cacheable = True
    random_ties = True
    # Changes whenever the policy's scores change on nodes that did not (a held input
    # replaced, e.g. the sum-of-squares histogram): the per-node score cache is dropped.
    generation = 0

    def reset(
        self,
        state: ReplayState,
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

    def placed(self, node: int) -> None:  # noqa: B027 (an optional hook, not abstract)
        """Node ``node`` changed (a pod was placed on it); most policies keep nothing."""

    @abstractmethod
    def evaluate(self, idx: IntArray, req: MilliRequest) -> tuple[FloatArray, IntArray]:
        """Scores (higher better) and chosen GPU (-1: n/a) for candidate nodes ``idx``."""

    def break_tie(self, tied: IntArray, req: MilliRequest) -> int:
        """Position in ``tied`` (nodes of equal best score, in index order) of the node
        to take when ties are not random: the first."""
        del tied, req
        return 0


class FragmentAware(ReplayPolicy, ABC):
    """A policy that reads FGD's statistics (``self.fs``), kept per node as nodes change."""

    def reset(
        self,
        state: ReplayState,
        shapes: TypicalShapes,
        all_shapes: TypicalShapes | None = None,
        seed: int = 0,
    ) -> None:
        super().reset(state, shapes, all_shapes, seed)
        self.fs = FragmentationState(state, shapes)

    def placed(self, node: int) -> None:
        self.fs.refresh(node)


def best_fit_gpu(free: IntArray, milli: int) -> IntArray:
    """Per row, the GPU with the least free compute that still fits ``milli`` (first on ties)."""
    masked = np.where(free >= milli, free, np.iinfo(np.int64).max)
    return np.asarray(masked.argmin(axis=1), dtype=np.int64)


def _no_gpu(idx: IntArray) -> IntArray:
    return np.full(len(idx), -1, dtype=np.int64)


class RandomPolicy(ReplayPolicy):
    """Uniformly random feasible node; fractional pods best-fit a GPU inside it."""

    name = "random"

    def evaluate(self, idx: IntArray, req: MilliRequest) -> tuple[FloatArray, IntArray]:
        gpu = best_fit_gpu(self.state.free_gpu[idx], req.milli) if req.shared else _no_gpu(idx)
        return np.zeros(len(idx)), gpu


def _leftover(state: ReplayState, idx: IntArray, req: MilliRequest
              ) -> tuple[FloatArray, FloatArray]:
    """Fractions of the node's CPU and GPU capacity left after placing ``req``."""
    nodes = state.nodes
    cpu_left = (state.free_cpu[idx] - req.cpu) / np.maximum(nodes.cpu_milli[idx], 1)
    gpu_cap = np.maximum(nodes.gpu_count[idx] * GPU_MILLI, 1)
    gpu_left = (state.free_gpu[idx].sum(axis=1) - req.demand) / gpu_cap
    return cpu_left, gpu_left


class BestFitPolicy(ReplayPolicy):
    """Least leftover: minimise the node's remaining CPU share + GPU share after placing."""

    name = "bestfit"

    def evaluate(self, idx: IntArray, req: MilliRequest) -> tuple[FloatArray, IntArray]:
        cpu_left, gpu_left = _leftover(self.state, idx, req)
        gpu = best_fit_gpu(self.state.free_gpu[idx], req.milli) if req.shared else _no_gpu(idx)
        return -(cpu_left + gpu_left), gpu


class DotProductPolicy(ReplayPolicy):
    """Tetris-style alignment: maximise <request, free> with both normalised by capacity."""

    name = "dotproduct"

    def evaluate(self, idx: IntArray, req: MilliRequest) -> tuple[FloatArray, IntArray]:
        nodes = self.state.nodes
        cap_cpu = np.maximum(nodes.cpu_milli[idx], 1)
        cap_gpu = np.maximum(nodes.gpu_count[idx] * GPU_MILLI, 1)
        score = (req.cpu / cap_cpu) * (self.state.free_cpu[idx] / cap_cpu) + (
            req.demand / cap_gpu
        ) * (self.state.free_gpu[idx].sum(axis=1) / cap_gpu)
        gpu = best_fit_gpu(self.state.free_gpu[idx], req.milli) if req.shared else _no_gpu(idx)
        return score, gpu


class PackingPolicy(ReplayPolicy):
    """GPU packing: fill partly used GPUs first, then partly used nodes, then idle nodes."""

    name = "packing"

    def evaluate(self, idx: IntArray, req: MilliRequest) -> tuple[FloatArray, IntArray]:
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

    def __init__(self, state: ReplayState, shapes: TypicalShapes) -> None:
        self.state = state
        self.shapes = shapes
        self.stats = self._stats(np.arange(state.nodes.size))

    def _stats(self, idx: IntArray) -> FragmentStats:
        s = self.state
        return fragment_stats(s.free_gpu[idx], s.free_cpu[idx], s.free_mem[idx],
                              s.nodes.model_id[idx], self.shapes)

    def refresh(self, node: int) -> None:
        row = self._stats(np.array([node]))
        for name in ("total", "cnt", "small", "frag"):
            getattr(self.stats, name)[node] = getattr(row, name)[0]

    def rows(self, idx: IntArray) -> FragmentStats:
        st = self.stats
        return FragmentStats(st.total[idx], st.cnt[idx], st.small[idx], st.frag[idx])

    def arrays(self, idx: IntArray) -> NodeArrays:
        """Candidate nodes ``idx`` as the policy math reads them."""
        s = self.state
        return NodeArrays(s.free_gpu[idx], s.free_cpu[idx], s.free_mem[idx],
                          s.nodes.model_id[idx], self.rows(idx))

    def delta(self, idx: IntArray, req: MilliRequest) -> FloatArray:
        """Increase of F per candidate (see :func:`packing.fragmentation.fragment_delta`)."""
        s = self.state
        return fragment_delta(self.rows(idx), s.free_gpu[idx], s.free_cpu[idx],
                              s.free_mem[idx], s.nodes.model_id[idx], req, self.shapes)


class FgdPolicy(FragmentAware):
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
        state: ReplayState,
        shapes: TypicalShapes,
        all_shapes: TypicalShapes | None = None,
        seed: int = 0,
    ) -> None:
        super().reset(state, shapes, all_shapes, seed)
        n = state.nodes.size
        # rank in the run's node order, scaled into [0, 1): breaks integer-score ties only
        perm = np.random.default_rng(seed + 104729).permutation(n)
        self.order_bonus = np.asarray((n - perm) / (n + 1.0), dtype=np.float64)

    def _score(self, delta: FloatArray) -> FloatArray:
        return -delta if self.exact else fgd_level(delta)

    def evaluate(self, idx: IntArray, req: MilliRequest) -> tuple[FloatArray, IntArray]:
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


OPENS_WHOLE_NODE = 1e9  # subtracted from a score that breaks a whole node


class ProductPolicy(FragmentAware):
    """The product policy (:mod:`packing.policies.lookahead`: FGD's gradient at a finer
    grid, then capacity lookahead) over the replay's arrays.

    The extender ranks nodes with :func:`packing.policies.lookahead.best_on_nodes` one node at
    a time; this adapter calls the same function on every candidate node at once, with
    the FGD statistics kept per node between calls (refreshed as nodes change), and, with
    ``keep_whole_nodes``, puts the extender's first term before it (a whole node is
    broken only where no node in use fits:
    :func:`~packing.policies.lookahead.opens_whole_node`). Node ties
    go to the node left with the least free GPU capacity, then the lowest index (the
    extender: then the name).
    """

    name = "gpupack"
    random_ties = False

    def __init__(self, weights: GpupackWeights | None = None, coverage_all: bool = False,
                 keep_whole_nodes: bool = False, fresh_gpus: bool = True,
                 keep_cores: bool = True, core_deficit: bool = True,
                 cpu_bound_cost: bool = True, slivers: bool = True,
                 fresh_clean: bool = True, squares: bool = True, rare: bool = True) -> None:
        self.weights = weights or GpupackWeights()
        # The rare-shape price over every shape of the workload and the cluster's
        # capacity (packing.policies.rare; False: the policy before it).
        self.rare = rare
        # The sum-of-squares price with its held histogram, replaced as the extender's
        # planner replaces it (packing.policies.squares; False: the policy before it).
        self.squares = squares
        # The workload's CoreDeficitRule, and its weights without the FGD level where it
        # is cpu-bound (workload_weights), as the extender's scorer applies them (False:
        # the policy before them, for comparison).
        self.core_deficit = core_deficit
        self.cpu_bound_cost = cpu_bound_cost
        # The workload's FreshGpuRule, as the extender's scorer applies it (False: the
        # policy before issue 38, for comparison).
        self.fresh_gpus = fresh_gpus
        # Its KeepCoresRule and SliverRule likewise (False: the policy before them).
        self.keep_cores = keep_cores
        self.slivers = slivers
        # The fresh-GPU rule's clean-node form on whole-GPU heavy workloads (False: the
        # policy before issue 38 item 2's change, for comparison).
        self.fresh_clean = fresh_clean
        self.coverage_all = coverage_all
        # The extender keeps whole nodes only on clusters that run LLM groups
        # (packing.policies.lookahead.keeps_whole_nodes: group pods, NVLink cliques or the
        # gpupack.io/keep-whole-nodes label); the openb traces have none of them, so the
        # replay runs as the extender would on them.
        self.keep_whole_nodes = keep_whole_nodes
        if self.weights.levels is None:
            self.name = "gpupack-capacity"

    def reset(
        self,
        state: ReplayState,
        shapes: TypicalShapes,
        all_shapes: TypicalShapes | None = None,
        seed: int = 0,
    ) -> None:
        super().reset(state, shapes, all_shapes, seed)
        self.rules = WorkloadRules.of(
            shapes, self.weights, cap_shapes=self.all_shapes if self.coverage_all else None,
            fresh=self.fresh_gpus, keep=self.keep_cores, deficit=self.core_deficit,
            cpu_bound_cost=self.cpu_bound_cost, sliver=self.slivers,
            fresh_clean=self.fresh_clean, keep_whole_nodes=self.keep_whole_nodes,
            squares=self.squares,
            all_shapes=self.all_shapes if self.rare else None,
            nodes=NodeCapacity(cpu=state.nodes.cpu_milli, mem=state.nodes.memory_mib,
                               gpus=state.nodes.gpu_count, model=state.nodes.model_id))
        self.generation = 0
        self._has_gpus = state.nodes.gpu_count > 0
        self._gpus = int(state.nodes.gpu_count.sum())

    def placed(self, node: int) -> None:
        super().placed(node)
        # The held histogram of free sizes is replaced once the cluster's has drifted
        # from it (SquaresRule.due), checked after every placement.
        if self.rules.squares is not None and self.rules.squares.active:
            counts = free_size_counts(self.state.free_gpu[self._has_gpus])
            if self.rules.free_sizes_due(counts, self._gpus):
                self.rules = self.rules.at_free_sizes(counts, self._gpus)
                self.generation += 1

    def evaluate(self, idx: IntArray, req: MilliRequest) -> tuple[FloatArray, IntArray]:
        score, gpu = best_on_nodes(self.fs.arrays(idx), req, self.rules)
        if not self.keep_whole_nodes:
            return score, gpu
        # The extender's first term: a whole node is broken only where no node in use
        # fits. Rank values are FGD levels (at most GpupackWeights.levels) plus a
        # capacity loss in GPUs, far below OPENS_WHOLE_NODE: the subtraction is the
        # lexicographic order of the extender's key.
        opens = opens_whole_node(self.state.n_full[idx], self.state.nodes.gpu_count[idx], req)
        return np.where(opens, score - OPENS_WHOLE_NODE, score), gpu

    def break_tie(self, tied: IntArray, req: MilliRequest) -> int:
        """The node left with the least free GPU capacity, then the lowest index."""
        return int(node_free_after(self.state.free_gpu[tied], req).argmin())


class SquaresProbe(ProductPolicy):
    """A measurement: gpupack with the sum-of-squares price read live and on everywhere.

    The product (:mod:`packing.policies.squares`) holds a copy of the cluster's histogram
    of free sizes, replaced after it drifts, and is on only where the sliver price is on
    and the clean-node form off. This probe instead reads the histogram afresh at every
    share (so the per-node score cache is off: ``cacheable`` False, ~10x slower) and
    applies the price on every workload, which is how both choices were measured
    (bench/README.md, "Packing quality", idea 7: the live and the held histogram gain
    alike on default; on the traces where the clean-node form is on it lost).
    """

    name = "gpupack-squares"
    cacheable = False

    def __init__(self, weight: float = SQUARES_WEIGHT) -> None:
        super().__init__(squares=False)
        self.weight = weight

    def evaluate(self, idx: IntArray, req: MilliRequest) -> tuple[FloatArray, IntArray]:
        if not req.shared:
            return super().evaluate(idx, req)
        arrays = self.fs.arrays(idx)
        rank = ranks(arrays, req, self.rules)  # [n, G]
        live = SquaresRule(active=True, weight=self.weight).at(
            free_size_counts(self.state.free_gpu[self._has_gpus]), self._gpus)
        rank = np.where(np.isfinite(rank), rank - live.penalty_of(arrays.free, req), rank)
        gpu = np.asarray(rank.argmax(axis=1), dtype=np.int64)
        return np.asarray(rank[np.arange(len(gpu)), gpu], dtype=np.float64), gpu


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
    "gpupack-squares",
)


def make(name: str) -> ReplayPolicy:
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
        return ProductPolicy()
    if name == "gpupack-capacity":
        return ProductPolicy(GpupackWeights(levels=None, fgd_weight=1.0))
    if name == "gpupack-squares":
        return SquaresProbe()
    raise KeyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}, fgd-exact")
