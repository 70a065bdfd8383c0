"""packing.constraints: the one node-level evaluator, over plain values (its table of
operators and tolerations is tests/kube/test_constraints.py, through kube's parser);
here the pieces the packing state uses without a Pod object."""

from __future__ import annotations

import pytest

from packing.constraints import (
    NodeLevel,
    Requirement,
    Term,
    Toleration,
    exclusion,
    parse_int,
    selector_miss,
)
from packing.model import NodeInfo, PodRequest, Snapshot, Taint
from packing.state import ClusterState, fits_node


@pytest.mark.parametrize(
    ("selector", "labels", "miss"),
    [
        ((), {}, None),
        ((("pool", "a"),), {"pool": "a", "x": "y"}, None),
        ((("pool", "a"), ("zone", "z1")), {"pool": "a"}, ("zone", "z1")),
        ((("pool", "a"),), {"pool": "b"}, ("pool", "a")),
    ],
)
def test_selector_miss(selector: tuple[tuple[str, str], ...], labels: dict[str, str],
                       miss: tuple[str, str] | None) -> None:
    assert selector_miss(selector, labels) == miss


@pytest.mark.parametrize(("text", "value"), [("12", 12), ("+3", 3), ("-4", -4), (" 5 ", 5),
                                             ("x", None), ("", None), ("1" * 19, None)])
def test_parse_int(text: str, value: int | None) -> None:
    assert parse_int(text) == value


def test_fits_node_uses_the_same_selector_judgement() -> None:
    state = ClusterState(Snapshot((NodeInfo("n", 8000, 65536, labels={"pool": "a"}),)))
    ok = PodRequest("ns/p", node_selector={"pool": "a"})
    other = PodRequest("ns/q", node_selector={"pool": "b"})
    assert fits_node(ok, state.nodes["n"]) is None
    assert fits_node(other, state.nodes["n"]) == "node selector pool=b does not match"


def test_exclusion_over_plain_values() -> None:
    level = NodeLevel(affinity=(Term((Requirement("rack", "Gt", ("10",)),)),),
                      tolerations=(Toleration("gpu", "Exists"),))
    assert exclusion(level, "n", {"rack": "20"}, (Taint("gpu", "x", "NoExecute"),)) is None
    e = exclusion(level, "n", {"rack": "20"}, (Taint("other", "", "NoSchedule"),))
    assert e is not None and e.field == "spec.tolerations: taint other:NoSchedule"
    assert exclusion(level, "n", {"rack": "5"}, ()) is not None
