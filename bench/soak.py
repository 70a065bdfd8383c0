"""Memory of ``gpupack serve`` at size, under a steady mixed load (issue 17, item 6).

Generates 5,000 nodes x 8 GPUs (bench/extender.py's generator: H100 MIG, L40S
time-sliced and whole-GPU H100 nodes) with ``--bound`` running pods spread over them and
a supply of pending pods, starts ``gpupack serve`` on them (``bench/echo_serve.py``: the
same server with the benchmark's echo route) (static files; the in-cluster
path is the same cache fed by a watch), and sends filter, prioritize, bind and echo
requests at ``--rate`` per second for ``--minutes``. Every 10 s it samples RSS and PSS
(``/proc/PID/smaps_rollup``) of the whole process tree (gunicorn master, worker, solver
and warm children). Prints the samples, each process's RSS and PSS at the end, then
PASS/FAIL on two criteria: the tree's PSS stays under ``--limit-mib`` (default 500), and
it is flat: the last minute's mean is within ``--flat-pct`` (default 10%) of the mean of
the minute after warm-up.

``--cluster``: in-cluster instead (the watch path). The real control plane of tests/e2e
is started (``controlplane.up``; webhook, controller-manager and MIG manager stopped),
the nodes and bound pods are created through the API, the extender (the chart's command
line) is restarted so that it lists them, and kube-scheduler binds the pending pods the
soak creates, one per cycle; the soak's own requests are filter and prioritize.

    python bench/soak.py                       # 10 minutes, 20 requests/s
    python bench/soak.py --minutes 2 --rate 40
    python bench/soak.py --cluster --rate 40   # ~7 min of object creation first
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent


def cluster(ext: ModuleType, n: int, bound: int, pending: int, seed: int
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``n`` nodes, ``bound`` running pods spread evenly (each node's pods fit it: MIG
    nodes get 1g slices, L40S nodes shares, whole-GPU nodes up to 4 two-GPU pods and
    CPU-only pods), ``pending`` pods of the gpupack scheduler."""
    rng = random.Random(seed)
    nodes = [ext.gen_node(i, "mig" if i % 5 < 2 else ("l40s" if i % 5 == 2 else "whole"))
             for i in range(n)]
    per_node = max(1, bound // n)
    pods: list[dict[str, Any]] = []
    for node in nodes:
        name = node["metadata"]["name"]
        kind = name.split("-")[0]
        for j in range(per_node):
            if len(pods) >= bound:
                break
            if kind == "mig":
                pod = ext.gen_pod(f"run-{name}-{j}", 0, node=name)
            elif kind == "l40s":
                pod = ext.gen_pod(f"run-{name}-{j}", 2, node=name)
            elif j < 4:
                pod = ext.gen_pod(f"run-{name}-{j}", 3, node=name)
            else:
                pod = ext.gen_pod(f"run-{name}-{j}", 0, node=name)
                pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
                pod["metadata"]["annotations"] = {}
            pods.append(pod)
    for i in range(pending):
        pods.append(ext.gen_pod(f"pend-{i}", rng.randrange(len(ext.TEMPLATES))))
    return nodes, pods


def tree(pid: int) -> list[int]:
    out = [pid]
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for k in (task / "children").read_text().split():
                out += tree(int(k))
    except OSError:
        pass
    return out


def memory_mib(pid: int) -> tuple[float, float, int]:
    """(RSS, PSS, processes) of the process tree in MiB."""
    rss = pss = 0
    pids = tree(pid)
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            pass
    return rss / 1024, pss / 1024, len(pids)


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(k) for k in (task / "children").read_text().split()]
    except OSError:
        pass
    return out


def breakdown(pid: int) -> list[tuple[str, float, float]]:
    """(role, RSS MiB, PSS MiB) of each process of the tree: a launcher if any, the
    gunicorn master, its worker, and the worker's children (solver, warm child,
    multiprocessing's resource tracker), named by command line and place in the tree."""
    out = []
    seen: list[int] = []  # the gunicorn master, once met

    def walk(p: int, depth: int) -> None:
        rss = pss = 0
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
        except OSError:
            return
        kids = children(p)
        if "resource_tracker" in cmd:
            what = "resource tracker"
        elif "spawn_main" in cmd:
            what = "child (spawn)"
        elif ("gpupack" in cmd or "echo_serve" in cmd) and not seen:
            what = "master"
            seen.append(p)
        elif seen:
            what = "worker"
        else:
            what = "launcher"
        out.append((f"{'  ' * depth}{what} {p}", rss / 1024, pss / 1024))
        for c in kids:
            walk(c, depth + 1)

    walk(pid, 0)
    return out


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def load_cluster(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], workers: int = 8
                 ) -> tuple[Any, Any]:
    """Start the real control plane of tests/e2e (etcd, kube-apiserver, kube-scheduler
    with the chart's gpupack profile, the extender as the chart runs it), stop what the
    soak does not need (webhook, controller-manager, MIG manager double), and create
    ``nodes`` and the bound ones of ``pods`` through the API. The stack and its client."""
    sys.path.insert(0, str(HERE.parent / "tests" / "e2e"))
    import controlplane
    from kubernetes import client

    base = Path(tempfile.mkdtemp(prefix="gpupack-soak-"))
    stack = controlplane.up(base, agent=False, standby=False, plain=False)
    admin = controlplane._api(stack.kubeconfig)
    core: Any = client.CoreV1Api(admin)
    # Pods are created as they are (the webhook would size them; these are sized).
    with contextlib.suppress(Exception):
        client.AdmissionregistrationV1Api(admin).delete_collection_mutating_webhook_configuration()
    for component in ("webhook", "controller-manager", "mig-manager"):
        if stack.alive(component):
            stack.stop(component)
    for ns in {p["metadata"]["namespace"] for p in pods}:
        controlplane.ensure_namespace(admin, ns)

    def make_node(n: dict[str, Any]) -> None:
        name = n["metadata"]["name"]
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": n["metadata"]})
        alloc = n["status"]["allocatable"]
        core.patch_node_status(name, {"status": {
            "capacity": alloc, "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "soak: no kubelet"}]}})
        core.patch_node(name, {"spec": {"taints": None}})

    def make_pod(p: dict[str, Any]) -> None:
        body = {k: v for k, v in p.items() if k != "status"}
        body["metadata"] = {k: v for k, v in p["metadata"].items()
                            if k not in ("uid", "creationTimestamp")}
        core.create_namespaced_pod(p["metadata"]["namespace"], body)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(make_node, nodes))
        list(pool.map(make_pod, pods))
    return stack, core


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--bound", type=int, default=50_000)
    ap.add_argument("--pending", type=int, default=2000)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=20.0, help="requests per second")
    ap.add_argument("--limit-mib", type=float, default=500.0)
    ap.add_argument("--flat-pct", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fine-s", type=float, default=0.5, metavar="S",
                    help="also sample the tree every S seconds in a thread and print the "
                         "highest sample (0: off; the verdict uses the 10 s samples)")
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG")
    ap.add_argument("--cluster", action="store_true",
                    help="in-cluster: the real API server of tests/e2e holds the cluster and "
                         "the extender runs as the chart runs it (watch path); binds are "
                         "kube-scheduler's, of pending pods created one per cycle")
    a = ap.parse_args()
    import extender as ext  # bench/extender.py: this script's folder is on sys.path
    nodes, pods = cluster(ext, a.nodes, a.bound, a.pending, a.seed)
    names = [x["metadata"]["name"] for x in nodes]
    pending = [p for p in pods if not p["spec"].get("nodeName")]
    if a.cluster:
        return soak_cluster(a, ext, nodes, pods, names, pending)
    with tempfile.TemporaryDirectory() as d:
        nf, pf = Path(d) / "nodes.json", Path(d) / "pods.json"
        nf.write_text(json.dumps({"kind": "NodeList", "items": nodes}))
        pf.write_text(json.dumps({"kind": "PodList", "items": pods}))
        del nodes, pods
        port = ext._free_port()
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, str(ext.ECHO_SERVE), "--port", str(port), "--nodes", str(nf),
             "--pods", str(pf), "--log-level", "WARNING", *a.serve_arg],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            conn = ext.wait_ready(port, proc, 0.5)
            print(f"static: {a.nodes} nodes, {a.bound} bound pods: ready in "
                  f"{time.monotonic() - started:.1f} s", flush=True)
            samples = drive(a, conn, proc.pid, names, pending, bind=True)
        finally:
            proc.terminate()
            proc.wait(30)
    return verdict(a, samples)


def soak_cluster(a: argparse.Namespace, ext: ModuleType, nodes: list[dict[str, Any]],
                 pods: list[dict[str, Any]], names: list[str],
                 pending: list[dict[str, Any]]) -> int:
    started = time.monotonic()
    bound = [p for p in pods if p["spec"].get("nodeName")]
    stack, core = load_cluster(nodes, bound)
    try:
        loaded = time.monotonic() - started
        # A fresh extender lists everything (the start of a real replica), then watches.
        stack.restart("extender")
        url = stack.state()["components"]["extender"]["url"]
        port = int(url.rsplit(":", 1)[1])
        pid = stack.pid("extender")
        assert pid is not None
        if _cmd(pid).startswith("bash"):  # the stack's restart loop: gpupack is its child
            pid = children(pid)[0]
        t = time.monotonic()
        conn = ext.Conn(port)
        while True:
            try:
                if conn.get("/readyz").get("ready"):
                    break
            except (OSError, ValueError):
                conn = ext.Conn(port)
            if time.monotonic() - t > 600:
                raise RuntimeError("the extender did not get ready in 10 minutes")
            time.sleep(0.5)
        print(f"in-cluster: {a.nodes} nodes, {a.bound} bound pods created through the API "
              f"in {loaded:.0f} s; extender ready {time.monotonic() - t:.1f} s after its "
              f"restart", flush=True)

        def create(pod: dict[str, Any]) -> None:
            body = {k: v for k, v in pod.items() if k != "status"}
            body["metadata"] = {k: v for k, v in pod["metadata"].items()
                                if k not in ("uid", "creationTimestamp")}
            with contextlib.suppress(Exception):  # a name already used: the next one
                core.create_namespaced_pod(pod["metadata"]["namespace"], body)

        samples = drive(a, conn, pid, names, pending, bind=False, create=create)
    finally:
        stack.down()
    return verdict(a, samples)


def drive(a: argparse.Namespace, conn: Any, root: int, names: list[str],
          pending: list[dict[str, Any]], bind: bool,
          create: Callable[[dict[str, Any]], None] | None = None
          ) -> list[tuple[float, float, float, int, int]]:
    """The steady load: per cycle a filter over a tenth of the nodes, a prioritize of
    the kept ones, a bind of the best (``bind``; in-cluster kube-scheduler binds the
    pending pods ``create`` makes, one per cycle) and an echo; memory sampled every 10 s."""
    rng = random.Random(a.seed + 1)
    print(f"{a.rate:.0f} requests/s for {a.minutes:g} min", flush=True)
    print("   t_s  requests   rss_mib   pss_mib  procs", flush=True)
    samples: list[tuple[float, float, float, int, int]] = []
    fine = FineSampler(root, a.fine_s, a.limit_mib) if a.fine_s > 0 else None
    t0 = time.monotonic()
    next_sample = t0
    requests = 0
    used = 0
    while time.monotonic() - t0 < a.minutes * 60:
        now = time.monotonic()
        if now >= next_sample:
            rss, pss, procs = memory_mib(root)
            samples.append((now - t0, rss, pss, procs, requests))
            print(f"{now - t0:6.0f} {requests:9d} {rss:9.1f} {pss:9.1f} {procs:6d}",
                  flush=True)
            next_sample += 10.0
        pod = pending[used % len(pending)]
        if create is not None and used < len(pending):
            create(pod)
        sample = rng.sample(names, max(1, len(names) // 10))
        body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": sample}).encode()
        _, _, data = conn.post("/filter", body)
        kept = json.loads(data)["NodeNames"] or []
        requests += 1
        if kept:
            pbody = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": kept}).encode()
            _, _, data = conn.post("/prioritize", pbody)
            best = max(json.loads(data), key=lambda h: h["Score"])["Host"]
            requests += 1
            if bind and used < len(pending):
                m = pod["metadata"]
                conn.post("/bind", json.dumps({
                    "PodName": m["name"], "PodNamespace": m["namespace"],
                    "PodUID": m["uid"], "Node": best}).encode())
                requests += 1
        used += 1
        if bind or create is None:
            conn.post("/echo", body)
            requests += 1
        # Steady rate: the cycle above was about four requests.
        time.sleep(max(0.0, 4.0 / a.rate - (time.monotonic() - now)))
    rss, pss, procs = memory_mib(root)
    samples.append((time.monotonic() - t0, rss, pss, procs, requests))
    print(f"{samples[-1][0]:6.0f} {requests:9d} {rss:9.1f} {pss:9.1f} {procs:6d}")
    if fine is not None:
        fine.stop()
        print(f"every {a.fine_s:g} s ({fine.count} samples): tree peak PSS {fine.peak:.1f} MiB "
              f"at {fine.peak_t:.0f} s, {fine.over} samples at or over {a.limit_mib:.0f}; "
              f"highest single process {fine.top:.1f} MiB ({fine.top_what})")
        print("  each process's highest sample (PSS MiB): " + ", ".join(
            f"{what} {p:.1f}" for what, p in fine.highest.items()))
    print("per process at the end (RSS / PSS MiB):")
    for what, prss, ppss in breakdown(root):
        print(f"  {prss:8.1f} {ppss:8.1f}  {what}")
    # After the figures: a scrape renders the per-GPU lines (the worker grows by them).
    print("planner at the end: " + plan_figures(conn))
    return samples


def plan_figures(conn: Any) -> str:
    """The planner's figures from the extender's /metrics (solves, the latest status,
    solve seconds, fragmentation), or why they could not be read."""
    try:
        conn.c.request("GET", "/metrics")
        r = conn.c.getresponse()
        text = r.read().decode()
    except (OSError, ValueError) as e:
        return f"(/metrics: {e})"
    if r.status != 200:
        return f"(/metrics: HTTP {r.status})"
    out = []
    for line in text.splitlines():
        if line.startswith(("gpupack_plan_solves ", "gpupack_plan_solve_seconds ",
                            "gpupack_fragmentation_ratio ")):
            name, value = line.rsplit(" ", 1)
            out.append(f"{name.removeprefix('gpupack_')} {float(value):g}")
        elif line.startswith("gpupack_plan_status{") and line.endswith(" 1.0"):
            out.append(line.split(" ")[0].removeprefix("gpupack_"))
    return ", ".join(out) or "(no planner figures)"


class FineSampler:
    """The tree's PSS every ``every_s`` seconds in a thread of its own: the 10 s samples
    can miss a solve; this one sees the transient (reading smaps_rollup of five
    processes takes a few ms)."""

    def __init__(self, root: int, every_s: float, limit_mib: float = 500.0) -> None:
        self.root, self.every_s, self.limit = root, every_s, limit_mib
        self.peak = self.peak_t = self.top = 0.0
        self.top_what = ""
        self.highest: dict[str, float] = {}  # each process's highest PSS sample
        self.count = self.over = 0
        self._t0 = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.every_s):
            parts = breakdown(self.root)
            pss = sum(p for _, _, p in parts)
            self.count += 1
            self.over += pss >= self.limit
            if pss > self.peak:
                self.peak, self.peak_t = pss, time.monotonic() - self._t0
            for what, _, p in parts:
                name = what.strip()
                self.highest[name] = max(self.highest.get(name, 0.0), p)
                if p > self.top:
                    self.top, self.top_what = p, name

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def verdict(a: argparse.Namespace, samples: list[tuple[float, float, float, int, int]]) -> int:
    peak = max(s[2] for s in samples)
    warm = [s[2] for s in samples if 60 <= s[0] < 120] or [samples[0][2]]
    last = [s[2] for s in samples if s[0] >= samples[-1][0] - 60]
    growth = (statistics.mean(last) / statistics.mean(warm) - 1) * 100
    under = peak < a.limit_mib
    flat = growth <= a.flat_pct
    print(f"peak PSS {peak:.1f} MiB (limit {a.limit_mib:.0f}): {'PASS' if under else 'FAIL'}; "
          f"last minute vs minute after warm-up {growth:+.1f}% (limit {a.flat_pct:.0f}%): "
          f"{'PASS' if flat else 'FAIL'}; {samples[-1][4]} requests")
    return 0 if under and flat else 1


if __name__ == "__main__":
    raise SystemExit(main())
