"""`--mig-actuator` on `gpupack plan` and `gpupack simulate` (issue 19, item 1): off by
default, and then no MIG slice is promised on a GPU that does not have it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

NODES = """
kind: NodeList
items:
- metadata:
    name: h100-0
    labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, nvidia.com/gpu.count: "2",
             gpupack.io/mig-reconfigure: "true"}
  status:
    allocatable: {cpu: "64", memory: 512Gi, nvidia.com/gpu: "2"}
"""
PODS = """
apiVersion: v1
kind: Pod
metadata: {name: asr-0, namespace: speech}
spec:
  containers: [{name: c, resources: {limits: {nvidia.com/mig-1g.10gb: 1, cpu: "1"}}}]
"""


def gpupack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupack", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    ("flags", "placed", "reason"),
    [
        ([], False, "MIG is off on this node; it opts in to reconfiguration but the MIG "
                    "actuator is off"),
        (["--mig-actuator"], True, "created on an idle GPU switched to MIG"),
    ],
)
def test_plan_mig_pod_on_an_opted_in_whole_h100(tmp_path: Path, flags: list[str],
                                                placed: bool, reason: str) -> None:
    (tmp_path / "n.yaml").write_text(NODES)
    (tmp_path / "p.yaml").write_text(PODS)
    r = gpupack("plan", "--nodes", str(tmp_path / "n.yaml"), "--pods", str(tmp_path / "p.yaml"),
                "--format", "json", *flags)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = out["placements"] if placed else out["unschedulable"]
    assert [row["pod"] for row in rows] == ["speech/asr-0"]
    assert reason in rows[0]["reason"], rows[0]


def test_simulate_bundled_scenario_with_and_without_the_actuator(tmp_path: Path) -> None:
    runs = {}
    for flags in ([], ["--mig-actuator"]):
        r = gpupack("simulate", "--scenario", "arrivals", "--policies", "gpupack",
                    "--format", "json", "--out", str(tmp_path), "--quiet", *flags)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        runs[out["mig_actuator"]] = out["results"][0]
    off, on = runs[False], runs[True]
    # Off, the MIG pods have only the slices the MIG nodes report (all-balanced), and the
    # opted-in whole H100s stay whole: some MIG pods find no slice.
    assert off["pods_placed"] < off["pods_total"]
    assert set(off["failed_by_class"]) <= {"asr", "tts", "small"}
    # On, idle whole H100s may be partitioned: more pods are placed.
    assert on["pods_placed"] > off["pods_placed"]


@pytest.mark.parametrize(("flags", "says"), [
    (["--mig-timeout", "0"], "--mig-timeout and --mig-backoff must be positive"),
    (["--mig-backoff", "-1"], "--mig-timeout and --mig-backoff must be positive"),
    (["--mig-min-idle", "-5"], "--mig-min-idle must be 0 or positive"),
])
def test_serve_refuses_bad_mig_actuator_settings(flags: list[str], says: str) -> None:
    out = gpupack("serve", "--mig-actuator", *flags)
    assert out.returncode == 2 and says in out.stderr, out.stderr


def test_serve_refuses_a_malformed_mig_config_map() -> None:
    out = gpupack("serve", "--mig-actuator", "--mig-config-map", "a/b/c")
    assert out.returncode == 2 and "--mig-config-map 'a/b/c'" in out.stderr, out.stderr


@pytest.mark.parametrize(("flags", "says"), [
    (["--mig-compact"], "--mig-compact needs --mig-actuator"),
    (["--mig-actuator", "--mig-compact"], "--mig-compact needs a cluster"),
    (["--mig-actuator", "--mig-compact-max-pods", "0"],
     "--mig-compact-max-pods 0: must be at least 1"),
    (["--mig-actuator", "--mig-compact-evictions-per-hour", "-3"],
     "--mig-compact-evictions-per-hour -3: must be at least 1"),
    (["--mig-actuator", "--mig-compact-min-excess", "0"],
     "--mig-compact-min-excess 0: must be at least 1"),
    (["--mig-actuator", "--mig-compact-min-age", "-1"],
     "--mig-compact-min-age -1.0: must be 0 or positive"),
    (["--mig-actuator", "--mig-compact-dynamic-min-excess", "0"],
     "--mig-compact-dynamic-min-excess 0: must be at least 1"),
    (["--mig-actuator", "--mig-compact-dynamic-evictions-per-hour", "0"],
     "--mig-compact-dynamic-evictions-per-hour 0: must be at least 1"),
    (["--mig-actuator", "--mig-compact-kept-mode-max-pods", "0"],
     "--mig-compact-kept-mode-max-pods 0: must be at least 1"),
    (["--mig-actuator", "--mig-compact-kept-mode-min-age", "-5"],
     "--mig-compact-kept-mode-min-age -5.0: must be 0 or positive"),
])
def test_serve_refuses_bad_mig_compaction_settings(flags: list[str], says: str) -> None:
    out = gpupack("serve", *flags)
    assert out.returncode == 2 and says in out.stderr, out.stderr
