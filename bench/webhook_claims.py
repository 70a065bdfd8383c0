"""What the webhook's in-flight claims cost per review (issue #18 item 4).

Between two refreshes of the webhook's cluster view, each admission's claim
(webhook.claims) is taken out of the view's free counts before the next decision. This
times, on the cluster of ``bench/webhook.py`` (default 5,000 nodes), one review's
``claims -> view -> admit`` step with N claims live, two ways:

- ``full``: every live claim applied to the view again for each review;
- ``incremental``: :class:`webhook.claims.ClaimedView`, as the app does: only the claims
  added since the last review (the view object unchanged).

Run: ``python bench/webhook_claims.py [--nodes 5000] [--claims 0 100 1000 4000]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

# Run as a script, this file's directory comes first on sys.path, where bench/webhook.py
# would shadow the ``webhook`` package; it is loaded by path instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))
_spec = importlib.util.spec_from_file_location("bench_webhook", _HERE / "webhook.py")
assert _spec is not None and _spec.loader is not None
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
cluster_objects, workload = _bench.cluster_objects, _bench.workload

from kube.snapshot import build_snapshot  # noqa: E402
from webhook.admit import admit  # noqa: E402
from webhook.capacity import ClusterView  # noqa: E402
from webhook.claims import ClaimBook, ClaimedView  # noqa: E402
from webhook.config import WebhookConfig  # noqa: E402


def run(nodes: int, counts: list[int], reviews: int) -> None:
    objs, running = cluster_objects(nodes)
    view = ClusterView.of(build_snapshot(objs, running).snapshot)
    cfg = WebhookConfig()
    pods = workload()
    print(f"{nodes} nodes; ms per review (claims live -> view -> admit), median / p99")
    print(f"{'claims':>7} {'full':>16} {'incremental':>16}")
    for n in counts:
        row = []
        for mode in ("full", "incremental"):
            book = ClaimBook(ttl_s=1e9, max_claims=max(n + reviews, 1))
            for i in range(n):  # claims made before the measured reviews
                d = admit(pods[i % len(pods)], view, cfg).decision
                c = d.claim()
                if c is not None:
                    book.add(f"pre-{i}", c)
            claimed = ClaimedView()
            claimed.get(view, book.live_items(view.seen))
            times = []
            for i in range(reviews):
                start = time.perf_counter()
                live = book.live_items(view.seen)
                v = (claimed.get(view, live) if mode == "incremental"
                     else view.with_claims(c for _, c in live))
                d = admit(pods[i % len(pods)], v, cfg).decision
                c = d.claim()
                if c is not None:
                    book.add(f"r-{i}", c)
                times.append((time.perf_counter() - start) * 1000)
            times.sort()
            row.append(f"{statistics.median(times):7.2f} / {times[int(len(times) * .99)]:6.2f}")
        print(f"{n:>7} {row[0]:>16} {row[1]:>16}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--claims", type=int, nargs="+", default=[0, 100, 1000, 4000])
    p.add_argument("--reviews", type=int, default=200)
    a = p.parse_args()
    run(a.nodes, a.claims, a.reviews)
    return 0


if __name__ == "__main__":
    sys.exit(main())
