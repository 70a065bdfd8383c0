"""MPS replicas as a share kind: chosen before time-slicing, pinned by sharing strategy,
refused when the per-client cap (GPU memory / replicas) cannot hold the pod."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
import pytest
from prometheus_client import CollectorRegistry
from webhook_builders import cluster, node, pod, review

from kube.node_objects import node_info
from packing.model import GpuMode, Snapshot
from webhook.admit import admit
from webhook.app import create_webhook_app
from webhook.capacity import ClusterView
from webhook.claims import ClaimBook
from webhook.config import WebhookConfig
from webhook.decide import decide_admission
from webhook.decision import Kind

CFG = WebhookConfig()
STRATEGY = "nvidia.com/gpu.sharing-strategy"
# L40S (48Gi) with 4 MPS replicas: 12Gi per client; and time-sliced L40S.
MPS_AND_TS = cluster(node("mps-0", "L40S", 2, "mps"), node("ts-0", "L40S", 2, "shared"))
MPS_ONLY = cluster(node("mps-0", "L40S", 1, "mps"))
TS_ONLY = cluster(node("ts-0", "L40S", 2, "shared"))
WITH_MIG = cluster(node("h100", mig={"1g.10gb": 1}), node("mps-0", "L40S", 1, "mps"))
# The same in two zones: the pod's own zone terms below reach both nodes.
ZONED = cluster(node("mps-0", "L40S", 2, "mps", labels={"zone": "b"}),
                node("ts-0", "L40S", 2, "shared", labels={"zone": "a"}))


def _ann(memory: str, isolation: str | None = None) -> dict[str, str]:
    out = {"gpupack.io/gpu-memory": memory}
    if isolation is not None:
        out["gpupack.io/isolation"] = isolation
    return out


@pytest.mark.parametrize(
    ("snap", "memory", "isolation", "kind", "sharing", "needle"),
    [
        # A share that fits a 12Gi MPS client gets one: memory capped, neighbours safe.
        (MPS_AND_TS, "8Gi", None, Kind.MPS, ("In", ("mps",)), "MPS share of L40S"),
        (MPS_AND_TS, "12Gi", "shared", Kind.MPS, ("In", ("mps",)),
         "capped per client: L40S 12Gi"),
        (MPS_AND_TS, "8Gi", "mps", Kind.MPS, ("In", ("mps",)), "free replica"),
        # Over the client cap: time-sliced, kept off the MPS nodes (same resource name).
        (MPS_AND_TS, "20Gi", None, Kind.SHARED, ("NotIn", ("mps",)), "time-sliced"),
        (MPS_AND_TS, "20Gi", "mps", Kind.DENY, None,
         "gpupack.io/isolation=mps, but no MPS replica holds it (largest MPS client 12Gi on "
         "L40S)"),
        (TS_ONLY, "8Gi", "mps", Kind.DENY, None, "no MPS GPUs"),
        # No MPS in the cluster: time-sliced shares are not pinned (as before).
        (TS_ONLY, "8Gi", None, Kind.SHARED, None, "time-sliced"),
        # MIG first when a slice is free; mig isolation never takes an MPS replica.
        (WITH_MIG, "8Gi", None, Kind.MIG, None, "smallest MIG slice"),
        (MPS_ONLY, "8Gi", "mig", Kind.DENY, None, "no MIG slice holds it"),
        (MPS_ONLY, "20Gi", "shared", Kind.DENY, None,
         "no time-sliced GPU or MPS replica holds it"),
    ],
)
def test_mps_decisions(snap: Snapshot, memory: str, isolation: str | None, kind: Kind,
                       sharing: tuple[str, tuple[str, ...]] | None, needle: str) -> None:
    d = decide_admission(pod(annotations=_ann(memory, isolation)), snap, CFG)
    assert d.kind is kind, d.reason
    assert needle in d.reason, d.reason
    assert d.sharing == sharing
    if kind is Kind.MPS:
        assert d.resource == "nvidia.com/gpu.shared" and d.products == ("NVIDIA-L40S",)


def _terms(p: dict[str, Any]) -> list[dict[str, Any]]:
    terms: list[dict[str, Any]] = (p["spec"]["affinity"]["nodeAffinity"]
                                   ["requiredDuringSchedulingIgnoredDuringExecution"]
                                   ["nodeSelectorTerms"])
    return terms


@pytest.mark.parametrize(
    ("spec", "terms_after"),
    [
        ({}, [[("nvidia.com/gpu.product", "In", ["NVIDIA-L40S"]), (STRATEGY, "In", ["mps"])]]),
        # The user's own terms each get both pins, ANDed with what they wrote.
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}}},
         [[("zone", "In", ["a"]), ("nvidia.com/gpu.product", "In", ["NVIDIA-L40S"]),
           (STRATEGY, "In", ["mps"])],
          [("zone", "In", ["b"]), ("nvidia.com/gpu.product", "In", ["NVIDIA-L40S"]),
           (STRATEGY, "In", ["mps"])]]),
    ],
)
def test_mps_patch_is_valid_and_idempotent(spec: dict[str, Any],
                                           terms_after: list[list[tuple[str, str, list[str]]]]
                                           ) -> None:
    p = pod(annotations=_ann("8Gi"), spec=spec)
    adm = admit(p, ZONED, CFG)
    assert adm.decision.kind is Kind.MPS, adm.decision.reason
    out = jsonpatch.JsonPatch(list(adm.patch)).apply(p)
    assert out == adm.result
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu.shared": "1"}
    got = [[(e["key"], e["operator"], e["values"]) for e in t["matchExpressions"]]
           for t in _terms(out)]
    assert got == terms_after
    assert json.loads(out["metadata"]["annotations"]["gpupack.io/decision"])["kind"] == "mps"
    again = admit(out, MPS_AND_TS, CFG)
    assert again.decision.reused and again.decision.kind is Kind.MPS and again.patch == ()


def test_time_sliced_share_is_pinned_off_mps_nodes() -> None:
    p = pod(annotations=_ann("20Gi"))
    adm = admit(p, MPS_AND_TS, CFG)
    out = jsonpatch.JsonPatch(list(adm.patch)).apply(p)
    exprs = _terms(out)[0]["matchExpressions"]
    assert {"key": STRATEGY, "operator": "NotIn", "values": ["mps"]} in exprs


def test_burst_fills_mps_replicas_then_time_slices() -> None:
    """4 replicas per MPS GPU: a burst of 8Gi pods takes the 4 of the one MPS GPU, then
    time-sliced room (the claims count replicas, not only memory)."""
    snap = cluster(node("mps-0", "L40S", 1, "mps"), node("ts-0", "L40S", 1, "shared"))
    client = create_webhook_app(lambda: snap, CollectorRegistry(), CFG,
                        claim_book=ClaimBook()).test_client()
    kinds = []
    for i in range(9):
        p = pod(f"p{i}", annotations=_ann("8Gi"))
        r = client.post("/mutate", json=review(p, uid=f"u{i}")).get_json()["response"]
        out = jsonpatch.apply_patch(p, json.loads(base64.b64decode(r["patch"])))
        kinds.append(json.loads(out["metadata"]["annotations"]["gpupack.io/decision"])["kind"])
    # 4 MPS replicas, then the time-sliced GPU's 4 replicas of 8Gi (of 48Gi); the ninth
    # waits for an MPS replica (the better isolated kind that exists).
    assert kinds == ["mps"] * 4 + ["shared"] * 4 + ["mps"]


def test_view_counts_mps_clients_and_replicas() -> None:
    view = ClusterView.of(MPS_AND_TS)
    l40s = view.models["L40S"]
    assert (l40s.mps_gpus, l40s.shared_gpus) == (2, 2)
    assert l40s.mps_clients == {12288}
    assert dict(l40s.mps_room) == {(12288, 1000, 4): 2}
    assert l40s.mps_available(12 * 1024, 0) == 2 and l40s.mps_available(13 * 1024, 0) == 0


@pytest.mark.parametrize(
    ("strategy", "mps"),
    [("mps", True), ("time-slicing", False), (None, False)],
)
def test_nodes_say_mps_by_sharing_strategy(strategy: str | None, mps: bool) -> None:
    n = node("n", "L40S", 2, "shared")
    labels = n["metadata"]["labels"]
    if strategy is None:
        del labels[STRATEGY]
    else:
        labels[STRATEGY] = strategy
    info = node_info(n)
    assert [(g.mode, g.mps) for g in info.gpus] == [(GpuMode.SHARED, mps)] * 2


def test_observed_gpus_keep_the_mps_label() -> None:
    """The node agent's inventory replaces inferred GPUs; MPS still comes from GFD."""
    n = node("n", "L40S", 1, "mps")
    n["metadata"]["annotations"] = {"gpupack.io/inventory": json.dumps({
        "v": 1, "node": "n", "ts": 1, "gpus": [{"i": 0, "uuid": "GPU-0", "model": "NVIDIA-L40S",
                                               "mem": 46068, "used": 0, "mode": "shared"}]})}
    (g,) = node_info(n).gpus
    assert g.mps and g.replicas == 4 and g.memory_mib == 46068
