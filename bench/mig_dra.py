"""``bench/mig.py --protocol dra-dynamic``: the same speech stream (issue 34) where the
NVIDIA DRA driver's DynamicMIG makes MIG instances, one claim at a time, beside the
instances in use.

    python bench/mig.py --protocol dra-dynamic [--rate 200] [--seed 1] [--format json]

The cluster, the stream, the warm-up and the figures are ``bench/mig.py``'s (its
docstring); what changes is how a MIG pod gets its slice.

**DynamicMIG's rules, as modelled.** Every node publishes its GPUs as the driver does
with DynamicMIG on Kubernetes 1.35+ (``packing.dra.nvidia``, split layout): per GPU the
whole device ``gpu-<minor>`` and every MIG profile at every placement, all consuming the
GPU's counter set (a memory-slice counter each, the engines). A pod asks one device by a
claim (a MIG profile of ``mig.nvidia.com``, or a whole ``gpu.nvidia.com``), and
kube-scheduler's allocator gives it the first fitting device on the node chosen: that is
``packing.dra.allocator.predict`` (the model checked against kube-scheduler v1.37.2),
called here for every allocation of every policy. A placement is free when its counters
are: its memory slices and engines not consumed by an allocated claim.

* An instance is created when its claim is prepared: the pod starts ``--create-delay``
  seconds after its allocation (default 5 s), plus ``--mode-switch-delay`` (default
  10 s) when the instance turns its GPU's MIG mode on. Neither is measured here: both
  are parameters, and the sensitivity runs are in ``bench/README.md``.
* An instance is destroyed when its pod ends: the claim stays allocated (its counters
  consumed, the GPU counted in use) for ``--destroy-delay`` seconds (default 5 s), then
  is deallocated (the kubelet unprepares it before the claim's reservation goes).
* MIG mode: a GPU with no MIG device may switch. On a Hopper part the driver turns MIG on
  for the first instance and off after the last one; an Ampere part (the A100s) changes
  mode only with a reset, so once an instance turned it on it stays in MIG mode and its
  whole device is no longer published (a new generation of the node's slices), as the
  driver does for an A100 already in MIG mode. Every GPU starts with MIG off.
* A whole-GPU pod takes the first GPU whose whole device is published and none of whose
  counters is consumed.

**Policies.**

* ``gpupack``: what ships, end to end: the DRA participant's own answer per node
  (``scheduler.dra.decide.evaluate``: the allocator's predicted fit there, seen through
  ``packing.dra.inventory`` as the cache sees it, ranked by the fit's DynamicMIG key and
  the extender's scorer, ``make_gpupack_scorer`` refreshed every ``--scorer-refresh``
  s), the best node handed to kube-scheduler alone (as the participant's filter does),
  the allocator's first fit there.
* ``dra-first-fit``: plain kube-scheduler: the nodes where the allocator finds a device
  (the DynamicResources Filter), scored by its default profile (``LeastAllocated`` over
  CPU and memory, which each pod asks in proportion to its compute slices, as
  ``static-default`` models it; DynamicResources scores only ``firstAvailable``
  subrequests), ties at random, and the allocator's first fit there in the driver's
  device order.
* ``static-default``: ``bench/mig.py``'s (``all-balanced`` through the MIG manager and the
  device plugin, placed by plain kube-scheduler).
* ``layout-bound``: no policy: every pod runs from its arrival, and ``gpus_used`` is
  ``packing.mig.layout.fewest_layouts`` over the running instances plus the whole GPUs
  (time-averaged as the others); ``reconfigs_per_h`` is the least any DynamicMIG policy
  makes, one instance created and one destroyed per MIG pod.
* ``gpupack-scorer-only`` (diagnostic): gpupack with the fit's DynamicMIG key left out
  (the extender's scorer alone, as before issue 34).

Every allocation is checked: its devices' uses (``packing.dra.inventory.claim_uses``) must
fit the state (``ClusterState.check``) and leave the GPU a valid MIG layout
(``layout_errors``); an error counts in ``invalid``.

Figures are ``bench/mig.py``'s; ``reconfigs_per_h`` counts instances created and
destroyed (GPU MIG mode switches in ``mode_switches_per_h``).
"""

from __future__ import annotations

import math
import random
import time
from abc import abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mig as base  # bench/mig.py (this directory is on sys.path when it runs us)

from gpupack.compact_flags import compact_settings
from kube.mig.fences import TAINT_KEY, gpu_devices, mig_devices, rule_name
from packing.dra import nvidia
from packing.dra.allocator import AllocatedState, Prediction, Verdict, predict
from packing.dra.inventory import (
    TAINT_MARK,
    DraInventory,
    claim_uses,
    node_inventory,
    taint_uses,
    with_dra_gpus,
)
from packing.dra.objects import (
    AllocatedDevice,
    DeviceClass,
    DeviceRequest,
    DeviceTaintRule,
    Node,
    Request,
    ResourceClaim,
    ResourceSlice,
)
from packing.dra.parse import parse_device_class, parse_resource_slice
from packing.dra.pools import apply_taint_rules
from packing.dra.world import DraWorld
from packing.model import GpuMode, MigReconfigure, NodeInfo, Placement, PodRequest, Snapshot
from packing.policies.gpupack import make_gpupack_scorer
from packing.scoring import Scorer
from packing.state import ClusterState, NodeState
from packing.taints import Taint
from scheduler.dra.decide import NodeAnswer, evaluate
from scheduler.mig.compact.decide import (
    CompactState,
    Drain,
    Tenant,
    decide_compaction,
    fence_seen,
    fences_up_since,
)
from scheduler.mig.decide import MigPod, NodeView, gpu_view

HERE = Path(__file__).resolve().parent
PROFILE_SELECTOR = "device.attributes['gpu.nvidia.com'].profile == '{}'"
POLICIES = ("static-default", "dra-first-fit", "gpupack", "gpupack-compact", "layout-bound")
DIAGNOSTIC = ("gpupack-scorer-only",)


@dataclass(frozen=True)
class DraArgs:
    create_delay: float = 5.0
    destroy_delay: float = 5.0
    mode_switch_delay: float = 10.0


@dataclass
class DraNode:
    """One node as the API shows it: the driver's GPUs and slices, the claims allocated
    there (claim key -> its devices), a version bumped on every change."""

    name: str
    specs: list[nvidia.GpuSpec]
    slices: tuple[ResourceSlice, ...]
    generation: int = 1
    claims: dict[str, tuple[AllocatedDevice, ...]] = field(default_factory=dict)
    version: int = 0

    @property
    def model(self) -> str:
        return self.specs[0].model


def claim_for(pod: base.Pod) -> ResourceClaim:
    """The pod's claim: one MIG device of its profile, or one whole GPU."""
    ns, name = pod.req.key.split("/", 1)
    if pod.profile is None:
        req = Request("r", nvidia.GPU_CLASS)
    else:
        req = Request("r", nvidia.MIG_CLASS, (PROFILE_SELECTOR.format(pod.profile),))
    return ResourceClaim(ns, name, requests=(DeviceRequest("r", exactly=req),))


def publish(name: str, specs: Sequence[nvidia.GpuSpec], generation: int
            ) -> tuple[ResourceSlice, ...]:
    return tuple(parse_resource_slice(s) for s in nvidia.node_slices(
        name, specs, layout=nvidia.Layout.SPLIT, generation=generation))


class DraSim(base.Sim):
    """The shared DynamicMIG cluster: the API's objects per node, the packer's state
    rebuilt from them as the extender's cache builds it, allocations, instances made and
    destroyed. Policies choose the node (:meth:`choose`)."""

    def __init__(self, nodes: Sequence[NodeInfo], pods: Sequence[base.Pod], args: base.Args,
                 dra: DraArgs) -> None:
        super().__init__(nodes, pods, args)
        self.dra = dra
        self.rules: list[DeviceTaintRule] = []  # DeviceTaintRules in the API
        self.classes: dict[str, DeviceClass] = {
            c.name: c for c in map(parse_device_class, nvidia.device_classes())}
        self.base_infos = {n.name: n for n in nodes}
        self.cluster: dict[str, DraNode] = {}
        self.inventories: dict[str, DraInventory | None] = {}
        self.worlds: dict[str, DraWorld] = {}
        self.on_node: dict[str, set[str]] = {n.name: set() for n in nodes}
        self.node_of: dict[str, str] = {}  # running (or being destroyed) claim -> node
        self.mode_switches = 0
        self.mode_switches_in_window = 0
        self.fits: Counter[str] = Counter()  # predictions asked, by verdict
        self._memo: dict[tuple[str, int, str | None], Prediction] = {}
        for n in nodes:
            specs = [nvidia.GpuSpec(g.index, g.model) for g in n.gpus]
            self.cluster[n.name] = DraNode(n.name, specs, publish(n.name, specs, 1))
            self.rebuild(n.name)

    # -- the cache's view of a node ------------------------------------------------------

    def held(self, name: str) -> set[str]:
        return {f"{d.driver}/{d.pool}/{d.device}"
                for rs in self.cluster[name].claims.values() for d in rs}

    def rebuild(self, name: str) -> None:
        """The node's DRA world, inventory and packer state from its objects (as
        ``kube/cache.py``'s ``_dra_apply`` does: GPUs from the slices, every allocated
        claim's uses applied)."""
        node = self.cluster[name]
        node.version += 1
        # The rules of other pools select none of this node's devices (all of gpupack's
        # name their pool): left out here only to save time.
        mine = [r for r in self.rules if r.pool in (None, name)]
        slices = tuple(apply_taint_rules(list(node.slices), mine))
        held = self.held(name)
        self.worlds[name] = DraWorld(slices, self.classes,
                                     AllocatedState(devices=frozenset(held)), {},
                                     by_node={name: slices}, indexed=True)
        inv = node_inventory(name, slices, held)
        self.inventories[name] = inv
        info, _ = with_dra_gpus(self.base_infos[name], inv)
        scratch = ClusterState(Snapshot(nodes=(info,)))
        if inv is not None:
            held_gpus: set[int] = set()
            for key, results in sorted(node.claims.items()):
                for req, p in claim_uses(inv, key, results):
                    scratch.apply(req, p, allow_overcommit=True)
                    held_gpus.update(p.gpus)
            for req, p in taint_uses(inv, held_gpus):  # a fenced idle GPU: its taint holds it
                scratch.apply(req, p, allow_overcommit=True)
        self.state.nodes[name] = scratch.nodes[name]

    def gpus_used(self) -> tuple[int, int]:
        """``bench/mig.py``'s, a fenced idle GPU (held by its taint in the cache's view)
        not counted: no pod is on it."""
        used, idle = super().gpus_used()
        fenced = sum(1 for n in self.state.nodes.values() for g in n.gpus
                     if g.whole_owner is not None and g.whole_owner.endswith(TAINT_MARK))
        return used - fenced, idle

    def fit(self, name: str, pod: base.Pod) -> Prediction:
        """The allocator's answer for ``pod``'s claim on ``name`` (kept per node state)."""
        key = (name, self.cluster[name].version, pod.profile)
        found = self._memo.get(key)
        if found is None:
            found = predict(Node(name), self.worlds[name].relevant_slices(name),
                            self.classes, self.worlds[name].allocated, [claim_for(pod)])
            if len(self._memo) > 100_000:
                self._memo.clear()
            self._memo[key] = found
        self.fits[found.verdict.value] += 1
        return found

    def candidates(self, pod: base.Pod) -> list[str]:
        """The nodes of the pod's GPU model (its node selector), in node order."""
        return [n for n, c in self.cluster.items() if c.model == pod.model]

    # -- the event loop's hooks ----------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self.rng = random.Random(f"{self.name}:{self.args.params.seed}")

    @abstractmethod
    def choose(self, pod: base.Pod) -> tuple[str, tuple[AllocatedDevice, ...]] | None:
        """The node and the devices the pod's claim gets, None while nothing fits."""

    def schedule(self, pods: Sequence[base.Pod] | None = None) -> None:
        for pod in list(self.pending.values()) if pods is None else pods:
            if pod.req.key not in self.pending:
                continue
            got = self.choose(pod)
            if got is not None:
                self.allocate(pod, *got)

    def allocate(self, pod: base.Pod, name: str, results: tuple[AllocatedDevice, ...]
                 ) -> None:
        """kube-scheduler's PreBind writes the allocation; the kubelet prepares it (the
        instance is created) and the pod starts."""
        node = self.cluster[name]
        inv = self.inventories[name]
        assert inv is not None
        key = pod.req.key
        uses = claim_uses(inv, key, results)
        self.validated += 1
        taken = self.held(name)
        for d in results:
            if f"{d.driver}/{d.pool}/{d.device}" in taken:
                self.invalid.append(f"{self.name}: {key} on {name}: {d.device} is allocated "
                                    "already")
        if len(uses) != len(results):
            self.invalid.append(f"{self.name}: {key} on {name}: {results} are not GPUs of the "
                                "node's inventory")
        for _req, p in uses:
            if p.mig_profile is None and any(
                    not self.state.gpu(name, i).idle for i in p.gpus):
                self.invalid.append(f"{self.name}: {key} on {name}: GPUs {p.gpus} in use")
        delay = 0.0
        switched: set[int] = set()
        for _req, p in uses:
            if p.mig_profile is None:
                continue
            delay = self.dra.create_delay
            g = self.state.gpu(name, p.gpus[0])
            if g.info.mode is GpuMode.WHOLE:  # no MIG device on it: MIG mode turns on
                delay += self.dra.mode_switch_delay
                switched.add(p.gpus[0])
            self.count_reconfig()
        for minor in switched:
            self.count_mode_switch()
            spec = node.specs[minor]
            if spec.model in nvidia.MIG_MODE_NEEDS_RESET and not spec.mig_mode:
                # Ampere: MIG mode on for good; the whole device is no longer published.
                node.specs[minor] = replace(spec, mig_mode=True)
                node.generation += 1
                node.slices = publish(name, node.specs, node.generation)
        node.claims[key] = results
        self.rebuild(name)
        for req, p in uses:  # the instance exists where it was allocated, in a valid layout
            g = self.state.gpu(name, p.gpus[0])
            if p.mig_profile is None:
                if g.whole_owner != req.key:
                    self.invalid.append(f"{self.name}: {req.key}: GPU {p.gpus} not held")
                continue
            if g.instances.get(p.mig_start or 0) != (p.mig_profile, req.key):
                self.invalid.append(f"{self.name}: {req.key}: no {p.mig_profile} instance at "
                                    f"{p.mig_start} of GPU {p.gpus[0]} on {name}")
            self.check_layout(name, g)
        del self.pending[key]
        self._count(self.wait_slices, pod, -1)
        self.running[key] = pod
        self._count(self.run_slices, pod, +1)
        self.on_node[name].add(key)
        self.node_of[key] = name
        pod.placement = uses[0][1] if uses else Placement(key, name)
        pod.start = self.now + delay
        self.placed += 1
        self.push(pod.start + pod.duration, "departure", pod)

    def depart(self, pod: base.Pod) -> None:
        if pod.evicted:
            return  # its "gone" event ended it; the replacement runs the rest
        self.end(pod)

    def end(self, pod: base.Pod) -> None:
        """The pod is gone: its instance is destroyed, then its claim deallocated."""
        key = pod.req.key
        del self.running[key]
        self._count(self.run_slices, pod, -1)
        name = self.node_of[key]
        self.on_node[name].discard(key)
        if pod.profile is None:
            self.release(name, key)
            self.schedule()
        else:  # the instance is destroyed before the claim lets its counters go
            self.push(self.now + self.dra.destroy_delay, "destroyed", (name, key))

    def handle(self, ev: base.Event) -> None:
        if ev.kind != "destroyed":
            super().handle(ev)
            return
        assert isinstance(ev.data, tuple)
        name, key = ev.data
        before = self.mig_gpus(name)
        self.release(name, key)
        self.count_reconfig()
        after = self.mig_gpus(name)
        for _ in before - after:  # a Hopper GPU's last instance: MIG mode off
            self.count_mode_switch()
        self.schedule()

    def release(self, name: str, key: str) -> None:
        del self.cluster[name].claims[key]
        del self.node_of[key]
        self.rebuild(name)

    def mig_gpus(self, name: str) -> set[int]:
        return {g.info.index for g in self.state.nodes[name].gpus
                if g.info.mode is GpuMode.MIG}

    def count_mode_switch(self) -> None:
        self.mode_switches += 1
        if self.now >= self.warmup:
            self.mode_switches_in_window += 1

    def report(self, wall: float) -> dict[str, object]:
        out = super().report(wall)
        hours = max(self.horizon - self.warmup, 1.0) / 3600
        out["mode_switches_per_h"] = round(self.mode_switches_in_window / hours, 1)
        out["predictions"] = dict(sorted(self.fits.items()))
        out["ampere_gpus_in_mig_mode"] = sum(
            1 for c in self.cluster.values() for s in c.specs if s.mig_mode)
        return out


class DraFirstFit(DraSim):
    """Plain kube-scheduler: DynamicResources' Filter, ``LeastAllocated`` (CPU and memory
    in proportion to compute slices), a random pick among the best, the allocator's fit."""

    name = "dra-first-fit"

    def choose(self, pod: base.Pod) -> tuple[str, tuple[AllocatedDevice, ...]] | None:
        best = base.top_scored(self._scored(pod))
        if not best:
            return None
        name, pred = self.rng.choice(best)
        return name, pred.results[0]

    def _scored(self, pod: base.Pod) -> Iterator[tuple[int, tuple[str, Prediction]]]:
        """The nodes where the allocator finds devices, with their score."""
        for name in self.candidates(pod):
            pred = self.fit(name, pod)
            if pred.verdict is not Verdict.ALLOCATED:
                continue
            slices = sum(base.slices_of(self.by_key[k])[0] for k in self.on_node[name])
            slices += base.slices_of(pod)[0]
            info = self.base_infos[name]
            yield base.default_score(slices, info.cpu_milli, info.memory_mib), (name, pred)


class DraGpupack(DraSim):
    """What ships: the DRA participant's answer per node, the best node alone, the
    allocator's fit there."""

    name = "gpupack"
    prefix = True  # the fit's DynamicMIG key (issue 34) ahead of the scorer's preference

    def setup(self) -> None:
        super().setup()
        self._scorer: Scorer | None = None
        self._scorer_at = -math.inf
        self._scorer_gen = 0
        self._answers: dict[tuple[str, int, str | None, int], NodeAnswer] = {}

    def scorer(self) -> Scorer:
        if self._scorer is None or self.now - self._scorer_at >= self.args.scorer_refresh:
            running = tuple((req, p) for n in self.state.nodes.values()
                            for req, p in self._uses(n))
            snap = Snapshot(nodes=tuple(n.info for n in self.state.nodes.values()),
                            running=running,
                            pending=tuple(p.req for p in self.pending.values()))
            self._scorer = make_gpupack_scorer(snap)
            self._scorer_at = self.now
            self._scorer_gen += 1
            self._answers.clear()
        return self._scorer

    def _uses(self, node: NodeState) -> list[tuple[PodRequest, Placement]]:
        inv = self.inventories[node.info.name]
        if inv is None:
            return []
        return [u for key, rs in sorted(self.cluster[node.info.name].claims.items())
                for u in claim_uses(inv, key, rs)]

    def answer(self, name: str, pod: base.Pod, scorer: Scorer) -> NodeAnswer:
        key = (name, self.cluster[name].version, pod.profile, self._scorer_gen)
        found = self._answers.get(key)
        if found is None:
            claim = claim_for(pod)
            found = evaluate(self.state, self.worlds[name], name, {}, self.inventories[name],
                             [(claim.key, claim)], "", pod.req, scorer)
            if found.prediction is not None:
                self.fits[found.prediction.verdict.value] += 1
            self._answers[key] = found
        return found

    def choose(self, pod: base.Pod) -> tuple[str, tuple[AllocatedDevice, ...]] | None:
        scorer = self.scorer()
        ranked = []
        for i, name in enumerate(self.candidates(pod)):
            ans = self.answer(name, pod, scorer)
            if ans.fits and ans.pref is not None and ans.prediction is not None:
                pref = ans.pref if self.prefix else ans.pref[6:]
                ranked.append((pref, i, name, ans.prediction))
        if not ranked:
            return None
        _, _, name, pred = min(ranked, key=lambda r: (r[0], r[1]))
        return name, pred.results[0]


class DraGpupackScorerOnly(DraGpupack):
    """Diagnostic: the extender's scorer alone (the fit's DynamicMIG key left out)."""

    name = "gpupack-scorer-only"
    prefix = False


class DraGpupackCompact(DraGpupack):
    """gpupack with ``--mig-compact`` on DynamicMIG nodes: every ``--tick`` s compaction's
    own decision (``scheduler.mig.compact.decide.decide_compaction``, the ``--compact-*``
    settings) over the nodes as the actuator's view shows them (``gpu_view``, the DRA
    inventory's partitionable GPUs marked DynamicMIG), applied as the handler applies
    it: each fenced GPU's devices tainted NoSchedule by DeviceTaintRules (the allocator
    and gpupack's prediction skip them) until its drain ends, and the decision's steered
    (node, GPU, profile) likewise (``scheduler.mig.compact.steer``: the MIG devices of an
    idle GPU while a GPU in MIG mode on its node has room; pending pods are tried again
    when a fence lifts, as kube-scheduler does on the ResourceSlice change); evictions
    accepted (no PodDisruptionBudget here), the evicted pod gone ``--evict-grace`` s
    later (its instance then destroyed), its replacement pending from the eviction with
    the rest of its run time, placed like any pod."""

    name = "gpupack-compact"

    def setup(self) -> None:
        super().setup()
        self.push(0.0, "tick")
        self.drains: dict[tuple[str, int], Drain] = {}
        self.evicted_at: list[float] = []
        self.evicted_at_all: list[float] = []
        self.cooldown: dict[tuple[str, int], float] = {}
        self.drain_results: Counter[str] = Counter()
        self.moves: list[tuple[float, base.Pod]] = []
        self.fenced: set[tuple[str, int]] = set()
        self.fenced_since: dict[tuple[str, int], float] = {}
        self.steered: set[tuple[str, int, str]] = set()
        # DeviceTaintRule churn: rules created plus deleted after the warm-up, and the
        # most in force at once (one rule per fenced device, as kube/mig/fences.py writes).
        self.rule_writes = 0
        self.rules_peak = 0
        self.holder_pod: dict[str, base.Pod] = {}
        self.moved_in_window = 0
        self._seen: object = None
        self._views: tuple[NodeView, ...] = ()
        self._tenants: dict[str, Tenant] = {}

    def handle(self, ev: base.Event) -> None:
        if ev.kind == "tick":
            self.compact_step()
            self.push(self.now + self.args.tick, "tick")
        elif ev.kind == "gone":
            assert isinstance(ev.data, tuple)
            old, new = ev.data
            self.end(old)
            self.moves.append((self.now, new))
        else:
            super().handle(ev)

    def views(self) -> tuple[NodeView, ...]:
        out = []
        for name, ns in self.state.nodes.items():
            inv = self.inventories[name]
            dynamic = inv.partitionable if inv is not None else frozenset()
            out.append(NodeView(name, MigReconfigure.ON,
                                tuple(gpu_view(g, g.info.index in dynamic) for g in ns.gpus)))
        return tuple(out)

    def compact_step(self) -> None:
        seen = (tuple(c.version for c in self.cluster.values()),
                frozenset(k for k, p in self.running.items() if not p.evicted))
        if seen != self._seen:  # the views and tenants of an unchanged cluster are kept
            self._seen = seen
            self._views = self.views()
            self._tenants = self.tenants()
        self.evicted_at = [t for t in self.evicted_at if self.now - t < 3600]
        pending = tuple(MigPod(p.req.key, p.profile, p.req.gpu_models, p.arrival)
                        for p in self.pending.values() if p.profile is not None)
        cs = CompactState(self._views, self._tenants, tuple(self.drains.values()), pending,
                          frozenset(), tuple(self.evicted_at), dict(self.cooldown),
                          frozenset(self.steered))
        d = decide_compaction(cs, self.now, self.args.compact)
        base.keep_drains(self, d)
        lifted = self.fence(set(d.fences), set(d.steer))
        # As the product's compactor: a drained GPU's pods only once its fence has stood
        # FENCE_SETTLE_S (the next tick); kube-scheduler sees the rules through a watch.
        self.fenced_since = fences_up_since(self.fenced_since, self.fenced, self.now)
        for dr, key in d.evict:
            if dr.gpu_key in self.fenced and not fence_seen(self.fenced_since, dr.gpu_key,
                                                            self.now):
                continue
            self.evict(self.drains[dr.gpu_key], key)
        if d.evict or d.ends or lifted:
            self.schedule()

    def tenants(self) -> dict[str, Tenant]:
        """The pods on MIG instances, by the key their instance's holder has in the
        cache (a claim use: ``<claim>#dra-<device>``)."""
        tenants: dict[str, Tenant] = {}
        self.holder_pod = {}
        for pod in self.running.values():
            if pod.evicted or pod.profile is None or pod.start is None:
                continue
            name = self.node_of[pod.req.key]
            inv = self.inventories[name]
            assert inv is not None
            for req, p in claim_uses(inv, pod.req.key, self.cluster[name].claims[pod.req.key]):
                assert p.mig_profile is not None
                tenants[req.key] = Tenant(req.key, name, p.gpus[0], p.mig_profile,
                                          pod.start, True)
                self.holder_pod[req.key] = pod
        return tenants

    def fence(self, wanted: set[tuple[str, int]], steer: set[tuple[str, int, str]]) -> bool:
        """The DeviceTaintRules, one per device, NoSchedule: every device of the fenced
        (drained) GPUs, and the devices of each steered (node, GPU, profile): a MIG
        profile of an idle GPU kept off while a GPU in MIG mode on its node has room
        (``scheduler.mig.compact.steer``). True when a fence was lifted (a pending pod
        may fit now: kube-scheduler retries on the ResourceSlice change)."""
        if wanted == self.fenced and steer == self.steered:
            return False
        touched = ({n for n, _ in wanted ^ self.fenced}
                   | {n for n, _, _ in steer ^ self.steered})
        lifted = bool(self.fenced - wanted or self.steered - steer)
        self.fenced, self.steered = wanted, steer
        # The devices as the product's compactor picks them (kube.mig.fences), one rule
        # each, named and tainted as it writes them.
        def devices_of(name: str) -> Any:
            inv = self.inventories[name]
            assert inv is not None
            return inv.devices

        devices: set[str] = set()
        for name, index in wanted:
            devices.update(gpu_devices(devices_of(name), index))
        for name, index, profile in steer:
            devices.update(mig_devices(devices_of(name), index, profile))
        before = {r.name for r in self.rules}
        self.rules = []
        for device_id in sorted(devices):
            driver, pool, device = device_id.split("/", 2)
            self.rules.append(DeviceTaintRule(rule_name(device_id),
                                              Taint(TAINT_KEY, "", "NoSchedule"),
                                              driver, pool, device))
        if self.now >= self.warmup:
            self.rule_writes += len(before ^ {r.name for r in self.rules})
        self.rules_peak = max(self.rules_peak, len(self.rules))
        for name in touched:
            self.rebuild(name)
        return lifted

    def evict(self, dr: Drain, holder: str) -> None:
        self.drains[dr.gpu_key] = replace(dr, evicted=dr.evicted | {holder})
        base.evict_pod(self, self.holder_pod[holder], len(self.evicted_at_all) + 1)

    def report(self, wall: float) -> dict[str, object]:
        hours = max(self.horizon - self.warmup, 1.0) / 3600
        return {**super().report(wall), **base.move_figures(self),
                "taint_rule_writes_per_h": round(self.rule_writes / hours, 1),
                "taint_rules_peak": self.rules_peak}


class LayoutBound:
    """The layout bound as a row: every pod runs from its arrival for its run time."""

    name = "layout-bound"

    def __init__(self, pods: Sequence[base.Pod], args: base.Args) -> None:
        self.pods = pods
        self.args = args

    def run(self) -> dict[str, object]:
        started = time.monotonic()
        horizon, warmup = self.args.hours * 3600, self.args.warmup_h * 3600
        events = sorted([(p.arrival, 1, p) for p in self.pods]
                        + [(p.arrival + p.duration, -1, p) for p in self.pods],
                        key=lambda e: (e[0], e[1]))
        instances: dict[str, Counter[str | None]] = {}
        slices: dict[str, list[int]] = {}
        now = span = lb = sb = 0.0
        mig_in_window = 0
        for t, sign, pod in events:
            t = min(t, horizon)
            lo = max(now, warmup)
            if t > lo:
                span += t - lo
                lb += (t - lo) * base.layout_bound(instances)
                sb += (t - lo) * base.bound(slices)
            now = max(now, t)
            if now >= horizon:
                break
            c, m = base.slices_of(pod)
            s = slices.setdefault(pod.model, [0, 0])
            s[0] += sign * c
            s[1] += sign * m
            inst = instances.setdefault(pod.model, Counter())
            inst[pod.profile] += sign * (pod.req.gpu_count if pod.profile is None else 1)
            if pod.profile is not None and warmup <= t < horizon:
                mig_in_window += 1  # one created (arrival) or destroyed (departure)
        span = span or 1.0
        hours = max(horizon - warmup, 1.0) / 3600
        return {"gpus_used": round(lb / span, 2), "lower_bound": round(sb / span, 2),
                "layout_bound": round(lb / span, 2), "pods_waiting": 0.0,
                "wait_p99_s": 0.0, "reconfigs_per_h": round(mig_in_window / hours, 1),
                "invalid": 0, "wall_s": round(time.monotonic() - started, 1)}


DRA_POLICIES: dict[str, Callable[..., DraSim]] = {
    "dra-first-fit": DraFirstFit, "gpupack": DraGpupack, "gpupack-compact": DraGpupackCompact,
    "gpupack-scorer-only": DraGpupackScorerOnly}


def run(ns: Any) -> dict[str, object]:
    """The ``--protocol dra-dynamic`` run of ``bench/mig.py``'s parsed arguments."""
    nodes = base.make_nodes(ns.nodes, ns.gpus_per_node)
    period = ns.period_h or ns.hours
    pods = base.make_stream(nodes, ns.hours, ns.rate, ns.swing, period, ns.seed)
    args = base.Args(hours=ns.hours, warmup_h=min(ns.warmup_h, ns.hours / 2),
                     reconfig_delay=ns.reconfig_delay, create_delay=ns.create_delay,
                     tick=ns.tick, scorer_refresh=ns.scorer_refresh,
                     evict_grace=ns.evict_grace,
                     compact=compact_settings(ns, "--compact-"),
                     params=replace(base.DEFAULT_PARAMS, max_time_s=ns.solver_time,
                                    seed=ns.seed))
    dra = DraArgs(create_delay=ns.create_delay, destroy_delay=ns.destroy_delay,
                  mode_switch_delay=ns.mode_switch_delay)
    whole = base.static_whole_gpus(nodes, ns.rate, ns.swing)
    results: dict[str, dict[str, object]] = {}
    for name in ns.policies:
        if name == "layout-bound":
            results[name] = LayoutBound(pods, args).run()
            continue
        if name == "static-default":
            sim: base.Sim = base.StaticDefault(nodes, pods, args, whole)
        else:
            sim = DRA_POLICIES[name](nodes, pods, args, dra)
        results[name] = base.run_sim(sim)
    params = {**base.run_params(ns, args, period, len(pods), whole),
              "destroy_delay_s": ns.destroy_delay,
              "mode_switch_delay_s": ns.mode_switch_delay,
              "scorer_refresh_s": ns.scorer_refresh}
    return {"params": params, "policies": results, "goals": goals(results)}


def goals(results: dict[str, dict[str, object]]) -> dict[str, object]:
    """Issue 34's goals, for gpupack and gpupack-compact each: within 1.05x of the layout
    bound, at least 20% fewer GPUs than dra-first-fit, no more pods waiting than
    dra-first-fit; reconfigurations per hour reported."""
    out: dict[str, object] = {}
    lb = results.get("layout-bound")
    f = results.get("dra-first-fit")
    for name in ("gpupack", "gpupack-compact"):
        g = results.get(name)
        if g is None:
            continue
        mine: dict[str, object] = {}
        used = g["gpus_used"]
        assert isinstance(used, float)
        if lb is not None and isinstance(lb["gpus_used"], float) and lb["gpus_used"]:
            ratio = round(used / lb["gpus_used"], 3)
            mine["vs_layout_bound"] = ratio
            mine["within_1_05_of_layout_bound"] = ratio <= 1.05
        if f is not None and isinstance(f["gpus_used"], float) and f["gpus_used"]:
            fewer = round(1 - used / f["gpus_used"], 3)
            mine["fewer_gpus_than_dra_first_fit"] = fewer
            mine["at_least_20pct_fewer_than_dra_first_fit"] = fewer >= 0.20
            assert isinstance(g["pods_waiting"], float)
            assert isinstance(f["pods_waiting"], float)
            mine["waiting_no_more_than_dra_first_fit"] = g["pods_waiting"] <= f["pods_waiting"]
        mine["reconfigs_per_h"] = g["reconfigs_per_h"]
        out[name] = mine
    return out


__all__ = ["DIAGNOSTIC", "POLICIES", "DraArgs", "DraFirstFit", "DraGpupack", "DraSim",
           "LayoutBound", "claim_for", "goals", "run"]
