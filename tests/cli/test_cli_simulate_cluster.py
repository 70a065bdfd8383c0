"""`gpupack simulate --nodes FILE --pods FILE` (issue 36, item 2): a cluster's pods
replayed on its nodes under both schedulers; what cannot be modelled is listed; bad
input names the file, the object and the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "gpupack" / "examples"


def gpupack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpupack", *args], capture_output=True,
                          text=True, timeout=300)


def test_example_cluster_json(tmp_path: Path) -> None:
    r = gpupack("simulate", "--nodes", str(EXAMPLES / "nodes.yaml"), "--pods",
                str(EXAMPLES / "pods.yaml"), "--format", "json", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["kind"] == "cluster"
    assert doc["replayed"] == 14  # 15 pods, one finished
    assert doc["notes"] == ["1 finished pod(s) (Succeeded or Failed) not replayed"]
    assert doc["unmodelled"] == []
    rows = {row["policy"]: row for row in doc["results"]}
    assert set(rows) == {"kube-scheduler", "gpupack"}
    for row in rows.values():
        assert row["served_when_sized"] and row["pods_waiting_peak"] == 0
        assert row["overcommitted"] == 0
        assert {f["pool"] for f in row["fragmentation"]} == {
            "h100-mig-0", "h100-mig-1", "l40s-ts", "h100-a"}
        for f in row["fragmentation"]:
            assert 0 <= f["unusable_gpus"] <= f["free_gpus"]
    assert rows["gpupack"]["gpus_in_use_peak"] <= rows["kube-scheduler"]["gpus_in_use_peak"]
    assert (tmp_path / "packing.png").read_bytes()[:4] == b"\x89PNG"


def test_waiting_pods_unmodelled_objects_and_a_refusal_are_listed(tmp_path: Path) -> None:
    nodes = yaml.safe_load((EXAMPLES / "nodes.yaml").read_text())
    pods = yaml.safe_load((EXAMPLES / "pods.yaml").read_text())
    base: dict[str, Any] = json.loads(json.dumps(pods["items"][-1]))  # the 2-GPU LLM pod
    for i in range(6):  # more 8-GPU pods than the 2 whole nodes hold
        p = json.loads(json.dumps(base))
        p["metadata"]["name"] = f"big-{i}"
        p["metadata"]["creationTimestamp"] = f"2026-12-01T09:0{i}:00Z"
        p["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "8"}
        pods["items"].append(p)
    amd = json.loads(json.dumps(base))
    amd["metadata"]["name"] = "rocm-0"
    amd["spec"]["containers"][0]["resources"]["limits"] = {"amd.com/gpu": "1"}
    pods["items"].append(amd)
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(nodes))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pods))
    r = gpupack("simulate", "--nodes", str(tmp_path / "n.yaml"), "--pods",
                str(tmp_path / "p.yaml"), "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "not modelled: Pod llm/rocm-0: asks for amd.com/gpu" in out
    assert "pod(s) would wait" in out and "llm/big-5" in out
    assert "waited for 8 whole GPU(s)" in out
    assert "fragmentation at the end" in out


@pytest.mark.parametrize(("args", "says"), [
    (["--nodes", "NODES"], "--nodes and --pods go together"),
    (["--from-cluster", "--nodes", "NODES", "--pods", "PODS"], "not both"),
    (["--from-cluster", "--kubeconfig", "/nonexistent/kubeconfig"],
     "--kubeconfig /nonexistent/kubeconfig"),
    (["--nodes", "NODES", "--pods", "PODS", "--namespace", "x"], "apply to --from-cluster"),
    (["--nodes", "NODES", "--pods", "PODS", "--scenario", "arrivals"], "do not apply"),
])
def test_bad_options_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    args = [str(EXAMPLES / "nodes.yaml") if a == "NODES" else
            str(EXAMPLES / "pods.yaml") if a == "PODS" else a for a in args]
    r = gpupack("simulate", "--out", str(tmp_path), *args)
    assert r.returncode == 2 and says in r.stderr, r.stderr


def test_bad_pod_names_the_file_object_and_field(tmp_path: Path) -> None:
    pods = yaml.safe_load((EXAMPLES / "pods.yaml").read_text())
    del pods["items"][3]["metadata"]["creationTimestamp"]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pods))
    r = gpupack("simulate", "--nodes", str(EXAMPLES / "nodes.yaml"), "--pods",
                str(tmp_path / "p.yaml"), "--out", str(tmp_path))
    assert r.returncode == 2
    name = pods["items"][3]["metadata"]["name"]
    assert f"{tmp_path / 'p.yaml'}: Pod speech/{name}: metadata.creationTimestamp" in r.stderr
