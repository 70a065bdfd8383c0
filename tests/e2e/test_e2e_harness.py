"""The e2e harness itself (tests/e2e/controlplane.py): a start that fails part-way leaves
no process running.

A component that never becomes ready is stopped by :meth:`Stack.start` before the
error goes on, and :func:`controlplane.up` stops every component it already started
when a later one fails (``bench/e2e_throughput.py`` once left etcd and kube-apiserver
behind after the extender did not come up)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import controlplane
import pytest
from conftest import need_go


def processes_under(path: Path) -> list[int]:
    """Live (not zombie) processes whose command line names ``path``."""
    found = []
    needle = str(path).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends


def test_a_component_that_never_becomes_ready_is_stopped(tmp_path: Path) -> None:
    stack = controlplane.Stack(tmp_path)
    marker = tmp_path / "never-ready"
    # A child of the component too: the whole process group must go.
    script = ("import subprocess, sys, time; "
              f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', "
              f"{str(marker)!r}]); time.sleep(120)")
    stack.save({"components": {"never": {
        "argv": [sys.executable, "-c", script, str(marker)],
        "ready": {"url": f"http://127.0.0.1:{closed_port()}/healthz"},
        "ready_timeout_s": 1.5, "grace_s": 2}}})
    started = time.monotonic()
    with pytest.raises(controlplane.StackError, match="never not ready within 2s"):
        stack.start("never")
    assert time.monotonic() - started < 30
    deadline = time.monotonic() + 5
    while processes_under(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_under(marker) == []
    assert stack.pid("never") is None  # its pid file is gone: nothing to stop later


def test_a_failed_bring_up_stops_what_it_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real etcd and kube-apiserver are started; the API server then 'never becomes
    ready' (its readiness check fails at once): up raises, and neither process is left."""
    need_go()
    real_wait = controlplane.Stack.wait_ready

    def wait_ready(self: controlplane.Stack, component: str, proc: Any = None,
                   timeout_s: float = 120.0) -> None:
        if component == "apiserver":
            raise controlplane.StackError("apiserver not ready (the test says so)")
        real_wait(self, component, proc, timeout_s)

    monkeypatch.setattr(controlplane.Stack, "wait_ready", wait_ready)
    base = tmp_path / "stack"
    with pytest.raises(controlplane.StackError, match="the test says so"):
        controlplane.up(base, agent=False, standby=False, plain=False)
    state = json.loads((base / "state.json").read_text())
    assert list(state["components"]) == ["etcd", "apiserver"]  # both had been started
    deadline = time.monotonic() + 10
    while processes_under(base) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_under(base) == []
    assert not any((base / "pids").glob("*.pid"))
    for component in ("etcd", "apiserver"):
        log = (base / "logs" / f"{component}.log").read_text()
        assert log.startswith("--- start"), component  # each really ran
    assert os.path.isdir(base / "etcd")
