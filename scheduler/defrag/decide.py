"""What the defragmenter does now, as one pure function: ``decide_defrag(state, now)``.

The defragmenter (:mod:`scheduler.defrag.loop`, on the active extender only) carries out
one *campaign* at a time: the move :func:`packing.defrag.plan.plan_defrag` found for one
waiting group (its evictions, and the room the group takes afterwards, in one domain).
Nothing here does I/O, takes a lock or reads a clock; the handler gathers the facts
(:class:`DefragState`), applies the :class:`DefragDecision` (evictions through the Eviction
API, holds in the cache, Events, metrics) and feeds the outcomes back.

Rules:

* **plan** mode never evicts: every move planned for a group the book says waits for
  room (or a waiting whole-GPU pod) that differs from the one last told is announced
  (an Event, a log line, a metric); nothing is held.
* **act** mode, no campaign: the first move of the plan (the planner orders them:
  highest priority first, then the most GPUs) for a group the book says waits for room
  (``room_short``), not cooling down, that needs at least one eviction, starts a
  campaign. Lone whole-GPU pods are only announced (no book reserves their room).
  Only the eligible units (:func:`eligible`) are planned: a move planned after one that
  is never carried out could count on the room that one frees.
* a campaign stops, its holds given back, when: the group holds a reservation (placed,
  here or elsewhere: ``placed``), the group has no pending pod any more (``gone``), the
  API refuses an eviction for good (403: ``forbidden``), all its pods are gone but the
  room is not free (another pod took it before it was held: ``room_lost``), or it runs
  past ``campaign_timeout_s`` (``timeout``). A group whose campaign stopped without
  being placed cools down ``cooldown_s`` before another.
* evictions: the campaign's pods still there, not evicted yet and not backing off, in
  the move's order, at most ``evictions_per_minute`` accepted evictions in any 60 s;
  a refusal (429: a PodDisruptionBudget, or another error) is tried again after
  ``retry_base_s * 2**(refusals-1)``, at most ``retry_max_s``.
* holds: every GPU of the room that is idle (or already held) is held for the group,
  as it frees, so neither the evicted pods' replacements nor any other pod take it; with
  it, as it frees, the CPU and memory the members take on that node (``Campaign.takes``).
* hand over: once every pod of the move is gone and every GPU of the room is held, the
  holds are given to the group (the handler releases them and has the reservation book
  place the group in the same locked step).
* consolidation (act mode, optional): inside a configured window, with no group
  waiting for room and no campaign running, when fewer whole nodes are free than the
  largest group seen needs (:class:`Consolidation`), a move planned for a virtual unit
  (key ``gpupack-consolidate/...``: one whole node) that evicts at most
  ``consolidate_max_pods`` pods starts a campaign. It runs like any other (holds,
  rate limit, backoff) and stops when the window closes (``window_closed``) or a group
  starts waiting for room (``group_waiting``); its hand-over gives the holds back, the
  node being whole and free (``consolidated``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from packing.defrag.plan import Move
from scheduler.backoff import doubling

MODES = ("off", "plan", "act")
STOP_REASONS = ("placed", "gone", "forbidden", "room_lost", "timeout", "handed_over",
                "not_placed", "leadership", "consolidated", "window_closed", "group_waiting")
CONSOLIDATE = "gpupack-consolidate/"  # key prefix of consolidation units
REFUSALS = ("pdb", "forbidden", "error")
WINDOW_S = 60.0


@dataclass(frozen=True)
class DefragSettings:
    evictions_per_minute: int = 2
    retry_base_s: float = 2.0
    retry_max_s: float = 120.0
    campaign_timeout_s: float = 900.0
    cooldown_s: float = 60.0
    plan_every_s: float = 30.0  # a waiting group is planned for at most this often...
    plan_min_s: float = 5.0  # ...or sooner when the cluster changed, but not more often
    consolidate_max_pods: int = 2  # a node is "nearly empty" when this many pods free it


@dataclass(frozen=True)
class Target:
    """One eviction of a campaign."""

    pod: str  # namespace/name
    uid: str
    node: str
    to: str  # where its replacement is expected to land


@dataclass(frozen=True)
class Campaign:
    group: str
    leader: str  # the pod the group's Events go to
    targets: tuple[Target, ...]
    room: Mapping[str, tuple[int, ...]]  # node -> the GPUs the group takes there
    started: float
    busy_at_start: int  # GPUs of the room not idle when it started (freed by it)
    cost: int = 0
    # node -> (CPU millicores, memory MiB) the group's members take there: held with the
    # room's GPUs, since the move may evict pods for their CPU or memory too
    takes: Mapping[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Need:
    """A group (or lone whole-GPU pod) with pending pods and no reservation."""

    leader: str  # pod key for its Events
    since: float  # first seen waiting
    room_short: bool  # the book says it waits for room (a campaign may help)
    lone: bool = False  # a lone whole-GPU pod: plan only


@dataclass(frozen=True)
class Consolidation:
    """Whether consolidation may run now, and how far the cluster is from its aim."""

    window_open: bool
    whole_free: int  # nodes of the wanted kind with every GPU free now
    wanted: int  # whole nodes the largest group seen needs


def is_consolidation(key: str) -> bool:
    return key.startswith(CONSOLIDATE)


def parse_window(text: str) -> tuple[int, int]:
    """"HH:MM-HH:MM" (UTC) as minutes of the day; ValueError naming what is wrong."""
    parts = text.strip().split("-")
    if len(parts) != 2:
        raise ValueError(f"{text!r}: expected HH:MM-HH:MM (UTC), e.g. 01:00-05:00")
    out: list[int] = []
    for part in parts:
        hh, sep, mm = part.strip().partition(":")
        if not sep or not hh.isdigit() or not mm.isdigit() or len(mm) != 2:
            raise ValueError(f"{text!r}: {part!r} is not HH:MM")
        h, m = int(hh), int(mm)
        if not (0 <= h <= 24 and 0 <= m < 60) or (h == 24 and m != 0):
            raise ValueError(f"{text!r}: {part!r} is not a time of day (00:00-24:00)")
        out.append(h * 60 + m)
    start, end = out
    return start % 1440, end % 1440  # 24:00 is midnight; equal ends: the whole day


def in_window(window: tuple[int, int] | None, now: float) -> bool:
    """Whether ``now`` (epoch seconds) is inside ``window`` (minutes of the UTC day,
    start inclusive, end exclusive; a window may wrap midnight; None: never)."""
    if window is None:
        return False
    start, end = window
    minute = int(now // 60) % 1440
    if start == end:
        return True
    return start <= minute < end if start < end else (minute >= start or minute < end)


@dataclass(frozen=True)
class Attempt:
    refusals: int
    next_try: float
    last: str  # one of REFUSALS


@dataclass(frozen=True)
class DefragState:
    mode: str  # plan | act
    campaign: Campaign | None
    needs: Mapping[str, Need]
    placed: frozenset[str]  # groups holding a reservation now
    present: Mapping[str, str]  # campaign pods still there: key -> uid
    room_free: Mapping[str, frozenset[int]]  # room GPUs idle or held by us, per node
    held: Mapping[str, frozenset[int]]  # room GPUs our holds count, per node
    evicted: Mapping[str, float] = field(default_factory=dict)  # pod -> accepted at
    attempts: Mapping[str, Attempt] = field(default_factory=dict)
    recent: tuple[float, ...] = ()  # when evictions were accepted
    plan: Sequence[Move] | None = None  # this pass's plan (None: not planned)
    cooldown: Mapping[str, float] = field(default_factory=dict)  # group -> not before
    announced: Mapping[str, tuple[object, ...]] = field(default_factory=dict)
    uids: Mapping[str, str] = field(default_factory=dict)  # running pod -> uid (plan)
    consolidation: Consolidation | None = None  # None: consolidation is off


@dataclass(frozen=True)
class DefragDecision:
    start: Campaign | None = None
    evict: tuple[Target, ...] = ()
    hold: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # node -> GPUs held
    hand_over: bool = False
    stop: str | None = None
    announce: tuple[Move, ...] = ()
    announced: Mapping[str, tuple[object, ...]] = field(default_factory=dict)
    cooldown: Mapping[str, float] = field(default_factory=dict)


def signature(move: Move) -> tuple[object, ...]:
    return (tuple((e.pod, e.node) for e in move.evictions), tuple(sorted(
        (n, tuple(g)) for n, g in move.frees().items())))


def window(recent: Sequence[float], now: float) -> tuple[float, ...]:
    return tuple(t for t in recent if now - t < WINDOW_S)


def backoff(refusals: int, cfg: DefragSettings) -> float:
    return doubling(cfg.retry_base_s, refusals, cfg.retry_max_s)


def wants_plan(state: DefragState, now: float, last_plan: float, changed: bool,
               cfg: DefragSettings) -> bool:
    """Whether the handler should plan this pass: something waits that a plan could
    serve, no campaign runs, and the last plan is old (or the cluster changed since it,
    and it is not too recent)."""
    if state.campaign is not None:
        return False
    if not any(eligible(g, n, state, now) for g, n in state.needs.items()) \
            and not consolidating(state):
        return False
    age = now - last_plan
    return age >= cfg.plan_every_s or (changed and age >= cfg.plan_min_s)


def consolidating(state: DefragState) -> bool:
    """Whether a consolidation move is wanted now (no group needs a campaign then: the
    handler plans for the virtual unit only when no group is eligible)."""
    c = state.consolidation
    return state.mode == "act" and c is not None and c.window_open and c.whole_free < c.wanted


def _group_waits(state: DefragState, now: float) -> bool:
    return any(eligible(g, n, state, now) for g, n in state.needs.items()
               if not n.lone)


def eligible(group: str, need: Need, state: DefragState, now: float) -> bool:
    """Whether a plan may serve ``group`` now: plan mode tells groups waiting for room
    and lone whole-GPU pods; act mode acts only for groups waiting for room, not cooling
    down. The handler plans for these units only (see ``Defragmenter._plan``)."""
    if state.mode == "plan":
        return need.room_short or need.lone
    return need.room_short and not need.lone and now >= state.cooldown.get(group, 0.0)


def wanted_room_holds(c: Campaign, room_free: Mapping[str, frozenset[int]]
                 ) -> dict[str, tuple[int, ...]]:
    """The room's GPUs to hold now: those free (or held already), per node."""
    out: dict[str, tuple[int, ...]] = {}
    for node, gpus in sorted(c.room.items()):
        free = tuple(g for g in gpus if g in room_free.get(node, frozenset()))
        if free:
            out[node] = free
    return out


def decide_defrag(state: DefragState, now: float, cfg: DefragSettings) -> DefragDecision:
    if state.mode == "plan":
        return _announce(state)
    if state.campaign is None:
        return _start(state, now, cfg)
    return _run(state.campaign, state, now, cfg)


def _announce(state: DefragState) -> DefragDecision:
    """Plan mode: tell each move that differs from the last one told for its group."""
    told = {g: s for g, s in state.announced.items() if g in state.needs}
    new: list[Move] = []
    for m in state.plan or ():
        need = state.needs.get(m.group)
        if need is None or not m.evictions or not (need.room_short or need.lone):
            continue
        sig = signature(m)
        if told.get(m.group) != sig:
            told[m.group] = sig
            new.append(m)
    return DefragDecision(announce=tuple(new), announced=told)


def _start(state: DefragState, now: float, cfg: DefragSettings) -> DefragDecision:
    cooldown = {g: t for g, t in state.cooldown.items() if t > now}
    for m in state.plan or ():
        need = state.needs.get(m.group)
        if need is None or not m.evictions or not eligible(m.group, need, state, now):
            continue
        frees = m.frees()
        busy = sum(len(g) - len(set(g) & state.room_free.get(n, frozenset()))
                   for n, g in frees.items())
        c = Campaign(
            group=m.group, leader=need.leader,
            targets=tuple(Target(e.pod, state.uids.get(e.pod, ""), e.node, e.to.node)
                          for e in m.evictions),
            room={n: tuple(g) for n, g in frees.items()}, started=now, busy_at_start=busy,
            cost=m.cost, takes=m.cpu_memory())
        return DefragDecision(start=c, hold=wanted_room_holds(c, state.room_free),
                              cooldown=cooldown)
    if consolidating(state) and not _group_waits(state, now):
        for m in state.plan or ():
            if not is_consolidation(m.group) or not \
                    0 < len(m.evictions) <= cfg.consolidate_max_pods:
                continue
            frees = m.frees()
            busy = sum(len(g) - len(set(g) & state.room_free.get(n, frozenset()))
                       for n, g in frees.items())
            c = Campaign(
                group=m.group, leader="",
                targets=tuple(Target(e.pod, state.uids.get(e.pod, ""), e.node, e.to.node)
                              for e in m.evictions),
                room={n: tuple(g) for n, g in frees.items()}, started=now,
                busy_at_start=busy, cost=m.cost, takes=m.cpu_memory())
            return DefragDecision(start=c, hold=wanted_room_holds(c, state.room_free),
                            cooldown=cooldown)
    return DefragDecision(cooldown=cooldown)


def _gone(t: Target, present: Mapping[str, str]) -> bool:
    uid = present.get(t.pod)
    return uid is None or bool(t.uid and uid != t.uid)


def _run(c: Campaign, state: DefragState, now: float, cfg: DefragSettings) -> DefragDecision:
    cooldown = {g: t for g, t in state.cooldown.items() if t > now}

    def stop(reason: str, cool: bool = True) -> DefragDecision:
        if cool:
            cooldown[c.group] = now + cfg.cooldown_s
        return DefragDecision(stop=reason, cooldown=cooldown)

    if is_consolidation(c.group):
        cons = state.consolidation
        if cons is None or not cons.window_open:
            return stop("window_closed", cool=False)
        if _group_waits(state, now):
            return stop("group_waiting", cool=False)
    elif c.group in state.placed:
        return stop("placed", cool=False)
    elif c.group not in state.needs:
        return stop("gone", cool=False)
    if any(a.last == "forbidden" for p, a in state.attempts.items()
           if p in {t.pod for t in c.targets}):
        return stop("forbidden")
    if now - c.started >= cfg.campaign_timeout_s:
        return stop("timeout")
    hold = wanted_room_holds(c, state.room_free)
    left = [t for t in c.targets if not _gone(t, state.present)]
    room_held = all(set(g) <= set(hold.get(n, ())) for n, g in c.room.items())
    if not left:
        if room_held:
            return DefragDecision(hold=hold, hand_over=True, cooldown=cooldown)
        return stop("room_lost")
    budget = cfg.evictions_per_minute - len(window(state.recent, now))
    evict: list[Target] = []
    for t in left:
        if budget <= 0:
            break
        if t.pod in state.evicted:
            continue  # accepted: waiting for it to go
        a = state.attempts.get(t.pod)
        if a is not None and now < a.next_try:
            continue
        evict.append(t)
        budget -= 1
    return DefragDecision(evict=tuple(evict), hold=hold, cooldown=cooldown)


def after_refusal(attempts: Mapping[str, Attempt], pod: str, outcome: str, now: float,
                  cfg: DefragSettings) -> dict[str, Attempt]:
    """The attempts book after the API refused evicting ``pod`` (``outcome`` in
    REFUSALS)."""
    out = dict(attempts)
    n = (out[pod].refusals if pod in out else 0) + 1
    out[pod] = Attempt(n, now + backoff(n, cfg), outcome)
    return out
