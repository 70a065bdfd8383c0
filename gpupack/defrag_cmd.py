"""``gpupack defrag``: which evictions would let each waiting whole-GPU group in.

Reads a Node file and a pods file (Pods, and PodDisruptionBudgets in the same List or
documents), plans with :func:`packing.defrag.plan.plan_defrag` and prints the moves. It only
plans: nothing is evicted. Exit status: 0 when every waiting group has a move (or none
waits), 1 when some group still waits (each with its reason), 2 on unusable input (the
message names the file, the object and the field).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpupack.inputs import read_objects
from kube.defrag.inputs import PDB, evictability
from kube.files import split_objects
from kube.objects import ObjectError
from kube.owners import RECREATING_KINDS
from kube.snapshot import BuiltSnapshot, build_snapshot
from packing.defrag.plan import DefragParams, DefragPlan, InvalidDefragPlan, plan_defrag


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", required=True, type=Path, help="Node objects (YAML/JSON)")
    p.add_argument("--pods", required=True, type=Path,
                   help="Pod objects, and PodDisruptionBudgets (YAML/JSON, a List may mix them)")
    p.add_argument("--format", default="table", choices=["table", "json"])
    p.add_argument("--scheduler-name", default=None,
                   help="only pending pods with this schedulerName wait (default: all)")
    p.add_argument("--owner-kind", action="append", default=[], metavar="KIND",
                   help="a further controller kind that recreates its evicted pods (built in: "
                        + ", ".join(sorted(RECREATING_KINDS)) + "); may be repeated")
    p.add_argument("--time-limit", type=float, default=0.5, help="CP-SAT seconds per solve")
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed")
    p.add_argument("--exact", action="store_true",
                   help="every node and domain, no time limit: the optimum (slow on big clusters)")


def _read(args: argparse.Namespace) -> tuple[BuiltSnapshot, list[dict[str, Any]],
                                             list[dict[str, Any]]]:
    nodes = read_objects(args.nodes, "Node")
    try:
        text = Path(args.pods).read_text(encoding="utf-8")
    except OSError as e:
        raise ObjectError(f"{args.pods}: {e.strerror or e}") from None
    found = split_objects(text, str(args.pods), ("Pod", PDB))
    pods, pdbs = found["Pod"], found[PDB]
    try:
        built = build_snapshot(nodes, pods, args.scheduler_name)
    except ObjectError as e:
        try:
            build_snapshot(nodes, [], args.scheduler_name)
        except ObjectError:
            raise ObjectError(f"{args.nodes}: {e}") from None
        raise ObjectError(f"{args.pods}: {e}") from None
    return built, pods, pdbs


def run(args: argparse.Namespace) -> int:
    try:
        built, pods, pdbs = _read(args)
        ev = evictability(pods, pdbs, RECREATING_KINDS | set(args.owner_kind))
    except ObjectError as e:
        msg = str(e)
        if not msg.startswith(str(args.pods)) and not msg.startswith(str(args.nodes)):
            msg = f"{args.pods}: {msg}"
        print(f"gpupack defrag: {msg}", file=sys.stderr)
        return 2
    for note in built.notes:
        print(f"note: {note}", file=sys.stderr)
    params = (DefragParams.exact() if args.exact
              else DefragParams(max_time_s=args.time_limit, seed=args.seed))
    try:
        plan = plan_defrag(built.snapshot, ev, params)
    except InvalidDefragPlan as e:  # a planner bug: say so rather than print a wrong plan
        print(f"gpupack defrag: internal error: {e}", file=sys.stderr)
        return 3
    if args.format == "json":
        print(json.dumps(plan.to_json(), indent=2))
    else:
        print_table(plan)
    return 1 if plan.waiting else 0


def print_table(plan: DefragPlan) -> None:
    if not plan.moves and not plan.waiting:
        print("no whole-GPU group or pod is waiting")
    for m in plan.moves:
        frees = "; ".join(f"{n} GPUs {','.join(map(str, g))}" for n, g in m.frees().items())
        if not m.evictions:
            print(f"group {m.group}: fits now without evictions ({frees})")
            continue
        print(f"group {m.group}: evict {len(m.evictions)} pod(s), cost {m.cost}; "
              f"then it takes {frees}")
        print(f"  {'POD':44} {'FROM':24} TO")
        for e in m.evictions:
            print(f"  {e.pod:44} {e.node:24} {e.to.node}")
    for w in plan.waiting:
        print(f"group {w.group}: WAITS: {w.reason}")
