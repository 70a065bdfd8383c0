"""Build a packing Snapshot from lists of Node and Pod objects.

Pods with ``spec.nodeName`` are running (unless Succeeded/Failed), the others pending.
A running pod's GPUs come from what gpupack recorded at bind time; for pods bound by
someone else they are inferred (first GPU that fits), which is reported as a note.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kube.node_objects import NodeObservation, inventory_text, node_info, observation_of
from kube.objects import (
    ObjectError,
    bound_node,
    is_finished,
    object_name,
    pod_key,
    pod_request,
    recorded_placement,
)
from packing.model import NodeInfo, Placement, PodRequest, RequestKind, Snapshot
from packing.state import ClusterState, PlacementError, plugin_pick

# Headroom over an observed peak: time-sliced GPUs have no memory isolation, so a pod
# that already reached its peak once is counted with 10% more than that.
PEAK_HEADROOM_PCT = 10


def with_observed_peak(req: PodRequest, peak_mib: int | None) -> PodRequest:
    """A shared-GPU pod is counted with its observed peak (plus headroom) when that is
    larger than what it declared in gpupack.io/gpu-memory."""
    if req.kind is not RequestKind.SHARED or not peak_mib:
        return req
    need = -(-peak_mib * (100 + PEAK_HEADROOM_PCT) // 100)  # integer ceiling
    return replace(req, gpu_memory_mib=need) if need > req.gpu_memory_mib else req


def observed_share(obs: NodeObservation | None, node: str, req: PodRequest
                   ) -> Placement | None:
    """The time-sliced GPU the node agent saw this share pod hold a replica of, if any."""
    if obs is None or req.kind is not RequestKind.SHARED:
        return None
    index = obs.shares.get(req.key)
    return None if index is None else Placement(req.key, node, (index,))


def owned_instance(node: NodeInfo, req: PodRequest) -> Placement | None:
    """The MIG instance the node agent saw this pod own, if any."""
    for g in node.gpus:
        for inst in g.mig:
            if inst.owner == req.key and inst.profile == req.mig_profile:
                return Placement(req.key, node.name, (g.index,), inst.profile, inst.start)
    return None


@dataclass(frozen=True)
class BuiltSnapshot:
    snapshot: Snapshot
    notes: tuple[str, ...]  # inferred placements and pods that could not be accounted


def build_snapshot(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    scheduler_name: str | None = None,
    *,
    mig_actuator: bool = False,
) -> BuiltSnapshot:
    """Snapshot of ``nodes`` and ``pods``; ObjectError on an object it cannot read.

    ``scheduler_name``: when given, only pending pods of that scheduler are pending for
    us; running pods of every scheduler count, since they hold resources.
    ``mig_actuator``: whether MIG layouts of nodes that opt in may change (node_info).
    """
    notes: list[str] = []
    nodes = list(nodes)
    infos = [node_info(n, notes, mig_actuator=mig_actuator) for n in nodes]
    observations: dict[str, NodeObservation] = {}
    for n in nodes:
        name = object_name(n)
        if name is not None:
            observations[name] = observation_of(inventory_text(n), name)
    names = {n.name for n in infos}
    infos_by_name = {n.name: n for n in infos}
    if len(names) != len(infos):
        dup = sorted(n.name for n in infos if sum(m.name == n.name for m in infos) > 1)[0]
        raise ObjectError(f"Node {dup}: metadata.name: duplicate node")
    state = ClusterState(Snapshot(tuple(infos)))
    running: list[tuple[PodRequest, Placement]] = []
    pending: list[PodRequest] = []
    seen: set[str] = set()
    for pod in pods:
        node = bound_node(pod)
        # A pod's peak is the one its own node's agent saw (another node's entry for the
        # same key is about another pod, or stale).
        seen_on = observations.get(node) if node is not None else None
        req = with_observed_peak(pod_request(pod, strict=node is None),
                                 seen_on.peaks.get(pod_key(pod)) if seen_on else None)
        if req.key in seen:
            raise ObjectError(f"Pod {req.key}: metadata.name: duplicate pod")
        seen.add(req.key)
        if is_finished(pod):
            continue
        if node is None:
            wanted = (pod.get("spec") or {}).get("schedulerName", "default-scheduler")
            if scheduler_name is None or wanted == scheduler_name:
                pending.append(req)
            continue
        if node not in names:
            notes.append(f"pod {req.key} runs on unknown node {node}; ignored")
            continue
        placement = None
        # What the node agent saw wins over what gpupack recorded: the device plugin, not
        # gpupack, chose the replica, and a MIG slice is whichever the pod holds.
        candidates = (
            (observed_share(observations.get(node), node, req), "GPU the node agent saw it on"),
            (owned_instance(infos_by_name[node], req), "MIG instance the node agent saw it own"),
            (recorded_placement(pod, node), "recorded placement"),
        )
        for candidate, what in candidates:
            if candidate is None:
                continue
            why = state.shape_error(req, candidate)
            if why is None:
                placement = candidate
                break
            notes.append(f"pod {req.key} on {node}: {what} {candidate.to_json()} ignored: {why}")
        if placement is None and req.kind is RequestKind.SHARED:
            # A share nobody has seen yet is where the device plugin put it.
            pick = plugin_pick(state.nodes[node])
            if pick is not None:
                placement = Placement(req.key, node, (pick.first,))
                notes.append(f"pod {req.key} on {node}: GPU inferred as {pick.first} (the "
                             "device plugin's pick)")
        if placement is None:
            options = state.options(req, node)
            if options:
                placement = options[0]
                if req.kind is not RequestKind.NONE:
                    notes.append(
                        f"pod {req.key} on {node}: GPUs inferred as {list(placement.gpus)}"
                    )
            else:
                # It holds what it holds: count its CPU and memory, its GPUs are unknown.
                placement = Placement(req.key, node)
                notes.append(f"pod {req.key} on {node}: no free resource to account it on; "
                             f"counted without GPUs")
        if req.kind is RequestKind.SHARED and placement.gpus:
            # Where a running share is is a fact, not a choice the plugin model must
            # agree with; only say so when its GPU is over-booked.
            state.apply(req, placement, allow_overcommit=True)
            g = state.gpu(node, placement.gpus[0])
            if g.shared_memory_used > g.info.memory_mib:
                notes.append(f"pod {req.key} on {node}: GPU {g.info.index} is booked "
                             f"{g.shared_memory_used}Mi of {g.info.memory_mib}Mi")
            running.append((req, placement))
            continue
        try:
            state.apply(req, placement)
        except PlacementError as e:
            notes.append(f"pod {req.key} on {node}: placement does not fit: {e}")
            state.apply(req, placement, allow_overcommit=True)
        running.append((req, placement))
    snap = Snapshot(tuple(infos), tuple(running), tuple(pending))
    return BuiltSnapshot(snap, tuple(notes))
