"""CP-SAT selection of the evictions that free room for one waiting whole-GPU group.

Pure: a :class:`ClusterState` and facts about the pods in, a choice out; nothing here
applies it (``packing.defrag.plan`` does, and checks that the evicted pods land).

Data (built by :func:`defrag_candidates`): the group's members (whole-GPU pods, k[m] GPUs each)
and its topology domains. For every node n of a domain that could ever hold a member:
  free[n]      idle GPUs a member could take now (whole-capable, of an allowed model)
  hold[n, g]   the pods holding GPU g of n, for every whole-capable GPU g that is busy
               and held only by pods that may be evicted (GPUs held by any other pod are
               locked and not in the model)
  V[n]         the pods on n that may be evicted, each with its cost c[v], CPU, memory
               and the PodDisruptionBudgets that cover it
  cpu[n], mem[n]  free CPU and memory now
A budget b allows a[b] more disruptions (what earlier moves used is already taken off).

Reductions (``screen``): per node, the cheapest set of pods to evict for k GPUs (a tiny
knapsack over the node's GPUs: a multi-GPU pod frees its GPUs together); per domain only
the ``per_domain`` cheapest nodes; of the domains, the ``max_domains`` whose cheapest
nodes cost least. Without ``screen`` every node and domain goes into the model (the
exact answer the benchmark compares against).

Variables (Boolean):
  y[d]      the group goes to domain d
  x[m, n]   member m goes to node n                  (only where it could ever fit)
  t[n]      node n receives a member
  u[n, g]   GPU g of n is given to the group         (idle now, or freed)
  e[v]      pod v is evicted

Constraints:
  sum_d y[d] = 1;  sum_n x[m, n] = 1;  x[m, n] => y[domain(n)];  x[m, n] => t[n]
  sum_g u[n, g] >= sum_m k[m] x[m, n]                 the members' GPUs are there
  u[n, g] => e[v] for every holder v of g             a freed GPU is freed whole
  e[v] => t[node(v)]                                  evict only where a member goes
  sum_m cpu[m] x[m, n] <= cpu[n] + sum_{v on n} cpu[v] e[v]   (and memory alike)
  sum_{v in b} e[v] <= a[b] for every budget b
  and one clause per rejected answer (its evicted pods did not all land: see
  ``packing.defrag.plan``): exactly that answer in the exact search; with screening, every
  answer evicting all of its pods.

Objective (minimize): W * sum_v c[v] e[v] + sum_n t[n], W = nodes + 1: the cheapest
evictions, then the fewest nodes (tensor parallelism stays inside a node).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from packing.constraints import selector_miss
from packing.model import GpuMode, PodRequest
from packing.state import ClusterState, GpuState, NodeState


@dataclass(frozen=True)
class EvictablePod:
    """A running pod that may be evicted for this group."""

    key: str
    node: str
    gpus: tuple[int, ...]  # whole-capable GPUs of its node that it holds (maybe none)
    cpu: int
    mem: int
    cost: int
    budgets: tuple[str, ...] = ()


@dataclass(frozen=True)
class CandidateNode:
    """A node of a domain that could hold a member once some pods are evicted."""

    name: str
    domain: int
    free: tuple[int, ...]  # idle whole-capable GPUs now
    hold: Mapping[int, tuple[str, ...]]  # busy GPU -> its holders, all evictable
    cpu: int
    mem: int
    victims: tuple[EvictablePod, ...]
    cheapest: tuple[int | None, ...] = field(default=(), compare=False)  # cost for j GPUs


@dataclass(frozen=True)
class Selection:
    """The model's answer: the node of every member (in the order given) and the pods to
    evict, or a status saying why there is none."""

    nodes: tuple[str, ...] | None
    evict: tuple[str, ...]
    cost: int
    status: str


def whole_capable(g: GpuState, member: PodRequest) -> bool:
    """A GPU a member could take once nobody holds it: advertised whole (a whole GPU that
    small pods turned into MIG slices becomes whole again when they are all gone)."""
    if g.info.mode not in (GpuMode.WHOLE, GpuMode.FRACTIONAL):
        return False
    return not member.gpu_models or g.info.model in member.gpu_models


def holders(g: GpuState) -> tuple[str, ...]:
    out: list[str] = []
    if g.whole_owner is not None:
        out.append(g.whole_owner)
    out.extend(sorted(g.shared_owners))
    out.extend(sorted(o for _, o in g.instances.values() if o is not None))
    return tuple(dict.fromkeys(out))


def node_rules_ok(member: PodRequest, node: NodeState) -> bool:
    """Cordon and node selector: what no eviction can change."""
    if node.info.unschedulable:
        return False
    return selector_miss(member.node_selector.items(), node.info.labels) is None


def _cheapest(free: int, items: Sequence[tuple[int, int]], most: int) -> tuple[int | None, ...]:
    """Least cost to have j GPUs, j = 0..most: ``free`` cost nothing, each item is
    (GPUs, cost) taken whole (a knapsack of at most a node's GPUs)."""
    inf = None
    best: list[int | None] = [0 if j <= free else inf for j in range(most + 1)]
    for size, cost in items:
        nxt = list(best)
        for j in range(most + 1):
            prev = best[max(0, j - size)]
            if prev is not None and (nxt[j] is None or prev + cost < nxt[j]):  # type: ignore[operator]
                nxt[j] = prev + cost
        best = nxt
    return tuple(best)


def candidate(state: ClusterState, name: str, domain: int, member: PodRequest,
              victims: Mapping[str, EvictablePod], most: int) -> CandidateNode | None:
    """The node as the model sees it, or None when no eviction lets a member in."""
    node = state.nodes[name]
    if not node_rules_ok(member, node):
        return None
    free: list[int] = []
    hold: dict[int, tuple[str, ...]] = {}
    for g in node.gpus:
        if not whole_capable(g, member):
            continue
        who = holders(g)
        if not who:
            if g.mode in (GpuMode.WHOLE, GpuMode.FRACTIONAL):
                free.append(g.info.index)
            continue
        if all(k in victims for k in who):
            hold[g.info.index] = who
    mine = tuple(victims[k] for k in node.pods if k in victims)
    # CPU and memory the node could ever give: what is free plus what victims hold.
    if (node.cpu_free + sum(v.cpu for v in mine) < member.cpu_milli
            or node.mem_free + sum(v.mem for v in mine) < member.memory_mib):
        return None
    if len(free) + len(hold) < member.gpu_count:
        return None
    # Knapsack items: GPUs that share a holder are freed together (a multi-GPU pod).
    groups: list[tuple[set[int], set[str]]] = []
    for gi, who in hold.items():
        merged = [grp for grp in groups if grp[1] & set(who)]
        gpus, pods = {gi}, set(who)
        for grp in merged:
            groups.remove(grp)
            gpus |= grp[0]
            pods |= grp[1]
        groups.append((gpus, pods))
    items = [(len(gs), sum(victims[k].cost for k in ps)) for gs, ps in groups]
    cheapest = _cheapest(len(free), items, most)
    return CandidateNode(name, domain, tuple(free), hold, node.cpu_free, node.mem_free, mine,
                     cheapest)


def defrag_candidates(state: ClusterState, members: Sequence[PodRequest],
               domains: Sequence[Sequence[str]], victims: Mapping[str, EvictablePod],
               screen: bool, max_domains: int, per_domain: int) -> list[CandidateNode]:
    """Candidate nodes of the domains that could hold the whole group (see the module
    docstring for the reductions when ``screen``)."""
    small = min(members, key=lambda m: (m.gpu_count, m.cpu_milli, m.memory_mib))
    big = max(m.gpu_count for m in members)
    need = sum(m.gpu_count for m in members)
    kept: list[tuple[tuple[float, int], list[CandidateNode]]] = []
    for d, names in enumerate(domains):
        cands = [c for n in names
                 if (c := candidate(state, n, d, small, victims, need)) is not None]
        if sum(len(c.free) + len(c.hold) for c in cands) < need:
            continue  # even with every evictable pod gone the group does not fit
        if not screen:
            kept.append(((0.0, d), cands))
            continue

        def node_cost(c: CandidateNode) -> tuple[float, float, str]:
            one = c.cheapest[min(big, need)]
            return (float("inf") if one is None else one,
                    float("inf") if c.cheapest[-1] is None else c.cheapest[-1], c.name)

        cands.sort(key=node_cost)
        cands = cands[:per_domain]
        bound = sum(node_cost(c)[0] for c in cands[:len(members)])
        kept.append(((bound, d), cands))
    kept.sort(key=lambda kc: kc[0])
    if screen:
        kept = kept[:max_domains]
    return [c for _, cs in kept for c in cs]


@dataclass
class SelectionModel:
    """A built model; :meth:`reject` adds the clause excluding an answer, and
    :meth:`solve` may be called again after it."""

    members: Sequence[PodRequest]
    cands: Sequence[CandidateNode]
    model: cp_model.CpModel
    x: dict[tuple[int, int], cp_model.IntVar]
    e: dict[str, cp_model.IntVar]
    cost: dict[str, int]

    def reject(self, sel: Selection, exact: bool = True) -> None:
        """Exclude an answer whose evicted pods did not all land. ``exact``: exactly that
        answer. Otherwise every answer that evicts all of its pods (and maybe more),
        wherever the members go: more evictions rarely make room for the pods that did
        not land, and one answer at a time can take hundreds of rounds when several
        pods compete for the same few places."""
        assert sel.nodes is not None
        evicted = set(sel.evict)
        if not exact:
            self.model.add_bool_or([self.e[k].Not() for k in sorted(evicted)])
            return
        index = {c.name: i for i, c in enumerate(self.cands)}
        chosen = {(m, index[n]) for m, n in enumerate(sel.nodes)}
        lits = [v.Not() if mi in chosen else v for mi, v in self.x.items()]
        lits += [v.Not() if k in evicted else v for k, v in self.e.items()]
        self.model.add_bool_or(lits)

    def solve(self, max_time_s: float | None, workers: int, seed: int) -> Selection:
        solver = cp_model.CpSolver()
        if max_time_s is not None:
            solver.parameters.max_time_in_seconds = max_time_s
        solver.parameters.num_workers = workers
        solver.parameters.random_seed = seed
        status = solver.solve(self.model)
        name = solver.status_name(status)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return Selection(None, (), 0, name)
        nodes = []
        for m in range(len(self.members)):
            i = next(i for (mm, i), v in self.x.items() if mm == m and solver.boolean_value(v))
            nodes.append(self.cands[i].name)
        evict = tuple(sorted(k for k, v in self.e.items() if solver.boolean_value(v)))
        return Selection(tuple(nodes), evict, sum(self.cost[k] for k in evict), name)


def build_selection(members: Sequence[PodRequest], cands: Sequence[CandidateNode],
                    budgets_left: Mapping[str, int]) -> SelectionModel:
    # ---- data
    model = cp_model.CpModel()
    domains = sorted({c.domain for c in cands})
    victims = {v.key: v for c in cands for v in c.victims}
    w_cost = len(cands) + 1

    # ---- variables
    y = {d: model.new_bool_var(f"y[{d}]") for d in domains}  # the group's domain
    x: dict[tuple[int, int], cp_model.IntVar] = {}  # member m on candidate i
    for i, c in enumerate(cands):
        room = len(c.free) + len(c.hold)
        for m, member in enumerate(members):
            if member.gpu_count <= room:
                x[m, i] = model.new_bool_var(f"x[{m},{c.name}]")
    t = [model.new_bool_var(f"t[{c.name}]") for c in cands]  # node receives a member
    u: dict[tuple[int, int], cp_model.IntVar] = {}  # GPU given to the group
    for i, c in enumerate(cands):
        for g in (*c.free, *c.hold):
            u[i, g] = model.new_bool_var(f"u[{c.name},{g}]")
    e = {k: model.new_bool_var(f"e[{k}]") for k in sorted(victims)}  # pod evicted

    # ---- constraints
    model.add_exactly_one(y.values())
    for m in range(len(members)):
        mine = [v for (mm, _), v in x.items() if mm == m]
        if mine:
            model.add_exactly_one(mine)
        else:
            model.add_bool_or([])  # no candidate can ever hold this member: infeasible
    for i, c in enumerate(cands):
        here = [(m, v) for (m, ii), v in x.items() if ii == i]
        for _, v in here:
            model.add_implication(v, y[c.domain])
            model.add_implication(v, t[i])
        model.add(t[i] <= sum(v for _, v in here))
        gpus = [u[i, g] for g in (*c.free, *c.hold)]
        model.add(sum(gpus) >= sum(members[m].gpu_count * v for m, v in here))
        for g, who in c.hold.items():
            for k in who:
                model.add_implication(u[i, g], e[k])
        for vic in c.victims:
            model.add_implication(e[vic.key], t[i])
        model.add(sum(members[m].cpu_milli * v for m, v in here)
                  <= c.cpu + sum(vic.cpu * e[vic.key] for vic in c.victims))
        model.add(sum(members[m].memory_mib * v for m, v in here)
                  <= c.mem + sum(vic.mem * e[vic.key] for vic in c.victims))
    covered: dict[str, list[cp_model.IntVar]] = defaultdict(list)
    for vic in victims.values():
        for b in vic.budgets:
            covered[b].append(e[vic.key])
    for b, vs in covered.items():
        model.add(sum(vs) <= max(0, budgets_left.get(b, 0)))

    # ---- objective
    cost = {k: v.cost for k, v in victims.items()}
    model.minimize(w_cost * sum(cost[k] * e[k] for k in e) + sum(t))
    return SelectionModel(members, cands, model, x, e, cost)
