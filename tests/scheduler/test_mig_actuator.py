"""The MIG actuator's pure decision (scheduler/mig/decide.py): one table row per rule,
builders for nodes and pods, and a Hypothesis property that no action touches a GPU that
a pod or a reservation holds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.cpsat import SolverParams
from packing.mig.layout import MigSlot
from packing.mig.plan import WHOLE
from packing.model import MigReconfigure
from scheduler.mig.changes import (
    CONFIG_PREFIX,
    Backoff,
    Change,
    backoff_from_json,
    changes_from_json,
    changes_json,
)
from scheduler.mig.decide import (
    ActuatorState,
    GpuView,
    MigPod,
    MigSettings,
    NodeView,
    WholePod,
    decide_mig,
    forecast,
    holds_for,
    unmet_pods,
)

H100 = "H100-80GB"
FAST = SolverParams(max_time_s=2.0, workers=1, seed=1)
S = MigSettings(timeout_s=600, backoff_s=60, backoff_max_s=600, min_idle_s=60)
ON, FROZEN, OFF = MigReconfigure.ON, MigReconfigure.FROZEN, MigReconfigure.NOT_OPTED_IN


def whole(i: int, holders: tuple[str, ...] = ()) -> GpuView:
    return GpuView(i, H100, False, holders=frozenset(holders))


def mig(i: int, slots: Mapping[int, tuple[str, str | None]]) -> GpuView:
    layout = tuple(MigSlot(p, s) for s, (p, _) in sorted(slots.items()))
    free = tuple(MigSlot(p, s) for s, (p, o) in sorted(slots.items()) if o is None)
    holders = frozenset(o for _, o in slots.values() if o is not None)
    return GpuView(i, H100, True, layout, free, holders)


def node(name: str, gpus: list[GpuView] | None = None, reconf: MigReconfigure = ON,
         **kw: object) -> NodeView:
    gpus = gpus if gpus is not None else [whole(i) for i in range(8)]
    return NodeView(name, reconf, tuple(gpus), **kw)  # type: ignore[arg-type]


def asr(n: int, start: int = 0) -> tuple[MigPod, ...]:
    return tuple(MigPod(f"ns/asr-{i}", "1g.10gb") for i in range(start, start + n))


def state(nodes: list[NodeView], pods: tuple[MigPod, ...] = (), **kw: object) -> ActuatorState:
    return ActuatorState(tuple(nodes), mig_pods=pods, **kw)  # type: ignore[arg-type]


def change(node_name: str, targets: dict[int, object], started: float = 0.0,
           config: str = "gpupack-abc", labelled_at: float | str | None = "started"
           ) -> Change:
    """A change in flight, its node labelled as it started unless ``labelled_at`` says
    otherwise (None: the entry written, the label not yet)."""
    at = started if labelled_at == "started" else labelled_at
    assert at is None or isinstance(at, float)
    return Change(node_name, config, tuple(sorted(targets.items())),  # type: ignore[arg-type]
                  (H100,), started, labelled_at=at)


SEVEN = (("1g.10gb", 7),)
MIG7 = {s: ("1g.10gb", None) for s in range(7)}


# ---- starts -----------------------------------------------------------------------------------

START_CASES = [
    # (name, nodes, pods, extra state, expected started nodes)
    ("opted-in idle node serves waiting pods", [node("a")], asr(10), {}, ["a"]),
    ("no label: nothing", [node("a", reconf=OFF)], asr(10), {}, []),
    ("freeze: nothing", [node("a", reconf=FROZEN)], asr(10), {}, []),
    ("actuator off: nothing", [node("a", reconf=MigReconfigure.ACTUATOR_OFF)], asr(10), {},
     []),
    ("cordoned node: nothing", [node("a", unschedulable=True)], asr(3), {}, []),
    ("tainted node: nothing", [node("a", tainted=True)], asr(3), {}, []),
    ("free slices of a tainted node serve no one",
     [node("m", [mig(0, {0: ("1g.10gb", None)})], reconf=OFF, tainted=True), node("a")],
     asr(1), {}, ["a"]),
    ("a free slice serves the pod: nothing",
     [node("m", [mig(0, {0: ("1g.10gb", None)})], reconf=OFF), node("a")], asr(1), {}, []),
    ("free slices serve some: the rest wait",
     [node("m", [mig(0, {0: ("1g.10gb", None)})], reconf=OFF), node("a")], asr(2), {}, ["a"]),
    ("one node per model, even for many pods", [node("a"), node("b")], asr(100), {}, ["a"]),
    ("model in flight elsewhere: nothing",
     [node("a"), node("b", config_label="gpupack-abc", state_label="pending")], asr(5),
     {"in_flight": {"b": change("b", {0: SEVEN}, 90.0)}}, []),
    ("node backed off: nothing", [node("a")], asr(5),
     {"backoff": {"a": Backoff(until=200.0, failures=1)}}, []),
    ("back-off over: acts", [node("a")], asr(5),
     {"backoff": {"a": Backoff(until=50.0, failures=1)}}, ["a"]),
    ("every GPU busy: nothing",
     [node("a", [whole(i, (f"ns/p{i}",)) for i in range(8)])], asr(5), {}, []),
    ("burst still arriving: wait", [node("a")],
     tuple(replace(p, arrived=99.0) for p in asr(5)), {}, []),
    ("burst settled: acts", [node("a")],
     tuple(replace(p, arrived=97.0) for p in asr(5)), {}, ["a"]),
    ("oldest waited long enough: acts despite new arrivals", [node("a")],
     (replace(asr(1)[0], arrived=85.0), replace(asr(1, 1)[0], arrived=99.5)), {}, ["a"]),
    ("the MIG manager at work on another config: nothing",
     [node("a", config_label="all-balanced", state_label="pending")], asr(3), {}, []),
    ("the MIG manager rebooting the node: nothing",
     [node("a", config_label="all-balanced", state_label="rebooting")], asr(3), {}, []),
    ("another config applied: acts",
     [node("a", config_label="all-balanced", state_label="success")], asr(3), {}, ["a"]),
    ("no node agent and a GPU in use: nothing (which GPU is not known)",
     [node("a", [replace(whole(0, ("ns/p",)), inferred=True)]
           + [replace(whole(i), inferred=True) for i in range(1, 8)])], asr(3), {}, []),
    ("no node agent, nothing in use: acts",
     [node("a", [replace(whole(i), inferred=True) for i in range(8)])], asr(3), {}, ["a"]),
    ("node in MIG mode preferred",
     [node("a"), node("m", [mig(0, {0: ("7g.80gb", None)}), whole(1)])],
     asr(3), {}, ["m"]),
    # Its whole GPU 1 could serve them, but switching its MIG mode would clear the busy
    # MIG GPU 0 (mig-parted's mode step): the idle node changes instead.
    ("a node in use does not switch a GPU's MIG mode",
     [node("a"), node("m", [mig(0, {0: ("7g.80gb", "ns/big")}), whole(1)])],
     asr(3), {}, ["a"]),
]


@pytest.mark.parametrize("name,nodes,pods,extra,expected", START_CASES,
                         ids=[c[0] for c in START_CASES])
def test_starts(name: str, nodes: list[NodeView], pods: tuple[MigPod, ...],
                extra: dict[str, object], expected: list[str]) -> None:
    d = decide_mig(state(nodes, pods, **extra), 100.0, S, FAST)
    assert sorted(s.change.node for s in d.starts) == expected, (name, d.plan_status)
    for s in d.starts:
        assert s.change.config.startswith(CONFIG_PREFIX)
        assert s.plan.config_name == s.change.config
        # Everything it changes is held from the decision on.
        held = {(h.node, h.gpu) for h in d.holds}
        assert {(s.change.node, i) for i, _ in s.change.targets} <= held


def test_start_converts_the_fewest_gpus_for_the_waiting_pods() -> None:
    # Idle MIG GPUs (idle long enough): two are re-laid for ten 1g pods (7 slices a GPU).
    gpus = [mig(i, {0: ("7g.80gb", None)}) for i in range(8)]
    d = decide_mig(state([node("a", gpus)], asr(10), idle_since={("a", i): 0.0
                                                                 for i in range(8)}),
                   100.0, S, FAST)
    (s,) = d.starts
    created = sum(n for _, t in s.change.targets if not isinstance(t, str) for p, n in t
                  if p == "1g.10gb")
    assert created >= 10
    assert len(s.change.targets) == 2
    assert d.waiting == {(H100, "1g.10gb"): 10}


def test_a_node_entering_mig_mode_switches_all_its_whole_gpus() -> None:
    d = decide_mig(state([node("a")], asr(10)), 100.0, S, FAST)
    (s,) = d.starts
    assert len(s.change.targets) == 8 and s.change.node_wide
    assert all(t != WHOLE for _, t in s.change.targets)


def test_busy_gpu_never_in_a_change() -> None:
    gpus = [whole(0, ("ns/llm",)), mig(1, {0: ("7g.80gb", None)}),
            mig(2, {0: ("1g.10gb", "ns/asr-x")})]
    d = decide_mig(state([node("a", gpus)], asr(20), idle_since={("a", 1): 0.0}), 100.0, S,
                   FAST)
    (s,) = d.starts
    touched = {i for i, _ in s.change.targets}
    # Only the idle MIG GPU is re-laid (its mode stays: the node is in use).
    assert touched == {1} and not s.change.node_wide
    assert {h.gpu for h in d.holds} == {1}


def test_a_mode_change_holds_every_gpu_of_the_node_until_applied() -> None:
    # GPU 1 is idle in MIG mode; GPU 0 turns MIG too: every GPU of the node is held,
    # GPU 1 as well, which the change does not re-lay.
    gpus = [whole(0), mig(1, dict(MIG7))]
    d = decide_mig(state([node("a", gpus)], asr(10), idle_since={("a", 1): 0.0}), 100.0, S,
                   FAST)
    (s,) = d.starts
    assert s.change.node_wide and 0 in dict(s.change.targets)
    assert {h.gpu for h in d.holds} == {0, 1}
    # Applied: the node reports the target layouts; nothing is held any more.
    done = [mig(i, {k: (p, None) for k, p in enumerate(
                p for p, n in t for _ in range(n))}) if not isinstance(t, str) else whole(i)
            for i, t in sorted({**{1: SEVEN}, **dict(s.change.targets)}.items())]
    assert holds_for(s.change, node("a", done)) == []


def test_recently_idle_mig_gpu_left_alone() -> None:
    gpus = [mig(0, {0: ("7g.80gb", None)})]
    st_ = state([node("a", gpus)], asr(3), idle_since={("a", 0): 80.0})
    assert decide_mig(st_, 100.0, S, FAST).starts == ()
    assert decide_mig(replace(st_, idle_since={("a", 0): 0.0}), 100.0, S, FAST).starts


def test_reverse_direction_idle_mig_gpus_turn_whole_for_a_waiting_whole_pod() -> None:
    gpus = [mig(i, dict(MIG7)) for i in range(8)]
    st_ = state([node("a", gpus)], whole_pods=(WholePod("ns/llm-0", 8),),
                idle_since={("a", i): 0.0 for i in range(8)})
    (s,) = decide_mig(st_, 100.0, S, FAST).starts
    assert {t for _, t in s.change.targets} == {WHOLE}
    assert len(s.change.targets) == 8


# ---- the end of a change --------------------------------------------------------------------

END_CASES = [
    # (name, node view, now, result or None)
    ("pending: still in flight",
     node("a", config_label="gpupack-abc", state_label="pending"), 100.0, None),
    ("success label but slices not there yet: in flight",
     node("a", config_label="gpupack-abc", state_label="success"), 100.0, None),
    ("success and layout: success",
     node("a", [mig(0, dict(MIG7))] + [whole(i) for i in range(1, 8)],
          config_label="gpupack-abc", state_label="success"), 100.0, "success"),
    ("failed", node("a", config_label="gpupack-abc", state_label="failed"), 100.0, "failed"),
    ("timeout", node("a", config_label="gpupack-abc", state_label="pending"), 700.0,
     "timeout"),
    ("relabelled by someone else",
     node("a", config_label="all-disabled", state_label="success"), 100.0, "superseded"),
    ("our label not in the cache yet (an old failure shown): in flight",
     node("a", config_label="all-disabled", state_label="failed"), 70.0, None),
    ("our label never came: superseded once the grace is over",
     node("a", config_label="all-disabled", state_label="failed"), 81.0, "superseded"),
]


@pytest.mark.parametrize("name,view,now,result", END_CASES, ids=[c[0] for c in END_CASES])
def test_end_of_a_change(name: str, view: NodeView, now: float, result: str | None) -> None:
    c = change("a", {0: SEVEN}, started=50.0)
    d = decide_mig(state([view], in_flight={"a": c}), now, S, FAST)
    assert [f.result for f in d.finishes] == ([] if result is None else [result]), name
    held = {h.gpu for h in d.holds}
    if result is None and not view.gpus[0].matches(SEVEN):
        assert held == {0}  # held until the slices appear
    else:
        assert held == set()  # released: success, failed, timeout, superseded
    if result in ("failed", "timeout"):
        assert d.backoff["a"] == Backoff(now + 60, 1)


# ---- the entry before the label (config_propagation_s, 90 s in S) ------------------------

LABEL_CASES = [
    # (name, labelled_at, node view, now, result or None, labelled now)
    ("entry on its way: a failed state or another label is not judged",
     None, node("a", config_label="all-disabled", state_label="failed"), 100.0, None, False),
    ("entry there by now: the node is labelled", None,
     node("a", config_label="all-disabled", state_label="success"), 140.0, None, True),
    ("never labelled before the timeout (counted from the start)", None,
     node("a", config_label="all-disabled"), 651.0, "timeout", False),
    ("labelled at 140: the label is judged from then, not from the start", 140.0,
     node("a", config_label="all-disabled", state_label="failed"), 160.0, None, False),
    ("labelled at 140, the label never came: superseded after the grace", 140.0,
     node("a", config_label="all-disabled", state_label="failed"), 171.0, "superseded", False),
]


@pytest.mark.parametrize("name,at,view,now,result,labelled", LABEL_CASES,
                         ids=[c[0] for c in LABEL_CASES])
def test_the_label_waits_for_the_entry(name: str, at: float | None, view: NodeView,
                                       now: float, result: str | None,
                                       labelled: bool) -> None:
    c = change("a", {0: SEVEN}, started=50.0, labelled_at=at)
    d = decide_mig(state([view], in_flight={"a": c}), now, S, FAST)
    assert [f.result for f in d.finishes] == ([] if result is None else [result]), name
    assert d.labels == ((replace(c, labelled_at=now),) if labelled else ()), name
    assert {h.gpu for h in d.holds} == ({0} if result is None else set()), name


@pytest.mark.parametrize("propagation", [0.0, 90.0])
def test_a_start_is_labelled_at_once_only_without_propagation(propagation: float) -> None:
    gpus = [whole(i) for i in range(8)]
    settings = replace(S, config_propagation_s=propagation)
    (s,) = decide_mig(state([node("a", gpus)], asr(3)), 100.0, settings, FAST).starts
    assert s.change.labelled_at == (100.0 if propagation == 0 else None)


@pytest.mark.parametrize("at", [None, 12.5])
def test_labelled_at_survives_the_config_map(at: float | None) -> None:
    c = change("a", {0: SEVEN}, started=10.0, labelled_at=at)
    assert changes_from_json(changes_json({"a": c})) == ({"a": c}, [])


def test_a_change_written_before_labels_waited_counts_as_labelled_when_it_started() -> None:
    raw = change("a", {0: SEVEN}, started=10.0).to_json()
    del raw["labelled_at"]
    assert Change.from_json(raw).labelled_at == 10.0
    for field_name in ("labelled_at", "started"):
        for bad in (float("nan"), "soon", [1]):
            with pytest.raises(ValueError, match=f"{field_name} .* is not a time"):
                Change.from_json({**raw, field_name: bad})


def test_a_node_that_cannot_be_read_is_followed_not_gone() -> None:
    # A new leader whose watch could not read the node: its change is still the MIG
    # manager's, its model still busy; it ends only by its timeout.
    c = change("a", {0: SEVEN}, started=50.0)
    unreadable = state([node("b")], asr(5), in_flight={"a": c}, unreadable=frozenset({"a"}))
    d = decide_mig(unreadable, 100.0, S, FAST)
    assert d.finishes == () and d.starts == ()  # b is of a's model: one node per model
    d = decide_mig(unreadable, 50.0 + S.timeout_s + 1, S, FAST)
    assert [f.result for f in d.finishes] == ["timeout"]
    gone = decide_mig(state([node("b")], in_flight={"a": c}), 100.0, S, FAST)
    assert [f.result for f in gone.finishes] == ["superseded"]


def test_the_same_layouts_asked_again_get_a_new_label_value() -> None:
    # The MIG manager acts on a change of the label's value: after a failure, the same
    # entry must come under another name, and back.
    first = decide_mig(state([node("a")], asr(3)), 100.0, S, FAST).starts[0].change.config
    again = decide_mig(state([node("a", config_label=first, state_label="failed")], asr(3)),
                       100.0, S, FAST).starts[0]
    assert again.change.config == first + "-again" == again.plan.config_name
    back = decide_mig(state([node("a", config_label=again.change.config,
                                  state_label="failed")], asr(3)), 100.0, S, FAST).starts[0]
    assert back.change.config == first


def test_inferred_layout_recognised_by_its_multiset() -> None:
    """Without the node agent the extender infers which GPUs are MIG from allocatable
    counts, at indices of its own choosing: the change is recognised by the node's
    layouts as a multiset, and holds nothing once they are there."""
    before = node("a", [replace(whole(i), inferred=True) for i in range(4)])
    c = replace(change("a", {0: SEVEN, 2: SEVEN}, started=50.0),
                expected=(WHOLE, WHOLE, SEVEN, SEVEN))
    after = node("a", [replace(whole(0), inferred=True), replace(whole(1), inferred=True),
                       replace(mig(2, dict(MIG7)), inferred=True),
                       replace(mig(3, dict(MIG7)), inferred=True)],
                 config_label="gpupack-abc", state_label="success")
    d = decide_mig(state([after], in_flight={"a": c}), 100.0, S, FAST)
    assert [f.result for f in d.finishes] == ["success"] and d.holds == ()
    pending = replace(after, state_label="pending")
    d = decide_mig(state([pending], asr(14), in_flight={"a": c}), 100.0, S, FAST)
    assert d.finishes == () and d.holds == () and d.waiting == {}
    d = decide_mig(state([replace(before, config_label="gpupack-abc")], in_flight={"a": c}),
               100.0, S, FAST)
    assert {h.gpu for h in d.holds} == {0, 2}


def test_a_start_records_the_expected_layouts() -> None:
    gpus = [whole(0), mig(1, {0: ("7g.80gb", None)}), mig(2, {0: ("7g.80gb", "ns/x")})]
    d = decide_mig(state([node("a", gpus)], asr(7), idle_since={("a", 1): 0.0}), 100.0, S,
                   FAST)
    (s,) = d.starts
    # The node is in use: GPU 1 is re-laid, GPU 0 stays whole, GPU 2 keeps its 7g.
    assert sorted(s.change.expected, key=str) == sorted(
        [WHOLE, SEVEN, (("7g.80gb", 1),)], key=str)


def test_backoff_doubles_and_success_clears_it() -> None:
    c = change("a", {0: SEVEN}, started=50.0)
    failed = node("a", config_label="gpupack-abc", state_label="failed")
    d = decide_mig(state([failed], in_flight={"a": c}, backoff={"a": Backoff(0.0, 2)}), 100.0, S,
               FAST)
    assert d.backoff["a"] == Backoff(100.0 + 240, 3)
    ok = node("a", [mig(0, dict(MIG7))], config_label="gpupack-abc", state_label="success")
    d = decide_mig(state([ok], in_flight={"a": c}, backoff={"a": Backoff(0.0, 2)}), 100.0, S, FAST)
    assert "a" not in d.backoff


def test_a_freeze_does_not_cancel_a_change_in_flight() -> None:
    c = change("a", {0: SEVEN}, started=50.0)
    frozen = node("a", reconf=FROZEN, config_label="gpupack-abc", state_label="pending")
    d = decide_mig(state([frozen], asr(50), in_flight={"a": c}), 100.0, S, FAST)
    assert d.finishes == () and d.starts == ()
    assert {h.gpu for h in d.holds} == {0}


def test_mig_gpu_in_flight_holds_each_free_instance() -> None:
    g = mig(0, {0: ("7g.80gb", None)})
    c = change("a", {0: SEVEN})
    hs = holds_for(c, node("a", [g]))
    assert [(h.profile, h.start) for h in hs] == [("7g.80gb", 0)]
    assert hs[0].key == "gpupack-mig/a/0/0"


def test_mig_gpu_in_flight_keeps_the_instances_it_holds_held() -> None:
    # The decision after the start sees the instances held by the change, not free: they
    # stay held (a hold dropped here would free them for pods while the MIG manager works),
    # and an instance a pod took is never held.
    g = mig(0, {0: ("3g.40gb", "gpupack-mig/a/0/0"), 4: ("3g.40gb", None)})
    c = change("a", {0: SEVEN})
    assert [(h.start, h.key) for h in holds_for(c, node("a", [g]))] == [
        (0, "gpupack-mig/a/0/0"), (4, "gpupack-mig/a/0/4")]
    d = decide_mig(state([node("a", [g], config_label="gpupack-abc")], in_flight={"a": c}),
               100.0, S, FAST)
    assert sorted(h.key for h in d.holds) == ["gpupack-mig/a/0/0", "gpupack-mig/a/0/4"]
    busy = mig(0, {0: ("3g.40gb", "ns/pod"), 4: ("3g.40gb", "gpupack-mig/a/0/4")})
    assert [h.start for h in holds_for(c, node("a", [busy]))] == [4]


def test_slices_being_created_serve_pods_no_second_change() -> None:
    c = change("b", {0: SEVEN}, started=90.0)
    nodes = [node("a"), node("b", config_label="gpupack-abc", state_label="pending"),
             node("x", [whole(0)], reconf=OFF)]
    d = decide_mig(state(nodes, asr(7), in_flight={"b": c}), 100.0, S, FAST)
    assert d.waiting == {} and d.starts == ()


@pytest.mark.parametrize("name, nodes, pods, in_flight, unmet", [
    ("free slices serve the oldest pods first",
     [node("a", [mig(0, {0: ("1g.10gb", None), 1: ("1g.10gb", "ns/x")})])], asr(3), {},
     ("ns/asr-1", "ns/asr-2")),
    ("a profile no GPU offers free", [node("a", [mig(0, MIG7)])],
     (MigPod("ns/tts", "2g.20gb"), *asr(1)), {}, ("ns/tts",)),
    ("pods that slices being created will serve found none free: counted",
     [node("b", config_label="gpupack-abc", state_label="pending")],
     asr(2), {"b": change("b", {0: SEVEN}, started=90.0)}, ("ns/asr-0", "ns/asr-1")),
    ("a cordoned node's free slices serve no one",
     [node("a", [mig(0, MIG7)], unschedulable=True)], asr(1), {}, ("ns/asr-0",)),
])
def test_unmet_pods_are_the_ones_the_forecast_counts(
        name: str, nodes: list[NodeView], pods: tuple[MigPod, ...],
        in_flight: dict[str, Change], unmet: tuple[str, ...]) -> None:
    assert unmet_pods(state(nodes, pods, in_flight=in_flight)) == unmet, name


def test_forecast_decays_with_age() -> None:
    none: frozenset[str] = frozenset()
    arrivals = tuple((t, "1g.10gb", none) for t in (0.0, 0.0, 100.0, 100.0))
    assert forecast(arrivals, 100.0, 100.0, [H100]) == {(H100, "1g.10gb"): 3}
    assert forecast(arrivals, 1000.0, 100.0, [H100]) == {}


def test_changes_round_trip_and_bad_entries_named() -> None:
    c = {"a": replace(change("a", {0: SEVEN, 1: WHOLE}), expected=(WHOLE, SEVEN))}
    back, problems = changes_from_json(changes_json(c))
    assert back == c and problems == []
    back, problems = changes_from_json('[{"node": "a"}, {"node": "b", "config": "x", '
                                       '"started": 1, "models": [], "targets": []}]')
    assert back == {} and len(problems) == 2
    assert "not gpupack's" in problems[1]
    assert changes_from_json("{")[1][0].startswith("in-flight changes: not JSON")
    both = changes_json(c, {"b": Backoff(500.0, 2)})
    assert changes_from_json(both) == (c, [])
    assert backoff_from_json(both) == ({"b": Backoff(500.0, 2)}, [])
    assert backoff_from_json('[{"backoff": {"node": "b", "until": "soon", "failures": 1}}]'
                             )[1] == ["in-flight changes[0].backoff.until: 'soon' is not a time"]
    nan = ('[{"node": "a", "config": "gpupack-x", "started": NaN, "models": [], '
           '"targets": []}]')
    assert changes_from_json(nan) == ({}, ["in-flight changes[0]: change: started nan is "
                                           "not a time"])


# ---- property -----------------------------------------------------------------------------------

PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb")


@st.composite
def clusters(draw: st.DrawFn) -> ActuatorState:
    nodes = []
    for n in range(draw(st.integers(1, 3))):
        gpus = []
        for i in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from(["idle", "busy", "mig-free", "mig-busy", "reserved"]))
            if kind == "idle":
                gpus.append(whole(i))
            elif kind == "busy":
                gpus.append(whole(i, ("ns/pod",)))
            elif kind == "reserved":
                gpus.append(whole(i, ("llm/g/0#reserve-0",)))
            else:
                owner = "ns/small" if kind == "mig-busy" else None
                gpus.append(mig(i, {0: ("3g.40gb", owner), 4: ("3g.40gb", None)}))
        nodes.append(node(f"n{n}", gpus, reconf=draw(st.sampled_from([ON, ON, FROZEN, OFF]))))
    pods = tuple(MigPod(f"ns/p{k}", draw(st.sampled_from(PROFILES)))
                 for k in range(draw(st.integers(0, 12))))
    whole_pods = tuple(WholePod(f"ns/w{k}", draw(st.integers(1, 4)))
                       for k in range(draw(st.integers(0, 2))))
    return ActuatorState(tuple(nodes), mig_pods=pods, whole_pods=whole_pods)


@settings(max_examples=40, deadline=None)
@given(clusters())
def test_no_action_touches_a_gpu_a_pod_or_reservation_holds(s: ActuatorState) -> None:
    d = decide_mig(s, 1000.0, S, FAST)
    views = {(n.name, g.index): (n, g) for n in s.nodes for g in n.gpus}
    models: list[str] = []
    for start in d.starts:
        for i, _ in start.change.targets:
            n, g = views[start.change.node, i]
            assert not g.holders, (start, g)
            assert n.reconfigure is ON
        models += list(start.change.models)
    assert len(models) == len(set(models))  # one node per model
    for h in d.holds:
        _, g = views[h.node, h.gpu]
        assert not g.busy
