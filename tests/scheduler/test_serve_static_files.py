"""``gpupack serve --nodes/--pods`` reads its files once, in the worker (issue 17 item 6):
the gunicorn master keeps no copy of the cluster, and a bad file still ends the server
with one line naming the file and exit status 2."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpupack.cli import build_parser
from gpupack.serve_cmd import EXAMPLES, run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_master_does_not_parse_the_files(monkeypatch: pytest.MonkeyPatch) -> None:
    import kube.files

    parsed: list[str] = []
    real = kube.files.split_objects

    def counting(text: str, source: str, kinds: Any) -> Any:
        parsed.append(source)
        return real(text, source, kinds)

    monkeypatch.setattr(kube.files, "split_objects", counting)
    started: list[Any] = []

    class NotServing:
        def __init__(self, args: Any) -> None:
            started.append(args)

        def run(self) -> None:
            pass

    args = build_parser().parse_args(["serve", "--nodes", str(EXAMPLES / "nodes.yaml"),
                                      "--pods", str(EXAMPLES / "pods.yaml")])
    assert run(args, server=NotServing) == 0  # type: ignore[arg-type]
    assert len(started) == 1 and parsed == []


@pytest.mark.parametrize(("text", "needle"), [
    (json.dumps({"kind": "NodeList", "items": [{"kind": "Pod", "metadata": {"name": "x"}}]}),
     "kind: expected Node or ResourceSlice or DeviceClass or ResourceClaim or "
     "ResourceClaimTemplate or DeviceTaintRule, got 'Pod'"),
    ("items: [", "not valid YAML"),
], ids=["wrong-kind", "not-yaml"])
def test_a_bad_file_ends_the_server_with_status_2(tmp_path: Path, text: str,
                                                  needle: str) -> None:
    bad = tmp_path / "nodes.json"
    bad.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "gpupack", "serve", "--port", str(_free_port()),
         "--no-planner", "--nodes", str(bad), "--pods", str(EXAMPLES / "pods.yaml")],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.startswith("gpupack serve: ")]
    assert len(lines) == 1 and lines[0].startswith(f"gpupack serve: {bad}: ")
    assert needle in lines[0]
