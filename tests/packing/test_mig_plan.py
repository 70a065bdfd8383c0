"""The MIG layout planner (issue 19, item 2, the pure core): which idle GPUs of opted-in
nodes get which layout, as mig-parted entries. Table-driven cases, the validator's own
checks, and Hypothesis properties: only valid layouts, never a held GPU, demand served
when one node can serve it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packing.catalog import get_model
from packing.cpsat import SolverParams
from packing.mig.layout import MigSlot, layout_from_counts
from packing.mig.plan import (
    DeviceConfig,
    MigDemand,
    MigGpu,
    MigNode,
    MigPlan,
    NodeChange,
    WholeDemand,
    config_name,
    count_vectors,
    greedy_mig_plan,
    plan_errors,
    plan_mig,
)

H, A = "H100-80GB", "A100-40GB"
FAST = SolverParams(max_time_s=0.5, workers=1)
ALL_1G = tuple(MigSlot("1g.10gb", s) for s in range(7))
BALANCED = (MigSlot("1g.10gb", 0), MigSlot("1g.10gb", 1), MigSlot("2g.20gb", 2),
            MigSlot("3g.40gb", 4))


def whole(name: str, n: int = 8, model: str = H, held: tuple[int, ...] = (),
          opted_in: bool = True) -> MigNode:
    return MigNode(name, tuple(MigGpu(i, model, False, (), i in held) for i in range(n)),
                   opted_in)


def mig(name: str, n: int = 8, layout: tuple[MigSlot, ...] = BALANCED,
        held: tuple[int, ...] = (), opted_in: bool = True) -> MigNode:
    return MigNode(name, tuple(MigGpu(i, H, True, layout, i in held) for i in range(n)),
                   opted_in)


def waiting(**by_profile: int) -> MigDemand:
    return MigDemand({(H, p.replace("_", ".")): n for p, n in by_profile.items()})


def changed(plan: MigPlan) -> dict[str, tuple[int, ...]]:
    return {c.node: c.changed for c in plan.changes}


def test_nothing_waiting_changes_nothing() -> None:
    plan = plan_mig([whole("w")], MigDemand(forecast={(H, "1g.10gb"): 7}), params=FAST)
    assert plan.changes == () and plan.status == "nothing-to-do"


NONE: frozenset[str] = frozenset()


@pytest.mark.parametrize(
    ("nodes", "demand", "in_flight", "expect"),
    ids=["fewest-gpus", "whole-node-switches-at-once", "mig-mode-node-first",
         "more-served-first", "no-mode-change-in-use", "none-when-all-in-use",
         "held-gpus-kept", "not-opted-in", "model-in-flight"],
    argvalues=[
        # 7 x 1g.10gb fit one GPU: of the idle MIG GPUs, one is re-laid, not seven.
        ([mig("m", layout=(MigSlot("7g.80gb", 0),))], waiting(**{"1g_10gb": 7}), NONE,
         {"m": 1}),
        # A node entering MIG mode switches every whole GPU at once: later it will be in
        # use, and a node in use cannot switch a GPU's mode.
        ([whole("w")], waiting(**{"1g_10gb": 7}), NONE, {"w": 8}),
        # A node already in MIG mode (its idle GPU re-laid out: 1 x 2g.20gb -> 3) before
        # a whole node, when both serve the demand.
        ([whole("w"), mig("m", held=(0, 1, 2, 3, 4, 5, 6))], waiting(**{"2g_20gb": 2}), NONE,
         {"m": 1}),
        # Serving more waiting pods comes first: 3 more 2g.20gb fit only a whole GPU.
        ([whole("w"), mig("m", held=(0, 1, 2, 3, 4, 5, 6))], waiting(**{"2g_20gb": 3}), NONE,
         {"w": 8}),
        # A node with a GPU in use switches no GPU's MIG mode (mig-parted's mode step
        # clears every MIG GPU of the node and may reset them all): the idle node does.
        ([whole("a"), whole("b", held=(7,))], waiting(**{"3g_40gb": 2}), NONE, {"a": 8}),
        ([whole("b", held=(7,))], waiting(**{"3g_40gb": 2}), NONE, {}),
        # Only the one GPU nobody holds may change; the demand asks for more than it holds.
        ([mig("m", held=(0, 1, 2, 3, 4, 5, 6))], waiting(**{"1g_10gb": 20}), NONE, {"m": 1}),
        ([whole("w", opted_in=False)], waiting(**{"1g_10gb": 1}), NONE, {}),
        # A change of this model is still in flight (the MIG manager works on a node).
        ([whole("w")], waiting(**{"1g_10gb": 1}), frozenset({H}), {}),
    ],
)
def test_choices(nodes: list[MigNode], demand: MigDemand, in_flight: frozenset[str],
                 expect: dict[str, int]) -> None:
    for plan in (plan_mig(nodes, demand, in_flight=in_flight, params=FAST),
                 greedy_mig_plan(nodes, demand, in_flight)):
        assert plan_errors(nodes, plan, in_flight) == []
        assert {n: len(ix) for n, ix in changed(plan).items()} == expect, plan


def test_one_node_per_model_at_a_time() -> None:
    # 16 x 3g.40gb need 8 GPUs; two whole nodes: only one of them changes now.
    nodes = [whole("a"), whole("b")]
    plan = plan_mig(nodes, waiting(**{"3g_40gb": 20}), params=FAST)
    assert len(plan.changes) == 1 and len(plan.changes[0].changed) == 8
    assert plan.served == {(H, "3g.40gb"): 16}
    # A second model may change on its own node at the same time.
    nodes.append(whole("c", model=A))
    demand = MigDemand({(H, "3g.40gb"): 2, (A, "1g.5gb"): 7})
    plan = plan_mig(nodes, demand, params=FAST)
    assert sorted(c.models for c in plan.changes) == [(A,), (H,)]
    assert plan_errors(nodes, plan) == []


def test_the_served_demand_is_made_of_new_instances_only() -> None:
    # Every GPU has 2 x 1g.10gb already; 3 more pods wait. One GPU re-laid out as 7 x 1g
    # (5 new) serves them; the three waiting are served, not seven.
    plan = plan_mig([mig("m")], waiting(**{"1g_10gb": 3}), params=FAST)
    assert plan.served == {(H, "1g.10gb"): 3}
    assert len(plan.changes[0].changed) == 1


def test_forecast_shapes_the_layout_but_converts_nothing_alone() -> None:
    # One 1g.10gb waits; 2g.20gb and 3g.40gb are expected. One GPU changes (the forecast
    # converts no second one), and beside the 1g its room goes to the most forecast
    # instances: 3 x 2g.20gb (7 compute slices), not 1 x 3g.40gb + 1 x 2g.20gb.
    demand = MigDemand({(H, "1g.10gb"): 1}, forecast={(H, "2g.20gb"): 3, (H, "3g.40gb"): 9})
    plan = plan_mig([whole("w", n=1)], demand, params=FAST)
    (ch,) = plan.changes
    assert len(ch.changed) == 1
    new = next(d for d in ch.devices if ch.changed[0] in d.devices)
    assert dict(new.mig_devices) == {"1g.10gb": 1, "2g.20gb": 3}
    assert plan.served == {(H, "1g.10gb"): 1}


FILL_CASES = [
    # (waiting, forecast, the changed GPU's new instance counts)
    # One 1g waits and two more are expected: the GPU is filled with 1g slices (7), not
    # left with 3 and four compute slices that no instance will ever take while it runs.
    ({"1g.10gb": 1}, {"1g.10gb": 2}, {"1g.10gb": 7}),
    # One 3g waits, nothing expected: a second 3g, the only profile anyone asked for.
    ({"3g.40gb": 1}, {}, {"3g.40gb": 2}),
    # 2g waits and 1g is expected: 3 x 2g + 1 x 1g uses all 7 compute slices.
    ({"2g.20gb": 3}, {"1g.10gb": 1}, {"1g.10gb": 1, "2g.20gb": 3}),
]


@pytest.mark.parametrize(("wait", "fore", "expect"), FILL_CASES,
                         ids=["1g-filled", "only-asked-profiles", "mixed-fill"])
def test_a_gpu_that_changes_is_filled_with_demanded_profiles(
        wait: dict[str, int], fore: dict[str, int], expect: dict[str, int]) -> None:
    demand = MigDemand({(H, p): n for p, n in wait.items()},
                       forecast={(H, p): n for p, n in fore.items()})
    nodes = [whole("w", n=1)]
    for plan in (plan_mig(nodes, demand, params=FAST), greedy_mig_plan(nodes, demand)):
        assert plan_errors(nodes, plan) == []
        (ch,) = plan.changes
        assert len(ch.changed) == 1, plan.status
        new = next(d for d in ch.devices if ch.changed[0] in d.devices)
        assert dict(new.mig_devices) == expect, plan.status


def test_symmetric_nodes_are_chosen_as_the_greedy_plan_does() -> None:
    nodes = [whole("a"), whole("b")]
    plan = plan_mig(nodes, waiting(**{"1g_10gb": 60}), params=FAST)
    assert [c.node for c in plan.changes] == ["a"], plan.status


def test_idle_mig_gpus_go_back_to_whole_for_a_waiting_llm() -> None:
    # An 8-GPU node all in MIG mode, idle; a 4-GPU pod waits: four GPUs turn whole.
    nodes = [mig("m")]
    demand = MigDemand(whole=(WholeDemand("llm/a-0", 4),))
    for plan in (plan_mig(nodes, demand, params=FAST), greedy_mig_plan(nodes, demand)):
        assert plan_errors(nodes, plan) == []
        assert plan.whole_served == ("llm/a-0",)
        (ch,) = plan.changes
        assert len(ch.changed) == 4
        assert all(not d.mig_enabled for d in ch.devices if set(d.devices) & set(ch.changed))


def test_a_busy_mig_gpu_is_not_turned_whole() -> None:
    nodes = [mig("m", n=2, held=(0,))]
    plan = plan_mig(nodes, MigDemand(whole=(WholeDemand("llm/a-0", 2),)), params=FAST)
    assert plan.whole_served == () and all(0 not in c.changed for c in plan.changes)


def test_mig_parted_entry_and_label() -> None:
    nodes = [mig("m", n=2, held=(0,))]
    plan = plan_mig(nodes, waiting(**{"1g_10gb": 5}), params=FAST)
    (ch,) = plan.changes
    config = plan.mig_parted_config()
    assert config["version"] == "v1"
    entries = config["mig-configs"]
    assert isinstance(entries, dict) and list(entries) == [ch.label_value]
    # Every GPU of the node is named, the held one as it is.
    assert entries[ch.label_value][0] == {
        "devices": [0], "mig-enabled": True,
        "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}
    assert entries[ch.label_value][1]["devices"] == [1]
    assert ch.label_value == config_name(ch.devices) and len(ch.label_value) <= 63


def test_count_vectors_are_all_valid_layouts() -> None:
    for model in (H, A, "A30-24GB"):
        geom = get_model(model).mig
        assert geom is not None
        vectors = count_vectors(geom)
        assert len(set(vectors)) == len(vectors) > 0
        for v in vectors:
            assert layout_from_counts(geom, dict(v)) is not None
    h100 = get_model(H).mig
    assert h100 is not None and len(count_vectors(h100)) == 77  # 78 with the empty one


# ---- the validator ---------------------------------------------------------------------------


def _change(node: MigNode, configs: dict[int, tuple[bool, tuple[tuple[str, int], ...]]],
            changed_ix: tuple[int, ...]) -> MigPlan:
    devices = tuple(DeviceConfig((i,), on, counts) for i, (on, counts) in sorted(configs.items()))
    return MigPlan((NodeChange(node.name, (H,), changed_ix, devices, config_name(devices)),),
                   "test", {})


@pytest.mark.parametrize(
    ("configs", "changed_ix", "needle"),
    [
        ({0: (True, (("1g.10gb", 7),)), 1: (True, (("1g.10gb", 7),))}, (0, 1),
         "GPU 0: held by a pod or a reservation"),
        ({0: (True, BALANCED_C := (("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1))),
          1: (True, (("7g.80gb", 1), ("1g.10gb", 1)))}, (1,), "have no valid layout"),
        ({0: (True, BALANCED_C), 1: (True, (("1g.5gb", 1),))}, (1,), "no MIG profile 1g.5gb"),
        ({0: (False, ()), 1: (True, (("1g.10gb", 7),))}, (1,),
         "GPU 0: config differs from its state but the GPU is not listed as changed"),
        ({0: (True, BALANCED_C)}, (1,), "config names GPUs [0], node has [0, 1]"),
        ({0: (True, BALANCED_C), 1: (True, BALANCED_C)}, (1,), "listed as changed but unchanged"),
    ],
)
def test_validator_rejects(configs: dict[int, tuple[bool, tuple[tuple[str, int], ...]]],
                           changed_ix: tuple[int, ...], needle: str) -> None:
    node = mig("m", n=2, held=(0,))
    errors = plan_errors([node], _change(node, configs, changed_ix))
    assert any(needle in e for e in errors), errors


def test_validator_rejects_two_nodes_of_a_model_in_flight_and_not_opted_in() -> None:
    a, b = whole("a", n=1), whole("b", n=1, opted_in=False)
    one = ((("1g.10gb", 7),))
    plan = MigPlan(_change(a, {0: (True, one)}, (0,)).changes
                   + _change(b, {0: (True, one)}, (0,)).changes, "test", {})
    errors = plan_errors([a, b], plan, frozenset({H}))
    assert any("nodes a and b change at once" in e for e in errors), errors
    assert any("b: does not opt in" in e for e in errors), errors
    assert any("a H100-80GB change is in flight" in e for e in errors), errors
    forged = MigPlan((replace(plan.changes[0], config_name="all-1g.10gb"),), "test", {})
    assert any("is not the entry's own" in e for e in plan_errors([a], forged))


# ---- properties ----------------------------------------------------------------------------

PROFILES = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


@st.composite
def gpu(draw: st.DrawFn, index: int) -> MigGpu:
    if draw(st.booleans()):
        geom = get_model(H).mig
        assert geom is not None
        counts = draw(st.sampled_from(count_vectors(geom)))
        slots = layout_from_counts(geom, dict(counts))
        assert slots is not None
        return MigGpu(index, H, True, slots, draw(st.booleans()))
    return MigGpu(index, H, False, (), draw(st.booleans()))


@st.composite
def cluster(draw: st.DrawFn) -> list[MigNode]:
    nodes = []
    for k in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 4))
        nodes.append(MigNode(f"n{k}", tuple(draw(gpu(i)) for i in range(n)),
                             draw(st.booleans())))
    return nodes


demands = st.builds(
    lambda w, f, q: MigDemand({(H, p): n for p, n in w.items()},
                              {(H, p): n for p, n in f.items()},
                              tuple(WholeDemand(f"q{i}", g) for i, g in enumerate(q))),
    st.dictionaries(st.sampled_from(PROFILES), st.integers(0, 9), max_size=3),
    st.dictionaries(st.sampled_from(PROFILES), st.integers(0, 9), max_size=2),
    st.lists(st.integers(1, 4), max_size=2),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster(), demands)
def test_plans_are_valid_and_touch_no_held_gpu(nodes: list[MigNode], demand: MigDemand) -> None:
    greedy = greedy_mig_plan(nodes, demand)
    solved = plan_mig(nodes, demand, params=FAST)
    by_name = {n.name: n for n in nodes}
    for plan in (greedy, solved):
        assert plan_errors(nodes, plan) == []
        for ch in plan.changes:
            node = by_name[ch.node]
            assert node.opted_in
            held = {g.index for g in node.gpus if g.held}
            assert not held & set(ch.changed)
        for mp, n in plan.served.items():
            assert 0 < n <= demand.waiting[mp]
    if solved.status == "OPTIMAL":
        # Serving waiting pods comes first: the solver never serves fewer than greedy.
        assert (sum(solved.served.values()) + len(solved.whole_served)
                >= sum(greedy.served.values()) + len(greedy.whole_served))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.sampled_from(PROFILES), st.data())
def test_demand_one_node_can_serve_is_served(n_gpus: int, profile: str,
                                              data: st.DataObject) -> None:
    geom = get_model(H).mig
    assert geom is not None
    most = n_gpus * geom.profile(profile).max_count
    count = data.draw(st.integers(1, most))
    busy = whole("busy", n=2, held=(0, 1))  # a node with nothing to offer
    nodes = [busy, whole("w", n=n_gpus)]
    demand = MigDemand({(H, profile): count})
    for plan in (plan_mig(nodes, demand, params=FAST), greedy_mig_plan(nodes, demand)):
        assert plan_errors(nodes, plan) == []
        assert plan.served == {(H, profile): count}, plan


def test_many_models_keep_the_objective_within_cp_sats_integers() -> None:
    # Nine MIG-capable models, four opted-in nodes of eight whole GPUs each: the weights
    # of the lexicographic objective were once bounded by every candidate's terms, and
    # their product passed 2^63 (MODEL_INVALID, the greedy plan every time).
    from packing.catalog import CATALOG

    models = [m for m in CATALOG.values() if m.mig is not None]
    nodes, waiting, fore = [], {}, {}
    for m in models:
        assert m.mig is not None
        profile = m.mig.classic[0].name
        nodes += [MigNode(f"{m.name}-{i}", tuple(MigGpu(j, m.name, False) for j in range(8)),
                          opted_in=True) for i in range(4)]
        waiting[m.name, profile] = 50
        fore[m.name, profile] = 400
    plan = plan_mig(nodes, MigDemand(waiting, fore, (WholeDemand("w", 8),)),
                    params=SolverParams(max_time_s=0.2, workers=1, seed=1))
    assert not plan.status.startswith("MODEL_INVALID"), plan.status
    assert plan_errors(nodes, plan) == []


def test_plan_errors_refuse_a_mode_change_on_a_node_in_use() -> None:
    # A hand-made plan switching idle GPU 0 to MIG while GPU 7 runs a pod: mig-parted's
    # mode step would clear every MIG GPU of the node and may reset GPU 7 too.
    nodes = [whole("b", held=(7,))]
    idle = [whole("b")]
    plan = greedy_mig_plan(idle, waiting(**{"1g_10gb": 7}))
    assert plan.changes and plan_errors(idle, plan) == []
    errors = plan_errors(nodes, plan)
    assert any("MIG mode changes on a node in use" in e for e in errors), errors
