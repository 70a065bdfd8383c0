"""`gpupack plan` and `gpupack simulate` end to end, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

NODES = """
kind: NodeList
items:
- metadata:
    name: h100-mig-0
    labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, nvidia.com/gpu.count: "2"}
  status:
    allocatable:
      {cpu: "64", memory: 512Gi, nvidia.com/mig-1g.10gb: "7", nvidia.com/mig-3g.40gb: "1"}
- metadata:
    name: h100-0
    labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, nvidia.com/gpu.count: "10",
             nvidia.com/gpu.clique: a}
  status:
    allocatable: {cpu: "128", memory: 1Ti, nvidia.com/gpu: "10"}
"""
PODS = """
apiVersion: v1
kind: Pod
metadata:
  name: vllm-0
  namespace: llm
  labels: {leaderworkerset.sigs.k8s.io/name: vllm, leaderworkerset.sigs.k8s.io/group-index: "0",
           leaderworkerset.sigs.k8s.io/worker-index: "0"}
  annotations: {leaderworkerset.sigs.k8s.io/size: "2"}
spec:
  containers: [{name: c, resources: {limits: {nvidia.com/gpu: 1}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: asr-0, namespace: speech}
spec:
  containers: [{name: c, resources: {limits: {nvidia.com/mig-1g.10gb: 1, cpu: "1"}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: llm-0, namespace: llm}
spec:
  containers: [{name: c, resources: {limits: {nvidia.com/gpu: 8}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: llm-big, namespace: llm}
spec:
  containers: [{name: c, resources: {limits: {nvidia.com/gpu: 16}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: running, namespace: speech}
spec:
  nodeName: h100-mig-0
  containers: [{name: c, resources: {limits: {nvidia.com/mig-3g.40gb: 1}}}]
"""


def gpupack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupack", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "nodes.yaml").write_text(NODES)
    (tmp_path / "pods.yaml").write_text(PODS)
    return tmp_path / "nodes.yaml", tmp_path / "pods.yaml"


@pytest.mark.parametrize("policy", ["gpupack", "bestfit", "fgd"])
def test_plan_json_shape(files: tuple[Path, Path], policy: str) -> None:
    nodes, pods = files
    r = gpupack(
        "plan",
        "--nodes",
        str(nodes),
        "--pods",
        str(pods),
        "--format",
        "json",
        "--policy",
        policy,
        "--time-limit",
        "1",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    placed = {p["pod"]: p for p in out["placements"]}
    assert set(placed) == {"speech/asr-0", "llm/llm-0", "llm/vllm-0"}
    asr = placed["speech/asr-0"]
    assert asr["node"] == "h100-mig-0" and asr["mig"]["profile"] == "1g.10gb"
    assert set(asr["mig"]) == {"gpu", "profile", "start"} and asr["gpus"] == [asr["mig"]["gpu"]]
    assert len(placed["llm/llm-0"]["gpus"]) == 8 and placed["llm/llm-0"]["mig"] is None
    assert [u["pod"] for u in out["unschedulable"]] == ["llm/llm-big"]
    assert "16" in out["unschedulable"][0]["reason"]
    assert out["groups"] == [
        {
            "group": "llm/vllm/0",
            "size": 2,
            "nodes": ["h100-0"],
            "state": "reserved",
            "reason": "room held for members not created yet",
        }
    ]
    assert "llm/vllm/0#reserve-1" not in placed
    assert set(out["summary"]) == {
        "gpus_total",
        "gpus_allocated",
        "whole_gpus_free",
        "whole_nodes_free",
        "fragmentation",
    }
    assert out["summary"]["gpus_total"] == 12


@pytest.mark.parametrize(
    ("nodes_text", "pods_text", "needle"),
    ids=["not-yaml", "wrong-kind", "bad-node-cpu", "bad-pod-cpu"],
    argvalues=[
        ("a: [", "", "not valid YAML"),
        (NODES, "kind: Service\nmetadata: {name: x}", "expected Pod"),
        (NODES.replace('cpu: "64"', "cpu: lots"), PODS, "Node h100-mig-0: status.allocatable.cpu"),
        (NODES, PODS.replace('cpu: "1"', "cpu: lots"), "Pod speech/asr-0"),
    ],
)
def test_plan_bad_input_exits_2(
    tmp_path: Path, nodes_text: str, pods_text: str, needle: str
) -> None:
    (tmp_path / "n.yaml").write_text(nodes_text)
    (tmp_path / "p.yaml").write_text(pods_text)
    r = gpupack("plan", "--nodes", str(tmp_path / "n.yaml"), "--pods", str(tmp_path / "p.yaml"))
    assert r.returncode == 2
    assert needle in r.stderr


def test_simulate_small_scenario_json_and_png(tmp_path: Path) -> None:
    default = Path(__file__).resolve().parents[2] / "gpupack" / "scenarios" / "arrivals.yaml"
    scenario = yaml.safe_load(default.read_text())
    scenario["arrivals"] = 40
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    r = gpupack(
        "simulate",
        "--scenario",
        str(tmp_path / "s.yaml"),
        "--policies",
        "spread,bestfit,gpupack",
        "--format",
        "json",
        "--out",
        str(tmp_path),
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [x["policy"] for x in out["results"]] == ["spread", "bestfit", "gpupack"]
    for x in out["results"]:
        assert 0 < x["pods_placed"] <= x["pods_total"]
    gp = out["results"][2]
    assert gp["whole_nodes_free"] >= out["results"][0]["whole_nodes_free"]
    assert (tmp_path / "packing.png").read_bytes()[:4] == b"\x89PNG"


def test_simulate_bad_scenario_exits_2(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(
        "seed: 1\nnodes: [{prefix: a, count: 1, gpus: 1, product: NVIDIA-L40S, mode: magic}]\n"
    )
    r = gpupack("simulate", "--scenario", str(tmp_path / "s.yaml"))
    assert r.returncode == 2 and "nodes[0].mode" in r.stderr


L40S_NODES = """
kind: NodeList
items:
- metadata:
    name: l40s-gfd
    labels: {kubernetes.io/hostname: l40s-gfd, nvidia.com/gpu.product: NVIDIA-L40S,
             nvidia.com/gpu.count: "1", nvidia.com/gpu.memory: "46068",
             nvidia.com/gpu.replicas: "4"}
  status:
    allocatable: {cpu: "32", memory: 256Gi, nvidia.com/gpu.shared: "4"}
- metadata:
    name: l40s-bare
    labels: {kubernetes.io/hostname: l40s-bare, nvidia.com/gpu.product: NVIDIA-L40S,
             nvidia.com/gpu.count: "1", nvidia.com/gpu.replicas: "4"}
  status:
    allocatable: {cpu: "32", memory: 256Gi, nvidia.com/gpu.shared: "4"}
"""
SHARES = "".join(f"""---
apiVersion: v1
kind: Pod
metadata: {{name: tts-{i}, namespace: speech, annotations: {{gpupack.io/gpu-memory: 16Gi}}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  containers: [{{name: c, resources: {{limits: {{nvidia.com/gpu.shared: 1}}}}}}]
""" for i, node in enumerate(["l40s-gfd"] * 3 + ["l40s-bare"] * 3))


def test_plan_counts_the_nodes_gpu_memory_and_says_where_it_came_from(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    pods = tmp_path / "pods.yaml"
    nodes.write_text(L40S_NODES)
    pods.write_text(SHARES)
    r = gpupack("plan", "--nodes", str(nodes), "--pods", str(pods), "--format", "json",
                "--policy", "bestfit")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = {(m["memory_mib"], m["source"]): m["nodes"] for m in out["gpu_memory"]}
    assert rows == {(46068, "gfd"): 1, (49152, "catalog"): 1}
    placed = {p["pod"]: p["node"] for p in out["placements"]}
    # 3 x 16Gi fill the catalog's 49,152 MiB, not the 46,068 MiB GFD reports.
    assert sorted(placed.values()) == ["l40s-bare"] * 3 + ["l40s-gfd"] * 2
    table = gpupack("plan", "--nodes", str(nodes), "--pods", str(pods), "--policy", "bestfit")
    assert "gpu memory: L40S 46068 MiB from GPU Feature Discovery" in table.stdout
    assert "gpu memory: L40S 49152 MiB from gpupack's catalog" in table.stdout
