"""MIG partitioning policies on a speech-era stream of arrivals and departures (issue 19,
item 4): GPUs in use against the slice lower bound, waiting pods, waits, reconfigurations.

    python bench/mig.py [--nodes 16] [--hours 8] [--rate 200] [--seed 1] [--format json]

The cluster: ``--nodes`` nodes of ``--gpus-per-node`` GPUs, H100-80GB and A100-80GB
alternating (the two share the profile names 1g.10gb, 2g.20gb, 3g.40gb). The stream:
Poisson arrivals at ``--rate`` pods/h, modulated by ``1 + swing * sin(2 pi t / period)``
(a day's curve; ``--swing``, ``--period-h``, default one period per run), seeded and
deterministic. Each pod is one of (share of arrivals, mean run time, exponential):

    asr    MIG 1g.10gb   55%  30 min
    tts    MIG 2g.20gb   30%  30 min
    mid    MIG 3g.40gb   10%  60 min
    whole  1 whole GPU    5%  90 min

and is pinned to one GPU model (a node selector), drawn by the model's share of GPUs.
A pod's run time counts from when it starts, so a pod that waits also leaves later.

Policies (each replays the same stream on its own copy of the cluster):

- ``static``: mig-parted's ``all-balanced`` layout (1g x2, 2g x1, 3g x1 per GPU) on every
  GPU except the whole GPUs the stream's whole pods need at the peak (expected peak
  concurrency + 3 standard deviations, per model; a per-device mig-parted entry), never
  changed. Pods go on existing slices by gpupack's own scorer, so only the layout policy
  differs from gpupack.
- ``static-default``: the same layouts, placed as a cluster without gpupack places pods:
  kube-scheduler's default scoring (``LeastAllocated`` over CPU and memory, which the
  pods ask in proportion to their GPU share; ties at random) picks the node, and the
  kubelet any free device of the pod's resource there (the NVIDIA device plugin has no
  preference among MIG devices). What a platform team running ``all-balanced`` has
  today; ``static`` isolates the layout policy, this one is the whole difference.
- ``first-fit``: what the NVIDIA DRA driver's DynamicMIG does: each MIG pod gets a new
  instance on the first GPU (node, then index order) where the geometry has room for it
  (MIG switched on for an idle whole GPU), at the first free allowed start; the instance
  is destroyed when its pod ends, and an empty GPU goes back to whole. Creating an
  instance takes ``--create-delay`` seconds (other instances keep running). Whole pods
  take the first idle whole GPU.
- ``gpupack``: the code that ships. Pods are placed only on slices that exist (what
  kube-scheduler's resource fit allows) by the extender's scorer
  (``packing.policies.gpupack.make_gpupack_scorer``, refreshed from a snapshot every
  ``--scorer-refresh`` s as the planner does). Every ``--tick`` seconds (the extender's
  poll) the MIG actuator's own decision, ``scheduler.mig.decide.decide_mig`` with the
  shipped default ``Settings`` and the planner's default solver parameters, runs over an
  ``ActuatorState`` built from the simulated cluster as ``scheduler/mig/loop.py`` builds
  it from the cache (every node opted in; GPUs with their holders; the changes in flight;
  pending MIG pods with their arrival, pending whole pods; back-off; when each MIG GPU
  became idle; the unmet arrivals its forecast decays), and the decision is applied as the
  handler applies it: holds taken (a whole GPU whole, a MIG GPU's free instances; every
  GPU of the node for a change of MIG mode) and given back, the change kept in flight,
  the node's config label set ``--config-propagation`` seconds after its entry (the
  extender's ``--mig-config-propagation``: the kubelet's copy of the ConfigMap lags) and
  its state label cleared. The MIG manager is modelled as
  ``tests/e2e/mig_manager_double.py``: after ``--reconfig-delay`` seconds it applies the
  node's mig-parted entry (a GPU whose config already matches is left alone; instances
  placed by ``packing.mig.layout.layout_from_counts``; a change of MIG mode needs every GPU of
  the node idle, as mig-parted's mode step clears them all) and reports ``success``;
  the next decision ends the change (a Finish) and releases the holds. Everything the
  actuator rules (settle time for bursts, min idle before a MIG GPU changes, one node
  per model in flight, the reverse direction to whole GPUs) is its own;
  the bench adds no forecast or rule of its own. A decision that would touch a busy GPU,
  start a second change of a model in flight, or a change that ends otherwise than
  ``success`` counts as ``invalid``.
- ``gpupack-compact``: the same, with ``--mig-compact`` (off in the product's default):
  after the actuator's decision, compaction's own
  (``scheduler.mig.compact.decide.decide_compaction``, the shipped default ``CompactSettings`` or
  the ``--compact-*`` flags, which are the extender's ``--mig-compact-*``) over the same
  gathered nodes, applied as ``scheduler/mig/compact/loop.py`` applies it: drain holds
  taken and given back, evictions accepted (no PodDisruptionBudget here), the evicted pod
  gone ``--evict-grace`` s later (its slice held for the drain in the same step), its
  replacement pending from the eviction (a Deployment makes it at once) with the rest of
  the run time, placed like any pod.
- ``gpupack-bestfit`` (diagnostic, not in the default list): the gpupack planner, pods
  placed by plain best fit instead of the extender's scorer.

Every placement any policy makes is checked with ``packing.validate.validate`` on the
node it lands on (the node's MIG layouts and running pods replayed, then the new one),
and every layout a policy creates with ``packing.mig.layout.layout_errors``; any error is counted
in ``invalid`` and makes the run exit 2.

Figures, time-averaged after ``--warmup-h`` (the cluster starts empty), to the end:
  gpus_used        GPUs holding a pod or being reconfigured (an empty MIG GPU is not used)
  lower_bound      sum over models of max(ceil(compute slices / 7), ceil(memory slices /
                   8)) of the pods the policy runs (a whole pod counts 7 and 8)
  layout_bound     the lower bound with MIG's layout rules kept: the fewest valid layouts
                   (allowed starts, per-profile maxima) holding the running instances,
                   plus the whole GPUs, as if every pod could move at every instant
                   (``packing.mig.layout.fewest_layouts``); ratio_to_layout_bound = gpus_used / it
  demand_bound     the same over the pods running or waiting
  idle_slices_on_used  memory slices no pod holds on used MIG GPUs (free instances and
                   room without an instance): what keeps gpus_used above the bound
  pods_waiting     pods arrived and not started (time average); pods_waiting_end at the end
  wait_p50_s/p99_s arrival to start of the pods arrived after the warm-up (one still
                   waiting at the end counts its wait so far)
  reconfigs_per_h  GPU layout changes per hour: a GPU re-laid by the MIG manager
                   (gpupack), an instance created or destroyed (first-fit)
  naive_gpus       GPUs a naive placement of the same running pods takes (one whole GPU
                   per pod); naive_ratio = naive_gpus / gpus_used
  evictions_per_h  (gpupack-compact) pods moved per hour; move_gap_p99_s: from an evicted
                   pod gone to its replacement started (0: the replacement was placed while
                   the pod terminated)
  taint_rule_writes_per_h, taint_rules_peak  (gpupack-compact, dra-dynamic) the
                   DeviceTaintRules drains and steering create plus delete per hour after
                   the warm-up, and the most in force at once: their load on the API server
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from abc import ABC, abstractmethod
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpupack.compact_flags import add_compact_flags, compact_flag_error, compact_settings
from packing.catalog import get_model
from packing.cpsat import SolverParams
from packing.mig.layout import (
    MigSlot,
    fewest_layouts,
    free_starts,
    layout_errors,
    layout_from_counts,
    slice_bound,
)
from packing.mig.plan import DEFAULT_PARAMS, NodeChange
from packing.model import (
    GpuInfo,
    GpuMode,
    MigInstance,
    MigReconfigure,
    NodeInfo,
    Placement,
    PodRequest,
    RequestKind,
    Snapshot,
)
from packing.policies.gpupack import make_gpupack_scorer
from packing.policies.kube_default import least_requested
from packing.policies.scores import bestfit
from packing.scoring import Scorer, best_option
from packing.state import _VERSIONS, ClusterState, GpuState, NodeState
from packing.validate import validate
from scheduler.mig.changes import Backoff, Change
from scheduler.mig.compact.decide import (
    DEFAULT_COMPACT,
    DRAIN_PREFIX,
    CompactDecision,
    CompactSettings,
    CompactState,
    Drain,
    Tenant,
    decide_compaction,
)
from scheduler.mig.decide import (
    DEFAULT_SETTINGS,
    HOLD_PREFIX,
    ActuatorState,
    GpuView,
    Hold,
    MigPod,
    NodeView,
    WholePod,
    decide_mig,
    unmet_pods,
)

MODELS = ("H100-80GB", "A100-80GB")
T = TypeVar("T")
# How MIG slices are made: mig-parted through the GPU Operator's MIG manager (here), or
# the NVIDIA DRA driver's DynamicMIG, one instance per claim (bench/mig_dra.py).
PROTOCOLS = ("mig-manager", "dra-dynamic")


@dataclass(frozen=True)
class PodClass:
    name: str
    profile: str | None  # None: one whole GPU
    share: float
    mean_min: float


CLASSES = (
    PodClass("asr", "1g.10gb", 0.55, 30.0),
    PodClass("tts", "2g.20gb", 0.30, 30.0),
    PodClass("mid", "3g.40gb", 0.10, 60.0),
    PodClass("whole", None, 0.05, 90.0),
)
ALL_BALANCED = (("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1))  # mig-parted, 80GB parts


@dataclass
class Pod:
    req: PodRequest
    model: str
    cls: str
    arrival: float
    duration: float
    start: float | None = None
    placement: Placement | None = None
    evicted: bool = False  # moved by compaction: its replacement runs the rest

    @property
    def profile(self) -> str | None:
        return self.req.mig_profile


# ---- the stream ---------------------------------------------------------------------------


def rate_at(t: float, rate: float, swing: float, period_s: float) -> float:
    return rate / 3600 * (1 + swing * math.sin(2 * math.pi * t / period_s))


def make_stream(nodes: Sequence[NodeInfo], hours: float, rate: float, swing: float,
                period_h: float, seed: int) -> list[Pod]:
    """Seeded arrivals (thinned Poisson) with their class, model and run time."""
    rng = random.Random(seed)
    gpus = Counter(g.model for n in nodes for g in n.gpus)
    models = sorted(gpus)
    horizon, period_s = hours * 3600, period_h * 3600
    peak = rate / 3600 * (1 + abs(swing))
    pods: list[Pod] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= horizon:
            return pods
        if rng.random() * peak > rate_at(t, rate, swing, period_s):
            continue
        cls = rng.choices(CLASSES, weights=[c.share for c in CLASSES])[0]
        model = rng.choices(models, weights=[gpus[m] for m in models])[0]
        duration = rng.expovariate(1 / (cls.mean_min * 60))
        key = f"speech/{cls.name}-{len(pods)}"
        if cls.profile is None:
            req = PodRequest(key, kind=RequestKind.WHOLE, gpu_count=1,
                             gpu_models=frozenset({model}), klass=cls.name)
        else:
            req = PodRequest(key, kind=RequestKind.MIG, mig_profile=cls.profile,
                             gpu_models=frozenset({model}), klass=cls.name)
        pods.append(Pod(req, model, cls.name, t, duration))


def make_nodes(n: int, gpus_per_node: int) -> tuple[NodeInfo, ...]:
    out = []
    for i in range(n):
        model = MODELS[i % len(MODELS)]
        mib = get_model(model).memory_mib
        gpus = tuple(GpuInfo(j, model, mib) for j in range(gpus_per_node))
        out.append(NodeInfo(f"{model.split('-')[0].lower()}-{i:03d}", 256_000, 2_048_000, gpus))
    return tuple(out)


def static_whole_gpus(nodes: Sequence[NodeInfo], rate: float, swing: float) -> dict[str, int]:
    """Whole GPUs per model a static split keeps for whole pods: the expected number of
    whole pods at the peak rate (Little's law) plus three standard deviations (Poisson)."""
    gpus = Counter(g.model for n in nodes for g in n.gpus)
    total = sum(gpus.values())
    whole = next(c for c in CLASSES if c.profile is None)
    out = {}
    for m, k in gpus.items():
        mean = rate * (1 + abs(swing)) * whole.share * whole.mean_min / 60 * k / total
        out[m] = min(k, math.ceil(mean + 3 * math.sqrt(mean)))
    return out


# ---- metrics ------------------------------------------------------------------------------


def slices_of(pod: Pod) -> tuple[int, int]:
    """(compute, memory) slices a pod takes on its model's 7/8-slice geometry."""
    geom = get_model(pod.model).mig
    assert geom is not None
    if pod.profile is None:
        return geom.compute_slices * pod.req.gpu_count, geom.memory_slices * pod.req.gpu_count
    p = geom.profile(pod.profile)
    return p.compute_slices, p.memory_slices


def bound(slices: dict[str, list[int]]) -> int:
    out = 0
    for m, (c, mem) in slices.items():
        geom = get_model(m).mig
        assert geom is not None
        out += slice_bound(geom, c, mem)
    return out


def layout_bound(instances: dict[str, Counter[str | None]]) -> int:
    """``bound`` with MIG's layout rules kept: whole GPUs plus the fewest valid layouts
    that hold the running instances (``packing.mig.layout.fewest_layouts``), per model."""
    out = 0
    for m, held in instances.items():
        geom = get_model(m).mig
        assert geom is not None
        out += held[None] + len(fewest_layouts(
            geom, {p: c for p, c in held.items() if p is not None and c > 0}))
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


# ---- the simulation -----------------------------------------------------------------------


@dataclass
class Args:
    hours: float
    warmup_h: float
    reconfig_delay: float
    create_delay: float
    tick: float
    scorer_refresh: float
    params: SolverParams
    evict_grace: float = 10.0
    config_propagation: float = DEFAULT_SETTINGS.config_propagation_s
    compact: CompactSettings = DEFAULT_COMPACT
    validate_every: int = 1


@dataclass
class Totals:
    gpus: float = 0.0
    bound: float = 0.0
    layout_bound: float = 0.0
    demand_bound: float = 0.0
    naive: float = 0.0
    idle_slices: float = 0.0
    span: float = 0.0


@dataclass(order=True)
class Event:
    t: float
    seq: int
    kind: str = field(compare=False)
    data: object = field(compare=False, default=None)


class Sim(ABC):
    """The shared event loop; policies say where a pod goes and what happens around it."""

    name = "base"

    def __init__(self, nodes: Sequence[NodeInfo], pods: Sequence[Pod], args: Args) -> None:
        self.args = args
        self.state = ClusterState(Snapshot(nodes=tuple(nodes)))
        self.pods = [replace(p) for p in pods]
        self.by_key = {p.req.key: p for p in self.pods}
        self.pending: dict[str, Pod] = {}  # arrival order
        self.running: dict[str, Pod] = {}
        self.events: list[Event] = []
        self._seq = 0
        self.now = 0.0
        self.totals = Totals()
        self.run_slices: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.wait_slices: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        # Running instances per model and profile (None: whole GPUs), for layout_bound.
        self.run_instances: dict[str, Counter[str | None]] = defaultdict(Counter)
        self.reconfigs = 0
        self.invalid: list[str] = []
        self.placed = 0
        self.validated = 0
        self.horizon = args.hours * 3600
        self.warmup = args.warmup_h * 3600

    # -- events --------------------------------------------------------------------------

    def push(self, t: float, kind: str, data: object = None) -> None:
        self._seq += 1
        heapq.heappush(self.events, Event(t, self._seq, kind, data))

    def run(self) -> dict[str, object]:
        started = time.monotonic()
        for p in self.pods:
            self.push(p.arrival, "arrival", p)
        self.setup()
        while self.events and self.events[0].t <= self.horizon:
            ev = heapq.heappop(self.events)
            self.advance(ev.t)
            if ev.kind == "arrival":
                assert isinstance(ev.data, Pod)
                self.arrive(ev.data)
            elif ev.kind == "departure":
                assert isinstance(ev.data, Pod)
                self.depart(ev.data)
            else:
                self.handle(ev)
        self.advance(self.horizon)
        return self.report(time.monotonic() - started)

    def setup(self) -> None:  # noqa: B027 (an optional hook: nothing by default)
        """Initial layouts and recurring events."""

    def handle(self, ev: Event) -> None:
        raise ValueError(f"{self.name}: unknown event {ev.kind}")

    def advance(self, t: float) -> None:
        lo = max(self.now, self.warmup)
        if t > lo:
            dt = t - lo
            tot = self.totals
            tot.span += dt
            used, idle = self.gpus_used()
            tot.gpus += dt * used
            tot.idle_slices += dt * idle
            tot.bound += dt * bound(self.run_slices)
            tot.layout_bound += dt * layout_bound(self.run_instances)
            both = {m: [self.run_slices[m][i] + self.wait_slices[m][i] for i in (0, 1)]
                    for m in set(self.run_slices) | set(self.wait_slices)}
            tot.demand_bound += dt * bound(both)
            tot.naive += dt * sum(p.req.gpu_count if p.profile is None else 1
                                  for p in self.running.values())
        self.now = max(self.now, t)

    def gpus_used(self) -> tuple[int, int]:
        """GPUs holding a pod (or being changed), and the memory slices no pod holds on
        those of them in MIG mode (free instances and unpartitioned room)."""
        used = idle = 0
        for n in self.state.nodes.values():
            for g in n.gpus:
                if g.whole_owner is not None:
                    used += 1
                    continue
                owned = [p for p, o in g.instances.values()
                         if o is not None and not o.startswith(HOLD_PREFIX)]
                if any(o is not None for _, o in g.instances.values()):
                    used += 1
                    geom = get_model(g.info.model).mig
                    assert geom is not None
                    idle += geom.memory_slices - sum(geom.profile(p).memory_slices
                                                     for p in owned)
        return used, idle

    # -- pods ----------------------------------------------------------------------------

    def arrive(self, pod: Pod) -> None:
        self.pending[pod.req.key] = pod
        self._count(self.wait_slices, pod, +1)
        # Nothing was freed: only the new pod can find room.
        self.schedule([pod])

    def depart(self, pod: Pod) -> None:
        if pod.evicted:
            return  # its "gone" event ended it; the replacement runs the rest
        assert pod.placement is not None
        self.state.undo(pod.req, pod.placement)
        del self.running[pod.req.key]
        self._count(self.run_slices, pod, -1)
        self.freed(pod)
        self.schedule()

    def freed(self, pod: Pod) -> None:  # noqa: B027 (an optional hook: nothing by default)
        """After a pod's resources were given back."""

    @abstractmethod
    def schedule(self, pods: Sequence[Pod] | None = None) -> None:
        """Start what waits (``pods``: only these), in arrival order, as the
        protocol places pods: through the device plugin (:class:`DevicePluginSim`) or
        DRA's allocator (``bench/mig_dra.py``)."""

    def _count(self, table: dict[str, list[int]], pod: Pod, sign: int) -> None:
        c, m = slices_of(pod)
        table[pod.model][0] += sign * c
        table[pod.model][1] += sign * m
        if table is self.run_slices:
            self.run_instances[pod.model][pod.profile] += sign * (
                pod.req.gpu_count if pod.profile is None else 1)

    # -- checks --------------------------------------------------------------------------

    def check_layout(self, node: str, g: GpuState) -> None:
        geom = get_model(g.info.model).mig
        assert geom is not None
        self.invalid.extend(f"{self.name} {node} GPU {g.info.index}: {e}"
                            for e in layout_errors(geom, g.mig_slots()))

    # -- layout changes (the node agent's view changes; bump the version scorers memo on) --

    def set_layout(self, node: str, g: GpuState, mode: GpuMode, slots: Sequence[MigSlot]) -> None:
        g.info = replace(g.info, mode=mode)
        g.instances = {s.start: (s.profile, None) for s in slots}
        self.state.nodes[node].version = next(_VERSIONS)
        if mode is GpuMode.MIG:
            self.check_layout(node, g)

    # -- report --------------------------------------------------------------------------

    def report(self, wall: float) -> dict[str, object]:
        tot = self.totals
        span = tot.span or 1.0
        measured = [p for p in self.pods if p.arrival >= self.warmup]
        waits = [(p.start if p.start is not None and p.start <= self.horizon else self.horizon)
                 - p.arrival for p in measured]
        hours = max(self.horizon - self.warmup, 1.0) / 3600
        # Waiting: arrived and not started (a slice being created counts), time-averaged.
        waiting = sum(max(0.0, min(self.horizon if p.start is None else p.start, self.horizon)
                          - max(p.arrival, self.warmup)) for p in self.pods)
        at_end = sum(1 for p in self.pods if p.start is None or p.start > self.horizon)
        gpus = tot.gpus / span
        lb = tot.bound / span
        naive = tot.naive / span
        return {
            "gpus_used": round(gpus, 2),
            "lower_bound": round(lb, 2),
            "layout_bound": round(tot.layout_bound / span, 2),
            "ratio_to_layout_bound": (round(gpus / (tot.layout_bound / span), 3)
                                      if tot.layout_bound else None),
            "ratio_to_bound": round(gpus / lb, 3) if lb else None,
            "demand_bound": round(tot.demand_bound / span, 2),
            "idle_slices_on_used": round(tot.idle_slices / span, 2),
            "pods_waiting": round(waiting / span, 2),
            "pods_waiting_end": at_end,
            "wait_p50_s": round(percentile(waits, 50), 1),
            "wait_p99_s": round(percentile(waits, 99), 1),
            "wait_max_s": round(max(waits, default=0.0), 1),
            "reconfigs_per_h": round(self.reconfigs_in_window / hours, 1),
            "arrived": len(self.pods),
            "placed": self.placed,
            "validated": self.validated,
            "invalid": len(self.invalid),
            "naive_gpus": round(naive, 2),
            "naive_ratio": round(naive / gpus, 3) if gpus else None,
            "wall_s": round(wall, 1),
        }

    reconfigs_in_window = 0

    def count_reconfig(self, n: int = 1) -> None:
        self.reconfigs += n
        if self.now >= self.warmup:
            self.reconfigs_in_window += n


class DevicePluginSim(Sim):
    """Pods placed as the device plugin serves them: the policy's :meth:`place`, then
    the bind, each placement checked by the shared validator."""

    def schedule(self, pods: Sequence[Pod] | None = None) -> None:
        """Place what waits, in arrival order (kube-scheduler retries its queue when
        something is freed or created)."""
        for pod in list(self.pending.values()) if pods is None else pods:
            p = self.place(pod)
            if p is not None:
                self.bind(pod, p, self.start_delay(p))

    @abstractmethod
    def place(self, pod: Pod) -> Placement | None:
        """Where the policy puts ``pod`` now (None: it waits)."""

    def start_delay(self, p: Placement) -> float:
        return 0.0

    def bind(self, pod: Pod, p: Placement, delay: float) -> None:
        self.check_placement(pod, p)
        self.state.apply(pod.req, p)
        del self.pending[pod.req.key]
        self._count(self.wait_slices, pod, -1)
        self.running[pod.req.key] = pod
        self._count(self.run_slices, pod, +1)
        pod.placement = p
        pod.start = self.now + delay
        self.placed += 1
        self.push(pod.start + pod.duration, "departure", pod)

    # -- checks --------------------------------------------------------------------------

    def check_placement(self, pod: Pod, p: Placement) -> None:
        """The shared validator on the node the pod lands on."""
        self.validated += 1
        node = self.state.nodes[p.node]
        snap = Snapshot(nodes=(node_info(node),),
                        running=tuple((self.by_key[k].req, q) for k, q in node.pods.items()),
                        pending=(pod.req,))
        errors = validate(snap, [p])
        if pod.req.gpu_models and any(node_gpu(node, i).info.model not in pod.req.gpu_models
                                      for i in p.gpus):
            errors.append(f"{pod.req.key}: on a GPU model it does not allow")
        self.invalid.extend(f"{self.name}: {e}" for e in errors)


def node_gpu(node: NodeState, index: int) -> GpuState:
    return next(g for g in node.gpus if g.info.index == index)


def node_info(node: NodeState) -> NodeInfo:
    """The node as its agent reports it now: modes and MIG layouts (owners come from the
    running pods' placements)."""
    gpus = tuple(replace(g.info, mig=tuple(MigInstance(p, s) for s, (p, _) in
                                           sorted(g.instances.items())))
                 for g in node.gpus)
    return replace(node.info, gpus=gpus)


def snapshot_of(state: ClusterState, sim: Sim) -> Snapshot:
    running = tuple((sim.by_key[k].req, p) for n in state.nodes.values()
                    for k, p in n.pods.items())
    return Snapshot(nodes=tuple(node_info(n) for n in state.nodes.values()), running=running,
                    pending=tuple(p.req for p in sim.pending.values()))


class ScoredPlacement(DevicePluginSim):
    """Pods on existing slices and idle whole GPUs, best option by the extender's scorer."""

    def setup(self) -> None:
        super().setup()
        self._scorer: Scorer | None = None
        self._scorer_at = -math.inf

    def scorer(self) -> Scorer:
        if self._scorer is None or self.now - self._scorer_at >= self.args.scorer_refresh:
            self._scorer = make_gpupack_scorer(snapshot_of(self.state, self))
            self._scorer_at = self.now
        return self._scorer

    def place(self, pod: Pod) -> Placement | None:
        return best_option(self.state, pod.req, self.scorer())


class Static(ScoredPlacement):
    name = "static"

    def __init__(self, nodes: Sequence[NodeInfo], pods: Sequence[Pod], args: Args,
                 whole: dict[str, int]) -> None:
        super().__init__(nodes, pods, args)
        self.whole = whole

    def setup(self) -> None:
        super().setup()
        keep = dict(self.whole)
        # The whole GPUs are the last GPUs of each model's last nodes (a per-device
        # mig-parted entry); every other GPU is all-balanced.
        for node in reversed(list(self.state.nodes.values())):
            for g in reversed(node.gpus):
                m = g.info.model
                if keep.get(m, 0) > 0:
                    keep[m] -= 1
                    continue
                geom = get_model(m).mig
                assert geom is not None
                slots = layout_from_counts(geom, dict(ALL_BALANCED))
                assert slots is not None
                self.set_layout(node.info.name, g, GpuMode.MIG, slots)


def default_score(compute_slices: int, cpu_milli: int, memory_mib: int) -> int:
    """kube-scheduler's default score of a node whose pods, the new one included, hold
    ``compute_slices`` compute slices: NodeResourcesFit's ``LeastAllocated`` over the CPU
    and memory they ask in proportion (:class:`StaticDefault`'s docstring)."""
    return (least_requested(compute_slices * StaticDefault.CPU_PER_SLICE, cpu_milli)
            + least_requested(compute_slices * StaticDefault.MEM_PER_SLICE, memory_mib)) // 2


def top_scored(scored: Iterable[tuple[int, T]]) -> list[T]:
    """The items of the highest score, in their order (``selectHost`` picks among them)."""
    best: list[T] = []
    top = -1
    for score, item in scored:
        if score > top:
            top, best = score, [item]
        elif score == top:
            best.append(item)
    return best


class StaticDefault(Static):
    """The same static layouts placed as a cluster without gpupack places them.

    kube-scheduler's default profile keeps the nodes of the pod's GPU model that have a
    free device of its resource (``nvidia.com/mig-<profile>``, or ``nvidia.com/gpu`` on the
    whole GPUs) and scores them with NodeResourcesFit's ``LeastAllocated`` over CPU and
    memory: ``score = (capacity - requested) * 100 // capacity`` per resource, averaged
    (extended resources are not scored by default). NodeResourcesBalancedAllocation is
    constant here, since every pod asks CPU and memory in the node's own proportion
    (``CPU_PER_SLICE`` and ``MEM_PER_SLICE`` per compute slice of its profile, a whole GPU
    seven), so the fractions of both in use are equal. Among the best-scored nodes it
    picks one at random (its ``selectHost``). The kubelet then takes the device the NVIDIA
    device plugin prefers: for MIG devices and single whole GPUs every candidate ties, so
    any free one (modelled at random). The score is
    ``packing.policies.kube_default``'s, the model the day replay of ``gpupack simulate``
    places plain kube-scheduler's pods with (there with the pods' own CPU and memory)."""

    name = "static-default"
    CPU_PER_SLICE = 4_000  # millicores a pod asks per compute slice of its GPU share
    MEM_PER_SLICE = 32_000  # MiB a pod asks per compute slice (the nodes' 8,000 per CPU)

    def setup(self) -> None:
        super().setup()
        # selectHost's and the kubelet's picks: seeded, so a run repeats.
        self.rng = random.Random(f"static-default:{self.args.params.seed}")

    def place(self, pod: Pod) -> Placement | None:
        best = top_scored(self._scored(pod))
        if not best:
            return None
        _, fits = self.rng.choice(best)
        return self.rng.choice(fits)

    def _scored(self, pod: Pod) -> Iterator[tuple[int, tuple[str, list[Placement]]]]:
        """Every node with a free device of the pod's resource, with its score."""
        for name, node in self.state.nodes.items():
            fits = [Placement(pod.req.key, name, (g.info.index,), pod.profile, start)
                    if pod.profile is not None else Placement(pod.req.key, name, (g.info.index,))
                    for g in node.gpus if g.info.model == pod.model
                    for start in self._free(g, pod.profile)]
            if not fits:
                continue
            slices = sum(slices_of(self.by_key[k])[0] for k in node.pods) + slices_of(pod)[0]
            yield default_score(slices, node.info.cpu_milli, node.info.memory_mib), (name, fits)

    @staticmethod
    def _free(g: GpuState, profile: str | None) -> list[int]:
        """Free devices of the resource on ``g``: the starts of its free instances of
        ``profile``, or ``[0]`` for an idle whole GPU asked for whole."""
        if profile is None:
            ok = g.info.mode is GpuMode.WHOLE and g.whole_owner is None and g.idle
            return [0] if ok else []
        if g.info.mode is not GpuMode.MIG:
            return []
        return [s for s, (p, o) in sorted(g.instances.items()) if p == profile and o is None]


class FirstFit(DevicePluginSim):
    name = "first-fit"

    def place(self, pod: Pod) -> Placement | None:
        for name, node in self.state.nodes.items():
            for g in node.gpus:
                if g.info.model != pod.model or g.whole_owner is not None:
                    continue
                if pod.profile is None:
                    if g.idle and g.info.mode is GpuMode.WHOLE:
                        return Placement(pod.req.key, name, (g.info.index,))
                    continue
                geom = get_model(g.info.model).mig
                assert geom is not None
                if g.info.mode is GpuMode.WHOLE and not g.idle:
                    continue
                starts = free_starts(geom, g.mig_slots(), pod.profile)
                if not starts:
                    continue
                # DynamicMIG creates the instance as the claim is prepared.
                slots = [*g.mig_slots(), MigSlot(pod.profile, starts[0])]
                owners = dict(g.instances)
                self.set_layout(name, g, GpuMode.MIG, slots)
                for s, (prof, o) in owners.items():
                    g.instances[s] = (prof, o)
                self.count_reconfig()
                return Placement(pod.req.key, name, (g.info.index,), pod.profile, starts[0])
        return None

    def start_delay(self, p: Placement) -> float:
        return self.args.create_delay if p.mig_profile is not None else 0.0

    def freed(self, pod: Pod) -> None:
        p = pod.placement
        assert p is not None
        if p.mig_profile is None:
            return
        g = self.state.gpu(p.node, p.gpus[0])
        slots = [s for s in g.mig_slots() if s.start != p.mig_start]
        owners = {s: v for s, v in g.instances.items() if s != p.mig_start}
        mode = GpuMode.MIG if slots else GpuMode.WHOLE
        self.set_layout(p.node, g, mode, slots)
        g.instances.update(owners)
        self.count_reconfig()


class Gpupack(ScoredPlacement):
    """What ships: pods on existing slices by the extender's scorer, and the MIG actuator's
    own decision (``scheduler.mig.decide.decide_mig``, default ``Settings``) every ``--tick``
    seconds over an ``ActuatorState`` built from the simulated cluster, applied as
    ``scheduler/mig/loop.py`` applies it; the MIG manager modelled as the e2e double."""

    name = "gpupack"

    def setup(self) -> None:
        super().setup()
        self.push(0.0, "tick")
        self.settings = replace(DEFAULT_SETTINGS,
                                config_propagation_s=self.args.config_propagation)
        self.changes: dict[str, Change] = {}  # node -> change in flight (the ConfigMap)
        self.entries: dict[str, NodeChange] = {}  # node -> the mig-parted entry asked for
        self.labels: dict[str, tuple[str | None, str | None]] = {}  # config, state labels
        self.backoff: dict[str, Backoff] = {}
        self.idle_since: dict[tuple[str, int], float] = {}
        self.seen: dict[str, tuple[float, str, frozenset[str]]] = {}  # unmet MIG arrivals
        self.held: dict[str, Hold] = {}  # the actuator's holds in the cache
        self.plan_calls = 0
        self.decide_calls = 0
        self.plan_s = 0.0
        self.plan_status: Counter[str] = Counter()
        self.results: Counter[str] = Counter()
        self.layouts: Counter[str] = Counter()  # target layouts asked for

    def handle(self, ev: Event) -> None:
        if ev.kind == "tick":
            self.step()
            self.push(self.now + self.args.tick, "tick")
        elif ev.kind == "done":
            assert isinstance(ev.data, tuple)
            self.mig_manager(*ev.data)
            self.step()  # the actuator sees the new layout: the holds end
            self.schedule()  # the new slices (or whole GPU) appear in allocatable
        else:
            super().handle(ev)

    # -- the actuator's input, as scheduler/mig/loop.py gathers it from the cache ----------

    def gather(self) -> ActuatorState:
        nodes = []
        for name, node in self.state.nodes.items():
            gpus = []
            for g in node.gpus:
                holders: set[str] = set(g.shared_owners)
                if g.whole_owner is not None:
                    holders.add(g.whole_owner)
                mig = g.info.mode is GpuMode.MIG
                layout, free = [], []
                for start, (profile, owner) in sorted(g.instances.items()):
                    if mig:
                        layout.append(MigSlot(profile, start))
                        if owner is None:
                            free.append(MigSlot(profile, start))
                    if owner is not None:
                        holders.add(owner)
                gpus.append(GpuView(g.info.index, g.info.model, mig, tuple(layout),
                                    tuple(free), frozenset(holders)))
            config, state = self.labels.get(name, (None, None))
            nodes.append(NodeView(name, MigReconfigure.ON, tuple(gpus), False, config, state))
        mig_pods, whole = [], []
        for pod in self.pending.values():
            if pod.profile is None:
                whole.append(WholePod(pod.req.key, pod.req.gpu_count, pod.req.gpu_models))
                continue
            # The extender wakes the actuator on every cache change (at most once a
            # second): it sees a pod pending about when it arrives.
            mig_pods.append(MigPod(pod.req.key, pod.profile, pod.req.gpu_models,
                                   pod.arrival))
        idle: dict[tuple[str, int], float] = {}
        for n in nodes:
            for gv in n.gpus:
                if gv.mig_enabled and not gv.busy:
                    idle[n.name, gv.index] = self.idle_since.get((n.name, gv.index), self.now)
        self.idle_since = idle
        base = ActuatorState(tuple(nodes), dict(self.changes), tuple(mig_pods), tuple(whole),
                             dict(self.backoff), dict(idle))
        # The forecast's arrivals: pods a step found unmet (as the handler records them).
        for key in unmet_pods(base):
            pod = self.pending[key]
            assert pod.profile is not None
            self.seen.setdefault(key, (pod.arrival, pod.profile, pod.req.gpu_models))
        horizon = self.now - 4 * self.settings.half_life_s
        self.seen = {k: a for k, a in self.seen.items() if a[0] >= horizon}
        return replace(base, arrivals=tuple(sorted(self.seen.values(), key=lambda a: a[0])))

    # -- one step: decide_mig and apply (scheduler/mig/loop.py's MigActuator.apply) -----------

    def step(self) -> None:
        state = self.gather()
        t0 = time.monotonic()
        d = decide_mig(state, self.now, self.settings, self.args.params)
        self.decide_calls += 1
        if d.plan_status not in ("not-run", "nothing-to-do", "settling", "no-candidate-gpu"):
            self.plan_calls += 1
            self.plan_s += time.monotonic() - t0
            self.plan_status[d.plan_status.split("/")[0]] += 1
        self.backoff = dict(d.backoff)
        started = {s.change.node for s in d.starts}
        self.sync_holds([h for h in d.holds if h.node not in started])
        for f in d.finishes:
            self.changes.pop(f.change.node, None)
            self.entries.pop(f.change.node, None)
            self.results[f.result] += 1
            if f.result != "success":
                self.invalid.append(f"gpupack: change on {f.change.node} ended "
                                    f"{f.result}: {f.message}")
        busy_models = {m for c in self.changes.values() for m in c.models}
        for s in d.starts:
            c = s.change
            if c.node in self.changes or busy_models & set(c.models):
                self.invalid.append(f"gpupack: a second change of {c.models} on {c.node} "
                                    "while one is in flight")
            busy_models.update(c.models)
            for h in (h for h in d.holds if h.node == c.node):
                self.take(h)
            self.changes[c.node] = c
            self.entries[c.node] = s.plan
            if c.labelled_at is not None:  # no wait for the entry to reach the manager
                self.label(c)
            self.count_reconfig(len(c.targets))
            for _, t in c.targets:
                self.layouts[t if isinstance(t, str)
                             else " ".join(f"{k}x{p}" for p, k in t)] += 1
        for c in d.labels:  # entries the MIG manager's file now holds
            self.changes[c.node] = c
            self.label(c)
        moved = self.compact(state)
        if d.starts or d.finishes or moved:
            self.schedule()

    def label(self, c: Change) -> None:
        """The node's config label set (a stale state label removed): the MIG manager
        starts, and is done ``--reconfig-delay`` s later."""
        self.labels[c.node] = (c.config, None)
        self.push(self.now + self.args.reconfig_delay, "done", (c.node, c.config))

    def compact(self, state: ActuatorState) -> bool:
        """Compaction's step (``--mig-compact``; off in the product's default)."""
        return False

    def take(self, h: Hold) -> None:
        """Hold a whole GPU or one free instance (under the cache lock in the product,
        where a hold that cannot be had cancels the start: here nothing races, so it
        would mean the decision touched a GPU someone holds)."""
        g = self.state.gpu(h.node, h.gpu)
        if h.key in self.held:
            return
        if h.start is None:
            if not g.idle or g.info.mode is GpuMode.MIG:
                self.invalid.append(f"gpupack: {h.key}: GPU not idle whole")
                return
            g.whole_owner = h.key
        else:
            inst = g.instances.get(h.start)
            if inst is None or inst[1] is not None:
                self.invalid.append(f"gpupack: {h.key}: instance not free")
                return
            g.instances[h.start] = (inst[0], h.key)
        self.held[h.key] = h
        self.state.nodes[h.node].version = next(_VERSIONS)

    def give_back(self, key: str) -> None:
        h = self.held.pop(key)
        g = self.state.gpu(h.node, h.gpu)
        if h.start is None:
            if g.whole_owner == key:
                g.whole_owner = None
        else:
            inst = g.instances.get(h.start)
            if inst is not None and inst[1] == key:
                g.instances[h.start] = (inst[0], None)
        self.state.nodes[h.node].version = next(_VERSIONS)

    def sync_holds(self, wanted: Sequence[Hold], prefix: str = HOLD_PREFIX) -> None:
        """Hold exactly ``wanted`` among the holds whose keys start with ``prefix`` (the
        actuator's changes and compaction's drains keep theirs apart)."""
        want = {h.key: h for h in wanted}
        for k in [k for k in self.held if k.startswith(prefix) and k not in want]:
            self.give_back(k)
        for h in want.values():
            self.take(h)

    # -- the MIG manager (tests/e2e/mig_manager_double.py) ----------------------------------

    def mig_manager(self, node: str, config: str) -> None:
        """After ``--reconfig-delay`` s: apply the node's mig-parted entry (a GPU whose
        config already matches is left alone, as mig-parted does) and report ``success``;
        a GPU to change that a pod uses makes the apply fail (state ``failed``, nothing
        changed), as the real manager fails on a busy instance, and so does any GPU of
        the node in use when a GPU's MIG mode changes (mig-parted's mode step clears
        every MIG GPU and may reset them all)."""
        entry = self.entries.get(node)
        if entry is None or entry.config_name != config:
            return
        todo: list[tuple[GpuState, dict[str, int] | None]] = []
        for dev in entry.devices:
            for i in dev.devices:
                g = self.state.gpu(node, i)
                have = ({p: k for p, k in Counter(p for p, _ in g.instances.values()).items()}
                        if g.info.mode is GpuMode.MIG else None)
                want = dict(dev.mig_devices) if dev.mig_enabled else None
                if have != want:
                    todo.append((g, want))
        # A change of MIG mode (mig-parted's mode step) clears every MIG GPU of the node
        # and may reset every GPU: all of them must be idle; otherwise only the GPUs
        # whose layout changes.
        mode_change = any((want is None) != (g.info.mode is not GpuMode.MIG)
                          for g, want in todo)
        touched = list(self.state.nodes[node].gpus) if mode_change else [g for g, _ in todo]
        for g in touched:
            owners = {g.whole_owner} | {o for _, o in g.instances.values()}
            if any(o is not None and not o.startswith(HOLD_PREFIX) for o in owners):
                self.invalid.append(f"gpupack: MIG manager met busy GPU {g.info.index} of "
                                    f"{node}: {config} failed")
                self.labels[node] = (config, "failed")
                return
        for g, want in todo:
            for k in [k for k, h in self.held.items() if h.node == node and h.gpu == g.info.index]:
                self.give_back(k)
            if want is None:
                self.set_layout(node, g, GpuMode.WHOLE, ())
                continue
            geom = get_model(g.info.model).mig
            assert geom is not None
            slots = layout_from_counts(geom, want)
            if slots is None:
                self.invalid.append(f"gpupack: {node} GPU {g.info.index}: no layout for {want}")
                continue
            self.set_layout(node, g, GpuMode.MIG, slots)
        self.labels[node] = (config, "success")

    def report(self, wall: float) -> dict[str, object]:
        out = super().report(wall)
        out["decide_calls"] = self.decide_calls
        out["plan_calls"] = self.plan_calls
        out["plan_s_mean"] = round(self.plan_s / self.plan_calls, 3) if self.plan_calls else 0
        out["plan_status"] = dict(sorted(self.plan_status.items()))
        out["changes_ended"] = dict(sorted(self.results.items()))
        out["layouts_asked"] = dict(self.layouts.most_common(8))
        return out


class GpupackCompact(Gpupack):
    """gpupack with ``--mig-compact``: after the actuator's decision, compaction's own
    (``scheduler.mig.compact.decide.decide_compaction``, default ``CompactSettings``) over the same
    gathered nodes, applied as ``scheduler/mig/loop.py`` applies it: drain holds taken and
    given back, evictions accepted (no PodDisruptionBudget here), the evicted pod gone
    ``--evict-grace`` s later (its instance held for the drain in the same step, the
    cache's on_pod_gone), its replacement pending from the eviction (a Deployment makes it
    at once) with the rest of the run time."""

    name = "gpupack-compact"

    def setup(self) -> None:
        super().setup()
        self.compact_settings = self.args.compact
        self.drains: dict[tuple[str, int], Drain] = {}
        self.evicted_at: list[float] = []  # the last hour's (pruned as the handler does)
        self.evicted_at_all: list[float] = []
        self.cooldown: dict[tuple[str, int], float] = {}
        self.drain_results: Counter[str] = Counter()
        self.moves: list[tuple[float, Pod]] = []  # (original gone at, replacement)
        self.gone_at: dict[str, float] = {}  # replacement key -> when its original went

    def compact(self, state: ActuatorState) -> bool:
        tenants = {}
        for pod in self.running.values():
            p = pod.placement
            if p is None or p.mig_profile is None or pod.evicted:
                continue
            assert pod.start is not None
            tenants[pod.req.key] = Tenant(pod.req.key, p.node, p.gpus[0], p.mig_profile,
                                          pod.start, True)
        self.evicted_at = [t for t in self.evicted_at if self.now - t < 3600]
        cs = CompactState(state.nodes, tenants, tuple(self.drains.values()),
                          state.mig_pods, frozenset(self.changes), tuple(self.evicted_at),
                          dict(self.cooldown))
        d = decide_compaction(cs, self.now, self.compact_settings)
        keep_drains(self, d)
        self.sync_holds(d.holds, DRAIN_PREFIX)
        for dr, key in d.evict:
            self.evict(self.drains[dr.gpu_key], key)
        return bool(d.ends or d.evict)

    def evict(self, dr: Drain, key: str) -> None:
        self.drains[dr.gpu_key] = replace(dr, evicted=dr.evicted | {key})
        evict_pod(self, self.running[key], len(self.moves) + 1)

    def handle(self, ev: Event) -> None:
        if ev.kind != "gone":
            super().handle(ev)
            return
        assert isinstance(ev.data, tuple)
        old, new = ev.data
        p = old.placement
        assert p is not None
        self.state.undo(old.req, p)
        del self.running[old.req.key]
        self._count(self.run_slices, old, -1)
        self.moves.append((self.now, new))
        # The cache's on_pod_gone: the drain holds the freed instance at once.
        dr = self.drains.get((p.node, p.gpus[0]))
        if dr is not None and p.mig_start is not None:
            self.take(Hold(p.node, p.gpus[0], old.model, p.mig_profile, p.mig_start,
                           DRAIN_PREFIX))
        self.schedule()

    def report(self, wall: float) -> dict[str, object]:
        return {**super().report(wall), **move_figures(self)}

    moved_in_window = 0


def keep_drains(sim: GpupackCompact | Any, d: CompactDecision) -> None:
    """A compaction decision's bookkeeping, as ``scheduler/mig/compact/loop.py`` keeps it:
    the cool-downs, the drains ended (counted by result) and started."""
    sim.cooldown = dict(d.cooldown)
    for e in d.ends:
        sim.drains.pop(e.drain.gpu_key, None)
        sim.drain_results[e.result] += 1
    for dr in d.starts:
        sim.drains[dr.gpu_key] = dr


def evict_pod(sim: GpupackCompact | Any, old: Pod, number: int) -> Pod:
    """A drained pod evicted (accepted: no PodDisruptionBudget here): gone
    ``--evict-grace`` s later (a "gone" event), its replacement ``<key>~<number>``
    pending from now (a Deployment makes it at once) with the rest of its run time.
    ``sim`` keeps ``evicted_at``, ``evicted_at_all`` and ``moved_in_window``."""
    assert old.start is not None
    sim.evicted_at.append(sim.now)
    sim.evicted_at_all.append(sim.now)
    old.evicted = True
    if sim.now >= sim.warmup:
        sim.moved_in_window += 1
    rest = max(0.0, old.start + old.duration - sim.now)
    new = Pod(replace(old.req, key=f"{old.req.key}~{number}"), old.model, old.cls, sim.now,
              rest)
    sim.by_key[new.req.key] = new
    sim.pending[new.req.key] = new
    sim._count(sim.wait_slices, new, +1)
    sim.push(sim.now + sim.args.evict_grace, "gone", (old, new))
    return new


def move_figures(sim: GpupackCompact | Any) -> dict[str, object]:
    """Compaction's figures of a run: evictions (all, per hour after the warm-up), the
    move gap (evicted pod gone to replacement started), how drains ended."""
    hours = max(sim.horizon - sim.warmup, 1.0) / 3600
    gaps = [max(0.0, (new.start if new.start is not None else sim.horizon) - gone)
            for gone, new in sim.moves if gone >= sim.warmup]
    return {"evictions": len(sim.evicted_at_all),
            "evictions_per_h": round(sim.moved_in_window / hours, 1),
            "move_gap_p50_s": round(percentile(gaps, 50), 1),
            "move_gap_p99_s": round(percentile(gaps, 99), 1),
            "drains_ended": dict(sorted(sim.drain_results.items()))}


class GpupackBestfit(Gpupack):
    """A diagnostic, not the product: gpupack's planner with pods placed by plain best fit
    (``packing.policies.scores.bestfit``) instead of the extender's scorer."""

    name = "gpupack-bestfit"

    def place(self, pod: Pod) -> Placement | None:
        return best_option(self.state, pod.req, bestfit)


# ---- main ---------------------------------------------------------------------------------


POLICIES: dict[str, Callable[..., Sim]] = {
    "static": Static, "static-default": StaticDefault, "first-fit": FirstFit,
    "gpupack": Gpupack,
    "gpupack-compact": GpupackCompact, "gpupack-bestfit": GpupackBestfit}


def run_sim(sim: Sim) -> dict[str, object]:
    """A policy's figures, with its first invalid placements where there are any."""
    out = sim.run()
    if sim.invalid:
        out["invalid_examples"] = sim.invalid[:5]
    return out


def run_params(ns: Any, args: Args, period: float, arrivals: int,
               whole: dict[str, int]) -> dict[str, object]:
    """The ``params`` both protocols report (each adds its own delays)."""
    return {"protocol": ns.protocol, "nodes": ns.nodes, "gpus_per_node": ns.gpus_per_node,
            "hours": ns.hours, "rate_per_h": ns.rate, "swing": ns.swing, "period_h": period,
            "seed": ns.seed, "warmup_h": args.warmup_h, "create_delay_s": ns.create_delay,
            "tick_s": ns.tick, "arrivals": arrivals,
            "compact": {"evictions_per_hour": ns.compact_evictions_per_hour,
                        "min_age_s": ns.compact_min_age, "max_pods": ns.compact_max_pods,
                        "min_excess": ns.compact_min_excess, "evict_grace_s": ns.evict_grace,
                        "dynamic_min_excess": ns.compact_dynamic_min_excess,
                        "dynamic_evictions_per_hour": ns.compact_dynamic_evictions_per_hour,
                        "kept_mode_max_pods": ns.compact_kept_mode_max_pods,
                        "kept_mode_min_age_s": ns.compact_kept_mode_min_age,
                        "keep_room": ns.compact_keep_room,
                        "steer_margin": ns.compact_steer_margin,
                        "steer_keep": ns.compact_steer_keep},
            "static_whole_gpus": whole,
            "mix": {c.name: {"profile": c.profile or "whole", "share": c.share,
                             "mean_min": c.mean_min} for c in CLASSES}}


def run(ns: argparse.Namespace) -> dict[str, object]:
    nodes = make_nodes(ns.nodes, ns.gpus_per_node)
    period = ns.period_h or ns.hours
    pods = make_stream(nodes, ns.hours, ns.rate, ns.swing, period, ns.seed)
    args = Args(hours=ns.hours, warmup_h=min(ns.warmup_h, ns.hours / 2),
                reconfig_delay=ns.reconfig_delay, create_delay=ns.create_delay, tick=ns.tick,
                scorer_refresh=ns.scorer_refresh, evict_grace=ns.evict_grace,
                config_propagation=ns.config_propagation,
                compact=compact_settings(ns, "--compact-"),
                params=replace(DEFAULT_PARAMS, max_time_s=ns.solver_time, seed=ns.seed))
    whole = static_whole_gpus(nodes, ns.rate, ns.swing)
    results: dict[str, dict[str, object]] = {}
    for name in ns.policies:
        if name in ("static", "static-default"):
            sim: Sim = POLICIES[name](nodes, pods, args, whole)
        else:
            sim = POLICIES[name](nodes, pods, args)
        results[name] = run_sim(sim)
    params = {**run_params(ns, args, period, len(pods), whole),
              "reconfig_delay_s": ns.reconfig_delay,
              "config_propagation_s": ns.config_propagation,
              "solver_time_s": ns.solver_time}
    return {"params": params, "policies": results, "goals": goals(results)}


def goals(results: dict[str, dict[str, object]]) -> dict[str, object]:
    """The issue's goals for gpupack (the actuator alone) and gpupack-compact, each."""
    out: dict[str, object] = {}
    for name in ("gpupack", "gpupack-compact"):
        g = results.get(name)
        if g is not None:
            out[name] = goals_of(g, results)
    if out:
        # GPU counts compare only between policies that serve the stream alike.
        out["pods_waiting"] = {name: r["pods_waiting"] for name, r in results.items()}
    return out


def goals_of(g: dict[str, object], results: dict[str, dict[str, object]]
             ) -> dict[str, object]:
    out: dict[str, object] = {}
    ratio = g["ratio_to_bound"]
    if isinstance(ratio, float):
        out["gpupack_vs_bound"] = ratio
        out["within_1_05_of_bound"] = ratio <= 1.05
    # "static": the same layouts placed by gpupack's scorer (the layout policy alone);
    # "static-default": placed as kube-scheduler's defaults and the device plugin do.
    for base in ("static", "static-default"):
        s = results.get(base)
        if s is not None and isinstance(s["gpus_used"], float) and s["gpus_used"]:
            assert isinstance(g["gpus_used"], float)
            fewer = 1 - g["gpus_used"] / s["gpus_used"]
            suffix = base.replace("-", "_")
            out[f"fewer_gpus_than_{suffix}"] = round(fewer, 3)
            out[f"at_least_20pct_fewer_than_{suffix}"] = fewer >= 0.20
    f = results.get("first-fit")
    if f is not None:
        assert isinstance(g["pods_waiting"], float) and isinstance(f["pods_waiting"], float)
        out["fewer_waiting_than_first_fit"] = g["pods_waiting"] < f["pods_waiting"]
    out["naive_ratio"] = g["naive_ratio"]
    return out


COLUMNS = (("gpus_used", "GPUs"), ("lower_bound", "bound"), ("ratio_to_bound", "x bound"),
           ("idle_slices_on_used", "idle sl."), ("pods_waiting", "waiting"),
           ("pods_waiting_end", "wait@end"), ("wait_p50_s", "p50 s"), ("wait_p99_s", "p99 s"),
           ("reconfigs_per_h", "reconf/h"), ("evictions_per_h", "evict/h"),
           ("naive_ratio", "naive x"), ("invalid", "invalid"), ("wall_s", "wall s"))


def table(out: dict[str, object]) -> str:
    params = out["params"]
    assert isinstance(params, dict)
    lines = [f"{params['nodes']} nodes x {params['gpus_per_node']} GPUs, {params['hours']} h, "
             f"{params['rate_per_h']} pods/h (swing {params['swing']}), seed {params['seed']}, "
             f"{params['arrivals']} arrivals; figures after {params['warmup_h']} h warm-up"]
    lines.append(f"{'policy':<16}" + "".join(f"{h:>10}" for _, h in COLUMNS))
    pol = out["policies"]
    assert isinstance(pol, dict)
    for name, r in pol.items():
        lines.append(f"{name:<16}" + "".join(f"{r.get(k, '-')!s:>10}" for k, _ in COLUMNS))
    g = out.get("goals")
    if g:
        lines.append("goals: " + json.dumps(g))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--hours", type=float, default=8.0)
    ap.add_argument("--rate", type=float, default=200.0, help="mean arrivals per hour")
    ap.add_argument("--swing", type=float, default=0.5, help="rate amplitude, 0..1")
    ap.add_argument("--period-h", type=float, default=0.0,
                    help="period of the rate curve (0: the run's length)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup-h", type=float, default=1.0)
    ap.add_argument("--reconfig-delay", type=float, default=60.0,
                    help="seconds a GPU the MIG manager changes serves nothing (gpupack)")
    ap.add_argument("--config-propagation", type=float,
                    default=DEFAULT_SETTINGS.config_propagation_s,
                    help="seconds between a change's entry and its node label (gpupack: the "
                         "extender's --mig-config-propagation; the kubelet's copy of the "
                         "ConfigMap lags)")
    ap.add_argument("--protocol", choices=PROTOCOLS, default="mig-manager",
                    help="how MIG slices are made: the GPU Operator's MIG manager (this "
                         "script) or the NVIDIA DRA driver's DynamicMIG (bench/mig_dra.py)")
    ap.add_argument("--create-delay", type=float, default=5.0,
                    help="seconds DynamicMIG takes to create an instance (first-fit; "
                         "dra-dynamic)")
    ap.add_argument("--destroy-delay", type=float, default=5.0,
                    help="dra-dynamic: seconds an ended pod's instance takes to go (its "
                         "claim keeps its counters until then)")
    ap.add_argument("--mode-switch-delay", type=float, default=10.0,
                    help="dra-dynamic: seconds added to the first instance of a GPU whose "
                         "MIG mode it turns on")
    ap.add_argument("--tick", type=float, default=2.0,
                    help="seconds between the MIG actuator's decisions (gpupack; the "
                         "extender's poll)")
    ap.add_argument("--scorer-refresh", type=float, default=300.0)
    ap.add_argument("--evict-grace", type=float, default=10.0,
                    help="seconds an evicted pod keeps its slice (gpupack-compact)")
    ap.add_argument("--solver-time", type=float, default=DEFAULT_PARAMS.max_time_s,
                    help="the planner's deterministic time limit (product default)")
    add_compact_flags(ap, "--compact-", "gpupack-compact (the extender's --mig-compact-*): ")
    ap.add_argument("--policies", default="",
                    help="comma-separated (default: static,static-default,first-fit,"
                         "gpupack,gpupack-compact; with --protocol dra-dynamic: "
                         "static-default,dra-first-fit,gpupack,layout-bound)")
    ap.add_argument("--format", choices=("table", "json"), default="table")
    ns = ap.parse_args(argv)
    dra = None
    if ns.protocol == "dra-dynamic":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import mig_dra as dra  # the other protocol's module, on demand
    known = (list(POLICIES) if dra is None
             else [*dra.POLICIES, *dra.DRA_POLICIES])
    default = ("static,static-default,first-fit,gpupack,gpupack-compact" if dra is None
               else ",".join(dra.POLICIES))
    ns.policies = [p.strip() for p in (ns.policies or default).split(",") if p.strip()]
    for p in ns.policies:
        if p not in known:
            ap.error(f"--policies: unknown policy {p!r} for --protocol {ns.protocol}; "
                     f"known: {', '.join(dict.fromkeys(known))}")
    if not 0 <= ns.swing <= 1:
        ap.error(f"--swing {ns.swing}: must be within 0..1")
    if ns.nodes < 1 or ns.gpus_per_node < 1 or ns.hours <= 0 or ns.rate <= 0:
        ap.error("--nodes, --gpus-per-node, --hours and --rate must be positive")
    if ns.tick <= 0 or ns.solver_time <= 0 or ns.scorer_refresh <= 0:
        ap.error("--tick, --solver-time and --scorer-refresh must be positive")
    compact_error = compact_flag_error(ns, "--compact-")
    if compact_error is not None:
        ap.error(compact_error)
    if min(ns.reconfig_delay, ns.create_delay, ns.warmup_h,
           ns.config_propagation, ns.destroy_delay, ns.mode_switch_delay) < 0:
        ap.error("--reconfig-delay, --create-delay, --destroy-delay, --mode-switch-delay, "
                 "--warmup-h and --config-propagation must not be negative")
    out = run(ns) if dra is None else dra.run(ns)
    print(json.dumps(out, indent=2) if ns.format == "json" else table(out))
    pol = out["policies"]
    assert isinstance(pol, dict)
    return 2 if any(r["invalid"] for r in pol.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
