"""Benchmark: the certified upper bound on openb allocation at 130% (issue 38, item 1).

For every trace with a published FGD series and every seed, the bound of
``sim/openb/bound.py`` (the relaxation, ``--lps 1``; with ``--refine-lps N`` the first
seed's bound also by branch and bound with at most N LPs), kept per trace as JSON under
``--out`` so that a rerun computes only what is missing, and a table beside the policies'
figures of a ``bench/openb_all.py`` run (``--policies DIR``): FGD, gpupack, the bound and
how much of the distance from FGD to the bound gpupack closes.

    python bench/openb_bound.py --seeds 10 --out bench/results/openb-bound-2026-12-06
    python bench/openb_bound.py --traces default --seeds 1 --refine-lps 40
    python bench/openb_bound.py --policies bench/results/openb-all-2026-12-06 --reuse
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.openb_all import PREFIX, family  # noqa: E402
from sim.openb import bundled  # noqa: E402
from sim.openb.bound import allocation_bound, make_instance  # noqa: E402
from sim.openb.cluster import Nodes, Pods  # noqa: E402
from sim.openb.replay import PUBLISHED_SEEDS, build_workload  # noqa: E402
from sim.traces import parse_nodes, parse_pods  # noqa: E402

TRACES = ("cpu050", "cpu100", "cpu200", "cpu250", "default", "gpushare100", "gpushare40",
          "gpushare60", "gpushare80", "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
          "multigpu20", "multigpu30", "multigpu40", "multigpu50")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bound_trace(trace_dir: Path, trace: str, seeds: list[int], out: Path,
                refine_lps: int) -> dict[str, Any]:
    """The trace's per-seed bounds, from ``out/<trace>.json`` where already there."""
    path = out / f"{trace}.json"
    doc: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {"seeds": {}}
    todo = [s for s in seeds if str(s) not in doc["seeds"]]
    refine = refine_lps > 1 and doc.get("refined", {}).get("lps", 0) < refine_lps
    if not todo and not refine:
        return doc
    nodes = Nodes.from_trace(parse_nodes((trace_dir / "openb_node_list_gpu_node.csv").read_text()))
    pods = Pods.from_trace(parse_pods((trace_dir / f"{PREFIX}{trace}.csv").read_text()),
                           nodes.models)
    for seed in todo:
        inst = make_instance(nodes, pods, build_workload(pods, nodes.gpu_capacity_milli, seed))
        found = allocation_bound(inst)
        doc["seeds"][str(seed)] = {"alloc_130": found.alloc_130, "kind": found.kind,
                                   "lp_130": found.lp_130, "demand_pct": found.demand_pct,
                                   "seconds": round(found.seconds, 1)}
        _log(f"  {trace} seed {seed}: {found.alloc_130:.3f} ({found.seconds:.0f}s)")
        path.write_text(json.dumps(doc, indent=1))
    if refine:
        seed = seeds[0]
        inst = make_instance(nodes, pods, build_workload(pods, nodes.gpu_capacity_milli, seed))
        found = allocation_bound(inst, budget=refine_lps)
        doc["refined"] = {"seed": seed, "lps": refine_lps, "alloc_130": found.alloc_130,
                          "solved": found.nodes, "seconds": round(found.seconds, 1),
                          "log": list(found.log)}
        _log(f"  {trace} seed {seed} refined ({found.nodes} LPs): {found.alloc_130:.3f} "
             f"({found.seconds:.0f}s)")
        path.write_text(json.dumps(doc, indent=1))
    return doc


def mean_bound(doc: dict[str, Any], seeds: list[int]) -> float:
    return sum(doc["seeds"][str(s)]["alloc_130"] for s in seeds) / len(seeds)


def table(bounds: dict[str, dict[str, Any]], seeds: list[int],
          policies: dict[str, dict[str, Any]] | None) -> str:
    """Markdown: per trace, the bound (mean over the seeds; refined for the first seed
    where computed) and, with the policies' figures, FGD, gpupack and the share of the
    distance from FGD to the bound that gpupack closes."""
    head = "| trace | bound @130 (mean) | refined, seed 42 |"
    sep = "|---|---|---|"
    if policies:
        head += " fgd | gpupack | closed |"
        sep += "---|---|---|"
    lines = [head, sep]
    fams: dict[str, list[float]] = {}
    for trace in sorted(bounds):
        ub = mean_bound(bounds[trace], seeds)
        ref = bounds[trace].get("refined")
        row = f"| {trace} | {ub:.2f} | " + (f"{ref['alloc_130']:.2f}" if ref else "-") + " |"
        if policies and trace in policies:
            f = policies[trace]["fgd"]["alloc_130"]
            g = policies[trace]["gpupack"]["alloc_130"]
            closed = (g - f) / (ub - f) * 100 if ub > f else float("nan")
            fams.setdefault(family(trace), []).append(closed)
            row += f" {f:.2f} | {g:.2f} | {closed:+.0f}% |"
        lines.append(row)
    if fams:
        lines += ["", "| family | mean share of the distance closed |", "|---|---|"]
        lines += [f"| {k} | {sum(v) / len(v):+.0f}% |" for k, v in sorted(fams.items())]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--refine-lps", type=int, default=1)
    ap.add_argument("--out", default="bench/results/openb-bound")
    ap.add_argument("--policies", help="a bench/openb_all.py --out folder (its <trace>.json)")
    args = ap.parse_args()
    trace_dir = bundled.trace_dir()  # the traces shipped in sim/openb/data
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [PUBLISHED_SEEDS[0] + i for i in range(args.seeds)]
    t0 = time.perf_counter()
    bounds = {t: bound_trace(trace_dir, t, seeds, out, args.refine_lps)
              for t in args.traces.split(",")}
    _log(f"done in {time.perf_counter() - t0:.0f}s")
    policies = None
    if args.policies:
        policies = {t: json.loads((Path(args.policies) / f"{t}.json").read_text())["policies"]
                    for t in bounds if (Path(args.policies) / f"{t}.json").is_file()}
    print(table(bounds, seeds, policies))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
