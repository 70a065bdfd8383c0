"""Decisions against clusters of different GPU models, table-driven."""

from __future__ import annotations

from typing import Any

import pytest
from webhook_builders import cluster, dynamic, node, pod

from packing.model import Snapshot
from webhook.admit import admit
from webhook.capacity import ClusterView
from webhook.config import ClassDefault, WebhookConfig
from webhook.decide import decide_admission
from webhook.decision import Kind

CFG = WebhookConfig()
H100 = dynamic(node("h0"), node("h1"))
A100 = dynamic(node("a0", "A100-40GB"))
L40S = cluster(node("s0", "L40S", 4, "shared"))
MIXED = dynamic(node("a0", "A100-40GB"), node("h0"), node("s0", "L40S", 4, "shared"))
L4_L40S = cluster(node("l4", "L4", 4, "shared"), node("s0", "L40S", 4, "shared"))
WHOLE_ONLY = cluster(node("w0", "L40S", 8, "whole"))
CPU_ONLY = cluster(
    {"metadata": {"name": "cpu"}, "status": {"allocatable": {"cpu": "8", "memory": "8Gi"}}}
)
MEM = "gpupack.io/gpu-memory"
COMPUTE = "gpupack.io/gpu-compute"
ISO = "gpupack.io/isolation"
CLASS = "gpupack.io/class"


@pytest.mark.parametrize(
    ("snap", "ann", "kind", "resource", "models"),
    [
        (H100, {MEM: "5Gi"}, Kind.MIG, "nvidia.com/mig-1g.10gb", ("H100-80GB",)),
        (H100, {MEM: "9Gi"}, Kind.MIG, "nvidia.com/mig-1g.10gb", ("H100-80GB",)),
        (H100, {MEM: "12Gi"}, Kind.MIG, "nvidia.com/mig-1g.20gb", ("H100-80GB",)),
        (H100, {MEM: "8Gi", COMPUTE: "0.25"}, Kind.MIG, "nvidia.com/mig-2g.20gb", ("H100-80GB",)),
        (H100, {MEM: "30Gi"}, Kind.MIG, "nvidia.com/mig-3g.40gb", ("H100-80GB",)),
        (H100, {MEM: "30Gi", COMPUTE: "0.5"}, Kind.MIG, "nvidia.com/mig-4g.40gb", ("H100-80GB",)),
        (H100, {MEM: "60Gi"}, Kind.MIG, "nvidia.com/mig-7g.80gb", ("H100-80GB",)),
        (A100, {MEM: "5Gi"}, Kind.MIG, "nvidia.com/mig-1g.5gb", ("A100-40GB",)),
        (A100, {MEM: "8Gi", COMPUTE: "0.25"}, Kind.MIG, "nvidia.com/mig-2g.10gb", ("A100-40GB",)),
        (A100, {MEM: "8Gi"}, Kind.MIG, "nvidia.com/mig-1g.10gb", ("A100-40GB",)),
        (L40S, {MEM: "5Gi"}, Kind.SHARED, "nvidia.com/gpu.shared", ("L40S",)),
        (L40S, {MEM: "40Gi", ISO: "shared"}, Kind.SHARED, "nvidia.com/gpu.shared", ("L40S",)),
        # Mixed: least waste wins (A100 1g.5gb holds 5Gi exactly), then the same slice name
        # on every model it is the smallest fit of (A100-40GB 1g.10gb = H100 1g.10gb).
        (MIXED, {MEM: "5Gi"}, Kind.MIG, "nvidia.com/mig-1g.5gb", ("A100-40GB",)),
        (MIXED, {MEM: "8Gi"}, Kind.MIG, "nvidia.com/mig-1g.10gb", ("A100-40GB", "H100-80GB")),
        (MIXED, {MEM: "30Gi"}, Kind.MIG, "nvidia.com/mig-3g.40gb", ("H100-80GB",)),
        (MIXED, {MEM: "5Gi", ISO: "shared"}, Kind.SHARED, "nvidia.com/gpu.shared", ("L40S",)),
        (MIXED, {MEM: "5Gi", ISO: "mig"}, Kind.MIG, "nvidia.com/mig-1g.5gb", ("A100-40GB",)),
        # Only the shared GPUs with enough memory are pinned.
        (L4_L40S, {MEM: "30Gi"}, Kind.SHARED, "nvidia.com/gpu.shared", ("L40S",)),
        (L4_L40S, {MEM: "8Gi"}, Kind.SHARED, "nvidia.com/gpu.shared", ("L4", "L40S")),
        # Class without memory: per-class defaults (asr 8Gi, tts 4Gi).
        (H100, {CLASS: "asr"}, Kind.MIG, "nvidia.com/mig-1g.10gb", ("H100-80GB",)),
        (A100, {CLASS: "tts"}, Kind.MIG, "nvidia.com/mig-1g.5gb", ("A100-40GB",)),
        (L40S, {CLASS: "small"}, Kind.SHARED, "nvidia.com/gpu.shared", ("L40S",)),
    ],
)
def test_small_pod_decisions(snap: Any, ann: dict[str, str], kind: Kind, resource: str,
                             models: tuple[str, ...]) -> None:
    d = decide_admission(pod(annotations=ann), snap, CFG)
    assert (d.kind, d.resource, d.models) == (kind, resource, models), d.reason
    assert d.products  # pinned to the product label values of those models
    assert d.container == 0


def test_product_pin_uses_the_node_label_values() -> None:
    snap = dynamic(node("h0"), node("h1", product="NVIDIA-H100-SXM5-80GB"))
    d = decide_admission(pod(annotations={MEM: "9Gi"}), snap, CFG)
    assert d.models == ("H100-80GB",) and d.profile == "1g.10gb"
    assert d.products == ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB")
    # A100-40GB's smallest fit for 9Gi is 1g.10gb too (1g double memory): same resource,
    # so both models are allowed.
    snap = dynamic(node("h0"), node("a0", "A100-40GB"))
    d = decide_admission(pod(annotations={MEM: "9Gi"}), snap, CFG)
    assert d.models == ("A100-40GB", "H100-80GB")
    assert d.products == ("NVIDIA-A100-SXM4-40GB", "NVIDIA-H100-80GB-HBM3")


@pytest.mark.parametrize(
    ("snap", "ann", "needle"),
    [
        (H100, {MEM: "200Gi"}, "largest is H100-80GB with 80Gi"),
        (MIXED, {MEM: "100Gi"}, "largest is H100-80GB with 80Gi (largest MIG slice 7g.80gb"),
        (L40S, {MEM: "64Gi"}, "largest is L40S with 48Gi"),
        # 80Gi is the GPU's size but no slice holds it (7g.80gb is 79.25Gi).
        (H100, {MEM: "80Gi"}, "largest MIG slice 7g.80gb = 79.25Gi on H100-80GB"),
        (L40S, {MEM: "5Gi", ISO: "mig"},
         "isolation=mig, but no MIG slice holds it (no MIG slices)"),
        (H100, {MEM: "5Gi", ISO: "shared"}, "no time-sliced GPU holds it (no time-sliced GPUs)"),
        (WHOLE_ONLY, {MEM: "5Gi"}, "no MIG slice or time-sliced GPU holds it"),
        (CPU_ONLY, {MEM: "5Gi"}, "the cluster has no GPUs"),
        (cluster(), {CLASS: "asr"}, "the cluster has no GPUs"),
    ],
)
def test_denials_when_nothing_fits(snap: Any, ann: dict[str, str], needle: str) -> None:
    d = decide_admission(pod(annotations=ann), snap, CFG)
    assert d.kind is Kind.DENY and d.status_code == 403
    assert needle in d.reason


def test_busy_cluster_falls_back_then_waits() -> None:
    # One A30 node with a full, frozen layout: no 1g.6gb slice free, a shared L4 has room.
    full_a30 = node("a30", "A30-24GB", 1, mig={"1g.6gb": 4},
                    labels={"gpupack.io/mig-reconfigure": "false"})
    running = [
        {"metadata": {"name": f"r{i}", "namespace": "x"},
         "spec": {"nodeName": "a30", "containers": [
             {"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.6gb": "1"}}}]}}
        for i in range(4)
    ]
    snap = cluster(full_a30, node("l4", "L4", 1, "shared"), pods=running)
    assert decide_admission(pod(annotations={MEM: "5Gi"}), snap, CFG).kind is Kind.SHARED
    # isolation mig: no slice free now, but one exists: the pod waits for it.
    d = decide_admission(pod(annotations={MEM: "5Gi", ISO: "mig"}), snap, CFG)
    assert d.kind is Kind.MIG and d.profile == "1g.6gb" and "waits" in d.reason
    # Without the shared node the MIG slice is still chosen (pending beats denial).
    d = decide_admission(pod(annotations={MEM: "5Gi"}), cluster(full_a30, pods=running), CFG)
    assert d.kind is Kind.MIG and "waits" in d.reason


def test_one_slice_name_on_several_models_pins_all_of_them() -> None:
    # 1g.10gb is the smallest fit for 9Gi on A100-80GB and on H100-80GB (9.75Gi): the
    # resource is the same, so both models are allowed; capacity is counted per model.
    snap = dynamic(node("a", "A100-80GB", 8), node("h", "H100-80GB", 1))
    d = decide_admission(pod(annotations={MEM: "9Gi"}), snap, CFG)
    assert d.models == ("A100-80GB", "H100-80GB") and d.profile == "1g.10gb"
    view = ClusterView.of(snap)
    assert view.models["A100-80GB"].mig_available("1g.10gb") == 56
    assert view.models["H100-80GB"].mig_available("1g.10gb") == 7


def test_cordoned_nodes_offer_nothing() -> None:
    n = node("h0")
    n["spec"] = {"unschedulable": True}
    view = ClusterView.of(cluster(n))
    assert view.models["H100-80GB"].mig_gpus == 0 and view.models["H100-80GB"].gpus == 8


# ---- cordoned nodes: nothing free; their slices are the last place a pod may wait for ----

FROZEN = {"gpupack.io/mig-reconfigure": "false"}


def _cordoned(n: dict[str, Any], taint: bool = False) -> dict[str, Any]:
    n["spec"] = {"unschedulable": True}
    if taint:  # what the node lifecycle controller adds to a cordoned node
        n["spec"]["taints"] = [{"key": "node.kubernetes.io/unschedulable",
                                "effect": "NoSchedule"}]
    return n


def _running(name: str, node_name: str, resource: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "x"},
            "spec": {"nodeName": node_name, "containers": [
                {"name": "c", "resources": {"limits": {resource: "1"}}}]}}


def _live_2g_full(*more: dict[str, Any]) -> Snapshot:
    """h0 in service: a frozen layout of 2g.20gb slices, every one in use."""
    live = node("h0", gpus=2, mig={"2g.20gb": 6}, labels=FROZEN)
    held = [_running(f"r{i}", "h0", "nvidia.com/mig-2g.20gb") for i in range(6)]
    return cluster(live, *more, pods=held)


def test_a_cordoned_nodes_slices_are_kept_apart() -> None:
    view = ClusterView.of(cluster(_cordoned(node("h0", mig={"1g.10gb": 56}))))
    cap = view.models["H100-80GB"]
    assert cap.mig_cordoned == {"1g.10gb": 56}
    assert (cap.mig_gpus, cap.mig_free, cap.mig_existing) == (0, {}, {})


@pytest.mark.parametrize("taint", [False, True])
def test_a_pod_only_a_cordoned_node_can_hold_waits_for_it(taint: bool) -> None:
    # Maintenance on the only node with the profile: kube-scheduler keeps the pod Pending
    # until the node is uncordoned; refused, every create of its ReplicaSet failed. The
    # lifecycle controller's taint on the cordoned node does not change that.
    snap = cluster(_cordoned(node("h0", mig={"1g.10gb": 56}), taint=taint))
    d = decide_admission(pod(annotations={MEM: "8Gi", ISO: "mig"}), snap, CFG)
    assert (d.kind, d.profile) == (Kind.MIG, "1g.10gb"), d.reason
    assert "56 on cordoned node(s) of H100-80GB" in d.reason
    assert "waits until one is uncordoned" in d.reason and "in use" not in d.reason


def _naming(resource: str, **ann: str) -> dict[str, Any]:
    return pod(annotations=ann, containers=[{"name": "main", "image": "x",
                                             "resources": {"limits": {resource: "1"}}}])


def _maintenance() -> Snapshot:
    """h0 in service, its 2g.20gb slices all in use; h1 cordoned, with 1g.10gb slices."""
    return _live_2g_full(_cordoned(node("h1", gpus=1, mig={"1g.10gb": 7}, labels=FROZEN)))


def test_a_live_nodes_slice_beats_a_cordoned_nodes_smaller_one() -> None:
    # 1g.10gb exists only on the cordoned h1: the pod waits for h0's 2g.20gb, in service.
    snap = _maintenance()
    d = decide_admission(pod(annotations={MEM: "8Gi", ISO: "mig"}), snap, CFG)
    assert (d.kind, d.profile) == (Kind.MIG, "2g.20gb"), d.reason


def test_a_pod_naming_a_live_nodes_profile_is_not_refused_for_a_cordoned_one() -> None:
    snap = _maintenance()
    d = decide_admission(_naming("nvidia.com/mig-2g.20gb", **{MEM: "8Gi", ISO: "mig"}),
                         snap, CFG)
    assert (d.kind, d.profile) == (Kind.MIG, "2g.20gb"), d.reason


def test_a_pod_naming_only_a_cordoned_nodes_profile_waits_for_it() -> None:
    snap = _maintenance()
    d = decide_admission(_naming("nvidia.com/mig-1g.10gb", **{MEM: "8Gi", ISO: "mig"}),
                         snap, CFG)
    assert (d.kind, d.profile) == (Kind.MIG, "1g.10gb"), d.reason
    assert "cordoned" in d.reason


def test_a_busy_share_in_service_beats_a_cordoned_nodes_slice() -> None:
    s0 = node("s0", "L40S", 1, "shared", replicas=1)
    busy = {"metadata": {"name": "sp", "namespace": "x", "annotations": {MEM: "40Gi"}},
            "spec": {"nodeName": "s0", "schedulerName": "gpupack", "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}]}}
    snap = cluster(_cordoned(node("h0", mig={"1g.10gb": 56})), s0, pods=[busy])
    d = decide_admission(pod(annotations={MEM: "8Gi"}), snap, CFG)
    assert d.kind is Kind.SHARED, d.reason


@pytest.mark.parametrize("cordon", [False, True])
def test_a_bigger_slice_than_the_pod_needs_is_refused_cordoned_or_not(cordon: bool) -> None:
    # 8Gi naming 2g.20gb where 1g.10gb exists: the contradiction is the user's to resolve,
    # during a maintenance as after it.
    h0 = node("h0", gpus=1, mig={"1g.10gb": 4, "2g.20gb": 1}, labels=FROZEN)
    snap = cluster(_cordoned(h0, taint=True) if cordon else h0)
    d = decide_admission(_naming("nvidia.com/mig-2g.20gb", **{MEM: "8Gi", ISO: "mig"}),
                         snap, CFG)
    assert d.kind is Kind.DENY and d.status_code == 400, d.reason


def test_an_mps_pod_naming_a_slice_is_refused_on_a_cordoned_node() -> None:
    snap = cluster(_cordoned(node("h0", gpus=1, mig={"1g.10gb": 7}), taint=True))
    d = decide_admission(_naming("nvidia.com/mig-1g.10gb", **{MEM: "8Gi", ISO: "mps"}),
                         snap, CFG)
    assert d.kind is Kind.DENY, d.reason


@pytest.mark.parametrize(("n", "ann", "gpus"), [
    (lambda: node("s0", "L40S", 4, "shared"), {MEM: "8Gi", ISO: "shared"}, "4 L40S"),
    (lambda: node("h0", gpus=1, mig={"1g.10gb": 7}), {MEM: "40Gi", ISO: "mig"},
     "1 H100-80GB"),
])
def test_a_refusal_names_the_gpus_a_cordon_keeps(n: Any, ann: dict[str, str],
                                                 gpus: str) -> None:
    d = decide_admission(pod(annotations=ann), cluster(_cordoned(n(), taint=True)), CFG)
    assert d.kind is Kind.DENY
    assert d.reason.endswith(f"on cordoned nodes, offering nothing until uncordoned: "
                             f"{gpus} GPU(s)"), d.reason


def test_a_pod_pinned_to_a_cordoned_node_is_not_told_to_wait() -> None:
    # A cordon holds back schedulers, not the kubelet: a pod naming its node runs.
    snap = cluster(_cordoned(node("h0", gpus=1, mig={"1g.10gb": 7}), taint=True))
    d = decide_admission(pod(annotations={MEM: "8Gi", ISO: "mig"}, spec={"nodeName": "h0"}),
                         snap, CFG)
    assert (d.kind, d.profile) == (Kind.MIG, "1g.10gb"), d.reason
    assert "waits" not in d.reason and "spec.nodeName=h0" in d.reason


def test_a_shared_pod_is_not_sent_to_a_cordoned_mig_node() -> None:
    snap = cluster(_cordoned(node("h0", mig={"1g.10gb": 56})))
    d = decide_admission(pod(annotations={MEM: "8Gi", ISO: "shared"}), snap, CFG)
    assert d.kind is Kind.DENY, d.reason


@pytest.mark.parametrize(
    ("p", "kind", "klass"),
    [
        (pod(), Kind.SKIP, "none"),
        (pod(containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]),
         Kind.WHOLE, "whole"),
        (pod(annotations={CLASS: "whole", MEM: "5Gi"}), Kind.WHOLE, "whole"),
        (pod(annotations={CLASS: "llm"}), Kind.WHOLE, "whole"),
        (pod(labels={"leaderworkerset.sigs.k8s.io/name": "llama"},
             annotations={MEM: "5Gi"}), Kind.WHOLE, "whole"),
        (pod(annotations={"leaderworkerset.sigs.k8s.io/size": "2"}), Kind.WHOLE, "whole"),
        (pod(containers=[{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}]),
         Kind.EXPLICIT, "small"),
        (pod(annotations={"other.io/x": "y"}), Kind.SKIP, "none"),
    ],
)
def test_classification(p: dict[str, Any], kind: Kind, klass: str) -> None:
    d = decide_admission(p, H100, CFG)
    assert (d.kind, d.klass) == (kind, klass)


def test_small_pod_without_memory_takes_the_small_default() -> None:
    d = decide_admission(pod(annotations={ISO: "mig", COMPUTE: "0.5"}), H100, CFG)
    assert d.profile == "4g.40gb" and d.defaults == {MEM: "4Gi"}
    d = decide_admission(pod(annotations={ISO: "mig"}), H100, WebhookConfig(class_defaults={}))
    assert d.kind is Kind.DENY and d.status_code == 400
    assert "metadata.annotations.gpupack.io/gpu-memory: missing" in d.reason


def test_class_defaults_come_from_config() -> None:
    cfg = WebhookConfig(class_defaults={"asr": ClassDefault(30 * 1024, 250)})
    d = decide_admission(pod(annotations={CLASS: "asr"}), H100, cfg)
    assert d.profile == "3g.40gb"
    assert d.defaults == {MEM: "30Gi", COMPUTE: "0.25"}
    d = decide_admission(pod(annotations={CLASS: "tts"}), H100, cfg)
    assert d.kind is Kind.DENY and d.status_code == 400 and "'tts' is not one of" in d.reason


@pytest.mark.parametrize(
    ("containers", "ann", "needle"),
    [
        ([{"name": "c", "resources": {"limits": {"nvidia.com/mig-2g.20gb": "1"}}}], {MEM: "5Gi"},
         "spec.containers[0].resources.limits.nvidia.com/mig-2g.20gb conflicts with "
         "gpupack.io/gpu-memory=5Gi (it needs nvidia.com/mig-1g.10gb on H100-80GB)"),
        ([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}], {MEM: "5Gi"},
         "spec.containers[0].resources.limits.nvidia.com/gpu=1 asks for whole GPUs"),
        ([{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "2"}}}], {MEM: "5Gi"},
         "=2: a small pod takes exactly one slice"),
        ([{"name": "a"}, {"name": "b", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}],
         {MEM: "5Gi", "gpupack.io/container": "a"},
         "spec.containers[1].resources.limits.nvidia.com/mig-1g.10gb asks for a GPU in another"),
        ([{"name": "c", "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}],
         {MEM: "5Gi", ISO: "mig"}, "is a time-sliced share, but gpupack.io/isolation=mig"),
    ],
)
def test_explicit_conflicts_are_denied(containers: list[dict[str, Any]], ann: dict[str, str],
                                       needle: str) -> None:
    d = decide_admission(pod(annotations=ann, containers=containers), H100, CFG)
    assert d.kind is Kind.DENY and d.status_code == 400
    assert needle in d.reason


def test_explicit_value_that_matches_is_kept() -> None:
    c = [{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]
    a = admit(pod(annotations={MEM: "5Gi"}, containers=c), MIXED, CFG)
    # 1g.5gb on A100 would waste less, but the user's 1g.10gb is H100's smallest fit.
    assert a.decision.profile == "1g.10gb" and a.decision.models == ("H100-80GB",)
    assert not any("/resources/limits" in op["path"] for op in a.patch)


AFF = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


def _affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}}


def _product(op: str, *values: str) -> dict[str, Any]:
    return {"key": "nvidia.com/gpu.product", "operator": op, "values": list(values)}


def test_user_product_constraints_steer_the_choice() -> None:
    only_h100 = _affinity([_product("In", "NVIDIA-H100-80GB-HBM3")])
    d = decide_admission(pod(annotations={MEM: "5Gi"}, spec=only_h100), MIXED, CFG)
    assert d.models == ("H100-80GB",) and d.profile == "1g.10gb"
    not_a100 = _affinity([_product("NotIn", "NVIDIA-A100-SXM4-40GB")])
    d = decide_admission(pod(annotations={MEM: "5Gi"}, spec=not_a100), MIXED, CFG)
    assert d.models == ("H100-80GB",)
    sel = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L40S"}}
    d = decide_admission(pod(annotations={MEM: "5Gi"}, spec=sel), MIXED, CFG)
    assert d.kind is Kind.SHARED


def test_conflicting_product_affinity_is_denied_by_name() -> None:
    spec = _affinity([_product("In", "NVIDIA-L40S")])
    d = decide_admission(pod(annotations={MEM: "5Gi"}, spec=spec), H100, CFG)
    assert d.kind is Kind.DENY
    assert f"{AFF}.nodeSelectorTerms[0].matchExpressions[0] (nvidia.com/gpu.product In " \
           "[NVIDIA-L40S])" in d.reason
    d = decide_admission(pod(annotations={MEM: "5Gi"},
                   spec={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100"}}), H100, CFG)
    assert d.kind is Kind.DENY
    assert "spec.nodeSelector.nvidia.com/gpu.product=NVIDIA-A100" in d.reason


def test_scheduler_name_of_another_scheduler_is_kept_with_a_warning() -> None:
    a = admit(pod(annotations={MEM: "5Gi"}, spec={"schedulerName": "volcano"}), H100, CFG)
    assert a.allowed and not any(op["path"] == "/spec/schedulerName" for op in a.patch)
    assert any("volcano" in w for w in a.decision.warnings)
