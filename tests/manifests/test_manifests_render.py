"""Rendering with the real tools, schema validation, and Helm == kustomize."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from manifests_helpers import CHART, K8S_VERSION, Obj, find, find_all, helm_template, tool

from packing.dra import served

CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "Certificate", "Issuer", "LeaderWorkerSet"}
BASE_KINDS = {
    "Namespace": 2, "ServiceAccount": 4, "Secret": 1, "ClusterRole": 3, "ClusterRoleBinding": 8,
    "Role": 2, "RoleBinding": 3, "ConfigMap": 4, "Deployment": 2, "DaemonSet": 1,
    "Service": 3, "PodDisruptionBudget": 2, "MutatingWebhookConfiguration": 1,
    "ServiceMonitor": 3, "PrometheusRule": 1,
    "ValidatingAdmissionPolicy": 5, "ValidatingAdmissionPolicyBinding": 5,
    "NetworkPolicy": 4,
    "DeviceClass": len(served.device_classes()),
}


def kinds(objs: list[Obj]) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in objs:
        out[o["kind"]] = out.get(o["kind"], 0) + 1
    return out


def identity(o: Obj) -> tuple[str, str, str, str]:
    return (o["apiVersion"], o["kind"], o["metadata"].get("namespace", ""),
            o["metadata"]["name"])


def test_base_renders_every_object(base: list[Obj]) -> None:
    assert kinds(base) == BASE_KINDS
    assert len({identity(o) for o in base}) == len(base)


def test_plain_overlay_adds_secret_and_ca_bundle(plain: list[Obj]) -> None:
    secret = find(plain, "Secret", "gpupack-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    mwc = find(plain, "MutatingWebhookConfiguration")
    assert all(w["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
               for w in mwc["webhooks"])
    assert "cert-manager.io/inject-ca-from" not in mwc["metadata"].get("annotations", {})


def test_cert_manager_overlay(cert_manager: list[Obj]) -> None:
    cert = find(cert_manager, "Certificate", "gpupack-webhook")
    issuer = find(cert_manager, "Issuer", cert["spec"]["issuerRef"]["name"])
    assert issuer["metadata"]["namespace"] == cert["metadata"]["namespace"] == "gpupack"
    assert "selfSigned" in issuer["spec"]
    svc = find(cert_manager, "Service", "gpupack-webhook")
    dns = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    assert dns in cert["spec"]["dnsNames"]
    mwc = find(cert_manager, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{cert['metadata']['namespace']}/{cert['metadata']['name']}")
    assert all("caBundle" not in w["clientConfig"] for w in mwc["webhooks"])
    deploy = find(cert_manager, "Deployment", "gpupack-webhook")
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == cert["spec"]["secretName"]


def validate_objects(objs: list[Obj]) -> list[str]:
    """Schema-validate (strict: unknown fields are errors) every built-in object;
    returns the kinds left to the structural checks."""
    skipped = []
    for o in objs:
        if o["kind"] in CRD_KINDS:
            skipped.append(o["kind"])
            continue
        try:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{o['kind']}/{o['metadata']['name']}: {e.message} at "
                        f"{'/'.join(str(p) for p in e.path)}")
    return skipped


@pytest.mark.parametrize("which", ["base", "plain", "cert_manager", "helm_default",
                                   "helm_secret", "examples"])
def test_schema_valid(which: str, request: pytest.FixtureRequest,
                      render_helm: Callable[[dict[str, Any] | None], list[Obj]]) -> None:
    if which == "helm_secret":
        objs = render_helm({"tls": {"source": "secret", "caBundle": "Y2E="}})
    else:
        objs = request.getfixturevalue(which)
    skipped = validate_objects(objs)
    assert set(skipped) <= CRD_KINDS
    check_crds_structurally(objs)


def check_crds_structurally(objs: list[Obj]) -> None:
    services = find_all(objs, "Service")
    for sm in find_all(objs, "ServiceMonitor"):
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        sel = sm["spec"]["selector"]["matchLabels"]
        namespaces = sm["spec"].get("namespaceSelector", {}).get(
            "matchNames", [sm["metadata"]["namespace"]])
        hits = [s for s in services
                if s["metadata"]["namespace"] in namespaces
                and sel.items() <= s["metadata"]["labels"].items()]
        assert len(hits) == 1, f"ServiceMonitor {sm['metadata']['name']} selects {len(hits)}"
        ports = {p["name"] for p in hits[0]["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            assert ep["port"] in ports and ep["path"] == "/metrics"
            assert re.fullmatch(r"\d+[smh]", ep["interval"])
    for pr in find_all(objs, "PrometheusRule"):
        assert pr["apiVersion"] == "monitoring.coreos.com/v1"
        for group in pr["spec"]["groups"]:
            assert group["name"] and group["rules"]
            for rule in group["rules"]:
                assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
                assert rule["labels"]["severity"] in {"critical", "warning", "info"}
                assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    for cert in find_all(objs, "Certificate"):
        assert cert["apiVersion"] == "cert-manager.io/v1"
        assert cert["spec"]["secretName"] and cert["spec"]["dnsNames"]
        assert cert["spec"]["issuerRef"]["kind"] in {"Issuer", "ClusterIssuer"}
    for issuer in find_all(objs, "Issuer"):
        assert issuer["apiVersion"] == "cert-manager.io/v1"
    for lws in find_all(objs, "LeaderWorkerSet"):
        check_leaderworkerset(lws)


def check_leaderworkerset(lws: Obj) -> None:
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert set(lws["spec"]) <= {"replicas", "leaderWorkerTemplate", "rolloutStrategy",
                                "startupPolicy", "networkConfig"}
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert set(tmpl) <= {"leaderTemplate", "workerTemplate", "size", "restartPolicy",
                         "subGroupPolicy"}
    assert tmpl["size"] >= 2 and tmpl["restartPolicy"] in {
        "RecreateGroupOnPodRestart", "None", "Default"}
    for key in ("leaderTemplate", "workerTemplate"):
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate",
                        "metadata": {"name": f"{lws['metadata']['name']}-{key}"},
                        "template": tmpl[key]}
        kubernetes_validate.validate(pod_template, K8S_VERSION, strict=True)
        spec = tmpl[key]["spec"]
        assert spec["schedulerName"] == "gpupack"
        limits = spec["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) >= 1
        assert tmpl[key]["metadata"]["annotations"]["gpupack.io/class"] == "whole"


def test_examples(examples: list[Obj]) -> None:
    deploys = {d["metadata"]["name"]: d for d in find_all(examples, "Deployment")}
    assert set(deploys) == {"whisper-asr", "coqui-tts"}
    for name, klass in (("whisper-asr", "asr"), ("coqui-tts", "tts")):
        tmpl = deploys[name]["spec"]["template"]
        ann = tmpl["metadata"]["annotations"]
        assert ann["gpupack.io/class"] == klass
        assert re.fullmatch(r"\d+Gi", ann["gpupack.io/gpu-memory"])
        assert tmpl["spec"]["schedulerName"] == "gpupack"
        # No GPU resource written by hand: the webhook chooses the slice.
        for c in tmpl["spec"]["containers"]:
            assert not any(k.startswith("nvidia.com/") for k in c["resources"].get("limits", {}))
    assert len(find_all(examples, "LeaderWorkerSet")) == 1


def test_helm_lint() -> None:
    out = subprocess.run([tool("helm"), "lint", "--strict", str(CHART)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _normalize(o: Obj) -> Obj:
    """An object without what legitimately differs between Helm and kustomize: Helm's
    bookkeeping labels and config checksum, comments/whitespace inside embedded YAML,
    JSON and CEL."""
    o = json.loads(json.dumps(o))
    meta = o["metadata"]
    meta.pop("labels", None)
    tmpl = o.get("spec", {}).get("template", {}).get("metadata")
    if tmpl:
        tmpl.get("annotations", {}).pop("checksum/config", None)
        if not tmpl.get("annotations"):
            tmpl.pop("annotations", None)
    if o["kind"] == "ConfigMap":
        for k, v in list(o["data"].items()):
            o["data"][k] = json.loads(v) if k.endswith(".json") else yaml.safe_load(v)
    if o["kind"] == "MutatingWebhookConfiguration":
        for w in o["webhooks"]:
            for mc in w.get("matchConditions", []):
                mc["expression"] = " ".join(mc["expression"].split())
    return o


def test_helm_renders_the_same_objects_as_kustomize(
        render_helm: Callable[[dict[str, Any] | None], list[Obj]],
        cert_manager: list[Obj]) -> None:
    helm = render_helm({"namespace": {"create": True}})
    h = {identity(o): _normalize(o) for o in helm}
    k = {identity(o): _normalize(o) for o in cert_manager}
    assert sorted(h) == sorted(k)
    for key in k:
        assert h[key] == k[key], f"{key} differs between Helm and kustomize"


def test_helm_values_apply(render_helm: Callable[[dict[str, Any] | None], list[Obj]]) -> None:
    values = {
        "image": {"repository": "registry.internal/gpupack", "tag": "9.9.9"},
        "replicas": {"scheduler": 3, "webhook": 4},
        "resources": {"extender": {"requests": {"cpu": "2", "memory": "1Gi"}}},
        "schedulerName": "packer",
        "extender": {"weight": 7, "httpTimeout": "4s"},
        "policy": "bestfit",
        "tls": {"source": "secret", "caBundle": "Q0FfUEVN"},
        "nodeAgent": {"enabled": False},
        "dashboards": {"enabled": False},
    }
    objs = render_helm(values)
    sched = find(objs, "Deployment", "gpupack-scheduler")
    assert sched["spec"]["replicas"] == 3
    assert find(objs, "Deployment", "gpupack-webhook")["spec"]["replicas"] == 4
    containers = {c["name"]: c for c in sched["spec"]["template"]["spec"]["containers"]}
    ext = containers["extender"]
    assert ext["image"] == "registry.internal/gpupack:9.9.9"
    assert ext["resources"]["requests"] == {"cpu": "2", "memory": "1Gi"}
    cmd = ext["command"]
    assert cmd[cmd.index("--scheduler-name") + 1] == "packer"
    assert cmd[cmd.index("--policy") + 1] == "bestfit"
    cfg = yaml.safe_load(find(objs, "ConfigMap", "gpupack-scheduler-config")["data"][
        "scheduler-config.yaml"])
    assert cfg["profiles"][0]["schedulerName"] == "packer"
    assert (cfg["extenders"][0]["weight"], cfg["extenders"][0]["httpTimeout"]) == (7, "4s")
    mwc = find(objs, "MutatingWebhookConfiguration")
    assert all(w["clientConfig"]["caBundle"] == "Q0FfUEVN" for w in mwc["webhooks"])
    assert "annotations" not in mwc["metadata"]
    present = {o["kind"] for o in objs}
    assert not present & {"Certificate", "Issuer", "DaemonSet"}
    assert not [o for o in objs if "node-agent" in o["metadata"]["name"]]
    assert not [o for o in objs if o["metadata"].get("labels", {}).get("grafana_dashboard")]


def test_helm_secret_source_requires_ca_bundle(helm_dir: Path) -> None:
    _, err = helm_template({"tls": {"source": "secret"}}, helm_dir, expect_ok=False)
    assert "tls.source=secret needs tls.caBundle" in err
    _, err = helm_template({"tls": {"source": "vault"}}, helm_dir, expect_ok=False)
    assert "/tls/source" in err  # values.schema.json: an enum


@pytest.mark.parametrize("bad", [
    {"extender": {"weight": 0}}, {"extender": {"httpTimeout": "3 seconds"}},
    {"webhook": {"timeoutSeconds": 31}}, {"webhook": {"failurePolicy": "Retry"}},
    {"kubeScheduler": {"tag": "latest"}}, {"replicas": {"scheduler": 0}},
])
def test_helm_rejects_bad_values(bad: dict[str, Any], helm_dir: Path) -> None:
    _, err = helm_template(bad, helm_dir, expect_ok=False)
    assert "values don't meet the specifications of the schema" in err


def test_dashboards_are_grafana_configmaps(base: list[Obj]) -> None:
    maps = [o for o in base if o["kind"] == "ConfigMap"
            and o["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert len(maps) == 3
    uids = set()
    for cm in maps:
        (text,) = cm["data"].values()
        dash = json.loads(text)
        uids.add(dash["uid"])
        assert dash["templating"]["list"][0]["type"] == "datasource"
        ids = [p["id"] for p in dash["panels"]]
        assert len(ids) == len(set(ids))
        for p in dash["panels"]:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24
            assert p["targets"] and all(t["expr"] for t in p["targets"])
            assert p["datasource"]["uid"] == "${datasource}"
    assert len(uids) == 3
    main = yaml.safe_dump(maps)
    for needle in ("gpupack_whole_gpus_free", "gpupack_fragmentation_ratio",
                   "gpupack_pending_pods", "gpupack_gpu_allocated",
                   "gpupack_pod_gpu_memory_growth_bytes_per_second",
                   "gpupack_extender_request_seconds_bucket", "gpupack_plan_solve_seconds"):
        assert needle in main
