"""scheduler.groups.rights.allowed_nodes: the nodes a group's constraint sets allow, and
its memo by constraint sets (the groups of one LeaderWorkerSet are judged once per pass)."""

from __future__ import annotations

import pytest

from kube.constraints import PodConstraints
from packing.status import Status
from scheduler.groups.rights import AllowedMemo, NodeFacts, allowed_nodes

NODES = [NodeFacts(f"n{i}", {"pool": "a" if i % 2 else "b", "kubernetes.io/hostname": f"n{i}"})
         for i in range(6)]
POOL_A = PodConstraints(node_selector=(("pool", "a"),))
POOL_B = PodConstraints(node_selector=(("pool", "b"),))
POOL_C = PodConstraints(node_selector=(("pool", "c"),))

CASES = [
    ("none", [], frozenset(f"n{i}" for i in range(6))),
    ("pool a", [POOL_A], frozenset({"n1", "n3", "n5"})),
    ("pool a twice, other fields aside", [POOL_A, PodConstraints(
        node_selector=(("pool", "a"),), priority_class="high", lws="x")],
     frozenset({"n1", "n3", "n5"})),
    ("a and b", [POOL_A, POOL_B], None),
    ("c", [POOL_C], None),
]


@pytest.mark.parametrize(("sets", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_allowed_nodes_with_and_without_the_memo(sets: list[PodConstraints],
                                                 expected: frozenset[str] | None) -> None:
    memo: AllowedMemo = {}
    plain = allowed_nodes(sets, NODES)
    first = allowed_nodes(sets, NODES, memo)
    again = allowed_nodes(sets, NODES, memo)
    if expected is None:
        assert isinstance(plain, Status) and isinstance(first, Status)
        assert plain.check == first.check == "NodeRules"
        assert plain.message == first.message
    else:
        assert plain == first == expected
    assert again == first
    assert len(memo) == (1 if sets else 0)  # no constraint: every node, nothing to keep


def test_one_memo_keeps_each_constraint_set_apart() -> None:
    memo: AllowedMemo = {}
    assert allowed_nodes([POOL_A], NODES, memo) == frozenset({"n1", "n3", "n5"})
    assert allowed_nodes([POOL_B], NODES, memo) == frozenset({"n0", "n2", "n4"})
    assert len(memo) == 2
