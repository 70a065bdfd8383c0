"""JSON Patch: escaping, missing parents, never overwriting, and idempotency."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webhook_builders import cluster, dynamic, node, pod

from webhook.admit import admit
from webhook.config import WebhookConfig
from webhook.decision import Kind
from webhook.patch import escape, pointer

CFG = WebhookConfig()
MIXED = dynamic(node("a0", "A100-40GB"), node("h0"), node("s0", "L40S", 4, "shared"))
MEM = "gpupack.io/gpu-memory"
PRODUCT = "nvidia.com/gpu.product"


def apply(p: dict[str, Any], ops: Any) -> dict[str, Any]:
    return jsonpatch.apply_patch(p, list(ops))


def test_pointer_escaping() -> None:
    assert escape("gpupack.io/class") == "gpupack.io~1class"
    assert escape("a~b/c") == "a~0b~1c"  # ~ first, or "~1" would become "~01"
    assert pointer(["metadata", "annotations", "x/~y"]) == "/metadata/annotations/x~1~0y"
    assert pointer(["spec", "containers", 2, "resources"]) == "/spec/containers/2/resources"


def test_missing_parents_are_created_whole() -> None:
    a = admit(pod(annotations=None, containers=[{"name": "c"}]), MIXED, CFG)
    # annotations were absent: decision/class/memory would need 3 adds into a missing map
    paths = [op["path"] for op in a.patch]
    assert "/metadata/annotations" not in paths  # the pod has no gpupack annotation at all
    assert a.decision.kind is Kind.SKIP
    p = pod(annotations={"gpupack.io/class": "asr"})
    del p["metadata"]["annotations"]
    p["metadata"]["labels"] = {}
    a = admit(pod(annotations={"gpupack.io/class": "asr"}), MIXED, CFG)
    ops = {op["path"]: op for op in a.patch}
    assert ops["/spec/containers/0/resources"]["value"] == {
        "limits": {"nvidia.com/mig-1g.10gb": "1"}, "requests": {"nvidia.com/mig-1g.10gb": "1"}}
    assert "/spec/affinity" in ops
    assert ops["/metadata/annotations/gpupack.io~1gpu-memory"]["value"] == "8Gi"
    out = apply(pod(annotations={"gpupack.io/class": "asr"}), a.patch)
    assert out["metadata"]["annotations"]["gpupack.io/class"] == "asr"


def test_null_and_partial_parents() -> None:
    containers = [{"name": "c", "resources": {"limits": {"cpu": "2"}}}]
    p = pod(annotations={MEM: "5Gi"}, containers=containers,
            spec={"affinity": {"podAntiAffinity": {}}})
    a = admit(p, MIXED, CFG)
    out = apply(p, a.patch)
    c = out["spec"]["containers"][0]["resources"]
    assert c == {"limits": {"cpu": "2", "nvidia.com/mig-1g.5gb": "1"},
                 "requests": {"nvidia.com/mig-1g.5gb": "1"}}
    assert out["spec"]["affinity"]["podAntiAffinity"] == {}
    terms = out["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": PRODUCT, "operator": "In", "values": ["NVIDIA-A100-SXM4-40GB"]}]}]
    # metadata.annotations: null is replaced whole
    p2 = pod(annotations={MEM: "5Gi"})
    p2["metadata"]["labels"] = None
    a2 = admit(p2, MIXED, CFG)
    assert apply(p2, a2.patch)["metadata"]["annotations"][MEM] == "5Gi"


def test_existing_terms_get_the_pin_added_not_replaced() -> None:
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    mixed_products = {"key": PRODUCT, "operator": "In",
                      "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S"]}
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchExpressions": [mixed_products]},
                              {"matchFields": [{"key": "metadata.name", "operator": "In",
                                                "values": ["h0"]}]}]}}}}
    p = pod(annotations={MEM: "5Gi", "gpupack.io/isolation": "mig"}, spec=spec)
    a = admit(p, MIXED, CFG)
    assert a.decision.models == ("H100-80GB",)  # A100 is excluded by term 1
    out = apply(p, a.patch)
    terms = out["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    pin = {"key": PRODUCT, "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
    assert terms[0]["matchExpressions"] == [zone, pin]
    assert terms[1]["matchExpressions"] == [mixed_products, pin]
    assert terms[2]["matchExpressions"] == [pin] and "matchFields" in terms[2]
    assert admit(out, MIXED, CFG).patch == ()


def test_scheduler_name_rules() -> None:
    for current, expected in [(None, "gpupack"), ("", "gpupack"),
                              ("default-scheduler", "gpupack"), ("gpupack", "gpupack"),
                              ("volcano", "volcano")]:
        spec = {} if current is None else {"schedulerName": current}
        p = pod(containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                spec=spec)
        out = apply(p, admit(p, MIXED, CFG).patch)
        assert out["spec"]["schedulerName"] == expected
    cfg = WebhookConfig(scheduler_name="bin-packer")
    p = pod(annotations={MEM: "1Gi"})
    assert apply(p, admit(p, MIXED, cfg).patch)["spec"]["schedulerName"] == "bin-packer"


def test_whole_gpu_pod_only_gets_the_scheduler() -> None:
    p = pod(containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 8}}}])
    a = admit(p, MIXED, CFG)
    assert [op["path"] for op in a.patch] == ["/spec/schedulerName"]


def test_named_container_gets_the_resource() -> None:
    p = pod(annotations={MEM: "5Gi", "gpupack.io/container": "model"},
            containers=[{"name": "proxy"}, {"name": "model"}])
    out = apply(p, admit(p, MIXED, CFG).patch)
    assert "resources" not in out["spec"]["containers"][0]
    assert out["spec"]["containers"][1]["resources"]["limits"] == {"nvidia.com/mig-1g.5gb": "1"}


def test_decision_annotation_round_trip_and_stale_copy() -> None:
    p = pod(annotations={MEM: "5Gi"})
    a = admit(p, MIXED, CFG)
    out = apply(p, a.patch)
    doc = json.loads(out["metadata"]["annotations"]["gpupack.io/decision"])
    assert doc["kind"] == "mig" and doc["profile"] == "1g.5gb" and doc["model"] == "A100-40GB"
    assert doc["products"] == ["NVIDIA-A100-SXM4-40GB"] and doc["reason"]
    # Re-invocation on a cluster that changed meanwhile: the pod keeps its decision.
    h100_only = dynamic(node("h0"))
    assert admit(out, h100_only, CFG).patch == ()
    # A copied decision without the resource is stale: decided again and replaced.
    stale = pod(annotations={MEM: "5Gi", "gpupack.io/decision": doc and json.dumps(doc)})
    a2 = admit(stale, h100_only, CFG)
    ops = {op["path"]: op for op in a2.patch}
    assert ops["/metadata/annotations/gpupack.io~1decision"]["op"] == "replace"
    assert a2.decision.profile == "1g.10gb"


# ---- idempotency, as a property over random pods ---------------------------------------------

CLUSTERS = [
    MIXED,
    dynamic(node("h0")),
    dynamic(node("a0", "A100-40GB")),
    cluster(node("s0", "L40S", 4, "shared")),
    cluster(),
]
_ann_values = {
    # Mostly valid values, so most examples get a decision to re-run; a few bad ones.
    "gpupack.io/gpu-memory": st.sampled_from(["1Gi", "5Gi", "9Gi", "12Gi", "30Gi", "40Gi",
                                              "3Gi", "4096Mi", "500Gi", "lots", "0"]),
    "gpupack.io/gpu-compute": st.sampled_from(["0.1", "0.25", "0.5", "1", "0.3", "2"]),
    "gpupack.io/isolation": st.sampled_from(["mig", "shared", "any", "any", "bogus"]),
    "gpupack.io/class": st.sampled_from(["asr", "tts", "small", "asr", "whole", "nope"]),
    "gpupack.io/container": st.sampled_from(["c0", "c0", "c1", "missing"]),
    "gpupack.io/strict": st.sampled_from(["true", "false", "false", "maybe"]),
    "gpupack.io/decision": st.sampled_from(["{}", "not json", '{"kind":"mig"}']),
    "other.io/a~b/c": st.just("v"),
}
_resources = st.sampled_from([
    None, None, None, {}, {"limits": {"cpu": "1"}}, {"limits": None}, {"requests": {"cpu": "1"}},
    {"limits": {"nvidia.com/gpu": "1"}}, {"requests": {"nvidia.com/mig-1g.10gb": "1"}},
    {"limits": {"nvidia.com/mig-1g.5gb": 1}}, {"limits": {"nvidia.com/gpu.shared": "1"}},
    {"limits": {"nvidia.com/mig-2g.20gb": "1"}, "requests": {"memory": "1Gi"}},
])
_args = st.sampled_from([None, ["--gpu-memory-utilization", "0.9"],
                         ["--gpu-memory-utilization=0.05"], ["--mem-fraction-static", "0.8"]])


@st.composite
def _container(draw: st.DrawFn, i: int) -> dict[str, Any]:
    c: dict[str, Any] = {"name": f"c{i}", "image": draw(st.sampled_from(["app", "vllm/vllm"]))}
    res = draw(_resources)
    if res is not None:
        c["resources"] = copy.deepcopy(res)
    args = draw(_args)
    if args is not None:
        c["args"] = args
    return c


_affinities: st.SearchStrategy[dict[str, Any] | None] = st.sampled_from([
    None,
    {"podAffinity": {}},
    {"nodeAffinity": {}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}, {}]}}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": PRODUCT, "operator": "In",
                               "values": ["NVIDIA-H100-80GB-HBM3"]}]}]}}},
    {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": PRODUCT, "operator": "NotIn",
                               "values": ["NVIDIA-L40S"]}]}]}}},
])


@st.composite
def random_pods(draw: st.DrawFn) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(sorted(_ann_values)), unique=True, max_size=4))
    if draw(st.integers(0, 9)) < 7:
        keys.append("gpupack.io/gpu-memory")
    ann = {k: draw(_ann_values[k]) for k in keys}
    containers = [draw(_container(i)) for i in range(draw(st.sampled_from([1, 1, 2, 3, 0])))]
    spec: dict[str, Any] = {}
    aff = draw(_affinities)
    if aff is not None:
        spec["affinity"] = copy.deepcopy(aff)
    if draw(st.booleans()):
        spec["schedulerName"] = draw(st.sampled_from(["default-scheduler", "", "gpupack", "x"]))
    labels = {"leaderworkerset.sigs.k8s.io/name": "g"} if draw(st.integers(0, 9)) == 0 else None
    keep_empty = draw(st.booleans())  # {} and an absent map are both worth trying
    return pod(annotations=ann if ann or keep_empty else None, containers=containers,
               spec=spec, labels=labels)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_pods(), st.sampled_from(range(len(CLUSTERS))), st.sampled_from(range(len(CLUSTERS))))
def test_webhook_is_idempotent_on_its_own_output(p: dict[str, Any], first: int,
                                                  second: int) -> None:
    original = copy.deepcopy(p)
    a = admit(p, CLUSTERS[first], CFG)
    assert p == original  # pure: the input is not touched
    if not a.allowed:
        assert a.patch == () and a.decision.reason
        return
    out = apply(p, a.patch)
    assert out == a.result
    # Re-invocation sees the patched pod, possibly against a changed cluster.
    again = admit(out, CLUSTERS[second], CFG)
    assert again.allowed, again.decision.reason
    assert again.patch == (), again.patch
    if a.decision.small:
        res = out["spec"]["containers"][a.decision.container]["resources"]
        assert res["limits"][a.decision.resource] in ("1", 1)
        assert out["spec"]["schedulerName"] in ("gpupack", "x")


# ---- bind records on a new pod ------------------------------------------------------------

NODE_REC, GPUS_REC, MIG_REC, POLICY_REC = (
    "gpupack.io/node", "gpupack.io/gpus", "gpupack.io/mig", "gpupack.io/policy")
FORGED = {NODE_REC: "h0", GPUS_REC: "0,1", MIG_REC: "1g.10gb@2", POLICY_REC: "gpupack"}


@pytest.mark.parametrize(("annotations", "containers", "kind", "removed"), [
    # A small pod: decided as usual, the records removed beside the decision's changes.
    ({"gpupack.io/class": "asr", **FORGED}, None, Kind.MIG, list(FORGED)),
    # A whole-GPU pod copied from a running one (only some records).
    ({GPUS_REC: "3", NODE_REC: "h0"},
     [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}], Kind.WHOLE,
     [NODE_REC, GPUS_REC]),
    # A pod gpupack does not place (no GPU): still patched, the records are gpupack's.
    ({MIG_REC: "1g.10gb@0"}, [{"name": "c"}], Kind.SKIP, [MIG_REC]),
    # Other gpupack annotations (what users write, and the decision) are not records.
    ({"gpupack.io/class": "asr", "gpupack.io/group": "g"}, None, Kind.MIG, []),
    ({"gpupack.io/nodes": "x"}, [{"name": "c"}], Kind.SKIP, []),
])
def test_bind_records_are_removed_from_a_new_pod(
        annotations: dict[str, str], containers: list[dict[str, Any]] | None, kind: Kind,
        removed: list[str]) -> None:
    p = pod(annotations=annotations) if containers is None else pod(
        annotations=annotations, containers=containers)
    a = admit(p, MIXED, CFG)
    assert a.decision.kind is kind
    assert list(a.decision.strip) == removed
    removals = [op["path"] for op in a.patch if op["op"] == "remove"]
    assert removals == ["/metadata/annotations/" + escape(k) for k in removed]
    out = apply(p, a.patch)
    ann = out["metadata"].get("annotations") or {}
    assert not set(removed) & set(ann)
    assert all(ann[k] == v for k, v in annotations.items() if k not in removed)
    warned = [w for w in a.decision.warnings if "placement records" in w]
    if removed:
        assert len(warned) == 1 and all(k in warned[0] for k in removed)
        assert a.outcome == "patched"
    else:
        assert warned == []
    # Running the webhook on its own output changes nothing more (re-invocation).
    again = admit(out, MIXED, CFG)
    assert [op for op in again.patch if op["op"] == "remove"] == []
    assert again.decision.strip == ()


def test_a_denied_pod_is_denied_without_a_patch_even_with_records() -> None:
    p = pod(annotations={"gpupack.io/class": "nonsense", GPUS_REC: "0"})
    a = admit(p, MIXED, CFG)
    assert not a.allowed and a.patch == () and a.decision.strip == ()
    assert "gpupack.io/class" in a.decision.reason
