"""The live cache believes the node: where the node agent saw a pod wins over gpupack's
record (shares and MIG slices), observed peaks size time-sliced pods, and GPU memory
comes from the node (GFD label, NVML) before the catalog."""

from __future__ import annotations

from typing import Any

import pytest
from sched_builders import L40S, make_cache, node, pod, shared_pod

from kube.cache import ClusterCache
from kube.objects import pod_request
from packing.inventory import GpuInventory, Inventory, PodGpuUsage, encode_inventory
from packing.model import GpuMode, MigInstance, Placement, RequestKind

MIB = 1 << 20
GFD_L40S_MIB = 46_068


def l40s(name: str = "n1", gpus: int = 2, replicas: int = 4,
         memory_label: int | None = GFD_L40S_MIB) -> dict[str, Any]:
    labels = {} if memory_label is None else {"nvidia.com/gpu.memory": str(memory_label)}
    return node(name, L40S, gpus, shared_replicas=replicas, labels=labels)


def with_inventory(obj: dict[str, Any], gpus: list[GpuInventory], ts: int = 1) -> dict[str, Any]:
    inv = Inventory(node=obj["metadata"]["name"], ts=ts, gpus=tuple(gpus))
    obj["metadata"].setdefault("annotations", {})["gpupack.io/inventory"] = encode_inventory(inv)
    return obj


def shared_gpu(index: int, pods: dict[str, tuple[int, int]] | None = None,
               memory: int = GFD_L40S_MIB) -> GpuInventory:
    usage = tuple(PodGpuUsage(p, used, peak) for p, (used, peak) in (pods or {}).items())
    return GpuInventory(index, f"GPU-{index:04d}", "NVIDIA-L40S", memory,
                        sum(u.used_mib for u in usage), GpuMode.SHARED, pods=usage)


def bound_share(name: str, gpu: int, memory: str = "8Gi", node_name: str = "n1"
                ) -> dict[str, Any]:
    """A share gpupack bound and recorded on ``gpu``."""
    return shared_pod(name, memory, compute="0.1", node=node_name,
                      annotations={"gpupack.io/gpus": str(gpu)})


def fits(cache: ClusterCache, pending: dict[str, Any], node_name: str = "n1") -> bool:
    with cache.view():
        return bool(cache.state.options(pod_request(pending), node_name))


# ---- observation wins over the record ----------------------------------------------------


def test_share_counted_where_the_agent_saw_it_and_the_disagreement_counted_once() -> None:
    cache = make_cache([l40s()], [bound_share("a", gpu=0)])
    assert cache.counted("default/a")[1].gpus == (0,)
    seen = [shared_gpu(0), shared_gpu(1, {"default/a": (7000, 7000)})]
    for ts in (1, 2, 3):  # the agent reports the same assignment again and again
        cache.upsert_node(with_inventory(l40s(), seen, ts=ts))
        assert cache.counted("default/a")[1].gpus == (1,)
        assert cache.disagreements == {"shared": 1, "mig": 0}
    with cache.view():
        assert cache.state.gpu("n1", 0).shared_owners == {}
    # A pod update (status, labels) keeps the observed GPU.
    updated = bound_share("a", gpu=0)
    updated["metadata"]["labels"] = {"touched": "yes"}
    cache.upsert_pod(updated)
    assert cache.counted("default/a")[1].gpus == (1,)


def test_agreeing_observation_counts_no_disagreement() -> None:
    cache = make_cache([l40s()], [bound_share("a", gpu=1)])
    cache.upsert_node(with_inventory(l40s(), [shared_gpu(0), shared_gpu(1, {"default/a": (0, 0)})]))
    assert cache.counted("default/a")[1].gpus == (1,)
    assert cache.disagreements == {"shared": 0, "mig": 0}


def test_a_bind_confirmed_after_the_agent_saw_the_pod_elsewhere_moves() -> None:
    cache = make_cache([l40s()], [shared_pod("b", compute="0.1")])
    req = pod_request(shared_pod("b", compute="0.1"))
    option = cache.state.options(req, "n1")[0]
    cache.assume(req, req.uid, option)
    other = 1 - option.gpus[0]
    cache.upsert_node(with_inventory(l40s(), [shared_gpu(other, {"default/b": (100, 100)}),
                                              shared_gpu(option.gpus[0])]))
    cache.upsert_pod(bound_share("b", gpu=option.gpus[0]))
    assert not cache.is_assumed("default/b")
    assert cache.counted("default/b")[1].gpus == (other,)
    assert cache.disagreements["shared"] == 1


H100 = "NVIDIA-H100-80GB-HBM3"


def test_mig_slice_counted_where_the_agent_saw_the_owner() -> None:
    def h100(owner_at: int | None) -> dict[str, Any]:
        obj = node("m1", H100, 1, mig={"3g.40gb": 2})
        mig = tuple(MigInstance("3g.40gb", s, "default/m" if s == owner_at else None)
                    for s in (0, 4))
        gpu = GpuInventory(0, "GPU-h100", H100, 81_559, 0, GpuMode.MIG, mig=mig)
        return with_inventory(obj, [gpu])

    recorded = pod("m", {"nvidia.com/mig-3g.40gb": "1"}, node="m1",
                   annotations={"gpupack.io/gpus": "0", "gpupack.io/mig": "3g.40gb@0"})
    cache = make_cache([h100(None)], [recorded])
    assert cache.counted("default/m")[1].mig_start == 0
    cache.upsert_node(h100(4))
    p = cache.counted("default/m")[1]
    assert (p.gpus, p.mig_profile, p.mig_start) == ((0,), "3g.40gb", 4)
    assert cache.disagreements == {"shared": 0, "mig": 1}
    with cache.view():
        assert cache.state.gpu("m1", 0).instances[0] == ("3g.40gb", None)  # free again


# ---- observed peaks in the live cache ------------------------------------------------------


def test_a_growing_pod_stops_new_shares_landing_beside_it_before_it_runs_out() -> None:
    """The agent's growth series of pod a (its UsageHistory peaks) reaches the cache as
    inventories; the cache counts a at max(declared, peak + 10%), so a new 12Gi share
    stops fitting beside it while a and the share together still fit the GPU."""
    from nodeagent.report import PoolUsage, UsageHistory

    history = UsageHistory()
    cache = make_cache([l40s(gpus=1)], [bound_share("a", gpu=0, memory="12Gi")])
    newcomer = shared_pod("b", "12Gi", compute="0.1")
    assert fits(cache, newcomer)
    refused_at = None
    for step, used_mib in enumerate(range(12_000, 44_001, 2_000)):
        usage = PoolUsage("default/a", 0, "GPU-0000", "GPU-0000", used_mib * MIB,
                          GFD_L40S_MIB * MIB, used_mib * MIB)
        growth = history.update(60.0 * step, [usage])[("default/a", "GPU-0000")]
        peak = growth.peak_bytes // MIB
        assert peak == used_mib  # a rising series: its peak is its latest figure
        seen = [shared_gpu(0, {"default/a": (used_mib, peak)})]
        cache.upsert_node(with_inventory(l40s(gpus=1), seen, ts=step))
        counted = cache.counted("default/a")[0].gpu_memory_mib
        assert counted == max(12 * 1024, -(-peak * 110 // 100))
        if not fits(cache, newcomer):
            refused_at = used_mib
            break
    assert refused_at is not None
    # Refused before a and the newcomer would overfill the GPU in fact.
    assert refused_at + 12 * 1024 <= GFD_L40S_MIB
    # Counting the declared 12Gi alone, it would still have come.
    assert GFD_L40S_MIB >= 12 * 1024 * 2


# ---- GPU memory from the node ----------------------------------------------------------------


@pytest.mark.parametrize(("label", "third_fits"), [(GFD_L40S_MIB, False), (None, True)])
def test_gfd_memory_label_wins_over_the_catalog(label: int | None, third_fits: bool) -> None:
    """Three 16Gi shares fill the catalog's 49,152 MiB L40S exactly; on the 46,068 MiB
    GFD reports the third does not fit."""
    nodes = [l40s(gpus=1, memory_label=label)]
    cache = make_cache(nodes, [bound_share("a", 0, "16Gi"), bound_share("b", 0, "16Gi")])
    with cache.view():
        info = cache.state.nodes["n1"].info.gpus[0]
    assert (info.memory_mib, info.memory_source) == (
        (GFD_L40S_MIB, "gfd") if label else (49_152, "catalog"))
    assert fits(cache, shared_pod("c", "16Gi", compute="0.1")) is third_fits


def test_nvml_memory_wins_over_the_gfd_label() -> None:
    obj = with_inventory(l40s(gpus=1, memory_label=48_000), [shared_gpu(0, memory=45_000)])
    cache = make_cache([obj])
    with cache.view():
        info = cache.state.nodes["n1"].info.gpus[0]
    assert (info.memory_mib, info.memory_source) == (45_000, "nvml")


def test_share_is_booked_on_the_gpu_the_plugin_picks() -> None:
    cache = make_cache([l40s()], [bound_share("big", 0, "30Gi")])
    req = pod_request(shared_pod("small", "8Gi", compute="0.1"))
    with cache.view():
        assert cache.state.options(req, "n1") == [Placement("default/small", "n1", (1,))]
    assert req.kind is RequestKind.SHARED


# ---- metrics ---------------------------------------------------------------------------------


def test_metrics_count_memory_booked_shares_and_show_booked_beside_observed() -> None:
    from prometheus_client import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families

    from scheduler.extender.metrics import ExtenderMetrics
    from scheduler.planner.loop import Planner

    half = f"{GFD_L40S_MIB // 2}Mi"
    no_compute = [pod(n, {"nvidia.com/gpu.shared": "1"}, node="n1",
                      annotations={"gpupack.io/gpu-memory": half, "gpupack.io/gpus": "0"})
                  for n in ("a", "b")]
    cache = make_cache([l40s()], no_compute)
    cache.upsert_node(with_inventory(l40s(), [
        shared_gpu(0, {"default/a": (20_000, 20_000), "default/b": (0, 0)}),
        shared_gpu(1)]))
    metrics = ExtenderMetrics(CollectorRegistry(), cache, Planner(cache), figures_max_age_s=0,
                              scrape_pace_s=0, body_max_age_s=0)
    fams = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}

    def per_gpu(name: str) -> dict[str, float]:
        return {s.labels["gpu"]: s.value for s in fams[name].samples}

    # Shares that ask for no compute but book all the memory: the GPU is full (was 0.0).
    assert per_gpu("gpupack_gpu_allocated") == {"0": 1.0, "1": 0.0}
    assert per_gpu("gpupack_gpu_memory_booked_mib") == {"0": GFD_L40S_MIB, "1": 0}
    assert per_gpu("gpupack_gpu_memory_observed_mib") == {"0": 20_000, "1": 0}
    assert per_gpu("gpupack_gpu_memory_total_mib") == {"0": GFD_L40S_MIB, "1": GFD_L40S_MIB}
    disagreements = {s.labels["kind"]: s.value
                     for s in fams["gpupack_device_plugin_disagreements"].samples
                     if s.name.endswith("_total")}
    assert disagreements == {"shared": 0, "mig": 0}
    # The agent then sees b on GPU 1: it moves, and the counter says so.
    cache.upsert_node(with_inventory(l40s(), [
        shared_gpu(0, {"default/a": (20_000, 20_000)}),
        shared_gpu(1, {"default/b": (5, 5)})], ts=2))
    fams = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    assert per_gpu("gpupack_gpu_memory_booked_mib") == {"0": GFD_L40S_MIB // 2,
                                                        "1": GFD_L40S_MIB // 2}
    assert per_gpu("gpupack_gpu_memory_observed_mib") == {"0": 20_000, "1": 5}
    assert {s.labels["kind"]: s.value for s in fams["gpupack_device_plugin_disagreements"].samples
            if s.name.endswith("_total")} == {"shared": 1, "mig": 0}


# ---- the plugin's policy, per node -------------------------------------------------------


def test_share_policy_label_is_read_and_a_bad_one_is_named() -> None:
    from kube.node_objects import node_info
    from packing.device_plugin import AllocationPolicy

    notes: list[str] = []
    packed = l40s()
    packed["metadata"]["labels"]["gpupack.io/shared-allocation-policy"] = "packed"
    assert node_info(packed, notes).share_policy is AllocationPolicy.PACKED
    odd = l40s()
    odd["metadata"]["labels"]["gpupack.io/shared-allocation-policy"] = "roundrobin"
    assert node_info(odd, notes).share_policy is AllocationPolicy.DISTRIBUTED
    assert notes == ["Node n1: metadata.labels.gpupack.io/shared-allocation-policy: "
                     "'roundrobin' is not one of distributed|packed|spread; distributed "
                     "assumed"]
    assert node_info(l40s()).share_policy is AllocationPolicy.DISTRIBUTED


def test_nodes_alike_but_for_the_plugins_policy_have_other_signatures() -> None:
    packed = l40s("n2")
    packed["metadata"]["labels"]["gpupack.io/shared-allocation-policy"] = "packed"
    cache = make_cache([l40s("n1"), packed, l40s("n3")],
                       [bound_share(n, 0, node_name=f"n{i}") for i, n in
                        ((1, "a"), (2, "b"), (3, "c"))])
    with cache.view():
        sigs = cache.signatures()
        assert sigs["n1"] == sigs["n3"] != sigs["n2"]
        req = pod_request(shared_pod("d", "8Gi", compute="0.1"))
        # distributed: the idle GPU; packed: beside the share already there.
        assert cache.state.options(req, "n1")[0].gpus == (1,)
        assert cache.state.options(req, "n2")[0].gpus == (0,)


def test_a_share_bound_by_someone_else_and_unseen_is_where_the_plugin_put_it() -> None:
    # No record, no observation, no room by memory anywhere: it still holds a replica,
    # and the plugin gave it the GPU with the fewest replicas in use.
    cache = make_cache([l40s()], [bound_share("a", 0, "40Gi"), bound_share("b", 1, "40Gi"),
                                  bound_share("c", 0, "1Gi")])
    other = shared_pod("x", "40Gi", compute="0.1", node="n1")
    cache.upsert_pod(other)
    assert cache.counted("default/x")[1].gpus == (1,)


def guessed_shares() -> tuple[ClusterCache, dict[str, int]]:
    """An L40S node whose agent has not seen its three shares yet: gpupack bound them
    (each assumed, then the bind recorded), so their GPUs are its guesses, counted at
    their worst for later shares. Also the GPU each went to."""
    cache = make_cache([with_inventory(l40s(), [shared_gpu(0), shared_gpu(1)])])
    placed = {}
    for name, memory in (("a", "30Gi"), ("b", "2000Mi"), ("c", "2000Mi")):
        obj = shared_pod(name, memory, compute="0.1")
        cache.upsert_pod(obj)
        req = pod_request(obj)
        with cache.view():
            option = cache.state.options(req, "n1")[0]
        cache.assume(req, req.uid, option)
        placed[name] = option.gpus[0]
        cache.upsert_pod(bound_share(name, option.gpus[0], memory))  # the bind, recorded
    return cache, placed


def test_shares_bound_in_a_burst_count_at_their_worst_until_the_agent_reports() -> None:
    cache, placed = guessed_shares()
    with cache.view():
        # a came under a tie (either GPU); b and c after an unseen guess.
        assert set(cache.state.nodes["n1"].unsure) == {"default/a", "default/b", "default/c"}
    big = shared_pod("d", "20Gi", compute="0.1")
    assert not fits(cache, big)  # it could land beside a, wherever a really is
    # The agent reports: a and c share GPU 1, b is alone on GPU 0 (where d will go).
    cache.upsert_node(with_inventory(l40s(), [
        shared_gpu(0, {"default/b": (100, 100)}),
        shared_gpu(1, {"default/a": (100, 100), "default/c": (100, 100)})]))
    with cache.view():
        assert cache.state.nodes["n1"].unsure == {}
    assert {k: cache.counted(f"default/{k}")[1].gpus for k in placed} == {
        "a": (1,), "b": (0,), "c": (1,)}
    assert fits(cache, big)
    with cache.view():
        assert cache.state.options(pod_request(big), "n1")[0].gpus == (0,)


def test_without_an_agent_the_prediction_is_all_there_is() -> None:
    cache = make_cache([l40s()])
    obj = shared_pod("a", "30Gi", compute="0.1")
    cache.upsert_pod(obj)
    req = pod_request(obj)
    cache.assume(req, req.uid, cache.state.options(req, "n1")[0])
    with cache.view():
        assert cache.state.nodes["n1"].unsure == {}


def test_an_ignored_record_is_logged_once_however_often_the_node_is_recounted(
        caplog: pytest.LogCaptureFixture) -> None:
    # A record naming a GPU the node does not have: ignored (the pod is counted where it
    # can be), said once, not on every recount of the node.
    cache = make_cache([l40s()], [bound_share("a", gpu=7)])
    for ts in (1, 2, 3):
        cache.upsert_node(with_inventory(l40s(), [shared_gpu(0), shared_gpu(1)], ts=ts))
    said = [r for r in caplog.records if "recorded placement" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert "default/a" in said[0].getMessage() and "ignored" in said[0].getMessage()
