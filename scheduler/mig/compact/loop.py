"""MIG compaction's thin handler (``gpupack serve --mig-actuator --mig-compact``).

Called by the MIG actuator (:class:`scheduler.mig.loop.MigActuator`) in the same step,
on the leader only, over the nodes it just gathered: it adds what the pure decision
(:func:`scheduler.mig.compact.decide.decide_compaction`) needs of the cache and of the pods'
owners (:class:`Tenant`: which pods sit on which slice since when, and whether a
controller recreates them), and applies the :class:`CompactDecision`:

* holds: the drained GPUs' free instances, in the cache, under ``DRAIN_PREFIX`` keys; a
  drained pod that goes is seen under the cache lock (``on_pod_gone``) and its instance
  is held in the same step, before any other pod (its replacement included) is answered;
* evictions: through the Eviction API (:mod:`kube.evictions`; PodDisruptionBudgets are
  the API server's to enforce), outside the cache lock; an accepted eviction is
  remembered in the drain, a refusal (429, 403, an error) marks the drain, which then
  ends as ``refused`` and cools the GPU down; a drained DynamicMIG GPU's pods only once
  its fences have stood ``FENCE_SETTLE_S`` (``fence_seen``: kube-scheduler sees them
  through a watch);
* an Event per drain started and ended (on the node) and per eviction (on the pod), a
  log line, and the ``gpupack_mig_drains`` / ``gpupack_mig_compaction_evictions`` metrics;
* steering's fences (``steer.py``) written with the drains' in one pass, and an Event on
  the node when they are put up or lifted (``MigSteered``, ``MigSteerLifted``), with the
  ``gpupack_mig_steered`` / ``gpupack_mig_steer_changes`` metrics.

Leadership is checked again right before each eviction and each Event: the actuator's
step calls this after its own slow part (the decision, the ConfigMap and Node writes),
and a replica whose lease ran out meanwhile must not evict (the drain it started is
taken up, or not, by the new leader from the memory). Unless given its own
``is_leader``, the compactor asks the actuator's leader gate
(:class:`scheduler.engine.LeaderGate`).

A standby holds nothing. The evictions of the last hour, the cool-downs and the drains
in flight are kept in :mod:`kube.mig.compaction_memory`: a new leader reads them back before
it moves anything, so the hourly budget and the cool-downs are the cluster's, not a
leader term's, and a drain the last leader started goes on (its GPU's free slices held
again, its pods not yet evicted evicted, each slice held as its pod goes). The memory
goes through a writer that drops what it finds it may not write (this replica not
leading when it drains): when its ``dropped`` count moves, the memory is submitted
again at the next step, even if it did not change since (a lapse of the lease this
handler never saw would otherwise leave an accepted eviction out of the memory).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import fields, replace
from typing import Any, Protocol

from kube.cache import ClusterCache
from kube.evictions import EventSink, EvictionResult, Evictor, PodRef
from kube.mig.compaction_memory import NAME, CompactionMemory, DrainRecord, memory_object
from kube.mig.fences import Fences, gpu_devices, mig_devices
from kube.record_writer import Submitter
from packing.dra.inventory import USE_MARK
from packing.model import MigReconfigure
from scheduler.engine import LeaderGate
from scheduler.mig.compact.decide import (
    DEFAULT_COMPACT,
    DRAIN_PREFIX,
    CompactDecision,
    CompactSettings,
    CompactState,
    Drain,
    Tenant,
    decide_compaction,
    fence_seen,
    fences_up_since,
)
from scheduler.mig.compact.steer import Steer
from scheduler.mig.decide import HOLD_PREFIX, ActuatorState, Hold, NodeView
from scheduler.mig.holds import hold_one, sync_holds, take_holds

log = logging.getLogger("gpupack.scheduler.mig")
# A pod on a MIG slice as read: node, GPU, profile, uid, start time, and the pod's key
# (the holder's own, or for a DynamicMIG instance the key of the pod owning its claim).
Found = tuple[str, int, str, str, float | None, str]


# Controllers whose pods compaction moves: servers that a replacement serves as well.
# Not Jobs (an evicted Job pod loses its progress and counts against backoffLimit), nor
# LeaderWorkerSets (their groups are placed whole, never on MIG slices).
MOVABLE_KINDS = frozenset({"ReplicaSet", "ReplicationController", "StatefulSet"})
EVICTED_MEMORY_S = 3600.0  # a pod whose eviction was accepted is not asked again


class Owners(Protocol):
    """Which pods a controller recreates (kube.defrag.inputs.PodOwners)."""

    def movable(self, keys: Collection[str], kinds: Collection[str] | None = None
                ) -> set[str]: ...


class NodeEvents(Protocol):
    def event(self, node: str, reason: str, message: str, warning: bool = False) -> None: ...


class MemoryReader(Protocol):
    def read(self) -> CompactionMemory: ...


class CompactMetrics:
    """``gpupack_mig_drains{result}``, ``gpupack_mig_compaction_evictions{outcome}``,
    ``gpupack_mig_drains_in_flight``, ``gpupack_mig_steered`` and
    ``gpupack_mig_steer_changes{change}`` (registered by every extender: zero when off)."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge

        from kube.evictions import OUTCOMES
        from scheduler.mig.compact.decide import RESULTS

        self.drains = Counter("gpupack_mig_drains", "MIG GPUs drained by compaction, by "
                              "result (started, emptied, refilled, refused, timeout, gone)",
                              ["result"], registry=registry)
        for r in ("started", *RESULTS):
            self.drains.labels(r)
        self.evictions = Counter("gpupack_mig_compaction_evictions",
                                 "Evictions asked by MIG compaction, by outcome",
                                 ["outcome"], registry=registry)
        for o in OUTCOMES:
            self.evictions.labels(o)
        self.in_flight = Gauge("gpupack_mig_drains_in_flight",
                               "MIG GPUs being drained by compaction", registry=registry)
        self.steered = Gauge("gpupack_mig_steered",
                             "(idle DynamicMIG GPU, MIG profile) pairs whose MIG devices "
                             "compaction fences so the DRA allocator fills a GPU in MIG "
                             "mode first", registry=registry)
        self.steer_changes = Counter("gpupack_mig_steer_changes",
                                     "(GPU, MIG profile) pairs steering fenced or lifted, "
                                     "by change", ["change"], registry=registry)
        for c in ("fenced", "lifted"):
            self.steer_changes.labels(c)


class Compactor:
    """See the module docstring."""

    def __init__(self, cache: ClusterCache, owners: Owners, evictor: Evictor,
                 events: EventSink, node_events: NodeEvents, *,
                 settings: CompactSettings = DEFAULT_COMPACT,
                 metrics: CompactMetrics | None = None,
                 memory: tuple[MemoryReader, Submitter, str] | None = None,
                 is_leader: Callable[[], bool] | None = None,
                 fences: Fences | None = None) -> None:
        """``memory``: where the evictions of the last hour and the cool-downs are kept
        across leaders (:mod:`kube.mig.compaction_memory`): a reader, a writer and the
        namespace of the ConfigMap; None: nowhere (a new leader starts with none).
        ``is_leader``: asked before each eviction and Event; None: the actuator that
        runs this compactor sets its own (:class:`scheduler.mig.loop.MigActuator`).
        ``fences``: the DeviceTaintRules that keep the DRA allocator off DynamicMIG GPUs
        being drained (:mod:`kube.mig.fences`); None: such GPUs are not drained."""
        self.cache = cache
        self.fences = fences
        # A DynamicMIG GPU's holders are claim uses (<claim>#dra-<device>): the pod each
        # stands for (the claim's owner), as last read.
        self._pod_of: dict[str, str] = {}
        self.memory = memory
        self.gate = None if is_leader is None else LeaderGate(is_leader)
        # What this leader last read or wrote of the memory (None: not read back yet).
        self._remembered: CompactionMemory | None = None
        # The memory writer's ``dropped`` count when the memory was last submitted.
        self._drops_seen = 0
        self.owners = owners
        self.evictor = evictor
        self.events = events
        self.node_events = node_events
        self.settings = settings
        self.metrics = metrics
        self.drains: dict[tuple[str, int], Drain] = {}
        # Per opted-in node: the view last read and the pods found on its MIG slices.
        self._pods_on: dict[str, tuple[NodeView, dict[str, Found], bool]] = {}
        self.since: dict[tuple[str, str], float] = {}  # (pod, uid) -> first seen on a slice
        self.evicted: dict[tuple[str, str], float] = {}  # (pod, uid) -> accepted at
        self.evicted_at: list[float] = []
        self.cooldown: dict[tuple[str, int], float] = {}
        self.slots: dict[str, Hold] = {}  # drained pod -> the hold its slice takes once gone
        # Steering's fences as last written (node, GPU, profile): what the Events and
        # the gauge report changes of.
        self.steered: set[Steer] = set()
        # Drained DynamicMIG GPUs whose fences are written: since when (FENCE_SETTLE_S).
        self.fenced_since: dict[tuple[str, int], float] = {}
        self.last: CompactDecision | None = None
        cache.on_pod_gone(self._on_gone)

    # ---- gathering ---------------------------------------------------------------------------

    def tenants(self, state: ActuatorState, now: float) -> dict[str, Tenant]:
        """Pods on MIG slices of opted-in nodes (what compaction may move or count). A
        pod's age counts from its ``status.startTime`` (the kubelet's clock: it survives
        a failover), or from when this handler first saw it on its slice if that is
        earlier or the start time is not known (a pod the kubelet has not acknowledged,
        a node clock ahead of this one's)."""
        found: dict[str, Found] = {}
        memo: dict[str, tuple[NodeView, dict[str, Found],
                              bool]] = {}
        with self.cache.lock:
            for n in state.nodes:
                if n.reconfigure is not MigReconfigure.ON:
                    continue  # compaction neither moves nor counts pods there
                # The actuator's views are rebuilt only for nodes that changed (Views):
                # the same view object means the same pods on the same slices. Not
                # reused while an assumed bind was there: its confirmation leaves the
                # node's generation (and so its view) as it was.
                hit = self._pods_on.get(n.name)
                if hit is not None and hit[0] is n and hit[2]:
                    on_node, settled = hit[1], True
                else:
                    on_node, settled = self._read(n)
                memo[n.name] = (n, on_node, settled)
                found.update(on_node)
        self._pods_on = memo
        self._pod_of = {h: f[5] for h, f in found.items() if f[5] != h}
        by_pod = {f[5]: k for k, f in found.items()}
        movable = {by_pod[p] for p in self.owners.movable(by_pod.keys(), MOVABLE_KINDS)}
        # By (name, uid): a StatefulSet's replacement keeps the name, not the age.
        self.since = {(k, f[3]): min(self.since.get((k, f[3]), now),
                                     now if f[4] is None else f[4])
                      for k, f in found.items()}
        self.evicted = {k: t for k, t in self.evicted.items() if now - t < EVICTED_MEMORY_S}
        return {k: Tenant(k, node, gpu, profile, self.since[k, uid],
                          k in movable and (k, uid) not in self.evicted)
                for k, (node, gpu, profile, uid, _, _pod) in found.items()}

    def _read(self, n: NodeView
              ) -> tuple[dict[str, Found], bool]:
        """Under the cache lock: the pods on the node's MIG slices (node, GPU, profile,
        uid, start time), assumed binds left out; and whether there was none."""
        out = {}
        settled = True
        for g in n.gpus:
            if not g.mig_enabled:
                continue
            for h in g.holders:
                if h.startswith((HOLD_PREFIX, DRAIN_PREFIX)):
                    continue
                counted = self.cache.counted(h)
                if counted is None:
                    continue
                # A DynamicMIG instance is held by a claim: the pod is the claim's owner.
                pod = self.cache.dra.owner_pod(h.split(USE_MARK)[0]) if g.dynamic else h
                if pod is None:
                    continue  # a claim of its own: no pod to move it with
                if self.cache.is_assumed(pod):
                    settled = False
                    continue
                p = counted[1]
                entry = self.cache.pod_entry(pod)
                if p.mig_profile is not None and entry is not None:
                    out[h] = (n.name, g.index, p.mig_profile, entry.uid, entry.started, pod)
        return out, settled

    # ---- one step ----------------------------------------------------------------------------

    def step(self, state: ActuatorState, now: float, changing: Collection[str]
             ) -> CompactDecision:
        if not self._recall(now):
            return CompactDecision()  # the budget is unknown: nothing is moved yet
        hour = [t for t in self.evicted_at if now - t < 3600]
        self.evicted_at = hour
        cs = CompactState(state.nodes, self.tenants(state, now), tuple(self.drains.values()),
                          state.mig_pods, frozenset(changing), tuple(hour),
                          dict(self.cooldown), frozenset(self.steered))
        d = decide_compaction(cs, now, self.settings)
        self.apply(d, now)
        self._remember(now)
        self.last = d
        return d

    def _recall(self, now: float) -> bool:
        """On the first step as the leader: the last leaders' evictions and cool-downs,
        added to this one's. False while the memory cannot be read."""
        if self.memory is None or self._remembered is not None:
            return True
        try:
            mem = self.memory[0].read().within(now, cooldown_s=self.settings.cooldown_s)
        except Exception as e:  # unreadable or unreachable: no eviction until it is known
            log.warning("MIG compaction memory not read back: %s; moving nothing yet", e)
            return False
        # A multiset union: the evictions of one step share its time (and a far-future
        # one is read as now), while this leader's own, when it leads again, are in the
        # memory too. Each is counted once: none lost from the budget, none doubled.
        self.evicted_at = sorted((Counter(self.evicted_at) | Counter(mem.evictions))
                                 .elements())
        self.cooldown = {**mem.cooldown, **self.cooldown}
        for rec in mem.drains:
            if (rec.node, rec.gpu) not in self.drains:
                self._resume(_drain_of(rec), now)
        self._remembered = mem
        if mem.evictions or mem.cooldown or mem.drains:
            log.info("MIG compaction: %d eviction(s) of the last hour, %d GPU(s) cooling "
                     "down and %d drain(s) in flight remembered from the last leader",
                     len(mem.evictions), len(mem.cooldown), len(mem.drains))
        return True

    def _resume(self, dr: Drain, now: float) -> None:
        """Take up a drain the last leader started: its pods still on the GPU have their
        slots held once they go, and those it evicted are not asked again. The GPU's free
        instances are held by this step's decision, or the drain ends there."""
        self.drains[dr.gpu_key] = dr
        with self.cache.lock:
            for key in dr.pods:
                counted = self.cache.counted(key)
                entry = self.cache.pod_entry(key)
                if key in dr.evicted and entry is not None:
                    self.evicted[key, entry.uid] = now
                if counted is None:
                    continue
                p = counted[1]
                if (p.node, p.gpus[:1], p.mig_start is not None) == (dr.node, (dr.gpu,), True):
                    self.slots[key] = Hold(dr.node, dr.gpu, dr.model, p.mig_profile,
                                           p.mig_start, DRAIN_PREFIX)
        log.info("MIG drain of GPU %d on %s taken up from the last leader (%d of %d pod(s) "
                 "evicted)", dr.gpu, dr.node, len(dr.evicted), len(dr.pods))

    def _remember(self, now: float) -> None:
        """Write the memory when what it keeps changed, or when the writer dropped a
        write since the last submit (the leader only: its writer)."""
        if self.memory is None:
            return
        mem = CompactionMemory(tuple(t for t in self.evicted_at if now - t < 3600),
                               {k: t for k, t in self.cooldown.items() if t > now},
                               tuple(_record_of(d) for d in self.drains.values()))
        cool = self.settings.cooldown_s
        writer = self.memory[1]
        dropped = int(getattr(writer, "dropped", 0))
        if (self._remembered is not None and dropped == self._drops_seen
                and mem.within(now, cooldown_s=cool) == self._remembered.within(
                    now, cooldown_s=cool)):
            return
        if dropped != self._drops_seen:
            log.info("MIG compaction memory: a write was dropped while not leading; "
                     "writing it again")
        self._remembered = mem
        self._drops_seen = dropped
        writer.submit(NAME, memory_object(mem, self.memory[2]))

    def apply(self, d: CompactDecision, now: float) -> None:
        self.cooldown = dict(d.cooldown)
        # Under the cache lock, as the on_pod_gone hook runs: a drained pod that went
        # since the decision had its slot held by the hook, and that hold must stay.
        with self.cache.lock:
            for e in d.ends:
                self.drains.pop(e.drain.gpu_key, None)
                for p in e.drain.pods:
                    self.slots.pop(p, None)
            live = set(self.drains)
            self._sync_holds([h for h in d.holds if (h.node, h.gpu) in live], live)
        for e in d.ends:
            (log.info if e.result == "emptied" else log.warning)(
                "MIG drain of GPU %d on %s: %s (%s)", e.drain.gpu, e.drain.node, e.result,
                e.message)
            self._node_event(e.drain.node, "MigDrained" if e.result == "emptied"
                             else "MigDrainStopped", e.message,
                             warning=e.result != "emptied")
            self._count(e.result)
        fenced = set(d.fences)
        for dr in d.starts:
            if dr.gpu_key in fenced and self.fences is None:
                log.info("MIG drain of GPU %d on %s not started: a DynamicMIG GPU is drained "
                         "only behind DeviceTaintRules, and this compactor has no writer of "
                         "them", dr.gpu, dr.node)
                fenced.discard(dr.gpu_key)
                continue
            why = (None if dr.gpu_key in fenced else
                   self._take([h for h in d.holds if (h.node, h.gpu) == dr.gpu_key], dr))
            if why is not None:
                log.info("MIG drain of GPU %d on %s not started: %s", dr.gpu, dr.node, why)
                continue
            self.drains[dr.gpu_key] = dr
            reason = d.why.get(dr.gpu_key, "")
            log.info("MIG drain of GPU %d on %s: %s", dr.gpu, dr.node, reason)
            self._node_event(dr.node, "MigDrainStarted",
                             f"{reason}; evicting {len(dr.pods)} pod(s) so the GPU "
                             "can be re-partitioned or turned whole")
            self._count("started")
        up = fenced & set(self.drains)
        fence_error = self._fence(up, d.steer)
        # A failed write may have left some rules out: the wait starts again after it.
        self.fenced_since = fences_up_since(self.fenced_since,
                                            up if fence_error is None else (), now)
        for dr, key in d.evict:
            if dr.gpu_key in fenced and not fence_seen(self.fenced_since, dr.gpu_key, now):
                continue  # not before its fence is up and seen: tried at the next step
            # A refusal ends the drain: its other pods are not restarted for nothing.
            live_drain = self.drains.get(dr.gpu_key)
            if live_drain is not None and live_drain.refused is None:
                self._evict(live_drain, key, now)
        if self.metrics is not None:
            self.metrics.in_flight.set(len(self.drains))

    def _fence(self, gpus: set[tuple[str, int]], steer: Iterable[Steer] = ()) -> str | None:
        """Fence exactly the devices of ``gpus`` (DynamicMIG GPUs being drained) and the
        MIG devices of each steered (node, GPU, profile) (idle GPUs kept off while a GPU
        in MIG mode on their node has room: ``steer.py``), in one pass; None when done
        (or nothing to do), else why not. The leader only."""
        if self.fences is None or not self._leading():
            return None if not gpus else "not fenced"
        devices: list[str] = []
        with self.cache.lock:
            for node, gpu in sorted(gpus):
                inv = self.cache.dra_inventory(node)
                if inv is not None:
                    devices += gpu_devices(inv.devices, gpu)
            for node, gpu, profile in sorted(steer):
                inv = self.cache.dra_inventory(node)
                if inv is not None:
                    devices += mig_devices(inv.devices, gpu, profile)
        why = self.fences.sync(devices)
        if why is not None:
            log.warning("MIG compaction: %s; drained DynamicMIG GPUs not evicted from yet",
                        why)
        else:
            self._steering(set(steer))
        return why

    def _steering(self, now: set[Steer]) -> None:
        """Report what steering fenced or lifted since its fences were last written: one
        Event per node and change (the GPUs and profiles), a log line and the metrics.
        Nothing when nothing changed: the fences are written again every step."""
        fenced, lifted = now - self.steered, self.steered - now
        self.steered = now
        for change, keys in (("fenced", fenced), ("lifted", lifted)):
            for node in sorted({n for n, _, _ in keys}):
                mine = [(g, p) for n, g, p in keys if n == node]
                gpus = ", ".join(str(g) for g in sorted({g for g, _ in mine}))
                profiles = ", ".join(sorted({p for _, p in mine}))
                if change == "fenced":
                    reason = "MigSteered"
                    msg = (f"MIG devices of idle GPU(s) {gpus} fenced for {profiles}: a GPU "
                           "in MIG mode on this node has room for them, so the DRA "
                           "allocator's first fit takes it instead of switching an idle GPU")
                else:
                    reason = "MigSteerLifted"
                    msg = (f"steering fences of GPU(s) {gpus} lifted for {profiles}: the "
                           "GPUs in MIG mode on this node no longer have room for them")
                log.info("MIG compaction on %s: %s", node, msg)
                self._node_event(node, reason, msg)
            if self.metrics is not None and keys:
                self.metrics.steer_changes.labels(change).inc(len(keys))
        if self.metrics is not None:
            self.metrics.steered.set(len(now))

    def release(self) -> None:
        """Leadership lost: drain holds given back, drains forgotten; the memory is read
        again when this replica leads again."""
        self._remembered = None
        with self.cache.lock:
            self.drains.clear()
            self.slots.clear()
            self._sync_holds([], set())
        # The rules stay in the API until the next leader writes its own; this replica
        # no longer answers for them.
        self.steered = set()
        if self.metrics is not None:
            self.metrics.in_flight.set(0)
            self.metrics.steered.set(0)

    # ---- pieces --------------------------------------------------------------------------------

    def _sync_holds(self, wanted: list[Hold], live: set[tuple[str, int]]) -> None:
        """Give back the drain holds of GPUs not being drained and take the wanted ones;
        a running drain's holds are never given back (one the on_pod_gone hook took
        since the decision is not among ``wanted``)."""

        def of_live_drain(key: str) -> bool:
            node, _, rest = key[len(DRAIN_PREFIX):].partition("/")
            gpu = rest.partition("/")[0]
            return gpu.isdigit() and (node, int(gpu)) in live

        sync_holds(self.cache, wanted, DRAIN_PREFIX, of_live_drain)

    def _take(self, holds: list[Hold], dr: Drain) -> str | None:
        """Hold the drain's free instances, and remember each pod's slot (held once the
        pod goes); give back and say why on the first that cannot be had."""
        with self.cache.lock:
            for key in dr.pods:
                counted = self.cache.counted(key)
                if counted is None or counted[1].mig_start is None:
                    for k in dr.pods:
                        self.slots.pop(k, None)
                    return f"{key} is no longer on the GPU"
                p = counted[1]
                self.slots[key] = Hold(dr.node, dr.gpu, dr.model, p.mig_profile,
                                       p.mig_start, DRAIN_PREFIX)
            why = take_holds(self.cache, holds)
            if why is not None:
                for key in dr.pods:
                    self.slots.pop(key, None)
            return why

    def _on_gone(self, key: str) -> None:
        """Under the cache lock: a drained pod's slot is held before anyone is answered."""
        h = self.slots.pop(key, None)
        if h is not None:
            hold_one(self.cache, h)

    @property
    def is_leader(self) -> Callable[[], bool] | None:
        """The leader check asked before each eviction and Event (None: none yet)."""
        return None if self.gate is None else self.gate.is_leader

    @is_leader.setter
    def is_leader(self, check: Callable[[], bool]) -> None:
        self.gate = LeaderGate(check)  # its own, no longer the actuator's

    def _leading(self) -> bool:
        return self.gate is None or self.gate()

    def _node_event(self, node: str, reason: str, message: str, warning: bool = False
                    ) -> None:
        """An Event on ``node``, from the leader only."""
        if self._leading():
            self.node_events.event(node, reason, message, warning=warning)

    def _evict(self, dr: Drain, key: str, now: float) -> None:
        """Ask for one eviction, if this replica still leads right now (else nothing:
        the pod stays in the drain, not evicted, for whoever leads next)."""
        if not self._leading():
            log.info("MIG compaction: no longer leading; %s not evicted", key)
            return
        # The pod as it is now, not as the step's view had it: evictions go one after
        # another, each up to seconds, and meanwhile a drained pod may have gone and a
        # StatefulSet made it again under its name, elsewhere. Only the pod still on the
        # drained GPU is evicted, under its own UID (a precondition the API checks).
        pod = self._pod_of.get(key, key)  # a DynamicMIG tenant is a claim use
        with self.cache.lock:
            entry = self.cache.pod_entry(pod)
            counted = self.cache.counted(key)
        if (entry is None or not entry.uid or counted is None
                or counted[1].node != dr.node or dr.gpu not in counted[1].gpus):
            log.info("MIG compaction: %s is no longer on GPU %d of %s; not evicted", key,
                     dr.gpu, dr.node)
            self.drains[dr.gpu_key] = replace(dr, evicted=dr.evicted | {key})
            return
        ref = PodRef(pod, entry.uid)
        try:
            res = self.evictor.evict(ref)
        except Exception as e:  # a client bug must not stop the actuator
            res = EvictionResult("error", str(e))
        if self.metrics is not None:
            self.metrics.evictions.labels(res.outcome).inc()
        if res.outcome == "gone":
            # 404, or a 409 on the UID: that pod went by itself; nothing was evicted,
            # so no budget is used and no Event says it was.
            log.info("MIG compaction: %s was gone already: %s", key, res.message)
            self.drains[dr.gpu_key] = replace(dr, evicted=dr.evicted | {key})
            return
        if res.outcome == "evicted":
            self.drains[dr.gpu_key] = replace(dr, evicted=dr.evicted | {key})
            self.evicted_at.append(now)
            self.evicted[key, ref.uid] = now
            try:
                self.events.emit(ref, "MigCompactionEvicted",
                                 f"evicted to empty MIG GPU {dr.gpu} of {dr.node}: a free "
                                 f"slice of its profile on another GPU in use takes its "
                                 "replacement")
            except Exception:  # an Event is a report: the eviction stands, the step goes on
                log.exception("MIG compaction: Event for the eviction of %s not sent", key)
            return
        why = {"pdb": "a PodDisruptionBudget does not allow it now (429)",
               "forbidden": "forbidden (403)"}.get(res.outcome, res.outcome)
        self.drains[dr.gpu_key] = replace(dr, refused=f"{key}: {why}: {res.message}")
        log.info("MIG compaction: eviction of %s refused: %s %s", key, why, res.message)

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.drains.labels(result).inc()

def _record_of(d: DrainRecord) -> DrainRecord:
    """The record as the memory keeps it (a Drain compares unequal to its record)."""
    return DrainRecord(**{f.name: getattr(d, f.name) for f in fields(DrainRecord)})


def _drain_of(r: DrainRecord) -> Drain:
    return Drain(**{f.name: getattr(r, f.name) for f in fields(DrainRecord)})


__all__ = ["CompactMetrics", "Compactor", "Owners"]
