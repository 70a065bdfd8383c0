"""``gpupack simulate``: replay the bundled day (or a scenario file, or the openb trace).

A day scenario (the default, ``gpupack/scenarios/default.yaml``) goes through the day
replay (:mod:`packing.day`) under plain kube-scheduler and under gpupack, and the cluster
is sized for each (:func:`packing.day_sizing.size_cluster`); an arrival scenario (``--scenario
arrivals``, or a file with ``arrivals:``) through the arrival-only replay
(:mod:`packing.simulate`) under the registry's policies.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from gpupack.inputs import read_objects
from kube.listing import ListingError, list_cluster
from kube.objects import ObjectError
from kube.replay_inputs import ClusterDay, cluster_day
from packing.cpsat import SolverParams
from packing.day import Day, DayResult, Placer, replay
from packing.day_scenario import is_day, parse_day
from packing.day_sizing import Sizing, pool_fragmentation, size_cluster
from packing.model import with_mig_actuator
from packing.policies import REGISTRY
from packing.policies.placers import GpupackPlacer, KubeSchedulerPlacer
from packing.scenario import ScenarioError, parse_scenario
from packing.simulate import SimResult, simulate
from webhook.replay import webhook_admission

DEFAULT_POLICIES = "spread,bestfit,fgd,random,gpupack"
DAY_POLICIES = "kube-scheduler,gpupack"
BUNDLED = ("default", "arrivals")  # scenarios shipped in gpupack/scenarios


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace",
        choices=["openb"],
        default=None,
        help="replay the openb trace protocol instead of a scenario",
    )
    p.add_argument(
        "--scenario",
        default=None,
        help="scenario YAML, or a bundled one by name: default (a day of a mixed "
        "H100/L40S inference cluster), arrivals (an arrival-only fill)",
    )
    p.add_argument("--policies", default=None,
                   help=f"comma list (a day: {DAY_POLICIES}; arrivals: {DEFAULT_POLICIES})")
    p.add_argument(
        "--window",
        type=int,
        default=1,
        help="arrival scenario: also run gpupack planning W arrivals at a time (W > 1)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=0.5,
        help="CP-SAT seconds per window (gpupack, --window > 1)",
    )
    p.add_argument("--seed", type=int, default=0,
                   help="a day: seed of kube-scheduler's random tie-breaks and the kubelet's "
                   "device picks; arrivals: CP-SAT random seed")
    p.add_argument("--format", default="table", choices=["table", "json"])
    p.add_argument("--out", type=Path, default=None, help="folder for the PNG (default ./out)")
    p.add_argument("--mig-actuator", action="store_true",
                   help="arrival scenario: nodes with mig-reconfigure: true may be re-partitioned "
                   "on demand, as `gpupack serve --mig-actuator` does on a cluster "
                   "(default off, as there: MIG layouts stay as the scenario gives them)")
    cluster = p.add_argument_group(
        "your cluster", "replay its pods in creation order on its nodes, under plain "
        "kube-scheduler and gpupack (read-only; docs/simulate.md)")
    cluster.add_argument("--from-cluster", action="store_true",
                         help="read the Nodes and Pods of the cluster of --kubeconfig")
    cluster.add_argument("--kubeconfig", default=None,
                         help="kubeconfig (default: $KUBECONFIG or ~/.kube/config)")
    cluster.add_argument("--context", default=None, help="kubeconfig context (default: "
                         "its current one)")
    cluster.add_argument("--namespace", default=None,
                         help="--from-cluster: replay the pods of this namespace only")
    cluster.add_argument("--node-selector", default=None, metavar="SELECTOR",
                         help="--from-cluster: the nodes matching this label selector only")
    cluster.add_argument("--nodes", type=Path, default=None,
                         help="Nodes YAML (kubectl get nodes -o yaml)")
    cluster.add_argument("--pods", type=Path, default=None,
                         help="Pods YAML (kubectl get pods -A -o yaml)")
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
    if args.from_cluster or args.nodes is not None or args.pods is not None:
        return run_cluster(args)
    loaded = _load(args.scenario)
    if isinstance(loaded, int):
        return loaded
    data, source = loaded
    if is_day(data):
        return run_day(args, data, source)
    try:
        scenario = parse_scenario(data)
        scenario = replace(scenario, nodes=with_mig_actuator(scenario.nodes, args.mig_actuator))
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


def _load(name: str | None) -> tuple[Any, str] | int:
    """The decoded scenario and what to call it, or exit status 2 (said on stderr)."""
    if name is None or (name in BUNDLED and not Path(name).exists()):
        bundled = name or "default"
        ref = importlib.resources.files("gpupack") / "scenarios" / f"{bundled}.yaml"
        source, text = f"the bundled {bundled} scenario", ref.read_text(encoding="utf-8")
    else:
        source = name
        try:
            text = Path(name).read_text(encoding="utf-8")
        except OSError as e:
            print(f"gpupack simulate: {source}: {e.strerror or e}", file=sys.stderr)
            return 2
    try:
        return yaml.safe_load(text), source
    except yaml.YAMLError as e:
        print(f"gpupack simulate: {source}: not valid YAML: {e}", file=sys.stderr)
        return 2


DAY_PLACERS: dict[str, Callable[[int], Callable[[], Placer]]] = {
    "kube-scheduler": lambda seed: lambda: KubeSchedulerPlacer(seed),
    "gpupack": lambda seed: lambda: GpupackPlacer(webhook_admission(), seed),
}


def _day_policies(args: argparse.Namespace) -> list[str] | None:
    """The policies of ``--policies`` for a day or a cluster; None (said on stderr) when
    one is not known."""
    names = [n for n in (args.policies or DAY_POLICIES).split(",") if n]
    unknown = [n for n in names if n not in DAY_PLACERS]
    if unknown or not names:
        print(f"gpupack simulate: unknown policy {(unknown or [''])[0]!r} for a day; known: "
              f"{', '.join(DAY_PLACERS)}", file=sys.stderr)
        return None
    return names


@dataclass(frozen=True)
class DayRow:
    result: DayResult
    sizing: Sizing | None
    seconds: float


def run_day(args: argparse.Namespace, data: Any, source: str) -> int:
    """A day scenario through plain kube-scheduler and gpupack (see the module
    docstring): the table or JSON, and the picture."""
    from gpupack.render_day import render_day

    if args.mig_actuator or args.window > 1:
        print("gpupack simulate: --mig-actuator and --window apply to arrival scenarios "
              "(--scenario arrivals); a day replay keeps MIG layouts as the nodes report "
              "them and places pods online", file=sys.stderr)
        return 2
    try:
        sc = parse_day(data)
    except ScenarioError as e:
        print(f"gpupack simulate: {source}: {e}", file=sys.stderr)
        return 2
    names = _day_policies(args)
    if names is None:
        return 2
    rows = [day_row(sc.day, DAY_PLACERS[n](args.seed), size=True) for n in names]
    png = render_day([r.result for r in rows], sc.day.nodes, (args.out or Path("out"))
                     / "packing.png")
    if args.format == "json":
        print(json.dumps({"source": source, "kind": "day", "png": str(png),
                          "cluster": cluster_json(sc.day),
                          "results": [row_json(r) for r in rows]}, indent=2))
        return 0
    pools = ", ".join(f"{p.base} {p.name}" for p in sc.day.pools)
    first = rows[0].result
    header = (f"scenario: {source}: a day on {len(sc.day.nodes)} nodes ({pools}), "
              f"{sum(len(n.gpus) for n in sc.day.nodes)} GPUs; {first.pods_created} pods "
              f"and {first.groups_created} LLM groups created over {sc.day.end / 3600:g} h")
    for line in day_table(sc.day, header, rows):
        print(line)
    print(f"picture: {png}")
    return 0


def day_row(day: Day, make: Callable[[], Placer], size: bool) -> DayRow:
    t0 = time.perf_counter()
    result = replay(day, make())
    sizing = size_cluster(day, make) if size else None
    return DayRow(result, sizing, time.perf_counter() - t0)


def cluster_json(day: Day) -> dict[str, Any]:
    return {"nodes": len(day.nodes), "gpus": sum(len(n.gpus) for n in day.nodes),
            "pools": {p.name: {"nodes": p.base, "gpus_per_node": p.gpus_per_node}
                      for p in day.pools},
            "hours": day.end / 3600}


def row_json(row: DayRow) -> dict[str, Any]:
    """One policy's figures; the first seven keys are the interface of issue 36."""
    r, z = row.result, row.sizing
    return {
        "policy": r.policy,
        "gpus_needed": z.gpus if z else None,
        "nodes_needed": z.nodes if z else None,
        "pods_waiting_peak": r.pods_waiting_peak,
        "groups_waiting_peak": r.groups_waiting_peak,
        "wait_p99_s": r.wait_p99_s,
        "overcommitted": r.overcommitted,
        "needed_by_pool": dict(z.counts) if z else None,
        "served_when_sized": z.served if z else None,
        "group_wait_p99_s": r.group_wait_p99_s,
        "gpus_in_use_peak": r.gpus_in_use_peak,
        "nodes_in_use_peak": r.nodes_in_use_peak,
        "gpus_allocated_peak": r.gpus_allocated_peak,
        "pods_created": r.pods_created,
        "groups_created": r.groups_created,
        "refused": [{"pod": k, "why": why} for k, why in r.refusals],
        "overcommit_examples": list(r.overcommit_examples),
        "waited": [{"pod": w.key, "workload": w.workload, "seconds": w.seconds,
                    "why": w.reason} for w in r.waited],
        "groups_waited": [{"group": g, "seconds": s} for g, s in r.groups_waited],
        "seconds": round(row.seconds, 3),
    }


def _needed(z: Sizing | None, day: Day) -> tuple[str, str]:
    if z is None:
        return "-", "-"
    pools = ", ".join(f"{z.counts[p.name]} {p.name}" for p in day.pools)
    mark = "" if z.served else " (still waits)"
    return f"{z.gpus} ({pools}){mark}", str(z.nodes)


def _duration(s: float) -> str:
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def day_table(day: Day, header: str, rows: Sequence[DayRow]) -> list[str]:
    """The table ``gpupack simulate`` prints for a day (the README shows it verbatim)."""
    gpus = sum(len(n.gpus) for n in day.nodes)
    lines = [header]
    lines.append("| policy | GPUs needed | nodes needed | pods waiting (peak) "
                 "| LLM groups waiting (peak) | wait p99 | over-committed "
                 "| GPUs in use (peak) |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for row in rows:
        r = row.result
        need_gpus, need_nodes = _needed(row.sizing, day)
        lines.append(f"| {r.policy} | {need_gpus} | {need_nodes} | {r.pods_waiting_peak} "
                     f"| {r.groups_waiting_peak} | {_duration(r.wait_p99_s)} "
                     f"| {r.overcommitted} | {r.gpus_in_use_peak}/{gpus} |")
    return lines


WAITED_SHOWN = 10  # pods listed per policy in the table's notes (the JSON lists all)


def _read_cluster(args: argparse.Namespace) -> tuple[str, ClusterDay] | str:
    """The cluster's day and what to call it, or why it cannot be read."""
    if args.from_cluster:
        if args.nodes is not None or args.pods is not None:
            return "give --from-cluster or --nodes and --pods, not both"
        try:
            nodes, pods = list_cluster(args.kubeconfig, args.context, args.namespace,
                                       args.node_selector)
        except ListingError as e:
            return str(e)
        source = f"cluster of {args.kubeconfig or 'the default kubeconfig'}" + (
            f" (context {args.context})" if args.context else "")
        try:
            return source, cluster_day(nodes, pods)
        except ObjectError as e:
            return f"{source}: {e}"
    if args.nodes is None or args.pods is None:
        return ("--nodes and --pods go together (kubectl get nodes -o yaml, kubectl get pods "
                "-A -o yaml)")
    if args.namespace or args.node_selector:
        return "--namespace and --node-selector apply to --from-cluster"
    try:
        nodes = read_objects(args.nodes, "Node")
        pods = read_objects(args.pods, "Pod")
    except ObjectError as e:
        return str(e)
    try:
        return f"{args.nodes} and {args.pods}", cluster_day(nodes, pods)
    except ObjectError as e:
        culprit = args.nodes if str(e).startswith("Node") else args.pods
        return f"{culprit}: {e}"


def run_cluster(args: argparse.Namespace) -> int:
    """Your cluster's pods replayed on its nodes under both schedulers (docs/simulate.md)."""
    from gpupack.render_day import render_day

    if args.scenario is not None or args.mig_actuator or args.window > 1:
        print("gpupack simulate: --scenario, --mig-actuator and --window do not apply to a "
              "cluster's replay", file=sys.stderr)
        return 2
    got = _read_cluster(args)
    if isinstance(got, str):
        print(f"gpupack simulate: {got}", file=sys.stderr)
        return 2
    source, cd = got
    names = _day_policies(args)
    if names is None:
        return 2
    day = cd.day
    rows = [day_row(day, DAY_PLACERS[n](args.seed), size=True) for n in names]
    frags = {r.result.policy: pool_fragmentation(day, r.result) for r in rows}
    png = render_day([r.result for r in rows], day.nodes, (args.out or Path("out"))
                     / "packing.png")
    if args.format == "json":
        results = []
        for r in rows:
            doc = row_json(r)
            doc["fragmentation"] = [f.__dict__ for f in frags[r.result.policy]]
            results.append(doc)
        print(json.dumps({"source": source, "kind": "cluster", "png": str(png),
                          "cluster": cluster_json(day), "replayed": cd.replayed,
                          "unmodelled": list(cd.unmodelled), "notes": list(cd.notes),
                          "results": results}, indent=2))
        return 0
    pools = ", ".join(f"{p.base} {p.name}" for p in day.pools)
    header = (f"cluster: {source}: {len(day.nodes)} nodes ({pools}), "
              f"{sum(len(n.gpus) for n in day.nodes)} GPUs; {cd.replayed} pods replayed in "
              f"creation order over {_duration(day.end)}")
    for line in day_table(day, header, rows):
        print(line)
    for r in rows:
        res = r.result
        if res.waited:
            print(f"{res.policy}: {len(res.waited)} pod(s) would wait"
                  + (f" ({WAITED_SHOWN} longest)" if len(res.waited) > WAITED_SHOWN else "")
                  + ":")
            for w in res.waited[:WAITED_SHOWN]:
                print(f"  {w.key}: {_duration(w.seconds)}, {w.reason}")
        for g, secs in res.groups_waited:
            print(f"  group {g} not running whole for {_duration(secs)}")
        for key, why in res.refusals:
            print(f"{res.policy}: {key} refused as written ({why}); replayed as it asks")
        parts = [f"{f.pool} {f.unusable_gpus:g} of {f.free_gpus:g} free GPUs"
                 for f in frags[res.policy] if f.free_gpus]
        if parts:
            print(f"{res.policy}: fragmentation at the end (free GPU capacity the pods' "
                  f"shapes cannot use): {'; '.join(parts)}")
    for u in cd.unmodelled:
        print(f"not modelled: {u}")
    for note in cd.notes:
        print(f"note: {note}")
    print(f"picture: {png}")
    return 0
