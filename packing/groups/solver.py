"""CP-SAT placement of one LLM group on whole GPUs, all members in one topology domain.

The reservation book of the extender places a group the moment its first pod is seen
(see ``scheduler/groups/loop.py``); this model chooses the domain and the node of every member
at once, so the choice is the best for the whole group rather than the first domain in
which a member-by-member greedy pass happens to succeed.

Data: a :class:`ClusterState`, the members (every one a whole-GPU request with the same
GPU-model filter), and the candidate domains (node-name lists; the caller has removed
exclusive domains that another group holds). For node n: G[n] idle GPUs a member could
take, W[n] whether the node is whole now (every GPU idle), and its free CPU and memory;
k[m], cpu[m], mem[m] what member m asks. ok[m, n]: member m fits node n on its own now
(cordon, node selector, CPU, memory, GPUs).

Reductions: nodes of one domain with equal G and W, room for equally many of the largest
member's CPU and memory, and the same ok column are interchangeable for the model, and
no placement uses more than len(members) of them, so only the first len(members) of each
such class are kept; two domains with the same idle GPUs F made of the same numbers of
nodes of each class are interchangeable, so only the first of each is kept. Domains that
cannot hold the group (too few idle GPUs, or a member that fits none of their nodes) are
dropped, and of the rest only the ``max_domains`` with the fewest idle GPUs enter the
model: a cluster with hundreds of NVLink cliques still gives a model of a few hundred
variables, solved in milliseconds, at the price of optimality over the domains left out
(they are the roomiest ones, which the last objective term disfavours anyway).

Variables (Boolean):
  y[d]     the group goes to domain d
  x[m, n]  member m goes to node n                    (only where ok[m, n])
  t[n]     node n receives at least one member
  f[n]     node n is left with no idle usable GPU     (filled exactly)

Constraints:
  sum_d y[d] = 1;  sum_n x[m, n] = 1 for every m;  x[m, n] <= y[domain(n)]
  sum_m k[m] x[m, n] <= G[n];  CPU and memory likewise
  x[m, n] <= t[n] <= sum_m x[m, n];  G[n] f[n] <= sum_m k[m] x[m, n];  f[n] <= t[n]

Objective (minimize; weights keep the terms lexicographic, each term bounded by the
number N of candidate nodes or, for the last, by the largest domain's idle GPUs F, F[d]
counting every node of domain d):
  A * sum_{n whole now} (t[n] - f[n])   whole nodes the group breaks without filling them
  + B * sum_{n} (t[n] - f[n])           nodes left with idle GPUs that a group cannot use
  + C * sum_n t[n]                      fewest nodes (tensor parallel stays inside a node)
  + sum_d F[d] y[d]                     best-fit domain: keep the roomiest ones for others
with C = F + 1, B = C (N + 1), A = B (N + 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

from packing.model import GpuMode, Placement, PodRequest, RequestKind
from packing.state import ClusterState, NodeState, fits_node


@dataclass(frozen=True)
class GroupSolverParams:
    max_time_s: float = 0.2
    workers: int = 1  # one worker: reproducible, and the solve runs inside a request
    seed: int = 0
    max_domains: int = 8  # screened domains in the model, fewest idle GPUs first
    max_candidates: int = 2_000  # nodes kept after the reductions; beyond, greedy answers


@dataclass(frozen=True)
class GroupSolve:
    """The members' placements (in the order given) and the domain's index, or None when
    the solver proved the group cannot fit (INFEASIBLE) or gave no answer in time."""

    placements: tuple[Placement, ...] | None
    domain: int | None
    status: str


def applicable(members: Sequence[PodRequest]) -> bool:
    """The model covers groups whose members all take whole GPUs of the same models."""
    return bool(members) and all(
        m.kind is RequestKind.WHOLE and m.gpu_models == members[0].gpu_models for m in members
    )


def _gpu_stats(node: NodeState, pod: PodRequest) -> tuple[int, bool]:
    """(idle GPUs the pod's models allow, whether the node is whole), in one pass: the
    same as counting ``GpuState.whole_free`` and reading ``NodeState.whole_free``."""
    usable = 0
    whole = bool(node.gpus)
    models = pod.gpu_models
    for g in node.gpus:
        if g.idle and g.mode in (GpuMode.WHOLE, GpuMode.FRACTIONAL):
            if not models or g.info.model in models:
                usable += 1
        else:
            whole = False
    return usable, whole


@dataclass(frozen=True)
class _Node:
    name: str
    domain: int
    gpus: int  # G[n]
    whole: bool  # W[n]
    cpu: int
    mem: int
    ok: tuple[bool, ...]  # per member


def _shape(m: PodRequest) -> tuple[object, ...]:
    return (m.gpu_count, m.cpu_milli, m.memory_mib, tuple(sorted(m.node_selector.items())))


def _candidates(state: ClusterState, members: Sequence[PodRequest],
                domains: Sequence[Sequence[str]], max_domains: int
                ) -> tuple[list[_Node], list[int], dict[int, int]]:
    """Candidate nodes after the reductions, the kept domains' indexes, and F[d]: the idle
    GPUs a member could use in each kept domain (every node of it counted).

    Screening (necessary conditions): a domain is kept only if every member fits one of
    its nodes and its idle usable GPUs cover the group's. Of the domains left, the
    ``max_domains`` with the fewest idle GPUs go into the model (best fit first; ties in
    the order given).
    """
    n_members = len(members)
    shapes = {_shape(m): m for m in members}  # members of one shape fit the same nodes
    shape_of = [_shape(m) for m in members]
    need = sum(m.gpu_count for m in members)
    cpu_unit = max(m.cpu_milli for m in members) or 1
    mem_unit = max(m.memory_mib for m in members) or 1
    screened: list[tuple[int, int, list[_Node], dict[tuple[object, ...], int]]] = []
    seen: set[tuple[object, ...]] = set()
    for d, names in enumerate(domains):
        per_class: dict[tuple[object, ...], int] = {}
        nodes: list[_Node] = []
        idle = 0
        for name in sorted(names):
            n = state.nodes[name]
            g, whole = _gpu_stats(n, members[0])
            idle += g
            fits = {s: g >= m.gpu_count and fits_node(m, n) is None for s, m in shapes.items()}
            ok = tuple(fits[s] for s in shape_of)
            if not any(ok):
                continue
            # Nodes that hold the same number of (the largest) members are interchangeable
            # up to which one is named; the representative keeps its exact free CPU/memory.
            cls = (g, whole, min(n_members, n.cpu_free // cpu_unit),
                   min(n_members, n.mem_free // mem_unit), ok)
            per_class[cls] = per_class.get(cls, 0) + 1
            if per_class[cls] <= n_members:
                nodes.append(_Node(name, d, g, whole, n.cpu_free, n.mem_free, ok))
        if idle < need or not all(any(c.ok[m] for c in nodes) for m in range(n_members)):
            continue
        key = (idle, tuple(sorted(per_class.items())))
        if key in seen:
            continue
        seen.add(key)
        screened.append((idle, d, nodes, per_class))
    screened.sort(key=lambda t: (t[0], t[1]))
    out: list[_Node] = []
    kept: list[int] = []
    free: dict[int, int] = {}
    for idle, d, nodes, _ in screened[:max_domains]:
        kept.append(d)
        free[d] = idle
        out.extend(nodes)
    return out, kept, free


def solve_group(
    state: ClusterState,
    members: Sequence[PodRequest],
    domains: Sequence[Sequence[str]],
    params: GroupSolverParams | None = None,
) -> GroupSolve:
    """Place every member or none (see the module docstring); ``state`` is unchanged."""
    prm = params or GroupSolverParams()
    if not applicable(members) or not domains:
        return GroupSolve(None, None, "NOT_APPLICABLE")
    # ---- data
    cands, kept, free = _candidates(state, members, domains, prm.max_domains)
    if not cands:
        return GroupSolve(None, None, "INFEASIBLE")
    if len(cands) > prm.max_candidates:
        return GroupSolve(None, None, "TOO_LARGE")
    n_cands = len(cands)
    w_c = max(free.values()) + 1
    w_b = w_c * (n_cands + 1)
    w_a = w_b * (n_cands + 1)

    # OR-Tools is imported where a model is built (as packing.cpsat does): the greedy
    # engine imports this module, and the warm child must not pay ~75 MiB for it.
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    # ---- variables
    y = {d: model.new_bool_var(f"y[{d}]") for d in kept}  # the group's domain
    x: dict[tuple[int, int], cp_model.IntVar] = {}  # member m on candidate i
    for i, c in enumerate(cands):
        for m, ok in enumerate(c.ok):
            if ok:
                x[m, i] = model.new_bool_var(f"x[{m},{c.name}]")
    t = [model.new_bool_var(f"t[{c.name}]") for c in cands]  # node receives a member
    f = [model.new_bool_var(f"f[{c.name}]") for c in cands]  # node left with no idle GPU

    # ---- constraints
    model.add_exactly_one(y.values())
    for m in range(len(members)):
        mine = [v for (mm, _), v in x.items() if mm == m]
        if not mine:
            return GroupSolve(None, None, "INFEASIBLE")
        model.add_exactly_one(mine)
    for i, c in enumerate(cands):
        here = [(m, v) for (m, ii), v in x.items() if ii == i]
        used = sum(members[m].gpu_count * v for m, v in here)
        model.add(used <= c.gpus)
        model.add(sum(members[m].cpu_milli * v for m, v in here) <= c.cpu)
        model.add(sum(members[m].memory_mib * v for m, v in here) <= c.mem)
        for _, v in here:
            model.add_implication(v, y[c.domain])
            model.add_implication(v, t[i])
        model.add(t[i] <= sum(v for _, v in here))
        model.add(used >= c.gpus * f[i])
        model.add_implication(f[i], t[i])

    # ---- objective
    model.minimize(
        w_a * sum(t[i] - f[i] for i, c in enumerate(cands) if c.whole)
        + w_b * sum(t[i] - f[i] for i in range(n_cands))
        + w_c * sum(t)
        + sum(free[d] * y[d] for d in kept)
    )

    # ---- solve
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = prm.max_time_s
    solver.parameters.num_workers = prm.workers
    solver.parameters.random_seed = prm.seed
    status = solver.solve(model)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return GroupSolve(None, None, name)

    # ---- read: node per member, then concrete GPUs by applying members one by one
    node_of = {m: cands[i].name for (m, i), v in x.items() if solver.boolean_value(v)}
    domain = next(d for d in kept if solver.boolean_value(y[d]))
    done: list[tuple[PodRequest, Placement]] = []
    try:
        for m in sorted(range(len(members)), key=lambda j: -members[j].gpu_count):
            opts = state.options(members[m], node_of[m])
            if not opts:
                return GroupSolve(None, None, f"{name}/unreadable")
            state.apply(members[m], opts[0])
            done.append((members[m], opts[0]))
    finally:
        for pod, p in reversed(done):
            state.undo(pod, p)
    by_key = {p.pod: p for _, p in done}
    return GroupSolve(tuple(by_key[m.key] for m in members), domain, name)
