"""The Flask app in process: wire decoding, bad input table, metrics, never a 500."""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

import jsonpatch
import pytest
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry
from webhook_builders import dynamic, node, pod, review

from packing.model import Snapshot
from webhook.app import create_webhook_app
from webhook.config import WebhookConfig
from webhook.wire import AdmissionResponse, ReviewError, decode_review, encode_response

SNAP = dynamic(node("h0"), node("s0", "L40S", 4, "shared"))


@pytest.fixture()
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture()
def client(registry: CollectorRegistry) -> FlaskClient:
    cfg = WebhookConfig(namespace_labels=lambda ns: {"gpupack.io/strict": "true"}
                        if ns == "strict" else {})
    return create_webhook_app(lambda: SNAP, registry, cfg).test_client()


def _nested(depth: int) -> Any:
    out: Any = []
    for _ in range(depth):
        out = [out]
    return out


def post(client: FlaskClient, body: Any) -> Any:
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return client.post("/mutate", data=data, content_type="application/json")


def test_patch_round_trip(client: FlaskClient) -> None:
    p = pod(annotations={"gpupack.io/gpu-memory": "5Gi"})
    r = post(client, review(p, uid="abc"))
    assert r.status_code == 200 and r.mimetype == "application/json"
    body = r.get_json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    resp = body["response"]
    assert resp["uid"] == "abc" and resp["allowed"] is True and resp["patchType"] == "JSONPatch"
    out = jsonpatch.apply_patch(p, json.loads(base64.b64decode(resp["patch"])))
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert json.loads(resp["auditAnnotations"]["decision"])["profile"] == "1g.10gb"
    again = post(client, review(out)).get_json()["response"]
    assert again["allowed"] is True and "patch" not in again


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "body"),
        ([], "body"),
        ({"kind": "AdmissionReview"}, "body.apiVersion"),
        ({"apiVersion": "v1", "kind": "AdmissionReview"}, "apiVersion"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}, "kind"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": []},
         "request"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"kind": {"kind": "Pod"}, "operation": "CREATE"}}, "request.uid"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": 5}}, "request.uid"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "u", "operation": "CREATE"}}, "request.kind"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "u", "kind": {"kind": "Pod"}}}, "request.operation"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE"}},
         "request.object"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE",
                      "object": "pod"}}, "request.object"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE",
                      "object": {}, "dryRun": "yes"}}, "request.dryRun"),
        (b"[" * 1000 + b"]" * 1000, "body"),  # deeper than json's recursion limit
    ],
)
def test_malformed_reviews_are_400_naming_the_field(client: FlaskClient, body: Any,
                                                    field: str) -> None:
    r = post(client, body)
    assert r.status_code == 400
    assert r.get_json()["field"] == field
    with pytest.raises(ReviewError):
        decode_review(body if isinstance(body, bytes) else json.dumps(body))


@pytest.mark.parametrize(
    ("obj", "needle"),
    [
        (pod(annotations={"gpupack.io/gpu-memory": "lots"}),
         "metadata.annotations.gpupack.io/gpu-memory: 'lots' is not a quantity"),
        (pod(annotations={"gpupack.io/gpu-memory": "0"}), "'0' must be more than zero"),
        (pod(annotations={"gpupack.io/gpu-compute": "1.5", "gpupack.io/gpu-memory": "1Gi"}),
         "metadata.annotations.gpupack.io/gpu-compute: '1.5' must be a fraction in (0, 1]"),
        (pod(annotations={"gpupack.io/isolation": "strong", "gpupack.io/gpu-memory": "1Gi"}),
         "metadata.annotations.gpupack.io/isolation: 'strong' is not one of mig, mps, shared, any"),
        (pod(annotations={"gpupack.io/class": "video"}),
         "metadata.annotations.gpupack.io/class: 'video' is not one of"),
        (pod(annotations={"gpupack.io/gpu-memory": ""}),
         "metadata.annotations.gpupack.io/gpu-memory: '' is not a quantity"),
        (pod(annotations={"gpupack.io/gpu-memory": "1Gi", "gpupack.io/container": "x"}),
         "metadata.annotations.gpupack.io/container: 'x' is not a container of the pod (main)"),
        ({"metadata": {"annotations": {"gpupack.io/gpu-memory": 5}}},
         "metadata.annotations.gpupack.io/gpu-memory: expected a string, got 5"),
        ({"metadata": [], "spec": {}}, "metadata: expected an object, got list"),
        ({"metadata": {}, "spec": {"containers": {}}}, "spec.containers: expected a list"),
        ({"metadata": {}, "spec": {"containers": ["c"]}}, "spec.containers[0]: expected an object"),
        (pod(containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "many"}}}]),
         "spec.containers[0].resources.limits.nvidia.com/gpu: 'many' is not a quantity"),
        (pod(containers=[{"name": "c", "resources": []}]),
         "spec.containers[0].resources: expected an object"),
        (pod(annotations={"gpupack.io/gpu-memory": "1Gi"},
             spec={"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                                 {"nodeSelectorTerms": {}}}}}),
         "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: expected a list"),
        (pod(annotations={"gpupack.io/gpu-memory": "1Gi"},
             spec={"nodeSelector": {"nvidia.com/gpu.product": 3}}),
         "spec.nodeSelector.nvidia.com/gpu.product: expected a string"),
        # Found by fuzzing: these were denials with code 500 (or took seconds).
        (pod(annotations={"gpupack.io/gpu-memory": "1e1000000"}),
         "gpupack.io/gpu-memory: '1e1000000' is out of range"),
        (pod(containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": -1}}}]),
         "limits.nvidia.com/gpu: -1 is negative"),
    ],
)
def test_bad_pods_are_denied_with_400_naming_field_and_value(client: FlaskClient, obj: Any,
                                                             needle: str) -> None:
    r = post(client, review(obj))
    assert r.status_code == 200
    resp = r.get_json()["response"]
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 400 and resp["status"]["reason"] == "BadRequest"
    assert needle in resp["status"]["message"]


@pytest.mark.parametrize(
    ("operation", "kind"),
    [("UPDATE", "Pod"), ("DELETE", "Pod"), ("CONNECT", "Pod"), ("CREATE", "Deployment"),
     ("CREATE", "Service")],
)
def test_other_kinds_and_operations_pass_untouched(client: FlaskClient, operation: str,
                                                   kind: str) -> None:
    obj = pod(annotations={"gpupack.io/gpu-memory": "lots"})
    resp = post(client, review(obj, operation=operation, kind=kind)).get_json()["response"]
    assert resp == {"uid": "uid-1", "allowed": True}


def test_subresource_create_passes(client: FlaskClient) -> None:
    rv = review(pod(annotations={"gpupack.io/gpu-memory": "5Gi"}))
    rv["request"]["subResource"] = "binding"
    assert post(client, rv).get_json()["response"] == {"uid": "uid-1", "allowed": True}


def test_v1beta1_is_echoed(client: FlaskClient) -> None:
    rv = review(pod())
    rv["apiVersion"] = "admission.k8s.io/v1beta1"
    assert post(client, rv).get_json()["apiVersion"] == "admission.k8s.io/v1beta1"


def test_namespace_strict_mode_through_the_provider(client: FlaskClient) -> None:
    p = pod(annotations={"gpupack.io/gpu-memory": "8Gi", "gpupack.io/isolation": "shared"},
            containers=[{"name": "v", "image": "vllm/vllm-openai"}])
    ok = post(client, review(p, namespace="speech")).get_json()["response"]
    assert ok["allowed"] is True and "vLLM" in ok["warnings"][0]
    denied = post(client, review(p, namespace="strict")).get_json()["response"]
    assert denied["allowed"] is False and denied["status"]["code"] == 403
    assert "strict mode" in denied["status"]["message"]


def test_too_big_pod_is_denied_with_the_largest_size(client: FlaskClient) -> None:
    p = pod(annotations={"gpupack.io/gpu-memory": "100Gi"})
    resp = post(client, review(p)).get_json()["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == 403
    assert "largest is H100-80GB with 80Gi" in resp["status"]["message"]


def test_provider_failure_is_a_denial_not_a_500(registry: CollectorRegistry) -> None:
    def broken() -> Snapshot:
        raise RuntimeError("cache not synced")

    client = create_webhook_app(broken, registry, WebhookConfig()).test_client()
    r = post(client, review(pod(annotations={"gpupack.io/gpu-memory": "5Gi"})))
    assert r.status_code == 200
    resp = r.get_json()["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == 500
    assert registry.get_sample_value("gpupack_webhook_reviews_total",
                                     {"outcome": "error", "class": "none"}) == 1


def test_metrics(client: FlaskClient, registry: CollectorRegistry) -> None:
    post(client, review(pod(annotations={"gpupack.io/class": "asr"})))
    post(client, review(pod(annotations={"gpupack.io/class": "asr"})))
    post(client, review(pod(annotations={"gpupack.io/class": "bogus"})))
    post(client, review(pod(), operation="DELETE"))
    post(client, b"nope")
    post(client, review(pod(containers=[{"name": "c", "resources": {"limits":
                                                                    {"nvidia.com/gpu": 1}}}])))
    sample = registry.get_sample_value
    assert sample("gpupack_webhook_reviews_total", {"outcome": "patched", "class": "asr"}) == 2
    assert sample("gpupack_webhook_reviews_total", {"outcome": "denied", "class": "invalid"}) == 1
    assert sample("gpupack_webhook_reviews_total", {"outcome": "ignored", "class": "none"}) == 1
    assert sample("gpupack_webhook_reviews_total", {"outcome": "malformed", "class": "none"}) == 1
    assert sample("gpupack_webhook_reviews_total", {"outcome": "patched", "class": "whole"}) == 1
    assert sample("gpupack_webhook_latency_seconds_count", {}) == 6
    text = client.get("/metrics").get_data(as_text=True)
    assert "gpupack_webhook_latency_seconds_bucket" in text
    assert client.get("/healthz").get_json() == {"ok": True}


def test_encode_response_shapes() -> None:
    deny = encode_response("admission.k8s.io/v1", AdmissionResponse(
        "u", False, status_code=403, message="no", warnings=["w" * 300]))
    assert deny["response"]["status"] == {"code": 403, "message": "no", "reason": "Forbidden"}
    assert len(deny["response"]["warnings"][0]) == 256
    assert "patch" not in deny["response"]
    allow = encode_response("admission.k8s.io/v1", AdmissionResponse(
        "u", True, patch=[{"op": "add", "path": "/a~1b", "value": 1}]))
    raw = base64.b64decode(allow["response"]["patch"])
    assert json.loads(raw) == [{"op": "add", "path": "/a~1b", "value": 1}]


def test_view_cache_serves_the_previous_view_while_rebuilding() -> None:
    import time

    from webhook.app import ViewCache

    cache = ViewCache()
    first = cache.get(SNAP)
    assert cache.get(SNAP) is first
    bigger = dynamic(node("h0"), node("h1"))
    assert cache.get(bigger) is first  # stale while the new one is condensed
    deadline = time.monotonic() + 10
    while cache.get(bigger) is first and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cache.get(bigger).models["H100-80GB"].gpus == 16


def test_a_pod_too_deep_to_copy_is_denied_with_400(client: FlaskClient) -> None:
    # Copying the pod for the patch overflows the stack: a denial that names the cause,
    # not an internal error. The limit is pinned: Hypothesis may leave it raised.
    body = json.dumps(review(pod(annotations={"gpupack.io/gpu-memory": "1Gi"},
                                 spec={"x": _nested(600)})))
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        r = post(client, body)
    finally:
        sys.setrecursionlimit(old)
    resp = r.get_json()["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == 400
    assert "nested too deeply" in resp["status"]["message"]
