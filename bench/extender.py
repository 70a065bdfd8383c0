"""Benchmark of the scheduler extender: a real ``gpupack serve`` process (gunicorn),
kube-scheduler-shaped requests, per-verb latency percentiles, throughput and memory.

For each cluster size it writes a generated snapshot (GFD-labelled Node objects: H100
MIG mixed nodes, L40S time-sliced nodes, whole-GPU H100 nodes; running pods on part of
them; pending pods of the gpupack scheduler), starts the server on a free loopback port
with the planner running, and replays scheduling cycles the way kube-scheduler makes
them with ``nodeCacheCapable: true``: ``filter`` with the pod and ~10% of the node names
(what ``percentageOfNodesToScore`` leaves on a large cluster), ``prioritize`` with the
nodes that passed, ``bind`` to the best of them. Each cycle also sends ``/echo`` with a
body of the same size, to the same server, as the HTTP baseline (the route is the
benchmark's: the server is ``bench/echo_serve.py``, ``gpupack serve`` with it added).
Requests go over one keep-alive connection, one after another, like the scheduler's
serial cycle. Meanwhile a
second connection scrapes ``/metrics`` every ``--scrape-every`` seconds (as Prometheus
does; the manifests' ServiceMonitor interval is 30 s), so the scrape's cost on the verbs
is part of the figures; its own duration is reported too.

    python bench/extender.py                 # 1,000 and 5,000 nodes
    python bench/extender.py --nodes 1000 --cycles 300
    python bench/extender.py --no-planner    # the request path alone
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# gpupack serve, plus the benchmark's own POST /echo baseline route.
ECHO_SERVE = Path(__file__).resolve().parent / "echo_serve.py"

H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"


# ---- cluster generation ----------------------------------------------------------------------


def gen_node(i: int, kind: str) -> dict[str, Any]:
    name = f"{kind}-{i:05d}"
    labels = {"kubernetes.io/hostname": name,
              "nvidia.com/gpu.count": "8" if kind != "l40s" else "4",
              "topology.kubernetes.io/zone": f"zone-{i % 3}"}
    alloc = {"cpu": "126", "memory": "1007Gi", "pods": "110"}
    if kind == "mig":
        labels.update({"nvidia.com/gpu.product": H100, "nvidia.com/mig.strategy": "mixed"})
        alloc.update({"nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-2g.20gb": "6",
                      "nvidia.com/mig-3g.40gb": "4", "nvidia.com/gpu": "2"})
    elif kind == "l40s":
        labels.update({"nvidia.com/gpu.product": L40S, "nvidia.com/gpu.replicas": "4",
                       "nvidia.com/gpu.sharing-strategy": "time-slicing"})
        alloc.update({"cpu": "62", "memory": "503Gi", "nvidia.com/gpu.shared": "16"})
    else:
        labels.update({"nvidia.com/gpu.product": H100,
                       "nvidia.com/gpu.clique": f"clique-{i // 16}",
                       "gpupack.io/mig-reconfigure": "false"})
        alloc["nvidia.com/gpu"] = "8"
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": alloc}}


TEMPLATES: list[tuple[str, dict[str, str], dict[str, str]]] = [
    ("asr", {"nvidia.com/mig-1g.10gb": "1"}, {"gpupack.io/class": "asr"}),
    ("tts", {"nvidia.com/mig-2g.20gb": "1"}, {"gpupack.io/class": "tts"}),
    ("embed-ts", {"nvidia.com/gpu.shared": "1"},
     {"gpupack.io/class": "small", "gpupack.io/gpu-memory": "6Gi",
      "gpupack.io/gpu-compute": "0.25"}),
    ("llm-tp2", {"nvidia.com/gpu": "2"}, {"gpupack.io/class": "llm"}),
]


def gen_pod(name: str, template: int, node: str | None = None) -> dict[str, Any]:
    kind, limits, ann = TEMPLATES[template]
    spec: dict[str, Any] = {
        "schedulerName": "gpupack", "restartPolicy": "Always", "priority": 0,
        "containers": [{
            "name": kind, "image": f"registry.example/{kind}:1.4.2",
            "args": ["--port", "8080", "--model", f"/models/{kind}"],
            "ports": [{"containerPort": 8080, "protocol": "TCP"}],
            "env": [{"name": "OMP_NUM_THREADS", "value": "4"}],
            "resources": {"requests": {"cpu": "2", "memory": "8Gi", **limits}, "limits": limits},
        }],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "inference", "uid": f"uid-{name}",
                         "labels": {"app": kind}, "annotations": dict(ann),
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


def gen_cluster(
    n: int, pending: int, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rng = random.Random(seed)
    nodes = []
    for i in range(n):
        kind = "mig" if i % 5 < 2 else ("l40s" if i % 5 == 2 else "whole")
        nodes.append(gen_node(i, kind))
    pods = []
    # Running pods on a third of the nodes (bound by someone else: GPUs inferred).
    for i, node in enumerate(nodes[: n // 3]):
        name = node["metadata"]["name"]
        t = {"mig": 0, "l40s": 2, "whole": 3}[name.split("-")[0]]
        pods.append(gen_pod(f"run-{i}", t, node=name))
    for i in range(pending):
        pods.append(gen_pod(f"pend-{i}", rng.randrange(len(TEMPLATES))))
    return nodes, pods


# ---- client --------------------------------------------------------------------------------


class Conn:
    def __init__(self, port: int) -> None:
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(self, path: str, body: bytes) -> tuple[float, int, bytes]:
        t0 = time.perf_counter()
        self.c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = self.c.getresponse()
        data = r.read()
        return time.perf_counter() - t0, r.status, data

    def get(self, path: str) -> Any:
        self.c.request("GET", path)
        r = self.c.getresponse()
        return json.loads(r.read())


def wait_ready(port: int, proc: subprocess.Popen[bytes], poll_s: float = 0.2) -> Conn:
    """A connection to the extender on ``port`` once its /readyz says ready;
    RuntimeError if ``proc`` exits first."""
    conn = Conn(port)
    while True:
        try:
            if conn.get("/readyz").get("ready"):
                return conn
        except (OSError, ValueError):
            conn = Conn(port)
        if proc.poll() is not None:
            raise RuntimeError("gpupack serve exited")
        time.sleep(poll_s)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _descendants(pid: int) -> list[int]:
    """``pid`` and its descendants, parents first (children of every thread)."""
    out = [pid]
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for k in kids:
            out += _descendants(int(k))
    return out


def _rss_mib(pid: int) -> dict[str, float]:
    """RSS in MiB: the gunicorn master and worker ("server"), and everything under them
    ("total": the solver and warm children too)."""
    server = total = 0
    pids = _descendants(pid)
    for depth, p in enumerate(pids):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    kib = int(line.split()[1])
                    total += kib
                    if depth < 2:  # master, then its first child: the worker
                        server += kib
        except OSError:
            pass
    return {"server": round(server / 1024, 1), "total": round(total / 1024, 1)}


def _load() -> float:
    """The 1-minute load average (other work on the machine skews the figures)."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1.0


def _metrics(conn: Conn) -> str:
    conn.c.request("GET", "/metrics")
    return conn.c.getresponse().read().decode()


def _solves(text: str) -> int:
    """Plans finished so far, from the server's Prometheus text."""
    for line in text.splitlines():
        if line.startswith("gpupack_plan_solves "):
            return int(float(line.split()[1]))
    return -1


def _handler_seconds(text: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of the server's own request histogram per verb: the time inside the
    handler, without HTTP parsing, gunicorn and the network."""
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        for part, idx in (("gpupack_extender_request_seconds_sum{", 0),
                          ("gpupack_extender_request_seconds_count{", 1)):
            if line.startswith(part):
                verb = line.split('verb="', 1)[1].split('"', 1)[0]
                out.setdefault(verb, [0.0, 0.0])[idx] = float(line.rsplit(" ", 1)[1])
    return {v: (s, c) for v, (s, c) in out.items()}


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] * 1000


class Scraper:
    """GET /metrics every ``every_s`` seconds on its own connection, in a thread."""

    def __init__(self, port: int, every_s: float) -> None:
        self.port, self.every_s = port, every_s
        self.seconds: list[float] = []
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while not self._stop.wait(self.every_s):
            t0 = time.perf_counter()
            conn.request("GET", "/metrics")
            self.bytes = len(conn.getresponse().read())
            self.seconds.append(time.perf_counter() - t0)

    def start(self) -> None:
        if self.every_s > 0:
            self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)
        xs = self.seconds
        return {"every_s": self.every_s, "n": len(xs), "bytes": self.bytes,
                "mean_ms": round(statistics.mean(xs) * 1e3, 1) if xs else None,
                "max_ms": round(max(xs) * 1e3, 1) if xs else None}


def split_cpus(cpus: set[int]) -> tuple[set[int], set[int]] | None:
    """(client CPUs, server CPUs) for ``--pin``: the lowest CPU for the client, the rest
    for the server and its children; None with fewer than 2 CPUs."""
    if len(cpus) < 2:
        return None
    first = min(cpus)
    return {first}, cpus - {first}


def run_size(n: int, cycles: int, warmup: int, seed: int, planner: bool,
             extra: list[str] | None = None, scrape_every_s: float = 5.0,
             server_cpus: set[int] | None = None) -> dict[str, Any]:
    pending = cycles + warmup
    nodes, pods = gen_cluster(n, pending, seed)
    names = [x["metadata"]["name"] for x in nodes]
    with tempfile.TemporaryDirectory() as d:
        nf, pf = Path(d) / "nodes.yaml", Path(d) / "pods.yaml"
        nf.write_text(json.dumps({"kind": "NodeList", "items": nodes}))
        pf.write_text(json.dumps({"kind": "PodList", "items": pods}))
        port = _free_port()
        cmd = [sys.executable, str(ECHO_SERVE), "--port", str(port), "--nodes", str(nf),
               "--pods", str(pf), "--log-level", "WARNING", "--time-limit", "2"]
        if not planner:
            cmd.append("--no-planner")
        cmd += extra or []
        t0 = time.perf_counter()
        pin = None if server_cpus is None else (lambda: os.sched_setaffinity(0, server_cpus))
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                preexec_fn=pin)
        try:
            while True:
                try:
                    if Conn(port).get("/readyz").get("ready"):
                        break
                except (OSError, ValueError):
                    pass
                if proc.poll() is not None:
                    raise RuntimeError("gpupack serve exited")
                time.sleep(0.1)
            ready_s = time.perf_counter() - t0
            return _drive(proc.pid, port, names, pods, cycles, warmup, seed, ready_s, n,
                          scrape_every_s)
        finally:
            proc.terminate()
            proc.wait(20)


def _drive(pid: int, port: int, names: list[str], pods: list[dict[str, Any]], cycles: int,
           warmup: int, seed: int, ready_s: float, n: int,
           scrape_every_s: float) -> dict[str, Any]:
    rng = random.Random(seed + 1)
    conn = Conn(port)
    load_before = _load()
    pending = [p for p in pods if not p["spec"].get("nodeName")]
    lat: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": [], "echo": []}
    sizes: list[int] = []
    failures = 0
    bound = 0
    requests = 0
    t_start = 0.0
    handler0: dict[str, tuple[float, float]] = {}
    for c in range(warmup + cycles):
        if c == warmup:
            lat = {k: [] for k in lat}
            requests = 0
            t_start = time.perf_counter()
            handler0 = _handler_seconds(_metrics(conn))
            scraper = Scraper(port, scrape_every_s)
            scraper.start()
        pod = pending[c]
        sample = rng.sample(names, max(1, n // 10))
        body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": sample}).encode()
        sizes.append(len(body))
        dt, _, data = conn.post("/filter", body)
        lat["filter"].append(dt)
        out = json.loads(data)
        kept = out["NodeNames"] or []
        dt, _, _ = conn.post("/echo", body)
        lat["echo"].append(dt)
        requests += 2
        if not kept:
            failures += 1
            continue
        pbody = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": kept}).encode()
        dt, _, data = conn.post("/prioritize", pbody)
        lat["prioritize"].append(dt)
        scores = json.loads(data)
        best = max(scores, key=lambda h: h["Score"])["Host"]
        meta = pod["metadata"]
        bbody = json.dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                            "PodUID": meta["uid"], "Node": best}).encode()
        dt, _, data = conn.post("/bind", bbody)
        lat["bind"].append(dt)
        requests += 2
        if json.loads(data)["Error"] == "":
            bound += 1
    wall = time.perf_counter() - t_start
    scrapes = scraper.stop()
    end_metrics = _metrics(conn)  # one scrape for the handler times and the solve count
    handler1 = _handler_seconds(end_metrics)
    status = conn.get("/status")
    result = {
        "nodes": n, "cycles": cycles, "ready_s": round(ready_s, 2), "bound": bound,
        "filter_rejected_all": failures, "requests_per_s": round(requests / wall, 1),
        "cycles_per_s": round(cycles / wall, 1), "rss_mib": _rss_mib(pid),
        "body_bytes_median": int(statistics.median(sizes)),
        "plan": status["plan"], "memo": status["memo"],
        "plan_solves": _solves(end_metrics), "load_before": load_before, "load_after": _load(),
        "scrapes": scrapes,
    }
    for verb, xs in lat.items():
        if xs:
            s1, c1 = handler1.get(verb, (0.0, 0.0))
            s0, c0 = handler0.get(verb, (0.0, 0.0))
            result[verb] = {"p50_ms": round(pct(xs, 0.5), 3), "p99_ms": round(pct(xs, 0.99), 3),
                            "n": len(xs),
                            "handler_mean_ms": round((s1 - s0) / (c1 - c0) * 1e3, 3)
                            if c1 > c0 else None}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, action="append", help="cluster sizes (default 1000, 5000)")
    ap.add_argument("--cycles", type=int, default=500, help="measured scheduling cycles per size")
    ap.add_argument("--warmup", type=int, default=200,
                    help="unmeasured cycles first (default 200: the server's own start-up "
                         "work, its first memo warming and plan, runs ~0.5 s past /readyz)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-planner", action="store_true", help="run the server without planner")
    ap.add_argument("--json", action="store_true", help="print JSON only")
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for `gpupack serve` (repeatable), e.g. --no-warm")
    ap.add_argument("--scrape-every", type=float, default=5.0, metavar="S",
                    help="scrape /metrics every S seconds during the measured cycles "
                         "(default 5; 0: never)")
    ap.add_argument("--pin", action="store_true",
                    help="client (and scraper) on one CPU, the server and its children on "
                         "the others, as when kube-scheduler and the extender do not share "
                         "cores; default: both float over all CPUs")
    args = ap.parse_args()
    server_cpus = None
    if args.pin:
        split = split_cpus(os.sched_getaffinity(0))
        if split is None:
            print("error: --pin needs at least 2 CPUs", file=sys.stderr)
            return 2
        os.sched_setaffinity(0, split[0])
        server_cpus = split[1]
    results = [run_size(n, args.cycles, args.warmup, args.seed, not args.no_planner,
                        args.serve_arg, args.scrape_every, server_cpus)
               for n in (args.nodes or [1000, 5000])]
    for r in results:
        r["pinned"] = server_cpus is not None
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'nodes':>6} {'verb':<11} {'p50 ms':>8} {'p99 ms':>8} {'n':>5} "
          f"{'handler mean ms':>15}")
    for r in results:
        for verb in ("filter", "prioritize", "bind", "echo"):
            if verb in r:
                v = r[verb]
                h = v["handler_mean_ms"]
                print(f"{r['nodes']:>6} {verb:<11} {v['p50_ms']:>8.3f} {v['p99_ms']:>8.3f} "
                      f"{v['n']:>5} {'-' if h is None else f'{h:.3f}':>15}")
        print(f"{r['nodes']:>6} requests/s {r['requests_per_s']}, cycles/s {r['cycles_per_s']}, "
              f"RSS {r['rss_mib']['server']} MiB (with children {r['rss_mib']['total']}), "
              f"ready in {r['ready_s']} s, "
              f"body {r['body_bytes_median']} B, "
              f"bound {r['bound']}/{r['cycles']}, plan {r['plan']['status']} "
              f"({r['plan']['solve_seconds']:.2f} s, {r['plan_solves']} solves), "
              f"memo hits {r['memo']['hits']} misses {r['memo']['misses']} "
              f"warmed {r['memo'].get('warmed', 0)}, "
              f"node signatures {r['memo'].get('node_signatures', '?')}, "
              f"load {r['load_before']} -> {r['load_after']}")
        sc = r["scrapes"]
        if sc["n"]:
            print(f"{r['nodes']:>6} /metrics every {sc['every_s']} s during the run: {sc['n']} "
                  f"scrapes of {sc['bytes'] / 1e6:.1f} MB, mean {sc['mean_ms']} ms, "
                  f"max {sc['max_ms']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
