"""Chart-testing style tests of the Helm chart: `helm lint --strict` with every file of
``ci/``, a template test for every value of values.yaml (a value without one fails
``test_every_value_has_a_template_test``), schema tests that reject an unknown key at
every level and a wrongly typed value for every leaf, names derived from the release,
references that resolve, httpGet probes, NOTES.txt."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from manifests_helpers import (
    CHART,
    MANIFESTS,
    REPO,
    Obj,
    find,
    find_all,
    helm_template,
    tool,
)

VALUES: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
FULL: dict[str, Any] = yaml.safe_load((CHART / "ci" / "full-values.yaml").read_text())
CHART_META: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
Render = Callable[[dict[str, Any] | None], list[Obj]]

# Maps whose keys are the user's (labels, annotations, selectors): any key is valid.
FREE_FORM = {"commonLabels", "podAnnotations", "nodeSelector", "nodeAgent.nodeSelector",
             "monitoring.serviceMonitors.additionalLabels",
             "monitoring.prometheusRule.additionalLabels", "dashboards.additionalLabels",
             "dashboards.annotations"}
# Objects tested as one value (a resources block, an affinity).
WHOLE = {"resources.kubeScheduler", "resources.extender", "resources.webhook",
         "resources.nodeAgent", "affinity", "nodeAgent.affinity"}


def leaves(tree: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in FREE_FORM | WHOLE:
            yield from leaves(value, path + ".")
        else:
            yield path


def objects(tree: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Paths of the nested objects whose keys the chart defines ("" is the top)."""
    yield prefix.rstrip(".")
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in FREE_FORM | WHOLE:
            yield from objects(value, path + ".")


def nested(path: str, value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(path.split(".")):
        out = {part: out}
    assert isinstance(out, dict)
    return out


def get(tree: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        tree = tree[part]
    return tree


def pod_specs(objs: list[Obj]) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"]
            for o in objs if o["kind"] in ("Deployment", "DaemonSet")}


def containers(objs: list[Obj]) -> dict[str, Obj]:
    return {c["name"]: c for spec in pod_specs(objs).values() for c in spec["containers"]}


def arg(container: Obj, flag: str) -> str:
    cmd = container["command"]
    return str(cmd[cmd.index(flag) + 1])


def scheduler_config(objs: list[Obj], name: str = "gp-prod-scheduler-config") -> Obj:
    cm = find(objs, "ConfigMap", name)
    cfg: Obj = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    return cfg


def alerts(objs: list[Obj]) -> list[Obj]:
    return [r for pr in find_all(objs, "PrometheusRule") for g in pr["spec"]["groups"]
            for r in g["rules"] if "alert" in r]


def labelled(objs: list[Obj]) -> list[Obj]:
    return [o for o in objs if o["kind"] != "Namespace" or o["metadata"].get("labels")]


# --- one check per value: (values to render, or None for ci/full-values.yaml; check) ---

def _names(objs: list[Obj]) -> None:
    names = {o["metadata"]["name"] for o in objs if o["kind"] != "Namespace"}
    assert all(n.startswith("gp-prod") for n in names), sorted(names)


def _selectors(objs: list[Obj]) -> None:
    for o in objs:
        if o["kind"] in ("Deployment", "DaemonSet"):
            assert o["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "gpu"


def _common_labels(objs: list[Obj]) -> None:
    for o in labelled(objs):
        assert o["metadata"]["labels"]["team"] == "ml-platform", o["metadata"]["name"]
    for spec_owner in find_all(objs, "Deployment") + find_all(objs, "DaemonSet"):
        assert spec_owner["spec"]["template"]["metadata"]["labels"]["team"] == "ml-platform"


def _image(objs: list[Obj]) -> None:
    c = containers(objs)
    for name in ("extender", "webhook", "agent"):
        assert c[name]["image"] == "registry.internal/gpupack:9.9.9"


def _image_tag_default(objs: list[Obj]) -> None:
    c = containers(objs)
    assert c["extender"]["image"].endswith(":" + str(CHART_META["appVersion"]))


def _pull_policy(objs: list[Obj]) -> None:
    assert {c["imagePullPolicy"] for n, c in containers(objs).items()
            if n != "kube-scheduler"} == {"Always"}


def _pull_secrets(objs: list[Obj]) -> None:
    for spec in pod_specs(objs).values():
        assert spec["imagePullSecrets"] == [{"name": "registry-internal"}]


def _kube_scheduler_image(objs: list[Obj]) -> None:
    assert containers(objs)["kube-scheduler"]["image"] == (
        "registry.internal/kube-scheduler:v1.31.4")


def _verbosity(objs: list[Obj]) -> None:
    assert "--v=4" in containers(objs)["kube-scheduler"]["command"]


def _percentage_of_nodes_to_score(objs: list[Obj]) -> None:
    (profile,) = scheduler_config(objs)["profiles"]
    assert profile["percentageOfNodesToScore"] == 40


def _namespace(objs: list[Obj]) -> None:
    ns = find(objs, "Namespace", "gpupack")
    # Pod Security: restricted for gpupack's own pods (the agent has its own namespace).
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def _agent_namespace(objs: list[Obj]) -> None:
    ns = find(objs, "Namespace", "gpu-agents")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert find(objs, "DaemonSet")["metadata"]["namespace"] == "gpu-agents"
    assert find(objs, "ServiceAccount", "gp-prod-node-agent")["metadata"]["namespace"] == (
        "gpu-agents")
    binding = find(objs, "ClusterRoleBinding", "gp-prod-node-agent")
    assert binding["subjects"][0]["namespace"] == "gpu-agents"
    policy = find(objs, "ValidatingAdmissionPolicy", "gp-prod-node-agent-own-node")
    assert "system:serviceaccount:gpu-agents:gp-prod-node-agent" in (
        policy["spec"]["matchConditions"][0]["expression"])
    sm = find(objs, "ServiceMonitor", "gp-prod-node-agent")
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["gpu-agents"]}


def _replicas_scheduler(objs: list[Obj]) -> None:
    assert find(objs, "Deployment", "gp-prod-scheduler")["spec"]["replicas"] == 3


def _replicas_webhook(objs: list[Obj]) -> None:
    assert find(objs, "Deployment", "gp-prod-webhook")["spec"]["replicas"] == 3


def _resources(container: str, key: str) -> Callable[[list[Obj]], None]:
    def check(objs: list[Obj]) -> None:
        assert containers(objs)[container]["resources"] == FULL["resources"][key]
    return check


def _pod_annotations(objs: list[Obj]) -> None:
    for o in find_all(objs, "Deployment") + find_all(objs, "DaemonSet"):
        assert o["spec"]["template"]["metadata"]["annotations"]["example.com/scrape"] == "false"


def _deployments(objs: list[Obj]) -> list[Obj]:
    return [o["spec"]["template"]["spec"] for o in find_all(objs, "Deployment")]


def _node_selector(objs: list[Obj]) -> None:
    for spec in _deployments(objs):
        assert spec["nodeSelector"] == FULL["nodeSelector"]


def _tolerations(objs: list[Obj]) -> None:
    for spec in _deployments(objs):
        assert spec["tolerations"] == FULL["tolerations"]


def _affinity(objs: list[Obj]) -> None:
    for spec in _deployments(objs):
        assert spec["affinity"] == FULL["affinity"]


def _scheduler_name(objs: list[Obj]) -> None:
    assert scheduler_config(objs)["profiles"][0]["schedulerName"] == "packer"
    assert arg(containers(objs)["extender"], "--scheduler-name") == "packer"


def _extender_port(objs: list[Obj]) -> None:
    assert arg(containers(objs)["extender"], "--port") == "18888"
    assert scheduler_config(objs)["extenders"][0]["urlPrefix"] == "http://127.0.0.1:18888"


def _extender_metrics_port(objs: list[Obj]) -> None:
    ext = containers(objs)["extender"]
    assert arg(ext, "--metrics-port") == "19401"
    assert ext["ports"] == [{"name": "metrics", "containerPort": 19401, "protocol": "TCP"}]
    svc = find(objs, "Service", "gp-prod-scheduler-metrics")
    assert svc["spec"]["ports"][0]["port"] == 19401


def _weight(objs: list[Obj]) -> None:
    assert scheduler_config(objs)["extenders"][0]["weight"] == 7


def _http_timeout(objs: list[Obj]) -> None:
    assert scheduler_config(objs)["extenders"][0]["httpTimeout"] == "4s"
    # The Binding's own timeout stays below it (two thirds).
    assert arg(containers(objs)["extender"], "--bind-timeout") == "2.667"
    # GpupackExtenderSlow fires at a third of the timeout, and says which timeout.
    slow = next(a for a in alerts(objs) if a["alert"] == "GpupackExtenderSlow")
    assert slow["expr"].endswith(") > 1.333"), slow["expr"]
    assert "httpTimeout is 4s" in slow["annotations"]["description"]


def _max_group_gpus(objs: list[Obj]) -> None:
    assert arg(containers(objs)["extender"], "--max-group-gpus") == "32"


def _gc_freeze_every(objs: list[Obj]) -> None:
    assert arg(containers(objs)["extender"], "--gc-freeze-every") == "10"


def _max_namespace_reserved(objs: list[Obj]) -> None:
    assert arg(containers(objs)["extender"], "--max-namespace-reserved-gpus") == "25%"


def _dra_off(objs: list[Obj]) -> None:
    assert arg(containers(objs)["extender"], "--dra") == "off"
    cm = find(objs, "ConfigMap", "gp-prod-scheduler-config")
    assert "managedResources" in next(iter(cm["data"].values()))


def _mig_actuator(objs: list[Obj]) -> None:
    for name in ("extender", "webhook"):
        assert "--mig-actuator" in containers(objs)[name]["command"], name
    rules = find(objs, "ClusterRole", "gp-prod-extender")["rules"]
    assert {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]} in rules
    assert {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]} in rules


def _mig_config_map(objs: list[Obj]) -> None:
    assert arg(containers(objs)["extender"], "--mig-config-map").endswith("/mig-layouts")


def _mig_config_propagation(objs: list[Obj]) -> None:
    assert arg(containers(objs)["extender"], "--mig-config-propagation") == "120"


def _mig_config_map_namespace(objs: list[Obj]) -> None:
    assert arg(containers(objs)["extender"], "--mig-config-map") == "gpu-operator/mig-layouts"
    role = find(objs, "Role", "gp-prod-mig-config")
    assert role["metadata"]["namespace"] == "gpu-operator"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "verbs": ["get", "create", "update"]}]
    binding = find(objs, "RoleBinding", "gp-prod-mig-config")
    assert binding["subjects"][0]["name"] == "gp-prod-extender"
    # The extender's ConfigMap writes reach that namespace's mig-parted ConfigMap only.
    policy = find(objs, "ValidatingAdmissionPolicy", "gp-prod-extender-configmaps")
    expr = policy["spec"]["validations"][0]["expression"]
    assert "request.namespace == 'gpu-operator'" in expr and "'mig-layouts'" in expr


def _mig_compact(objs: list[Obj]) -> None:
    # With defragmentation off, only compaction asks for the Eviction API.
    assert "--mig-compact" in containers(objs)["extender"]["command"]
    assert "--mig-compact" not in containers(objs)["webhook"]["command"]
    rules = find(objs, "ClusterRole", "gp-prod-extender")["rules"]
    assert {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]} in rules


def _mig_compact_flag(flag: str, want: str) -> Callable[[list[Obj]], None]:
    def check(objs: list[Obj]) -> None:
        assert arg(containers(objs)["extender"], flag) == want
    return check


def _mig_compact_keep_room_off(objs: list[Obj]) -> None:
    assert "--no-mig-compact-keep-room" in containers(objs)["extender"]["command"]


def _policy(objs: list[Obj]) -> None:
    assert arg(containers(objs)["extender"], "--policy") == "bestfit"


def _defrag_mode(objs: list[Obj]) -> None:
    assert arg(containers(objs)["extender"], "--defrag") == "act"
    rules = find(objs, "ClusterRole", "gp-prod-extender")["rules"]
    assert {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]} in rules
    assert {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]} in rules


def _defrag_plan_mode(objs: list[Obj]) -> None:
    assert arg(containers(objs)["extender"], "--defrag") == "plan"
    rules = find(objs, "ClusterRole", "gp-prod-extender")["rules"]
    assert {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]} in rules
    assert not any("pods/eviction" in r["resources"] for r in rules)


def _defrag_rate(objs: list[Obj]) -> None:
    assert arg(containers(objs)["extender"], "--defrag-evictions-per-minute") == "5"


def _defrag_interval(objs: list[Obj]) -> None:
    assert arg(containers(objs)["extender"], "--defrag-interval") == "60"


def _defrag_consolidate(objs: list[Obj]) -> None:
    assert arg(containers(objs)["extender"], "--defrag-consolidate") == "01:00-05:00"


def _webhook_port(objs: list[Obj]) -> None:
    hook = containers(objs)["webhook"]
    assert arg(hook, "--port") == "18443" and hook["ports"][0]["containerPort"] == 18443


def _mwc(objs: list[Obj]) -> list[Obj]:
    hooks: list[Obj] = find(objs, "MutatingWebhookConfiguration")["webhooks"]
    return hooks


def _webhook_timeout(objs: list[Obj]) -> None:
    assert {w["timeoutSeconds"] for w in _mwc(objs)} == {10}


def _failure_policy(objs: list[Obj]) -> None:
    assert {w["failurePolicy"] for w in _mwc(objs)} == {"Fail"}


def _client_auth(objs: list[Obj]) -> None:
    hook = containers(objs)["webhook"]
    assert arg(hook, "--client-ca") == "/etc/gpupack/client-ca/ca.crt"
    assert {"name": "client-ca", "mountPath": "/etc/gpupack/client-ca",
            "readOnly": True} in hook["volumeMounts"]
    volumes = pod_specs(objs)["gp-prod-webhook"]["volumes"]
    assert {"name": "client-ca", "configMap": {"name": "gp-prod-webhook-client-ca"}} in volumes


def _client_ca(objs: list[Obj]) -> None:
    assert find(objs, "ConfigMap", "gp-prod-webhook-client-ca")["data"] == {"ca.crt": "CA_PEM"}


def _client_names(objs: list[Obj]) -> None:
    assert arg(containers(objs)["webhook"], "--client-name") == "kube-apiserver-webhook-client"


def _policies(objs: list[Obj]) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o["spec"] for o in find_all(objs, "NetworkPolicy")}


def _network_policy_off(objs: list[Obj]) -> None:
    assert not find_all(objs, "NetworkPolicy")


def _api_server_cidrs(objs: list[Obj]) -> None:
    (rule,) = _policies(objs)["gp-prod-webhook"]["ingress"]
    assert rule["ports"] == [{"port": "https", "protocol": "TCP"}]
    assert rule["from"][0] == {"ipBlock": {"cidr": "10.0.0.0/28"}}


def _metrics_from(objs: list[Obj]) -> None:
    peer = FULL["networkPolicy"]["metricsFrom"][0]
    policies = _policies(objs)
    for name in ("gp-prod-scheduler", "gp-prod-node-agent"):
        (rule,) = policies[name]["ingress"]
        assert rule == {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [peer]}
    # The webhook's /metrics is on its HTTPS port: Prometheus is admitted there too.
    assert peer in policies["gp-prod-webhook"]["ingress"][0]["from"]
    assert policies["gp-prod-default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress"]}


def _tls_secret_source(objs: list[Obj]) -> None:
    assert not find_all(objs, "Certificate") and not find_all(objs, "Issuer")


def _tls_cert_manager(objs: list[Obj]) -> None:
    cert = find(objs, "Certificate", "prod-gpupack-webhook")
    assert cert["spec"]["secretName"] == "prod-gpupack-webhook-tls"
    mwc = find(objs, "MutatingWebhookConfiguration", "prod-gpupack")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        "gpupack/prod-gpupack-webhook")


def _tls_secret_name(objs: list[Obj]) -> None:
    volumes = pod_specs(objs)["gp-prod-webhook"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "my-tls"}} in volumes


def _ca_bundle(objs: list[Obj]) -> None:
    assert {w["clientConfig"]["caBundle"] for w in _mwc(objs)} == {"Q0FfUEVN"}


def _agent_disabled(objs: list[Obj]) -> None:
    assert not find_all(objs, "DaemonSet")
    assert not [o for o in objs if "node-agent" in o["metadata"]["name"]]


def _agent_interval(objs: list[Obj]) -> None:
    assert arg(containers(objs)["agent"], "--interval") == "30"


def _agent_metrics_port(objs: list[Obj]) -> None:
    agent = containers(objs)["agent"]
    assert arg(agent, "--metrics-port") == "19402"
    assert agent["ports"][0]["containerPort"] == 19402


def _agent_runtime_class(objs: list[Obj]) -> None:
    assert pod_specs(objs)["gp-prod-node-agent"]["runtimeClassName"] == "nvidia-legacy"


def _agent_field(field: str) -> Callable[[list[Obj]], None]:
    def check(objs: list[Obj]) -> None:
        got, want = pod_specs(objs)["gp-prod-node-agent"][field], FULL["nodeAgent"][field]
        if field == "nodeSelector":
            # Helm merges maps with the default (nvidia.com/gpu.present stays unless
            # set to null); lists and the affinity object are replaced.
            assert want.items() <= got.items()
        else:
            assert got == want
    return check


def _service_monitors_off(objs: list[Obj]) -> None:
    assert not find_all(objs, "ServiceMonitor")


def _sm_interval(objs: list[Obj]) -> None:
    assert {e["interval"] for sm in find_all(objs, "ServiceMonitor")
            for e in sm["spec"]["endpoints"]} == {"15s"}


def _sm_labels(objs: list[Obj]) -> None:
    sms = find_all(objs, "ServiceMonitor")
    assert len(sms) == 3
    assert all(sm["metadata"]["labels"]["release"] == "kube-prometheus-stack" for sm in sms)


def _rule_off(objs: list[Obj]) -> None:
    assert not find_all(objs, "PrometheusRule")


def _rule_labels(objs: list[Obj]) -> None:
    rule = find(objs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def _runbooks(objs: list[Obj]) -> None:
    for a in alerts(objs):
        assert a["annotations"]["runbook_url"] == (
            f"https://wiki.internal/gpupack/runbooks#{a['alert'].lower()}")


def _no_device_classes(objs: list[Obj]) -> None:
    assert not [o for o in objs if o["kind"] == "DeviceClass"]


def _dashboards_off(objs: list[Obj]) -> None:
    assert not [o for o in objs if o["metadata"].get("labels", {}).get("grafana_dashboard")]


def _dashboard_maps(objs: list[Obj]) -> list[Obj]:
    maps = [o for o in objs if o["kind"] == "ConfigMap"
            and o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(maps) == 3
    return maps


def _dashboard_labels(objs: list[Obj]) -> None:
    for cm in _dashboard_maps(objs):
        assert cm["metadata"]["labels"]["team"] == "ml-platform"


def _dashboard_annotations(objs: list[Obj]) -> None:
    for cm in _dashboard_maps(objs):
        assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}


def _kube_scheduler_tag_default(objs: list[Obj]) -> None:
    # helm_template renders for cluster v1.37.1: the tag follows the cluster.
    assert containers(objs)["kube-scheduler"]["image"] == "registry.k8s.io/kube-scheduler:v1.37.1"


CASES: dict[str, tuple[dict[str, Any] | None, Callable[[list[Obj]], None]]] = {
    "nameOverride": (None, _selectors),
    "fullnameOverride": (None, _names),
    "commonLabels": (None, _common_labels),
    "image.repository": (None, _image),
    "image.tag": ({}, _image_tag_default),
    "image.pullPolicy": (None, _pull_policy),
    "imagePullSecrets": (None, _pull_secrets),
    "kubeScheduler.image": (None, _kube_scheduler_image),
    "kubeScheduler.tag": ({}, _kube_scheduler_tag_default),
    "kubeScheduler.verbosity": (None, _verbosity),
    "kubeScheduler.percentageOfNodesToScore": (None, _percentage_of_nodes_to_score),
    "namespace.create": (None, _namespace),
    "replicas.scheduler": (None, _replicas_scheduler),
    "replicas.webhook": (None, _replicas_webhook),
    "resources.kubeScheduler": (None, _resources("kube-scheduler", "kubeScheduler")),
    "resources.extender": (None, _resources("extender", "extender")),
    "resources.webhook": (None, _resources("webhook", "webhook")),
    "resources.nodeAgent": (None, _resources("agent", "nodeAgent")),
    "podAnnotations": (None, _pod_annotations),
    "nodeSelector": (None, _node_selector),
    "tolerations": (None, _tolerations),
    "affinity": (None, _affinity),
    "schedulerName": (None, _scheduler_name),
    "extender.port": (None, _extender_port),
    "extender.metricsPort": (None, _extender_metrics_port),
    "extender.weight": (None, _weight),
    "extender.httpTimeout": (None, _http_timeout),
    "extender.maxGroupGpus": (None, _max_group_gpus),
    "extender.maxNamespaceReservedGpus": (None, _max_namespace_reserved),
    "extender.gcFreezeEverySeconds": (None, _gc_freeze_every),
    "extender.dra": (None, _dra_off),
    "migActuator.enabled": (None, _mig_actuator),
    "migActuator.configMap": (None, _mig_config_map),
    "migActuator.configMapNamespace": (None, _mig_config_map_namespace),
    "migActuator.configPropagationSeconds": (None, _mig_config_propagation),
    "migActuator.compact.enabled": (None, _mig_compact),
    "migActuator.compact.evictionsPerHour": (
        None, _mig_compact_flag("--mig-compact-evictions-per-hour", "60")),
    "migActuator.compact.minAgeSeconds": (None, _mig_compact_flag("--mig-compact-min-age",
                                                                  "600")),
    "migActuator.compact.maxPods": (None, _mig_compact_flag("--mig-compact-max-pods", "2")),
    "migActuator.compact.minExcess": (None, _mig_compact_flag("--mig-compact-min-excess",
                                                              "1")),
    "migActuator.compact.dynamicMinExcess": (
        None, _mig_compact_flag("--mig-compact-dynamic-min-excess", "2")),
    "migActuator.compact.dynamicEvictionsPerHour": (
        None, _mig_compact_flag("--mig-compact-dynamic-evictions-per-hour", "90")),
    "migActuator.compact.keptModeMaxPods": (
        None, _mig_compact_flag("--mig-compact-kept-mode-max-pods", "4")),
    "migActuator.compact.keptModeMinAgeSeconds": (
        None, _mig_compact_flag("--mig-compact-kept-mode-min-age", "30")),
    "migActuator.compact.keepRoom": (None, _mig_compact_keep_room_off),
    "migActuator.compact.steerMargin": (
        None, _mig_compact_flag("--mig-compact-steer-margin", "2")),
    "migActuator.compact.steerKeep": (
        None, _mig_compact_flag("--mig-compact-steer-keep", "1")),
    "policy": (None, _policy),
    "defrag.mode": (None, _defrag_mode),
    "defrag.evictionsPerMinute": (None, _defrag_rate),
    "defrag.intervalSeconds": (None, _defrag_interval),
    "defrag.consolidateWindow": (None, _defrag_consolidate),
    "webhook.port": (None, _webhook_port),
    "webhook.timeoutSeconds": (None, _webhook_timeout),
    "webhook.failurePolicy": (None, _failure_policy),
    "webhook.clientAuth.enabled": (None, _client_auth),
    "webhook.clientAuth.caBundle": (None, _client_ca),
    "webhook.clientAuth.names": (None, _client_names),
    "networkPolicy.enabled": ({"networkPolicy": {"enabled": False}}, _network_policy_off),
    "networkPolicy.apiServerCIDRs": (None, _api_server_cidrs),
    "networkPolicy.metricsFrom": (None, _metrics_from),
    "tls.source": (None, _tls_secret_source),
    "tls.secretName": (None, _tls_secret_name),
    "tls.caBundle": (None, _ca_bundle),
    "nodeAgent.enabled": ({"nodeAgent": {"enabled": False}}, _agent_disabled),
    "nodeAgent.namespace": (None, _agent_namespace),
    "nodeAgent.interval": (None, _agent_interval),
    "nodeAgent.metricsPort": (None, _agent_metrics_port),
    "nodeAgent.runtimeClassName": (None, _agent_runtime_class),
    "nodeAgent.nodeSelector": (None, _agent_field("nodeSelector")),
    "nodeAgent.tolerations": (None, _agent_field("tolerations")),
    "nodeAgent.affinity": (None, _agent_field("affinity")),
    "monitoring.serviceMonitors.enabled": (
        {"monitoring": {"serviceMonitors": {"enabled": False}}}, _service_monitors_off),
    "monitoring.serviceMonitors.interval": (None, _sm_interval),
    "monitoring.serviceMonitors.additionalLabels": (None, _sm_labels),
    "monitoring.prometheusRule.enabled": (
        {"monitoring": {"prometheusRule": {"enabled": False}}}, _rule_off),
    "monitoring.prometheusRule.additionalLabels": (None, _rule_labels),
    "monitoring.prometheusRule.runbookBaseURL": (None, _runbooks),
    "dashboards.enabled": ({"dashboards": {"enabled": False}}, _dashboards_off),
    "dra.deviceClasses": ({"dra": {"deviceClasses": False}}, _no_device_classes),
    "dashboards.additionalLabels": (None, _dashboard_labels),
    "dashboards.annotations": (None, _dashboard_annotations),
}
# The certManager path of tls.source is the default; checked under another release name.
EXTRA_CASES = {"tls.source=certManager": ("prod", _tls_cert_manager)}


def test_every_value_has_a_template_test() -> None:
    assert sorted(leaves(VALUES)) == sorted(CASES)
    # ci/full-values.yaml sets every value its check reads away from the default.
    for path, (values, _) in CASES.items():
        if values is None:
            assert get(FULL, path) != get(VALUES, path), path


@pytest.mark.parametrize("path", sorted(CASES))
def test_value_reaches_the_objects(path: str, render_helm: Render) -> None:
    values, check = CASES[path]
    check(render_helm(FULL if values is None else values))


def test_mig_compact_alone_grants_evictions(render_helm: Render) -> None:
    # Defragmentation off: compaction is what asks for the Eviction API; without it, none.
    objs = render_helm({**FULL, "defrag": {**FULL["defrag"], "mode": "off"}})
    _mig_compact(objs)
    mig = FULL["migActuator"]
    objs = render_helm({**FULL, "defrag": {**FULL["defrag"], "mode": "off"},
                        "migActuator": {**mig, "compact": {**mig["compact"], "enabled": False}}})
    assert "--mig-compact" not in containers(objs)["extender"]["command"]
    rules = find(objs, "ClusterRole", "gp-prod-extender")["rules"]
    assert not any("pods/eviction" in r["resources"] for r in rules)


def test_client_auth_needs_a_ca(helm_dir: Path) -> None:
    _, err = helm_template({"webhook": {"clientAuth": {"enabled": True}}}, helm_dir,
                           expect_ok=False)
    assert "webhook.clientAuth.enabled needs webhook.clientAuth.caBundle" in err
    objs, _ = helm_template(None, helm_dir)
    assert "--client-ca" not in containers(objs)["webhook"]["command"]


def test_webhook_port_open_to_all_without_api_server_cidrs(render_helm: Render) -> None:
    (rule,) = _policies(render_helm({**FULL, "networkPolicy": {"enabled": True}})
                        )["gp-prod-webhook"]["ingress"]
    assert "from" not in rule


def test_cert_manager_names_follow_the_release(helm_dir: Path) -> None:
    objs, _ = helm_template(None, helm_dir, release="prod")
    EXTRA_CASES["tls.source=certManager"][1](objs)


def test_defrag_plan_grants_events_only(render_helm: Render) -> None:
    mig = FULL["migActuator"]  # compaction off: it would ask for evictions too
    objs = render_helm({**FULL, "defrag": {**FULL["defrag"], "mode": "plan"},
                        "migActuator": {**mig, "compact": {**mig["compact"], "enabled": False}}})
    _defrag_plan_mode(objs)
    assert "--defrag-consolidate" not in containers(objs)["extender"]["command"]


@pytest.mark.parametrize("ci_values", sorted((CHART / "ci").glob("*-values.yaml")),
                         ids=lambda p: p.name)
def test_helm_lint_strict_with_ci_values(ci_values: Path) -> None:
    out = subprocess.run([tool("helm"), "lint", "--strict", str(CHART), "-f", str(ci_values)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# --- schema: unknown keys and wrong types are errors --------------------------------

SCHEMA_ERROR = "values don't meet the specifications of the schema"


@pytest.mark.parametrize("path", sorted(objects(VALUES)), ids=lambda p: p or "top")
def test_schema_rejects_unknown_keys(path: str, helm_dir: Path) -> None:
    typo = {"enable": False}  # as in the issue: nodeAgent.enable for nodeAgent.enabled
    values = typo if not path else nested(path, typo)
    _, err = helm_template(values, helm_dir, expect_ok=False)
    assert SCHEMA_ERROR in err and "enable" in err


def _wrong(value: Any) -> Any:
    if isinstance(value, bool):
        return "true"
    if isinstance(value, int | float):
        return "many"
    if isinstance(value, str):
        return 12
    return "not-an-object-or-list"


@pytest.mark.parametrize("path", sorted(leaves(VALUES)))
def test_schema_rejects_wrong_types(path: str, helm_dir: Path) -> None:
    _, err = helm_template(nested(path, _wrong(get(VALUES, path))), helm_dir,
                           expect_ok=False)
    assert SCHEMA_ERROR in err, err


@pytest.mark.parametrize("bad", [
    {"fullnameOverride": "Not_A_Name"}, {"kubeScheduler": {"tag": "1.31"}},
    {"imagePullSecrets": [{"secret": "x"}]}, {"tolerations": [{"operator": "Maybe"}]},
    {"monitoring": {"serviceMonitors": {"interval": "soon"}}},
    {"monitoring": {"prometheusRule": {"runbookBaseURL": "wiki/runbooks"}}},
    {"commonLabels": {"team": 1}}, {"affinity": {"nodeAfinity": {}}},
    {"defrag": {"mode": "on"}}, {"defrag": {"consolidateWindow": "1am-5am"}},
    {"policy": "dotproduct"},  # a registry name the extender's --policy does not take
    {"extender": {"maxNamespaceReservedGpus": "half"}},
    {"extender": {"maxNamespaceReservedGpus": "50 %"}},
])
def test_schema_rejects_bad_values(bad: dict[str, Any], helm_dir: Path) -> None:
    _, err = helm_template(bad, helm_dir, expect_ok=False)
    assert SCHEMA_ERROR in err


# --- names, references, probes, versions, NOTES --------------------------------------

@pytest.mark.parametrize(("release", "values", "prefix"), [
    ("gpupack", None, "gpupack"),
    ("prod", None, "prod-gpupack"),
    ("gpupack-eu", None, "gpupack-eu"),
    ("x", {"fullnameOverride": "gp"}, "gp"),
    ("x", {"nameOverride": "packer"}, "x-packer"),
])
def test_names_derive_from_the_release(release: str, values: dict[str, Any] | None,
                                       prefix: str, helm_dir: Path) -> None:
    objs, _ = helm_template(values, helm_dir, release=release)
    for o in objs:
        if o["kind"] == "Namespace":
            continue  # named after the release's namespace (the agent's: <ns>-node-agent)
        name = o["metadata"]["name"]
        assert name == prefix or name.startswith(prefix + "-"), (o["kind"], name)
    check_references(objs)
    lease = scheduler_config(objs, f"{prefix}-scheduler-config")["leaderElection"]
    assert lease["resourceName"] == f"{prefix}-scheduler"
    # The ServiceMonitor names the scrape job after the Service: the alert that the
    # extender is down watches this release's, in its namespace.
    down = next(a for a in alerts(objs) if a["alert"] == "GpupackExtenderDown")
    job = f"{prefix}-scheduler-metrics"
    assert f'up{{job="{job}",namespace="gpupack"}}' in down["expr"], down["expr"]
    assert find(objs, "Service", job)


@pytest.mark.parametrize(("timeout", "threshold"), [("3s", "1"), ("500ms", "0.167"),
                                                     ("1m", "20")])
def test_slow_alert_is_a_third_of_the_http_timeout(timeout: str, threshold: str,
                                                   helm_dir: Path) -> None:
    objs, _ = helm_template({"extender": {"httpTimeout": timeout}}, helm_dir)
    slow = next(a for a in alerts(objs) if a["alert"] == "GpupackExtenderSlow")
    assert slow["expr"].endswith(f") > {threshold}"), slow["expr"]
    assert f"httpTimeout is {timeout}," in slow["annotations"]["description"]
    # The extender's --bind-timeout: two thirds of it, at most 30 s.
    seconds = {"3s": 3.0, "500ms": 0.5, "1m": 60.0}[timeout]
    bind = float(arg(containers(objs)["extender"], "--bind-timeout"))
    assert bind == min(30.0, round(seconds * 2 / 3, 3))


def test_schema_policies_are_the_extenders() -> None:
    from packing.policies import policy_names

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["policy"]["enum"] == policy_names()


def check_references(objs: list[Obj]) -> None:
    """Every object a rendered object points at by name is rendered too."""
    have = {(o["kind"], o["metadata"]["name"]) for o in objs}
    for name, spec in pod_specs(objs).items():
        assert ("ServiceAccount", spec["serviceAccountName"]) in have, name
        for v in spec.get("volumes", []):
            if "configMap" in v:
                assert ("ConfigMap", v["configMap"]["name"]) in have
    for o in objs:
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            ref = o["roleRef"]
            assert ref["name"].startswith("system:") or ref["name"].startswith(
                "extension-apiserver") or (ref["kind"], ref["name"]) in have
            for s in o["subjects"]:
                assert ("ServiceAccount", s["name"]) in have
    for hook in find(objs, "MutatingWebhookConfiguration")["webhooks"]:
        assert ("Service", hook["clientConfig"]["service"]["name"]) in have
    for cert in find_all(objs, "Certificate"):
        assert ("Issuer", cert["spec"]["issuerRef"]["name"]) in have


def test_every_container_has_http_probes(helm_default: list[Obj], base: list[Obj]) -> None:
    for objs in (helm_default, base):
        for name, c in containers(objs).items():
            probes = [c[k] for k in ("livenessProbe", "readinessProbe") if k in c]
            assert c.get("livenessProbe"), name
            assert all(set(p) & {"httpGet"} and "exec" not in p for p in probes), name
        ext = containers(objs)["extender"]
        assert ext["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert ext["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        hook = containers(objs)["webhook"]
        assert hook["readinessProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize(("cluster", "tag"), [
    ("v1.31.4", "v1.31.4"), ("1.30.2", "v1.30.2"), ("v1.33.1-eks-a737599", "v1.33.1"),
    ("v1.32.3+k3s1", "v1.32.3"),
])
def test_kube_scheduler_follows_the_cluster(cluster: str, tag: str, helm_dir: Path) -> None:
    objs, _ = helm_template(None, helm_dir, kube_version=cluster)
    assert containers(objs)["kube-scheduler"]["image"] == f"registry.k8s.io/kube-scheduler:{tag}"


def test_older_clusters_are_refused(helm_dir: Path) -> None:
    _, err = helm_template(None, helm_dir, expect_ok=False, kube_version="v1.29.9")
    assert "requires kubeVersion" in err


def test_versions_agree(base: list[Obj]) -> None:
    """One release number: pyproject, Chart.yaml appVersion, the kustomize image tag."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert CHART_META["appVersion"] == project
    kustomization = yaml.safe_load((MANIFESTS / "base" / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert image["newTag"] == project
    images = {c["image"] for n, c in containers(base).items() if n != "kube-scheduler"}
    assert images == {f"{image['name']}:{project}"}


def test_notes(tmp_path: Path) -> None:
    values = tmp_path / "v.yaml"
    values.write_text(yaml.safe_dump({"monitoring": {"serviceMonitors": {
        "additionalLabels": {"release": "kps"}}}}))
    out = subprocess.run(
        [tool("helm"), "install", "prod", str(CHART), "--namespace", "ml", "--dry-run=client",
         "-f", str(values)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    notes = out.stdout[out.stdout.index("NOTES:"):]
    assert "deployment/prod-gpupack-scheduler" in notes
    assert "schedulerName: gpupack" in notes and "gpupack.io/webhook=enabled" in notes
    assert "kube-scheduler v1." in notes
    assert "without additionalLabels" not in notes
    default = subprocess.run(
        [tool("helm"), "install", "gpupack", str(CHART), "--namespace", "gpupack",
         "--dry-run=client"], capture_output=True, text=True, timeout=60)
    assert "without additionalLabels" in default.stdout


def test_runbook_of_every_alert_exists(helm_default: list[Obj]) -> None:
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^## (.+)$", runbooks, re.M)}
    found = alerts(helm_default)
    assert found
    for a in found:
        url = a["annotations"]["runbook_url"]
        assert url.startswith(str(VALUES["monitoring"]["prometheusRule"]["runbookBaseURL"]))
        assert url.split("#")[1] in anchors, a["alert"]
