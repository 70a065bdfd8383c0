"""``gpupack simulate``: replay the bundled scenario (or a file, or the openb trace)."""

from __future__ import annotations

import argparse
import importlib.resources
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import yaml

from packing.cpsat import SolverParams
from packing.model import with_mig_actuator
from packing.policies import REGISTRY
from packing.scenario import ScenarioError, parse_scenario
from packing.simulate import SimResult, simulate

DEFAULT_POLICIES = "spread,bestfit,fgd,random,gpupack"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace",
        choices=["openb"],
        default=None,
        help="replay the openb trace protocol instead of a scenario",
    )
    p.add_argument(
        "--scenario",
        type=Path,
        default=None,
        help="scenario YAML (default: the bundled mixed H100/L40S cluster)",
    )
    p.add_argument("--policies", default=None, help=f"comma list (default {DEFAULT_POLICIES})")
    p.add_argument(
        "--window",
        type=int,
        default=1,
        help="scenario: also run gpupack planning W arrivals at a time (W > 1)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=0.5,
        help="CP-SAT seconds per window (gpupack, --window > 1)",
    )
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed")
    p.add_argument("--format", default="table", choices=["table", "json"])
    p.add_argument("--out", type=Path, default=None, help="folder for the PNG (default ./out)")
    p.add_argument("--mig-actuator", action="store_true",
                   help="scenario: nodes with mig-reconfigure: true may be re-partitioned "
                   "on demand, as `gpupack serve --mig-actuator` does on a cluster "
                   "(default off, as there: MIG layouts stay as the scenario gives them)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (progress is only shown on a terminal anyway)")


def run_openb(argv: list[str]) -> int:
    """``simulate --trace openb ...``: the trace runner parses its own options."""
    from gpupack import openb_cmd

    parser = argparse.ArgumentParser(prog="gpupack simulate --trace openb")
    openb_cmd.add_arguments(parser)
    rest = [a for a in argv if a not in ("--trace", "openb", "--trace=openb")]
    return openb_cmd.run(parser.parse_args(rest))


SIM_EXTRA_MISSING = (
    "gpupack simulate: drawing the packing picture needs matplotlib, which is not "
    "installed; install the simulation extra: python -m pip install 'gpupack[sim]' "
    "(from a checkout: python -m pip install -e '.[sim]')"
)


def run(args: argparse.Namespace) -> int:
    try:
        # The one command that draws: matplotlib is the [sim] extra, not a server
        # dependency, so it is imported here and its absence is said before any work.
        from gpupack.render import render
    except ImportError:
        print(SIM_EXTRA_MISSING, file=sys.stderr)
        return 2
    if args.scenario is None:
        ref = importlib.resources.files("gpupack") / "scenarios" / "default.yaml"
        source = "default scenario"
        text = ref.read_text(encoding="utf-8")
    else:
        source = str(args.scenario)
        try:
            text = args.scenario.read_text(encoding="utf-8")
        except OSError as e:
            print(f"gpupack simulate: {source}: {e.strerror or e}", file=sys.stderr)
            return 2
    try:
        scenario = parse_scenario(yaml.safe_load(text))
        scenario = replace(scenario, nodes=with_mig_actuator(scenario.nodes, args.mig_actuator))
    except yaml.YAMLError as e:
        print(f"gpupack simulate: {source}: not valid YAML: {e}", file=sys.stderr)
        return 2
    except ScenarioError as e:
        print(f"gpupack simulate: {source}: {e}", file=sys.stderr)
        return 2
    # Progress rewrites one line with \r: only where a person watches it, never into a
    # log file or a CI transcript.
    show_progress = not args.quiet and sys.stderr.isatty()
    names = [n for n in (args.policies or DEFAULT_POLICIES).split(",") if n]
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        print(
            f"gpupack simulate: unknown policy {unknown[0]!r}; known: {', '.join(REGISTRY)}",
            file=sys.stderr,
        )
        return 2
    runs: list[tuple[str, int]] = [(n, 1) for n in names]
    if args.window > 1 and "gpupack" in names:
        runs.append(("gpupack", args.window))
    results: list[SimResult] = []
    timings: list[float] = []
    for name, window in runs:
        t0 = time.perf_counter()
        solver = SolverParams(max_time_s=args.time_limit, seed=args.seed)
        progress = _progress(name) if show_progress else None
        results.append(simulate(scenario, name, window, progress, solver))
        timings.append(time.perf_counter() - t0)
        if show_progress:
            print(file=sys.stderr)
    out_dir = args.out or Path("out")
    png = render(results, out_dir / "packing.png")
    if args.format == "json":
        print(
            json.dumps(
                {
                    "source": source,
                    "mig_actuator": bool(args.mig_actuator),
                    "png": str(png),
                    "results": [
                        {
                            "policy": r.policy,
                            "mode": r.mode,
                            "pods_total": r.pods_total,
                            "pods_placed": r.pods_placed,
                            "groups_total": r.groups_total,
                            "groups_placed": r.groups_placed,
                            "failed_by_class": r.failed_by_class,
                            "seconds": round(t, 3),
                            **r.summary.to_json(),
                        }
                        for r, t in zip(results, timings, strict=True)
                    ],
                },
                indent=2,
            )
        )
        return 0
    print(
        f"scenario: {source}: {len(scenario.nodes)} nodes, "
        f"{sum(len(n.gpus) for n in scenario.nodes)} GPUs, {len(scenario.arrivals)} arrivals, "
        f"MIG actuator {'on' if args.mig_actuator else 'off'}"
    )
    print(
        "| policy | mode | pods placed | groups placed | GPUs allocated | whole GPUs free "
        "| whole nodes free | fragmentation | failed by class | s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r, t in zip(results, timings, strict=True):
        s = r.summary
        failed = ", ".join(f"{k}:{v}" for k, v in r.failed_by_class.items()) or "-"
        print(
            f"| {r.policy} | {r.mode} | {r.pods_placed}/{r.pods_total} | "
            f"{r.groups_placed}/{r.groups_total} | {s.gpus_allocated:.2f}/{s.gpus_total} | "
            f"{s.whole_gpus_free} | {s.whole_nodes_free} | {s.fragmentation:.1%} | {failed} "
            f"| {t:.1f} |"
        )
    print(f"picture: {png}")
    return 0


def _progress(name: str) -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        if done == total or done % 10 == 0:
            print(f"\r{name}: {done}/{total} arrivals", end="", file=sys.stderr, flush=True)

    return show
