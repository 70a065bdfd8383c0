"""The one validator of a snapshot plus placements.

Every solver runs its answer through :func:`validate` before returning it, and the tests
use the same function, so "valid" means one thing everywhere. It replays the running pods
and then the new placements onto empty nodes and reports every violation it finds:

- a pod placed twice, a placement for a pod that is not pending, an unknown node;
- CPU, memory, GPU share, replica or GPU memory over-committed;
- a MIG instance at a start its profile does not allow, or overlapping another;
- a whole-GPU pod on a GPU somebody else uses;
- a group placed in part, or spread over more than one topology domain, or sharing an
  exclusive domain with another group.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from packing.catalog import get_model
from packing.mig.layout import layout_errors
from packing.model import GpuMode, Placement, PodRequest, Snapshot
from packing.state import ClusterState, PlacementError


def validate(
    snapshot: Snapshot, placements: Iterable[Placement], *, check_running: bool = True
) -> list[str]:
    """All violations of ``placements`` on ``snapshot``; an empty list means valid."""
    errors: list[str] = []
    placements = list(placements)
    empty = Snapshot(nodes=snapshot.nodes)
    state = ClusterState(empty)
    pods: dict[str, PodRequest] = {}
    where: dict[str, Placement] = {}

    def place(pod: PodRequest, p: Placement, what: str) -> None:
        if p.pod != pod.key:
            errors.append(f"{what} {p.pod}: placement names another pod than {pod.key}")
            return
        if pod.key in where:
            errors.append(f"{what} {pod.key}: placed twice ({where[pod.key].node}, {p.node})")
            return
        try:
            state.apply(pod, p)
        except PlacementError as e:
            errors.append(f"{what} {e}")
            return
        where[pod.key] = p

    for pod, p in snapshot.running:
        pods[pod.key] = pod
        if check_running:
            place(pod, p, "running pod")
        else:
            state.apply(pod, p, allow_overcommit=True)
            where[pod.key] = p
    pending = {p.key: p for p in snapshot.pending}
    for p in placements:
        req = pending.get(p.pod)
        if req is None:
            errors.append(f"placement for {p.pod}, which is not a pending pod")
            continue
        pods[req.key] = req
        place(req, p, "pending pod")

    errors.extend(_mig_layouts(state))
    errors.extend(_groups(snapshot, pods, where))
    return errors


def _mig_layouts(state: ClusterState) -> list[str]:
    out = []
    for node in state.nodes.values():
        for g in node.gpus:
            if g.mode is not GpuMode.MIG:
                continue
            geom = get_model(g.info.model).mig
            if geom is None:
                out.append(f"{node.info.name} GPU {g.info.index}: MIG mode on a non-MIG model")
                continue
            for e in layout_errors(geom, g.mig_slots()):
                out.append(f"{node.info.name} GPU {g.info.index}: {e}")
    return out


def _groups(
    snapshot: Snapshot, pods: dict[str, PodRequest], where: dict[str, Placement]
) -> list[str]:
    out: list[str] = []
    members: dict[str, list[PodRequest]] = defaultdict(list)
    known = {p.key: p for p in snapshot.pending}
    known.update({p.key: p for p, _ in snapshot.running})
    for pod in known.values():
        if pod.group is not None:
            members[pod.group.key].append(pod)
    node_of = {n.name: n for n in snapshot.nodes}
    domain_owner: dict[tuple[str, str], str] = {}
    for key, group_pods in sorted(members.items()):
        placed = [p for p in group_pods if p.key in where]
        if placed and len(placed) != len(group_pods):
            missing = sorted(p.key for p in group_pods if p.key not in where)
            out.append(f"group {key}: placed in part; not placed: {', '.join(missing)}")
        ref = group_pods[0].group
        assert ref is not None
        if not placed or ref.topology_key is None:
            continue
        domains = {node_of[where[p.key].node].labels.get(ref.topology_key) for p in placed}
        if len(domains) > 1 or None in domains:
            shown = sorted(str(d) for d in domains)
            out.append(f"group {key}: spans {ref.topology_key} domains {shown}")
        if ref.exclusive:
            for d in domains:
                if d is None:
                    continue
                other = domain_owner.setdefault((ref.exclusive_key, d), key)
                if other != key:
                    out.append(f"group {key}: shares exclusive domain {d} with group {other}")
    return out
