"""The MutatingWebhookConfiguration field by field against
shared/reference/admission-v1.md; its CEL matchConditions compiled and evaluated (cel-python)
on sample pods."""

from __future__ import annotations

from typing import Any

import celpy
import pytest
from manifests_helpers import Obj, find

WEBHOOK_FIELDS = {"name", "clientConfig", "rules", "failurePolicy", "matchPolicy",
                  "namespaceSelector", "objectSelector", "sideEffects", "timeoutSeconds",
                  "admissionReviewVersions", "reinvocationPolicy", "matchConditions"}
LWS_WEBHOOK = "lws-mutating-webhook-configuration"


@pytest.fixture(params=["plain", "cert_manager", "helm_default"])
def objs(request: pytest.FixtureRequest) -> list[Obj]:
    result: list[Obj] = request.getfixturevalue(request.param)
    return result


def pod(limits: dict[str, str] | None = None, requests: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None, init_gpu: bool = False) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    container: dict[str, Any] = {"name": "main", "image": "img"}
    if resources:
        container["resources"] = resources
    meta: dict[str, Any] = {"name": "p", "namespace": "speech"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [container]}}


SAMPLES = {
    "mig-limit": (pod(limits={"nvidia.com/mig-1g.10gb": "1"}), True),
    "gpu-request": (pod(requests={"nvidia.com/gpu": "2"}), True),
    "shared": (pod(limits={"nvidia.com/gpu.shared": "1", "memory": "1Gi"}), True),
    "annotated": (pod(annotations={"gpupack.io/gpu-memory": "8Gi"}), True),
    "class-only": (pod(limits={"cpu": "1"}, annotations={"gpupack.io/class": "tts"}), True),
    "cpu-pod": (pod(limits={"cpu": "1"}, annotations={"team": "x"}), False),
    "bare-pod": (pod(), False),
    "other-vendor": (pod(limits={"amd.com/gpu": "1"}), False),
}


def evaluate(expression: str, obj: dict[str, Any]) -> bool:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return bool(program.evaluate({"object": celpy.json_to_cel(obj)}))


def test_configuration_fields(objs: list[Obj]) -> None:
    mwc = find(objs, "MutatingWebhookConfiguration")
    assert mwc["apiVersion"] == "admissionregistration.k8s.io/v1"
    # Sorted before the LeaderWorkerSet webhook: reinvocation brings it back after.
    assert mwc["metadata"]["name"] < LWS_WEBHOOK
    svc = find(objs, "Service", "gpupack-webhook")
    deploy = find(objs, "Deployment", "gpupack-webhook")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    names = set()
    for w in mwc["webhooks"]:
        assert set(w) <= WEBHOOK_FIELDS
        assert w["name"].endswith(".gpupack.io") and w["name"] not in names
        names.add(w["name"])
        assert w["admissionReviewVersions"] == ["v1"]
        assert w["sideEffects"] == "None"
        assert w["failurePolicy"] in {"Ignore", "Fail"}
        assert w["reinvocationPolicy"] == "IfNeeded"
        assert w["matchPolicy"] == "Equivalent"
        assert 1 <= w["timeoutSeconds"] <= 30
        assert w["rules"] == [{"operations": ["CREATE"], "apiGroups": [""],
                               "apiVersions": ["v1"], "resources": ["pods"],
                               "scope": "Namespaced"}]
        ref = w["clientConfig"]["service"]
        assert "url" not in w["clientConfig"]
        assert (ref["name"], ref["namespace"]) == (svc["metadata"]["name"],
                                                   svc["metadata"]["namespace"])
        assert ref["path"] == "/mutate"
        port = next(p for p in svc["spec"]["ports"] if p["port"] == ref["port"])
        assert port["targetPort"] == container["ports"][0]["name"]
        excluded = next(e for e in w["namespaceSelector"]["matchExpressions"]
                        if e["key"] == "kubernetes.io/metadata.name")
        assert excluded["operator"] == "NotIn"
        assert {"kube-system", svc["metadata"]["namespace"]} <= set(excluded["values"])
        assert 1 <= len(w["matchConditions"]) <= 64


def test_match_conditions_select_gpu_pods_only(objs: list[Obj]) -> None:
    mwc = find(objs, "MutatingWebhookConfiguration")
    hooks = {w["name"]: w for w in mwc["webhooks"]}
    gpu = hooks["gpu-pods.gpupack.io"]
    opted = hooks["opted-in.gpupack.io"]
    assert "matchLabels" not in gpu["namespaceSelector"]
    assert opted["namespaceSelector"]["matchLabels"] == {"gpupack.io/webhook": "enabled"}
    for label, (obj, is_gpu) in SAMPLES.items():
        g = all(evaluate(mc["expression"], obj) for mc in gpu["matchConditions"])
        o = all(evaluate(mc["expression"], obj) for mc in opted["matchConditions"])
        assert g == is_gpu, label
        assert o == (not is_gpu), label  # disjoint: no pod is reviewed twice
