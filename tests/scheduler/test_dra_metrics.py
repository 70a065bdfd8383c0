"""The DRA figures: devices of DRA nodes by profile and state, the participant's verdicts,
and the predictions checked (the cache's)."""

from __future__ import annotations

from builders_dra import claim, dra_node, h100_slices, result
from prometheus_client import CollectorRegistry, generate_latest

from kube.cache import ClusterCache
from kube.cache_metrics import CacheCollector
from kube.dra_store import CLAIMS, CLASSES, SLICES
from packing.dra import nvidia
from packing.dra.objects import AllocatedDevice
from scheduler.dra.metrics import DraCollector
from scheduler.dra.plugin import DraVerbs


def samples(registry: CollectorRegistry) -> dict[str, float]:
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_device_states_and_predictions_checked() -> None:
    cache = ClusterCache("gpupack")
    cache.replace([dra_node("d")], [])
    cache.replace_dra(SLICES, h100_slices("d", 2))
    cache.replace_dra(CLASSES, nvidia.device_classes())
    held = claim("m", klass=nvidia.MIG_CLASS, results=[result("d", "gpu-0-mig-1g10gb-19-0")])
    cache.replace_dra(CLAIMS, [held, claim("w", results=[result("d", "gpu-1")])])
    cache.mark_synced()
    registry = CollectorRegistry()
    registry.register(CacheCollector(cache))
    registry.register(DraCollector(cache, DraVerbs(cache, lambda: None)))  # type: ignore[arg-type]
    got = samples(registry)
    key = 'gpupack_dra_devices{model="H100-80GB",profile="%s",state="%s"}'
    assert got[key % ("1g.10gb", "used")] == 1
    # GPU 1 is held whole: its 7 1g.10gb placements are unavailable; on GPU 0, the
    # placement at start 0 is used and the other six are free.
    assert got[key % ("1g.10gb", "free")] == 6
    assert got[key % ("1g.10gb", "unavailable")] == 7
    assert got[key % ("gpu", "used")] == 1 and got[key % ("gpu", "unavailable")] == 1
    # 7g.80gb covers every memory slice: unavailable on both GPUs.
    assert got[key % ("7g.80gb", "unavailable")] == 2
    assert got["gpupack_dra_nodes"] == 1
    checked = 'gpupack_dra_predictions_checked_total{outcome="%s"}'
    assert got[checked % "agree"] == 0 and got[checked % "disagree"] == 0
    cache.upsert_dra(CLAIMS, claim("x"))
    cache.assume_dra("default/p", {"default/x": (
        AllocatedDevice("r", nvidia.DRIVER, "d", "gpu-0-mig-1g10gb-19-1"),)})
    cache.upsert_dra(CLAIMS, claim("x", klass=nvidia.MIG_CLASS,
                                   results=[result("d", "gpu-0-mig-1g10gb-19-2")]))
    got = samples(registry)
    assert got[checked % "disagree"] == 1 and got[checked % "agree"] == 0
