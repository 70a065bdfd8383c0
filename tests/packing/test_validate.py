"""The validator: accepts valid plans and rejects each kind of hand-made invalid state.

A validator that accepts everything fails this file."""

from __future__ import annotations

import pytest
from packing_builders import group, mig, node, shared, whole

from packing.model import GpuMode, Placement, Snapshot
from packing.validate import validate

MIGN = node("m", 1, mode=GpuMode.MIG)
WHOLE2 = node("w", 2)
L40S = node("s", 1, model="L40S", mode=GpuMode.SHARED, replicas=2)
CLIQUE_A = node("ca", 8, labels={"clique": "a"})
CLIQUE_B = node("cb", 8, labels={"clique": "b"})


def snap(nodes: list, pending: list, running: list | None = None) -> Snapshot:
    return Snapshot(tuple(nodes), tuple(running or ()), tuple(pending))


def test_valid_plan_has_no_errors() -> None:
    s = snap([MIGN, WHOLE2], [mig("a"), mig("b", "3g.40gb"), whole("c", 2)])
    plan = [
        Placement("a", "m", (0,), "1g.10gb", 0, True),
        Placement("b", "m", (0,), "3g.40gb", 4, True),
        Placement("c", "w", (0, 1)),
    ]
    assert validate(s, plan) == []


@pytest.mark.parametrize(
    ("nodes", "pending", "plan", "needle"),
    [
        # MIG instance at a start its profile does not allow (3g only at 0 or 4).
        ([MIGN], [mig("a", "3g.40gb")], [Placement("a", "m", (0,), "3g.40gb", 2, True)], "a"),
        # Overlapping MIG instances.
        (
            [MIGN],
            [mig("a", "3g.40gb"), mig("b", "1g.10gb")],
            [
                Placement("a", "m", (0,), "3g.40gb", 4, True),
                Placement("b", "m", (0,), "1g.10gb", 5, True),
            ],
            "b",
        ),
        # Two whole pods on one GPU.
        (
            [WHOLE2],
            [whole("a"), whole("b")],
            [Placement("a", "w", (0,)), Placement("b", "w", (0,))],
            "in use",
        ),
        # Whole pod given fewer GPUs than asked.
        ([WHOLE2], [whole("a", 2)], [Placement("a", "w", (0,))], "needs 2"),
        # Whole pod on a MIG GPU.
        ([MIGN], [whole("a")], [Placement("a", "m", (0,))], "cannot serve"),
        # Shared GPU replicas over-committed (2 replicas).
        (
            [L40S],
            [shared("a", 10, 10), shared("b", 10, 10), shared("c", 10, 10)],
            [Placement(k, "s", (0,)) for k in "abc"],
            "c",
        ),
        # Shared GPU memory over-committed (L40S has 48 GiB).
        (
            [L40S],
            [shared("a", 10, 30_000), shared("b", 10, 30_000)],
            [Placement(k, "s", (0,)) for k in "ab"],
            "b",
        ),
        # CPU over-committed.
        (
            [node("w", 2, cpu=1500)],
            [whole("a", 1, cpu=1000), whole("b", 1, cpu=1000)],
            [Placement("a", "w", (0,)), Placement("b", "w", (1,))],
            "insufficient cpu",
        ),
        # A pod placed twice, a pod that is not pending, an unknown node.
        ([WHOLE2], [whole("a")], [Placement("a", "w", (0,)), Placement("a", "w", (1,))], "twice"),
        ([WHOLE2], [], [Placement("x", "w", (0,))], "not a pending pod"),
        ([WHOLE2], [whole("a")], [Placement("a", "nowhere", (0,))], "unknown node"),
        # A group placed in part.
        ([CLIQUE_A, CLIQUE_B], group("g", 2), [Placement("g-0", "ca", tuple(range(8)))], "in part"),
        # A group spanning two topology domains.
        (
            [CLIQUE_A, CLIQUE_B],
            group("g", 2, "clique"),
            [Placement("g-0", "ca", tuple(range(8))), Placement("g-1", "cb", tuple(range(8)))],
            "spans",
        ),
        # Two exclusive groups of one namespace in one domain.
        (
            [node("c1", 8, labels={"clique": "a"}), node("c2", 8, labels={"clique": "a"})],
            group("ns/g", 1, "clique", True) + group("ns/h", 1, "clique", True),
            [Placement("ns/g-0", "c1", tuple(range(8))),
             Placement("ns/h-0", "c2", tuple(range(8)))],
            "exclusive",
        ),
    ],
)
def test_invalid_states_are_rejected(nodes, pending, plan, needle: str) -> None:  # type: ignore[no-untyped-def]
    errors = validate(snap(nodes, pending), plan)
    assert errors, "validator accepted an invalid plan"
    assert any(needle in e for e in errors), errors


def test_running_overcommit_is_reported() -> None:
    s = snap(
        [WHOLE2],
        [],
        running=[(whole("a"), Placement("a", "w", (0,))), (whole("b"), Placement("b", "w", (0,)))],
    )
    assert validate(s, []) != []
    assert validate(s, [], check_running=False) == []


def test_exclusive_domains_are_exclusive_within_a_namespace() -> None:
    """LeaderWorkerSet's exclusive placement is a pod anti-affinity of the group's own
    namespace: two exclusive groups of different namespaces may share a domain."""
    nodes = [node("c1", 8, labels={"clique": "a"}), node("c2", 8, labels={"clique": "a"})]
    pending = group("team-a/g", 1, "clique", True) + group("team-b/h", 1, "clique", True)
    plan = [Placement("team-a/g-0", "c1", tuple(range(8))),
            Placement("team-b/h-0", "c2", tuple(range(8)))]
    assert validate(snap(nodes, pending), plan) == []
