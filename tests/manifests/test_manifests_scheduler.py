"""The KubeSchedulerConfiguration and the scheduler Deployment, field by field against
shared/reference/extender-v1.md, and every gpupack command line against the real CLI."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from manifests_helpers import MANIFESTS, Obj, find

from gpupack.cli import build_parser

sys.path.insert(0, str(MANIFESTS))
from generate import managed_resources

# extenders[] fields of kubescheduler.config.k8s.io/v1 (reference).
EXTENDER_FIELDS = {"urlPrefix", "filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb",
                   "weight", "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable",
                   "managedResources", "ignorable"}


def scheduler_config(objs: list[Obj]) -> dict[str, Any]:
    cm = find(objs, "ConfigMap", "gpupack-scheduler-config")
    (key, text), = cm["data"].items()
    assert key == "scheduler-config.yaml"
    cfg = yaml.safe_load(text)
    assert isinstance(cfg, dict)
    return cfg


def containers(objs: list[Obj], kind: str, name: str) -> dict[str, Obj]:
    spec = find(objs, kind, name)["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"]}


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def duration_s(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text)
    assert m, f"not a Go duration this check knows: {text}"
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m.group(2)]


@pytest.fixture(params=["base", "helm_default"])
def objs(request: pytest.FixtureRequest) -> list[Obj]:
    result: list[Obj] = request.getfixturevalue(request.param)
    return result


def test_config_header_and_leader_election(objs: list[Obj]) -> None:
    cfg = scheduler_config(objs)
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    le = cfg["leaderElection"]
    assert le["leaderElect"] is True and le["resourceLock"] == "leases"
    assert le["resourceNamespace"] == "gpupack" and le["resourceName"]
    role = find(objs, "Role", "gpupack-leader-election")
    assert role["metadata"]["namespace"] == le["resourceNamespace"]
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["get", "create", "update"]}]
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["gpupack"]


def test_extender_stanza(objs: list[Obj]) -> None:
    cfg = scheduler_config(objs)
    (ext,) = cfg["extenders"]
    assert set(ext) <= EXTENDER_FIELDS
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"], ext["preemptVerb"]) == (
        "filter", "prioritize", "bind", "preempt")
    # weight must be > 0 when prioritizeVerb is set; scores 0..10 x weight x 10.
    assert isinstance(ext["weight"], int) and ext["weight"] > 0
    assert ext["nodeCacheCapable"] is True
    assert ext["ignorable"] is False  # with bindVerb, binding goes through us anyway
    assert ext["enableHTTPS"] is False and "tlsConfig" not in ext  # loopback sidecar
    assert 0 < duration_s(ext["httpTimeout"]) <= 5.0
    # Every pod of the profile: a pod whose GPUs are ResourceClaims names no resource.
    assert "managedResources" not in ext


def test_without_dra_only_gpu_pods_reach_the_extender(render_helm: Any) -> None:
    objs = render_helm({"extender": {"dra": False}})
    (ext,) = scheduler_config(objs)["extenders"]
    names = [r["name"] for r in ext["managedResources"]]
    assert names == managed_resources()  # exactly the catalog's, no duplicates
    assert all(r["ignoredByScheduler"] is False for r in ext["managedResources"])
    cmd = containers(objs, "Deployment", "gpupack-scheduler")["extender"]["command"]
    assert flag(cmd, "--dra") == "off"


def test_extender_sidecar_serves_the_configured_url(objs: list[Obj]) -> None:
    ext = scheduler_config(objs)["extenders"][0]
    m = re.fullmatch(r"http://127\.0\.0\.1:(\d+)", ext["urlPrefix"])
    assert m, ext["urlPrefix"]
    sidecar = containers(objs, "Deployment", "gpupack-scheduler")["extender"]
    cmd = sidecar["command"]
    assert cmd[:2] == ["gpupack", "serve"]
    assert flag(cmd, "--host") == "127.0.0.1" and flag(cmd, "--port") == m.group(1)
    args = build_parser().parse_args(cmd[1:])  # the real CLI accepts every flag
    assert (args.host, args.port, args.in_cluster) == ("127.0.0.1", int(m.group(1)), True)
    assert args.scheduler_name == scheduler_config(objs)["profiles"][0]["schedulerName"]
    assert args.metrics_port == sidecar["ports"][0]["containerPort"]
    assert args.metrics_host == "0.0.0.0"  # the ServiceMonitor scrapes the pod IP


def test_scheduler_deployment(objs: list[Obj]) -> None:
    deploy = find(objs, "Deployment", "gpupack-scheduler")
    assert deploy["spec"]["replicas"] == 2
    spec = deploy["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "gpupack-scheduler"
    ks = {c["name"]: c for c in spec["containers"]}["kube-scheduler"]
    image, _, tag = ks["image"].rpartition(":")
    assert image == "registry.k8s.io/kube-scheduler"
    assert re.fullmatch(r"v1\.(3[0-9])\.\d+", tag), "pin a released version, never latest"
    config_arg = next(a for a in ks["command"] if a.startswith("--config="))
    path = Path(config_arg.split("=", 1)[1])
    mount = next(m for m in ks["volumeMounts"] if m["mountPath"] == str(path.parent))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == "gpupack-scheduler-config"
    assert path.name in find(objs, "ConfigMap", "gpupack-scheduler-config")["data"]
    pdb = find(objs, "PodDisruptionBudget", "gpupack-scheduler")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]


def test_node_agent_daemonset(objs: list[Obj]) -> None:
    ds = find(objs, "DaemonSet", "gpupack-node-agent")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["hostPID"] is True and spec["runtimeClassName"] == "nvidia"
    (agent,) = spec["containers"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert not any(k.startswith("nvidia.com/") for k in agent["resources"].get("limits", {}))
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    assert all(m.get("readOnly") is True for m in mounts.values())
    assert {volumes[m["name"]] for m in mounts.values()} == {
        "/var/lib/kubelet/pod-resources", "/proc"}
    cmd = agent["command"]
    args = build_parser().parse_args(cmd[1:])
    assert args.command == "agent"
    assert volumes[mounts[args.proc_root]["name"]] == "/proc"
    sock = Path(args.podresources_socket)
    assert volumes[mounts[str(sock.parent)]["name"]] == "/var/lib/kubelet/pod-resources"
    assert args.metrics_port == agent["ports"][0]["containerPort"]
    assert not args.no_patch and not args.once


def test_webhook_command_line(objs: list[Obj]) -> None:
    deploy = find(objs, "Deployment", "gpupack-webhook")
    spec = deploy["spec"]["template"]["spec"]
    container = {c["name"]: c for c in spec["containers"]}["webhook"]
    cmd = container["command"]
    assert cmd[:2] == ["gpupack", "webhook"]
    # Every flag but the cluster source must be one the real CLI takes, and consistent
    # with the TLS mount and the Service's target port.
    static = [a for a in cmd[1:] if a != "--in-cluster"] + ["--nodes", "nodes.yaml"]
    args = build_parser().parse_args(static)
    assert args.command == "webhook"
    assert args.port == container["ports"][0]["containerPort"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    tls_dir = str(Path(args.tls_cert).parent)
    assert Path(args.tls_key).parent == Path(tls_dir) and mounts[tls_dir]["readOnly"]
    secret = next(v for v in spec["volumes"] if v["name"] == mounts[tls_dir]["name"])["secret"]
    assert secret["secretName"] == "gpupack-webhook-tls"
    assert build_parser().parse_args(cmd[1:]).in_cluster
