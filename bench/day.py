"""The bundled day (``gpupack simulate``) over other draws of its noise: GPUs and nodes
each scheduler needs, and what waits, per scenario seed, with gpupack's share of plain
kube-scheduler's GPUs.

    python bench/day.py [--seeds 5] [--format json]

Each seed redraws the autoscalers' ±10% noise of the bundled day (the scenario's
``seed``) and kube-scheduler's random tie-breaks (``--seed`` of the placers); the
cluster, the services and their curves stay as shipped (``gpupack/scenarios/default.yaml``).
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import statistics
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpupack.simulate_cmd import DAY_PLACERS, day_row
from packing.day_scenario import parse_day


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--format", choices=["table", "json"], default="table")
    args = ap.parse_args()
    text = (importlib.resources.files("gpupack") / "scenarios" / "default.yaml").read_text()
    rows = []
    for seed in range(1, args.seeds + 1):
        data = yaml.safe_load(text)
        data["seed"] = seed
        day = parse_day(data).day
        t0 = time.perf_counter()
        out = {}
        for name in ("kube-scheduler", "gpupack"):
            row = day_row(day, DAY_PLACERS[name](seed), size=True)
            assert row.sizing is not None
            out[name] = {"gpus_needed": row.sizing.gpus, "nodes_needed": row.sizing.nodes,
                         "pods_waiting_peak": row.result.pods_waiting_peak,
                         "groups_waiting_peak": row.result.groups_waiting_peak,
                         "wait_p99_s": row.result.wait_p99_s,
                         "overcommitted": row.result.overcommitted}
        out_row = {"seed": seed, **out, "gpupack_over_kube_gpus": round(
            out["gpupack"]["gpus_needed"] / out["kube-scheduler"]["gpus_needed"], 3),
            "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(out_row)
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    print("| seed | kube-scheduler GPUs / nodes | gpupack GPUs / nodes | gpupack / kube GPUs "
          "| kube waits (pods, groups) | gpupack waits | over-committed (kube, gpupack) | s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        k, g = r["kube-scheduler"], r["gpupack"]
        print(f"| {r['seed']} | {k['gpus_needed']} / {k['nodes_needed']} "
              f"| {g['gpus_needed']} / {g['nodes_needed']} | {r['gpupack_over_kube_gpus']} "
              f"| {k['pods_waiting_peak']}, {k['groups_waiting_peak']} "
              f"| {g['pods_waiting_peak']}, {g['groups_waiting_peak']} "
              f"| {k['overcommitted']}, {g['overcommitted']} | {r['seconds']} |")
    ratios = [r["gpupack_over_kube_gpus"] for r in rows]
    print(f"gpupack needs {statistics.mean(ratios):.3f} of plain kube-scheduler's GPUs "
          f"(mean of {len(rows)} seeds; {min(ratios)}-{max(ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
