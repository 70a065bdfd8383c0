"""Scheduling throughput on the real control plane: pods created -> bound by the real
kube-scheduler, with the gpupack profile (extender + webhook) and with plain
kube-scheduler, on the same fake nodes.

    python bench/e2e_throughput.py [--nodes 500] [--pods 1000] [--format json|table]

The stack is tests/e2e/controlplane.py (etcd, kube-apiserver, kube-scheduler built from
their modules, gpupack serve/webhook). Nodes: a third H100 in MIG mixed strategy (28 x
1g.10gb slices), a third L40S time-sliced (16 shares), a third whole H100 (8 GPUs).
Pods: a mix of 1g.10gb, time-sliced and single whole-GPU pods, with the concrete resource
already set (as the webhook leaves them) so both schedulers see the same pods; each
profile's pods are created by 8 client threads, then deleted before the next profile.

Then ``--single`` pods per profile are created one at a time, each once the previous one
is bound: the create-to-bound latency of a lone pod (the p99 goal is for these).

Create-to-bound latency is measured on this side: from the moment the create call
returned to the moment a watch on pods saw ``spec.nodeName`` (the API server's timestamps
have one-second resolution). pods/s = pods / (last bound - first create sent).
Everything shares this machine's cores: the figures are for the whole stack on it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))

import cluster  # noqa: E402
import controlplane  # noqa: E402

PODS_NS = "bench"
FILL_NS = "bench-fill"  # the prefill's pods, which stay through both profiles


def node_specs(n: int) -> list[cluster.NodeSpec]:
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            out.append(cluster.h100_mig(f"mig-{i}", "bench", {"1g.10gb": 28}))
        elif kind == 1:
            out.append(cluster.l40s_shared(f"l40s-{i}", "bench"))
        else:
            out.append(cluster.h100_whole(f"whole-{i}", "bench",
                                          clique=f"clique-{i // 48}"))
    return out


def pod_specs(n: int, scheduler: str, prefix: str) -> list[dict[str, Any]]:
    shapes = [{"nvidia.com/mig-1g.10gb": "1"}, {"nvidia.com/gpu.shared": "1"},
              {"nvidia.com/gpu": "1"}]
    return [cluster.pod(f"{prefix}-{i}", pool="bench", scheduler=scheduler,
                        limits=shapes[i % 3], cpu="100m", memory="256Mi")
            for i in range(n)]


def cpu_seconds(stack: controlplane.Stack) -> dict[str, float]:
    """CPU seconds used so far by each component's process group (user + system, from
    /proc), to show where a profile's time goes."""
    tick = os.sysconf("SC_CLK_TCK")
    groups = {stack.pid(c): c for c in stack.state()["components"] if stack.pid(c)}
    out = dict.fromkeys(groups.values(), 0.0)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pgid = int(fields[2])
        if pgid in groups:
            # utime, stime, cutime, cstime: fields 14-17 of stat (here 11-14).
            out[groups[pgid]] += sum(int(x) for x in fields[11:15]) / tick
    return out


def extender_verb_ms(stack: controlplane.Stack) -> dict[str, float]:
    """Mean handling time per verb so far (ms), from the extender's own histogram
    ``gpupack_extender_request_seconds``, read on its loopback port (the same body as
    its metrics port, which needs a bearer token allowed to get /metrics)."""
    import urllib.request

    base = stack.state()["components"]["extender"].get("url")
    if not base:
        return {}
    url = f"{base}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        for suffix, into in (("_sum", sums), ("_count", counts)):
            head = f"gpupack_extender_request_seconds{suffix}{{"
            if line.startswith(head):
                verb = line.split('verb="', 1)[1].split('"', 1)[0]
                into[verb] = float(line.rsplit(" ", 1)[1])
    return {v: round(1000 * sums[v] / counts[v], 2) for v in sums if counts.get(v)}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def run_profile(admin: Any, core: Any, scheduler: str, n_pods: int, timeout_s: float
                ) -> dict[str, float]:
    from kubernetes import watch

    prefix = "gp" if scheduler == controlplane.SCHEDULER_NAME else "pl"
    pods = pod_specs(n_pods, scheduler, prefix)
    created: dict[str, float] = {}
    bound_at: dict[str, float] = {}
    done = threading.Event()
    w = watch.Watch()

    def watcher() -> None:
        for ev in w.stream(core.list_namespaced_pod, PODS_NS, timeout_seconds=int(timeout_s)):
            obj = ev["object"]
            name = obj.metadata.name
            if obj.spec.node_name and name not in bound_at and name.startswith(prefix):
                bound_at[name] = time.monotonic()
                if len(bound_at) >= n_pods:
                    done.set()
                    w.stop()
                    return

    t = threading.Thread(target=watcher, daemon=True)
    t.start()
    time.sleep(0.5)  # the watch is open before the first create

    def create(p: dict[str, Any]) -> None:
        core.create_namespaced_pod(PODS_NS, p)
        created[p["metadata"]["name"]] = time.monotonic()

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, pods))
    done.wait(timeout_s)
    w.stop()
    latencies = [(bound_at[k] - created[k]) * 1000 for k in bound_at if k in created]
    last = max(bound_at.values()) if bound_at else start
    out = {"pods": float(n_pods), "bound": float(len(bound_at)),
           "pods_per_s": len(bound_at) / max(last - start, 1e-9),
           "p50_ms": percentile(latencies, 0.5), "p99_ms": percentile(latencies, 0.99)}
    out.update(packing(core, prefix))
    cluster.force_delete_pods(core, PODS_NS)
    cluster.wait_for(lambda: not core.list_namespaced_pod(PODS_NS).items, 300,
                     "the pods to be gone")
    return out


def packing(core: Any, prefix: str) -> dict[str, float]:
    """How the burst was packed, as the API server holds it: nodes the pods went to, and
    whole-GPU nodes (the room LLM groups need) left without any pod."""
    used: dict[str, int] = {}
    for p in core.list_namespaced_pod(PODS_NS).items:
        if p.metadata.name.startswith(prefix) and p.spec.node_name:
            used[p.spec.node_name] = used.get(p.spec.node_name, 0) + 1
    # Whole-GPU nodes with no pod at all (the prefill's survivors count too).
    filled = {x.spec.node_name for x in core.list_namespaced_pod(FILL_NS).items
              if x.spec.node_name}
    busy = set(used) | filled
    whole = [n.metadata.name for n in core.list_node().items
             if n.metadata.name.startswith("whole-")]
    return {"nodes_used": float(len(used)),
            "whole_nodes_untouched": float(sum(1 for n in whole if n not in busy)),
            "whole_nodes": float(len(whole))}


def prefill(core: Any, specs: list[cluster.NodeSpec], n: int, keep: float, seed: int
            ) -> dict[str, float]:
    """A fragmented cluster to pack into: ``n`` mixed pods bound straight to random nodes
    of their kind with room (``spec.nodeName``, as a random policy would), then all but a
    seeded ``keep`` share deleted: churn that leaves used GPUs scattered."""
    import random

    rng = random.Random(seed)
    room = {s.name: int(next(iter(s.allocatable.values()))) for s in specs}
    by_kind = {"nvidia.com/mig-1g.10gb": [s.name for s in specs if s.name.startswith("mig-")],
               "nvidia.com/gpu.shared": [s.name for s in specs if s.name.startswith("l40s-")],
               "nvidia.com/gpu": [s.name for s in specs if s.name.startswith("whole-")]}
    pods = pod_specs(n, controlplane.PLAIN_SCHEDULER_NAME, "fill")
    for p in pods:
        (resource,) = p["spec"]["containers"][0]["resources"]["limits"]
        choices = [x for x in by_kind[resource] if room[x] > 0]
        node = rng.choice(choices)
        room[node] -= 1
        p["spec"]["nodeName"] = node
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda p: core.create_namespaced_pod(FILL_NS, p), pods))
    gone = [p["metadata"]["name"] for p in pods if rng.random() >= keep]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda name: core.delete_namespaced_pod(name, FILL_NS,
                                                              grace_period_seconds=0), gone))
    cluster.wait_for(lambda: len(core.list_namespaced_pod(FILL_NS).items) == n - len(gone),
                     300, "the prefill's departures")
    nodes = {x.spec.node_name for x in core.list_namespaced_pod(FILL_NS).items}
    return {"prefill_pods": float(n - len(gone)), "prefill_nodes": float(len(nodes))}


def group_latency(core: Any, n_groups: int, timeout_s: float) -> dict[str, float]:
    """Create-to-complete of ``n_groups`` LeaderWorkerSet groups of 2 pods x 8 GPUs
    (gpupack profile), all created at once: kube-scheduler must offer each member the
    node the extender reserved for it, which sampling (percentageOfNodesToScore below
    100) can leave out of a cycle."""
    pods = []
    for g in range(n_groups):
        for w in range(2):
            p = cluster.lws_member(f"grp{g}", w, 2, 8, "bench")
            p["spec"]["schedulerName"] = controlplane.SCHEDULER_NAME
            p["spec"]["containers"][0]["resources"]["requests"] = {
                "cpu": "100m", "memory": "256Mi", "nvidia.com/gpu": "8"}
            pods.append(p)
    t0 = time.monotonic()
    for p in pods:
        core.create_namespaced_pod(PODS_NS, p)
    done: dict[str, float] = {}
    end = t0 + timeout_s
    while len(done) < n_groups and time.monotonic() < end:
        bound = {x.metadata.name for x in core.list_namespaced_pod(PODS_NS).items
                 if x.spec.node_name}
        for g in range(n_groups):
            if f"grp{g}" not in done and {f"grp{g}-0", f"grp{g}-0-1"} <= bound:
                done[f"grp{g}"] = time.monotonic() - t0
        time.sleep(0.1)
    cluster.force_delete_pods(core, PODS_NS)
    cluster.wait_for(lambda: not core.list_namespaced_pod(PODS_NS).items, 300,
                     "the pods to be gone")
    times = sorted(done.values())
    return {"groups": float(n_groups), "groups_complete": float(len(times)),
            "group_p50_s": percentile(times, 0.5), "group_max_s": max(times, default=float("nan"))}


def single_pods(core: Any, scheduler: str, n: int, timeout_s: float) -> dict[str, float]:
    """Create-to-bound of ``n`` pods created one at a time, each after the previous one
    is bound: the latency a lone pod sees, without a queue ahead of it."""
    prefix = "gs" if scheduler == controlplane.SCHEDULER_NAME else "ps"
    latencies = []
    for p in pod_specs(n, scheduler, prefix):
        core.create_namespaced_pod(PODS_NS, p)
        t0 = time.monotonic()
        name = str(p["metadata"]["name"])

        def is_bound(name: str = name) -> Any:
            return core.read_namespaced_pod(name, PODS_NS).spec.node_name

        cluster.wait_for(is_bound, timeout_s, f"{name} bound", interval_s=0.005)
        latencies.append((time.monotonic() - t0) * 1000)
    cluster.force_delete_pods(core, PODS_NS)
    cluster.wait_for(lambda: not core.list_namespaced_pod(PODS_NS).items, 300,
                     "the pods to be gone")
    return {"single_p50_ms": percentile(latencies, 0.5),
            "single_p99_ms": percentile(latencies, 0.99)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--single", type=int, default=50,
                   help="pods created one at a time, for the lone-pod latency (default 50)")
    p.add_argument("--prefill", type=int, default=0,
                   help="first fragment the cluster: this many pods bound to random nodes, "
                        "then --prefill-keep of them kept (default 0: empty)")
    p.add_argument("--prefill-keep", type=float, default=0.5,
                   help="share of the prefill's pods that stay (default 0.5)")
    p.add_argument("--groups", type=int, default=5,
                   help="LLM groups (2 x 8 GPUs) created at once after the gpupack burst, "
                        "for their create-to-complete time (default 5; 0: none)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per profile")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--dir", type=Path, default=None, help="stack folder (default: a temp dir)")
    p.add_argument("--percentage-of-nodes-to-score", type=int, default=None,
                   help="override the chart's setting (0: adaptive) for the gpupack profile")
    p.add_argument("--profile-json", default=None,
                   help="JSON merged into the gpupack profile (benchmark experiments)")
    p.add_argument("--extender-arg", action="append", default=[],
                   help="extra argument for gpupack serve, e.g. --no-planner (repeatable)")
    args = p.parse_args(argv)
    from kubernetes import client

    base = args.dir or Path(tempfile.mkdtemp(prefix="gpupack-e2e-bench-"))
    t0 = time.monotonic()
    overrides = json.loads(args.profile_json) if args.profile_json else {}
    if args.percentage_of_nodes_to_score is not None:
        overrides["percentageOfNodesToScore"] = args.percentage_of_nodes_to_score
    stack = controlplane.up(base, agent=False, standby=False,
                            extender_args=args.extender_arg, profile_overrides=overrides)
    try:
        admin = controlplane._api(stack.kubeconfig)
        core = client.CoreV1Api(admin)
        controlplane.ensure_namespace(admin, PODS_NS)
        controlplane.ensure_namespace(admin, FILL_NS)
        specs = node_specs(args.nodes)
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda s: cluster.create_nodes(core, [s]), specs))
        setup_s = time.monotonic() - t0
        time.sleep(5)  # the schedulers' and the extender's informers take the nodes in
        results: dict[str, dict[str, float]] = {}
        if args.prefill:
            results["prefill"] = prefill(core, specs, args.prefill, args.prefill_keep, seed=1)
            time.sleep(5)
        for name, scheduler in (("gpupack", controlplane.SCHEDULER_NAME),
                                ("default", controlplane.PLAIN_SCHEDULER_NAME)):
            before = cpu_seconds(stack)
            burst = run_profile(admin, core, scheduler, args.pods, args.timeout)
            after = cpu_seconds(stack)
            results[name] = {**burst, **single_pods(core, scheduler, args.single, 60.0)}
            if name == "gpupack" and args.groups:
                results[name].update(group_latency(core, args.groups, 300.0))
            if name == "gpupack":
                results["gpupack_extender_mean_ms"] = extender_verb_ms(stack)
            # CPU seconds of the burst, per component that used any.
            results[name + "_cpu_s"] = {c: round(after.get(c, 0.0) - before.get(c, 0.0), 1)
                                        for c in after
                                        if after.get(c, 0.0) - before.get(c, 0.0) >= 0.1}
    finally:
        stack.down()
    results["setup"] = {"nodes": args.nodes, "pods": args.pods, "setup_s": round(setup_s, 1),
                        "cpus": float(os.cpu_count() or 0)}
    if args.format == "json":
        print(json.dumps(results, indent=1))
    else:
        print(f"{args.nodes} nodes x 8 GPUs, {args.pods} pods per profile "
              f"(setup {setup_s:.0f} s, {os.cpu_count()} CPUs)")
        print(f"{'profile':<10} {'bound':>7} {'pods/s':>8} {'p50 ms':>9} {'p99 ms':>9} "
              f"{'lone p50':>9} {'lone p99':>9}")
        for name in ("gpupack", "default"):
            r = results[name]
            print(f"{name:<10} {int(r['bound']):>7} {r['pods_per_s']:>8.1f} "
                  f"{r['p50_ms']:>9.0f} {r['p99_ms']:>9.0f} {r['single_p50_ms']:>9.0f} "
                  f"{r['single_p99_ms']:>9.0f}")
        if "prefill" in results:
            f = results["prefill"]
            print(f"prefilled: {f['prefill_pods']:.0f} pods left on {f['prefill_nodes']:.0f} "
                  "random nodes")
        ratio = results["gpupack"]["pods_per_s"] / max(results["default"]["pods_per_s"], 1e-9)
        print(f"gpupack / default pods/s: {ratio:.2f}")
        if args.groups:
            r = results["gpupack"]
            print(f"gpupack: {r['groups_complete']:.0f} of {r['groups']:.0f} groups complete, "
                  f"p50 {r['group_p50_s']:.1f} s, last {r['group_max_s']:.1f} s")
        for name in ("gpupack", "default"):
            r = results[name]
            print(f"{name}: the burst used {r['nodes_used']:.0f} nodes and left "
                  f"{r['whole_nodes_untouched']:.0f} of {r['whole_nodes']:.0f} whole-GPU nodes "
                  "untouched")
        print("extender mean ms per verb (burst and lone pods): "
              + ", ".join(f"{v} {ms:.1f}" for v, ms in
                          sorted(results["gpupack_extender_mean_ms"].items())))
        for name in ("gpupack", "default"):
            cpu = results[name + "_cpu_s"]
            print(f"CPU s during the {name} burst: "
                  + ", ".join(f"{c} {v:.1f}" for c, v in sorted(cpu.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
