"""All-or-nothing groups: reserving room for members that do not exist yet.

A LeaderWorkerSet creates the leader first and the workers later, so when the first pod
of a group is pending the others are not. To place the group all-or-nothing the planner
adds a *reservation* member for every missing pod, shaped like the largest known member
(LWS workers share one template; the leader's may differ but never asks for more), and
solves them together. A reservation member's placement is the room held for that worker;
it is reported as a reservation, never bound.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from packing.model import Placement, PlanResult, PodRequest, Snapshot

# The NVLink clique label of GPU Feature Discovery: a group with no topology key of its
# own is kept inside one clique when nodes carry it (packing.groups.placement).
CLIQUE_LABEL = "nvidia.com/gpu.clique"
# A node labelled so says the cluster runs LLM groups even before any group pod exists
# and without NVLink cliques (plain 8-GPU nodes): whole nodes are then kept whole
# (packing.policies.lookahead.keeps_whole_nodes).
KEEP_WHOLE_NODES_LABEL = "gpupack.io/keep-whole-nodes"

RESERVE_MARK = "#reserve-"


def is_reservation(key: str) -> bool:
    return RESERVE_MARK in key


@dataclass(frozen=True)
class GroupStatus:
    group: str
    size: int
    nodes: tuple[str, ...]
    state: str  # placed | reserved | waiting
    reason: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "group": self.group,
            "size": self.size,
            "nodes": list(self.nodes),
            "state": self.state,
            "reason": self.reason,
        }


def members_by_group(pods: Iterable[PodRequest]) -> dict[str, list[PodRequest]]:
    out: dict[str, list[PodRequest]] = defaultdict(list)
    for p in pods:
        if p.group is not None:
            out[p.group.key].append(p)
    return out


def with_reservations(snapshot: Snapshot) -> Snapshot:
    """The snapshot with a reservation member added for every missing pod of a group
    that has at least one pending member."""
    running = members_by_group(p for p, _ in snapshot.running)
    extra: list[PodRequest] = []
    for key, pending in members_by_group(snapshot.pending).items():
        ref = pending[0].group
        assert ref is not None
        known = {p.group.index for p in pending if p.group} | {
            p.group.index for p in running.get(key, []) if p.group
        }
        template = max(pending, key=lambda p: (p.gpu_demand_milli, p.cpu_milli, p.memory_mib))
        missing = [i for i in range(ref.size) if i not in known]
        for i in missing:
            extra.append(
                replace(
                    template,
                    key=f"{key}{RESERVE_MARK}{i}",
                    uid="",
                    group=replace(ref, index=i),
                )
            )
    if not extra:
        return snapshot
    return replace(snapshot, pending=snapshot.pending + tuple(extra))


def group_statuses(snapshot: Snapshot, result: PlanResult) -> list[GroupStatus]:
    """What happened to each group with pending members (or running members only)."""
    where: dict[str, Placement] = {p.pod: p for p in result.placements}
    why = {u.pod: u.reason for u in result.unschedulable}
    running = members_by_group(p for p, _ in snapshot.running)
    run_nodes = {p.key: pl.node for p, pl in snapshot.running}
    pending = members_by_group(snapshot.pending)
    out: list[GroupStatus] = []
    for key in sorted(set(running) | set(pending)):
        members: Sequence[PodRequest] = pending.get(key, []) or running[key]
        ref = members[0].group
        assert ref is not None
        nodes = sorted(
            {run_nodes[p.key] for p in running.get(key, [])}
            | {where[p.key].node for p in pending.get(key, []) if p.key in where}
        )
        waiting = [p for p in pending.get(key, []) if p.key not in where]
        if waiting:
            out.append(GroupStatus(key, ref.size, (), "waiting", why.get(waiting[0].key, "")))
        elif any(is_reservation(p.key) for p in pending.get(key, [])):
            out.append(
                GroupStatus(
                    key, ref.size, tuple(nodes), "reserved", "room held for members not created yet"
                )
            )
        elif pending.get(key):
            out.append(GroupStatus(key, ref.size, tuple(nodes), "placed", "all members placed"))
        else:
            out.append(GroupStatus(key, ref.size, tuple(nodes), "placed", "all members running"))
    return out
