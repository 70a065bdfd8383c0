"""Pods refused just before a node changed in the cache (scheduler/extender/refusals.py): what is
remembered, for how long, and the cache's node-change hook that asks for them."""

from __future__ import annotations

import copy

from prometheus_client import CollectorRegistry
from sched_builders import FakeClock, filter_args, make_cache, node, pod, shared_pod

from gpupack.extender_app import create_extender_app
from scheduler.extender.app import AppConfig
from scheduler.extender.refusals import RecentRefusals
from scheduler.planner.loop import Planner


def test_a_refusal_is_stale_once_for_a_candidate_within_the_window() -> None:
    clock = FakeClock()
    r = RecentRefusals(clock, window_s=10)
    r.refused("ns/a", ("n1", "n2"))
    r.refused("ns/b", ("n3",))
    assert r.stale("n9") == []
    assert r.stale("n2") == ["ns/a"]
    assert r.stale("n1") == []  # woken once
    clock.advance(11)
    assert r.stale("n3") == []  # too old: kube-scheduler saw the change after it


def test_the_cache_calls_its_node_hook_on_a_change_not_on_a_heartbeat() -> None:
    n = node("l40s", gpus=1, shared_replicas=4)
    cache = make_cache([n])
    seen: list[str] = []
    cache.on_node_changed(seen.append)
    cache.upsert_node(copy.deepcopy(n))
    assert seen == []
    more = copy.deepcopy(n)
    more["metadata"]["labels"]["nvidia.com/gpu.memory"] = "49152"
    cache.upsert_node(more)
    assert seen == ["l40s"]


def test_the_filter_remembers_full_refusals_only() -> None:
    n = node("l40s", gpus=1, shared_replicas=4)
    cache = make_cache([n])
    refusals = RecentRefusals()
    app = create_extender_app(cache, Planner(cache), None, CollectorRegistry(),  # type: ignore[arg-type]
                              AppConfig(warm=False), refusals=refusals)
    client = app.test_client()
    fits = shared_pod("small", memory="8Gi", compute="0.25")
    too_big = pod("big", cpu="900")  # more CPU than the node has
    assert client.post("/filter", json=filter_args(fits, ["l40s"])).get_json()["NodeNames"]
    assert not client.post("/filter", json=filter_args(too_big, ["l40s"])).get_json()[
        "NodeNames"]
    unseen = client.post("/filter", json=filter_args(too_big, ["ghost"])).get_json()
    assert unseen["Error"]  # a view behind: an error, not a refusal
    assert refusals.stale("l40s") == ["default/big"]
    assert refusals.stale("ghost") == []
