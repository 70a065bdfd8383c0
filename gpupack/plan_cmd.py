"""``gpupack plan``: where would the pending pods of a snapshot go, and why."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpupack.inputs import add_mig_actuator_argument, load_cluster
from kube.objects import ObjectError
from packing.cpsat import SolverParams
from packing.groups.members import group_statuses, is_reservation, with_reservations
from packing.model import PlanResult, Snapshot
from packing.policies import get_policy, policy_names
from packing.policies.fgd import typical_shapes, workload_of
from packing.policies.gpupack import GpupackPolicy
from packing.reasons import placement_reason
from packing.state import ClusterState
from packing.summary import summarize


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", required=True, type=Path, help="Node objects (YAML/JSON)")
    p.add_argument("--pods", required=True, type=Path, help="Pod objects (YAML/JSON)")
    p.add_argument("--policy", default="gpupack", choices=policy_names())
    p.add_argument("--format", default="table", choices=["table", "json"])
    p.add_argument(
        "--scheduler-name",
        default=None,
        help="only pending pods with this schedulerName (default: all)",
    )
    p.add_argument("--time-limit", type=float, default=5.0, help="CP-SAT seconds (gpupack)")
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed (gpupack)")
    add_mig_actuator_argument(p)


def plan_json(snapshot: Snapshot, result: PlanResult) -> dict[str, object]:
    """The plan as JSON. ``snapshot`` includes the reservation members of groups; their
    placements are the room held for workers not created yet, shown under "groups"."""
    state = ClusterState(snapshot)
    pods = {p.key: p for p in snapshot.pending}
    placements = []
    for p in result.placements:
        # In the plan's order: each reason sees the pods placed before it.
        reason = placement_reason(state, pods[p.pod], p)
        if not is_reservation(p.pod):
            placements.append({**p.to_json(), "reason": reason})
    return {
        "placements": placements,
        "unschedulable": [
            {"pod": u.pod, "reason": u.reason}
            for u in result.unschedulable
            if not is_reservation(u.pod)
        ],
        "groups": [g.to_json() for g in group_statuses(snapshot, result)],
        "gpu_memory": gpu_memory_sources(snapshot),
        "summary": summarize(state, typical_shapes(workload_of(snapshot))).to_json(),
        "policy": result.policy,
        "solver_status": result.solver_status,
    }


MEMORY_SOURCES = {
    "nvml": "the node agent (NVML)",
    "gfd": "GPU Feature Discovery (nvidia.com/gpu.memory)",
    "catalog": "gpupack's catalog (the node reports none)",
}


def gpu_memory_sources(snapshot: Snapshot) -> list[dict[str, object]]:
    """The GPU memory the plan counted, by model, size and where the size came from
    (the node's own figure wins; the catalog is the fallback), with node and GPU counts."""
    rows: dict[tuple[str, int, str], tuple[set[str], int]] = {}
    for n in snapshot.nodes:
        for g in n.gpus:
            nodes, count = rows.get((g.model, g.memory_mib, g.memory_source), (set(), 0))
            nodes.add(n.name)
            rows[g.model, g.memory_mib, g.memory_source] = (nodes, count + 1)
    return [{"model": model, "memory_mib": mib, "source": source,
             "from": MEMORY_SOURCES.get(source, source), "nodes": len(nodes), "gpus": count}
            for (model, mib, source), (nodes, count) in sorted(rows.items())]


def run(args: argparse.Namespace) -> int:
    try:
        built = load_cluster(args.nodes, args.pods, args.scheduler_name,
                             mig_actuator=args.mig_actuator)
    except ObjectError as e:
        print(f"gpupack plan: {e}", file=sys.stderr)
        return 2
    for note in built.notes:
        print(f"note: {note}", file=sys.stderr)
    snapshot = with_reservations(built.snapshot)
    if args.policy == "gpupack":
        policy = GpupackPolicy(SolverParams(max_time_s=args.time_limit, seed=args.seed))
        result = policy.plan(snapshot)
    else:
        result = get_policy(args.policy).plan(snapshot)
    out = plan_json(snapshot, result)
    if args.format == "json":
        print(json.dumps(out, indent=2))
        return 0
    print(f"policy {result.policy} ({result.solver_status})")
    print(f"{'POD':40} {'NODE':24} {'GPUS':10} {'MIG':16} WHY")
    for row in out["placements"]:  # type: ignore[attr-defined]
        mig = f"{row['mig']['profile']}@{row['mig']['start']}" if row["mig"] else "-"
        gpus = ",".join(map(str, row["gpus"])) or "-"
        print(f"{row['pod']:40} {row['node']:24} {gpus:10} {mig:16} {row['reason']}")
    for u in result.unschedulable:
        if not is_reservation(u.pod):
            print(f"{u.pod:40} UNSCHEDULABLE: {u.reason}")
    for g in group_statuses(snapshot, result):
        print(
            f"group {g.group} (size {g.size}): {g.state} on {','.join(g.nodes) or '-'} ({g.reason})"
        )
    for row in out["gpu_memory"]:  # type: ignore[attr-defined]
        print(f"gpu memory: {row['model']} {row['memory_mib']} MiB from {row['from']} "
              f"({row['gpus']} GPU(s) on {row['nodes']} node(s))")
    print("summary: " + ", ".join(f"{k}={v}" for k, v in out["summary"].items()))  # type: ignore[attr-defined]
    return 0
