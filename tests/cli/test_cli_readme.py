"""The README's two commands are what .ci/run runs, and they use a virtual environment
(a stock Debian/Ubuntu Python refuses `pip install` outside one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def block(name: str) -> str:
    out = subprocess.run([sys.executable, str(REPO / ".ci" / "readme_block.py"), name],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_first_command_creates_and_uses_a_venv() -> None:
    steps = [s.strip() for s in block("install").split("&&")]
    assert steps[0] == "python3 -m venv .venv"
    assert steps[1] == ". .venv/bin/activate"
    # Every later step runs inside the venv: `python`, not the system's `python3`.
    assert all(not s.startswith(("python3 ", "pip ", "pip3 ", "sudo ")) for s in steps[2:])
    assert "python -m pip install -e '.[sim]'" in steps and steps[-1] == "gpupack simulate"


def test_test_command_uses_the_same_venv_and_runs_the_suite() -> None:
    steps = [s.strip() for s in block("test").split("&&")]
    assert steps[0] == ". .venv/bin/activate"
    assert "bash tests/install-tools.sh" in steps
    assert "python -m pip install -q -e '.[test]'" in steps
    assert steps[-1] == "python -m pytest"


def test_ci_runs_both_readme_blocks_in_order() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    calls = [line.split()[1] for line in ci.splitlines()
             if line.startswith("run_readme_block ")]
    assert calls == ["install", "test"]


def test_a_missing_block_is_an_error() -> None:
    out = subprocess.run([sys.executable, str(REPO / ".ci" / "readme_block.py"), "nope"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "ci: nope" in out.stderr
