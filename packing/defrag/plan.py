"""Defragmentation plans: the fewest, cheapest evictions that let a waiting group in.

For every waiting whole-GPU group (and lone whole-GPU pod) of a snapshot, highest
priority first, :func:`plan_defrag` finds a *move*: pods to evict such that afterwards
the group fits inside one domain of its topology and every evicted pod fits somewhere
else, all at once and without over-commit. A move is planned on the cluster as the moves
before it leave it, so all the moves of a plan can be carried out together; the whole
plan is checked by the validator the solvers share (:func:`packing.validate.validate`).

What may be evicted (everything else is never chosen):
- a running pod that a controller recreates (``Evictability.recreated_by``: the kube
  layer reads ``ownerReferences``); a bare pod would be gone for good;
- not a member of any group (another LLM group's pod would break that group), not of a
  priority above the waiting group's, not moved by an earlier move of the same plan;
- within what its PodDisruptionBudget still allows; a pod two budgets cover is never
  chosen (the Eviction API refuses it);
- only on a node that receives a member: evictions make room for the group, never room
  for other evicted pods (no chains of moves).

Cost of evicting pod v: (1 + tier(v)) * (1000 + size(v)), tier = rank of v's priority
among the running pods' priorities (0 for the lowest), size = the GPU it takes in
milli-GPUs (a whole GPU 1000; a MIG slice by its memory share; a share by its compute or
memory share, the larger). Each pod costs at least 1000, so fewer evictions come first;
among as many, smaller and lower-priority pods go first.

Search (see ``packing.defrag.model``): CP-SAT picks the domain, the member nodes and the
evictions; the evicted pods are then landed (``packing.defrag.landing``). If they do not
all land, that answer is excluded by a clause and the model is solved again, up to
``max_rounds`` times. Without screening and time limits (``DefragParams.exact()``) this
is the exact optimum of the definition above: the tests check it against brute force.
With screening (the default) pods that fit no other node now are not considered either.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from packing.catalog import get_model
from packing.defrag.landing import land
from packing.defrag.model import (
    EvictablePod,
    Selection,
    build_selection,
    defrag_candidates,
)
from packing.groups.members import members_by_group, with_reservations
from packing.groups.placement import EXCLUSIVE_DOMAIN, TOPOLOGY_LABEL, exclusive_domains_in_use
from packing.model import GPU_MILLI, GroupRef, Placement, PodRequest, RequestKind, Snapshot
from packing.scoring import topology_domains
from packing.state import ClusterState, describe
from packing.status import Status
from packing.validate import validate

POD_COST = 1000  # every eviction costs at least this: fewer evictions come first

# Checks of a group no move is planned for (Status.check; EXCLUSIVE_DOMAIN and
# TOPOLOGY_LABEL are packing.groups.placement's).
GROUP_KIND = "GroupKind"  # only whole-GPU groups of one GPU model set are planned
RUNNING_DOMAIN = "RunningDomain"  # the domain its running members pin cannot be used
NO_MOVE = "NoMove"  # no eviction set frees room (or none found in time)
NO_LANDING = "NoLanding"  # eviction sets free room, but the evicted pods fit nowhere


@dataclass(frozen=True)
class DisruptionBudget:
    """A PodDisruptionBudget as the planner needs it."""

    name: str  # "namespace/name"
    allowed: int  # disruptions it allows now
    pods: frozenset[str]  # keys of the pods it covers


@dataclass(frozen=True)
class Evictability:
    """What the cluster says about evicting pods (read by the kube layer)."""

    recreated_by: Mapping[str, str] = field(default_factory=dict)  # pod -> "Kind/name"
    budgets: tuple[DisruptionBudget, ...] = ()
    blocked: Mapping[str, str] = field(default_factory=dict)  # pod -> why never


@dataclass(frozen=True)
class DefragParams:
    max_time_s: float | None = 0.5  # per CP-SAT solve; None: no limit
    workers: int = 1  # one worker: the same answer every run
    seed: int = 0
    screen: bool = True  # the reductions of packing.defrag.model
    max_domains: int = 8
    per_domain: int | None = None  # candidate nodes kept per domain; None: 2 * members + 4
    max_rounds: int = 12  # answers whose evicted pods do not land, tried before giving up

    @staticmethod
    def exact() -> DefragParams:
        """Every node and domain, no time limits, no bound on rounds: the optimum."""
        return DefragParams(max_time_s=None, screen=False, max_rounds=1_000_000)


@dataclass(frozen=True)
class Eviction:
    pod: str
    node: str
    to: Placement  # where the pod (its replacement) is expected to land


@dataclass(frozen=True)
class Move:
    group: str
    evictions: tuple[Eviction, ...]
    room: tuple[Placement, ...]  # the group's members (and reserved workers) after it
    cost: int
    # (node, CPU millicores, memory MiB) the members take there: a move may evict a pod
    # for its CPU or memory, and whoever carries it out must keep those for the group too
    takes: tuple[tuple[str, int, int], ...] = ()

    def cpu_memory(self) -> dict[str, tuple[int, int]]:
        """CPU millicores and memory MiB the group takes, per node."""
        return {n: (cpu, mem) for n, cpu, mem in self.takes}

    def frees(self) -> dict[str, list[int]]:
        """GPUs the group takes, per node: idle already or freed by the evictions."""
        out: dict[str, set[int]] = defaultdict(set)
        for p in self.room:
            out[p.node].update(p.gpus)
        return {n: sorted(g) for n, g in sorted(out.items())}

    def to_json(self) -> dict[str, object]:
        return {
            "group": self.group,
            "evictions": [{"pod": e.pod, "node": e.node, "to": e.to.node}
                          for e in self.evictions],
            "frees": self.frees(),
            "cost": self.cost,
        }


@dataclass(frozen=True)
class WaitingGroup:
    group: str
    reason: str
    check: str = ""  # the Status.check that refused (see the constants above)

    def to_json(self) -> dict[str, object]:
        return {"group": self.group, "reason": self.reason, "check": self.check}


@dataclass(frozen=True)
class DefragPlan:
    moves: tuple[Move, ...]
    waiting: tuple[WaitingGroup, ...]

    def to_json(self) -> dict[str, object]:
        return {"moves": [m.to_json() for m in self.moves],
                "waiting": [w.to_json() for w in self.waiting]}


class InvalidDefragPlan(AssertionError):
    """The validator rejected a plan: a bug in the planner, never an answer."""


# ---- costs and who may be evicted --------------------------------------------------------


def size_milli(state: ClusterState, pod: PodRequest, p: Placement) -> int:
    """The GPU a pod takes, in milli-GPUs (see the module docstring)."""
    if pod.kind is RequestKind.WHOLE:
        return GPU_MILLI * pod.gpu_count
    if not p.gpus:
        return 0
    g = state.gpu(p.node, p.gpus[0])
    if pod.kind is RequestKind.MIG and p.mig_profile is not None:
        geom = get_model(g.info.model).mig
        if geom is None:
            return 0
        return geom.profile(p.mig_profile).memory_slices * GPU_MILLI // geom.memory_slices
    if pod.kind is RequestKind.SHARED:
        mem = pod.gpu_memory_mib * GPU_MILLI // max(1, g.info.memory_mib)
        return min(GPU_MILLI, max(pod.gpu_milli, mem))
    return 0


def priority_tiers(pods: Sequence[PodRequest]) -> dict[int, int]:
    return {prio: i for i, prio in enumerate(sorted({p.priority for p in pods}))}


def eviction_cost(state: ClusterState, pod: PodRequest, p: Placement, tier: int) -> int:
    return (1 + tier) * (POD_COST + size_milli(state, pod, p))


def why_kept(pod: PodRequest, priority: int, ev: Evictability, covered: Sequence[str],
             budgets_left: Mapping[str, int], moved: set[str]) -> str | None:
    """Why ``pod`` may not be evicted for a group of ``priority``, or None when it may.
    The reasons are short nouns; :func:`_waiting_reason` counts them."""
    if pod.group is not None:
        return "of another group"
    if pod.priority > priority:
        return "of higher priority"
    if pod.key in moved:
        return "moved by an earlier move"
    if pod.key in ev.blocked:
        return ev.blocked[pod.key]
    if pod.key not in ev.recreated_by:
        return "without a controller that recreates them"
    if len(covered) > 1:
        return "covered by more than one PodDisruptionBudget"
    if any(budgets_left.get(b, 0) <= 0 for b in covered):
        return "at their PodDisruptionBudget's limit"
    return None


# ---- planning ----------------------------------------------------------------------------


@dataclass
class _Cluster:
    """The working state of one plan: moves already planned are applied to it."""

    state: ClusterState
    running: dict[str, tuple[PodRequest, Placement]]
    tiers: dict[int, int]
    ev: Evictability
    covers: dict[str, list[str]]  # pod -> budgets covering it
    budgets_left: dict[str, int]
    moved: set[str]
    taken_domains: set[tuple[str, str]]


def _units(snapshot: Snapshot) -> list[tuple[str, list[PodRequest]]]:
    """Waiting groups (pending members with reservations for missing ones) and lone
    whole-GPU pods, highest priority first, then the most GPUs, then by name."""
    units: list[tuple[str, list[PodRequest]]] = list(members_by_group(snapshot.pending).items())
    units += [(p.key, [p]) for p in snapshot.pending
              if p.group is None and p.kind is RequestKind.WHOLE]
    return sorted(units, key=lambda u: (-max(m.priority for m in u[1]),
                                        -sum(m.gpu_count for m in u[1]), u[0]))


def _domains(c: _Cluster, members: Sequence[PodRequest]) -> list[list[str]] | Status:
    ref = members[0].group or GroupRef(members[0].key, 1)
    domains = topology_domains(c.state, ref)
    if ref.topology_key is None:
        return domains
    if not domains:
        return Status.unresolvable(
            TOPOLOGY_LABEL, f"no node carries the topology label {ref.topology_key}")
    # Members already running pin the domain.
    placed = {c.state.nodes[pl.node].info.labels.get(ref.topology_key)
              for p, pl in c.running.values() if p.group is not None and p.group.key == ref.key}
    out = []
    for names in domains:
        value = c.state.nodes[names[0]].info.labels[ref.topology_key]
        if placed and value not in placed:
            continue
        if ref.exclusive and (ref.exclusive_key, value) in c.taken_domains:
            continue
        out.append(names)
    if not out:
        if not placed:
            return Status.unschedulable(
                EXCLUSIVE_DOMAIN, f"every {ref.topology_key} domain is held by another group")
        return Status.unschedulable(
            RUNNING_DOMAIN, f"the domain of its running members ({sorted(map(str, placed))})"
            " cannot be used")
    return out


def _shape(pod: PodRequest) -> tuple[object, ...]:
    return (pod.kind, pod.gpu_count, pod.mig_profile, pod.gpu_milli, pod.gpu_memory_mib,
            pod.gpu_models, pod.cpu_milli, pod.memory_mib, tuple(sorted(pod.node_selector.items())))


def _room_elsewhere(state: ClusterState, pod: PodRequest, own: str,
                    memo: dict[tuple[object, ...], tuple[str, ...]]) -> bool:
    """Whether the pod fits some node other than its own now (the first two nodes with
    room are remembered per pod shape: pods of one shape fit the same nodes)."""
    key = _shape(pod)
    if key not in memo:
        found: list[str] = []
        for name in state.nodes:
            if state.options(pod, name, dedupe=True):
                found.append(name)
                if len(found) == 2:
                    break
        memo[key] = tuple(found)
    return any(n != own for n in memo[key])


def _victims(c: _Cluster, names: Sequence[str], priority: int, screen: bool
             ) -> tuple[dict[str, EvictablePod], dict[str, int]]:
    """Pods on ``names`` that may be evicted, and counts of the kept ones by reason.
    ``screen``: also keep pods that fit no other node now. Such a pod could still land
    in room that other evictions free, so the exact search keeps them; but a model full
    of them spends its rounds on answers whose pods do not land (a spread cluster where
    no node has four idle GPUs for a 4-GPU pod)."""
    out: dict[str, EvictablePod] = {}
    kept: dict[str, int] = defaultdict(int)
    memo: dict[tuple[object, ...], tuple[str, ...]] = {}
    for n in names:
        node = c.state.nodes[n]
        usable = {g.info.index for g in node.gpus if g.info.mode.value in ("whole", "fractional")}
        for key, pl in node.pods.items():
            pod, _ = c.running[key]
            covered = c.covers.get(key, [])
            why = why_kept(pod, priority, c.ev, covered, c.budgets_left, c.moved)
            if why is None and screen and not _room_elsewhere(c.state, pod, n, memo):
                why = "with no room on another node now"
            if why is not None:
                if set(pl.gpus) & usable:
                    kept[why] += 1
                continue
            out[key] = EvictablePod(key, n, tuple(g for g in pl.gpus if g in usable),
                              pod.cpu_milli, pod.memory_mib,
                              eviction_cost(c.state, pod, pl, c.tiers.get(pod.priority, 0)),
                              tuple(covered))
    return out, kept


def _waiting_reason(members: Sequence[PodRequest], topology: str | None,
                    kept: Mapping[str, int], limits: Sequence[str], rounds: int,
                    status: str) -> Status:
    what = f"{len(members)} pod(s) of {describe(members[0])}"
    where = f"one {topology} domain" if topology else "the cluster"
    if rounds:
        return Status.unschedulable(
            NO_LANDING, f"{rounds} eviction set(s) would free room for {what} in {where}, "
            "but the evicted pods would not all fit elsewhere")
    if status not in ("INFEASIBLE", "NO_CANDIDATES"):
        return Status.unschedulable(
            NO_MOVE, f"no eviction set found in time for {what} in {where} (solver {status})")
    held = ", ".join(f"{n} {why}" for why, n in sorted(kept.items(), key=lambda kv: -kv[1]))
    tail = f"; GPUs held by pods that may not be evicted: {held}" if held else ""
    if limits:
        tail += "; PodDisruptionBudgets allow only " + ", ".join(limits)
    return Status.unschedulable(NO_MOVE, f"no eviction set frees room for {what} in {where}{tail}")


def _limits(c: _Cluster, victims: Mapping[str, EvictablePod]) -> list[str]:
    """Budgets that allow fewer disruptions than the candidate pods they cover."""
    covered: dict[str, int] = defaultdict(int)
    for v in victims.values():
        for b in v.budgets:
            covered[b] += 1
    return [f"{c.budgets_left[b]} more disruption(s) of the {n} pods {b} covers"
            for b, n in sorted(covered.items()) if c.budgets_left[b] < n]


def _undo_all(state: ClusterState, done: Sequence[tuple[PodRequest, Placement]]) -> None:
    for pod, p in reversed(done):
        state.undo(pod, p)


def _try(c: _Cluster, members: Sequence[PodRequest], sel: Selection,
         params: DefragParams) -> tuple[list[Placement], list[Eviction]] | None:
    """Carry out a selection on the state: evict, place the members, land the evicted
    pods. Applied on success; the state is unchanged on failure."""
    assert sel.nodes is not None
    state = c.state
    evicted = [c.running[k] for k in sel.evict]
    for pod, pl in evicted:
        state.undo(pod, pl)
    placed: list[tuple[PodRequest, Placement]] = []
    order = sorted(range(len(members)), key=lambda m: -members[m].gpu_count)
    for m in order:
        opts = state.options(members[m], sel.nodes[m])
        if not opts:
            break
        state.apply(members[m], opts[0])
        placed.append((members[m], opts[0]))
    landed = None
    if len(placed) == len(members):
        landed = land(state, evicted, params.max_time_s, params.seed)
    if landed is None:
        _undo_all(state, placed)
        for pod, pl in evicted:
            state.apply(pod, pl, allow_overcommit=True)
        return None
    where = {p.pod: p for p in landed}
    evictions = [Eviction(pod.key, pl.node, where[pod.key]) for pod, pl in evicted]
    by_member = {p.pod: p for _, p in placed}
    return [by_member[m.key] for m in members], evictions


def _plan_unit(c: _Cluster, key: str, members: list[PodRequest],
               params: DefragParams) -> Move | Status:
    if not all(m.kind is RequestKind.WHOLE and m.gpu_models == members[0].gpu_models
               for m in members):
        return Status.unresolvable(
            GROUP_KIND, "only groups of whole-GPU pods (of the same GPU models) are planned")
    domains = _domains(c, members)
    if isinstance(domains, Status):
        return domains
    priority = max(m.priority for m in members)
    names = [n for d in domains for n in d]
    victims, kept = _victims(c, names, priority, params.screen)
    per_domain = params.per_domain or 2 * len(members) + 4
    cands = defrag_candidates(c.state, members, domains, victims, params.screen,
                              params.max_domains, per_domain)
    topology = members[0].group.topology_key if members[0].group else None
    limits = _limits(c, victims)
    if not cands:
        return _waiting_reason(members, topology, kept, limits, 0, "NO_CANDIDATES")
    built = build_selection(members, cands, c.budgets_left)
    rounds = 0
    while True:
        sel = built.solve(params.max_time_s, params.workers, params.seed)
        if sel.nodes is None:
            return _waiting_reason(members, topology, kept, limits, rounds, sel.status)
        done = _try(c, members, sel, params)
        if done is not None:
            room, evictions = done
            takes: dict[str, tuple[int, int]] = {}
            for m, p in zip(members, room, strict=True):
                cpu, mem = takes.get(p.node, (0, 0))
                takes[p.node] = (cpu + m.cpu_milli, mem + m.memory_mib)
            return Move(key, tuple(evictions), tuple(room), sel.cost,
                        tuple((n, cpu, mem) for n, (cpu, mem) in sorted(takes.items())))
        rounds += 1
        if rounds >= params.max_rounds:
            return _waiting_reason(members, topology, kept, limits, rounds, sel.status)
        built.reject(sel, exact=not params.screen)


def plan_defrag(snapshot: Snapshot, ev: Evictability,
                params: DefragParams | None = None) -> DefragPlan:
    """Moves for the waiting groups of ``snapshot`` (see the module docstring)."""
    prm = params or DefragParams()
    snap = with_reservations(snapshot)
    state = ClusterState(snap)
    covers: dict[str, list[str]] = defaultdict(list)
    for b in ev.budgets:
        for k in sorted(b.pods):
            covers[k].append(b.name)
    c = _Cluster(
        state=state,
        running={p.key: (p, pl) for p, pl in snap.running},
        tiers=priority_tiers([p for p, _ in snap.running]),
        ev=ev,
        covers=dict(covers),
        budgets_left={b.name: b.allowed for b in ev.budgets},
        moved=set(),
        taken_domains=exclusive_domains_in_use(state, [p for p, _ in snap.running]),
    )
    moves: list[Move] = []
    waiting: list[WaitingGroup] = []
    for key, members in _units(snap):
        got = _plan_unit(c, key, members, prm)
        if isinstance(got, Status):
            waiting.append(WaitingGroup(key, got.message, got.check))
            continue
        moves.append(got)
        _record(c, members, got)
    _check(snap, moves)
    return DefragPlan(tuple(moves), tuple(waiting))


def _record(c: _Cluster, members: Sequence[PodRequest], move: Move) -> None:
    """The move is applied to the state already; keep the books in step with it."""
    for e in move.evictions:
        pod, _ = c.running[e.pod]
        c.running[e.pod] = (pod, e.to)
        c.moved.add(e.pod)
        for b in c.covers.get(e.pod, []):
            c.budgets_left[b] -= 1
    for m, p in zip(members, move.room, strict=True):
        c.running[m.key] = (m, p)
        ref = m.group
        if ref is not None and ref.exclusive and ref.topology_key is not None:
            value = c.state.nodes[p.node].info.labels.get(ref.topology_key)
            if value is not None:
                c.taken_domains.add((ref.exclusive_key, value))


def _check(snap: Snapshot, moves: Sequence[Move]) -> None:
    """Every move together: the evicted pods and the groups as pending pods placed where
    the plan puts them, on the cluster without the evicted pods. Raises InvalidDefragPlan."""
    if not moves:
        return
    evicted = {e.pod for m in moves for e in m.evictions}
    running = tuple((p, pl) for p, pl in snap.running if p.key not in evicted)
    pods = {p.key: p for p, _ in snap.running if p.key in evicted}
    moved = [e.to for m in moves for e in m.evictions]
    pending = [pods[e.pod] for m in moves for e in m.evictions]
    members = {p.key: p for p in snap.pending}
    for m in moves:
        pending.extend(members[p.pod] for p in m.room)
    errors = validate(replace(snap, running=running, pending=tuple(pending)),
                      [*moved, *(p for m in moves for p in m.room)])
    if errors:
        raise InvalidDefragPlan("defragmentation plan failed validation: " + "; ".join(errors[:5]))

