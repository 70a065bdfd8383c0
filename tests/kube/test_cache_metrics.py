"""The cache's own figures as metrics (``kube.cache_metrics``): what the extender and the
standalone webhook each export from their cache."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, generate_latest

from kube.cache import ClusterCache
from kube.cache_metrics import CacheCollector
from kube.inventory_age import InventoryAge

T0 = 1_700_000_000.0


def h100(name: str, ts: float) -> dict[str, object]:
    inv = json.dumps({"v": 1, "node": name, "ts": int(ts), "gpus": [
        {"i": 0, "uuid": f"GPU-{name}", "model": "NVIDIA-H100-80GB-HBM3", "mem": 81559,
         "used": 0, "mode": "whole", "pods": []}]})
    return {"metadata": {"name": name, "annotations": {"gpupack.io/inventory": inv},
                         "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                    "nvidia.com/gpu.count": "1"}},
            "status": {"allocatable": {"nvidia.com/gpu": "1"}}}


def scrape(cache: ClusterCache) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(CacheCollector(cache))
    out: dict[str, float] = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_before_the_first_list_the_cache_says_it_is_not_synced() -> None:
    figures = scrape(ClusterCache("gpupack"))
    assert figures["gpupack_cache_synced"] == 0.0
    assert figures["gpupack_cache_nodes"] == 0.0


def test_stale_inventories_and_unreadable_objects_are_counted() -> None:
    now = [T0]
    cache = ClusterCache("gpupack", inventory_age=InventoryAge(60), clock=lambda: now[0])
    cache.replace([h100("fresh", T0), h100("old", T0 - 3600),
                   {"metadata": {"name": "bad"}, "status": {"allocatable": {
                       "nvidia.com/gpu": "many"}}}], [])
    cache.mark_synced()
    figures = scrape(cache)
    assert figures["gpupack_cache_synced"] == 1.0
    assert figures["gpupack_node_inventories_stale"] == 1.0
    assert figures["gpupack_cache_bad_objects"] >= 1.0
    assert figures['gpupack_device_plugin_disagreements_total{kind="mig"}'] == 0.0
    now[0] += 61  # the fresh one ages past the limit too
    cache.expire_inventories()
    assert scrape(cache)["gpupack_node_inventories_stale"] == 2.0
