"""The benchmark scripts still run (tiny sizes; the real runs are not part of CI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_group_placement_bench_runs_and_both_methods_place_the_group() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "group_placement.py"), "--nodes", "40",
         "--clique-size", "8", "--members", "2"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.splitlines()
    rows = [line.split() for line in out[1:]]
    assert [(r[0], r[1]) for r in rows] == [
        ("nvidia.com/gpu.clique", "cp-sat"), ("nvidia.com/gpu.clique", "greedy"),
        ("none", "cp-sat"), ("none", "greedy")]
    for r in rows:  # placed: time, domain ("-" without topology), idle left, broken
        assert len(r) == 6 and float(r[2]) >= 0 and int(r[4]) >= 0 and int(r[5]) >= 0, r
    assert all(r[3].startswith("c") for r in rows[:2])  # a clique was chosen


def test_extender_bench_pin_splits_client_from_server_cpus() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_extender", ROOT / "bench" / "extender.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.split_cpus({0, 1}) == ({0}, {1})
    assert mod.split_cpus({2, 5, 7}) == ({2}, {5, 7})
    assert mod.split_cpus({3}) is None


def test_device_plugin_bench_runs_and_the_plugin_booker_never_overfills() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "device_plugin.py"), "--runs", "20",
         "--arrivals", "30"], capture_output=True, text=True, timeout=120, check=True,
    ).stdout.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in out[2:]}
    assert set(rows) == {"memory-first", "plugin"}
    assert rows["plugin"][2] == "0"  # no GPU ever held more than its memory
    assert int(rows["memory-first"][2]) > 0  # the old booking did overfill
