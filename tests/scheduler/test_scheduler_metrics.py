"""The extender's /metrics body: the per-GPU family rendered per node and cached by node
generation must read exactly like prometheus_client's own rendering, and a scrape must
re-render only the nodes that changed."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from sched_builders import FakeClock, make_cache, mig_pod, node, shared_pod, whole_pod

from scheduler.extender.metrics import Exposition, ExtenderMetrics, Refreshed
from scheduler.planner.loop import Planner


def families(body: bytes) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def rig(figures_max_age_s: float = 0.0) -> tuple[Any, ExtenderMetrics]:
    """The cache and its metrics; everything rendered at each scrape unless
    ``figures_max_age_s`` (then with the production pacing and body reuse)."""
    cache = make_cache(
        [node("w", gpus=2, reconfigurable=False),
         node("m", gpus=1, mig={"3g.40gb": 2}),
         node("s", product="NVIDIA-L40S", gpus=2, shared_replicas=4),
         node('odd"name', gpus=1)],
        [], FakeClock())
    cached = figures_max_age_s > 0
    metrics = ExtenderMetrics(CollectorRegistry(), cache, Planner(cache),
                              figures_max_age_s=figures_max_age_s,
                              scrape_pace_s=0.01 if cached else 0.0,
                              body_max_age_s=1.0 if cached else 0.0)
    return cache, metrics


def samples(body: bytes) -> dict[tuple[str, str], float]:
    fam = families(body)["gpupack_gpu_allocated"]
    assert fam.type == "gauge"
    return {(s.labels["node"], s.labels["gpu"]): s.value for s in fam.samples}


def place(cache: Any, pod: dict[str, Any], node_name: str) -> None:
    cache.upsert_pod(pod)
    req = cache.pending_pod(f"default/{pod['metadata']['name']}")
    cache.assume(req, req.uid, cache.state.options(req, node_name)[0])


def test_every_gpu_has_one_series_with_its_allocated_share() -> None:
    cache, metrics = rig()
    place(cache, whole_pod("a", 1), "w")
    place(cache, mig_pod("b", "3g.40gb"), "m")
    place(cache, shared_pod("c"), "s")
    got = samples(metrics.exposition())
    with cache.lock:
        want = {(name, str(g.info.index)): g.used_milli / 1000
                for name, n in cache.state.nodes.items() for g in n.gpus}
    assert got == want
    assert got[("w", "0")] == 1.0 and got[("w", "1")] == 0.0
    assert 0 < got[("m", "0")] < 1 and 0 < got[("s", "0")] < 1
    assert ('odd"name', "0") in got  # label values are escaped, the text still parses


def test_cluster_figures_come_from_the_same_rows() -> None:
    cache, metrics = rig()
    place(cache, whole_pod("a", 1), "w")
    place(cache, mig_pod("b", "3g.40gb"), "m")
    fams = families(metrics.exposition())
    with cache.lock:
        assert fams["gpupack_whole_gpus_free"].samples[0].value == cache.state.whole_gpus_free()
        assert fams["gpupack_whole_nodes_free"].samples[0].value == cache.state.whole_nodes_free()
    mig = {(s.labels["profile"], s.labels["state"]): s.value
           for s in fams["gpupack_mig_instances"].samples}
    assert mig == {("3g.40gb", "used"): 1.0, ("3g.40gb", "free"): 1.0}


def test_a_scrape_renders_only_the_nodes_that_changed() -> None:
    cache, metrics = rig()
    rows = metrics.gpu_rows
    metrics.exposition()
    first = rows.rendered
    assert first == 4
    metrics.exposition()
    assert rows.rendered == first  # nothing changed: nothing re-rendered
    place(cache, whole_pod("a", 1), "w")
    body = metrics.exposition()
    assert rows.rendered == first + 1 and samples(body)[("w", "0")] == 1.0
    cache.delete_node("s")
    assert all(n != "s" for n, _ in samples(metrics.exposition()))
    cache.upsert_node(node("s", gpus=1))  # same name, new node: a new generation
    assert samples(metrics.exposition())[("s", "0")] == 0.0


def test_a_scrape_loop_computes_the_cluster_figures_once_per_max_age() -> None:
    cache, metrics = rig(figures_max_age_s=60.0)
    rows = metrics.gpu_rows
    metrics.exposition()  # the first scrape computes in the caller
    computed, rendered = metrics.cluster.cluster.computed, rows.rendered
    place(cache, whole_pod("a", 1), "w")
    metrics.requests.labels("filter", "ok").inc()
    for _ in range(100):  # scrapers in a loop, say
        body = metrics.exposition()
    # No computation on the request path: the figures are the first scrape's...
    assert metrics.cluster.cluster.computed == computed and rows.rendered == rendered
    assert samples(body)[("w", "0")] == 0.0
    # ...and the body is rendered again only once it is a second old, with the request
    # counters as they are then.
    assert metrics.exposition.rendered <= 2
    time.sleep(1.0)
    fams = families(metrics.exposition())
    assert any(s.labels.get("verb") == "filter" and s.labels.get("outcome") == "ok"
               and s.value == 1.0 for s in fams["gpupack_extender_requests"].samples)


def test_stale_figures_are_recomputed_in_the_background_only_while_scraped() -> None:
    now = [0.0]
    calls: list[float] = []

    def compute() -> int:
        calls.append(now[0])
        return len(calls)

    figures = Refreshed(compute, max_age_s=5.0, keep_s=30.0, clock=lambda: now[0])
    assert figures.get() == 1  # first: in the caller
    now[0] = 4.0
    assert figures.get() == 1 and len(calls) == 1  # fresh enough
    now[0] = 6.0
    assert figures.get() == 1  # stale: answered at once with the old figures...
    deadline = time.monotonic() + 5
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(calls) == 2 and figures.get() == 2  # ...and recomputed off the request path
    now[0] = 100.0  # nobody scraped for longer than keep_s: the thread does nothing
    figures._wake.set()
    time.sleep(0.2)
    assert len(calls) == 2


def test_scrapes_are_paced_and_share_a_recent_body() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(dt: float) -> None:
        slept.append(dt)
        now[0] += dt

    _, metrics = rig()
    expo = Exposition(metrics.exposition.registry, metrics.gpu_rows, pace_s=0.2,
                      body_max_age_s=1.0, clock=lambda: now[0], sleep=sleep)
    bodies = [expo() for _ in range(10)]  # a client in a loop
    assert slept == [pytest.approx(0.2)] * 9  # one answer per 0.2 s, whatever the rate
    assert expo.rendered == 2 and len(set(bodies)) <= 2  # rendered at t=0 and t=1.0
    now[0] += 5.0
    expo()  # after a pause: served at once, rendered anew
    assert len(slept) == 9 and expo.rendered == 3
