"""MIG compaction: empty a MIG GPU whose few pods fit in free slices of GPUs already in
use, as one pure function, :func:`decide_compaction` (issue 19).

Why: the MIG manager re-lays a GPU only when nothing uses it, so a GPU that keeps one
pod keeps its layout. In a stream of ASR/TTS pods that come and go, GPUs end up holding
one or two pods each while free slices of the same profiles stand on other GPUs: the
cluster holds more GPUs than its pods' slices need (``bench/mig.py``: about 1.25x the
slice bound with the actuator alone). Moving those pods -- evicting them through the
Eviction API, which honours PodDisruptionBudgets, so that their controllers make
replacements the extender places on the free slices -- empties the GPU; the actuator can
then re-lay it for pods that wait, or turn it whole for whole-GPU pods and LLM groups.

Input (:class:`CompactState`): the nodes as :func:`scheduler.mig.decide.decide_mig` sees
them, the pods on MIG slices (:class:`Tenant`: profile, since when, whether a controller
recreates it), the drains in flight, the pending MIG pods, the nodes with a MIG change
in flight, recent accepted evictions and per-GPU cool-downs. Output
(:class:`CompactDecision`): drains to start, drains that ended, pods to evict now, the
instances to hold, the new cool-downs. The handler (``scheduler/mig/loop.py``) evicts,
holds, records outcomes (an eviction refused marks the drain), and emits Events/metrics.

Rules (each has a row in ``tests/scheduler/test_mig_compact.py``):

* **where**: nodes opted in to MIG reconfiguration (``MigReconfigure.ON``), schedulable,
  without a NoSchedule/NoExecute taint, with no MIG change in flight.
* **source GPU**: MIG on; every holder is a pod on one of its slices that a controller
  recreates (the handler: a ReplicaSet, ReplicationController or StatefulSet; not Jobs,
  whose progress an eviction loses), started at least ``min_pod_age_s`` ago; at most
  ``max_pods`` of them (each is a restart); not cooling down.
* **destinations**: the source's pods, by profile, fit in free instances of the same GPU
  model on *other GPUs in use* (a pod there already: moving onto an idle GPU would only
  move the use) on schedulable, untainted nodes without a MIG change in flight, opted in
  or not (a replacement is placed like any pod, anywhere), not being drained, after the
  pending MIG pods took theirs (in arrival order: they are served first). The
  extender prefers instances on GPUs in use (``scores.mig_preference``).
* **only when it pays**: the model's MIG GPUs in use on opted-in nodes exceed the slice
  bound of their pods by at least ``min_excess`` GPUs (``dynamic_min_excess`` for a
  DynamicMIG source GPU: a move there creates one instance beside the others, no GPU is
  re-laid, so the first GPU of excess is worth a drain).
* **DynamicMIG sources** (issue 34; ``bench/mig.py --protocol dra-dynamic`` measured
  each rule): what emptying a GPU costs later depends on its MIG mode once its last
  instance goes (:func:`keeps_mig_mode`).

  - A GPU that **keeps MIG mode** (Ampere: the mode changes only with a GPU reset, so
    the driver leaves it on) costs only the moved pods' restarts: the next pod gets an
    instance there as on any GPU in MIG mode. Its guards are ``kept_mode_max_pods`` and
    ``kept_mode_min_pod_age_s`` (looser than ``max_pods`` and ``min_pod_age_s``).
  - A GPU that **leaves MIG mode** with its last instance (Hopper and later) makes the
    pod that next opens an idle GPU of its model wait the mode switch. So with
    ``keep_room`` it is drained only when, once the pending pods and the moved pods took
    their instances, the model's other GPUs in use still have room for one more pod of
    every profile in use on the model: the next arrivals of any of those profiles find an
    instance without opening a GPU. (Measured on seed 1 at 200 pods/h: stream pods
    waited for 15.3 H100 mode switches an hour without it, 9.7 with it, 9.1 under plain
    kube-scheduler's first fit; ``bench/README.md``, "DynamicMIG".)
* **pace**: one drain per GPU model at a time; a drain starts only when its evictions fit
  in ``evictions_per_hour`` (``dynamic_evictions_per_hour`` for a DynamicMIG source),
  counting accepted evictions in the last hour plus those of drains in flight not yet
  done.
* **choice**: the GPU with the fewest pods, then the fewest memory slices in use, then
  node name and index (the same answer for the same input).
* **holds**: every free instance of a draining GPU is held (key prefix ``DRAIN_PREFIX``)
  so nothing, a replacement included, lands there; the handler also holds an instance
  the moment a drained pod goes (the cache's ``on_pod_gone`` hook), before any other pod
  is answered.
* **steering** (``steer.py``): on opted-in nodes, the MIG devices of idle DynamicMIG
  GPUs are fenced for each profile the node's GPUs in MIG mode have room for
  (``dynamic_steer_margin`` instances or more), so the allocator's first fit creates the
  instance beside the others instead of turning an idle GPU's MIG mode on.
* **end**: ``emptied`` once none of the drain's pods is on the GPU; ``refilled`` when a
  pod not in the drain is on it (kube-scheduler counts MIG resources per node, and the
  kubelet may hand a replacement any free instance of its profile on the node);
  ``refused`` when the API refused an eviction (a PodDisruptionBudget: 429, or 403);
  ``timeout`` after ``drain_timeout_s``; ``gone`` when the GPU is gone or not in MIG
  mode. Every end but ``emptied`` cools the GPU down for ``cooldown_s``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kube.mig.compaction_memory import DEFAULT_COOLDOWN_S, DrainRecord
from packing.catalog import get_model
from packing.dra.inventory import TAINT_MARK
from packing.dra.nvidia import MIG_MODE_NEEDS_RESET
from packing.mig.layout import MigSlot, free_starts, slice_bound, used_slices
from packing.model import MigReconfigure
from scheduler.mig.compact.steer import Steer, steer_fences
from scheduler.mig.decide import GpuView, Hold, MigPod, NodeView

DRAIN_PREFIX = "gpupack-mig-drain/"  # cache hold keys of drains (never a pod's key)
RESULTS = ("emptied", "refilled", "refused", "timeout", "gone")
HOUR_S = 3600.0

GpuKey = tuple[str, int]  # (node, GPU index)
# How long a drained DynamicMIG GPU's fences stand before its pods are evicted: the API
# has the DeviceTaintRules once written, but kube-scheduler's allocator sees them only
# when its DeviceTaintRule informer (a watch apart from the pods') delivers them; a
# replacement created at once could be allocated the drained GPU again. The actuator
# steps at least every 2 s, so the eviction comes one step after the fence.
FENCE_SETTLE_S = 1.0


@dataclass(frozen=True)
class CompactSettings:
    min_pod_age_s: float = 300.0  # a pod that started less long ago is not moved
    max_pods: int = 3  # a GPU holding more pods is not drained (each is a restart)
    evictions_per_hour: int = 120  # accepted evictions in any hour, cluster-wide
    drain_timeout_s: float = 600.0  # a drain whose pods are not gone by then ends
    cooldown_s: float = DEFAULT_COOLDOWN_S  # a GPU whose drain failed is left alone this long
    # Only a GPU model whose MIG GPUs in use exceed the slice bound of their pods by at
    # least this many GPUs is compacted (no restarts where the packing is tight already).
    min_excess: int = 2
    # DynamicMIG source GPUs (module docstring): the excess that pays for a drain, the
    # guards of a GPU that keeps MIG mode once empty, and the room a GPU that leaves MIG
    # mode must leave for every profile in use.
    dynamic_min_excess: int = 1
    # A drain of a DynamicMIG GPU may start while accepted evictions in any hour stay
    # under this (all evictions counted, as for ``evictions_per_hour``).
    dynamic_evictions_per_hour: int = 240
    kept_mode_max_pods: int = 7
    kept_mode_min_pod_age_s: float = 0.0
    keep_room: bool = True
    # Steering (``steer.py``): the MIG devices of idle DynamicMIG GPUs are fenced for a
    # profile while the node's GPUs in MIG mode have room for at least this many more
    # instances of it; 0: never.
    dynamic_steer_margin: int = 1
    # Once up, a profile's fences stay while the room is at least this many (1 ..
    # margin; 0: the margin itself, no hysteresis). Below the margin, fewer fences go
    # up and down as pods come and go on the GPUs in MIG mode (DeviceTaintRule writes).
    dynamic_steer_keep: int = 0

    def excess_needed(self, g: GpuView) -> int:
        return self.dynamic_min_excess if g.dynamic else self.min_excess

    def evictions_limit(self, g: GpuView) -> int:
        return self.dynamic_evictions_per_hour if g.dynamic else self.evictions_per_hour

    def most_pods(self, g: GpuView) -> int:
        return self.kept_mode_max_pods if g.dynamic and keeps_mig_mode(g) else self.max_pods

    def least_age(self, g: GpuView) -> float:
        return (self.kept_mode_min_pod_age_s if g.dynamic and keeps_mig_mode(g)
                else self.min_pod_age_s)


DEFAULT_COMPACT = CompactSettings()


def keeps_mig_mode(g: GpuView) -> bool:
    """Whether the GPU stays in MIG mode once its last instance goes: a part whose MIG
    mode changes only with a reset (``packing.dra.nvidia.MIG_MODE_NEEDS_RESET``: A100,
    A30), which the DynamicMIG driver therefore leaves in MIG mode."""
    return g.model in MIG_MODE_NEEDS_RESET


@dataclass(frozen=True)
class Tenant:
    """A pod on a MIG slice, as the handler knows it."""

    key: str
    node: str
    gpu: int
    profile: str
    since: float  # when the handler first saw it on the slice
    movable: bool  # a controller recreates it once evicted (kube.owners.recreator)


@dataclass(frozen=True)
class Drain(DrainRecord):
    """A drain in flight: the fields compaction's memory keeps across leaders (node,
    GPU, model, the pods that must leave, when it started, the evictions the API
    accepted, why one was refused), and where it is."""

    @property
    def gpu_key(self) -> GpuKey:
        return (self.node, self.gpu)


@dataclass(frozen=True)
class CompactState:
    nodes: tuple[NodeView, ...]
    tenants: Mapping[str, Tenant] = field(default_factory=dict)  # by pod key
    drains: tuple[Drain, ...] = ()
    pending: tuple[MigPod, ...] = ()  # pending MIG pods, in arrival order
    changing: frozenset[str] = frozenset()  # nodes with a MIG change in flight
    evictions: tuple[float, ...] = ()  # when recent accepted evictions happened
    cooldown: Mapping[GpuKey, float] = field(default_factory=dict)  # GPU -> until
    steered: frozenset[Steer] = frozenset()  # steering's fences up now (the keep rule)


@dataclass(frozen=True)
class DrainEnd:
    drain: Drain
    result: str  # one of RESULTS
    message: str


@dataclass(frozen=True)
class CompactDecision:
    starts: tuple[Drain, ...] = ()
    ends: tuple[DrainEnd, ...] = ()
    evict: tuple[tuple[Drain, str], ...] = ()  # (drain, pod) to evict now
    holds: tuple[Hold, ...] = ()  # every drain hold wanted now
    cooldown: Mapping[GpuKey, float] = field(default_factory=dict)
    why: Mapping[GpuKey, str] = field(default_factory=dict)  # per started drain
    # DynamicMIG GPUs being drained: the handler keeps the DRA allocator off them (a
    # NoSchedule device taint on each of their devices) until their drain ends.
    fences: tuple[GpuKey, ...] = ()
    # (node, GPU, MIG profile): the handler fences those MIG devices of idle DynamicMIG
    # GPUs (``steer.py``) so the allocator creates the instance on a GPU in MIG mode.
    steer: tuple[Steer, ...] = ()


def _eligible(n: NodeView, changing: frozenset[str]) -> bool:
    return (n.reconfigure is MigReconfigure.ON and not n.unschedulable and not n.tainted
            and n.name not in changing)


def _end(d: Drain, gpus: Mapping[GpuKey, GpuView], now: float, s: CompactSettings
         ) -> DrainEnd | None:
    g = gpus.get(d.gpu_key)
    where = f"GPU {d.gpu} of {d.node}"
    # A DynamicMIG GPU leaves MIG mode when its last instance goes: that is emptied.
    if g is None or not (g.mig_enabled or g.dynamic):
        return DrainEnd(d, "gone", f"{where} is gone or no longer in MIG mode")
    if d.refused is not None:
        return DrainEnd(d, "refused", f"{where}: an eviction was refused: {d.refused}")
    # A fenced DynamicMIG GPU left idle is held by its own taint (the cache counts a
    # tainted idle GPU as held): that is the fence, not a pod.
    pods = {h for h in g.holders if not h.startswith(DRAIN_PREFIX)
            and not (g.dynamic and h.endswith(TAINT_MARK))}
    strangers = sorted(pods - set(d.pods))
    if strangers:
        return DrainEnd(d, "refilled", f"{where}: {', '.join(strangers)} landed on it while "
                                       "it was drained")
    if not pods:
        return DrainEnd(d, "emptied", f"{where} emptied: {', '.join(d.pods)} moved")
    if now - d.started > s.drain_timeout_s:
        return DrainEnd(d, "timeout", f"{where}: {', '.join(sorted(pods))} still there after "
                                      f"{s.drain_timeout_s:.0f} s")
    return None


def drain_holds(d: Drain, g: GpuView) -> list[Hold]:
    """Every instance of the GPU no pod holds: free ones, and those the drain holds."""
    out = []
    for slot in g.layout:
        h = Hold(d.node, d.gpu, d.model, slot.profile, slot.start, DRAIN_PREFIX)
        if slot in g.free or h.key in g.holders:
            out.append(h)
    return out


def fences_up_since(since: Mapping[GpuKey, float], up: Iterable[GpuKey], now: float
                    ) -> dict[GpuKey, float]:
    """When the fences of each GPU in ``up`` (written now) went up: as in ``since``, else
    ``now``; GPUs not in ``up`` are forgotten (a failed write: pass none)."""
    return {g: since.get(g, now) for g in up}


def fence_seen(since: Mapping[GpuKey, float], gpu: GpuKey, now: float) -> bool:
    """Whether ``gpu``'s fences have stood ``FENCE_SETTLE_S`` (see there)."""
    return gpu in since and now - since[gpu] >= FENCE_SETTLE_S


def _free_on_used(nodes: Sequence[NodeView], changing: frozenset[str],
                  draining: set[GpuKey]) -> dict[GpuKey, Counter[str]]:
    """Free instances per profile on each GPU in use (a pod on it) that a pod may take."""
    out: dict[GpuKey, Counter[str]] = {}
    for n in nodes:
        if n.unschedulable or n.tainted or n.name in changing:
            continue
        for g in n.gpus:
            if not g.mig_enabled or not g.free or (n.name, g.index) in draining:
                continue
            if not any(not h.startswith(DRAIN_PREFIX) for h in g.holders):
                continue  # idle: a pod moved here would only move the use
            out[n.name, g.index] = Counter(s.profile for s in g.free)
    return out


def _after_pending(free: dict[GpuKey, Counter[str]], models: Mapping[GpuKey, str],
                   pending: Sequence[MigPod]) -> Counter[tuple[str, str]]:
    """Free instances per (model, profile) left once the pending pods took theirs."""
    left: Counter[tuple[str, str]] = Counter()
    for k, c in free.items():
        for p, n in c.items():
            left[models[k], p] += n
    for pod in pending:
        took = next((m for (m, p), n in sorted(left.items())
                     if p == pod.profile and n > 0 and (not pod.models or m in pod.models)),
                    None)
        if took is not None:
            left[took, pod.profile] -= 1
    return left


def decide_compaction(state: CompactState, now: float,
                      settings: CompactSettings = DEFAULT_COMPACT) -> CompactDecision:
    """What compaction does now; see the module docstring."""
    s = settings
    gpus = {(n.name, g.index): g for n in state.nodes for g in n.gpus}
    cooldown = {k: t for k, t in state.cooldown.items() if t > now}
    ends: list[DrainEnd] = []
    live: list[Drain] = []
    for d in state.drains:
        e = _end(d, gpus, now, s)
        if e is None:
            live.append(d)
            continue
        ends.append(e)
        if e.result != "emptied":
            cooldown[d.gpu_key] = now + s.cooldown_s
    holds = [h for d in live for h in drain_holds(d, gpus[d.gpu_key])]
    fences = [d.gpu_key for d in live if gpus[d.gpu_key].dynamic]
    evict = [(d, p) for d in live for p in d.pods
             if p not in d.evicted and p in gpus[d.gpu_key].holders]
    # Evictions counted against the budgets: accepted in the last hour, and those of the
    # drains in flight not yet done.
    spent = sum(1 for t in state.evictions if now - t < HOUR_S) + len(evict)
    budget = max(s.evictions_per_hour, s.dynamic_evictions_per_hour) - spent
    busy_models = {d.model for d in live}
    draining = {d.gpu_key for d in live}
    eligible = [n for n in state.nodes if _eligible(n, state.changing)]  # steering's nodes
    starts: list[Drain] = []
    why: dict[GpuKey, str] = {}
    if budget > 0:
        free = _free_on_used(state.nodes, state.changing, draining)
        models = {k: gpus[k].model for k in free}
        left = _after_pending(free, models, state.pending)
        by_gpu: dict[GpuKey, list[Tenant]] = defaultdict(list)
        for t in state.tenants.values():
            by_gpu[t.node, t.gpu].append(t)
        excess = _excess(state.nodes, by_gpu)
        # The allocator skips the MIG devices steering fences (``steer.py``): a moved
        # pod's first fit is then a GPU in MIG mode where an idle GPU comes first.
        steered = steer_fences(eligible, draining, s.dynamic_steer_margin,
                               s.dynamic_steer_keep, state.steered)
        room = DynamicRoom(state.nodes, state.changing, draining, state.pending,
                           frozenset(steered))
        in_use = _profiles_in_use(state.tenants.values(), gpus)
        for cand in _candidates(state, by_gpu, now, s, cooldown, draining, busy_models):
            node, g, pods = cand
            if (g.model in busy_models or spent + len(pods) > s.evictions_limit(g)
                    or excess.get(g.model, 0) < s.excess_needed(g)):
                continue
            need = Counter(t.profile for t in pods)
            if g.dynamic:
                # Destinations: instances the allocator would create on other GPUs in use;
                # a GPU that leaves MIG mode also leaves room for every profile in use.
                keep = (in_use.get(g.model, ()) if s.keep_room and not keeps_mig_mode(g)
                        else ())
                if not room.take((node, g.index), g.model, [t.profile for t in pods], keep):
                    continue
                fences.append((node, g.index))
                where = "room for the same profiles on GPUs in use takes them"
            else:
                # Destinations on other GPUs: the source's own free instances do not count.
                own = free.get((node, g.index), Counter())
                if any(left[g.model, p] - own[p] < k for p, k in need.items()):
                    continue
                for p, k in need.items():
                    left[g.model, p] -= k
                where = "free slices of the same profiles on GPUs in use take them"
            d = Drain(node, g.index, g.model, tuple(t.key for t in pods), now)
            starts.append(d)
            why[d.gpu_key] = (f"GPU {g.index} of {node} ({g.model}) holds only "
                              + ", ".join(f"{t.key} ({t.profile})" for t in pods)
                              + f"; {where}")
            busy_models.add(g.model)
            spent += len(pods)
            holds += drain_holds(d, g)
            evict += [(d, t.key) for t in pods]
    steer = steer_fences(eligible, set(fences), s.dynamic_steer_margin, s.dynamic_steer_keep,
                         state.steered)
    return CompactDecision(tuple(starts), tuple(ends), tuple(evict), tuple(holds), cooldown,
                           why, tuple(fences), steer)


class DynamicRoom:
    """Where the DRA allocator would create the instances of moved pods on DynamicMIG
    GPUs: on each node its first fit (the first GPU in the driver's order, which is
    index order, with a free start for the profile, at its lowest free start), and the
    pod counts as placed only where that first fit is a GPU already in use (a pod there
    already: moving onto an idle GPU would only move the use). Of the nodes that qualify
    the one whose GPU keeps the least free compute is taken (best fit by GPU, as the
    extender ranks DynamicMIG fits). Fenced GPUs (drains) get nothing (their devices
    are tainted); cordoned and tainted nodes, and nodes with a change in flight, take
    nothing. With a candidate source fenced too, the pending MIG pods take their fits
    first, in arrival order, then the source's pods, largest first.

    Only memory slices, compute and the layout rules are counted (the engines the driver
    also counts follow the profile for the profiles of a 7/8-slice part), so this is the
    allocator's choice for GPUs without device taints but those of drains and of
    ``steered`` (node, GPU, profile): steering's fences (``steer.py``), skipped."""

    def __init__(self, nodes: Sequence[NodeView], changing: frozenset[str],
                 fenced: set[GpuKey], pending: Sequence[MigPod],
                 steered: frozenset[Steer] = frozenset()) -> None:
        self._base: dict[str, list[tuple[int, str, tuple[MigSlot, ...], bool]]] = {}
        for n in nodes:
            if n.unschedulable or n.tainted or n.name in changing:
                continue
            rows = [(g.index, g.model, g.layout, bool(g.holders))
                    for g in sorted(n.gpus, key=lambda g: g.index)
                    # a whole GPU in use has no room
                    if g.dynamic and not (not g.mig_enabled and g.holders)]
            if rows:
                self._base[n.name] = rows
        self._fenced = set(fenced)
        self._taken: list[tuple[str, int, MigSlot]] = []  # moved pods of earlier drains
        self._pending = tuple(pending)
        self._steered = steered

    def _rows(self, source: GpuKey) -> dict[str, list[tuple[int, str, list[MigSlot], bool]]]:
        out = {}
        for n, rows in self._base.items():
            kept = [(i, m, list(lay), used) for i, m, lay, used in rows
                    if (n, i) not in self._fenced and (n, i) != source]
            for tn, ti, slot in self._taken:
                for i, _, lay, _ in kept:
                    if (tn, ti) == (n, i):
                        lay.append(slot)
            out[n] = kept
        return out

    def _place(self, rows: dict[str, list[tuple[int, str, list[MigSlot], bool]]],
               models: frozenset[str], profile: str) -> tuple[str, int, MigSlot] | None:
        best: tuple[tuple[int, str], str, int, list[MigSlot], MigSlot] | None = None
        for node, gpus in rows.items():
            for index, model, layout, used in gpus:
                if (models and model not in models) or (node, index, profile) in self._steered:
                    continue
                geom = get_model(model).mig
                if geom is None or not geom.has_profile(profile):
                    continue
                starts = free_starts(geom, layout, profile)
                if not starts:
                    continue
                if used or layout:  # the node's first fit is a GPU in use
                    slot = MigSlot(profile, starts[0])
                    compute, _ = used_slices(geom, [*layout, slot])
                    key = (geom.compute_slices - compute, node)
                    if best is None or key < best[0]:
                        best = (key, node, index, layout, slot)
                break  # the allocator stops at the node's first GPU with room
        if best is None:
            return None
        _, node, index, layout, slot = best
        layout.append(slot)
        return node, index, slot

    def take(self, source: GpuKey, model: str, profiles: Sequence[str],
             keep: Sequence[str] = ()) -> bool:
        """Whether, with ``source`` fenced, the pending pods and then every pod of
        ``profiles`` (the source's, on a GPU of ``model``) get instances on other GPUs in
        use, and after them one more pod of each profile of ``keep`` would too (each
        tried alone: room kept, not taken); if so the moved pods' room is taken and the
        source stays fenced, else nothing changes."""
        geom = get_model(model).mig
        if geom is None:
            return False
        rows = self._rows(source)
        for pod in self._pending:
            self._place(rows, pod.models, pod.profile)
        placed = []
        for p in sorted(profiles, key=lambda p: -geom.profile(p).compute_slices):
            got = self._place(rows, frozenset({model}), p)
            if got is None:
                return False
            placed.append(got)
        for p in keep:
            trial = {n: [(i, m, list(lay), used) for i, m, lay, used in gpus]
                     for n, gpus in rows.items()}
            if self._place(trial, frozenset({model}), p) is None:
                return False
        self._taken += placed
        self._fenced.add(source)
        return True


def _profiles_in_use(tenants: Iterable[Tenant], gpus: Mapping[GpuKey, GpuView]
                     ) -> dict[str, tuple[str, ...]]:
    """Per GPU model, the MIG profiles its tenants hold (sorted)."""
    out: dict[str, set[str]] = defaultdict(set)
    for t in tenants:
        g = gpus.get((t.node, t.gpu))
        if g is not None:
            out[g.model].add(t.profile)
    return {m: tuple(sorted(ps)) for m, ps in out.items()}


def _excess(nodes: Sequence[NodeView], by_gpu: Mapping[GpuKey, list[Tenant]]
            ) -> dict[str, int]:
    """Per GPU model: MIG GPUs holding a pod minus the slice bound of those pods
    (:func:`packing.mig.layout.slice_bound`): how many GPUs perfect packing would free."""
    used: Counter[str] = Counter()
    slices: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for n in nodes:
        for g in n.gpus:
            pods = by_gpu.get((n.name, g.index))
            geom = get_model(g.model).mig if g.mig_enabled and pods else None
            if geom is None or not pods:
                continue
            used[g.model] += 1
            for t in pods:
                p = geom.profile(t.profile)
                slices[g.model][0] += p.compute_slices
                slices[g.model][1] += p.memory_slices
    out = {}
    for m, k in used.items():
        geom = get_model(m).mig
        assert geom is not None
        out[m] = k - slice_bound(geom, *slices[m])
    return out


def _candidates(state: CompactState, by_gpu: Mapping[GpuKey, list[Tenant]], now: float,
                s: CompactSettings, cooldown: Mapping[GpuKey, float], draining: set[GpuKey],
                busy_models: set[str]) -> list[tuple[str, GpuView, list[Tenant]]]:
    """Source GPUs, best first (fewest pods, fewest memory slices in use, name, index)."""
    out: list[tuple[tuple[int, int, str, int], str, GpuView, list[Tenant]]] = []
    for n in state.nodes:
        if not _eligible(n, state.changing):
            continue
        for g in n.gpus:
            k = (n.name, g.index)
            if (not g.mig_enabled or k in draining or k in cooldown
                    or g.model in busy_models or not g.holders):
                continue
            pods = sorted(by_gpu.get(k, ()), key=lambda t: t.key)
            if (not pods or len(pods) > s.most_pods(g) or set(g.holders) != {t.key for t in pods}
                    or any(not t.movable or now - t.since < s.least_age(g) for t in pods)):
                continue
            geom = get_model(g.model).mig
            used = (sum(geom.profile(t.profile).memory_slices for t in pods)
                    if geom is not None else 0)
            out.append(((len(pods), used, n.name, g.index), n.name, g, pods))
    out.sort(key=lambda c: c[0])
    return [(node, g, pods) for _, node, g, pods in out]


__all__ = ["DEFAULT_COMPACT", "DRAIN_PREFIX", "FENCE_SETTLE_S", "CompactDecision",
           "CompactSettings", "CompactState", "Drain", "DrainEnd", "DynamicRoom", "Tenant",
           "decide_compaction", "drain_holds", "fence_seen", "fences_up_since",
           "keeps_mig_mode"]
