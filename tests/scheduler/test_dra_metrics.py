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


def test_shared_gpus_by_device_and_by_memory() -> None:
    # An L40S node whose GPUs claims share by memory (consumable capacity): GPU 0 holds
    # two shares (12 GiB and 6 GiB), GPU 1 none.
    cache = ClusterCache("gpupack")
    cache.replace([dra_node("s")], [])
    cache.replace_dra(SLICES, nvidia.node_slices(
        "s", [nvidia.GpuSpec(0, "L40S"), nvidia.GpuSpec(1, "L40S")],
        layout=nvidia.Layout.STATIC, info=nvidia.DriverInfo(consumable_shares="memory")))
    cache.replace_dra(CLASSES, nvidia.device_classes())
    cache.replace_dra(CLAIMS, [
        claim("a", results=[result("s", "gpu-0", share="s1", memory="12Gi")]),
        claim("b", results=[result("s", "gpu-0", share="s2", memory="6Gi")])])
    cache.mark_synced()
    registry = CollectorRegistry()
    registry.register(DraCollector(cache, DraVerbs(cache, lambda: None)))  # type: ignore[arg-type]
    got = samples(registry)
    dev = 'gpupack_dra_devices{model="L40S",profile="share",state="%s"}'
    assert got[dev % "used"] == 1 and got[dev % "free"] == 1
    mem = 'gpupack_dra_shared_memory_mib{model="L40S",state="%s"}'
    assert got[mem % "used"] == 18 * 1024
    assert got[mem % "free"] == 2 * 48 * 1024 - 18 * 1024
    # A third share: the node's figures follow (recomputed for its new generation).
    cache.upsert_dra(CLAIMS, claim("c", results=[result("s", "gpu-1", share="s3",
                                                        memory="24Gi")]))
    got = samples(registry)
    assert got[dev % "used"] == 2 and (dev % "free") not in got
    assert got[mem % "used"] == 42 * 1024
