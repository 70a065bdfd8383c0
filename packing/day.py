"""A day of a cluster, replayed pod by pod as the controllers and the scheduler act.

The input (:class:`Day`) is the cluster's nodes and what its owners ask for over time:
Deployments scaled to a number of replicas (:class:`Scale`), LeaderWorkerSets scaled to
a number of groups and rolled out (:class:`Rollout`), or, for a recorded cluster, pods
created and deleted at given times (:class:`Create`, :class:`Delete`). The replay plays
the controllers' part and the scheduler's:

* a **ReplicaSet** creates the missing pods when scaled up; scaled down, it deletes the
  pods its ``getPodsToDelete`` ranks first: unscheduled before scheduled, then those
  on the nodes holding the most pods of the same set, then those ready for the shorter
  time (log2 buckets: ``LogarithmicScaleDown``), then the newest;
* a **LeaderWorkerSet** (``startupPolicy`` LeaderCreated: every member created at once)
  creates groups ``0..n-1`` and removes the highest-indexed first; a rollout replaces
  the groups one at a time, highest index first, each only when the previous new group
  runs (``maxUnavailable`` 1, ``maxSurge`` 0, the defaults): delete, then recreate;
* the **scheduler** (a :class:`Placer`) admits each pod when it is created (an admission
  webhook may change what it asks for; a pod it denies as written is listed in
  ``refusals`` and replayed as its manifest asks) and places it at once if it can. A
  pod that does not fit waits; waiting pods are tried again, by priority then age,
  whenever pods are deleted (the queue's move on a Pod delete event), since nothing
  else frees room. A placer that places groups all or nothing is handed a group's
  waiting members together once all of them exist.

Time is in seconds from the start of the day; scheduling takes no time. Every figure
the replay reports is measured on the replayed state: pods waiting and LLM groups not
running whole at each event, how long each pod waited (from creation to start; a pod
still waiting at its deletion or at the end of the day counts what it waited), GPUs in
use, and placements that over-commit a GPU (a slice, a share's memory or compute, a
whole GPU) as :func:`packing.validate.validate` judges the running pods after each
event. :mod:`packing.day_sizing` finds the fewest nodes of each pool on which nobody
waits, and where the fragmentation is at the end.

Pure: no I/O, no clock. (Past 600 lines: the controllers, the queue and the measures
all read and change one replay's state, the :class:`_Replay` that holds it; its input
and output types are the rest.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from packing.model import NodeInfo, Placement, PodRequest, Snapshot
from packing.state import ClusterState, describe
from packing.validate import validate


@dataclass(frozen=True)
class DayPod:
    """A pod as its controller creates it."""

    key: str  # "namespace/name", unique over the day
    workload: str  # its owner ("namespace/deployment"), "" for none
    # What the pod asks for as written, i.e. what plain kube-scheduler places; for a
    # share, gpu_memory_mib is the GPU memory it really uses (the validator checks it).
    request: PodRequest
    # The Pod object as created, for an admission webhook; None: admitted as written.
    manifest: Mapping[str, Any] | None = None
    priority: int = 0


@dataclass(frozen=True)
class Workload:
    """A Deployment (``size`` 1) or a LeaderWorkerSet (``size`` pods per group) and how
    its controller names and builds its pods: ``make(name, group, worker, revision)``."""

    name: str
    kind: str  # "deployment" | "lws"
    make: Callable[[str, int, int, int], DayPod]
    size: int = 1


@dataclass(frozen=True)
class Scale:
    t: float
    workload: str
    replicas: int  # pods of a Deployment, groups of a LeaderWorkerSet


@dataclass(frozen=True)
class Rollout:
    t: float
    workload: str  # a LeaderWorkerSet: every group replaced by a new revision


@dataclass(frozen=True)
class Create:
    t: float
    pods: tuple[DayPod, ...]


@dataclass(frozen=True)
class Delete:
    t: float
    keys: tuple[str, ...]


Event = Scale | Rollout | Create | Delete


@dataclass(frozen=True)
class Pool:
    """Nodes of one kind: the first ``base`` of ``nodes`` are the cluster's; the rest
    are nodes of the same kind the sizing search may add (:func:`size_cluster`)."""

    name: str
    nodes: tuple[NodeInfo, ...]
    base: int

    @property
    def gpus_per_node(self) -> int:
        return len(self.nodes[0].gpus) if self.nodes else 0


@dataclass(frozen=True)
class Day:
    nodes: tuple[NodeInfo, ...]
    workloads: Mapping[str, Workload]
    events: tuple[Event, ...]  # in time order
    end: float
    pools: tuple[Pool, ...] = ()

    def with_counts(self, counts: Mapping[str, int]) -> Day:
        """The same day on the first ``counts[pool]`` nodes of each pool (nodes of no
        pool stay)."""
        pooled = {n.name for p in self.pools for n in p.nodes}
        nodes = [n for n in self.nodes if n.name not in pooled]
        for p in self.pools:
            nodes.extend(p.nodes[: counts.get(p.name, p.base)])
        return replace(self, nodes=tuple(nodes))

    def busiest_time(self) -> float:
        """When the owners ask for the most pods (the first such moment): the replay
        keeps the placements of that moment for the picture."""
        want: dict[str, int] = {}
        alive = 0
        best, at = -1, 0.0
        for e in self.events:
            if isinstance(e, Scale):
                size = self.workloads[e.workload].size
                alive += (e.replicas - want.get(e.workload, 0)) * size
                want[e.workload] = e.replicas
            elif isinstance(e, Create):
                alive += len(e.pods)
            elif isinstance(e, Delete):
                alive -= len(e.keys)
            if alive > best:
                best, at = alive, e.t
        return at


class Placer(Protocol):
    """How one scheduler admits and places pods (see :mod:`packing.policies.placers`)."""

    name: str
    all_or_nothing: bool  # groups placed whole or not at all

    def start(self, day: Day, state: ClusterState, workload_of: Callable[[str], str],
              requests: Callable[[], list[PodRequest]]) -> None:
        """Called once before the day starts: the state it places on, each pod's
        workload by key, and the requests of the pods present (running and waiting)."""

    def before_pass(self) -> None:
        """Called before each scheduling pass (the pods present may have changed)."""

    def admit(self, pod: DayPod, state: ClusterState,
              pending: Sequence[PodRequest]) -> PodRequest | str:
        """The request the pod is stored with, or why it is denied."""

    def place(self, state: ClusterState, pod: PodRequest) -> Placement | None:
        """Where the pod goes now, or None (it waits)."""

    def place_group(self, state: ClusterState,
                    members: Sequence[PodRequest]) -> list[Placement] | None:
        """Where every member goes now (in order), or None (they all wait)."""


@dataclass
class _Pod:
    pod: DayPod
    created: float
    seq: int
    request: PodRequest | None = None  # as admitted
    placement: Placement | None = None
    started: float | None = None
    group: str | None = None  # group key (LeaderWorkerSet or annotated group)


@dataclass(frozen=True)
class Sample:
    t: float
    pending: int
    groups_waiting: int
    gpus_in_use: int  # GPUs holding at least one pod
    gpus_allocated: float  # GPU capacity held (a slice counts its memory share)
    nodes_in_use: int  # nodes with at least one GPU pod


@dataclass(frozen=True)
class Waited:
    key: str
    workload: str
    seconds: float
    reason: str  # why it waited (the denial, or what it asked for)


@dataclass(frozen=True)
class DayResult:
    policy: str
    pods_created: int
    groups_created: int
    pods_waiting_peak: int
    groups_waiting_peak: int
    wait_p99_s: float
    group_wait_p99_s: float
    overcommitted: int  # placements the validator finds over-committing a GPU
    overcommit_examples: tuple[str, ...]
    gpus_in_use_peak: int
    nodes_in_use_peak: int
    gpus_allocated_peak: float
    series: tuple[Sample, ...]
    busiest_at: float
    busiest: tuple[tuple[PodRequest, Placement], ...]  # running pods at busiest_at
    final: tuple[tuple[PodRequest, Placement], ...]  # running pods at the end
    waited: tuple[Waited, ...]  # every pod that waited, longest first
    groups_waited: tuple[tuple[str, float], ...]  # group key, seconds not running whole
    refusals: tuple[tuple[str, str], ...]  # (pod, why) admissions denied as written

    @property
    def served(self) -> bool:
        """Nobody waited all day: no pod, no group."""
        return self.pods_waiting_peak == 0 and self.groups_waiting_peak == 0


def p99(values: Sequence[float]) -> float:
    """The 99th percentile by nearest rank (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


class _Replay:
    def __init__(self, day: Day, placer: Placer, record: bool) -> None:
        self.day = day
        self.placer = placer
        self.record = record
        self.state = ClusterState(Snapshot(day.nodes))
        self.pods: dict[str, _Pod] = {}
        self.alive: dict[str, list[str]] = {}  # Deployment -> pod keys (creation order)
        self.groups: dict[str, dict[int, tuple[int, tuple[str, ...]]]] = {}  # LWS -> idx
        self.revision: dict[str, int] = {}
        self.rollouts: dict[str, list[int]] = {}  # LWS -> indexes still to replace
        self.updating: dict[str, int] = {}  # LWS -> index whose new group is starting
        self.counter: dict[str, int] = {}
        self.seq = 0
        self.pending: dict[str, None] = {}  # waiting pod keys, in creation order
        self.group_members: dict[str, list[str]] = {}
        self.group_since: dict[str, float] = {}  # not running whole since
        self.group_waits: list[tuple[str, float]] = []
        self.waits: list[float] = []
        self.waited: list[Waited] = []
        self.samples: list[Sample] = []
        self.over: dict[str, str] = {}
        self.refusals: list[tuple[str, str]] = []
        self.groups_made = 0  # group instances created (a rollout makes new ones)
        self.busiest_at = day.busiest_time()
        self.busiest: tuple[tuple[PodRequest, Placement], ...] = ()
        self.running: dict[str, tuple[PodRequest, Placement]] = {}  # in start order
        self.gpu_nodes = {n.name for n in day.nodes if n.gpus}

    # -- controllers ---------------------------------------------------------------------

    def workload_of(self, key: str) -> str:
        rec = self.pods.get(key)
        return rec.pod.workload if rec is not None else ""

    def create(self, pod: DayPod, t: float) -> None:
        self.seq += 1
        rec = _Pod(pod, t, self.seq)
        ref = pod.request.group
        if ref is not None:
            rec.group = ref.key
            members = self.group_members.setdefault(ref.key, [])
            if not members:
                self.group_since[ref.key] = t
                self.groups_made += 1
            members.append(pod.key)
        self.pods[pod.key] = rec
        self.pending[pod.key] = None
        self._admit(rec)

    def requests(self) -> list[PodRequest]:
        """The requests of the pods present: running, then waiting (admitted)."""
        out = [r.request for r in self.pods.values()
               if r.placement is not None and r.request is not None]
        out += [req for k in self.pending if (req := self.pods[k].request) is not None]
        return out

    def _admit(self, rec: _Pod) -> None:
        pending = [req for k in self.pending
                   if k != rec.pod.key and (req := self.pods[k].request) is not None]
        got = self.placer.admit(rec.pod, self.state, pending)
        if isinstance(got, str):
            # Denied as written: listed, and replayed as its manifest asks (as if its
            # author took out what the admission refused), so that nodes are not sized
            # around a pod that a fixed manifest would run.
            self.refusals.append((rec.pod.key, got))
            got = rec.pod.request
        rec.request = got

    def delete(self, key: str, t: float) -> None:
        rec = self.pods.get(key)
        if rec is None or (key not in self.pending and rec.placement is None):
            return
        if rec.placement is not None:
            assert rec.request is not None
            self.state.undo(rec.request, rec.placement)
            rec.placement = None
            del self.running[key]
        else:
            self._waited(rec, t)
            del self.pending[key]
        self._drop_group_member(rec, t)

    def _waited(self, rec: _Pod, t: float, at_end: bool = False) -> None:
        wait = t - rec.created
        self.waits.append(wait)
        if wait > 0 or at_end:
            why = _asked(rec.request or rec.pod.request)
            if at_end:
                why = f"still waiting at the end; {why}"
            self.waited.append(Waited(rec.pod.key, rec.pod.workload, wait, why))

    def _drop_group_member(self, rec: _Pod, t: float) -> None:
        if rec.group is None:
            return
        members = self.group_members.get(rec.group, [])
        if rec.pod.key in members:
            members.remove(rec.pod.key)
        if not members:
            self.group_members.pop(rec.group, None)
            since = self.group_since.pop(rec.group, None)
            if since is not None:
                self.group_waits.append((rec.group, t - since))

    def scale(self, e: Scale) -> bool:
        wl = self.day.workloads[e.workload]
        if wl.kind == "lws":
            return self._scale_groups(wl, e.replicas, e.t)
        keys = self.alive.setdefault(wl.name, [])
        deleted = False
        while len(keys) < e.replicas:
            n = self.counter.get(wl.name, 0)
            self.counter[wl.name] = n + 1
            pod = wl.make(f"{wl.name.split('/')[-1]}-{n:05d}", 0, 0, 0)
            keys.append(pod.key)
            self.create(pod, e.t)
        if len(keys) > e.replicas:
            for key in self._victims(keys, len(keys) - e.replicas, e.t):
                keys.remove(key)
                self.delete(key, e.t)
                deleted = True
        return deleted

    def _victims(self, keys: list[str], n: int, t: float) -> list[str]:
        """ReplicaSet's getPodsToDelete order (see the module docstring)."""
        per_node: dict[str, int] = {}
        for k in keys:
            p = self.pods[k].placement
            if p is not None:
                per_node[p.node] = per_node.get(p.node, 0) + 1

        def rank(k: str) -> tuple[int, int, int, float, int]:
            rec = self.pods[k]
            if rec.placement is None:
                return (0, 0, 0, -rec.created, -rec.seq)
            ready = max(1.0, t - (rec.started or t))
            return (1, -per_node[rec.placement.node], int(math.log2(ready)), -rec.created,
                    -rec.seq)

        return sorted(keys, key=rank)[:n]

    def _scale_groups(self, wl: Workload, n: int, t: float) -> bool:
        groups = self.groups.setdefault(wl.name, {})
        rev = self.revision.get(wl.name, 0)
        for idx in range(n):
            if idx not in groups:
                self._create_group(wl, idx, rev, t)
        deleted = False
        for idx in sorted(groups, reverse=True):
            if idx >= n:
                self._delete_group(wl.name, idx, t)
                deleted = True
                if self.updating.get(wl.name) == idx:
                    del self.updating[wl.name]
        if wl.name in self.rollouts:
            self.rollouts[wl.name] = [i for i in self.rollouts[wl.name] if i < n]
        return deleted

    def _create_group(self, wl: Workload, idx: int, rev: int, t: float) -> None:
        name = wl.name.split("/")[-1]
        pods = [wl.make(f"{name}-{idx}" + (f"-{w}" if w else "") + f"-r{rev}", idx, w, rev)
                for w in range(wl.size)]
        self.groups[wl.name][idx] = (rev, tuple(p.key for p in pods))
        for p in pods:
            self.create(p, t)

    def _delete_group(self, lws: str, idx: int, t: float) -> None:
        _, keys = self.groups[lws].pop(idx)
        for k in keys:
            self.delete(k, t)

    def rollout(self, e: Rollout) -> None:
        self.revision[e.workload] = self.revision.get(e.workload, 0) + 1
        self.rollouts[e.workload] = sorted(self.groups.get(e.workload, {}), reverse=True)

    def step_rollouts(self, t: float) -> bool:
        """Replace the next group of each rollout whose previous new group runs;
        whether pods were deleted."""
        deleted = False
        for lws, todo in list(self.rollouts.items()):
            idx = self.updating.get(lws)
            if idx is not None:
                if idx in self.groups[lws] and not self._runs(lws, idx):
                    continue
                del self.updating[lws]
            rev = self.revision[lws]
            while todo and self.groups[lws].get(todo[0], (rev, ()))[0] == rev:
                todo.pop(0)
            if not todo:
                del self.rollouts[lws]
                continue
            idx = todo.pop(0)
            self._delete_group(lws, idx, t)
            deleted = True
            self._create_group(self.day.workloads[lws], idx, rev, t)
            self.updating[lws] = idx
        return deleted

    def _runs(self, lws: str, idx: int) -> bool:
        _, keys = self.groups[lws][idx]
        return all(self.pods[k].placement is not None for k in keys)

    # -- scheduling ----------------------------------------------------------------------

    def schedule(self, t: float, keys: Iterable[str]) -> None:
        self.placer.before_pass()
        order = sorted((self.pods[k] for k in keys if k in self.pending),
                       key=lambda r: (-r.pod.priority, r.created, r.seq))
        tried: set[str] = set()
        for rec in order:
            if rec.pod.key not in self.pending:
                continue
            if rec.request is None:
                continue
            if self.placer.all_or_nothing and rec.group is not None:
                if rec.group in tried:
                    continue
                tried.add(rec.group)
                self._place_group(rec.group, t)
                continue
            p = self.placer.place(self.state, rec.request)
            if p is not None:
                self._start(rec, p, t)

    def _place_group(self, group: str, t: float) -> None:
        keys = self.group_members.get(group, [])
        ref = self.pods[keys[0]].pod.request.group if keys else None
        if ref is None or len(keys) < ref.size:
            return  # members not created yet: the group's room is not taken in part
        members = [self.pods[k] for k in keys if k in self.pending]
        if not members or any(m.request is None for m in members):
            return
        got = self.placer.place_group(self.state, [m.request for m in members
                                                   if m.request is not None])
        if got is None:
            return
        for m, p in zip(members, got, strict=True):
            self._start(m, p, t)

    def _start(self, rec: _Pod, p: Placement, t: float) -> None:
        assert rec.request is not None
        if self.record:
            self._check(rec.request, p, t)
        # What the scheduler chose is applied as the kubelet would run it, over-committed
        # or not.
        self.state.apply(rec.request, p, allow_overcommit=True)
        self.running[rec.pod.key] = (rec.request, p)
        rec.placement, rec.started = p, t
        del self.pending[rec.pod.key]
        self._waited(rec, t)
        if rec.group is not None and self._group_whole(rec.group):
            since = self.group_since.pop(rec.group, None)
            if since is not None:
                self.group_waits.append((rec.group, t - since))

    def _group_whole(self, group: str) -> bool:
        keys = self.group_members.get(group, [])
        ref = self.pods[keys[0]].pod.request.group if keys else None
        return (ref is not None and len(keys) >= ref.size
                and all(self.pods[k].placement is not None for k in keys))

    # -- measuring -----------------------------------------------------------------------

    def sample(self, t: float) -> None:
        waiting_groups = sum(1 for g in self.group_members if not self._group_whole(g))
        gpus = 0
        alloc = 0
        nodes = 0
        for name in self.gpu_nodes:
            node = self.state.nodes[name]
            used = 0
            for g in node.gpus:
                if not g.idle:
                    used += 1
                    alloc += g.used_milli
            gpus += used
            nodes += 1 if used else 0
        self.samples.append(Sample(t, len(self.pending), waiting_groups, gpus,
                                   round(alloc / 1000, 3), nodes))
        if self.record and not self.busiest and t >= self.busiest_at:
            self.busiest = tuple(self.running.values())

    def _check(self, req: PodRequest, p: Placement, t: float) -> None:
        """The validator's verdict on one placement, on the cluster as it is when it is
        made (its running pods as they are): a slice or whole GPU another pod holds, a
        share without a replica, or without the memory or compute left on a GPU the
        device plugin may hand it, is over-committed. (Judging the running pods again
        later would replay shares whose GPU the plugin chose among pods since gone.)"""
        snap = Snapshot(self.day.nodes, tuple(self.running.values()), (req,))
        for error in validate(snap, (p,), check_running=False):
            if not error.startswith("group "):  # a group in part waits; it over-commits nothing
                self.over.setdefault(req.key, f"t={t:.0f}s {error}")

    def result(self) -> DayResult:
        end = self.day.end
        for key in list(self.pending):
            self._waited(self.pods[key], end, at_end=True)
        for group, since in self.group_since.items():
            self.group_waits.append((group, end - since))
        if self.record and not self.busiest:
            self.busiest = tuple(self.running.values())
        samples = tuple(self.samples)
        return DayResult(
            policy=self.placer.name,
            pods_created=len(self.pods),
            groups_created=self.groups_made,
            pods_waiting_peak=max((s.pending for s in samples), default=0),
            groups_waiting_peak=max((s.groups_waiting for s in samples), default=0),
            wait_p99_s=round(p99(self.waits), 1),
            group_wait_p99_s=round(p99([w for _, w in self.group_waits]), 1),
            overcommitted=len(self.over),
            overcommit_examples=tuple(sorted(self.over.values())[:5]),
            gpus_in_use_peak=max((s.gpus_in_use for s in samples), default=0),
            nodes_in_use_peak=max((s.nodes_in_use for s in samples), default=0),
            gpus_allocated_peak=max((s.gpus_allocated for s in samples), default=0.0),
            series=samples,
            busiest_at=self.busiest_at,
            busiest=self.busiest,
            final=tuple(self.running.values()) if self.record else (),
            waited=tuple(sorted(self.waited, key=lambda w: (-w.seconds, w.key))),
            groups_waited=tuple(sorted(((g, w) for g, w in self.group_waits if w > 0),
                                       key=lambda gw: (-gw[1], gw[0]))),
            refusals=tuple(self.refusals),
        )


def _asked(req: PodRequest) -> str:
    return f"waited for {describe(req)}"


def replay(day: Day, placer: Placer, *, record: bool = True) -> DayResult:
    """Play the day through ``placer``. ``record``: also keep the validator's verdicts
    and the busiest moment's placements (the sizing search does without)."""
    r = _Replay(day, placer, record)
    placer.start(day, r.state, r.workload_of, r.requests)
    i = 0
    events = day.events
    while i < len(events):
        t = events[i].t
        new: list[str] = []
        deleted = False
        while i < len(events) and events[i].t == t:
            e = events[i]
            i += 1
            before = set(r.pending)
            if isinstance(e, Scale):
                deleted |= r.scale(e)
            elif isinstance(e, Rollout):
                r.rollout(e)
            elif isinstance(e, Create):
                for p in e.pods:
                    r.create(p, t)
            else:
                for k in e.keys:
                    r.delete(k, t)
                deleted |= bool(e.keys)
            new.extend(k for k in r.pending if k not in before)
        deleted |= r.step_rollouts(t)
        r.schedule(t, list(r.pending) if deleted else new)
        # A rollout step waits for its new group to run; each step may free room.
        while r.step_rollouts(t):
            r.schedule(t, list(r.pending))
        r.sample(t)
    return r.result()
