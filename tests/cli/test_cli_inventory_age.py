"""``--inventory-max-age`` (serve, webhook) and ``--inventory-refresh`` (agent): checked,
applied only against a cluster, and the expiry thread re-reads an ageing node."""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import pytest
from test_cli_metrics_auth import EXAMPLES, gpupack

from gpupack.inventory_expiry import (
    add_inventory_age_argument,
    inventory_age,
    inventory_age_error,
    start_expiry,
)
from kube.cache import ClusterCache
from kube.inventory_age import InventoryAge


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
@pytest.mark.parametrize("command", [
    ["serve"],
    ["webhook", "--nodes", str(EXAMPLES / "nodes.yaml"), "--tls-cert", "c.pem",
     "--tls-key", "k.pem"],
])
def test_a_bad_max_age_is_refused_naming_the_flag(command: list[str], value: str,
                                                  tmp_path: Path) -> None:
    done = gpupack(*command, "--inventory-max-age", value, tmp=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"--inventory-max-age {float(value)!r}: must be 0 (no limit)" in done.stderr


def test_a_bad_refresh_is_refused_naming_the_flag(tmp_path: Path) -> None:
    done = gpupack("agent", "--no-patch", "--inventory-refresh", "-5", tmp=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "--inventory-refresh -5.0: must be 0" in done.stderr


@pytest.mark.parametrize(("refresh", "warned"), [("900", True), ("300", False)])
def test_a_refresh_as_long_as_the_max_age_is_warned_of(refresh: str, warned: bool,
                                                       tmp_path: Path) -> None:
    # --metrics-auth delegated without an API server ends the run after the warnings.
    done = gpupack("agent", "--no-patch", "--inventory-refresh", refresh,
                   "--metrics-auth", "delegated", tmp=tmp_path)
    assert done.returncode == 2, done.stderr
    assert ("an idle node's inventory goes stale between writes" in done.stderr) is warned


def parse(*flags: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_inventory_age_argument(p)
    return p.parse_args(list(flags))


@pytest.mark.parametrize(("flags", "live", "limit"), [
    ((), True, 900.0),
    (("--inventory-max-age", "60"), True, 60.0),
    (("--inventory-max-age", "0"), True, None),  # no limit
    ((), False, None),  # static files: no agent refreshes them
])
def test_the_limit_applies_against_a_cluster_only(flags: tuple[str, ...], live: bool,
                                                  limit: float | None) -> None:
    args = parse(*flags)
    assert inventory_age_error(args) is None
    age = inventory_age(args, live)
    assert (None if age is None else age.max_age_s) == limit


def test_the_expiry_thread_re_reads_an_ageing_node() -> None:
    now = [1_700_000_000.0]
    cache = ClusterCache("gpupack", inventory_age=InventoryAge(60), clock=lambda: now[0])
    inv = json.dumps({"v": 1, "node": "a", "ts": int(now[0]), "gpus": [
        {"i": 0, "uuid": "GPU-1", "model": "NVIDIA-H100-80GB-HBM3", "mem": 81559, "used": 0,
         "mode": "whole", "pods": []}]})
    cache.replace([{"metadata": {"name": "a", "annotations": {"gpupack.io/inventory": inv},
                                 "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                            "nvidia.com/gpu.count": "1"}},
                    "status": {"allocatable": {"nvidia.com/gpu": "1"}}}], [])
    stop = threading.Event()
    t = start_expiry(cache, stop, every_s=0.01)
    assert t is not None
    try:
        time.sleep(0.05)
        assert cache.stale_inventories == 0
        now[0] += 60
        deadline = time.monotonic() + 10
        while cache.stale_inventories == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cache.stale_inventories == 1
        with cache.lock:
            assert cache.state.nodes["a"].info.gpus[0].inferred
    finally:
        stop.set()
        t.join(5)
    assert not t.is_alive()


def test_no_thread_without_a_limit() -> None:
    assert start_expiry(ClusterCache("gpupack"), threading.Event()) is None
