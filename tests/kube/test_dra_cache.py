"""The cache with DRA objects: a node's GPUs from its ResourceSlices, allocated claims
(bound or not) counted as used, assumed allocations, mixed clusters, bad objects, and
the API source's list and watch of resource.k8s.io/v1."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from builders_dra import claim, claim_pod, dra_node, h100_slices, result
from builders_nodes import H100, gpu_node
from fake_apiserver import FakeApiServer

from kube.cache import ClusterCache
from kube.dra_store import CLAIMS, CLASSES, RULES, SLICES
from packing.dra import nvidia
from packing.dra.objects import AllocatedDevice
from packing.model import GpuMode


def make(nodes: list[dict[str, Any]], slices: list[dict[str, Any]],
         claims: list[dict[str, Any]] = (), pods: list[dict[str, Any]] = ()
         ) -> ClusterCache:
    cache = ClusterCache("gpupack")
    cache.replace(nodes, list(pods))
    cache.replace_dra(SLICES, slices)
    cache.replace_dra(CLASSES, nvidia.device_classes())
    cache.replace_dra(CLAIMS, list(claims))
    cache.mark_synced()
    return cache


def gpus(cache: ClusterCache, node: str) -> list[tuple[str, str | None, dict[int, Any]]]:
    return [(g.mode.value, g.whole_owner, dict(g.instances))
            for g in cache.state.nodes[node].gpus]


def test_a_dra_node_gets_its_gpus_from_its_slices_not_its_labels() -> None:
    cache = make([dra_node("d", product=H100)], h100_slices("d", 2))
    assert cache.is_dra_node("d")
    info = cache.state.nodes["d"].info
    assert [(g.index, g.model, g.mode) for g in info.gpus] == [
        (0, "H100-80GB", GpuMode.WHOLE), (1, "H100-80GB", GpuMode.WHOLE)]
    assert cache.state.whole_nodes_free() == 1
    assert cache.snapshot().dra is not None


CASES: list[tuple[str, int, list[dict[str, Any]], list[tuple[str, str | None, dict[int, Any]]]]] = [
    ("whole-gpu", 2, [claim("a", results=[result("d", "gpu-1")])],
     [("whole", None, {}), ("whole", "default/a#dra", {})]),
    ("dynamic-mig-partition", 2,
     [claim("a", klass=nvidia.MIG_CLASS, results=[result("d", "gpu-0-mig-1g10gb-19-2")])],
     [("mig", None, {2: ("1g.10gb", "default/a#dra-gpu-0-mig-1g10gb-19-2")}),
      ("whole", None, {})]),
    ("two-gpus-one-claim", 2,
     [claim("a", count=2, results=[result("d", "gpu-0"), result("d", "gpu-1")])],
     [("whole", "default/a#dra", {}), ("whole", "default/a#dra", {})]),
    ("another-nodes-device", 2, [claim("a", results=[result("other", "gpu-0")])],
     [("whole", None, {}), ("whole", None, {})]),
    ("admin-access-holds-nothing", 1,
     [claim("a", results=[{**result("d", "gpu-0"), "adminAccess": True}])],
     [("whole", None, {})]),
]


@pytest.mark.parametrize(("slices", "claims", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_claims_hold_their_devices(slices: int, claims: list[dict[str, Any]],
                                   expected: list[Any]) -> None:
    # No pod references these claims: allocated and not yet bound counts as used.
    cache = make([dra_node("d")], h100_slices("d", slices), claims)
    assert gpus(cache, "d") == expected


def test_static_mig_and_shared_gpus() -> None:
    static = h100_slices("s", 1, layout=nvidia.Layout.STATIC,
                         mig=[(0, (("3g.40gb", 0), ("1g.10gb", 4)))])
    shared = h100_slices("h", 1, info=nvidia.DriverInfo(consumable_shares="memory"),
                         layout=nvidia.Layout.STATIC)
    c = claim("a", klass=nvidia.MIG_CLASS, results=[result("s", "gpu-0-mig-1g10gb-19-4")])
    share = claim("b", results=[result("h", "gpu-0", share="x", memory="20Gi")])
    cache = make([dra_node("s"), dra_node("h")], static + shared, [c, share])
    owner = "default/a#dra-gpu-0-mig-1g10gb-19-4"
    assert gpus(cache, "s") == [("mig", None, {0: ("3g.40gb", None), 4: ("1g.10gb", owner)})]
    g = cache.state.nodes["h"].gpus[0]
    assert g.info.mode is GpuMode.FRACTIONAL
    ((milli, mib),) = g.shared_owners.values()
    assert mib == 20 * 1024 and milli == -(-1000 * 20 * 1024 // g.info.memory_mib)


def test_a_pod_on_a_dra_node_holds_cpu_and_memory_its_claims_the_gpus() -> None:
    c = claim("a", results=[result("d", "gpu-0")], reserved_for=["p"])
    p = claim_pod("p", claims=["a"], node="d", gpus=1, cpu="4")
    cache = make([dra_node("d")], h100_slices("d", 2), [c], [p])
    _req, placement = cache.counted("default/p")
    assert placement.gpus == () and cache.state.nodes["d"].cpu_free == 64000 - 4000
    assert gpus(cache, "d") == [("whole", "default/a#dra", {}), ("whole", None, {})]


def test_mixed_cluster_device_plugin_nodes_keep_their_gpus() -> None:
    plugin = gpu_node("p", H100, gpus=2, whole=2, hostname=True)
    cache = make([plugin, dra_node("d")], h100_slices("d", 1) + h100_slices("p", 1))
    assert not cache.is_dra_node("p") and cache.is_dra_node("d")
    assert len(cache.state.nodes["p"].gpus) == 2  # its own two, not the one slice
    cache.upsert_pod(claim_pod("w", node="p", gpus=1))
    assert cache.counted("default/w")[1].gpus == (0,)


def test_slices_before_their_node_and_a_node_gone_and_back() -> None:
    cache = make([], h100_slices("d", 2), [claim("a", results=[result("d", "gpu-0")])])
    assert "d" not in cache.state.nodes
    cache.upsert_node(dra_node("d"))
    assert gpus(cache, "d") == [("whole", "default/a#dra", {}), ("whole", None, {})]
    cache.delete_node("d")
    assert "d" not in cache.state.nodes and not cache.is_dra_node("d")
    cache.upsert_node(dra_node("d"))
    assert gpus(cache, "d")[0][1] == "default/a#dra"


def test_a_republished_slice_taints_a_gpu_and_the_model_counts_it_held() -> None:
    taint = {"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    cache = make([dra_node("d")], h100_slices("d", 2))
    tainted = h100_slices("d", 2, info=nvidia.DriverInfo(taints={"gpu-0": [taint]}))
    cache.replace_dra(SLICES, tainted)
    assert gpus(cache, "d")[0][1] == "d/gpu-0#dra-tainted"
    cache.replace_dra(SLICES, h100_slices("d", 2))
    assert gpus(cache, "d")[0][1] is None


def test_a_device_taint_rule_counts_too() -> None:
    cache = make([dra_node("d")], h100_slices("d", 2))
    rule = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": "drain-gpu-1"},
            "spec": {"deviceSelector": {"driver": nvidia.DRIVER, "pool": "d", "device": "gpu-1"},
                     "taint": {"key": "maintenance", "effect": "NoExecute"}}}
    cache.upsert_dra(RULES, rule)
    assert gpus(cache, "d")[1][1] == "d/gpu-1#dra-tainted"
    cache.delete_dra(RULES, "drain-gpu-1")
    assert gpus(cache, "d")[1][1] is None


def test_an_assumed_allocation_counts_until_the_claim_shows_it_and_is_compared() -> None:
    cache = make([dra_node("d")], h100_slices("d", 2), [claim("a")])
    seen: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []
    cache.dra.on_disagreement.append(lambda k, p, a: seen.append((k, p, a)))
    dev = AllocatedDevice("r", nvidia.DRIVER, "d", "gpu-0")
    cache.assume_dra("default/p", {"default/a": (dev,)})
    assert gpus(cache, "d")[0][1] == "default/a#dra"
    cache.upsert_dra(CLAIMS, claim("a", results=[result("d", "gpu-0")]))
    assert cache.dra.agreements == 1 and cache.dra.in_flight == {}
    assert gpus(cache, "d")[0][1] == "default/a#dra"
    # A second pod, predicted on gpu-0 again but allocated gpu-1: counted as a disagreement.
    cache.upsert_dra(CLAIMS, claim("b"))
    cache.assume_dra("default/q", {"default/b": (dev,)})
    cache.upsert_dra(CLAIMS, claim("b", results=[result("d", "gpu-1")]))
    assert cache.dra.disagreements == 1
    assert seen == [("default/b", ("gpu.nvidia.com/d/gpu-0",), ("gpu.nvidia.com/d/gpu-1",))]
    assert gpus(cache, "d")[1][1] == "default/b#dra"


def test_an_assumed_extended_resource_claim_settles_by_its_owner_pod() -> None:
    cache = make([dra_node("d")], h100_slices("d", 2))
    dev = AllocatedDevice("container-0-request-0", nvidia.DRIVER, "d", "gpu-0")
    cache.assume_dra("default/p", {"default/p#extended-resources": (dev,)})
    assert gpus(cache, "d")[0][1] == "default/p#extended-resources#dra"
    made = claim("p-extended-resources-x7k2", owner_pod="p", extended=True,
                 results=[result("d", "gpu-0", "container-0-request-0")])
    cache.upsert_dra(CLAIMS, made)
    assert cache.dra.in_flight == {} and cache.dra.agreements == 1
    assert gpus(cache, "d")[0][1] == "default/p-extended-resources-x7k2#dra"


def test_forget_frees_an_assumed_allocation() -> None:
    cache = make([dra_node("d")], h100_slices("d", 1), [claim("a")])
    cache.assume_dra("default/p", {"default/a": (
        AllocatedDevice("r", nvidia.DRIVER, "d", "gpu-0"),)})
    cache.forget_dra("default/p")
    assert gpus(cache, "d") == [("whole", None, {})]


@pytest.mark.parametrize(("kind", "obj", "field"), [
    (SLICES, {"metadata": {"name": "s"}, "spec": {"driver": 3}}, "spec.pool"),
    (CLAIMS, {"metadata": {"name": "c", "namespace": "x"},
              "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                  "deviceClassName": "gpu.nvidia.com", "count": "many"}}]}}}, "count"),
    (CLASSES, {"metadata": {"name": "k"}, "spec": {"selectors": "no"}}, "selectors"),
])
def test_an_unreadable_object_is_skipped_counted_and_named(
        kind: str, obj: dict[str, Any], field: str, caplog: pytest.LogCaptureFixture) -> None:
    cache = make([dra_node("d")], h100_slices("d", 1))
    before = cache.bad_objects
    assert cache.upsert_dra(kind, obj) is False
    assert cache.bad_objects == before + 1
    assert field in caplog.text
    assert len(cache.state.nodes["d"].gpus) == 1  # the rest still serves


def test_an_unreadable_slice_update_drops_the_slice_and_the_pool_reads_incomplete() -> None:
    slices = h100_slices("d", 2)
    cache = make([dra_node("d")], slices)
    broken = {**slices[1], "spec": {**slices[1]["spec"], "devices": "garbage"}}
    assert cache.upsert_dra(SLICES, broken) is False
    world = cache.dra_world()
    assert world is not None
    from packing.dra.objects import Node
    from packing.dra.parse import parse_resource_claim
    pred = world.predict(Node("d"), [parse_resource_claim(claim("z"))])
    assert pred.verdict.value == "unschedulable"  # the pool misses a slice: offers nothing


# ---- the API source -------------------------------------------------------------------------


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@pytest.fixture
def fake() -> Any:
    server = FakeApiServer().start()
    yield server
    server.stop()


def _source(fake: FakeApiServer) -> tuple[Any, ClusterCache]:
    from kubernetes import client

    from kube.api_source import ApiSource

    cfg = client.Configuration()
    cfg.host = fake.url
    source = ApiSource(client.ApiClient(cfg), watch_timeout_s=2, backoff_initial_s=0.01,
                       backoff_max_s=0.05, watch_dra=True)
    cache = ClusterCache("gpupack")
    source.start(cache, dra=cache)
    return source, cache


def test_the_source_lists_and_watches_dra_objects_before_the_cache_is_synced(
        fake: FakeApiServer) -> None:
    fake.put("nodes", dra_node("d"))
    for s in h100_slices("d", 2):
        fake.put("resourceslices", s)
    for k in nvidia.device_classes():
        fake.put("deviceclasses", k)
    source, cache = _source(fake)
    try:
        wait_for(lambda: cache.synced)
        assert cache.is_dra_node("d") and len(cache.state.nodes["d"].gpus) == 2
        fake.put("resourceclaims", claim("a", results=[result("d", "gpu-1")]))
        wait_for(lambda: cache.state.nodes["d"].gpus[1].whole_owner == "default/a#dra")
        fake.delete("resourceclaims", "default/a")
        wait_for(lambda: cache.state.nodes["d"].gpus[1].whole_owner is None)
    finally:
        source.stop()


def test_a_cluster_without_resource_k8s_io_is_synced_without_dra(fake: FakeApiServer) -> None:
    fake.dra_served = False
    fake.put("nodes", dra_node("d"))
    source, cache = _source(fake)
    try:
        wait_for(lambda: cache.synced)
        assert cache.dra_world() is None and "resourceslices" in source.not_served
    finally:
        source.stop()


def test_a_claim_allocated_on_a_held_gpu_takes_it_when_the_hold_lets_go() -> None:
    from packing.model import Placement, PodRequest, RequestKind

    cache = make([dra_node("d")], h100_slices("d", 1))
    hold = PodRequest("llm/g#reserve-0", kind=RequestKind.WHOLE, gpu_count=1)
    assert cache.hold(hold, Placement(hold.key, "d", (0,))) is None
    # The group's member was bound there: PreBind wrote its claim before the bind swapped
    # the hold for the pod. Neither is displaced; the claim counts without the GPU...
    cache.upsert_dra(CLAIMS, claim("m", results=[result("d", "gpu-0")]))
    assert gpus(cache, "d") == [("whole", "llm/g#reserve-0", {})]
    assert cache.counted("default/m#dra")[1].gpus == ()
    # ... until the hold lets go: then the claim holds the GPU.
    cache.unhold(hold.key)
    assert gpus(cache, "d") == [("whole", "default/m#dra", {})]


def test_a_group_members_bind_after_its_claim_holds_the_gpus_counts_cpu_only() -> None:
    from packing.model import Placement, PodRequest, RequestKind

    pod = claim_pod("m0", claims=["m"])
    cache = make([dra_node("d")], h100_slices("d", 1), pods=[pod])
    hold = PodRequest("default/g#reserve-0", kind=RequestKind.WHOLE, gpu_count=1)
    assert cache.hold(hold, Placement(hold.key, "d", (0,))) is None
    # PreBind wrote the member's claim before the bind swapped the hold for the pod:
    cache.upsert_dra(CLAIMS, claim("m", results=[result("d", "gpu-0")]))
    cache.unhold(hold.key)
    req = PodRequest("default/m0", cpu_milli=1000, memory_mib=1024, kind=RequestKind.WHOLE,
                     gpu_count=1, uid="uid-default-m0")
    cache.assume(req, req.uid, Placement(req.key, "d", (0,)))  # no "GPU 0 is in use"
    assert cache.counted("default/m0")[1].gpus == ()
    assert gpus(cache, "d") == [("whole", "default/m#dra", {})]
