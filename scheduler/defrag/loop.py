"""The defragmenter in the extender (``gpupack serve --defrag=plan|act``): a thin handler.

On the active extender only (its :class:`scheduler.engine.LeaderGate`; a standby does
nothing and holds nothing), once the reservation book is ready, a pass runs about every
second on the loop engine (:class:`scheduler.engine.Loop`): it gathers the facts under
the cache lock (which groups wait for room, what the running campaign's pods and room
look like), plans with :func:`packing.defrag.plan.plan_defrag` when
:func:`scheduler.defrag.decide.wants_plan` says so (outside the lock, on a snapshot),
takes the pure decision (:func:`scheduler.defrag.decide.decide_defrag`) and applies it:

* holds: the room's GPUs, as they free, are counted in the cache under the key
  ``<group>#defrag-<node>`` (:meth:`ClusterCache.hold`), so filter, bind and the planner
  see them as taken and no pod (an evicted pod's replacement included) gets them; so are
  the CPU and memory the members take on that node, as they free (the planner evicts
  pods for those too, and a replacement bound back in their place undoes the move). A pod
  of the campaign that goes is seen under the cache lock (``on_pod_gone``) and its GPUs
  are held in the same step, before any other pod is answered;
* evictions: through the Eviction API (:mod:`kube.evictions`), outside the lock; the
  outcome (accepted, 429 from a PodDisruptionBudget, gone, 403, error) is fed back;
* hand over: the holds are given back and the book reserves the group
  (:meth:`ReservationBook.retry_now`) in one locked step, so nothing comes in between;
* Events on the group's leader pod and on every evicted pod, a log line per step,
  metrics (:class:`DefragMetrics`).

Consolidation (``consolidate_window``): the largest group seen pending (members x GPUs
per member, GPU models, priority) is remembered; inside the window, when fewer whole
nodes of its kind are free than it needs, the planner is asked for one more whole node
on the cluster without the whole nodes already free (a virtual lone pod of a node's
GPUs, at that group's priority), and a move that evicts few pods is carried out; its
hand-over only gives the holds back.

Past 600 lines as one handler: the facts it gathers, the holds it keeps as pods go (on
the watch's thread) and the decision it applies share one campaign's state and the
order of the cache lock; the pure parts are :mod:`scheduler.defrag.decide` and
:mod:`packing.defrag`, the figures :mod:`scheduler.defrag.metrics`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from prometheus_client import CollectorRegistry

from kube.cache import ClusterCache
from kube.defrag.inputs import PodOwners
from kube.evictions import EventSink, Evictor, PodRef
from packing.defrag.plan import (
    DefragParams,
    DefragPlan,
    Evictability,
    InvalidDefragPlan,
    Move,
    plan_defrag,
)
from packing.groups.members import is_reservation
from packing.model import Placement, PodRequest, RequestKind, Snapshot
from scheduler.defrag.decide import (
    CONSOLIDATE,
    Attempt,
    Campaign,
    Consolidation,
    DefragDecision,
    DefragSettings,
    DefragState,
    Need,
    Target,
    after_refusal,
    consolidating,
    decide_defrag,
    eligible,
    in_window,
    is_consolidation,
    wanted_room_holds,
    wants_plan,
)
from scheduler.defrag.metrics import DefragMetrics
from scheduler.engine import LeaderGate, Loop, LoopMetrics, Outcome
from scheduler.groups.loop import ReservationBook

log = logging.getLogger("gpupack.scheduler.defrag")
HOLD_MARK = "#defrag-"
Clock = Callable[[], float]
Planner = Callable[[Snapshot, Evictability, DefragParams], DefragPlan]


def defrag_hold_key(group: str, node: str) -> str:
    return f"{group}{HOLD_MARK}{node}"


def room_hold_request(key: str, gpus: int, cpu_milli: int = 0, memory_mib: int = 0
                      ) -> PodRequest:
    """What a room's hold on one node counts: its GPUs (none yet: CPU and memory only)
    and the CPU and memory the group's members take there."""
    kind = RequestKind.WHOLE if gpus else RequestKind.NONE
    return PodRequest(key=key, kind=kind, gpu_count=gpus, cpu_milli=cpu_milli,
                      memory_mib=memory_mib, klass="whole" if gpus else "cpu")


@dataclass(frozen=True)
class Handed:
    """A room given to its group: reserved or not, where, and since when it waited."""

    placed: bool
    nodes: tuple[str, ...]
    first_seen: float
    at: float = 0.0


@dataclass(frozen=True)
class Seen:
    """The largest group seen pending: what consolidation keeps whole nodes free for."""

    members: int
    gpus: int  # per member
    models: frozenset[str]
    priority: int

    @property
    def total(self) -> int:
        return self.members * self.gpus


@dataclass(frozen=True)
class Facts:
    needs: Mapping[str, Need]
    placed: frozenset[str]
    present: Mapping[str, str]
    room_free: Mapping[str, frozenset[int]]
    held: Mapping[str, frozenset[int]]
    version: int
    consolidation: Consolidation | None = None


class Defragmenter:
    def __init__(
        self,
        cache: ClusterCache,
        book: ReservationBook,
        owners: PodOwners,
        mode: str,
        evictor: Evictor | None,
        events: EventSink,
        *,
        settings: DefragSettings | None = None,
        params: DefragParams | None = None,
        registry: CollectorRegistry | None = None,
        metrics: DefragMetrics | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        clock: Clock = time.time,
        planner: Planner = plan_defrag,
        consolidate_window: tuple[int, int] | None = None,
        loop_metrics: LoopMetrics | None = None,
    ) -> None:
        """``consolidate_window``: (start, end) minutes of the UTC day when, act mode
        only, consolidation may run (None: never). ``metrics``: registered by the caller
        (the extender registers them whether or not it defragments, so the dashboards
        always have the series); default: new ones in ``registry``."""
        if mode not in ("plan", "act"):
            raise ValueError(f"defrag mode {mode!r}: expected plan or act")
        if mode == "act" and evictor is None:
            raise ValueError("defrag mode act needs an evictor (an API server)")
        self.cache = cache
        self.book = book
        self.owners = owners
        self.mode = mode
        self.evictor = evictor
        self.events = events
        self.cfg = settings or DefragSettings()
        self.params = params or DefragParams()
        self.metrics = metrics if metrics is not None else DefragMetrics(registry)
        self.gate = LeaderGate(is_leader)
        self.clock = clock
        self.planner = planner
        self.campaign: Campaign | None = None
        self.evicted: dict[str, float] = {}
        self.attempts: dict[str, Attempt] = {}
        self.recent: tuple[float, ...] = ()
        self.cooldown: dict[str, float] = {}
        self.announced: dict[str, tuple[object, ...]] = {}
        self.last_plan = -math.inf
        self.plan_version = -1
        self.last_plan_moves: tuple[Move, ...] = ()
        self._lone_since: dict[str, float] = {}
        self._told_refusal: set[str] = set()
        self._handed: tuple[Campaign, Handed] | None = None  # by the hook, to report
        self.window = consolidate_window if mode == "act" else None
        self.seen: Seen | None = None
        self._seen_at = -math.inf
        self._pass = threading.Lock()
        # A pass about every poll_s (a timer: the cache's changes are not its cue).
        self.loop = Loop("defrag", self.tick, poll_s=1.0, log=log, metrics=loop_metrics)
        cache.on_pod_gone(self._pod_gone)

    # ---- facts (under the cache lock) -----------------------------------------------------

    def _needs(self, now: float) -> dict[str, Need]:
        groups: dict[str, list[PodRequest]] = {}
        lone: list[PodRequest] = []
        for p in self.book.resolved(self.cache.pending()):
            if p.group is not None:
                groups.setdefault(p.group.key, []).append(p)
            elif p.kind is RequestKind.WHOLE:
                lone.append(p)
        out: dict[str, Need] = {}
        records = self.book.reservations
        for g, ps in groups.items():
            self._see(ps)
            if g in records:
                continue
            w = self.book.waiting.get(g)
            leader = min(ps, key=lambda p: (p.group.index if p.group else 0, p.key)).key
            out[g] = Need(leader, self.book.first_seen.get(g, now),
                          w is not None and w.category == "no_room")
        keys = {p.key for p in lone}
        self._lone_since = {k: t for k, t in self._lone_since.items() if k in keys}
        for p in lone:
            out[p.key] = Need(p.key, self._lone_since.setdefault(p.key, now), False, lone=True)
        return out

    def _see(self, pods: Sequence[PodRequest]) -> None:
        ref = pods[0].group
        if ref is None or any(p.kind is not RequestKind.WHOLE for p in pods):
            return
        seen = Seen(ref.size, max(p.gpu_count for p in pods), pods[0].gpu_models,
                    max(p.priority for p in pods))
        if self.seen is None or (seen.total, seen.priority) > (self.seen.total,
                                                                self.seen.priority):
            self.seen = seen

    def _node_kind(self) -> tuple[list[str], int]:
        """Nodes that could hold a member of the largest group seen, and the most GPUs
        one of them has."""
        assert self.seen is not None
        names: list[str] = []
        most = 0
        for name, n in self.cache.state.nodes.items():
            if len(n.gpus) < self.seen.gpus:
                continue
            if self.seen.models and not (n.info.gpu_models & self.seen.models):
                continue
            names.append(name)
            most = max(most, len(n.gpus))
        return names, most

    def _see_running(self, now: float) -> None:
        """Groups placed without ever waiting a pass are seen among the counted pods (a
        pass over every pod: at most every ``plan_every_s``, only in the window)."""
        if now - self._seen_at < self.cfg.plan_every_s:
            return
        self._seen_at = now
        groups: dict[str, list[PodRequest]] = {}
        for p, _ in self.cache.snapshot().running:
            if p.group is not None and not is_reservation(p.key) and HOLD_MARK not in p.key:
                groups.setdefault(p.group.key, []).append(p)
        for ps in groups.values():
            self._see(ps)

    def _consolidation(self, now: float) -> Consolidation | None:
        if self.window is None:
            return None
        if not in_window(self.window, now):
            return Consolidation(False, 0, 0)
        if self.campaign is None:
            self._see_running(now)
        if self.seen is None:
            return Consolidation(False, 0, 0)
        names, most = self._node_kind()
        if most == 0:
            return Consolidation(True, 0, 0)
        per_node = max(1, most // self.seen.gpus)
        wanted = -(-self.seen.members // per_node)
        free = sum(1 for n in names if self.cache.state.nodes[n].whole_free)
        return Consolidation(True, free, wanted)

    def _room(self, room: Mapping[str, Sequence[int]], group: str
              ) -> tuple[dict[str, frozenset[int]], dict[str, frozenset[int]]]:
        """(GPUs of ``room`` idle or held by ``group``'s holds, GPUs held) per node."""
        holds = self.cache.holds()
        free: dict[str, frozenset[int]] = {}
        held: dict[str, frozenset[int]] = {}
        for node, gpus in room.items():
            hk = defrag_hold_key(group, node)
            ours = frozenset(holds[hk][1].gpus) if hk in holds else frozenset()
            n = self.cache.state.nodes.get(node)
            if n is None:
                free[node], held[node] = frozenset(), frozenset()
                continue
            count = len(n.gpus)
            idle = {g for g in gpus if 0 <= g < count and self.cache.state.gpu(node, g).idle}
            free[node] = frozenset((idle | ours) & set(gpus))
            held[node] = ours
        return free, held

    def _facts(self, now: float) -> Facts:
        c = self.campaign
        present: dict[str, str] = {}
        free: dict[str, frozenset[int]] = {}
        held: dict[str, frozenset[int]] = {}
        if c is not None:
            for t in c.targets:
                e = self.cache.pod_entry(t.pod)
                if e is not None and not e.finished:
                    present[t.pod] = e.uid
            free, held = self._room(c.room, c.group)
        return Facts(self._needs(now), frozenset(self.book.reservations), present, free,
                     held, self.cache.version, self._consolidation(now))

    # ---- holds (under the cache lock) -----------------------------------------------------

    def _hold_now(self) -> None:
        c = self.campaign
        if c is None:
            return
        free, _ = self._room(c.room, c.group)
        holds = self.cache.holds()
        wanted = wanted_room_holds(c, free)
        for node in sorted(c.room):
            hk = defrag_hold_key(c.group, node)
            cur = holds.get(hk)
            gpus = wanted.get(node, ())
            cpu, mem = self._cpu_memory_to_hold(c, node, cur)
            if not gpus and not cpu and not mem:
                continue
            if cur is not None and (tuple(cur[1].gpus), cur[0].cpu_milli,
                                    cur[0].memory_mib) == (gpus, cpu, mem):
                continue
            self.cache.unhold(hk)
            why = self.cache.hold(room_hold_request(hk, len(gpus), cpu, mem),
                                  Placement(hk, node, gpus))
            if why is not None and gpus and (cpu or mem):
                # The GPUs are what the room cannot do without: never lose them to a
                # CPU or memory figure the cache counts otherwise.
                why = self.cache.hold(room_hold_request(hk, len(gpus)),
                                      Placement(hk, node, gpus))
            if why is not None:
                log.info("room of group %s on %s not held: %s", c.group, node, why)

    def _cpu_memory_to_hold(self, c: Campaign, node: str,
                            cur: tuple[PodRequest, Placement] | None) -> tuple[int, int]:
        """The CPU and memory the members take on ``node``, as far as they are free now
        (or held by the node's hold already): the rest is held as the pods holding it
        go, in the step that sees them go, so their replacements cannot take it back."""
        cpu, mem = c.takes.get(node, (0, 0))
        n = self.cache.state.nodes.get(node)
        if n is None or not (cpu or mem):
            return 0, 0
        held_cpu, held_mem = (cur[0].cpu_milli, cur[0].memory_mib) if cur else (0, 0)
        return (max(0, min(cpu, n.cpu_free + held_cpu)),
                max(0, min(mem, n.mem_free + held_mem)))

    def _release(self, group: str) -> None:
        for hk in [k for k in self.cache.holds() if k.startswith(group + HOLD_MARK)]:
            self.cache.unhold(hk)

    def _pod_gone(self, key: str) -> None:
        """A counted pod went (under the cache lock): a campaign pod's GPUs are held in
        this very step, and when it was the last one and the whole room is held, the
        room goes to the group in this step too (the pass after reports it). It runs on
        the watch's thread: the books it reads are replaced, never changed in place, by
        the pass's thread, and nothing it raises may reach the watch."""
        try:
            self._on_gone(key)
        except Exception:
            log.exception("defrag: handling the deletion of %s failed", key)

    def _on_gone(self, key: str) -> None:
        c = self.campaign
        if c is None or self._handed is not None or not any(t.pod == key for t in c.targets):
            return
        self._hold_now()
        now = self.clock()
        f = self._facts(now)
        st = DefragState(mode="act", campaign=c, needs=f.needs, placed=f.placed,
                         present=f.present, room_free=f.room_free, held=f.held,
                         evicted=dict(self.evicted), attempts=dict(self.attempts),
                         recent=self.recent, cooldown=dict(self.cooldown),
                         consolidation=f.consolidation)
        if decide_defrag(st, now, self.cfg).hand_over:
            self._handed = (c, self._give(c))

    def _give(self, c: Campaign) -> Handed:
        """Under the cache lock: the holds given back and the group reserved at once (a
        consolidation has no group: the whole node stays free)."""
        self._release(c.group)
        if is_consolidation(c.group):
            now = self.clock()
            return Handed(True, tuple(sorted(c.room)), now, now)
        placed = self.book.retry_now(c.group)
        rec = self.book.reservations.get(c.group)
        now = self.clock()
        if not placed or rec is None:
            return Handed(False, (), now, now)
        return Handed(True, tuple(sorted({p.node for p in rec.slots.values()})),
                      rec.first_seen, now)

    # ---- a pass -----------------------------------------------------------------------------

    def tick(self) -> Outcome:
        with self._pass:
            return self._tick()

    def _tick(self) -> Outcome:
        now = self.clock()
        if not self.book.ready:
            return Outcome.IDLE
        with self.cache.lock:  # the hook sets it under this lock
            done, self._handed = self._handed, None
        if done is not None:
            self._finish(done[0], done[1], now)
        if not self.gate.step().leading:
            if self.campaign is not None:
                with self.cache.lock:
                    self._release(self.campaign.group)
                self._end("leadership", now)
            return Outcome.STANDBY
        self.gate.act()
        with self.cache.lock:
            if self._handed is not None:
                return Outcome.DONE  # handed over meanwhile: the next pass reports it
            f = self._facts(now)
        state = DefragState(
            mode=self.mode, campaign=self.campaign, needs=f.needs, placed=f.placed,
            present=f.present, room_free=f.room_free, held=f.held, evicted=dict(self.evicted),
            attempts=dict(self.attempts), recent=self.recent, cooldown=dict(self.cooldown),
            announced=dict(self.announced), consolidation=f.consolidation)
        if wants_plan(state, now, self.last_plan, f.version != self.plan_version, self.cfg):
            state = self._plan(state, now, f.version)
        self._apply(decide_defrag(state, now, self.cfg), state, now)
        return Outcome.DONE

    def _plan(self, state: DefragState, now: float, version: int) -> DefragState:
        snap = self.cache.snapshot()
        # Only the units a move may serve now are planned (act: groups short of room, not
        # cooling down; plan: those and lone whole-GPU pods). The planner applies each
        # move to the cluster before planning the next: a move kept after one of a unit
        # never acted on (a lone pod, a group waiting for quota) could count on the room
        # that one frees, and evict a pod that fits nowhere once it is not carried out.
        # The first move with evictions is then planned on the cluster as it is (the
        # moves before it evict nothing, they only take room).
        wanted = {g for g, n in state.needs.items() if eligible(g, n, state, now)}
        snap = replace(snap, pending=tuple(
            p for p in self.book.resolved(snap.pending)
            if (p.group.key if p.group else p.key) in wanted))
        groups = any(not n.lone and n.room_short for n in state.needs.values())
        if consolidating(state) and not groups:
            with self.cache.lock:
                snap, key = self._consolidation_snapshot(snap)
            wanted = {key}
        refused = {p: "refused by the API server lately" for p, a in self.attempts.items()
                   if a.next_try > now}
        t0 = time.monotonic()
        try:
            plan = self.planner(snap, self.owners.evictability(refused), self.params)
        except InvalidDefragPlan as e:  # a planner bug: never act on it
            log.error("defragmentation plan rejected: %s", e)
            plan = DefragPlan((), ())
        self.last_plan, self.plan_version = now, version
        moves = tuple(m for m in plan.moves if m.group in wanted)
        self.last_plan_moves = moves
        log.debug("defrag plan: %d move(s), %d waiting, %.0f ms", len(moves), len(plan.waiting),
                  (time.monotonic() - t0) * 1000)
        for w in plan.waiting:
            if w.group in wanted:
                log.debug("defrag: group %s: %s", w.group, w.reason)
        rooms: dict[str, set[int]] = {}
        for m in moves:
            for n, g in m.frees().items():
                rooms.setdefault(n, set()).update(g)
        with self.cache.lock:
            free, _ = self._room({n: sorted(g) for n, g in rooms.items()}, "")
        uids = {p.key: p.uid for p, _ in snap.running}
        return replace(state, plan=moves, room_free=free, uids=uids)

    def _consolidation_snapshot(self, snap: Snapshot) -> tuple[Snapshot, str]:
        """The cluster without the whole nodes already free (kept as they are: no pod
        lands there) and with one pending virtual pod of a whole node's GPUs, at the
        largest group's priority: the planner's move for it empties one more node."""
        assert self.seen is not None
        names, most = self._node_kind()
        free = {n for n in names if self.cache.state.nodes[n].whole_free}
        key = f"{CONSOLIDATE}whole-node"
        unit = PodRequest(key=key, kind=RequestKind.WHOLE, gpu_count=most,
                          gpu_models=self.seen.models, priority=self.seen.priority,
                          klass="whole")
        nodes = tuple(n for n in snap.nodes if n.name not in free)
        keep = {n.name for n in nodes}
        running = tuple((p, pl) for p, pl in snap.running if pl.node in keep)
        return Snapshot(nodes, running, (unit,)), key

    # ---- applying a decision --------------------------------------------------------------

    def _apply(self, d: DefragDecision, state: DefragState, now: float) -> None:
        self.cooldown = dict(d.cooldown)
        if self.mode == "plan":
            self.announced = dict(d.announced)
            for m in d.announce:
                self._tell(m, state)
            return
        if d.start is not None:
            self._begin(d.start, now)
        c = self.campaign
        if c is None:
            return
        if d.stop is not None:
            with self.cache.lock:
                self._release(c.group)
            self._end(d.stop, now)
            return
        with self.cache.lock:
            self._hold_now()
        if d.hand_over:
            self._hand_over(c)
            return
        for t in d.evict:
            self._evict(c, t, now)

    def _tell(self, m: Move, state: DefragState) -> None:
        self.metrics.planned.inc()
        need = state.needs[m.group]
        pods = ", ".join(e.pod for e in m.evictions)
        frees = "; ".join(f"{n} GPUs {','.join(map(str, g))}" for n, g in m.frees().items())
        msg = (f"gpupack --defrag=plan: evicting {len(m.evictions)} pod(s) ({pods}) would "
               f"free room for {m.group} ({frees}); nothing is evicted in plan mode")
        log.info("%s", msg)
        self.events.emit(PodRef(need.leader, self._uid(need.leader)), "DefragPlanned", msg)

    def _uid(self, key: str) -> str:
        e = self.cache.pod_entry(key)
        return e.uid if e is not None else ""

    def _begin(self, c: Campaign, now: float) -> None:
        self.campaign = c
        self.evicted = {}
        self.attempts = {p: a for p, a in self.attempts.items() if a.next_try > now}
        self._told_refusal = set()
        self.metrics.planned.inc()
        self.metrics.active.set(1)
        frees = "; ".join(f"{n} GPUs {','.join(map(str, g))}" for n, g in c.room.items())
        msg = (f"gpupack frees room for group {c.group} ({frees}) by evicting "
               f"{len(c.targets)} pod(s): {', '.join(t.pod for t in c.targets)}; at most "
               f"{self.cfg.evictions_per_minute} eviction(s) per minute")
        if is_consolidation(c.group):
            msg = (f"gpupack consolidates: frees {', '.join(c.room)} whole by evicting "
                   f"{len(c.targets)} pod(s): {', '.join(t.pod for t in c.targets)}")
        log.info("%s", msg)
        if c.leader:
            self.events.emit(PodRef(c.leader, self._uid(c.leader)), "DefragStarted", msg)
        with self.cache.lock:
            self._hold_now()

    def _end(self, reason: str, now: float) -> None:
        c = self.campaign
        self.campaign = None
        self.metrics.active.set(0)
        if c is None:
            return
        self.metrics.stopped.labels(reason).inc()
        msg = f"gpupack stopped freeing room for group {c.group}: {reason}"
        log.info("%s", msg)
        if c.leader and reason not in ("handed_over", "gone", "leadership"):
            self.events.emit(PodRef(c.leader, self._uid(c.leader)), "DefragStopped", msg,
                             warning=reason != "placed")

    def _hand_over(self, c: Campaign) -> None:
        with self.cache.lock:
            if self._handed is not None:
                return  # handed over by the hook already; the next pass reports it
            handed = self._give(c)
        self._finish(c, handed, self.clock())

    def _finish(self, c: Campaign, h: Handed, now: float) -> None:
        if self.campaign is not c:
            return
        if not h.placed:
            self.cooldown = {**self.cooldown, c.group: now + self.cfg.cooldown_s}
            self._end("not_placed", now)
            return
        self.metrics.freed.inc(c.busy_at_start)
        if is_consolidation(c.group):
            log.info("gpupack consolidated: %s whole and free after %d eviction(s)",
                     ", ".join(h.nodes), len(self.evicted))
            self._end("consolidated", now)
            return
        waited = max(0.0, h.at - h.first_seen)
        self.metrics.wait.observe(waited)
        where = ", ".join(h.nodes)
        msg = (f"gpupack freed {c.busy_at_start} GPU(s) with {len(self.evicted)} eviction(s); "
               f"group {c.group} has its room reserved on {where} after waiting {waited:.0f}s")
        self.events.emit(PodRef(c.leader, self._uid(c.leader)), "DefragRoomReserved", msg)
        self._end("handed_over", now)

    def _evict(self, c: Campaign, t: Target, now: float) -> None:
        assert self.evictor is not None
        res = self.evictor.evict(PodRef(t.pod, t.uid))
        self.metrics.evictions.labels(res.outcome).inc()
        if res.outcome == "evicted":
            self.evicted = {**self.evicted, t.pod: now}
            self.recent = (*self.recent, now)[-max(1, self.cfg.evictions_per_minute):]
            if is_consolidation(c.group):
                reason = "EvictedForConsolidation"
                msg = (f"evicted by gpupack to keep {t.node} whole for LLM groups "
                       f"(consolidation window); its controller recreates it (expected on "
                       f"{t.to})")
            else:
                reason = "EvictedForGroup"
                msg = (f"evicted by gpupack to free room for group {c.group} on {t.node}; "
                       f"its controller recreates it (expected on {t.to})")
            log.info("pod %s %s", t.pod, msg)
            self.events.emit(PodRef(t.pod, t.uid), reason, msg)
            return
        if res.outcome == "gone":
            self.evicted = {**self.evicted, t.pod: now}
            log.info("pod %s is gone already: %s", t.pod, res.message)
            return
        self.attempts = after_refusal(self.attempts, t.pod, res.outcome, now, self.cfg)
        a = self.attempts[t.pod]
        log.info("eviction of %s refused (%s): %s; next try in %.0fs", t.pod, res.outcome,
                 res.message, a.next_try - now)
        if c.leader and t.pod not in self._told_refusal:
            self._told_refusal.add(t.pod)
            self.events.emit(PodRef(c.leader, self._uid(c.leader)), "DefragEvictionRefused",
                             f"evicting {t.pod} for group {c.group} refused ({res.outcome}): "
                             f"{res.message}; tried again with backoff", warning=True)

    # ---- the thread ---------------------------------------------------------------------------

    def start(self, poll_s: float = 1.0) -> None:
        self.loop.poll_s = poll_s
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop()

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the thread (stopped) to end its pass in
        progress; whether it has (or never ran)."""
        return self.loop.join(timeout_s)

    @property
    def is_leader(self) -> Callable[[], bool]:
        """Whether this replica leads (the gate's check; may be replaced)."""
        return self.gate.is_leader

    @is_leader.setter
    def is_leader(self, check: Callable[[], bool]) -> None:
        self.gate.is_leader = check
