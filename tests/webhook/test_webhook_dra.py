"""The webhook on DRA nodes (docs/dra.md, "The webhook on DRA nodes"): a sized pod gets the
extended resource whose DeviceClass the allocator serves with the smallest device that
holds it (a MIG partition, else a share, else a whole GPU), counted from the
ResourceSlices with the allocator model, beside device-plugin nodes; table-driven over
worlds built by packing.dra.nvidia."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from webhook_builders import cluster, node, pod

from packing.dra import nvidia, served
from packing.dra.allocator import Verdict, allocated_state, predict
from packing.dra.objects import Allocation, DeviceRequest, Node, Request, ResourceClaim
from packing.dra.world import DraWorld, world_from_api
from packing.model import Snapshot
from webhook.admit import admit
from webhook.capacity import ClusterView
from webhook.config import WebhookConfig
from webhook.decide import decide_admission
from webhook.decision import Kind
from webhook.dra_view import dra_view

CFG = WebhookConfig()
MEM = "gpupack.io/gpu-memory"
COMPUTE = "gpupack.io/gpu-compute"
ISO = "gpupack.io/isolation"
CLASS = "gpupack.io/class"
PRODUCT = "nvidia.com/gpu.product"
H100_LABEL = "NVIDIA-H100-80GB-HBM3"
CLASSES = [*nvidia.device_classes(), *served.device_classes()]


def dra_node(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Node whose GPUs are ResourceSlices only: no GPU in its allocatable."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  **(labels or {})}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}


def h100s(n: int = 8) -> list[nvidia.GpuSpec]:
    return [nvidia.GpuSpec(g, "H100-80GB") for g in range(n)]


def l40s(n: int = 4) -> list[nvidia.GpuSpec]:
    return [nvidia.GpuSpec(g, "L40S") for g in range(n)]


def a100_static() -> list[nvidia.GpuSpec]:
    return [nvidia.GpuSpec(0, "A100-40GB", mig_mode=True,
                           static_mig=(("1g.5gb", 0), ("3g.20gb", 4)))]


Publish = tuple[str, Sequence[nvidia.GpuSpec], nvidia.Layout, nvidia.DriverInfo]


def world(*nodes: Publish, claims: Sequence[dict[str, Any]] = (),
          classes: Sequence[dict[str, Any]] = tuple(CLASSES)) -> DraWorld:
    slices = [s for name, gpus, layout, info in nodes
              for s in nvidia.node_slices(name, gpus, layout=layout, info=info)]
    w, errors = world_from_api(slices, classes, claims)
    assert errors == []
    return w


def split(name: str, gpus: Sequence[nvidia.GpuSpec], shares: str = "") -> Publish:
    return (name, gpus, nvidia.Layout.SPLIT, nvidia.DriverInfo(consumable_shares=shares))


def static(name: str, gpus: Sequence[nvidia.GpuSpec], shares: str = "") -> Publish:
    return (name, gpus, nvidia.Layout.STATIC, nvidia.DriverInfo(consumable_shares=shares))


def view(snap: Snapshot, w: DraWorld | None) -> ClusterView:
    return ClusterView.of(snap, dra=w)


H100_DRA = (cluster(dra_node("d0", {PRODUCT: H100_LABEL})), world(split("d0", h100s())))
L40S_SHARES = (cluster(dra_node("s0")), world(split("s0", l40s(), shares="4")))
L40S_PLAIN = (cluster(dra_node("w0")), world(split("w0", l40s())))
A100_STATIC = (cluster(dra_node("a0")), world(static("a0", a100_static())))


@pytest.mark.parametrize(("case", "ann", "kind", "resource"), [
    # DynamicMIG H100: every profile is a device; the smallest that holds the pod.
    (H100_DRA, {MEM: "8Gi"}, Kind.MIG, "nvidia.com/mig-1g.10gb"),
    (H100_DRA, {CLASS: "tts"}, Kind.MIG, "nvidia.com/mig-1g.10gb"),
    (H100_DRA, {CLASS: "asr"}, Kind.MIG, "nvidia.com/mig-1g.10gb"),
    (H100_DRA, {MEM: "12Gi"}, Kind.MIG, "nvidia.com/mig-1g.20gb"),
    (H100_DRA, {MEM: "12Gi", COMPUTE: "0.25"}, Kind.MIG, "nvidia.com/mig-2g.20gb"),
    (H100_DRA, {MEM: "30Gi"}, Kind.MIG, "nvidia.com/mig-3g.40gb"),
    (H100_DRA, {MEM: "30Gi", COMPUTE: "0.5"}, Kind.MIG, "nvidia.com/mig-4g.40gb"),
    (H100_DRA, {MEM: "60Gi"}, Kind.MIG, "nvidia.com/mig-7g.80gb"),
    (H100_DRA, {MEM: "8Gi", ISO: "mig"}, Kind.MIG, "nvidia.com/mig-1g.10gb"),
    # Static MIG (the driver's default): only the instances that exist.
    (A100_STATIC, {MEM: "4Gi"}, Kind.MIG, "nvidia.com/mig-1g.5gb"),
    (A100_STATIC, {MEM: "8Gi"}, Kind.MIG, "nvidia.com/mig-3g.20gb"),
    # No MIG: a share where the driver publishes shareable GPUs (ConsumableShares) ...
    (L40S_SHARES, {MEM: "8Gi"}, Kind.SHARED, "nvidia.com/gpu.shared"),
    (L40S_SHARES, {MEM: "8Gi", ISO: "shared"}, Kind.SHARED, "nvidia.com/gpu.shared"),
    # ... else a whole GPU.
    (L40S_PLAIN, {MEM: "8Gi"}, Kind.GPU, "nvidia.com/gpu"),
    (L40S_PLAIN, {CLASS: "asr"}, Kind.GPU, "nvidia.com/gpu"),
])
def test_size_to_request(case: tuple[Snapshot, DraWorld], ann: dict[str, str], kind: Kind,
                         resource: str) -> None:
    snap, w = case
    d = decide_admission(pod(annotations=ann), view(snap, w), CFG)
    assert (d.kind, d.resource) == (kind, resource), d.reason
    assert d.status_code == 0


@pytest.mark.parametrize(("case", "ann", "words"), [
    (H100_DRA, {MEM: "200Gi"}, "is more than any GPU in the cluster has: the largest is "
                               "H100-80GB"),
    (L40S_PLAIN, {MEM: "8Gi", ISO: "mig"}, "gpupack.io/isolation=mig, but no MIG slice"),
    (L40S_PLAIN, {MEM: "8Gi", ISO: "shared"}, "gpupack.io/isolation=shared, but no "
                                              "time-sliced GPU"),
    (L40S_PLAIN, {MEM: "60Gi"}, "is more than any GPU in the cluster has"),
])
def test_nothing_holds_it(case: tuple[Snapshot, DraWorld], ann: dict[str, str],
                          words: str) -> None:
    snap, w = case
    d = decide_admission(pod(annotations=ann), view(snap, w), CFG)
    assert d.kind is Kind.DENY and d.status_code == 403
    assert words in d.reason, d.reason


@pytest.mark.parametrize(("ann", "field"), [
    ({MEM: "lots"}, "metadata.annotations.gpupack.io/gpu-memory: 'lots' is not a quantity"),
    ({MEM: "-1Gi"}, "metadata.annotations.gpupack.io/gpu-memory"),
    ({MEM: "8Gi", COMPUTE: "2"}, "metadata.annotations.gpupack.io/gpu-compute"),
    ({MEM: "8Gi", ISO: "vm"}, "metadata.annotations.gpupack.io/isolation: 'vm'"),
    ({CLASS: "video"}, "metadata.annotations.gpupack.io/class: 'video'"),
])
def test_bad_input_is_denied_naming_the_field(ann: dict[str, str], field: str) -> None:
    snap, w = H100_DRA
    d = decide_admission(pod(annotations=ann), view(snap, w), CFG)
    assert d.kind is Kind.DENY and d.status_code == 400
    assert field in d.reason, d.reason


def test_the_patch_pins_the_product_only_where_every_node_is_labelled() -> None:
    snap, w = H100_DRA
    a = admit(pod(annotations={MEM: "8Gi"}), view(snap, w), CFG)
    limits = a.result["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-1g.10gb": "1"}
    assert a.result["spec"]["schedulerName"] == "gpupack"
    terms = a.result["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": PRODUCT, "operator": "In", "values": [H100_LABEL]}]}]
    # A DRA node without GPU Feature Discovery's label: a pin would keep the pod off it.
    unlabelled = admit(pod(annotations={MEM: "8Gi"}),
                       view(cluster(dra_node("d0")), world(split("d0", h100s()))), CFG)
    assert unlabelled.decision.kind is Kind.MIG
    assert "affinity" not in unlabelled.result["spec"]


def test_every_kind_goes_to_gpupacks_scheduler() -> None:
    for snap, w in (H100_DRA, L40S_SHARES, L40S_PLAIN):
        a = admit(pod(annotations={MEM: "8Gi"}), view(snap, w), CFG)
        assert a.result["spec"]["schedulerName"] == "gpupack", a.decision.kind


def test_reinvocation_keeps_each_kind() -> None:
    for snap, w in (H100_DRA, L40S_SHARES, L40S_PLAIN):
        v = view(snap, w)
        first = admit(pod(annotations={MEM: "8Gi"}), v, CFG, admission_id="a1")
        again = admit(first.result, v, CFG, admission_id="a1", live={"a1"})
        assert again.decision.reused and again.patch == (), again.decision.reason
        assert again.decision.kind is first.decision.kind


def test_counts_and_reasons_come_from_the_allocator() -> None:
    """One H100 of a DRA node, 1g.10gb at slice 0 held by a claim: six left; the
    reason counts them, and a burst of seven (each claimed as the webhook records it)
    leaves the seventh waiting for one."""
    held = {"metadata": {"name": "held", "namespace": "ns"}, "spec": {"devices": {
        "requests": [{"name": "r", "exactly": {"deviceClassName": "gpupack-mig-1g.10gb"}}]}},
        "status": {"allocation": {"devices": {"results": [{
            "request": "r", "driver": nvidia.DRIVER, "pool": "d0",
            "device": "gpu-0-mig-1g10gb-19-0"}]}}}}
    w = world(split("d0", h100s(1)), claims=[held])
    v = view(cluster(dra_node("d0")), w)
    d = decide_admission(pod(annotations={MEM: "8Gi"}), v, CFG)
    assert d.kind is Kind.MIG and "6 free on H100-80GB" in d.reason, d.reason
    for _ in range(6):
        d = decide_admission(pod(annotations={MEM: "8Gi"}), v, CFG)
        assert "free on" in d.reason, d.reason
        claim = d.claim()
        assert claim is not None
        v = v.with_claims([claim])
    d = decide_admission(pod(annotations={MEM: "8Gi"}), v, CFG)
    assert d.kind is Kind.MIG and d.profile == "1g.10gb"
    assert "none free now on H100-80GB, the pod waits for one" in d.reason, d.reason


def test_whole_gpu_burst_then_wait() -> None:
    v = view(*L40S_PLAIN)
    for i in range(4):
        d = decide_admission(pod(annotations={MEM: "8Gi"}), v, CFG)
        assert d.kind is Kind.GPU and f"{4 - i} free now" in d.reason, d.reason
        claim = d.claim()
        assert claim is not None
        v = v.with_claims([claim])
    d = decide_admission(pod(annotations={MEM: "8Gi"}), v, CFG)
    assert d.kind is Kind.GPU and "none free now, the pod waits" in d.reason


def test_shares_count_what_the_driver_allows() -> None:
    """ConsumableShares=2 on one L40S: two shares, then the pod waits (no whole-GPU
    fallback while a share may free)."""
    v = view(cluster(dra_node("s0")), world(split("s0", l40s(1), shares="2")))
    for _ in range(2):
        d = decide_admission(pod(annotations={MEM: "8Gi"}), v, CFG)
        assert d.kind is Kind.SHARED and "1 GPU(s) with room now" in d.reason, d.reason
        claim = d.claim()
        assert claim is not None
        v = v.with_claims([claim])
    d = decide_admission(pod(annotations={MEM: "8Gi"}), v, CFG)
    assert d.kind is Kind.SHARED and "no room now, the pod waits" in d.reason, d.reason


def test_mixed_cluster_counts_both_kinds_of_node() -> None:
    """Device-plugin MIG node (two free 1g.10gb) beside a DRA H100: the same resource
    serves on both, and the counts add up; a pod restricted to one pool counts only its
    own, and the denial names the field that keeps the others out."""
    snap = cluster(node("dp", mig={"1g.10gb": 2}, labels={"pool": "dp"}),
                   dra_node("d0", {PRODUCT: H100_LABEL, "pool": "dra"}))
    w = world(split("d0", h100s(1)))
    v = view(snap, w)
    d = decide_admission(pod(annotations={MEM: "8Gi"}), v, CFG)
    assert d.resource == "nvidia.com/mig-1g.10gb" and "9 free on H100-80GB" in d.reason
    only_dra = decide_admission(pod(annotations={MEM: "8Gi"},
                                    spec={"nodeSelector": {"pool": "dra"}}), v, CFG)
    assert "7 free on H100-80GB" in only_dra.reason, only_dra.reason
    only_dp = decide_admission(pod(annotations={MEM: "8Gi"},
                                   spec={"nodeSelector": {"pool": "dp"}}), v, CFG)
    assert "2 free on H100-80GB" in only_dp.reason, only_dp.reason
    # 30Gi: the device-plugin node has no 3g.40gb and may not make one; the DRA node does.
    big = decide_admission(pod(annotations={MEM: "30Gi"},
                               spec={"nodeSelector": {"pool": "dp"}}), v, CFG)
    assert big.kind is Kind.DENY and "no MIG slice" in big.reason, big.reason
    anywhere = decide_admission(pod(annotations={MEM: "30Gi"}), v, CFG)
    assert anywhere.resource == "nvidia.com/mig-3g.40gb", anywhere.reason
    nowhere = decide_admission(pod(annotations={MEM: "8Gi"},
                                   spec={"nodeSelector": {"pool": "none"}}), v, CFG)
    assert "spec.nodeSelector.pool=none: no node in reach has a GPU" in nowhere.reason
    assert "H100-80GB: spec.nodeSelector.pool=none" in nowhere.reason


def test_taints_on_dra_nodes_keep_pods_out_unless_tolerated() -> None:
    tainted = dra_node("d0")
    tainted["spec"] = {"taints": [{"key": "dedicated", "value": "asr", "effect": "NoSchedule"}]}
    snap = cluster(tainted, dra_node("w0"))
    w = world(split("d0", h100s(1)), split("w0", l40s(1)))
    v = view(snap, w)
    plain = decide_admission(pod(annotations={MEM: "8Gi"}), v, CFG)
    assert plain.kind is Kind.GPU, plain.reason  # the L40S: the H100 is out of reach
    tolerant = decide_admission(pod(annotations={MEM: "8Gi"}, spec={"tolerations": [
        {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]}), v, CFG)
    assert tolerant.kind is Kind.MIG, tolerant.reason


def test_pending_pods_take_their_devices() -> None:
    """Pods the webhook converted that wait for the scheduler count against the DRA
    node's free devices, as on device-plugin nodes."""
    waiting = [pod(f"w{i}", annotations={MEM: "30Gi"}, containers=[{
        "name": "main", "image": "x",
        "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}],
        spec={"schedulerName": "gpupack"}) for i in range(2)]
    snap = cluster(dra_node("d0"), pods=waiting)
    v = view(snap, world(split("d0", h100s(1))))
    d = decide_admission(pod(annotations={MEM: "30Gi"}), v, CFG)
    assert "none free now" in d.reason, d.reason


def test_without_the_charts_classes_dra_serves_whole_gpus_only() -> None:
    """With gpupack's DeviceClasses off (only the NVIDIA driver's), no MIG resource is
    served by DRA: a DynamicMIG H100 offers a small pod its whole GPU."""
    w = world(split("d0", h100s(1)), classes=nvidia.device_classes())
    d = decide_admission(pod(annotations={MEM: "8Gi"}), view(cluster(dra_node("d0")), w), CFG)
    assert d.kind is Kind.GPU, d.reason


def test_the_view_agrees_with_the_allocator() -> None:
    """Each count of the view is what predict() gives, claim after claim."""
    w = world(split("d0", h100s(2)), static("a0", a100_static()),
              split("s0", l40s(2), shares="3"))
    nodes = cluster(dra_node("d0"), dra_node("a0"), dra_node("s0"))
    infos = {n.name: n for n in nodes.nodes}
    dv = dra_view(w, infos, "nvidia.com/gpu.shared")
    assert set(dv.nodes) == {"d0", "a0", "s0"}
    for name, dn in dv.nodes.items():
        for model, offer in dn.models.items():
            for profile, free in offer.mig_free.items():
                assert free == _burst(w, name, served.mig_class_name(profile)), (name, profile)
            assert offer.whole_free == _burst(w, name, nvidia.GPU_CLASS), name
            shares = sum(k[2] * n for k, n in offer.shared_room.items())
            assert shares == _burst(w, name, served.SHARED_CLASS), name
            assert model in ("H100-80GB", "A100-40GB", "L40S")
    assert dv.nodes["d0"].models["H100-80GB"].mig_free["1g.10gb"] == 14
    assert dv.nodes["s0"].models["L40S"].shared_room == {(49152, 1000, 3): 2}


def _burst(w: DraWorld, node: str, klass: str) -> int:
    held = list(w.claims.values())
    n = 0
    while n < 200:
        p = predict(Node(node), w.slices, w.classes, allocated_state(held), [ResourceClaim(
            "ns", f"c{n}", requests=(DeviceRequest("r", exactly=Request("r", klass)),))])
        if p.verdict is not Verdict.ALLOCATED:
            return n
        held.append(ResourceClaim("ns", f"h{n}", allocation=Allocation(p.results[0])))
        n += 1
    return n


def test_claims_on_a_dra_gpu_take_the_memory_slices_other_profiles_share() -> None:
    """DynamicMIG: every profile is a device over shared memory slices. Four 1g.10gb
    claims land on slices 0-3 (the allocator's first fits), which leaves the 3g.40gb at
    slice 4 and no 4g.40gb; seven leave no 1g.20gb either, so a 12Gi pod waits for its
    own smallest profile instead of being offered a 1g.20gb that no longer exists."""
    v = view(cluster(dra_node("d0")), world(split("d0", h100s(1))))
    for _ in range(4):
        d = decide_admission(pod(annotations={MEM: "8Gi"}), v, CFG)
        claim = d.claim()
        assert claim is not None
        v = v.with_claims([claim])
    h100 = v.models["H100-80GB"]
    assert h100.mig_free.get("3g.40gb") == 1 and not h100.mig_free.get("4g.40gb")
    assert h100.mig_free.get("1g.20gb") == 2  # slices 4-5 and 6-7
    for _ in range(3):
        claim = decide_admission(pod(annotations={MEM: "8Gi"}), v, CFG).claim()
        assert claim is not None
        v = v.with_claims([claim])
    d = decide_admission(pod(annotations={MEM: "12Gi"}), v, CFG)
    assert d.profile == "1g.20gb" and "none free now" in d.reason, d.reason


def test_a_claim_lands_only_on_a_node_it_may_reach() -> None:
    snap = cluster(dra_node("d0", {"pool": "a"}), dra_node("d1", {"pool": "b"}))
    v = view(snap, world(split("d0", h100s(1)), split("d1", h100s(1))))
    b = pod(annotations={MEM: "60Gi"}, spec={"nodeSelector": {"pool": "b"}})
    d = decide_admission(b, v, CFG)
    claim = d.claim()
    assert d.profile == "7g.80gb" and claim is not None and claim.reach == {"d1"}
    v = v.with_claims([claim])
    # pool a's GPU is untouched; pool b's is gone
    again_b = decide_admission(b, v, CFG)
    assert "none free now" in again_b.reason, again_b.reason
    a = decide_admission(pod(annotations={MEM: "60Gi"}, spec={"nodeSelector": {"pool": "a"}}),
                         v, CFG)
    assert "1 free on H100-80GB" in a.reason, a.reason
