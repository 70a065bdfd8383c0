"""gpupack's sum-of-squares price on the real control plane (issue 38, item 2).

The price (``packing/policies/squares.py``) is the one term of the score that reads other
nodes: the scorer holds a copy of the cluster's histogram of GPU free sizes, and the
planner replaces it (a new scorer generation for the verbs) once the histogram the live
cache shows has drifted from it. Here a workload that turns the price on (one-GPU pods
ask 0.67 of the GPU demand, the rest 0.3-GPU shares) is bound through kube-scheduler;
the shares leave time-sliced GPUs partly used, so the planner must replace the held
histogram (``gpupack_scorer_replacements{reason="free_sizes"}``), and the pods created
after the replacement are placed by the new generation.
"""

from __future__ import annotations

from typing import Any

from cluster import (
    GPU,
    SHARED,
    bound_in,
    create_nodes,
    h100_whole,
    l40s_shared,
    pod,
    wait_for,
)
from conftest import Space
from controlplane import SCHEDULER_NAME, Stack, extender_metrics, metric_sample

SHARE = {"gpupack.io/gpu-compute": "0.3", "gpupack.io/gpu-memory": "8Gi"}


def _replacements(stack: Stack, admin: Any, scraper: str) -> float | None:
    fams = extender_metrics(stack, admin, scraper)
    if fams is None:
        return None
    return metric_sample(fams, "gpupack_scorer_replacements", reason="free_sizes")


def test_the_planner_hands_the_verbs_the_clusters_free_sizes(
        stack: Stack, admin: Any, core: Any, space: Space, scraper: str) -> None:
    ns = space.namespace()
    fams = wait_for(lambda: extender_metrics(stack, admin, scraper), 30,
                    "the extender's /metrics")
    before = metric_sample(fams, "gpupack_scorer_replacements", reason="free_sizes")
    assert before is not None
    space.nodes += create_nodes(core, [
        *(h100_whole(f"{space.name}-whole-{i}", space.name) for i in range(2)),
        *(l40s_shared(f"{space.name}-l40s-{i}", space.name) for i in range(3)),
    ])
    # 12 one-GPU pods (12,000 milli) and 20 shares of 300 milli (6,000): w = 0.67, where
    # the sliver price is on and the fresh-GPU rule off, so the sum-of-squares price is
    # (tests/test_squares.py checks that gate on these shapes).
    bodies = [pod(f"w-{i:02d}", pool=space.name, scheduler=SCHEDULER_NAME, limits={GPU: "1"},
                  cpu="100m", memory="256Mi") for i in range(12)]
    bodies += [pod(f"s-{i:02d}", pool=space.name, scheduler=SCHEDULER_NAME,
                   limits={SHARED: "1"}, annotations=SHARE, cpu="100m", memory="256Mi")
               for i in range(20)]
    for b in bodies:
        core.create_namespaced_pod(ns, b)
    where = bound_in(core, ns, len(bodies))
    # Shares only on the time-sliced nodes, one-GPU pods only on the whole-GPU ones.
    for name, node in where.items():
        assert ("-l40s-" in node) is name.startswith("s-"), (name, node)

    # Some time-sliced GPU is left partly used (0.3-GPU shares never fill a GPU), where
    # the scorer held an empty histogram: the planner replaces it.
    def replaced() -> float | None:
        got = _replacements(stack, admin, scraper)
        return got if got is not None and got > before else None

    held = wait_for(replaced, 60, "the planner to replace the held histogram of free sizes")
    # The last shares are placed by a scorer holding it.
    for i in range(20, 24):
        core.create_namespaced_pod(ns, pod(f"s-{i:02d}", pool=space.name,
                                           scheduler=SCHEDULER_NAME, limits={SHARED: "1"},
                                           annotations=SHARE, cpu="100m", memory="256Mi"))
    where = bound_in(core, ns, 36)
    assert all("-l40s-" in where[f"s-{i:02d}"] for i in range(24))
    after = _replacements(stack, admin, scraper)
    assert after is not None and after >= held
