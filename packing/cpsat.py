"""CP-SAT model for placing a batch of pending pods at once.

Data: a :class:`ClusterState` (running pods applied) and the pending pods of the batch.

Variables (all Boolean):
  x[p, o]   pod p takes option o (a MIG instance, a GPU share, or CPU only on a node)
  w[p][n]   whole-GPU pod p goes to node n (which idle GPUs it gets is read off after)
  s[g]      whole-free GPU g receives a small pod of the batch
  u[g]      whole-free GPU g is used by the batch (it stops being a whole free GPU)
  z[n]      node n, whole-free now, is used by the batch (it stops being a whole free node)
  t[n]      node n receives at least one pod of the batch
  d[G, D]   group G is placed in topology domain D

Constraints:
  each pod at most once; the members of a group all placed or none, in one domain;
  CPU and memory of each node; GPU share milli, memory and replicas of each shared GPU;
  each existing MIG instance to at most one pod; created MIG instances on memory slices
  that are free and not overlapping each other, within the GPU's compute slices, at
  most one ``+me``; whole-GPU pods on a node use at most its idle whole-capable GPUs not
  taken by small pods; an exclusive topology domain holds at most one group.

Objective (lexicographic through weights that cannot overflow into each other, since
every term below is bounded by the batch and its variables; see _objective):
  maximize  A * sum_p weight_p * placed_p      (more pods; then higher priority)
          - B * sum z[n]                        (keep whole nodes free)
          - C * sum u[g]                        (keep whole GPUs free)
          - D * MIG instances created           (prefer existing, exact-profile slices)
          - E * sum t[n]                        (fewest nodes touched)

Past 600 lines as one model: its variables, constraints and objective are written out
above and built in the sections below in the same order; split, the objective would sit
apart from the variables it weighs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ortools.sat.python import cp_model
# OR-Tools (with numpy and pandas, ~75 MiB per process) is imported where a model is
# built or solved, not with this module: the warm child and the webhook read
# SolverParams and the batch weights without ever solving.

from packing.catalog import get_model
from packing.mig.layout import MigSlot, memory_range
from packing.model import GpuMode, Placement, PodRequest, RequestKind
from packing.state import ClusterState, GpuState

# Models with more variables than this are solved without symmetry detection and probing.
SYMMETRY_LIMIT = 10_000
# The most the objective's positive (or negative) coefficients may sum to over its
# Boolean variables: CP-SAT's model checker refuses more (int64 max / 2, "possible
# integer overflow"), and the batch then gets the greedy answer (see _objective).
OBJECTIVE_LIMIT = (2**63 - 1) // 2
# solve_batch's statuses for a model it does not build (the greedy answer is kept).
TOO_LARGE = "TOO_LARGE"  # more than SolverParams.max_variables variables
OBJECTIVE_TOO_LARGE = "TOO_LARGE-objective"  # the weights would pass OBJECTIVE_LIMIT


@dataclass(frozen=True)
class SolverParams:
    """Explicit solver settings: every solve is bounded and reproducible."""

    max_time_s: float = 2.0  # the deterministic-time budget (see solve_batch)
    workers: int = 2
    seed: int = 0
    max_variables: int = 200_000  # beyond this the model is not built; greedy answers
    # Wall-clock cap. None: 3 x max_time_s, a safety net that keeps results reproducible
    # on a slow machine (simulate, benchmarks). The extender's planner sets it to
    # max_time_s: there a bounded solve matters more than the same answer everywhere.
    max_wall_s: float | None = None

    def solver(self) -> cp_model.CpSolver:
        """A CP-SAT solver with these settings.

        Reproducible for a fixed seed: interleaved search runs the workers' strategies in
        lockstep and the deterministic-time budget ends it at the same point on any
        machine. The wall-clock limit is by default only a safety net (3x) for a slow or
        loaded machine; see ``max_wall_s``."""
        from ortools.sat.python import cp_model

        solver = cp_model.CpSolver()
        solver.parameters.max_deterministic_time = self.max_time_s
        solver.parameters.max_time_in_seconds = (
            3 * self.max_time_s if self.max_wall_s is None else self.max_wall_s)
        solver.parameters.num_workers = self.workers
        solver.parameters.random_seed = self.seed
        solver.parameters.interleave_search = self.workers > 1
        return solver


@dataclass(frozen=True)
class SolveResult:
    placements: tuple[Placement, ...]
    # OPTIMAL | FEASIBLE | INFEASIBLE | UNKNOWN | MODEL_INVALID | TOO_LARGE[-objective]
    status: str
    objective: float | None = None
    wall_s: float = 0.0


def priority_weights(pods: Sequence[PodRequest]) -> dict[str, int]:
    """weight_p = M + rank(priority_p), M = |pods| * |ranks| + 1.

    Any extra pod placed is worth more than every priority difference together, so the
    model places the most pods first and, among equal counts, prefers higher priority.
    """
    ranks = {prio: i for i, prio in enumerate(sorted({p.priority for p in pods}))}
    big = len(pods) * max(len(ranks), 1) + 1
    return {p.key: big + ranks[p.priority] for p in pods}


@dataclass(frozen=True)
class BatchModel:
    """A built batch model and what reading its solution needs."""

    model: cp_model.CpModel
    x: Mapping[tuple[str, int], cp_model.IntVar]  # (small pod, option index) -> var
    options: Mapping[str, list[Placement]]  # small pod -> its options, by index
    w: Mapping[str, Mapping[str, cp_model.IntVar]]  # whole pod -> node -> var
    pods: Mapping[str, PodRequest]
    # node -> the GPUs the plugin hands its next shares to, in order
    sequences: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass
class _Batch:
    """The model under construction: the data, then each section's variables."""

    # data
    state: ClusterState
    pods: Sequence[PodRequest]
    pods_by_key: dict[str, PodRequest]
    sequences: dict[str, tuple[int, ...]]
    model: cp_model.CpModel
    # variables of the placements
    x: dict[tuple[str, int], cp_model.IntVar] = field(default_factory=dict)
    options: dict[str, list[Placement]] = field(default_factory=dict)
    w: dict[str, dict[str, cp_model.IntVar]] = field(default_factory=dict)
    # what each pod, node and GPU is offered (filled by _per_pod)
    placed: dict[str, cp_model.LinearExprT] = field(default_factory=dict)
    on_node: dict[str, list[tuple[PodRequest, cp_model.IntVar]]] = field(
        default_factory=lambda: defaultdict(list))
    on_gpu: dict[tuple[str, int], list[tuple[PodRequest, Placement, cp_model.IntVar]]] = (
        field(default_factory=lambda: defaultdict(list)))
    # indicator variables of the sections below
    small: dict[tuple[str, int], cp_model.IntVar] = field(default_factory=dict)  # s[g]
    u: dict[tuple[str, int], cp_model.IntVar] = field(default_factory=dict)  # u[g]
    created: list[cp_model.IntVar] = field(default_factory=list)  # MIG instances created
    taken_k: dict[tuple[str, int], cp_model.IntVar] = field(default_factory=dict)  # k[n, j]
    groups: dict[str, list[PodRequest]] = field(default_factory=lambda: defaultdict(list))
    domains: dict[str, dict[str, cp_model.IntVar]] = field(default_factory=dict)  # d[G, D]
    t: dict[str, cp_model.IntVar] = field(default_factory=dict)  # t[n]


def build_batch_model(
    state: ClusterState,
    pods: Sequence[PodRequest],
    hint: Sequence[Placement] = (),
    params: SolverParams = SolverParams(),
    taken_domains: frozenset[tuple[str, str]] = frozenset(),
) -> BatchModel | None:
    """The CP-SAT model of the batch on ``state``, every variable hinted from ``hint``;
    None when it would have more than ``params.max_variables`` variables or its objective
    more than CP-SAT's integers hold (:func:`_objective`). The sections
    (module docstring) in order: data, placement variables, each pod at most once, node
    CPU and memory, GPUs, the device plugin's share order, whole GPUs, groups and
    topology, objective, hint."""
    built = _build(state, pods, hint, params, taken_domains)
    return None if isinstance(built, str) else built


def _build(
    state: ClusterState,
    pods: Sequence[PodRequest],
    hint: Sequence[Placement],
    params: SolverParams,
    taken_domains: frozenset[tuple[str, str]],
) -> BatchModel | str:
    """:func:`build_batch_model`, or the status saying why no model is built
    (:data:`TOO_LARGE`, :data:`OBJECTIVE_TOO_LARGE`)."""
    from ortools.sat.python import cp_model

    b = _data(state, pods, cp_model.CpModel())
    if not _placement_variables(b, params):
        return TOO_LARGE
    _per_pod(b)
    _node_capacity(b)
    _gpus(b)
    _plugin_order(b)
    _whole_gpus(b)
    _groups(b, taken_domains)
    if not _objective(b):
        return OBJECTIVE_TOO_LARGE
    _hint(b, hint)
    return BatchModel(b.model, b.x, b.options, b.w, b.pods_by_key, b.sequences)


def _data(state: ClusterState, pods: Sequence[PodRequest], model: cp_model.CpModel) -> _Batch:
    # Time-sliced GPUs: the device plugin, not gpupack, picks the GPU of each share, by
    # replica counts. However the batch's shares are bound, the k-th new share of a node
    # lands on the k-th GPU of the node's plugin sequence; so a node taking k shares has
    # exactly the first k of its sequence, and each pod may be on any GPU of it.
    n_shares = sum(1 for p in pods if p.kind is RequestKind.SHARED)
    sequences = {name: seq for name in state.nodes
                 if n_shares and (seq := state.share_sequence(name, n_shares))}
    return _Batch(state, pods, {p.key: p for p in pods}, sequences, model)


def _placement_variables(b: _Batch, params: SolverParams) -> bool:
    """x[p, o] for each option of a small pod, w[p][n] for each node a whole-GPU pod fits;
    False when there would be more than ``params.max_variables``."""
    state, model = b.state, b.model
    n_vars = 0
    for pod in b.pods:
        if pod.kind is RequestKind.WHOLE:
            row = b.w[pod.key] = {}
            for name in state.nodes:
                if state.options(pod, name):
                    row[name] = model.new_bool_var(f"w[{pod.key},{name}]")
            n_vars += len(row)
        else:
            if pod.kind is RequestKind.SHARED:
                opts = [o for name in state.nodes for o in (
                    *state.share_options(pod, name, b.sequences.get(name, ())),
                    *(o for o in state.options(pod, name)
                      if state.gpu(name, o.gpus[0]).mode is GpuMode.FRACTIONAL))]
            else:
                opts = [o for name in state.nodes for o in state.options(pod, name)]
            b.options[pod.key] = opts
            for i, _ in enumerate(opts):
                b.x[pod.key, i] = model.new_bool_var(f"x[{pod.key},{i}]")
            n_vars += len(opts)
        # Checked after every pod, whole-GPU ones included (a batch of whole-GPU pods
        # alone once built a model of any size).
        if n_vars > params.max_variables:
            return False
    return True


def _per_pod(b: _Batch) -> None:
    """Each pod at most once; what each node and GPU is offered."""
    for pod in b.pods:
        if pod.kind is RequestKind.WHOLE:
            vars_ = list(b.w[pod.key].values())
            for n, v in b.w[pod.key].items():
                b.on_node[n].append((pod, v))
        else:
            vars_ = []
            for i, o in enumerate(b.options[pod.key]):
                v = b.x[pod.key, i]
                vars_.append(v)
                b.on_node[o.node].append((pod, v))
                if o.gpus:
                    b.on_gpu[o.node, o.gpus[0]].append((pod, o, v))
        b.model.add(sum(vars_) <= 1)
        b.placed[pod.key] = sum(vars_)


def _node_capacity(b: _Batch) -> None:
    """CPU and memory of each node."""
    for name, items in b.on_node.items():
        node = b.state.nodes[name]
        b.model.add(sum(p.cpu_milli * v for p, v in items) <= node.cpu_free)
        b.model.add(sum(p.memory_mib * v for p, v in items) <= node.mem_free)


def _gpus(b: _Batch) -> None:
    """s[g], u[g] on whole-free GPUs; MIG instances and slices; share milli, memory and
    replicas."""
    model = b.model
    for (name, index), gpu_items in b.on_gpu.items():
        g = b.state.gpu(name, index)
        if g.whole_free:
            # s[g] == 1 exactly when a small pod of the batch lands on this GPU.
            used = model.new_bool_var(f"s[{name},{index}]")
            for _, _, v in gpu_items:
                model.add_implication(v, used)
            model.add(used <= sum(v for _, _, v in gpu_items))
            b.small[name, index] = used
            b.u[name, index] = model.new_bool_var(f"u[{name},{index}]")
            model.add(b.u[name, index] >= used)
        if g.mode is GpuMode.MIG or any(o.mig_profile for _, o, _ in gpu_items):
            _mig_gpu(b, g, gpu_items)
        else:  # SHARED / FRACTIONAL shares
            model.add(sum(p.gpu_milli * v for p, _, v in gpu_items) <= g.free_milli)
            if g.mode is GpuMode.SHARED:
                free_mem = g.info.memory_mib - g.shared_memory_used
                model.add(sum(p.gpu_memory_mib * v for p, _, v in gpu_items) <= free_mem)
                if g.info.replicas:
                    model.add(
                        sum(v for _, _, v in gpu_items) <= g.info.replicas - len(g.shared_owners)
                    )


def _mig_gpu(b: _Batch, g: GpuState,
             gpu_items: Sequence[tuple[PodRequest, Placement, cp_model.IntVar]]) -> None:
    """Each existing instance to at most one pod; created instances on free memory
    slices that do not overlap, within the compute slices left, at most one ``+me``."""
    model = b.model
    geom = get_model(g.info.model).mig
    assert geom is not None
    by_instance: dict[int, list[cp_model.IntVar]] = defaultdict(list)
    by_slice: dict[int, list[cp_model.IntVar]] = defaultdict(list)
    compute = []
    media = []
    for _, o, v in gpu_items:
        assert o.mig_start is not None and o.mig_profile is not None
        if not o.mig_created:
            by_instance[o.mig_start].append(v)
            continue
        b.created.append(v)
        prof = geom.profile(o.mig_profile)
        for s in memory_range(geom, MigSlot(o.mig_profile, o.mig_start)):
            by_slice[s].append(v)
        compute.append(prof.compute_slices * v)
        if prof.media_extensions:
            media.append(v)
    for vs in by_instance.values():
        model.add(sum(vs) <= 1)
    for vs in by_slice.values():
        model.add(sum(vs) <= 1)
    used_c = sum(geom.profile(p).compute_slices for p, _ in g.instances.values())
    model.add(sum(compute) <= geom.compute_slices - used_c)
    has_me = any(geom.profile(p).media_extensions for p, _ in g.instances.values())
    model.add(sum(media) <= (0 if has_me else 1))


def _plugin_order(b: _Batch) -> None:
    """Shares per time-sliced GPU follow the plugin's sequence: k[n, j] = 1 exactly when
    the node takes j new shares, and then GPU g takes as many as the first j picks hold."""
    model = b.model
    for name, seq in b.sequences.items():
        b.taken_k.update({(name, j): model.new_bool_var(f"k[{name},{j}]")
                          for j in range(len(seq) + 1)})
        model.add(sum(b.taken_k[name, j] for j in range(len(seq) + 1)) == 1)
        for index in set(seq):
            landing = b.on_gpu.get((name, index), [])
            model.add(sum(v for _, _, v in landing)
                      == sum(seq[:j].count(index) * b.taken_k[name, j]
                             for j in range(len(seq) + 1)))


def _whole_gpus(b: _Batch) -> None:
    """Whole-GPU pods take idle whole-capable GPUs that small pods of the batch leave:
      sum_p k_p w[p][n] + sum_g s[g] <= |capable|, and the GPUs counted as used,
      sum_g u[g] >= sum_p k_p w[p][n] + sum_g s[g], so whole GPUs free stay exact."""
    model = b.model
    for name in b.state.nodes:
        wholes = [(p, v) for p, v in b.on_node.get(name, []) if p.kind is RequestKind.WHOLE]
        if not wholes:
            continue
        node = b.state.nodes[name]
        capable = [g for g in node.gpus if g.whole_free]
        demand = sum(p.gpu_count * v for p, v in wholes)
        taken = [b.small[name, g.info.index] for g in capable if (name, g.info.index) in b.small]
        model.add(demand + sum(taken) <= len(capable))
        for g in capable:
            if (name, g.info.index) not in b.u:
                b.u[name, g.info.index] = model.new_bool_var(f"u[{name},{g.info.index}]")
        model.add(sum(b.u[name, g.info.index] for g in capable) >= demand + sum(taken))


def _groups(b: _Batch, taken_domains: frozenset[tuple[str, str]]) -> None:
    """The members of a group all placed or none, in one domain d[G, D]; an exclusive
    domain holds at most one group (none when one already runs there)."""
    model = b.model
    for pod in b.pods:
        if pod.group is not None:
            b.groups[pod.group.key].append(pod)
    domain_use: dict[tuple[str, str], list[cp_model.IntVar]] = defaultdict(list)
    for key, members in b.groups.items():
        first = b.placed[members[0].key]
        for m in members[1:]:
            model.add(b.placed[m.key] == first)  # all or nothing
        ref = members[0].group
        assert ref is not None
        if ref.topology_key is None:
            continue
        by_domain: dict[str, list[str]] = defaultdict(list)
        for name, node in b.state.nodes.items():
            value = node.info.labels.get(ref.topology_key)
            if value is not None:
                by_domain[value].append(name)
        d = {dom: model.new_bool_var(f"d[{key},{dom}]") for dom in by_domain}
        b.domains[key] = d
        model.add(sum(d.values()) == first)
        for dom, var in d.items():
            if ref.exclusive:
                domain_use[ref.exclusive_key, dom].append(var)
        node_domain = {n: dom for dom, ns in by_domain.items() for n in ns}
        for m in members:
            for n, v in b.w.get(m.key, {}).items():
                _in_domain(model, v, d, node_domain.get(n))
            for i, o in enumerate(b.options.get(m.key, [])):
                _in_domain(model, b.x[m.key, i], d, node_domain.get(o.node))
    for (tk, dom), vs in domain_use.items():
        model.add(sum(vs) <= (0 if (tk, dom) in taken_domains else 1))


def _objective(b: _Batch) -> bool:
    """The lexicographic objective of the module docstring (t[n]; z[n] is t[n] on
    nodes whole-free now); False, and no objective set, when its coefficients could
    pass the integers CP-SAT accepts (:data:`OBJECTIVE_LIMIT`).

    Each weight is one more than the most the terms below it can sum to, so one unit of
    a term outweighs every term below it. At the optimum the indicators are as small as
    the placements allow, so each term is bounded by the batch and by its variables:
      sum t[n] <= T = min(pods, |t|),  MIG instances created <= K = min(pods, |created|),
      sum u[g] <= U = min(GPUs the batch asks, |u|),  sum z[n] <= Z = min(pods, |z|);
    E = 1, D = E (T + 1), C = D (K + 1), B = C (U + 1), A = B (Z + 1), and then
    B Z + C U + D K + E T = A - 1 < A. (Bounding each term by the batch size alone gave
    A ~ pods^3 * GPUs: ~8e12 at 1,000 8-GPU pods, and with priority weights ~5e3 the
    objective passed int64, MODEL_INVALID, however few nodes the batch could use.)"""
    from ortools.sat.python import cp_model

    model = b.model
    z: dict[str, cp_model.IntVar] = {}
    for name, items in b.on_node.items():
        b.t[name] = model.new_bool_var(f"t[{name}]")
        for _, v in items:
            model.add_implication(v, b.t[name])
        if b.state.nodes[name].whole_free:
            z[name] = b.t[name]
    weights = priority_weights(b.pods)
    n_pods = len(b.pods)
    n_gpu = sum(p.gpu_count if p.kind is RequestKind.WHOLE else 1 for p in b.pods)
    e_w = 1
    d_w = e_w * (min(n_pods, len(b.t)) + 1)
    c_w = d_w * (min(n_pods, len(b.created)) + 1)
    b_w = c_w * (min(n_gpu, len(b.u)) + 1)
    a_w = b_w * (min(n_pods, len(z)) + 1)
    # CP-SAT refuses an objective whose positive or negative coefficients, summed over
    # its Boolean variables, could pass int64 max / 2 (MODEL_INVALID): a pod's weight
    # stands on each of its placement variables.
    n_vars = {k: len(b.w[k]) if k in b.w else len(b.options[k]) for k in b.placed}
    gain = a_w * sum(weights[k] * n for k, n in n_vars.items())
    cost = b_w * len(z) + c_w * len(b.u) + d_w * len(b.created) + e_w * len(b.t)
    if max(gain, cost) > OBJECTIVE_LIMIT:
        return False
    LE = cp_model.LinearExpr
    model.maximize(
        a_w * LE.weighted_sum(list(b.placed.values()), [weights[k] for k in b.placed])
        - b_w * LE.sum(list(z.values()))
        - c_w * LE.sum(list(b.u.values()))
        - d_w * LE.sum(b.created)
        - e_w * LE.sum(list(b.t.values()))
    )
    return True


def _hint(b: _Batch, hint: Sequence[Placement]) -> None:
    """Every variable hinted from the greedy answer (the placement ones and the s/u/t/k/d
    indicators they imply): CP-SAT takes a complete, feasible hint as its first solution,
    so even a solve that spends its budget in presolve answers FEASIBLE, as good as the
    hint."""
    model, state = b.model, b.state
    hinted = {h.pod: h for h in hint}
    hinted_on: list[cp_model.IntVar] = []  # the placement variables the hint sets to 1
    for pod in b.pods:
        h = hinted.get(pod.key)
        if pod.kind is RequestKind.WHOLE:
            for n, v in b.w[pod.key].items():
                on = h is not None and h.node == n
                model.add_hint(v, 1 if on else 0)
                if on:
                    hinted_on.append(v)
        else:
            for i, o in enumerate(b.options[pod.key]):
                model.add_hint(b.x[pod.key, i], 1 if h == o else 0)
                if h == o:
                    hinted_on.append(b.x[pod.key, i])
    _hint_indicators(b, hinted_on)
    for name, seq in b.sequences.items():
        n_hinted = sum(1 for h in hint if h.node == name and h.gpus and h.pod in b.pods_by_key
                       and b.pods_by_key[h.pod].kind is RequestKind.SHARED
                       and state.gpu(name, h.gpus[0]).mode is GpuMode.SHARED)
        for j in range(len(seq) + 1):
            model.add_hint(b.taken_k[name, j], 1 if j == n_hinted else 0)
    for key, members in b.groups.items():
        ref = members[0].group
        if ref is None or ref.topology_key is None:
            continue
        h = hinted.get(members[0].key)
        at = None if h is None else state.nodes[h.node].info.labels.get(ref.topology_key)
        for value, var in b.domains[key].items():
            model.add_hint(var, 1 if value == at else 0)


def solve_batch(
    state: ClusterState,
    pods: Sequence[PodRequest],
    hint: Sequence[Placement] = (),
    params: SolverParams = SolverParams(),
    taken_domains: frozenset[tuple[str, str]] = frozenset(),
) -> SolveResult:
    """Solve the batch on ``state`` (not mutated). Placements are not yet validated."""
    from ortools.sat.python import cp_model

    built = _build(state, pods, hint, params, taken_domains)
    if isinstance(built, str):
        return SolveResult((), built)  # not solved, and the status says why
    model, x, options, w, pods_by_key = (
        built.model, built.x, built.options, built.w, built.pods)
    # ---- solve --------------------------------------------------------------------------
    solver = params.solver()
    if len(model.proto.variables) > SYMMETRY_LIMIT:
        # On large batches CP-SAT's presolve eats the whole budget and search never
        # starts (a 64-pod batch over 1,000 candidate nodes, 22,400 variables): symmetry
        # detection alone ran 7.5 s of wall past a 2 s limit, and without it probing still
        # took 1.0 of the 2.0 deterministic seconds and ended the solve UNKNOWN ("stopped
        # after presolve"). Without both and with one presolve pass (of three), the
        # complete hint is the first solution at ~0.6 s and search closes the gap to the
        # bound to ~1e-6 of the objective.
        solver.parameters.symmetry_level = 0
        solver.parameters.cp_model_probing_level = 0
        solver.parameters.max_presolve_iterations = 1
    status = solver.solve(model)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SolveResult((), name, None, solver.wall_time)

    # ---- read ---------------------------------------------------------------------------
    out: list[Placement] = []
    taken_by_small: dict[str, set[int]] = defaultdict(set)
    for key, opts in options.items():
        for i, o in enumerate(opts):
            if solver.boolean_value(x[key, i]):
                out.append(o)
                if o.gpus:
                    taken_by_small[o.node].add(o.gpus[0])
    out = in_plugin_order(out, built.sequences)
    given: dict[str, set[int]] = defaultdict(set)
    for key, n, v in sorted((k, n, v) for k, row in w.items() for n, v in row.items()):
        if not solver.boolean_value(v):
            continue
        pod = pods_by_key[key]
        free = [
            g.info.index
            for g in state.nodes[n].gpus
            if g.idle
            and g.mode in (GpuMode.WHOLE, GpuMode.FRACTIONAL)
            and (not pod.gpu_models or g.info.model in pod.gpu_models)
            and g.info.index not in taken_by_small[n]
            and g.info.index not in given[n]
        ]
        chosen = tuple(free[: pod.gpu_count])
        given[n].update(chosen)
        out.append(Placement(key, n, chosen))
    return SolveResult(tuple(out), name, solver.objective_value, solver.wall_time)


def in_plugin_order(placements: Sequence[Placement],
                    sequences: Mapping[str, tuple[int, ...]]) -> list[Placement]:
    """``placements`` with each node's time-sliced shares in the order the device plugin
    fills its GPUs (``sequences``): replayed one at a time, each share is then on the
    GPU the plugin would hand it. The rest keep their order, first."""
    out: list[Placement] = []
    shares: dict[str, dict[int, list[Placement]]] = defaultdict(lambda: defaultdict(list))
    for p in placements:
        if p.node in sequences and p.gpus and p.gpus[0] in sequences[p.node] \
                and p.mig_profile is None:
            shares[p.node][p.gpus[0]].append(p)
        else:
            out.append(p)
    for name, by_gpu in shares.items():
        for index in sequences[name]:
            if by_gpu[index]:
                out.append(by_gpu[index].pop(0))
        out.extend(p for rest in by_gpu.values() for p in rest)  # not expected
    return out


def _hint_indicators(b: _Batch, chosen: Sequence[cp_model.IntVar]) -> None:
    """Hint s, u and t as the hinted placement variables ``chosen`` imply them: s[g] = 1
    where a hinted small pod lands, u[g] = 1 on those GPUs and on as many other idle
    capable GPUs as the node's hinted whole pods take, t[n] = 1 where any hinted pod is."""
    model = b.model
    on = {v.index for v in chosen}
    for name, items in b.on_node.items():
        model.add_hint(b.t[name], 1 if any(v.index in on for _, v in items) else 0)
    for key, var in b.small.items():
        model.add_hint(var, 1 if any(v.index in on for _, _, v in b.on_gpu[key]) else 0)
    demand: dict[str, int] = defaultdict(int)
    for pod, row in b.w.items():
        for n, v in row.items():
            if v.index in on:
                demand[n] += b.pods_by_key[pod].gpu_count
    for name in sorted({n for n, _ in b.u}):  # sorted: the same model in every process
        need = demand.get(name, 0)
        for g in b.state.nodes[name].gpus:
            key = (name, g.info.index)
            if key not in b.u:
                continue
            used = key in b.small and any(v.index in on for _, _, v in b.on_gpu[key])
            if not used and need > 0:
                used, need = True, need - 1
            model.add_hint(b.u[key], 1 if used else 0)


def _in_domain(
    model: cp_model.CpModel,
    v: cp_model.IntVar,
    d: dict[str, cp_model.IntVar],
    domain: str | None,
) -> None:
    """An option may be used only when its node's domain is the group's domain."""
    if domain is None:
        model.add(v == 0)
    else:
        model.add_implication(v, d[domain])
