"""Benchmark: every openb trace through ``bench/openb.py``, then one summary table.

Runs each trace's pod list in its own process (``--jobs`` at a time; every process runs
all policies over the same seeds, so each trace's comparison holds on a noisy machine),
keeps each trace's JSON, markdown table, plot and series under ``--out``, and prints a
summary at 130% arrived load next to the published FGD figure over the same seeds
(the paper's ``analysis_allo_discrete.csv``, shipped in ``sim/openb/data``).

    python bench/openb_all.py --seeds 10 --jobs 2 --out bench/results/openb-all
    python bench/openb_all.py --traces default,multigpu50 --seeds 3

``--traces published`` (the default) takes the traces with published FGD series;
``--traces all`` every ``openb_pod_list_*.csv``.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.openb import bundled  # noqa: E402
from sim.openb.replay import PUBLISHED_SEEDS  # noqa: E402

PUBLISHED_FGD = "06-FGD"
PREFIX = "openb_pod_list_"


def published_means(
    csv_text: str, policy: str, seeds: Iterable[int], loads: Sequence[int] = (100, 130)
) -> dict[str, dict[int, float]]:
    """Per trace (without the prefix): the published policy's mean allocation % at each
    load over ``seeds``; traces missing a seed are left out (no like-for-like mean)."""
    want = set(seeds)
    rows: dict[str, dict[int, dict[int, float]]] = {}
    for row in csv.DictReader(csv_text.splitlines()):
        if row["sc_policy"] != policy or int(row["seed"]) not in want:
            continue
        trace = row["workload"].removeprefix(PREFIX)
        rows.setdefault(trace, {})[int(row["seed"])] = {x: float(row[str(x)]) for x in loads}
    return {
        t: {x: sum(v[x] for v in by_seed.values()) / len(by_seed) for x in loads}
        for t, by_seed in rows.items()
        if set(by_seed) == want
    }


def summary_table(
    results: Mapping[str, Mapping[str, Mapping[str, float]]],
    published: Mapping[str, Mapping[int, float]],
    ours: str = "gpupack",
    base: str = "fgd",
) -> str:
    """Markdown: one row per trace at 130% arrived load; ``cut`` is the share of the
    baseline's unallocated GPU capacity that ``ours`` allocates, (ours - base) / (100 -
    base)."""
    lines = [
        f"| trace | {base} @130 | published FGD @130 | {base} - published | {ours} @130 "
        f"| {ours} - {base} | unallocated cut | {base} ms mean / p99 | {ours} ms mean / p99 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    wins = 0
    for trace in sorted(results):
        row = results[trace]
        b, o = row[base], row[ours]
        pub = published.get(trace, {}).get(130)
        pub_s = f"{pub:.2f}" if pub is not None else "-"
        diff_s = f"{b['alloc_130'] - pub:+.2f}" if pub is not None else "-"
        gain = o["alloc_130"] - b["alloc_130"]
        wins += gain > 0
        cut = gain / (100.0 - b["alloc_130"]) * 100.0 if b["alloc_130"] < 100 else 0.0
        lines.append(
            f"| {trace} | {b['alloc_130']:.2f} | {pub_s} | {diff_s} | {o['alloc_130']:.2f} | "
            f"{gain:+.2f} | {cut:+.0f}% | {b['decision_ms_mean']:.2f} / "
            f"{b['decision_ms_p99']:.1f} | {o['decision_ms_mean']:.2f} / "
            f"{o['decision_ms_p99']:.1f} |"
        )
    lines.append("")
    lines.append(f"{ours} above {base} at 130% on {wins} of {len(results)} traces.")
    return "\n".join(lines)


def family(trace: str) -> str:
    """A trace's family: its name without the trailing number (gpushare40 -> gpushare)."""
    return trace.rstrip("0123456789") or trace


def family_table(
    results: Mapping[str, Mapping[str, Mapping[str, float]]],
    ours: str = "gpupack",
    base: str = "fgd",
) -> str:
    """Markdown: one row per trace family (the issue's unit of "beat FGD"): the mean of
    ``ours`` - ``base`` at 130% over its traces, the smallest per-trace gain, and on
    how many traces ``ours`` is ahead."""
    fams: dict[str, list[float]] = {}
    for trace in sorted(results):
        row = results[trace]
        fams.setdefault(family(trace), []).append(
            row[ours]["alloc_130"] - row[base]["alloc_130"]
        )
    lines = [
        f"| family | traces | mean {ours} - {base} | smallest | {ours} ahead on |",
        "|---|---|---|---|---|",
    ]
    for fam, gains in sorted(fams.items()):
        ahead = sum(g > 0 for g in gains)
        lines.append(
            f"| {fam} | {len(gains)} | {sum(gains) / len(gains):+.2f} | {min(gains):+.2f} "
            f"| {ahead} of {len(gains)} |"
        )
    return "\n".join(lines)


def policy_table(results: Mapping[str, Mapping[str, Mapping[str, float]]]) -> str:
    """Markdown: allocation % at 130% of every policy run, one row per trace."""
    names = list(next(iter(results.values()))) if results else []
    lines = ["| trace | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for trace in sorted(results):
        cells = [f"{results[trace][n]['alloc_130']:.2f}" for n in names]
        lines.append(f"| {trace} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _run_trace(pods: Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    trace = pods.stem.removeprefix(PREFIX)
    kept = out / f"{trace}.json"
    if args.reuse and kept.is_file():
        doc_kept: dict[str, Any] = json.loads(kept.read_text())
        if {p.strip() for p in args.policies.split(",")} <= set(doc_kept["policies"]):
            print(f"  {trace}: reused {kept}", file=sys.stderr, flush=True)
            return doc_kept
    cmd = [
        sys.executable, str(ROOT / "bench" / "openb.py"), "--pods", str(pods),
        "--policies", args.policies, "--seeds", str(args.seeds), "--format", "json",
        "--out", str(out / trace),
    ]
    if args.nodes:
        cmd += ["--nodes", args.nodes]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    (out / f"{trace}.log").write_text(done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"{trace}: exit {done.returncode}: {done.stderr.strip()[-400:]}")
    doc: dict[str, Any] = json.loads(done.stdout)
    (out / f"{trace}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"  {trace}: {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--traces", default="published",
                    help="'published', 'all', or comma-separated names (default, cpu250, ...)")
    ap.add_argument("--policies", default="fgd,gpupack,bestfit")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=2, help="traces run at once")
    ap.add_argument("--nodes", help="node CSV (default: the trace directory's GPU nodes)")
    ap.add_argument("--out", default="out/openb-all")
    ap.add_argument("--reuse", action="store_true",
                    help="take a trace's results from OUT/<trace>.json when it has every policy")
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",")]
    if "fgd" not in policies or "gpupack" not in policies:
        print("error: --policies must include fgd and gpupack", file=sys.stderr)
        return 2
    if args.seeds < 1 or args.jobs < 1:
        print("error: --seeds and --jobs must be >= 1", file=sys.stderr)
        return 2
    tdir = bundled.trace_dir()
    seeds = [PUBLISHED_SEEDS[0] + i for i in range(args.seeds)]
    published = published_means(bundled.published_series(), PUBLISHED_FGD, seeds)
    available = {p.stem.removeprefix(PREFIX): p for p in sorted(tdir.glob(f"{PREFIX}*.csv"))}
    if args.traces == "all":
        names = list(available)
    elif args.traces == "published":
        names = [t for t in available if t in published]
    else:
        names = [t.strip() for t in args.traces.split(",") if t.strip()]
    unknown = [t for t in names if t not in available]
    if unknown or not names:
        given = ",".join(unknown) or repr(args.traces)
        print(f"error: unknown --traces {given}; known: {', '.join(available)}",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"openb-all: {len(names)} traces x {args.seeds} seeds, policies {args.policies}, "
          f"{args.jobs} at a time", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        docs = pool.map(lambda t: _run_trace(available[t], args, out), names)
        results = {t: d["policies"] for t, d in zip(names, docs, strict=True)}
    table = "\n\n".join(
        [summary_table(results, published), family_table(results), policy_table(results)]
    )
    head = (f"openb, all traces: {args.seeds} seed(s) {seeds[0]}..{seeds[-1]}, online, "
            f"alloc % of GPU capacity; published FGD = mean of the published per-seed "
            f"series over the same seeds; {time.perf_counter() - t0:.0f} s")
    (out / "summary.md").write_text(head + "\n\n" + table + "\n")
    print(head + "\n\n" + table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
