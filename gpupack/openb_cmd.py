"""``gpupack simulate --trace openb``: replay the FGD paper's openb experiment.

The I/O shell around ``sim.openb``: finds and reads the trace files, runs every
requested policy over the same seeds in this one process (so their speed ratios hold on
a noisy machine), prints a markdown table or JSON, and writes a plot and the raw series.

    python -m gpupack.openb_cmd --policies fgd,gpupack --seeds 10
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

from sim.openb import bundled
from sim.openb.bound import allocation_bound, make_instance
from sim.openb.bundled import BundleError
from sim.openb.cluster import Nodes, Pods
from sim.openb.offline import offline_bound
from sim.openb.policies import POLICIES, make
from sim.openb.replay import (
    DEFAULT_LOAD,
    KINDS,
    PUBLISHED_SEEDS,
    RunResult,
    build_workload,
    replay,
    trace_shapes,
)
from sim.traces import TraceError, parse_nodes, parse_pods

DEFAULT_POLICIES = "random,bestfit,fgd,gpupack"
DEFAULT_PODS = bundled.DEFAULT_PODS
DEFAULT_NODES = bundled.DEFAULT_NODES
FRAG_LOAD = 130  # the load at which ``frag_rate`` is reported
T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", choices=["openb"], default="openb")
    parser.add_argument("--pods", help="pod CSV, or the name of a trace shipped with gpupack "
                        f"({', '.join(bundled.trace_names())}; default: default)")
    parser.add_argument("--nodes", help="node CSV (default: the shipped "
                        f"{DEFAULT_NODES})")
    parser.add_argument(
        "--policies",
        default=DEFAULT_POLICIES,
        help=f"comma-separated, from {', '.join(POLICIES)}, fgd-exact",
    )
    parser.add_argument(
        "--seeds", type=int, default=1, help="number of seeds, starting at 42 as published"
    )
    parser.add_argument("--mode", choices=["online", "windowed"], default="online")
    parser.add_argument("--window", type=int, default=16, help="pending pods seen (windowed)")
    parser.add_argument("--load", type=float, default=DEFAULT_LOAD, help="arrived demand cap")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.add_argument("--out", default="out/openb", help="directory for the plot and CSV")
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="score every feasible node for every pod (no per-node score cache)",
    )
    parser.add_argument(
        "--offline-bound",
        action="store_true",
        help="also solve the pooled CP-SAT upper bound (all pods known), first seed",
    )
    parser.add_argument("--offline-time", type=float, default=20.0, help="CP-SAT seconds")
    parser.add_argument(
        "--bound",
        action="store_true",
        help="also the certified upper bound on allocation at 130%% under the protocol "
        "(every pod that fits is placed, in order, never moved), per seed "
        "(sim/openb/bound.py)",
    )
    parser.add_argument(
        "--bound-lps",
        type=int,
        default=1,
        help="LPs the bound may solve per seed (1: the relaxation, 1-2 min a seed; more: "
        "branch and bound, never looser: 9 gives bench/README.md's table, 4-6 min a seed)",
    )


def _resolve(given: str | None, default_name: str) -> Path:
    """The file to read: ``given`` when it names a file; a trace shipped with gpupack
    (``sim/openb/data``) when ``given`` is one's name (``cpu250``, or
    ``openb_pod_list_cpu250.csv``) and no such file exists here; the shipped
    ``default_name`` when nothing is given."""
    if not given:
        return bundled.trace_dir() / default_name
    path = Path(given)
    if path.exists():
        return path
    if given in bundled.trace_names():
        return bundled.trace_dir() / f"{bundled.POD_PREFIX}{given}.csv"
    if given in bundled.names():
        return bundled.trace_dir() / given
    return path


class TraceInputError(ValueError):
    """A trace file that cannot be read or parsed; the message starts with its path."""


def _read_trace(path: Path, parse: Callable[[str], T]) -> T:
    """``parse`` of the file's text; errors name the file (two CSVs are read)."""
    try:
        return parse(path.read_text())
    except OSError as e:
        raise TraceInputError(f"{path}: {e.strerror or e}") from None
    except TraceError as e:
        raise TraceInputError(f"{path}: {e}") from None


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _summary(results: Sequence[RunResult]) -> dict[str, float | int]:
    times = np.concatenate([r.decision_ms for r in results])
    return {
        "alloc_100": round(float(np.mean([r.alloc_at(100) for r in results])), 2),
        "alloc_130": round(float(np.mean([r.alloc_at(130) for r in results])), 2),
        "frag_rate": round(float(np.mean([r.frag_rate[FRAG_LOAD] for r in results])), 2),
        "failed_pods": round(float(np.mean([sum(r.failed.values()) for r in results])), 1),
        "decision_ms_mean": round(float(times.mean()) if len(times) else 0.0, 4),
        "decision_ms_p99": round(float(np.percentile(times, 99)) if len(times) else 0.0, 4),
    }


def run(args: argparse.Namespace) -> int:
    try:
        pods_path = _resolve(args.pods, DEFAULT_PODS)
        nodes_path = _resolve(args.nodes, DEFAULT_NODES)
        node_rows = _read_trace(nodes_path, parse_nodes)
        pod_rows = _read_trace(pods_path, parse_pods)
    except (OSError, TraceInputError, BundleError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    try:
        for n in names:
            make(n)
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    if args.seeds < 1 or args.window < 1 or args.bound_lps < 1:
        print("error: --seeds, --window and --bound-lps must be >= 1", file=sys.stderr)
        return 2
    nodes = Nodes.from_trace(node_rows)
    pods = Pods.from_trace(pod_rows, nodes.models)
    seeds = [PUBLISHED_SEEDS[0] + i for i in range(args.seeds)]
    _log(
        f"openb: {len(pod_rows)} pods, {nodes.size} nodes, "
        f"{nodes.gpu_capacity_milli // 1000} GPUs; "
        f"policies {','.join(names)}; seeds {seeds[0]}..{seeds[-1]}; mode {args.mode}"
    )
    results: dict[str, list[RunResult]] = {n: [] for n in names}
    # FGD's typical shapes come from the trace itself (as in the published simulator);
    # gpupack's complete shape set too, so both are independent of the seed.
    shapes = trace_shapes(pods, nodes.models)
    all_shapes = trace_shapes(pods, nodes.models, coverage=1.0)
    bound = None
    upper: list[float] = []
    t_start = time.perf_counter()
    for seed in seeds:
        workload = build_workload(pods, nodes.gpu_capacity_milli, seed, args.load)
        for name in names:
            t0 = time.perf_counter()
            r = replay(
                nodes,
                pods,
                workload,
                make(name),
                seed,
                shapes,
                all_shapes,
                mode=args.mode,
                window=args.window,
                cache=not args.no_cache,
            )
            results[name].append(r)
            _log(
                f"  seed {seed} {name:>11}: alloc@100 {r.alloc_at(100):6.2f}  "
                f"@130 {r.alloc_at(130):6.2f}  ({time.perf_counter() - t0:.1f}s)"
            )
        if args.bound:
            t0 = time.perf_counter()
            found = allocation_bound(make_instance(nodes, pods, workload),
                                     budget=args.bound_lps)
            upper.append(found.alloc_130)
            _log(f"  seed {seed} {'bound':>11}: @130 <= {found.alloc_130:6.2f}  "
                 f"(certificate, {found.nodes} LP(s), {time.perf_counter() - t0:.1f}s)")
        if args.offline_bound and bound is None:
            _log("  offline bound (CP-SAT) ...")
            bound = offline_bound(nodes, pods, workload, max_time_in_seconds=args.offline_time)
    _log(f"done in {time.perf_counter() - t_start:.1f}s")
    summary = {n: _summary(rs) for n, rs in results.items()}
    out = Path(args.out)
    try:
        _write_outputs(out, results, pods_path.stem)
    except OSError as e:
        print(f"error: cannot write to {out}: {e}", file=sys.stderr)
        return 2
    certified = ({"alloc_130": round(float(np.mean(upper)), 2), "kind": "certificate"}
                 if upper else None)
    if args.format == "json":
        doc: dict[str, object] = {"policies": summary}
        if certified is not None:
            doc["bound"] = certified
        print(json.dumps(doc))
    else:
        print(_table(pods_path.stem, seeds, args, results, summary, certified))
        if certified is not None:
            print("\nbound: no run of the protocol (every arriving pod that fits is placed, "
                  "in arrival order, never moved), clairvoyant or not, allocates more at 130%; "
                  "a certificate, mean over the seeds (sim/openb/bound.py)")
        if bound is not None:
            print(
                f"\nOffline upper bound (pooled node types, CP-SAT {bound.status}, seed "
                f"{seeds[0]}): {bound.alloc_pct:.2f}% of GPU capacity "
                f"(workload demand {bound.demand_pct:.1f}%)"
            )
        print(f"\nPlot and series: {out}/")
    return 0


def _table(
    trace: str,
    seeds: Sequence[int],
    args: argparse.Namespace,
    results: dict[str, list[RunResult]],
    summary: dict[str, dict[str, float | int]],
    bound: dict[str, object] | None = None,
) -> str:
    mode = args.mode + (f" W={args.window}" if args.mode == "windowed" else "")
    lines = [
        f"{trace}: {len(seeds)} seed(s) {seeds[0]}..{seeds[-1]}, {mode}",
        "",
        "| policy | alloc % @100 | alloc % @130 | frag % @130 | failed whole | failed shared "
        "| failed cpu | decision ms mean | p99 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rs in results.items():
        s = summary[name]
        failed = {k: float(np.mean([r.failed[k] for r in rs])) for k in KINDS}
        lines.append(
            f"| {name} | {s['alloc_100']:.2f} | {s['alloc_130']:.2f} | {s['frag_rate']:.1f} | "
            f"{failed['whole']:.0f} | {failed['shared']:.0f} | {failed['cpu']:.0f} | "
            f"{s['decision_ms_mean']:.3f} | {s['decision_ms_p99']:.3f} |"
        )
    if bound is not None:
        lines.append(f"| bound ({bound['kind']}) | - | {bound['alloc_130']:.2f} | - | - | - | - "
                     f"| - | - |")
    return "\n".join(lines)


def _write_outputs(out: Path, results: dict[str, list[RunResult]], trace: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    loads = np.arange(0, 131)
    with (out / f"{trace}_series.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["policy", "seed", *[str(x) for x in loads]])
        for name, rs in results.items():
            for r in rs:
                w.writerow([name, r.seed, *[f"{v:.3f}" for v in r.series()]])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rs in results.items():
        stack = np.stack([r.series() for r in rs])
        seen = ~np.isnan(stack)
        # mean over the seeds that reached each load (small subsets may stop short)
        mean = np.where(
            seen.any(axis=0), np.nansum(stack, axis=0) / np.maximum(seen.sum(0), 1), np.nan
        )
        ax.plot(loads, mean, label=name)
    ax.plot(loads, np.minimum(loads, 100), "k:", linewidth=0.8, label="limit")
    ax.set_xlabel("arrived GPU demand, % of capacity")
    ax.set_ylabel("GPU allocation, %")
    ax.set_title(f"{trace}: allocation vs arrived load")
    ax.set_ylim(40, 101)
    ax.set_xlim(40, 130)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{trace}_alloc.png", dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupack simulate --trace openb", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
