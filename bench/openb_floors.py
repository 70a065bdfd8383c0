"""Benchmark: floors under the openb certificate, from one policy's run (issue 38, item 2).

For each trace and seed, a policy's run through the replay, then the LP optima of
``sim/openb/floors.py``: the root relaxation, the relaxation with b fixed to the run's
blocking profile (a floor for branch and bound on b), restricted to the run's node
configurations (a floor for column generation on the end state), and both. Kept per
trace as JSON under ``--out`` (a rerun computes only missing seeds); a table on stdout.

    python bench/openb_floors.py --traces multigpu40,gpushare40 --seeds 1 \\
        --out bench/results/openb-floors-2026-12-07
    python bench/openb_floors.py --traces multigpu40 --seeds 1 --slices 0.4:1.0:0.025
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from argparse import ArgumentTypeError
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.openb_all import PREFIX  # noqa: E402
from sim.openb import bundled  # noqa: E402
from sim.openb.bound import SLICES, make_instance  # noqa: E402
from sim.openb.cluster import Nodes, Pods  # noqa: E402
from sim.openb.floors import floors, run_end  # noqa: E402
from sim.openb.policies import POLICIES, make  # noqa: E402
from sim.openb.replay import PUBLISHED_SEEDS, build_workload, replay, trace_shapes  # noqa: E402
from sim.traces import parse_nodes, parse_pods  # noqa: E402

KEYS = ("run", "root", "blocking", "configurations", "both")


MAX_SLICES = 1000


def parse_slices(text: str) -> tuple[float, ...]:
    """"coarse" (``SLICES``), "a:b:step" (a to b inclusive: the step must divide b - a),
    or a comma list; each in (0, 1], increasing, at most ``MAX_SLICES``."""
    if text == "coarse":
        return SLICES
    try:
        if ":" in text:
            lo, hi, step = (float(x) for x in text.split(":"))
            if step <= 0 or hi < lo:
                raise ValueError
            count = round((hi - lo) / step)
            if abs(lo + count * step - hi) > 1e-9 or count >= MAX_SLICES:
                raise ArgumentTypeError(
                    f"{text!r}: the step must divide {hi} - {lo} into fewer than"
                    f" {MAX_SLICES} slices")
            got = tuple(round(lo + i * step, 9) for i in range(count + 1))
        else:
            got = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ArgumentTypeError(
            f"{text!r} is not 'coarse', 'lo:hi:step' or a comma list of fractions") from None
    if len(got) > MAX_SLICES or any(not 0 < f <= 1 for f in got) or list(got) != sorted(set(got)):
        raise ArgumentTypeError(f"{text!r}: slices must be increasing fractions in (0, 1]")
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="multigpu40,gpushare40")
    ap.add_argument("--seeds", type=int, default=1, help="count, from 42")
    ap.add_argument("--policy", default="gpupack", choices=sorted(POLICIES))
    ap.add_argument("--slices", type=parse_slices, default=SLICES)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    d = bundled.trace_dir()
    nodes = Nodes.from_trace(parse_nodes((d / bundled.DEFAULT_NODES).read_text()))
    seeds = [PUBLISHED_SEEDS[0] + i for i in range(args.seeds)]
    traces = [t for t in args.traces.split(",") if t]
    for trace in traces:
        if not (d / f"{PREFIX}{trace}.csv").exists():
            ap.error(f"--traces: no trace {trace!r} ({PREFIX}{trace}.csv is not bundled)")
    if not traces:
        ap.error("--traces: no trace named")
    failed = 0
    print("| trace | seed | " + " | ".join(KEYS) + " | s |")
    print("|---" * (len(KEYS) + 3) + "|")
    for trace in traces:
        path = d / f"{PREFIX}{trace}.csv"
        pods = Pods.from_trace(parse_pods(path.read_text()), nodes.models)
        record = args.out / f"{trace}.json" if args.out else None
        doc = (json.loads(record.read_text()) if record and record.exists()
               else {"trace": trace, "policy": args.policy, "slices": list(args.slices),
                     "seeds": {}})
        if doc["policy"] != args.policy or doc["slices"] != list(args.slices):
            ap.error(f"{record}: kept for policy {doc['policy']} and slices {doc['slices']}"
                     "; use another --out")
        shapes = trace_shapes(pods, nodes.models)
        all_shapes = trace_shapes(pods, nodes.models, coverage=1.0)
        for seed in seeds:
            got = doc["seeds"].get(str(seed))
            if got is None:
                t0 = time.perf_counter()
                workload = build_workload(pods, nodes.gpu_capacity_milli, seed)
                inst = make_instance(nodes, pods, workload)
                run = replay(nodes, pods, workload[:inst.n_arrivals], make(args.policy), seed,
                             shapes, all_shapes)
                got = floors(inst, run_end(inst, workload, run.placements),
                             args.slices).to_json()
                # the record's seconds: the whole seed (the replay and the four LPs)
                got["seconds"] = round(time.perf_counter() - t0, 1)
                if any(math.isnan(float(got[k])) for k in KEYS):
                    # GLOP's time limit: nothing kept, so a rerun computes it again
                    failed += 1
                    print(f"| {trace} | {seed} | an LP ended without an optimum: not kept"
                          " |", flush=True)
                    continue
                doc["seeds"][str(seed)] = got
                if record:
                    record.parent.mkdir(parents=True, exist_ok=True)
                    record.write_text(json.dumps(doc, indent=1) + "\n")
            print(f"| {trace} | {seed} | " + " | ".join(f"{got[k]:.3f}" for k in KEYS)
                  + f" | {got['seconds']:.0f} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
