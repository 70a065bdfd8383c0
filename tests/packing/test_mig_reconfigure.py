"""A node's MIG layout changes only when the node opts in and the MIG actuator is on
(issue 19, item 1): everywhere else the solvers offer only the instances the node reports,
and their reasons say which case keeps the layout as it is."""

from __future__ import annotations

from typing import Any

import pytest
from packing_builders import mig, node

from packing.model import GpuMode, MigReconfigure, NodeInfo, Snapshot, with_mig_actuator
from packing.scenario import ScenarioError, parse_scenario
from packing.state import ClusterState

R = MigReconfigure


@pytest.mark.parametrize(
    ("opt_in", "actuator", "case"),
    [
        (None, False, R.NOT_OPTED_IN),
        (None, True, R.NOT_OPTED_IN),
        (False, False, R.FROZEN),
        (False, True, R.FROZEN),
        (True, False, R.ACTUATOR_OFF),
        (True, True, R.ON),
    ],
)
def test_case_of_label_and_actuator(opt_in: bool | None, actuator: bool,
                                    case: MigReconfigure) -> None:
    assert MigReconfigure.of(opt_in, actuator) is case
    assert (case.why_fixed == "") is (case is R.ON)


def test_the_default_node_is_not_opted_in() -> None:
    info = NodeInfo("n", 1000, 1024)
    assert info.mig_reconfigure is R.NOT_OPTED_IN and not info.mig_reconfigurable


FIXED = [R.NOT_OPTED_IN, R.FROZEN, R.ACTUATOR_OFF]


@pytest.mark.parametrize("case", [*FIXED, R.ON])
def test_idle_whole_gpu_becomes_mig_only_when_on(case: MigReconfigure) -> None:
    state = ClusterState(Snapshot((node("h", 2, reconfigure=case),)))
    options = state.options(mig("p", "1g.10gb"), "h")
    if case is R.ON:
        assert options and all(o.mig_created for o in options)
    else:
        assert options == []


@pytest.mark.parametrize("case", [*FIXED, R.ON])
def test_free_room_of_a_mig_gpu_is_used_only_when_on(case: MigReconfigure) -> None:
    # GPU 0 has a 3g.40gb at 4 (free) and nothing at 0-3.
    info = node("h", 1, mode=GpuMode.MIG, layouts={0: [("3g.40gb", 4)]}, reconfigure=case)
    state = ClusterState(Snapshot((info,)))
    existing = state.options(mig("a", "3g.40gb"), "h")
    assert [(o.mig_start, o.mig_created) for o in existing][:1] == [(4, False)]
    created = state.options(mig("b", "1g.10gb"), "h")
    assert bool(created) is (case is R.ON)


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        (R.NOT_OPTED_IN, "the node does not opt in to MIG reconfiguration"),
        (R.FROZEN, "the node freezes its MIG layout"),
        (R.ACTUATOR_OFF, "the node opts in to MIG reconfiguration but the MIG actuator is off"),
    ],
)
def test_no_free_slice_reason_says_why_none_is_created(case: MigReconfigure,
                                                        needle: str) -> None:
    info = node("h", 1, mode=GpuMode.MIG, layouts={0: [("3g.40gb", 4)]}, reconfigure=case)
    why = ClusterState(Snapshot((info,))).reason(mig("p", "1g.10gb"), "h")
    assert why.startswith("no free 1g.10gb slice on any GPU")  # callers key on this
    assert f"no free 1g.10gb slice on any GPU, and none is created here: {needle}" in why


def test_busy_whole_gpus_on_a_node_that_may_change_say_they_are_in_use() -> None:
    state = ClusterState(Snapshot((node("h", 1, reconfigure=R.ON),)))
    state.apply(*_whole_on(state))
    why = state.reason(mig("p", "1g.10gb"), "h")
    assert "MIG is off on these GPUs and they are in use" in why
    # Emptied, the node could take it: not unresolvable.
    assert state.unresolvable(mig("p", "1g.10gb"), "h") is None


def _whole_on(state: ClusterState) -> tuple[Any, Any]:
    from packing_builders import whole

    pod = whole("w")
    return pod, state.options(pod, "h")[0]


def test_with_mig_actuator_turns_only_opted_in_nodes() -> None:
    nodes = [node(f"n{i}", 1, reconfigure=c) for i, c in enumerate(FIXED)]
    on = with_mig_actuator(nodes, True)
    assert [n.mig_reconfigure for n in on] == [R.NOT_OPTED_IN, R.FROZEN, R.ON]
    assert [n.mig_reconfigure for n in with_mig_actuator(on, False)] == FIXED


# ---- scenarios ----------------------------------------------------------------------------


def _scenario(**node_fields: Any) -> dict[str, Any]:
    spec = {"prefix": "h", "count": 1, "product": "NVIDIA-H100-80GB-HBM3", "gpus": 2,
            **node_fields}
    return {"nodes": [spec], "arrivals": 1,
            "classes": [{"name": "asr", "weight": 1, "mig": "1g.10gb"}]}


def test_scenario_mig_devices_and_opt_in() -> None:
    s = parse_scenario(_scenario(mode="mig", **{
        "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, "mig-reconfigure": True}))
    (n,) = s.nodes
    assert n.mig_reconfigure is R.ACTUATOR_OFF  # the run decides the actuator
    for g in n.gpus:
        assert sorted((i.profile, i.start) for i in g.mig) == [
            ("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)]
    assert parse_scenario(_scenario()).nodes[0].mig_reconfigure is R.NOT_OPTED_IN
    frozen = parse_scenario(_scenario(**{"mig-reconfigure": False}))
    assert frozen.nodes[0].mig_reconfigure is R.FROZEN


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"mig-reconfigure": "yes"}, "nodes[0].mig-reconfigure: 'yes' is not true or false"),
        ({"mig-devices": {"1g.10gb": 1}}, "nodes[0].mig-devices: only for mode: mig"),
        ({"mode": "mig", "mig-devices": {"1g.5gb": 1}},
         "nodes[0].mig-devices.1g.5gb: H100-80GB has no such profile"),
        ({"mode": "mig", "mig-devices": {"1g.10gb": -1}},
         "nodes[0].mig-devices.1g.10gb: -1 is not a count"),
        ({"mode": "mig", "mig-devices": {"7g.80gb": 1, "1g.10gb": 1}},
         "nodes[0].mig-devices: {'7g.80gb': 1, '1g.10gb': 1} fit no valid layout"),
        ({"mode": "mig", "mig-devices": ["1g.10gb"]}, "nodes[0].mig-devices: ['1g.10gb'] has"),
    ],
)
def test_scenario_errors_name_the_field(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScenarioError) as e:
        parse_scenario(_scenario(**fields))
    assert needle in str(e.value)
