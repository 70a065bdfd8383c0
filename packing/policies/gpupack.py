"""The ``gpupack`` policy: greedy portfolio, then CP-SAT over the batch.

1. Greedy answers from two scorers (gpupack's own and best fit) on the same snapshot.
2. CP-SAT (:mod:`packing.cpsat`) solves the whole batch, hinted with the better greedy
   answer, under an explicit time limit, worker count and seed. OPTIMAL and FEASIBLE
   answers are both accepted; UNKNOWN, a model too large to build, or an answer the
   validator rejects fall back to the greedy answer.
3. Of all valid candidates the one with the best objective key wins (see
   :func:`objective_key`), so gpupack never does worse on that key than best fit; on a
   tie the scorer's greedy answer wins (the solver has no preference among equal
   answers, the scorer does).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np

from packing.catalog import CATALOG
from packing.cpsat import SolverParams, priority_weights, solve_batch
from packing.fragmentation import (
    DEFAULT_COVERAGE,
    IntArray,
    MilliRequest,
    ShapeKey,
    TypicalShapes,
    fragment_stats,
    typical_shape_table,
)
from packing.groups.placement import exclusive_domains_in_use
from packing.model import (
    GPU_MILLI,
    MODE_SERVES,
    GpuMode,
    NodeInfo,
    Placement,
    PlanResult,
    PodRequest,
    RequestKind,
    Snapshot,
    Unschedulable,
)
from packing.policies.base import checked
from packing.policies.engine import greedy
from packing.policies.fgd import workload_of
from packing.policies.lookahead import (
    FloatArray,
    GpupackWeights,
    NodeArrays,
    WorkloadRules,
    keeps_whole_nodes,
    node_free_after,
    opens_whole_node,
    ranks,
)
from packing.policies.rare import NodeCapacity, RareShapeRule
from packing.policies.scores import bestfit, mig_preference, pod_milli_on
from packing.policies.squares import free_size_counts
from packing.scoring import Score, Scorer
from packing.state import ClusterState, NodeState
from packing.validate import validate

# A time-sliced share that declares GPU memory but no compute share counts, in the
# workload's shapes, as that memory over an 80 GiB GPU (the common H100/A100 size; on a
# node it counts against that node's own GPU memory).
REFERENCE_GPU_MIB = 80 * 1024
# Model id of GPU models no shape names (and of CPU-only nodes): shapes without a model
# restriction may use them, restricted shapes may not.
OTHER_MODEL = "*"
GPU_KINDS = (RequestKind.WHOLE, RequestKind.SHARED, RequestKind.MIG)
# Every set of GPU kinds a node may serve, the empty one (no GPUs) included.
SERVE_CLASSES: tuple[frozenset[RequestKind], ...] = tuple(
    frozenset(c) for r in range(len(GPU_KINDS) + 1) for c in combinations(GPU_KINDS, r))

# Evaluations one node's memo keeps for its current state (distinct pod requests).
EVALS_PER_NODE = 64


def mig_profile_milli(profile: str) -> int:
    """A MIG profile's share of its GPU by memory slices (the first catalog model that
    offers it; the profiles' names carry their size, so models agree closely)."""
    for model in CATALOG.values():
        if model.mig is not None and model.mig.has_profile(profile):
            p = model.mig.profile(profile)
            return p.memory_slices * GPU_MILLI // model.mig.memory_slices
    return GPU_MILLI // 7


def _share_milli(pod: PodRequest, gpu_memory_mib: int) -> int:
    """Compute share of a time-sliced pod: its own, else its memory over the GPU's."""
    if pod.gpu_milli > 0:
        return min(pod.gpu_milli, GPU_MILLI - 1)
    if pod.gpu_memory_mib > 0 and gpu_memory_mib > 0:
        return max(1, min(GPU_MILLI - 1, math.ceil(GPU_MILLI * pod.gpu_memory_mib
                                                   / gpu_memory_mib)))
    return 1


def typical_shape_key(pod: PodRequest) -> ShapeKey:
    """A pod as FGD's typical shapes count it (CPU, GPUs, milli-GPU each, models)."""
    if pod.kind is RequestKind.WHOLE:
        return ShapeKey(pod.cpu_milli, pod.gpu_count, GPU_MILLI, pod.gpu_models)
    if pod.kind is RequestKind.SHARED:
        return ShapeKey(pod.cpu_milli, 1, _share_milli(pod, REFERENCE_GPU_MIB), pod.gpu_models)
    if pod.kind is RequestKind.MIG:
        assert pod.mig_profile is not None
        return ShapeKey(pod.cpu_milli, 1, mig_profile_milli(pod.mig_profile), pod.gpu_models)
    return ShapeKey(pod.cpu_milli, 0, 0, frozenset())


def node_gpu_free(node: NodeState) -> list[int]:
    """Each GPU's free milli as the placement score reads it: a GPU that cannot be taken
    whole right now (MIG or time-sliced mode, or holding a pod) shows at most 999, so
    that only GPUs a whole-GPU pod could take count as whole."""
    return [g.free_milli if g.whole_free else min(g.free_milli, GPU_MILLI - 1)
            for g in node.gpus]


def share_gpu_free(node: NodeState) -> tuple[int, ...]:
    """The free milli of each GPU of ``node`` whose mode takes time-sliced shares (an
    idle one 1000): what the sum-of-squares price's histogram counts
    (:mod:`packing.policies.squares`; as the openb replay's FRACTIONAL GPUs, an idle GPU
    is not counted, where the score's ``free`` shows it as 999)."""
    return tuple(g.free_milli for g in node.gpus if RequestKind.SHARED in MODE_SERVES[g.mode])


def free_sizes(values: Iterable[Sequence[int]]) -> tuple[IntArray, int]:
    """The histogram of free sizes (:func:`~packing.policies.squares.free_size_counts`)
    and the GPU count, over nodes whose :func:`share_gpu_free` are ``values``."""
    flat = [f for v in values for f in v]
    return free_size_counts(np.array(flat, dtype=np.int64)), len(flat)


def _kinds_served(gpus: Iterable[tuple[GpuMode, bool]]) -> frozenset[RequestKind]:
    """The kinds of GPU pod GPUs of these (mode, may the MIG actuator convert it) take
    (:data:`packing.model.MODE_SERVES`; a whole-mode GPU that may be converted takes
    MIG pods too)."""
    out: set[RequestKind] = set()
    for mode, reconfigurable in gpus:
        out |= MODE_SERVES[mode]
        if reconfigurable and mode is GpuMode.WHOLE:
            out.add(RequestKind.MIG)
    return frozenset(out)


def served_kinds(node: NodeState) -> frozenset[RequestKind]:
    """The kinds of GPU pod some GPU of ``node`` takes in its mode now."""
    return _kinds_served((g.mode, g.reconfigurable) for g in node.gpus)


@dataclass(frozen=True, eq=False)
class ScoreModels:
    """A workload's shape keys and the score's model ids for them.

    The score's model ids are (GPU model, kinds of pod the node's GPUs take): a shape
    counts in a node's capacity and fragment only where its pods could run. Without the
    kinds, a time-sliced share (1 milli when it names no GPU memory) counted as a
    thousand shares on every free GPU of a whole-GPU H100 node, which made a one-GPU
    pod's last GPUs there cost more than a fresh node's (the burst of
    tests/e2e/test_e2e_burst_packing.py then opened a third node). The openb replay's
    GPUs (FRACTIONAL) take whole GPUs and shares: its ids are unchanged in effect."""

    keys: tuple[ShapeKey, ...]
    models: tuple[str, ...]
    ids: dict[tuple[str, frozenset[RequestKind]], int]
    kinds: dict[ShapeKey, frozenset[RequestKind]]

    @staticmethod
    def of(workload: Iterable[PodRequest]) -> ScoreModels:
        pods = list(workload)
        keys = tuple(typical_shape_key(p) for p in pods)
        models = (*sorted({m for k in keys for m in k.gpu_spec}), OTHER_MODEL)
        ids = {(m, c): i for i, (m, c) in enumerate(
            (m, c) for m in models for c in SERVE_CLASSES)}
        kinds: dict[ShapeKey, set[RequestKind]] = {}
        for k, p in zip(keys, pods, strict=True):
            kinds.setdefault(k, set()).add(p.kind)
        return ScoreModels(keys, models, ids, {k: frozenset(v) for k, v in kinds.items()})

    def table(self, coverage: float = DEFAULT_COVERAGE) -> TypicalShapes:
        """The typical shapes (``coverage`` 1: every shape) with the score's model ids:
        a GPU shape may run where the model fits and the GPUs take a kind of pod of
        that shape."""
        table = typical_shape_table(self.keys, self.models, coverage=coverage)
        by_model = {m: i for i, m in enumerate(self.models)}
        takes = {c: np.array([k.num_gpu == 0 or bool(self.kinds.get(k, frozenset()) & c)
                              for k in table.keys], dtype=bool) for c in SERVE_CLASSES}
        ok = np.zeros((len(table.keys), len(self.ids)), dtype=bool)
        for (m, c), i in self.ids.items():
            ok[:, i] = table.model_ok[:, by_model[m]] & takes[c]
        return replace(table, model_ok=ok)

    def id_of(self, model: str, serves: frozenset[RequestKind]) -> int:
        return self.ids.get((model, serves), self.ids[OTHER_MODEL, serves])

    def capacity(self, nodes: Sequence[NodeInfo]) -> NodeCapacity:
        """The nodes' capacity as the rare-shape price counts hosts."""
        return NodeCapacity(
            cpu=np.array([n.cpu_milli for n in nodes], dtype=np.int64),
            mem=np.array([n.memory_mib for n in nodes], dtype=np.int64),
            gpus=np.array([len(n.gpus) for n in nodes], dtype=np.int64),
            model=np.array([self.id_of(n.gpus[0].model if n.gpus else OTHER_MODEL,
                                       info_served_kinds(n)) for n in nodes],
                           dtype=np.int64))


def rare_shapes_key(snapshot: Snapshot) -> tuple[object, ...]:
    """What the rare-shape price reads of ``snapshot`` (its workload and its nodes): the
    rare shapes' requests and the (model, kinds) pairs each may use. The extender's
    planner builds a new scorer when it changes (a shape that only a few nodes host
    appears, or the nodes that host one come or go), which the typical shapes alone do
    not show: a rare shape is seldom a typical one. It reads which shapes the workload
    has, not how many pods each: one pod of each shape gives the same key."""
    if not snapshot.nodes:
        return ()
    ids = ScoreModels.of(workload_of(snapshot))
    rule = RareShapeRule.of(ids.table(coverage=1.0), ids.capacity(snapshot.nodes))
    if not rule.active:
        return ()
    names = {i: (m, tuple(sorted(k.value for k in c))) for (m, c), i in ids.ids.items()}
    return tuple((int(cpu), int(mem), int(g), int(milli),
                  tuple(names[int(i)] for i in np.flatnonzero(ok)))
                 for cpu, mem, g, milli, ok in zip(rule.cpu, rule.mem, rule.num_gpu,
                                                   rule.milli, rule.model_ok, strict=True))


def info_served_kinds(info: NodeInfo) -> frozenset[RequestKind]:
    """:func:`served_kinds` of a node as its :class:`NodeInfo` describes it (no GPU
    converted to MIG yet): what its capacity offers the rare-shape price."""
    return _kinds_served((g.mode, info.mig_reconfigurable) for g in info.gpus)


class GpupackScorer:
    """The extender's scorer: :mod:`packing.policies.lookahead` on one node at a time.

    The key of an option (lower wins): for MIG pods :func:`mig_preference` first, for
    other pods whether it breaks a whole node
    (:func:`~packing.policies.lookahead.opens_whole_node`; only on a cluster that runs
    LLM groups, :func:`keeps_whole_nodes`); then the negated rank value
    of the placement (FGD level and capacity loss, then best fit on the GPU; the openb
    replay ranks by the same number, after the same whole-node term); then the GPU
    capacity the
    node keeps (:func:`~packing.policies.lookahead.node_free_after`, as the replay breaks
    node ties); then node name, GPUs and MIG start, for determinism (the replay: the
    lowest node index, the lowest GPU).

    A node's arrays and FGD statistics are kept for its latest state (by version), and so
    is each evaluation (one call ranks every GPU of the node for a share), so scanning a
    node's options costs one evaluation, and the memo is bounded by the nodes.
    """

    def __init__(self, workload: Iterable[PodRequest],
                 weights: GpupackWeights | None = None, keep_whole_nodes: bool = False,
                 nodes: Sequence[NodeInfo] = ()) -> None:
        # Whether whole nodes are kept for LLM groups (:func:`keeps_whole_nodes`): the
        # key's first term for whole-GPU pods, else always 0.
        self.keep_whole_nodes = keep_whole_nodes
        self.ids = ScoreModels.of(workload)
        self.models = self.ids.models
        self.shapes: TypicalShapes = self.ids.table()
        # The workload's rules, as the replay builds them (WorkloadRules.of: the FGD
        # level goes on cpu-bound workloads, and with it the core-deficit price; where
        # whole nodes are kept for groups, the fresh-GPU rule's clean-node form is off;
        # the rare-shape price over every shape and the nodes' capacity, none given: off).
        self.rules = WorkloadRules.of(
            self.shapes, weights, keep_whole_nodes=keep_whole_nodes,
            all_shapes=self.ids.table(coverage=1.0) if nodes else None,
            nodes=self.ids.capacity(nodes) if nodes else None)
        # MIG pods are ranked without the sum-of-squares price: its histogram counts the
        # GPUs that take time-sliced shares, and a MIG GPU's free milli is not one of them.
        self._mig_rules = replace(self.rules, squares=None)
        # MilliRequest.model_ok: the score never reads it (the verbs filter by model).
        self._any_model = np.ones(len(self.ids.ids), dtype=bool)
        # Per node name, its latest state only: (version, arrays, rank values by request,
        # one per GPU for a share). Bounded by the nodes (~1.5 kB each), never by how
        # many states they went through.
        self._nodes: dict[str, tuple[int, NodeArrays, dict[tuple[int, int, int, int, bool],
                                                          FloatArray]]] = {}

    def at_free_sizes(self, counts: IntArray, gpus: int) -> GpupackScorer:
        """This scorer with the sum-of-squares price holding the cluster's histogram of
        free sizes (:meth:`WorkloadRules.at_free_sizes`) and an empty memo: a new scorer
        generation for the verbs."""
        other = copy.copy(self)
        other.rules = self.rules.at_free_sizes(counts, gpus)
        other._nodes = {}
        return other

    def free_sizes_due(self, counts: IntArray, gpus: int) -> bool:
        """Whether the cluster's histogram ``counts`` has drifted from the held one
        enough to replace it (:meth:`WorkloadRules.free_sizes_due`)."""
        return self.rules.free_sizes_due(counts, gpus)

    def _entry(self, node: NodeState) -> tuple[
            int, NodeArrays, dict[tuple[int, int, int, int, bool], FloatArray]]:
        found = self._nodes.get(node.info.name)
        if found is None or found[0] != node.version:
            free = np.array([node_gpu_free(node)], dtype=np.int64)
            model = node.gpus[0].info.model if node.gpus else OTHER_MODEL
            mid = np.array([self.ids.id_of(model, served_kinds(node))], dtype=np.int64)
            cpu = np.array([node.cpu_free], dtype=np.int64)
            mem = np.array([node.mem_free], dtype=np.int64)
            arrays = NodeArrays(free, cpu, mem, mid,
                                fragment_stats(free, cpu, mem, mid, self.shapes),
                                np.array([[g.free_milli for g in node.gpus]], dtype=np.int64))
            found = self._nodes[node.info.name] = (node.version, arrays, {})
        return found

    def arrays(self, node: NodeState) -> NodeArrays:
        return self._entry(node)[1]

    def request(self, state: ClusterState, pod: PodRequest, option: Placement) -> MilliRequest:
        """The pod as the score counts it on this option's node."""
        any_model = self._any_model
        if pod.kind is RequestKind.WHOLE:
            return MilliRequest(pod.cpu_milli, pod.memory_mib, pod.gpu_count, GPU_MILLI,
                                any_model)
        if pod.kind is RequestKind.SHARED:
            g = state.gpu(option.node, option.gpus[0])
            return MilliRequest(pod.cpu_milli, pod.memory_mib, 1,
                                _share_milli(pod, g.info.memory_mib), any_model)
        if pod.kind is RequestKind.MIG:
            take = max(1, min(GPU_MILLI - 1, pod_milli_on(state, pod, option)))
            return MilliRequest(pod.cpu_milli, pod.memory_mib, 1, take, any_model)
        return MilliRequest(pod.cpu_milli, pod.memory_mib, 0, 0, any_model)

    def rank(self, state: ClusterState, pod: PodRequest, option: Placement,
             req: MilliRequest | None = None) -> float:
        """The option's rank value (higher is better; -inf where it does not fit);
        ``req``: :meth:`request` of the option, when the caller has it already."""
        node = state.nodes[option.node]
        if req is None:
            req = self.request(state, pod, option)
        _, arrays, evals = self._entry(node)
        mig = pod.kind is RequestKind.MIG
        key = (req.cpu, req.mem, req.num_gpu, req.milli, mig)
        found = evals.get(key)
        if found is None:
            found = ranks(arrays, req, self._mig_rules if mig else self.rules)[0]
            if len(evals) >= EVALS_PER_NODE:
                evals.clear()
            evals[key] = found
        if not req.shared:
            return float(found)
        pos = next(i for i, g in enumerate(node.gpus) if g.info.index == option.gpus[0])
        return float(found[pos])

    def __call__(self, state: ClusterState, pod: PodRequest, option: Placement) -> Score:
        req = self.request(state, pod, option)
        rank = self.rank(state, pod, option, req)
        left = int(node_free_after(self.arrays(state.nodes[option.node]).free, req)[0])
        tail = (left, option.node, option.gpus, option.mig_start or 0)
        if pod.kind is RequestKind.MIG:
            return (*mig_preference(state, pod, option), -rank, *tail)
        opens = False
        if self.keep_whole_nodes:
            node = state.nodes[option.node]
            opens = bool(opens_whole_node(sum(1 for g in node.gpus if g.whole_free),
                                          len(node.gpus), req))
        return (int(opens), -rank, *tail)


def objective_key(snapshot: Snapshot, placements: Sequence[Placement]) -> tuple[int, ...]:
    """Higher is better: (weighted pods placed, whole nodes free, whole GPUs free,
    existing MIG instances reused, -nodes touched). Same order as the CP-SAT objective."""
    state = ClusterState(snapshot)
    pods = {p.key: p for p in snapshot.pending}
    weights = priority_weights(snapshot.pending)
    touched = set()
    reused = 0
    for p in placements:
        state.apply(pods[p.pod], p, allow_overcommit=True)
        touched.add(p.node)
        if p.mig_profile is not None and not p.mig_created:
            reused += 1
    return (
        sum(weights[p.pod] for p in placements),
        state.whole_nodes_free(),
        state.whole_gpus_free(),
        reused,
        -len(touched),
    )


def make_gpupack_scorer(snapshot: Snapshot) -> Scorer:
    """The extender's scorer for the workload of ``snapshot`` (its running and pending
    pods), whether its nodes are kept whole for groups (:func:`keeps_whole_nodes`) and
    its nodes' capacity (the rare-shape price)."""
    return GpupackScorer(workload_of(snapshot), keep_whole_nodes=keeps_whole_nodes(snapshot),
                         nodes=snapshot.nodes)


class GpupackPolicy:
    name = "gpupack"

    def __init__(self, params: SolverParams | None = None) -> None:
        self.params = params or SolverParams()
        self.last_status = "greedy"

    def make_scorer(self, snapshot: Snapshot) -> Scorer:
        return make_gpupack_scorer(snapshot)

    def plan(self, snapshot: Snapshot) -> PlanResult:
        running = [p for p, _ in snapshot.running]
        candidates: list[tuple[str, list[Placement], list[Unschedulable]]] = []
        for label, scorer in (("greedy", self.make_scorer(snapshot)), ("greedy-bestfit", bestfit)):
            placements, failed = greedy(ClusterState(snapshot), snapshot.pending, scorer, running)
            candidates.append((label, placements, failed))
        best_greedy = max(candidates, key=lambda c: objective_key(snapshot, c[1]))
        status = "greedy"
        if snapshot.pending:
            state = ClusterState(snapshot)
            taken = frozenset(exclusive_domains_in_use(state, running))
            solved = solve_batch(state, snapshot.pending, best_greedy[1], self.params, taken)
            status = solved.status
            if solved.placements and not validate(snapshot, solved.placements, check_running=False):
                placed = {p.pod for p in solved.placements}
                # Reasons for the pods CP-SAT left out come from the greedy pass.
                reasons = {u.pod: u.reason for _, _, f in candidates for u in f}
                failed = [
                    Unschedulable(p.key, reasons.get(p.key, "no room in the batch solution"))
                    for p in snapshot.pending
                    if p.key not in placed
                ]
                candidates.insert(0, (f"cpsat-{solved.status}", list(solved.placements), failed))
            elif solved.placements:
                status = f"{solved.status}-invalid"
        keys = [objective_key(snapshot, c[1]) for c in candidates]
        tied = [c for c, k in zip(candidates, keys, strict=True) if k == max(keys)]
        # On a tie of the objective key the scorer's greedy answer wins: the solver's
        # objective has the same terms and no preference among equal answers (its search
        # takes the first node that fits), while the scorer ranks them by the policy (FGD
        # level, capacity lookahead, the workload's rules and prices), as the openb
        # replay does. Before, the solver's answer won ties, and a one-GPU pod went to the
        # first node rather than the one the policy ranks first.
        # (Where the two answers are the same, the solver's: its status says it is optimal.)
        label, placements, failed = tied[0]
        scored = next((c for c in tied if c[0] == "greedy"), None)
        if scored is not None and set(scored[1]) != set(placements):
            label, placements, failed = scored
        if label == "greedy" and tied[0][0].startswith("cpsat"):
            status = f"{status}/tie-greedy"
        elif not label.startswith("cpsat"):
            status = f"{status}/fallback-{label}" if status != "greedy" else label
        self.last_status = status
        return checked(
            snapshot, PlanResult(tuple(placements), tuple(failed), self.name, solver_status=status)
        )
