"""``--metrics-auth`` on the three commands that serve metrics: delegated by default
against an API server, off in static mode, and a clear exit 2 when delegated is asked for
with no API server to ask."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpupack.metrics_auth import effective_mode, metrics_auth_error, metrics_guard
from serving.metrics_auth import ScrapeGuard

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "gpupack" / "examples"


@pytest.mark.parametrize(("flag", "has_api", "mode", "error"), [
    (None, True, "delegated", False),
    (None, False, "none", False),
    ("delegated", True, "delegated", False),
    ("delegated", False, "delegated", True),
    ("none", True, "none", False),
    ("none", False, "none", False),
])
def test_modes(flag: str | None, has_api: bool, mode: str, error: bool) -> None:
    assert effective_mode(flag, has_api) == mode
    assert (metrics_auth_error(flag, has_api) is not None) is error


def api_client() -> Any:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:1"
    return client.ApiClient(cfg)


@pytest.mark.parametrize(("flag", "with_api", "guarded"), [
    (None, True, True),
    ("delegated", True, True),
    ("none", True, False),
    (None, False, False),
])
def test_guard_built(flag: str | None, with_api: bool, guarded: bool) -> None:
    guard = metrics_guard(flag, api_client() if with_api else None)
    assert isinstance(guard, ScrapeGuard) is guarded
    assert (guard is None) is not guarded


def gpupack(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpupack", *args], capture_output=True,
                          text=True, timeout=60, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp),
                               "KUBECONFIG": str(tmp / "no-such-kubeconfig"),
                               "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("command", [
    ["serve", "--metrics-port", "9401", "--metrics-auth", "delegated"],
    ["serve", "--nodes", str(EXAMPLES / "nodes.yaml"), "--pods", str(EXAMPLES / "pods.yaml"),
     "--metrics-auth", "delegated"],
    ["webhook", "--nodes", str(EXAMPLES / "nodes.yaml"), "--tls-cert", "c.pem",
     "--tls-key", "k.pem", "--metrics-auth", "delegated"],
    ["agent", "--no-patch", "--metrics-auth", "delegated"],
])
def test_delegated_without_an_api_server_is_refused(command: list[str], tmp_path: Path
                                                    ) -> None:
    done = gpupack(*command, tmp=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"gpupack {command[0]}: --metrics-auth delegated needs an API server" in done.stderr


def test_unknown_mode_is_a_usage_error(tmp_path: Path) -> None:
    done = gpupack("serve", "--metrics-auth", "tls", tmp=tmp_path)
    assert done.returncode == 2
    assert "--metrics-auth: invalid choice: 'tls'" in done.stderr
