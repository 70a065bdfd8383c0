"""Reservation members for groups whose workers do not exist yet."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packing_builders import group, mig, node

from packing.cpsat import SolverParams
from packing.groups.members import group_statuses, is_reservation, with_reservations
from packing.model import GpuMode, Snapshot
from packing.policies.gpupack import GpupackPolicy
from packing.validate import validate

FAST = SolverParams(max_time_s=0.5, workers=1)


def test_leader_alone_reserves_room_for_workers() -> None:
    leader = group("ns/lws/0", 3, "clique", count=8)[0]
    nodes = tuple(node(f"n{i}", 8, labels={"clique": "a" if i < 3 else "b"}) for i in range(5))
    snap = with_reservations(Snapshot(nodes, pending=(leader,)))
    assert len(snap.pending) == 3 and sum(is_reservation(p.key) for p in snap.pending) == 2
    result = GpupackPolicy(FAST).plan(snap)
    assert validate(snap, result.placements) == []
    [status] = group_statuses(snap, result)
    assert status.state == "reserved" and len(status.nodes) == 3
    assert all(n in {"n0", "n1", "n2"} for n in status.nodes)  # clique a: 3 nodes


def test_group_that_cannot_fit_holds_nothing() -> None:
    leader = group("ns/lws/0", 4, "clique", count=8)[0]
    nodes = tuple(node(f"n{i}", 8, labels={"clique": "a"}) for i in range(3))
    snap = with_reservations(Snapshot(nodes, pending=(leader, mig("small"))))
    result = GpupackPolicy(FAST).plan(snap)
    assert [p.pod for p in result.placements] == ["small"]
    [status] = group_statuses(snap, result)
    assert status.state == "waiting" and "at most 3" in status.reason


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    known=st.lists(st.integers(1, 4), min_size=3, max_size=3),
    n_nodes=st.integers(1, 5),
)
def test_every_group_all_reserved_or_nothing(
    sizes: list[int], known: list[int], n_nodes: int
) -> None:
    nodes = tuple(node(f"n{i}", 4, labels={"clique": str(i % 2)}) for i in range(n_nodes))
    nodes += (node("mig", 2, mode=GpuMode.MIG),)
    pending = []
    for g, size in enumerate(sizes):
        members = group(f"g{g}", size, "clique", count=4)
        pending += members[: max(1, min(size, known[g]))]
    pending.append(replace(mig("s0"), priority=10))
    snap = with_reservations(Snapshot(nodes, pending=tuple(pending)))
    result = GpupackPolicy(FAST).plan(snap)
    assert validate(snap, result.placements) == []
    placed = {p.pod for p in result.placements}
    for g, size in enumerate(sizes):
        keys = [p.key for p in snap.pending if p.group and p.group.key == f"g{g}"]
        assert len(keys) == size
        assert all(k in placed for k in keys) or not any(k in placed for k in keys)
