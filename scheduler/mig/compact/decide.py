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
  bound of their pods by at least ``min_excess`` GPUs.
* **pace**: one drain per GPU model at a time; a drain starts only when its evictions fit
  in ``evictions_per_hour`` (accepted evictions in the last hour plus those of drains in
  flight not yet done).
* **choice**: the GPU with the fewest pods, then the fewest memory slices in use, then
  node name and index (the same answer for the same input).
* **holds**: every free instance of a draining GPU is held (key prefix ``DRAIN_PREFIX``)
  so nothing, a replacement included, lands there; the handler also holds an instance
  the moment a drained pod goes (the cache's ``on_pod_gone`` hook), before any other pod
  is answered.
* **end**: ``emptied`` once none of the drain's pods is on the GPU; ``refilled`` when a
  pod not in the drain is on it (kube-scheduler counts MIG resources per node, and the
  kubelet may hand a replacement any free instance of its profile on the node);
  ``refused`` when the API refused an eviction (a PodDisruptionBudget: 429, or 403);
  ``timeout`` after ``drain_timeout_s``; ``gone`` when the GPU is gone or not in MIG
  mode. Every end but ``emptied`` cools the GPU down for ``cooldown_s``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kube.mig.compaction_memory import DEFAULT_COOLDOWN_S, DrainRecord
from packing.catalog import get_model
from packing.dra.inventory import TAINT_MARK
from packing.mig.layout import MigSlot, free_starts, slice_bound, used_slices
from packing.model import MigReconfigure
from scheduler.mig.decide import GpuView, Hold, MigPod, NodeView

DRAIN_PREFIX = "gpupack-mig-drain/"  # cache hold keys of drains (never a pod's key)
RESULTS = ("emptied", "refilled", "refused", "timeout", "gone")
HOUR_S = 3600.0

GpuKey = tuple[str, int]  # (node, GPU index)


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


DEFAULT_COMPACT = CompactSettings()


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
    budget = (s.evictions_per_hour - sum(1 for t in state.evictions if now - t < HOUR_S)
              - len(evict))
    busy_models = {d.model for d in live}
    draining = {d.gpu_key for d in live}
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
        room = DynamicRoom(state.nodes, state.changing, draining, state.pending)
        for cand in _candidates(state, by_gpu, now, s, cooldown, draining, busy_models):
            node, g, pods = cand
            if (g.model in busy_models or len(pods) > budget
                    or excess.get(g.model, 0) < s.min_excess):
                continue
            need = Counter(t.profile for t in pods)
            if g.dynamic:
                # Destinations: instances the allocator would create on other GPUs in use.
                if not room.take((node, g.index), g.model, [t.profile for t in pods]):
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
            budget -= len(pods)
            holds += drain_holds(d, g)
            evict += [(d, t.key) for t in pods]
    return CompactDecision(tuple(starts), tuple(ends), tuple(evict), tuple(holds), cooldown,
                           why, tuple(fences))


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
    allocator's choice for GPUs without device taints."""

    def __init__(self, nodes: Sequence[NodeView], changing: frozenset[str],
                 fenced: set[GpuKey], pending: Sequence[MigPod]) -> None:
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

    @staticmethod
    def _place(rows: dict[str, list[tuple[int, str, list[MigSlot], bool]]],
               models: frozenset[str], profile: str) -> tuple[str, int, MigSlot] | None:
        best: tuple[tuple[int, str], str, int, list[MigSlot], MigSlot] | None = None
        for node, gpus in rows.items():
            for index, model, layout, used in gpus:
                if models and model not in models:
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

    def take(self, source: GpuKey, model: str, profiles: Sequence[str]) -> bool:
        """Whether, with ``source`` fenced, the pending pods and then every pod of
        ``profiles`` (the source's, on a GPU of ``model``) get instances on other GPUs in
        use; if so the moved pods' room is taken and the source stays fenced, else
        nothing changes."""
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
        self._taken += placed
        self._fenced.add(source)
        return True


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
            if (not pods or len(pods) > s.max_pods or set(g.holders) != {t.key for t in pods}
                    or any(not t.movable or now - t.since < s.min_pod_age_s for t in pods)):
                continue
            geom = get_model(g.model).mig
            used = (sum(geom.profile(t.profile).memory_slices for t in pods)
                    if geom is not None else 0)
            out.append(((len(pods), used, n.name, g.index), n.name, g, pods))
    out.sort(key=lambda c: c[0])
    return [(node, g, pods) for _, node, g, pods in out]


__all__ = ["DEFAULT_COMPACT", "DRAIN_PREFIX", "CompactDecision", "CompactSettings",
           "CompactState", "Drain", "DrainEnd", "DynamicRoom", "Tenant", "decide_compaction",
           "drain_holds"]
