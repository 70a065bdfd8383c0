"""Group refusals are Status values (issue 16, item 3): the check says which rule refused,
and the reservation book's wait reason comes from the check, never from the wording."""

from __future__ import annotations

import pytest
from packing_builders import group, node

from packing.groups.placement import (
    EXCLUSIVE_DOMAIN,
    GROUP_FIT,
    TOPOLOGY_LABEL,
    GroupFit,
    exclusive_domains_in_use,
    place_members,
)
from packing.model import Snapshot, exclusive_key
from packing.policies.gpupack import make_gpupack_scorer
from packing.state import ClusterState
from packing.status import Code, Status
from scheduler.groups.keys import wait_category

RACK = "example.com/rack"


def _state(*nodes):  # type: ignore[no-untyped-def]
    return ClusterState(Snapshot(tuple(nodes)))


@pytest.mark.parametrize("case,nodes,members,taken,check,code", [
    ("no node carries the key", [node("a"), node("b")], group("g", 2, RACK), set(),
     TOPOLOGY_LABEL, Code.UNRESOLVABLE),
    ("every domain taken", [node("a", labels={RACK: "r1"})], group("g", 1, RACK, True),
     {(exclusive_key("g", RACK), "r1")}, EXCLUSIVE_DOMAIN, Code.UNSCHEDULABLE),
    ("too big for any domain", [node("a", labels={RACK: "r1"}), node("b", labels={RACK: "r2"})],
     group("g", 2, RACK), set(), GROUP_FIT, Code.UNSCHEDULABLE),
], ids=lambda v: v if isinstance(v, str) else "")
def test_each_refusal_names_its_check(case: str, nodes: list, members: list,  # type: ignore[type-arg]
                                      taken: set[tuple[str, str]], check: str,
                                      code: Code) -> None:
    state = _state(*nodes)
    scorer = make_gpupack_scorer(Snapshot((), pending=tuple(members)))
    for exact in (True, False):
        got = place_members(state, members, scorer, set(taken), exact=exact)
        assert isinstance(got, Status), case
        assert (got.check, got.code) == (check, code), got
        assert got.message and str(got) == got.message


def test_a_fit_is_placements_and_domain_and_leaves_the_state_alone() -> None:
    state = _state(node("a", labels={RACK: "r1"}), node("b", labels={RACK: "r2"}),
                   node("c", labels={RACK: "r2"}))
    members = group("g", 2, RACK)
    scorer = make_gpupack_scorer(Snapshot((), pending=tuple(members)))
    got = place_members(state, members, scorer, set())
    assert isinstance(got, GroupFit) and got.domain == "r2"
    assert sorted(p.node for p in got.placements) == ["b", "c"]
    assert all(s.whole_free for s in state.nodes.values())  # nothing left applied
    assert exclusive_domains_in_use(state, []) == set()


@pytest.mark.parametrize("check,reason,category", [
    (GROUP_FIT, "no room anywhere", "no_room"),  # no word "fit" needed
    (TOPOLOGY_LABEL, "nothing", "no_domain"),
    (EXCLUSIVE_DOMAIN, "x", "exclusive_taken"),
    ("RoomChanged", "it does not fit: carries the topology label, exclusive, taken",
     "other"),  # the words of other checks do not matter
])
def test_wait_reason_comes_from_the_check(check: str, reason: str, category: str) -> None:
    assert wait_category(Status.unschedulable(check, reason)) == category
