"""How much a scrape loop moves the extender's filter latency (issue 17: at most 1 ms).

A real ``gpupack serve`` on a generated cluster (bench/extender.py's generator), filter
requests one after another on a kept-alive connection (the pod and ~10% of the node
names, as kube-scheduler sends them), in alternating phases: quiet, then with
``--scrapers`` clients fetching ``/metrics`` in a loop (in a separate process, so the
client's own GIL is not what is measured), for ``--rounds`` rounds. Prints filter
p50/p99 per phase, pooled, and the p99 difference; also how many scrapes were served.

    python bench/scrape_impact.py --nodes 5000 --cycles 1500 --scrapers 4
    python bench/scrape_impact.py --nodes 5000 --port-kind metrics   # the --metrics-port
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def scrape_forever(port: int, clients: int) -> None:
    """The scraper process: ``clients`` threads GET /metrics in a loop until killed."""
    served = [0]

    def loop() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            conn.request("GET", "/metrics")
            conn.getresponse().read()
            served[0] += 1

    for _ in range(clients):
        threading.Thread(target=loop, daemon=True).start()

    def report(signum: int, frame: Any) -> None:
        print(served[0], flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, report)
    while True:
        time.sleep(1)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--cycles", type=int, default=1500, help="filters per phase")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scrapers", type=int, default=4)
    ap.add_argument("--port-kind", choices=["verbs", "metrics"], default="verbs",
                    help="scrape the extender's own port or its --metrics-port")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scrape-only", nargs=2, type=int, metavar=("PORT", "CLIENTS"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.scrape_only:
        scrape_forever(*a.scrape_only)
        return 0
    import extender as ext  # bench/extender.py: this script's folder is on sys.path
    pending = 256
    nodes, pods = ext.gen_cluster(a.nodes, pending, a.seed)
    names = [x["metadata"]["name"] for x in nodes]
    pend = [p for p in pods if not p["spec"].get("nodeName")]
    rng = random.Random(a.seed)
    bodies = [json.dumps({"Pod": pend[i % len(pend)], "Nodes": None,
                          "NodeNames": rng.sample(names, max(1, a.nodes // 10))}).encode()
              for i in range(256)]
    with tempfile.TemporaryDirectory() as d:
        nf, pf = Path(d) / "nodes.json", Path(d) / "pods.json"
        nf.write_text(json.dumps({"kind": "NodeList", "items": nodes}))
        pf.write_text(json.dumps({"kind": "PodList", "items": pods}))
        port, mport = ext._free_port(), ext._free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpupack", "serve", "--port", str(port), "--nodes", str(nf),
             "--pods", str(pf), "--no-planner", "--log-level", "WARNING",
             "--metrics-port", str(mport)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            conn = ext.wait_ready(port, proc, 0.2)
            for i in range(300):  # warm the memo and the connection
                conn.post("/filter", bodies[i % len(bodies)])
            conn.c.request("GET", "/metrics")  # the first scrape computes in the caller
            conn.c.getresponse().read()
            target = port if a.port_kind == "verbs" else mport
            phases: dict[str, list[float]] = {"quiet": [], "scraping": []}
            served = 0
            print(f"{a.nodes} nodes, {a.cycles} filters per phase, {a.scrapers} scrapers on "
                  f"the {a.port_kind} port, load {os.getloadavg()[0]:.2f}")
            for r in range(a.rounds):
                for phase in ("quiet", "scraping"):
                    scrapers = None
                    if phase == "scraping":
                        scrapers = subprocess.Popen(
                            [sys.executable, __file__, "--scrape-only", str(target),
                             str(a.scrapers)], stdout=subprocess.PIPE, text=True)
                        time.sleep(1.0)
                    xs = []
                    for i in range(a.cycles):
                        dt, status, _ = conn.post("/filter", bodies[i % len(bodies)])
                        assert status == 200
                        xs.append(dt)
                    if scrapers is not None:
                        scrapers.terminate()
                        out, _ = scrapers.communicate(timeout=30)
                        served += int(out.strip() or 0)
                    phases[phase] += xs
                    print(f"  round {r + 1} {phase:9s} p50 {pct(xs, 0.5):6.2f} ms  "
                          f"p99 {pct(xs, 0.99):6.2f} ms")
            q, s = phases["quiet"], phases["scraping"]
            print(f"pooled    quiet p50/p99 {pct(q, 0.5):.2f}/{pct(q, 0.99):.2f} ms, "
                  f"scraping {pct(s, 0.5):.2f}/{pct(s, 0.99):.2f} ms; "
                  f"p99 moved {pct(s, 0.99) - pct(q, 0.99):+.2f} ms; {served} scrapes served")
        finally:
            proc.terminate()
            proc.wait(20)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
