"""The MIG actuator's decisions: one pure function, :func:`decide_mig` (issue 19, item 2).

Input (:class:`ActuatorState`): every node with its GPUs as the extender's cache counts
them (mode, instances, who holds each GPU), the node's opt-in/freeze, its
``nvidia.com/mig.config`` and ``nvidia.com/mig.config.state`` labels; the changes in
flight (what this actuator asked the MIG manager for, mirrored in its ConfigMap); the
pending MIG pods and whole-GPU pods; per-node back-off; when each idle MIG GPU became
idle; recent MIG arrivals for the forecast. Output (:class:`MigDecision`): changes to
start, changes that ended (success, failed, timeout, superseded), the GPUs to hold now,
the new back-off, and the figures the metrics show.

Rules (each has a table row in ``tests/scheduler/test_mig_actuator.py``):

* **opt-in and freeze**: only nodes whose ``gpupack.io/mig-reconfigure`` is ``"true"``
  with the actuator on (``MigReconfigure.ON``) are candidates; ``"false"`` (freeze) or
  no label: nothing is started there. A freeze does not cancel a change already handed
  to the MIG manager (it cannot be called back); it is followed to its end.
* **the MIG manager at work**: a node whose ``nvidia.com/mig.config.state`` is
  ``pending`` or ``rebooting`` (someone else's change, or one of ours that timed out)
  is not a candidate: a new label would redirect the manager mid-change.
* **GPU indices must be known**: on a node without the node agent's inventory the
  extender infers per-GPU detail from allocatable counts, at indices of its own choosing
  (MIG GPUs last), and does not know which physical GPU a pod uses. Such a node is a
  candidate only while nothing on it is held: a mig-parted entry names devices by index,
  and on an idle node a wrong index changes only idle GPUs.
* **busy GPUs are never touched**: a GPU any pod, assumed bind or reservation (other
  than this actuator's own hold) uses is ``held`` for the planner, which never changes
  a held GPU; the handler re-checks by taking the holds under the cache lock before it
  writes anything.
* **MIG mode changes only on idle nodes**: turning a GPU to MIG or back to whole is
  planned only on a node where no GPU is in use, and the change holds every GPU of the
  node (``Change.node_wide``) until it is applied: mig-parted's mode step clears every
  MIG GPU of the node and may reset all of its GPUs. Re-laying an idle MIG GPU touches
  that GPU alone.
* **one node per GPU model in flight**: models with a change in flight are passed to the
  planner as ``in_flight``; it changes at most one node per model.
* **hold until the slices appear**: every GPU of a change in flight whose reported
  layout is not yet the target is held (a whole GPU whole, a MIG GPU's free instances
  one by one), so filter, prioritize, the planner and groups place nothing on it. The
  hold ends GPU by GPU when the node reports the target layout (allocatable / agent
  inventory), before the state label says ``success``.
* **end of a change**: ``success`` once the state label is ``success`` and every target
  GPU reports its target layout; ``failed`` when the state label is ``failed``;
  ``timeout`` after ``MigSettings.timeout_s``; ``superseded`` when someone else relabelled
  the node or the node went. The node's label is judged only ``label_grace_s`` after it
  was written: before that the cache may not show the label this actuator wrote (the
  watch lags, or the patch's answer was lost); a node whose object cannot be read is
  not "gone" (its change is followed, unheld, to its end or its timeout). ``failed``
  and ``timeout`` back the node off (``backoff_s`` doubling per failure up to
  ``backoff_max_s``); ``success`` clears it.
* **the entry before the label**: a change starts by writing its mig-parted entry; the
  node's config label follows ``config_propagation_s`` later (``MigDecision.labels``),
  once the kubelet has copied the ConfigMap into the MIG manager's file: the manager
  reads that file the moment the label changes, and an entry not in it yet is a
  ``failed`` change. The GPUs are held from the start; the timeout counts from it too.
* **a new label value per attempt**: the MIG manager acts when the label's value
  changes, so a change whose entry has the name the node's label already carries (the
  same layouts asked again after a failure) gets the entry under another name.
* **a burst is planned as one**: nothing starts while MIG pods still arrive (the last
  one less than ``settle_s`` ago), unless the oldest has waited ``max_settle_s``.
* **MIG GPUs idle for less than ``min_idle_s``** are left alone (no flapping between
  layouts while pods come and go).
* **demand**: a pending MIG pod waits for a new slice only when no free slice and no
  slice being created (in flight) of its profile, on a GPU model it allows, is left for
  it (pods in arrival order). Free slices of cordoned nodes or nodes with a NoSchedule /
  NoExecute taint do not count (pods' tolerations are not judged), and such nodes are
  never changed. A pending whole-GPU pod waits when no node has that many
  whole GPUs free of a model it allows (node selectors are not judged here).
* **forecast**: per (model, profile), the exponentially decayed count of recent *unmet*
  MIG arrivals, pods that found no free slice (:func:`unmet_pods`: pending at a step with
  no free slice of their profile left for them, those a change in flight will serve
  included; half-life ``MigSettings.half_life_s``): how many more such pods the next
  half-life brings if the recent rate holds. The planner uses it only to shape layouts
  of GPUs that change for pods that wait; it never converts a GPU by itself. Pods that
  free slices serve are not demand for new ones: counted too (every arrival), they
  filled converted GPUs with instances of profiles whose free pools were not empty, and
  those stood idle (``bench/mig.py`` seed 1: 49.18 -> 53.22 GPUs without compaction,
  43.62 -> 46.57 with it). The handler records a pod when a step first finds it unmet,
  so the count does not depend on whether kube-scheduler bound a served pod before a
  step saw it pending.

The planner (:func:`packing.mig.plan.plan_mig`, CP-SAT with explicit limits and a greedy
fallback) chooses the layouts; this module only says what it is given and what follows.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from packing.catalog import get_model
from packing.cpsat import SolverParams
from packing.mig.layout import MigSlot
from packing.mig.plan import (
    DEFAULT_PARAMS,
    WHOLE,
    MigDemand,
    MigGpu,
    MigNode,
    NodeChange,
    WholeDemand,
    plan_mig,
)
from packing.model import GpuMode, MigReconfigure
from packing.state import GpuState
from scheduler.backoff import doubling
from scheduler.mig.changes import Backoff, Change, Target

HOLD_PREFIX = "gpupack-mig/"  # cache hold keys of this actuator (never a pod's key)
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"


@dataclass(frozen=True)
class MigSettings:
    timeout_s: float = 900.0  # a change not done by then counts as failed
    backoff_s: float = 60.0  # first back-off of a node after a failure; doubles
    backoff_max_s: float = 3600.0
    min_idle_s: float = 60.0  # a MIG GPU idle for less is not re-laid out
    half_life_s: float = 300.0  # of the arrival forecast
    # A burst is planned as one: nothing starts until no MIG pod has arrived for
    # settle_s, unless the oldest waiting one has waited max_settle_s.
    settle_s: float = 2.0
    max_settle_s: float = 10.0
    # The node's label is not judged before this long after it was written (the watch
    # may not have shown the label this actuator wrote yet).
    label_grace_s: float = 30.0
    # The MIG manager reads the mig-parted config from a file the kubelet copies from
    # the ConfigMap at its own sync (its sync period, 1 min by default, plus its cache's
    # delay), and it reads it the moment the node's label changes: an entry labelled at
    # once is not in its file yet, and it reports failed. The label is set this long
    # after the entry was written (0: at once, for a manager that reads the API).
    config_propagation_s: float = 90.0


DEFAULT_SETTINGS = MigSettings()


def _sort_key(t: Target) -> tuple[int, Target]:
    return (0, ()) if isinstance(t, str) else (1, t)


@dataclass(frozen=True)
class GpuView:
    index: int
    model: str
    mig_enabled: bool
    layout: tuple[MigSlot, ...] = ()  # its instances (MIG on)
    free: tuple[MigSlot, ...] = ()  # instances no one holds (MIG on)
    holders: frozenset[str] = frozenset()  # pods / reservations / holds using it
    inferred: bool = False  # detail inferred from allocatable counts (no agent inventory)
    # Its MIG instances are made one per claim by the NVIDIA DRA driver's DynamicMIG (a
    # DRA node's partitionable GPU): ``layout`` is the instances claims hold, ``free`` is
    # empty, and the MIG manager never re-lays it (the actuator leaves its node alone).
    dynamic: bool = False

    @property
    def layout_now(self) -> Target:
        return self.counts if self.mig_enabled else WHOLE

    @property
    def busy(self) -> bool:
        """Used by anything but this actuator's own holds."""
        return any(not h.startswith(HOLD_PREFIX) for h in self.holders)

    @property
    def counts(self) -> tuple[tuple[str, int], ...]:
        return tuple(sorted(Counter(s.profile for s in self.layout).items()))

    def matches(self, target: Target) -> bool:
        if target == WHOLE:
            return not self.mig_enabled
        return self.mig_enabled and self.counts == target


def gpu_view(g: GpuState, dynamic: bool = False) -> GpuView:
    """A GPU of the packer's state as the actuator sees it: its instances (MIG on), the
    free ones, and every holder (whole owner, shares, instance owners). ``dynamic``: its
    instances are made per claim by DynamicMIG (:attr:`GpuView.dynamic`)."""
    holders: set[str] = set(g.shared_owners)
    if g.whole_owner is not None:
        holders.add(g.whole_owner)
    layout, free = [], []
    for start, (profile, owner) in sorted(g.instances.items()):
        if g.info.mode is GpuMode.MIG:
            layout.append(MigSlot(profile, start))
            if owner is None:
                free.append(MigSlot(profile, start))
        if owner is not None:
            holders.add(owner)
    return GpuView(g.info.index, g.info.model, g.info.mode is GpuMode.MIG, tuple(layout),
                   tuple(free), frozenset(holders), g.info.inferred, dynamic)


@dataclass(frozen=True)
class NodeView:
    name: str
    reconfigure: MigReconfigure
    gpus: tuple[GpuView, ...] = ()
    unschedulable: bool = False
    config_label: str | None = None
    state_label: str | None = None
    # A NoSchedule/NoExecute taint: its free slices serve no ordinary pod, and its GPUs
    # are not changed (they are someone's dedicated nodes).
    tainted: bool = False


@dataclass(frozen=True)
class MigPod:
    key: str
    profile: str
    models: frozenset[str] = frozenset()  # allowed catalog models; empty: any
    arrived: float = -math.inf  # when the actuator first saw it pending


@dataclass(frozen=True)
class WholePod:
    key: str
    gpus: int
    models: frozenset[str] = frozenset()


def backed_off(prev: Backoff | None, now: float, s: MigSettings) -> Backoff:
    """The back-off after one more failure: ``backoff_s`` doubling per failure, up to
    ``backoff_max_s``."""
    fails = prev.failures + 1 if prev is not None else 1
    return Backoff(now + doubling(s.backoff_s, fails, s.backoff_max_s), fails)


@dataclass(frozen=True)
class ActuatorState:
    nodes: tuple[NodeView, ...]
    in_flight: Mapping[str, Change] = field(default_factory=dict)  # node -> change
    mig_pods: tuple[MigPod, ...] = ()  # pending, in arrival order
    whole_pods: tuple[WholePod, ...] = ()  # pending (group members with a room excluded)
    backoff: Mapping[str, Backoff] = field(default_factory=dict)
    idle_since: Mapping[tuple[str, int], float] = field(default_factory=dict)
    arrivals: tuple[tuple[float, str, frozenset[str]], ...] = ()  # (time, profile, models)
    unreadable: frozenset[str] = frozenset()  # nodes whose object cannot be read


@dataclass(frozen=True)
class Hold:
    """A GPU (whole) or one of its free instances (profile, start) held for a change."""

    node: str
    gpu: int
    model: str
    profile: str | None = None
    start: int | None = None
    prefix: str = HOLD_PREFIX  # whose hold: a change's, or a drain's (mig_compact)

    @property
    def key(self) -> str:
        tail = "" if self.start is None else f"/{self.start}"
        return f"{self.prefix}{self.node}/{self.gpu}{tail}"


@dataclass(frozen=True)
class Start:
    change: Change
    plan: NodeChange  # the mig-parted entry (every GPU of the node)
    why: str


@dataclass(frozen=True)
class Finish:
    change: Change
    result: str  # success | failed | timeout | superseded
    message: str


@dataclass(frozen=True)
class MigDecision:
    starts: tuple[Start, ...] = ()
    finishes: tuple[Finish, ...] = ()
    holds: tuple[Hold, ...] = ()  # every hold wanted now (in flight and started)
    backoff: Mapping[str, Backoff] = field(default_factory=dict)
    waiting: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (model, p)
    free: Mapping[tuple[str, str], int] = field(default_factory=dict)
    forecast: Mapping[tuple[str, str], int] = field(default_factory=dict)
    plan_status: str = "not-run"
    # Changes in flight whose entry has had time to reach the MIG manager: label the
    # node now (each with its labelled_at set).
    labels: tuple[Change, ...] = ()


def _has_profile(model: str, profile: str) -> bool:
    try:
        geom = get_model(model).mig
    except KeyError:
        return False
    return geom is not None and any(p.name == profile for p in geom.profiles)


def _allowed(models: frozenset[str], profile: str, present: Sequence[str]) -> list[str]:
    return [m for m in present if (not models or m in models) and _has_profile(m, profile)]


def forecast(arrivals: Sequence[tuple[float, str, frozenset[str]]], now: float,
             half_life_s: float, present: Sequence[str]) -> dict[tuple[str, str], int]:
    """Per (model, profile): the exponentially decayed count of recent (unmet) arrivals (each
    weighs 2^-(age / half-life)), rounded down: as many arrivals over the next half-life
    as the recent rate gives. An arrival counts for the first model it allows."""
    acc: dict[tuple[str, str], float] = defaultdict(float)
    for t, profile, models in arrivals:
        allowed = _allowed(models, profile, present)
        if allowed and t <= now:
            acc[allowed[0], profile] += math.pow(2.0, -(now - t) / half_life_s)
    return {k: int(v) for k, v in acc.items() if int(v) > 0}


def _supply(state: ActuatorState) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    """Free instances per (model, profile) on schedulable nodes, and instances being
    created by changes in flight (target minus what the GPU has)."""
    free: dict[tuple[str, str], int] = defaultdict(int)
    incoming: dict[tuple[str, str], int] = defaultdict(int)
    for n in state.nodes:
        change = state.in_flight.get(n.name)
        if change is not None and applied(change, n):
            change = None  # its slices are there: counted free below, not coming
        for g in n.gpus:
            target = change.target(g.index) if change is not None else None
            if target is not None and not g.matches(target):
                if not isinstance(target, str):
                    have = dict(g.counts) if g.mig_enabled else {}
                    for p, k in target:
                        incoming[g.model, p] += max(0, k - have.get(p, 0))
                continue  # held until it matches: its free instances are not free
            if n.unschedulable or n.tainted or not g.mig_enabled:
                continue
            for s in g.free:
                free[g.model, s.profile] += 1
    return dict(free), dict(incoming)


def waiting_demand(state: ActuatorState) -> tuple[dict[tuple[str, str], int],
                                                   dict[tuple[str, str], int]]:
    """(waiting, free) per (model, profile); see the module docstring."""
    free, incoming = _supply(state)
    left = Counter(free)
    left.update(incoming)
    waiting: dict[tuple[str, str], int] = defaultdict(int)
    for pod, model in _unserved(state, left):
        waiting[model, pod.profile] += 1
    return dict(waiting), free


def unmet_pods(state: ActuatorState) -> tuple[str, ...]:
    """Keys of the pending MIG pods that no free slice serves (pods in arrival order),
    those waiting for slices being created included: the arrivals the forecast counts
    (see *forecast* in the module docstring)."""
    free, _ = _supply(state)
    return tuple(pod.key for pod, _ in _unserved(state, Counter(free)))


def _unserved(state: ActuatorState, left: Counter[tuple[str, str]]
              ) -> list[tuple[MigPod, str]]:
    """The pending MIG pods that the slices in ``left`` (per (model, profile); used up
    here) do not serve, in arrival order, each with the model it would get a new slice
    of (one of an opted-in node when it allows one); pods whose profile no GPU in the
    cluster has are left out (nothing can be created for them)."""
    present = sorted({g.model for n in state.nodes for g in n.gpus})
    cand_models = {g.model for n in state.nodes if n.reconfigure is MigReconfigure.ON
                   for g in n.gpus}
    out: list[tuple[MigPod, str]] = []
    for pod in state.mig_pods:
        allowed = _allowed(pod.models, pod.profile, present)
        took = next((m for m in allowed if left[m, pod.profile] > 0), None)
        if took is not None:
            left[took, pod.profile] -= 1
            continue
        if not allowed:
            continue  # no GPU in the cluster has this profile: nothing to create
        out.append((pod, next((m for m in allowed if m in cand_models), allowed[0])))
    return out


def _whole_waiting(state: ActuatorState) -> tuple[WholeDemand, ...]:
    free_by_node = []
    for n in state.nodes:
        if n.unschedulable or n.tainted:
            continue
        per_model: Counter[str] = Counter(g.model for g in n.gpus
                                          if not g.mig_enabled and not g.holders)
        free_by_node.append(per_model)
    out = []
    for pod in state.whole_pods:
        served = any(sum(k for m, k in c.items() if not pod.models or m in pod.models)
                     >= pod.gpus for c in free_by_node)
        if not served:
            out.append(WholeDemand(pod.key, pod.gpus, pod.models))
    return tuple(out)


BUSY_STATES = frozenset({"pending", "rebooting"})  # the MIG manager at work


def _finish(change: Change, node: NodeView | None, now: float, s: MigSettings,
            unreadable: frozenset[str] = frozenset()) -> Finish | None:
    if node is None and change.node in unreadable:
        if now - change.started > s.timeout_s:
            return Finish(change, "timeout", f"node {change.node} cannot be read; "
                          f"{change.config} not seen applied after {s.timeout_s:.0f} s")
        return None
    if node is None:
        return Finish(change, "superseded", f"node {change.node} is gone")
    if change.labelled_at is None:  # the entry is on its way to the MIG manager's file
        if now - change.started > s.timeout_s:
            return Finish(change, "timeout", f"{change.config} never labelled in "
                          f"{s.timeout_s:.0f} s")
        return None
    if node.config_label != change.config and now - change.labelled_at < s.label_grace_s:
        return None  # our own label may not be in the cache yet
    if node.config_label != change.config:
        return Finish(change, "superseded",
                      f"{CONFIG_LABEL} is {node.config_label!r}, not {change.config!r}: "
                      "someone else changed the node's MIG config")
    if node.state_label == "failed":
        return Finish(change, "failed", f"the MIG manager reports {STATE_LABEL}=failed for "
                                        f"{change.config}")
    done = applied(change, node)
    if done and node.state_label == "success":
        return Finish(change, "success", f"{change.config} applied: "
                      + ", ".join(f"GPU {i} {_words(t)}" for i, t in change.targets))
    if now - change.started > s.timeout_s:
        return Finish(change, "timeout",
                      f"{change.config} not applied after {s.timeout_s:.0f} s (state "
                      f"{node.state_label!r}, layouts {'' if done else 'not '}as asked)")
    return None


AGAIN = "-again"


def _another_name(name: str) -> str:
    """The entry's other name: ``<name>-again``, and back (two suffice to change the
    label's value whenever the same layouts are asked twice in a row)."""
    return name.removesuffix(AGAIN) if name.endswith(AGAIN) else name + AGAIN


def _words(t: Target) -> str:
    if isinstance(t, str):
        return "whole"
    return "MIG " + " + ".join(f"{n}x{p}" for p, n in t)


def applied(change: Change, node: NodeView) -> bool:
    """Whether the node reports the change's layouts: each target GPU in its target
    layout or, where the node's GPU detail is inferred from allocatable counts (which
    cannot say which index is which), the node's layouts equal to the expected multiset."""
    gpus = {g.index: g for g in node.gpus}
    if all(i in gpus and gpus[i].matches(t) for i, t in change.targets):
        return True
    return bool(change.expected) and any(g.inferred for g in node.gpus) and sorted(
        (g.layout_now for g in node.gpus), key=_sort_key) == list(change.expected)


def expected_layouts(node: NodeView, targets: Sequence[tuple[int, Target]]
                     ) -> tuple[Target, ...]:
    t = dict(targets)
    return tuple(sorted((t.get(g.index, g.layout_now) for g in node.gpus), key=_sort_key))


def holds_for(change: Change, node: NodeView | None) -> list[Hold]:
    """What a change in flight holds now: each target GPU not yet in its target layout
    (every GPU of the node for a change of MIG mode, ``node_wide``), whole (MIG off) or
    each of its free instances (MIG on); nothing once the node reports the change
    (:func:`applied`)."""
    if node is None or applied(change, node):
        return []
    out: list[Hold] = []
    for g in node.gpus:
        target = change.target(g.index)
        if (target is None and not change.node_wide) or (
                target is not None and g.matches(target)):
            continue
        if not g.mig_enabled:
            out.append(Hold(node.name, g.index, g.model))
            continue
        # Each instance no one else holds: the free ones, and those this change holds
        # already (a held instance is not free; dropping its hold on the next decision
        # would free it for a pod while the MIG manager re-lays the GPU).
        for s in g.layout:
            h = Hold(node.name, g.index, g.model, s.profile, s.start)
            if s in g.free or h.key in g.holders:
                out.append(h)
    return out


def _planner_nodes(state: ActuatorState, now: float, s: MigSettings,
                   backoff: Mapping[str, Backoff]) -> list[MigNode]:
    out = []
    for n in state.nodes:
        gpus = []
        for g in n.gpus:
            try:
                if get_model(g.model).mig is None:
                    continue
            except KeyError:
                continue
            recently_idle = g.mig_enabled and now - state.idle_since.get(
                (n.name, g.index), now) < s.min_idle_s
            gpus.append(MigGpu(g.index, g.model, g.mig_enabled, g.layout,
                               held=bool(g.holders) or recently_idle))
        # In use: a holder other than this actuator's own hold (a change in flight keeps
        # its node out of the candidates anyway).
        in_use = any(h for g in n.gpus for h in g.holders if not h.startswith(HOLD_PREFIX))
        b = backoff.get(n.name)
        guessed = any(g.inferred for g in n.gpus)
        opted = (n.reconfigure is MigReconfigure.ON and not n.unschedulable
                 and not n.tainted and n.name not in state.in_flight
                 and not any(g.dynamic for g in n.gpus)
                 and (b is None or b.until <= now) and n.state_label not in BUSY_STATES
                 and not (guessed and any(g.holders for g in n.gpus)))
        if gpus:
            out.append(MigNode(n.name, tuple(gpus), opted_in=opted, in_use=in_use))
    return out


def decide_mig(state: ActuatorState, now: float, settings: MigSettings = DEFAULT_SETTINGS,
           params: SolverParams = DEFAULT_PARAMS) -> MigDecision:
    """What the actuator does now; see the module docstring."""
    nodes = {n.name: n for n in state.nodes}
    backoff = {k: v for k, v in state.backoff.items()}
    finishes: list[Finish] = []
    in_flight: dict[str, Change] = {}
    labels: list[Change] = []
    for name, change in sorted(state.in_flight.items()):
        f = _finish(change, nodes.get(name), now, settings, state.unreadable)
        if f is None:
            if (change.labelled_at is None
                    and now - change.started >= settings.config_propagation_s):
                change = replace(change, labelled_at=now)
                labels.append(change)
            in_flight[name] = change
            continue
        finishes.append(f)
        if f.result in ("failed", "timeout"):
            backoff[name] = backed_off(backoff.get(name), now, settings)
        elif f.result == "success":
            backoff.pop(name, None)
    live = ActuatorState(state.nodes, in_flight, state.mig_pods, state.whole_pods, backoff,
                         state.idle_since, state.arrivals, state.unreadable)
    waiting, free = waiting_demand(live)
    present = sorted({g.model for n in state.nodes for g in n.gpus})
    fore = forecast(state.arrivals, now, settings.half_life_s, present)
    whole = _whole_waiting(live)
    holds = [h for name, c in in_flight.items() for h in holds_for(c, nodes.get(name))]
    starts: list[Start] = []
    status = "nothing-to-do"
    busy_models = frozenset(m for c in in_flight.values() for m in c.models)
    arrivals = [p.arrived for p in state.mig_pods]
    settling = bool(arrivals) and any(waiting.values()) and not whole and (
        now - max(arrivals) < settings.settle_s and now - min(arrivals) < settings.max_settle_s)
    if settling:
        status = "settling"
    elif any(waiting.values()) or whole:
        pnodes = _planner_nodes(live, now, settings, backoff)
        can = any(n.opted_in and any(not g.held and g.model not in busy_models for g in n.gpus)
                  for n in pnodes)
        status = "no-candidate-gpu"
        if can:
            plan = plan_mig(pnodes, MigDemand(waiting, fore, whole), in_flight=busy_models,
                            params=params)
            status = plan.status
            for ch in plan.changes:
                if ch.config_name == nodes[ch.node].config_label:
                    # The same entry again (after a failure): the label must change.
                    ch = replace(ch, config_name=_another_name(ch.config_name))
                config = {i: d for d in ch.devices for i in d.devices}
                targets = tuple((i, WHOLE if not config[i].mig_enabled
                                 else tuple(config[i].mig_devices)) for i in ch.changed)
                view = nodes[ch.node]
                modes = {g.index: g.mig_enabled for g in view.gpus}
                node_wide = any((t != WHOLE) != modes.get(i, False) for i, t in targets)
                change = Change(ch.node, ch.config_name, targets, ch.models, now,
                                expected_layouts(view, targets),
                                now if settings.config_propagation_s <= 0 else None,
                                node_wide)
                why = _why(ch, plan.served, plan.whole_served)
                starts.append(Start(change, ch, why))
                holds += holds_for(change, nodes.get(ch.node))
    return MigDecision(tuple(starts), tuple(finishes), tuple(holds), backoff, waiting, free,
                    fore, status, tuple(labels))


def _why(ch: NodeChange, served: Mapping[tuple[str, str], int],
         whole_served: Sequence[str]) -> str:
    parts = [f"{n} waiting {p} pod(s) on {m}" for (m, p), n in sorted(served.items()) if n]
    if whole_served:
        parts.append(f"{len(whole_served)} waiting whole-GPU pod(s)")
    return (f"GPU(s) {', '.join(str(i) for i in ch.changed)} of {ch.node} re-partitioned "
            f"for {'; '.join(parts) or 'waiting pods'}")
