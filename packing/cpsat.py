"""CP-SAT model for placing a batch of pending pods at once.

Data: a :class:`ClusterState` (running pods applied) and the pending pods of the batch.

Variables (all Boolean):
  x[p, o]   pod p takes option o (a MIG instance, a GPU share, or CPU only on a node)
  w[p, n]   whole-GPU pod p goes to node n (which idle GPUs it gets is read off after)
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
every term below is bounded by the batch size):
  maximize  A * sum_p weight_p * placed_p      (more pods; then higher priority)
          - B * sum z[n]                        (keep whole nodes free)
          - C * sum u[g]                        (keep whole GPUs free)
          - D * MIG instances created           (prefer existing, exact-profile slices)
          - E * sum t[n]                        (fewest nodes touched)
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
from packing.mig import MigSlot, memory_range
from packing.model import GpuMode, Placement, PodRequest, RequestKind
from packing.state import ClusterState

# Models with more variables than this are solved without symmetry detection and probing.
SYMMETRY_LIMIT = 10_000


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
    status: str  # OPTIMAL | FEASIBLE | INFEASIBLE | UNKNOWN | MODEL_INVALID | TOO_LARGE
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
    w: Mapping[tuple[str, str], cp_model.IntVar]  # (whole pod, node) -> var
    pods: Mapping[str, PodRequest]
    # node -> the GPUs the plugin hands its next shares to, in order
    sequences: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


def build_batch_model(
    state: ClusterState,
    pods: Sequence[PodRequest],
    hint: Sequence[Placement] = (),
    params: SolverParams = SolverParams(),
    taken_domains: frozenset[tuple[str, str]] = frozenset(),
) -> BatchModel | None:
    """The CP-SAT model of the batch on ``state``, every variable hinted from ``hint``;
    None when it would have more than ``params.max_variables`` variables."""
    # ---- data --------------------------------------------------------------------------
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    x: dict[tuple[str, int], cp_model.IntVar] = {}  # (pod, option index) -> var
    options: dict[str, list[Placement]] = {}
    w: dict[tuple[str, str], cp_model.IntVar] = {}  # (whole pod, node) -> var
    pods_by_key = {p.key: p for p in pods}
    n_vars = 0
    # Time-sliced GPUs: the device plugin, not gpupack, picks the GPU of each share, by
    # replica counts. However the batch's shares are bound, the k-th new share of a node
    # lands on the k-th GPU of the node's plugin sequence; so a node taking k shares has
    # exactly the first k of its sequence, and each pod may be on any GPU of it.
    n_shares = sum(1 for p in pods if p.kind is RequestKind.SHARED)
    sequences = {name: seq for name in state.nodes
                 if n_shares and (seq := state.share_sequence(name, n_shares))}
    for pod in pods:
        if pod.kind is RequestKind.WHOLE:
            for name in state.nodes:
                if state.options(pod, name):
                    w[pod.key, name] = model.new_bool_var(f"w[{pod.key},{name}]")
                    n_vars += 1
            continue
        if pod.kind is RequestKind.SHARED:
            opts = [o for name in state.nodes for o in (
                *state.share_options(pod, name, sequences.get(name, ())),
                *(o for o in state.options(pod, name)
                  if state.gpu(name, o.gpus[0]).mode is GpuMode.FRACTIONAL))]
        else:
            opts = [o for name in state.nodes for o in state.options(pod, name)]
        options[pod.key] = opts
        for i, _ in enumerate(opts):
            x[pod.key, i] = model.new_bool_var(f"x[{pod.key},{i}]")
        n_vars += len(opts)
        if n_vars > params.max_variables:
            return None

    # ---- variables per pod, node and GPU -----------------------------------------------
    placed: dict[str, cp_model.LinearExprT] = {}
    on_node: dict[str, list[tuple[PodRequest, cp_model.IntVar]]] = defaultdict(list)
    on_gpu: dict[tuple[str, int], list[tuple[PodRequest, Placement, cp_model.IntVar]]] = (
        defaultdict(list)
    )
    for pod in pods:
        if pod.kind is RequestKind.WHOLE:
            vars_ = [v for (k, _), v in w.items() if k == pod.key]
            for (k, n), v in w.items():
                if k == pod.key:
                    on_node[n].append((pod, v))
        else:
            vars_ = []
            for i, o in enumerate(options[pod.key]):
                v = x[pod.key, i]
                vars_.append(v)
                on_node[o.node].append((pod, v))
                if o.gpus:
                    on_gpu[o.node, o.gpus[0]].append((pod, o, v))
        model.add(sum(vars_) <= 1)  # each pod at most once
        placed[pod.key] = sum(vars_)

    # ---- constraints: node CPU and memory ----------------------------------------------
    for name, items in on_node.items():
        node = state.nodes[name]
        model.add(sum(p.cpu_milli * v for p, v in items) <= node.cpu_free)
        model.add(sum(p.memory_mib * v for p, v in items) <= node.mem_free)

    # ---- constraints: GPUs --------------------------------------------------------------
    u: dict[tuple[str, int], cp_model.IntVar] = {}
    small: dict[tuple[str, int], cp_model.IntVar] = {}
    created_terms: list[cp_model.IntVar] = []
    for (name, index), gpu_items in on_gpu.items():
        g = state.gpu(name, index)
        if g.whole_free:
            # s[g] == 1 exactly when a small pod of the batch lands on this GPU.
            used = model.new_bool_var(f"s[{name},{index}]")
            for _, _, v in gpu_items:
                model.add_implication(v, used)
            model.add(used <= sum(v for _, _, v in gpu_items))
            small[name, index] = used
            u[name, index] = model.new_bool_var(f"u[{name},{index}]")
            model.add(u[name, index] >= used)
        if g.mode is GpuMode.MIG or any(o.mig_profile for _, o, _ in gpu_items):
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
                created_terms.append(v)
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
        else:  # SHARED / FRACTIONAL shares
            model.add(sum(p.gpu_milli * v for p, _, v in gpu_items) <= g.free_milli)
            if g.mode is GpuMode.SHARED:
                free_mem = g.info.memory_mib - g.shared_memory_used
                model.add(sum(p.gpu_memory_mib * v for p, _, v in gpu_items) <= free_mem)
                if g.info.replicas:
                    model.add(
                        sum(v for _, _, v in gpu_items) <= g.info.replicas - len(g.shared_owners)
                    )

    # Shares per time-sliced GPU follow the plugin's sequence: k[n] = j exactly when the
    # node takes j new shares, and then GPU g takes as many as the first j picks hold.
    taken_k: dict[tuple[str, int], cp_model.IntVar] = {}
    for name, seq in sequences.items():
        taken_k.update({(name, j): model.new_bool_var(f"k[{name},{j}]")
                        for j in range(len(seq) + 1)})
        model.add(sum(taken_k[name, j] for j in range(len(seq) + 1)) == 1)
        for index in set(seq):
            landing = on_gpu.get((name, index), [])
            model.add(sum(v for _, _, v in landing)
                      == sum(seq[:j].count(index) * taken_k[name, j]
                             for j in range(len(seq) + 1)))

    # Whole-GPU pods take idle whole-capable GPUs that small pods of the batch leave.
    for name in state.nodes:
        wholes = [(p, v) for p, v in on_node.get(name, []) if p.kind is RequestKind.WHOLE]
        if not wholes:
            continue
        node = state.nodes[name]
        capable = [g for g in node.gpus if g.whole_free]
        # Whole pods get idle GPUs that no small pod of the batch takes:
        #   sum_p k_p w[p,n] + sum_g s[g] <= |capable|, and the GPUs counted as used,
        #   sum_g u[g] >= sum_p k_p w[p,n] + sum_g s[g], so whole GPUs free stay exact.
        demand = sum(p.gpu_count * v for p, v in wholes)
        taken = [small[name, g.info.index] for g in capable if (name, g.info.index) in small]
        model.add(demand + sum(taken) <= len(capable))
        for g in capable:
            if (name, g.info.index) not in u:
                u[name, g.info.index] = model.new_bool_var(f"u[{name},{g.info.index}]")
        model.add(sum(u[name, g.info.index] for g in capable) >= demand + sum(taken))

    # ---- constraints: groups and topology ----------------------------------------------
    groups: dict[str, list[PodRequest]] = defaultdict(list)
    for pod in pods:
        if pod.group is not None:
            groups[pod.group.key].append(pod)
    domain_use: dict[tuple[str, str], list[cp_model.IntVar]] = defaultdict(list)
    model_domains: dict[str, dict[str, cp_model.IntVar]] = {}  # group -> domain -> d var
    for key, members in groups.items():
        first = placed[members[0].key]
        for m in members[1:]:
            model.add(placed[m.key] == first)  # all or nothing
        ref = members[0].group
        assert ref is not None
        if ref.topology_key is None:
            continue
        by_domain: dict[str, list[str]] = defaultdict(list)
        for name, node in state.nodes.items():
            value = node.info.labels.get(ref.topology_key)
            if value is not None:
                by_domain[value].append(name)
        d = {dom: model.new_bool_var(f"d[{key},{dom}]") for dom in by_domain}
        model_domains[key] = d
        model.add(sum(d.values()) == first)
        for dom, var in d.items():
            if ref.exclusive:
                domain_use[ref.topology_key, dom].append(var)
        node_domain = {n: dom for dom, ns in by_domain.items() for n in ns}
        for m in members:
            for (k, n), v in w.items():
                if k == m.key:
                    _in_domain(model, v, d, node_domain.get(n))
            for i, o in enumerate(options.get(m.key, [])):
                _in_domain(model, x[m.key, i], d, node_domain.get(o.node))
    for (tk, dom), vs in domain_use.items():
        model.add(sum(vs) <= (0 if (tk, dom) in taken_domains else 1))

    # ---- objective ----------------------------------------------------------------------
    z: dict[str, cp_model.IntVar] = {}
    t: dict[str, cp_model.IntVar] = {}
    for name, items in on_node.items():
        t[name] = model.new_bool_var(f"t[{name}]")
        for _, v in items:
            model.add_implication(v, t[name])
        node = state.nodes[name]
        if node.whole_free:
            z[name] = t[name]
    weights = priority_weights(pods)
    n_pods = len(pods)
    n_gpu = sum(p.gpu_count if p.kind is RequestKind.WHOLE else 1 for p in pods) + 1
    e_w = 1
    d_w = e_w * (n_pods + 1)
    c_w = d_w * (n_pods + 1)
    b_w = c_w * (n_gpu + 1)
    a_w = b_w * (n_pods + 1)
    LE = cp_model.LinearExpr
    model.maximize(
        a_w * LE.weighted_sum(list(placed.values()), [weights[k] for k in placed])
        - b_w * LE.sum(list(z.values()))
        - c_w * LE.sum(list(u.values()))
        - d_w * LE.sum(created_terms)
        - e_w * LE.sum(list(t.values()))
    )

    # ---- hint from the greedy answer --------------------------------------------------
    # Every variable is hinted (the placement ones and the s/u/t/d indicators they
    # imply): CP-SAT takes a complete, feasible hint as its first solution, so even a
    # solve that spends its budget in presolve answers FEASIBLE, as good as the hint.
    hinted = {h.pod: h for h in hint}
    hinted_on: list[cp_model.IntVar] = []  # the placement variables the hint sets to 1
    for pod in pods:
        h = hinted.get(pod.key)
        if pod.kind is RequestKind.WHOLE:
            for (k, n), v in w.items():
                if k == pod.key:
                    on = h is not None and h.node == n
                    model.add_hint(v, 1 if on else 0)
                    if on:
                        hinted_on.append(v)
        else:
            for i, o in enumerate(options[pod.key]):
                model.add_hint(x[pod.key, i], 1 if h == o else 0)
                if h == o:
                    hinted_on.append(x[pod.key, i])
    _hint_indicators(model, state, hinted_on, on_node, on_gpu, small, u, t, w, pods_by_key)
    for name, seq in sequences.items():
        n_hinted = sum(1 for h in hint if h.node == name and h.gpus and h.pod in pods_by_key
                       and pods_by_key[h.pod].kind is RequestKind.SHARED
                       and state.gpu(name, h.gpus[0]).mode is GpuMode.SHARED)
        for j in range(len(seq) + 1):
            model.add_hint(taken_k[name, j], 1 if j == n_hinted else 0)
    for key, members in groups.items():
        ref = members[0].group
        if ref is None or ref.topology_key is None:
            continue
        h = hinted.get(members[0].key)
        at = None if h is None else state.nodes[h.node].info.labels.get(ref.topology_key)
        for value, var in model_domains[key].items():
            model.add_hint(var, 1 if value == at else 0)

    return BatchModel(model, x, options, w, pods_by_key, sequences)


def solve_batch(
    state: ClusterState,
    pods: Sequence[PodRequest],
    hint: Sequence[Placement] = (),
    params: SolverParams = SolverParams(),
    taken_domains: frozenset[tuple[str, str]] = frozenset(),
) -> SolveResult:
    """Solve the batch on ``state`` (not mutated). Placements are not yet validated."""
    from ortools.sat.python import cp_model

    built = build_batch_model(state, pods, hint, params, taken_domains)
    if built is None:
        return SolveResult((), "TOO_LARGE")
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
    for (key, n), v in sorted(w.items()):
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


def _hint_indicators(
    model: cp_model.CpModel,
    state: ClusterState,
    chosen: Sequence[cp_model.IntVar],
    on_node: Mapping[str, list[tuple[PodRequest, cp_model.IntVar]]],
    on_gpu: Mapping[tuple[str, int], list[tuple[PodRequest, Placement, cp_model.IntVar]]],
    small: Mapping[tuple[str, int], cp_model.IntVar],
    u: Mapping[tuple[str, int], cp_model.IntVar],
    t: Mapping[str, cp_model.IntVar],
    w: Mapping[tuple[str, str], cp_model.IntVar],
    pods_by_key: Mapping[str, PodRequest],
) -> None:
    """Hint s, u and t as the hinted placement variables ``chosen`` imply them: s[g] = 1
    where a hinted small pod lands, u[g] = 1 on those GPUs and on as many other idle
    capable GPUs as the node's hinted whole pods take, t[n] = 1 where any hinted pod is."""
    on = {v.index for v in chosen}
    for name, items in on_node.items():
        model.add_hint(t[name], 1 if any(v.index in on for _, v in items) else 0)
    for key, var in small.items():
        model.add_hint(var, 1 if any(v.index in on for _, _, v in on_gpu[key]) else 0)
    demand: dict[str, int] = defaultdict(int)
    for (pod, n), v in w.items():
        if v.index in on:
            demand[n] += pods_by_key[pod].gpu_count
    for name in {n for n, _ in u}:
        need = demand.get(name, 0)
        for g in state.nodes[name].gpus:
            key = (name, g.info.index)
            if key not in u:
                continue
            used = key in small and any(v.index in on for _, _, v in on_gpu[key])
            if not used and need > 0:
                used, need = True, need - 1
            model.add_hint(u[key], 1 if used else 0)


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
