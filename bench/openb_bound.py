"""Benchmark: the certified upper bound on openb allocation at 130% (issue 38, item 1).

For every trace with a published FGD series and every seed, the bound of
``sim/openb/bound.py`` (``--lps N``: branch and bound with at most N LPs, 1 = the root
relaxation; a seed kept with fewer LPs is computed again, from where its search stopped
when the record keeps it, "frontier", with the same slices and split; with
``--refine-lps N`` the first seed's bound also, kept apart under "refined"), kept per
trace as JSON under
``--out`` so that a rerun computes only what is missing, and a table beside the policies'
figures of a ``bench/openb_all.py`` run (``--policies DIR``): FGD, gpupack, the bound and
how much of the distance from FGD to the bound gpupack closes. ``--slices fine``: the
relaxation with finer slices (``FINE_SLICES``: tighter, slower); ``--slices early``: with
slices before 0.6 too (``EARLY_SLICES``: when the heavy share classes first block).
``--split middle``: branch and bound halves a class's first-blocking interval instead of
splitting it at its most fractional slice (``sim/openb/bound.py``; the records keep
"split").

    python bench/openb_bound.py --seeds 10 --out bench/results/openb-bound-2026-12-06
    python bench/openb_bound.py --traces default,multigpu50 --seeds 1 --lps 9 \
        --out bench/results/openb-bound-2026-12-06-bb
    python bench/openb_bound.py --seeds 3 --policies \\
        bench/results/openb-all-2026-12-01-shipped,bench/results/openb-all-2026-12-06-fresh
    python bench/openb_bound.py --traces gpushare100 --seeds 1 --clairvoyant
    python bench/openb_bound.py --traces default,multigpu50 --seeds 1 --lps 9 --slices fine \
        --out bench/results/openb-bound-2026-12-06-fine
    python bench/openb_bound.py --traces multigpu50 --seeds 1 --lps 9 --slices fine \
        --split middle --out bench/results/openb-bound-2026-12-06-mid

``--clairvoyant``: also the clairvoyant rolling-horizon CP-SAT run of the first seed
(``sim/openb/clairvoyant.py``), an achievable figure: the bound must be at least it
(checked: a bound below it is an error and the run fails).
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
from sim.openb.bound import (  # noqa: E402
    EARLY_SLICES,
    FINE_SLICES,
    SLICES,
    SPLITS,
    Bound,
    Frontier,
    Instance,
    allocation_bound,
    make_instance,
)
from sim.openb.clairvoyant import clairvoyant_run  # noqa: E402
from sim.openb.cluster import Nodes, Pods  # noqa: E402
from sim.openb.replay import PUBLISHED_SEEDS, build_workload, trace_shapes  # noqa: E402
from sim.traces import parse_nodes, parse_pods  # noqa: E402

# The relaxation's slices (fractions of the arrivals; ``sim/openb/bound.py``): "fine"
# and "early" tighten the bound (never loosen it), each LP is larger and slower.
SLICE_SETS: dict[str, tuple[float, ...]] = {"coarse": SLICES, "fine": FINE_SLICES,
                                            "early": EARLY_SLICES}

# The clairvoyant run's settings: the policy to 60% of the arrivals, then CP-SAT plans
# 80 arrivals at a time over each pod's 6 best nodes, 5 s a window.
CLAIRVOYANT: dict[str, Any] = {"start": 0.6, "window": 80, "top": 6, "time_limit": 5.0}

TRACES = ("cpu050", "cpu100", "cpu200", "cpu250", "default", "gpushare100", "gpushare40",
          "gpushare60", "gpushare80", "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
          "multigpu20", "multigpu30", "multigpu40", "multigpu50")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _bound_seed(inst: Instance, doc: dict[str, Any], path: Path, trace: str, seed: str,
                lps: int, slices: str, split: str) -> None:
    """One seed's bound into ``doc["seeds"][seed]``, written to ``path`` after every
    branch too (its "lps" then the LPs solved), with the search's frontier: a record
    with the same slices and split is deepened from it instead of computed again."""
    kept = doc["seeds"].get(seed, {})
    resume = None
    if (kept.get("frontier") and kept.get("slices", "coarse") == slices
            and kept.get("split", "fractional") == split):
        resume = Frontier.from_json(kept["frontier"])
    before = kept.get("seconds", 0.0) if resume else 0.0

    def keep(found: Bound, budget: int) -> None:
        assert found.frontier is not None
        doc["seeds"][seed] = {
            "alloc_130": found.alloc_130, "kind": found.kind, "lp_130": found.lp_130,
            "demand_pct": found.demand_pct, "seconds": round(found.seconds + before, 1),
            "lps": budget, "slices": slices, "split": split, "solved": found.nodes,
            "log": list(found.log), "resumed_at": resume.solved if resume else None,
            "frontier": found.frontier.to_json()}
        path.write_text(json.dumps(doc, indent=1))

    found = allocation_bound(inst, budget=lps, slices=SLICE_SETS[slices], split=split,
                             resume=resume, on_branch=lambda b: keep(b, b.nodes))
    keep(found, lps)
    _log(f"  {trace} seed {seed}: {found.alloc_130:.3f} (root {found.lp_130:.3f}, "
         f"{found.nodes} LPs, {found.seconds:.0f}s"
         + (f", resumed at {resume.solved} LPs)" if resume else ")"))


def bound_trace(trace_dir: Path, trace: str, seeds: list[int], out: Path,
                refine_lps: int, clairvoyant: bool = False, lps: int = 1,
                slices: str = "coarse", split: str = "fractional") -> dict[str, Any]:
    """The trace's per-seed bounds, from ``out/<trace>.json`` where already there with at
    least ``lps`` LPs of branch and bound (a record without "lps" had 1: the root) and the
    same ``slices`` (a record without "slices" had the coarse ones) and ``split`` (without
    "split": the most fractional slice)."""
    path = out / f"{trace}.json"
    doc: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {"seeds": {}}
    todo = [s for s in seeds
            if str(s) not in doc["seeds"] or doc["seeds"][str(s)].get("lps", 1) < lps
            or doc["seeds"][str(s)].get("slices", "coarse") != slices
            or doc["seeds"][str(s)].get("split", "fractional") != split]
    refine = refine_lps > 1 and doc.get("refined", {}).get("lps", 0) < refine_lps
    run_cv = clairvoyant and "clairvoyant" not in doc
    if not todo and not refine and not run_cv:
        return doc
    nodes = Nodes.from_trace(parse_nodes((trace_dir / bundled.DEFAULT_NODES).read_text()))
    pods = Pods.from_trace(parse_pods((trace_dir / f"{PREFIX}{trace}.csv").read_text()),
                           nodes.models)
    for seed in todo:
        inst = make_instance(nodes, pods, build_workload(pods, nodes.gpu_capacity_milli, seed))
        _bound_seed(inst, doc, path, trace, str(seed), lps, slices, split)
    if refine:
        seed = seeds[0]
        inst = make_instance(nodes, pods, build_workload(pods, nodes.gpu_capacity_milli, seed))
        found = allocation_bound(inst, budget=refine_lps, slices=SLICE_SETS[slices],
                                 split=split)
        doc["refined"] = {"seed": seed, "lps": refine_lps, "slices": slices, "split": split,
                          "alloc_130": found.alloc_130,
                          "solved": found.nodes, "seconds": round(found.seconds, 1),
                          "log": list(found.log)}
        _log(f"  {trace} seed {seed} refined ({found.nodes} LPs): {found.alloc_130:.3f} "
             f"({found.seconds:.0f}s)")
        path.write_text(json.dumps(doc, indent=1))
    if run_cv:
        seed = seeds[0]
        workload = build_workload(pods, nodes.gpu_capacity_milli, seed)
        cv = clairvoyant_run(nodes, pods, workload, trace_shapes(pods, nodes.models), seed,
                             **CLAIRVOYANT)
        doc["clairvoyant"] = {"seed": seed, "alloc_130": cv.alloc_130, "planned": cv.planned,
                              "failed": cv.failed, "windows": cv.windows,
                              "seconds": round(cv.seconds, 1), **CLAIRVOYANT}
        _log(f"  {trace} seed {seed} clairvoyant: {cv.alloc_130:.3f} ({cv.seconds:.0f}s)")
        path.write_text(json.dumps(doc, indent=1))
    cv_doc = doc.get("clairvoyant")
    if cv_doc is not None:
        ub = doc["seeds"][str(cv_doc["seed"])]["alloc_130"]
        if cv_doc["alloc_130"] > ub + 1e-6:
            raise SystemExit(f"{trace} seed {cv_doc['seed']}: the clairvoyant run "
                             f"({cv_doc['alloc_130']:.3f}) beats the bound ({ub:.3f}): a bug")
    return doc


def mean_bound(doc: dict[str, Any], seeds: list[int]) -> float:
    return sum(doc["seeds"][str(s)]["alloc_130"] for s in seeds) / len(seeds)


Series = dict[str, dict[int, float]]  # policy -> seed -> allocation % at 130%


def policy_series(folders: list[Path], trace: str) -> Series:
    """Per policy and seed, allocation at 130% from ``bench/openb_all.py`` runs' series
    CSV (``<folder>/<trace>/openb_pod_list_<trace>_series.csv``); a later folder's
    figures replace an earlier one's."""
    out: Series = {}
    for folder in folders:
        path = folder / trace / f"{PREFIX}{trace}_series.csv"
        if not path.is_file():
            continue
        head, *rows = [line.split(",") for line in path.read_text().splitlines() if line]
        col = head.index("130")
        for row in rows:
            out.setdefault(row[0], {})[int(row[1])] = float(row[col])
    return out


def table(bounds: dict[str, dict[str, Any]], seeds: list[int],
          policies: dict[str, Series] | None) -> str:
    """Markdown: per trace, the bound (mean over those of ``seeds`` computed), the clairvoyant run's
    achievable figure where computed (first seed, beside that seed's bound) and, with the
    policies' series, FGD and gpupack over the same seeds, the distance from FGD to the
    bound and the share of it gpupack closes."""
    head = ("| trace | root LP | bound @130 (seeds) | LPs, s a seed "
            "| clairvoyant (seed, its bound) |")
    sep = "|---|---|---|---|---|"
    if policies:
        head += " fgd | gpupack | bound - fgd | bound - gpupack | closed (root LP) | closed |"
        sep += "---|---|---|---|---|---|"
    lines = [head, sep]
    fams: dict[str, list[tuple[float, float]]] = {}
    for trace in sorted(bounds):
        doc = bounds[trace]
        have = [x for x in seeds if str(x) in doc["seeds"]]  # --reuse: those computed
        ub = mean_bound(doc, have)
        root = sum(doc["seeds"][str(s)]["lp_130"] for s in have) / len(have)
        lps = sum(doc["seeds"][str(s)].get("solved", 1) for s in have) / len(have)
        secs = sum(doc["seeds"][str(s)]["seconds"] for s in have) / len(have)
        cv = doc.get("clairvoyant")
        cv_cell = (f"{cv['alloc_130']:.2f} ({cv['seed']}, "
                   f"{doc['seeds'][str(cv['seed'])]['alloc_130']:.2f})" if cv else "-")
        row = (f"| {trace} | {root:.2f} | {ub:.2f} ({len(have)}) | {lps:.0f}, {secs:.0f} |"
               f" {cv_cell} |")
        series = (policies or {}).get(trace, {})
        if policies and {"fgd", "gpupack"} <= series.keys():
            f = sum(series["fgd"][s] for s in have) / len(have)
            g = sum(series["gpupack"][s] for s in have) / len(have)
            closed = (g - f) / (ub - f) * 100 if ub > f else float("nan")
            closed_root = (g - f) / (root - f) * 100 if root > f else float("nan")
            fams.setdefault(family(trace), []).append((closed_root, closed))
            row += (f" {f:.2f} | {g:.2f} | {ub - f:.2f} | {ub - g:.2f} | {closed_root:.0f}% |"
                    f" {closed:.0f}% |")
        lines.append(row)
    if fams:
        lines += ["", "| family | mean share of the distance closed: to the root LP -> to the "
                  "bound |", "|---|---|"]
        for k, v in sorted(fams.items()):
            a = sum(x for x, _ in v) / len(v)
            b = sum(y for _, y in v) / len(v)
            lines.append(f"| {k} | {a:.0f}% -> {b:.0f}% |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--lps", type=int, default=1,
                    help="LPs of branch and bound per seed (1: the root relaxation); a seed "
                    "kept in --out with fewer is computed again, resumed where its record "
                    "keeps the search's frontier")
    ap.add_argument("--refine-lps", type=int, default=1)
    ap.add_argument("--slices", choices=sorted(SLICE_SETS), default="coarse",
                    help="the relaxation's slices: coarse (0.6, 0.75, 0.85, 0.93, 1), fine "
                    "(0.65, 0.7 and 0.8 added) or early (0.4, 0.45, 0.5 and 0.55 added): "
                    "tighter, slower; a seed kept in --out with other slices is computed "
                    "again")
    ap.add_argument("--split", choices=SPLITS, default="fractional",
                    help="where branch and bound splits a class's first-blocking interval: "
                    "at its most fractional slice, or at the middle of its fractional "
                    "slices (halves it); a seed kept in --out with the other rule is "
                    "computed again")
    ap.add_argument("--out", default="bench/results/openb-bound")
    ap.add_argument("--reuse", action="store_true",
                    help="only the table, from the seeds already in --out (computes nothing)")
    ap.add_argument("--clairvoyant", action="store_true",
                    help="also the clairvoyant CP-SAT run of the first seed (slow: minutes)")
    ap.add_argument("--policies",
                    help="bench/openb_all.py --out folders, comma-separated (their series CSV; "
                    "a later folder's figures replace an earlier one's)")
    args = ap.parse_args()
    trace_dir = bundled.trace_dir()  # the traces shipped in sim/openb/data
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [PUBLISHED_SEEDS[0] + i for i in range(args.seeds)]
    t0 = time.perf_counter()
    bounds = {t: (json.loads((out / f"{t}.json").read_text()) if args.reuse
                  else bound_trace(trace_dir, t, seeds, out, args.refine_lps, args.clairvoyant,
                                   args.lps, args.slices, args.split))
              for t in args.traces.split(",")}
    _log(f"done in {time.perf_counter() - t0:.0f}s")
    policies = None
    if args.policies:
        folders = [Path(f) for f in args.policies.split(",")]
        policies = {t: policy_series(folders, t) for t in bounds}
    print(table(bounds, seeds, policies))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
