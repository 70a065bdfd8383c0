"""Memory of ``gpupack serve`` at size, under a steady mixed load (issue 17, item 6).

Generates 5,000 nodes x 8 GPUs (bench/extender.py's generator: H100 MIG, L40S
time-sliced and whole-GPU H100 nodes) with ``--bound`` running pods spread over them and
a supply of pending pods, starts ``gpupack serve`` on them (``bench/echo_serve.py``: the
same server with the benchmark's echo route) (static files; the in-cluster
path is the same cache fed by a watch), and sends filter, prioritize, bind and echo
requests at ``--rate`` per second for ``--minutes``. Every 10 s it samples RSS and PSS
(``/proc/PID/smaps_rollup``) of the whole process tree (gunicorn master, worker, solver
and warm children). Prints the samples, then PASS/FAIL on two criteria: the tree's PSS
stays under ``--limit-mib`` (default 500), and it is flat: the last minute's mean is
within ``--flat-pct`` (default 10%) of the mean of the minute after warm-up.

    python bench/soak.py                       # 10 minutes, 20 requests/s
    python bench/soak.py --minutes 2 --rate 40
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
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
    """(role, RSS MiB, PSS MiB) of each process of the tree: the gunicorn master, its
    worker, and the worker's children (solver, warm child, multiprocessing's resource
    tracker), named by their place in the tree and their command line."""
    out = []
    worker = children(pid)
    kids = [k for w in worker for k in children(w)]
    for p in [pid, *worker, *kids]:
        rss = pss = 0
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
        except OSError:
            continue
        what = ("master" if p == pid else "worker" if p in worker
                else "resource tracker" if "resource_tracker" in cmd else "child (spawn)")
        out.append((f"{what} {p}", rss / 1024, pss / 1024))
    return out


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
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG")
    a = ap.parse_args()
    import extender as ext  # bench/extender.py: this script's folder is on sys.path
    nodes, pods = cluster(ext, a.nodes, a.bound, a.pending, a.seed)
    names = [x["metadata"]["name"] for x in nodes]
    pending = [p for p in pods if not p["spec"].get("nodeName")]
    rng = random.Random(a.seed + 1)
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
        samples: list[tuple[float, float, float, int, int]] = []
        try:
            conn = ext.wait_ready(port, proc, 0.5)
            print(f"{a.nodes} nodes, {a.bound} bound pods: ready in "
                  f"{time.monotonic() - started:.1f} s; {a.rate:.0f} requests/s for "
                  f"{a.minutes:g} min", flush=True)
            print("   t_s  requests   rss_mib   pss_mib  procs", flush=True)
            t0 = time.monotonic()
            next_sample = t0
            requests = 0
            bound = 0
            while time.monotonic() - t0 < a.minutes * 60:
                now = time.monotonic()
                if now >= next_sample:
                    rss, pss, procs = memory_mib(proc.pid)
                    samples.append((now - t0, rss, pss, procs, requests))
                    print(f"{now - t0:6.0f} {requests:9d} {rss:9.1f} {pss:9.1f} {procs:6d}",
                          flush=True)
                    next_sample += 10.0
                pod = pending[bound % len(pending)]
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
                    if bound < len(pending):
                        m = pod["metadata"]
                        conn.post("/bind", json.dumps({
                            "PodName": m["name"], "PodNamespace": m["namespace"],
                            "PodUID": m["uid"], "Node": best}).encode())
                        requests += 1
                        bound += 1
                conn.post("/echo", body)
                requests += 1
                # Steady rate: the cycle above was about four requests.
                time.sleep(max(0.0, 4.0 / a.rate - (time.monotonic() - now)))
            rss, pss, procs = memory_mib(proc.pid)
            samples.append((time.monotonic() - t0, rss, pss, procs, requests))
            print(f"{samples[-1][0]:6.0f} {requests:9d} {rss:9.1f} {pss:9.1f} {procs:6d}")
            print("per process at the end (RSS / PSS MiB):")
            for what, prss, ppss in breakdown(proc.pid):
                print(f"  {prss:8.1f} {ppss:8.1f}  {what}")
        finally:
            proc.terminate()
            proc.wait(30)
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
