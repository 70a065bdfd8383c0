"""Real AdmissionReview JSON through the real HTTPS server process on loopback."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
from webhook_builders import node, pod, review
from webhook_server import Cert, SecretVolume, Server, make_cert, start_server, stop_server


def _mutate(server: Server, cert: Cert, obj: Any, **kw: Any) -> dict[str, Any]:
    status, body = server.request(server.context(cert), "POST", "/mutate", review(obj, **kw))
    assert status == 200, body
    doc = json.loads(body)
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
    return doc["response"]


def _patched(obj: dict[str, Any], resp: dict[str, Any]) -> dict[str, Any]:
    assert resp["allowed"] is True and resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    return jsonpatch.apply_patch(obj, ops)


def test_small_pod_gets_a_mig_slice_pinned_to_the_product(
        https_server: tuple[Server, Cert]) -> None:
    server, cert = https_server
    obj = pod("asr-0", annotations={"gpupack.io/class": "asr"},
              containers=[{"name": "whisper", "image": "whisper:1",
                           "resources": {"requests": {"cpu": "2"}}}])
    resp = _mutate(server, cert, obj, uid="4b5f")
    assert resp["uid"] == "4b5f"
    out = _patched(obj, resp)
    assert out["spec"]["schedulerName"] == "gpupack"
    assert out["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "2", "nvidia.com/mig-1g.10gb": "1"},
        "limits": {"nvidia.com/mig-1g.10gb": "1"},
    }
    term = out["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term == {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                          "values": ["NVIDIA-H100-80GB-HBM3"]}]}
    ann = out["metadata"]["annotations"]
    assert ann["gpupack.io/gpu-memory"] == "8Gi" and ann["gpupack.io/class"] == "asr"
    assert json.loads(ann["gpupack.io/decision"])["profile"] == "1g.10gb"
    # reinvocationPolicy: IfNeeded sends the mutated pod again: nothing more to do.
    again = _mutate(server, cert, out)
    assert again["allowed"] is True and "patch" not in again and "patchType" not in again


def test_shared_pod_with_vllm_warns_and_strict_namespace_denies(
        https_server: tuple[Server, Cert]) -> None:
    server, cert = https_server
    obj = pod("tts-0", annotations={"gpupack.io/gpu-memory": "6Gi",
                                    "gpupack.io/isolation": "shared"},
              containers=[{"name": "vllm", "image": "vllm/vllm-openai:v0.6.3",
                           "args": ["--gpu-memory-utilization=0.9"]}])
    resp = _mutate(server, cert, obj)
    out = _patched(obj, resp)
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu.shared": "1"}
    assert len(resp["warnings"]) == 1 and "--gpu-memory-utilization 0.9" in resp["warnings"][0]
    denied = _mutate(server, cert, obj, namespace="prod")
    assert denied["allowed"] is False and denied["status"]["code"] == 403


def test_bad_inputs_over_https(https_server: tuple[Server, Cert]) -> None:
    server, cert = https_server
    ctx = server.context(cert)
    status, body = server.request(ctx, "POST", "/mutate", b"{")
    assert status == 400 and json.loads(body)["field"] == "body"
    status, body = server.request(ctx, "POST", "/mutate",
                                  {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "request": {"kind": {"kind": "Pod"}}})
    assert status == 400 and json.loads(body)["field"] == "request.uid"
    resp = _mutate(server, cert, pod(annotations={"gpupack.io/gpu-memory": "lots"}))
    assert resp["allowed"] is False and resp["status"]["code"] == 400
    assert "gpupack.io/gpu-memory: 'lots'" in resp["status"]["message"]
    resp = _mutate(server, cert, pod(annotations={"gpupack.io/gpu-memory": "96Gi"}))
    assert resp["allowed"] is False
    assert "largest is H100-80GB with 80Gi" in resp["status"]["message"]
    resp = _mutate(server, cert, pod(), operation="UPDATE")
    assert resp == {"uid": "uid-1", "allowed": True}
    status, body = server.request(ctx, "GET", "/healthz")
    assert status == 200
    status, body = server.request(ctx, "GET", "/metrics")
    text = body.decode()
    assert 'gpupack_webhook_reviews_total{class="none",outcome="malformed"} 2.0' in text
    assert "gpupack_webhook_latency_seconds_bucket" in text


def test_certificate_rotation_is_served_without_restart(tmp_path: Any) -> None:
    a, b, c = make_cert("cert-a"), make_cert("cert-b"), make_cert("cert-c")
    volume = SecretVolume(tmp_path / "certs")
    volume.write(a.cert_pem, a.key_pem)
    server = start_server(tmp_path, volume, [node("h100-0")])
    try:
        ctx = server.context(a, b, c)
        assert server.peer_der(ctx) == a.der
        volume.write(b.cert_pem, b.key_pem)  # cert-manager renews: atomic ..data swap
        assert server.peer_der(ctx) == b.der  # the very next connection
        # A half-rotated pair (new cert, old key) does not load: keep serving cert-b.
        volume.write(c.cert_pem, b.key_pem)
        assert server.peer_der(ctx) == b.der
        volume.write(c.cert_pem, c.key_pem)
        assert server.peer_der(ctx) == c.der
        status, _ = server.request(server.context(c), "POST", "/mutate",
                                   review(pod(annotations={"gpupack.io/gpu-memory": "5Gi"})))
        assert status == 200
        assert server.proc.poll() is None
    finally:
        stop_server(server)
    assert "keeping the previous certificate" in server.log.read_text()
