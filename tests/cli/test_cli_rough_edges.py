"""The CLI as a user meets it: ``--version``, progress only on a terminal, matplotlib only
for the commands that draw, non-zero ``explain`` on denial, file names in parse errors,
a reason for every placement of ``plan``."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SCENARIO = REPO / "gpupack" / "scenarios" / "arrivals.yaml"

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
    name: l40s-0
    labels: {nvidia.com/gpu.product: NVIDIA-L40S, nvidia.com/gpu.count: "2",
             nvidia.com/gpu.replicas: "4"}
  status:
    allocatable: {cpu: "64", memory: 512Gi, nvidia.com/gpu.shared: "8"}
- metadata:
    name: h100-0
    labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, nvidia.com/gpu.count: "8"}
  status:
    allocatable: {cpu: "128", memory: 1Ti, nvidia.com/gpu: "8"}
"""
PODS = """
apiVersion: v1
kind: Pod
metadata: {name: asr-0, namespace: speech}
spec:
  containers: [{name: c, resources: {limits: {nvidia.com/mig-1g.10gb: 1}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: tts-0, namespace: speech}
spec:
  containers: [{name: c, resources: {limits: {nvidia.com/gpu.shared: 1}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: llm-0, namespace: llm}
spec:
  containers: [{name: c, resources: {limits: {nvidia.com/gpu: 4}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: llm-huge, namespace: llm}
spec:
  containers: [{name: c, resources: {limits: {nvidia.com/gpu: 16}}}]
"""


def gpupack(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpupack", *args], capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.fixture
def cluster(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "nodes.yaml").write_text(NODES)
    (tmp_path / "pods.yaml").write_text(PODS)
    return tmp_path / "nodes.yaml", tmp_path / "pods.yaml"


@pytest.fixture
def small_scenario(tmp_path: Path) -> Path:
    scenario = yaml.safe_load(DEFAULT_SCENARIO.read_text())
    scenario["arrivals"] = 30
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return path


def test_version() -> None:
    from importlib.metadata import version

    r = gpupack("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"gpupack {version('gpupack')}"


def test_progress_not_written_into_a_pipe(small_scenario: Path, tmp_path: Path) -> None:
    r = gpupack("simulate", "--scenario", str(small_scenario), "--policies", "spread",
                "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr and "arrivals" not in r.stderr


def test_progress_shown_on_a_terminal(small_scenario: Path, tmp_path: Path) -> None:
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpupack", "simulate", "--scenario", str(small_scenario),
             "--policies", "spread", "--out", str(tmp_path)],
            stdout=subprocess.PIPE, stderr=follower, timeout=300)
        os.close(follower)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
    assert proc.returncode == 0
    assert b"\rspread: 30/30 arrivals" in seen


# Commands that must work without matplotlib (the server image has no [sim] extra).
NO_PLOT = r"""
import sys
sys.modules["matplotlib"] = None  # any import of it raises ImportError
from gpupack.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_commands_without_matplotlib(cluster: tuple[Path, Path], tmp_path: Path,
                                     small_scenario: Path) -> None:
    nodes, pods = cluster
    r = subprocess.run([sys.executable, "-c", NO_PLOT, "plan", "--nodes", str(nodes),
                        "--pods", str(pods), "--policy", "bestfit"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", NO_PLOT, "serve", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", NO_PLOT, "simulate", "--scenario",
                        str(small_scenario), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "gpupack[sim]" in r.stderr and "matplotlib" in r.stderr


def test_cli_start_imports_no_plotting() -> None:
    code = ("import sys; from gpupack.cli import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_explain_exits_1_on_denial(tmp_path: Path) -> None:
    (tmp_path / "nodes.yaml").write_text(NODES)
    ok = {"apiVersion": "v1", "kind": "Pod",
          "metadata": {"name": "asr", "namespace": "speech",
                       "annotations": {"gpupack.io/gpu-memory": "8Gi"}},
          "spec": {"containers": [{"name": "c", "image": "asr"}]}}
    big = json.loads(json.dumps(ok))
    big["metadata"]["name"] = "big"
    big["metadata"]["annotations"]["gpupack.io/gpu-memory"] = "500Gi"
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(ok))
    (tmp_path / "both.yaml").write_text(yaml.safe_dump_all([ok, big]))
    r = gpupack("explain", str(tmp_path / "ok.yaml"), "--nodes", str(tmp_path / "nodes.yaml"))
    assert r.returncode == 0, r.stdout + r.stderr
    r = gpupack("explain", str(tmp_path / "both.yaml"), "--nodes",
                str(tmp_path / "nodes.yaml"))
    assert r.returncode == 1
    assert "speech/big (class small): DENIED" in r.stdout
    r = gpupack("explain", str(tmp_path / "both.yaml"), "--nodes",
                str(tmp_path / "nodes.yaml"), "--format", "json")
    assert r.returncode == 1
    assert [d["allowed"] for d in json.loads(r.stdout)] == [True, False]


@pytest.mark.parametrize(
    ("text", "needle"),
    ids=["not-yaml", "bad-field"],
    argvalues=[
        ("nodes: [", "not valid YAML"),
        ("seed: 1\nnodes: [{prefix: a, count: 1, gpus: 1, product: NVIDIA-L40S, "
         "mode: magic}]\n", "nodes[0].mode"),
    ],
)
def test_simulate_scenario_errors_name_the_file(tmp_path: Path, text: str,
                                                needle: str) -> None:
    path = tmp_path / "broken-scenario.yaml"
    path.write_text(text)
    r = gpupack("simulate", "--scenario", str(path))
    assert r.returncode == 2
    first = r.stderr.splitlines()[0]
    assert first.startswith(f"gpupack simulate: {path}: ") and needle in r.stderr


@pytest.mark.parametrize(
    ("which", "bad", "needle"),
    ids=["node-field", "pod-field"],
    argvalues=[
        ("nodes", ('cpu: "64"', "cpu: lots"), "Node h100-mig-0: status.allocatable.cpu"),
        ("pods", ("{name: c, resources: {limits: {nvidia.com/gpu: 4}}}",
                  "{name: c, resources: {limits: {nvidia.com/gpu: four}}}"), "Pod llm/llm-0"),
    ],
)
def test_plan_and_explain_object_errors_name_the_file(
        tmp_path: Path, which: str, bad: tuple[str, str], needle: str) -> None:
    nodes, pods = tmp_path / "n.yaml", tmp_path / "p.yaml"
    nodes.write_text(NODES.replace(*bad) if which == "nodes" else NODES)
    pods.write_text(PODS.replace(*bad) if which == "pods" else PODS)
    culprit = nodes if which == "nodes" else pods
    r = gpupack("plan", "--nodes", str(nodes), "--pods", str(pods))
    assert r.returncode == 2
    assert f"{culprit}: " in r.stderr and needle in r.stderr
    (tmp_path / "pod.yaml").write_text(PODS.split("---")[0])
    r = gpupack("explain", str(tmp_path / "pod.yaml"), "--nodes", str(nodes), "--pods",
                str(pods))
    assert r.returncode == 2
    assert f"{culprit}: " in r.stderr and needle in r.stderr


def test_openb_csv_errors_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                                        "n0,lots,1024,1,V100M16\n")
    (tmp_path / "pods.csv").write_text("name\n")
    r = gpupack("simulate", "--trace", "openb", "--nodes", str(tmp_path / "nodes.csv"),
                "--pods", str(tmp_path / "pods.csv"))
    assert r.returncode == 2
    assert str(tmp_path / "nodes.csv") in r.stderr and "lots" in r.stderr


def test_plan_gives_every_placement_a_reason(cluster: tuple[Path, Path]) -> None:
    nodes, pods = cluster
    r = gpupack("plan", "--nodes", str(nodes), "--pods", str(pods), "--format", "json",
                "--time-limit", "1")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    reasons = {p["pod"]: p["reason"] for p in out["placements"]}
    assert set(reasons) == {"speech/asr-0", "speech/tts-0", "llm/llm-0"}
    assert "MIG" in reasons["speech/asr-0"] and "1g.10gb" in reasons["speech/asr-0"]
    assert "share" in reasons["speech/tts-0"]
    assert "4 whole GPU" in reasons["llm/llm-0"]
    for reason in reasons.values():
        assert "\n" not in reason and "node(s) fit" in reason
    table = gpupack("plan", "--nodes", str(nodes), "--pods", str(pods), "--time-limit", "1")
    assert table.returncode == 0, table.stderr
    for pod, reason in reasons.items():
        (line,) = [ln for ln in table.stdout.splitlines() if ln.startswith(pod + " ")]
        assert line.rstrip().endswith(reason)


def test_simulate_picture_fits_1280_px_with_a_legend(small_scenario: Path,
                                                     tmp_path: Path) -> None:
    from PIL import Image

    from gpupack.render import legend_labels

    r = gpupack("simulate", "--scenario", str(small_scenario), "--out", str(tmp_path),
                "--format", "json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["results"]) == 5
    with Image.open(tmp_path / "packing.png") as png:
        width, height = png.size
    assert width == 1280 and height < 1000
    labels = " ".join(legend_labels())
    for meaning in ("ASR", "TTS", "LLM", "MIG slice created, unused", "free"):
        assert meaning in labels
