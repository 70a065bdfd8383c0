"""The defragmenter's pure decision (scheduler/defrag/decide.py), table-driven: rate
limit, one campaign (one domain) at a time, 429 backoff, stopping when the need goes,
holding the freed room, handing it over."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from packing.defrag.plan import Eviction, Move
from packing.model import Placement
from scheduler.defrag.decide import (
    Attempt,
    Campaign,
    Consolidation,
    DefragSettings,
    DefragState,
    Need,
    Target,
    after_refusal,
    backoff,
    decide_defrag,
    in_window,
    parse_window,
    wanted_room_holds,
    wants_plan,
)

G = "llm/vllm/0"
CFG = DefragSettings(evictions_per_minute=2, retry_base_s=2.0, retry_max_s=30.0,
               campaign_timeout_s=600.0, cooldown_s=60.0, plan_every_s=30.0, plan_min_s=5.0)
NOW = 1000.0
ROOM = {"a": (0, 1, 2, 3, 4, 5, 6, 7)}
PODS = ("ns/p1", "ns/p2", "ns/p3")


def campaign(**kw: Any) -> Campaign:
    base = Campaign(group=G, leader="llm/vllm-0",
                    targets=tuple(Target(p, f"uid-{p}", "a", "b") for p in PODS),
                    room=ROOM, started=NOW - 10, busy_at_start=6)
    return replace(base, **kw)


def state(**kw: Any) -> DefragState:
    base = DefragState(
        mode="act", campaign=campaign(),
        needs={G: Need("llm/vllm-0", NOW - 100, room_short=True)},
        placed=frozenset(), present={p: f"uid-{p}" for p in PODS},
        room_free={"a": frozenset({0, 1})}, held={"a": frozenset({0, 1})})
    return replace(base, **kw)


def move(group: str = G, pods: tuple[str, ...] = ("ns/p1",), node: str = "a") -> Move:
    return Move(group, tuple(Eviction(p, node, Placement(p, "b", (0,))) for p in pods),
                (Placement(f"{group}#m0", node, tuple(range(8))),), 1000 * len(pods))


# ---- evictions: rate limit, backoff, waiting for accepted ones ----------------------------

@pytest.mark.parametrize("case, kw, want", [
    ("two per minute from three", {}, ("ns/p1", "ns/p2")),
    ("one accepted 30 s ago leaves one", {"recent": (NOW - 30,)}, ("ns/p1",)),
    ("two accepted within the minute: none", {"recent": (NOW - 59, NOW - 1)}, ()),
    ("an eviction 61 s ago no longer counts", {"recent": (NOW - 61, NOW - 1)}, ("ns/p1",)),
    ("accepted ones are not asked again", {"evicted": {"ns/p1": NOW - 5}, "recent": (NOW - 5,)},
     ("ns/p2",)),
    ("a pod backing off is skipped", {"attempts": {"ns/p1": Attempt(1, NOW + 2, "pdb")}},
     ("ns/p2", "ns/p3")),
    ("its backoff over: tried again", {"attempts": {"ns/p1": Attempt(3, NOW, "pdb")}},
     ("ns/p1", "ns/p2")),
    ("a gone pod is not evicted", {"present": {"ns/p2": "uid-ns/p2", "ns/p3": "uid-ns/p3"}},
     ("ns/p2", "ns/p3")),
    ("a pod recreated under the same name is the old one gone",
     {"present": {"ns/p1": "other-uid", "ns/p2": "uid-ns/p2", "ns/p3": "uid-ns/p3"}},
     ("ns/p2", "ns/p3")),
])
def test_evictions(case: str, kw: dict[str, Any], want: tuple[str, ...]) -> None:
    d = decide_defrag(state(**kw), NOW, CFG)
    assert d.stop is None and not d.hand_over, case
    assert tuple(t.pod for t in d.evict) == want, case


def test_rate_limit_k_per_minute_over_a_run() -> None:
    """Driving the decision minute by minute: never more than K accepted in any 60 s."""
    cfg = replace(CFG, evictions_per_minute=1)
    pods = tuple(f"ns/q{i}" for i in range(5))
    st = state(campaign=campaign(targets=tuple(Target(p, "", "a", "b") for p in pods)),
               present={p: "" for p in pods})
    accepted: list[float] = []
    t = NOW
    while t < NOW + 300:
        d = decide_defrag(replace(st, recent=tuple(accepted),
                           evicted={p: 0.0 for p in pods[:len(accepted)]}), t, cfg)
        accepted += [t for _ in d.evict]
        t += 7
    assert all(sum(1 for x in accepted if s <= x < s + 60) <= 1 for s in accepted)
    assert len(accepted) == 5


@pytest.mark.parametrize("refusals, want", [(1, 2.0), (2, 4.0), (3, 8.0), (5, 30.0), (9, 30.0)])
def test_backoff_doubles_to_its_cap(refusals: int, want: float) -> None:
    assert backoff(refusals, CFG) == want


def test_after_refusal_counts_and_schedules() -> None:
    a = after_refusal({}, "ns/p1", "pdb", NOW, CFG)
    a = after_refusal(a, "ns/p1", "pdb", NOW + 2, CFG)
    assert a["ns/p1"] == Attempt(2, NOW + 2 + 4.0, "pdb")


# ---- stopping -------------------------------------------------------------------------

@pytest.mark.parametrize("case, kw, now, want, cools", [
    ("placed (a reservation, here or elsewhere)", {"placed": frozenset({G})}, NOW, "placed",
     False),
    ("its pods deleted: nothing waits", {"needs": {}}, NOW, "gone", False),
    ("refused for good (403)", {"attempts": {"ns/p2": Attempt(1, NOW + 9, "forbidden")}}, NOW,
     "forbidden", True),
    ("past its time", {}, NOW - 10 + 600, "timeout", True),
    ("its pods gone but the room taken", {"present": {}, "room_free": {"a": frozenset({0})}},
     NOW, "room_lost", True),
])
def test_stops(case: str, kw: dict[str, Any], now: float, want: str, cools: bool) -> None:
    d = decide_defrag(state(**kw), now, CFG)
    assert d.stop == want, case
    assert d.evict == () and not d.hand_over, case
    assert (G in d.cooldown) is cools, case
    if cools:
        assert d.cooldown[G] == now + CFG.cooldown_s


def test_a_refusal_by_a_budget_does_not_stop_the_campaign() -> None:
    d = decide_defrag(state(attempts={"ns/p1": Attempt(4, NOW + 16, "pdb")}), NOW, CFG)
    assert d.stop is None
    assert [t.pod for t in d.evict] == ["ns/p2", "ns/p3"]


# ---- holds and hand-over -----------------------------------------------------------------

@pytest.mark.parametrize("case, free, want", [
    ("nothing free yet", {}, {}),
    ("what frees is held", {"a": frozenset({0, 1, 5})}, {"a": (0, 1, 5)}),
    ("only the room's GPUs", {"a": frozenset({0, 9})}, {"a": (0,)}),
])
def test_holds_follow_the_room_as_it_frees(case: str, free: dict[str, frozenset[int]],
                                           want: dict[str, tuple[int, ...]]) -> None:
    d = decide_defrag(state(room_free=free), NOW, CFG)
    assert dict(d.hold) == want, case
    assert wanted_room_holds(campaign(), free) == want, case


def test_hand_over_once_every_pod_is_gone_and_the_room_held() -> None:
    whole = {"a": frozenset(range(8))}
    d = decide_defrag(state(present={}, room_free=whole), NOW, CFG)
    assert d.hand_over and d.stop is None and d.evict == ()
    assert dict(d.hold) == {"a": tuple(range(8))}
    # One pod still terminating: no hand-over yet, nothing more to evict.
    d = decide_defrag(state(present={"ns/p3": "uid-ns/p3"}, room_free=whole,
                     evicted={"ns/p3": NOW - 3}), NOW, CFG)
    assert not d.hand_over and d.evict == () and d.stop is None


# ---- starting: one domain at a time, the book's waiting groups only -----------------------

def test_starts_the_first_eligible_move_and_only_one() -> None:
    other = "llm/other/0"
    st = state(campaign=None, needs={
        G: Need("llm/vllm-0", NOW - 50, room_short=True),
        other: Need("llm/other-0", NOW - 50, room_short=True)},
        plan=(move(G, ("ns/p1", "ns/p2")), move(other, ("ns/p3",), node="c")),
        room_free={"a": frozenset({0, 1, 2})}, uids={"ns/p1": "u1", "ns/p2": "u2"})
    d = decide_defrag(st, NOW, CFG)
    assert d.start is not None and d.start.group == G
    assert [(t.pod, t.uid, t.to) for t in d.start.targets] == [("ns/p1", "u1", "b"),
                                                                ("ns/p2", "u2", "b")]
    assert d.start.busy_at_start == 5 and d.start.room == {"a": tuple(range(8))}
    assert dict(d.hold) == {"a": (0, 1, 2)}
    assert d.evict == ()  # evictions start on the next pass, once the holds are in
    # While it runs, no plan is wanted (so no second domain is started).
    assert not wants_plan(replace(st, campaign=d.start), NOW + 100, -1e9, True, CFG)


@pytest.mark.parametrize("case, need, cooldown, plan, started", [
    ("room short: started", Need("l", 0.0, True), {}, (move(),), True),
    ("waiting for another reason (rights, domain)", Need("l", 0.0, False), {}, (move(),), False),
    ("cooling down after a stop", Need("l", 0.0, True), {G: NOW + 1}, (move(),), False),
    ("cool-down over", Need("l", 0.0, True), {G: NOW}, (move(),), True),
    ("a lone whole-GPU pod: plan only", Need("l", 0.0, True, lone=True), {}, (move(),), False),
    ("fits without evictions: the book places it", Need("l", 0.0, True), {}, (move(pods=()),),
     False),
    ("no plan this pass", Need("l", 0.0, True), {}, None, False),
])
def test_start_rules(case: str, need: Need, cooldown: dict[str, float],
                     plan: tuple[Move, ...] | None, started: bool) -> None:
    d = decide_defrag(state(campaign=None, needs={G: need}, cooldown=cooldown, plan=plan), NOW, CFG)
    assert (d.start is not None) is started, case


@pytest.mark.parametrize("case, last, changed, want", [
    ("never planned", -1e9, False, True),
    ("planned 10 s ago, nothing changed", NOW - 10, False, False),
    ("planned 10 s ago, the cluster changed", NOW - 10, True, True),
    ("planned 2 s ago, the cluster changed", NOW - 2, True, False),
    ("planned 30 s ago", NOW - 30, False, True),
])
def test_wants_plan(case: str, last: float, changed: bool, want: bool) -> None:
    st = state(campaign=None)
    assert wants_plan(st, NOW, last, changed, CFG) is want, case
    assert not wants_plan(replace(st, needs={}), NOW, last, changed, CFG), case


# ---- plan mode: tell, never act ----------------------------------------------------------

def test_plan_mode_announces_each_new_move_once_and_never_evicts() -> None:
    st = state(mode="plan", campaign=None, plan=(move(),))
    d = decide_defrag(st, NOW, CFG)
    assert [m.group for m in d.announce] == [G]
    assert d.start is None and d.evict == () and not d.hold
    again = decide_defrag(replace(st, announced=d.announced), NOW + 30, CFG)
    assert again.announce == ()
    changed = decide_defrag(replace(st, announced=d.announced, plan=(move(pods=("ns/p2",)),)),
                     NOW + 60, CFG)
    assert [m.group for m in changed.announce] == [G]
    gone = decide_defrag(replace(st, announced=d.announced, needs={}, plan=()), NOW + 90, CFG)
    assert dict(gone.announced) == {}
    # A group that waits for its rights, not for room, is not told a move.
    rights = decide_defrag(replace(st, needs={G: Need("l", 0.0, room_short=False)}), NOW, CFG)
    assert rights.announce == ()
    lone = decide_defrag(replace(st, needs={G: Need("l", 0.0, room_short=False, lone=True)}), NOW,
                  CFG)
    assert [m.group for m in lone.announce] == [G]


# ---- consolidation (act mode, in its window) ---------------------------------------------

K = "gpupack-consolidate/whole-node"
OPEN = Consolidation(window_open=True, whole_free=0, wanted=2)


@pytest.mark.parametrize("case, kw, plan, started", [
    ("window open, fewer whole nodes free than wanted", {}, (move(K, ("ns/s1",)),), True),
    ("window closed", {"consolidation": replace(OPEN, window_open=False)},
     (move(K, ("ns/s1",)),), False),
    ("enough whole nodes free", {"consolidation": replace(OPEN, whole_free=2)},
     (move(K, ("ns/s1",)),), False),
    ("off", {"consolidation": None}, (move(K, ("ns/s1",)),), False),
    ("not nearly empty: three pods to move", {}, (move(K, ("ns/s1", "ns/s2", "ns/s3")),),
     False),
    ("a group waits for room: it goes first", {"needs": {G: Need("l", 0.0, True)}},
     (move(K, ("ns/s1",)),), False),
    ("plan mode never consolidates", {"mode": "plan"}, (move(K, ("ns/s1",)),), False),
])
def test_consolidation_start_rules(case: str, kw: dict[str, Any], plan: tuple[Move, ...],
                                   started: bool) -> None:
    base: dict[str, Any] = {"campaign": None, "needs": {}, "consolidation": OPEN, "plan": plan}
    d = decide_defrag(state(**{**base, **kw}), NOW, CFG)
    assert (d.start is not None) is started, case
    if started:
        assert d.start is not None and d.start.group == K and d.start.leader == ""


@pytest.mark.parametrize("case, kw, want", [
    ("window closes", {"consolidation": replace(OPEN, window_open=False)}, "window_closed"),
    ("a group starts waiting for room", {"needs": {G: Need("l", 0.0, True)}}, "group_waiting"),
    ("runs on: no group need is no reason to stop", {}, None),
])
def test_consolidation_stops(case: str, kw: dict[str, Any], want: str | None) -> None:
    base: dict[str, Any] = {"campaign": campaign(group=K, leader=""), "needs": {},
                            "consolidation": OPEN}
    d = decide_defrag(state(**{**base, **kw}), NOW, CFG)
    assert d.stop == want, case
    if want is None:
        assert [t.pod for t in d.evict] == ["ns/p1", "ns/p2"]


def test_consolidation_hands_over_when_the_node_is_free() -> None:
    st = state(campaign=campaign(group=K, leader=""), needs={}, consolidation=OPEN,
               present={}, room_free={"a": frozenset(range(8))})
    assert decide_defrag(st, NOW, CFG).hand_over


def test_wants_plan_for_consolidation_only_when_it_is_wanted() -> None:
    st = state(campaign=None, needs={}, consolidation=OPEN)
    assert wants_plan(st, NOW, -1e9, False, CFG)
    assert not wants_plan(replace(st, consolidation=replace(OPEN, whole_free=2)), NOW, -1e9,
                          False, CFG)


@pytest.mark.parametrize("text, want", [
    ("01:00-05:00", (60, 300)), ("22:30-06:00", (1350, 360)), ("00:00-24:00", (0, 0)),
    ("05:00-24:00", (300, 0)),
])
def test_parse_window(text: str, want: tuple[int, int]) -> None:
    assert parse_window(text) == want


@pytest.mark.parametrize("text", ["1-2", "25:00-01:00", "01:0-02:00", "x", "01:00-02:00-03:00",
                                  "24:30-01:00"])
def test_parse_window_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"HH:MM|time of day"):
        parse_window(text)


@pytest.mark.parametrize("window, hour, inside", [
    ((60, 300), 2.0, True), ((60, 300), 5.0, False), ((60, 300), 0.5, False),
    ((1350, 360), 23.0, True), ((1350, 360), 3.0, True), ((1350, 360), 12.0, False),
    ((0, 0), 17.0, True), (None, 2.0, False),
])
def test_in_window(window: tuple[int, int] | None, hour: float, inside: bool) -> None:
    day = 86400 * 20000
    assert in_window(window, day + hour * 3600) is inside
