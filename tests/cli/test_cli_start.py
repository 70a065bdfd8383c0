"""``gpupack --version`` and ``gpupack --help`` load no heavy stack (issue 36, item 5).

The test checks the import graph, not the wall clock (a loaded CI machine would make a
timing flaky): after each command, none of the solver, numeric, Kubernetes, web,
plotting or YAML packages is in ``sys.modules``. ``bench/cli_start.py`` times it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Top-level packages whose import costs tens to hundreds of milliseconds each.
HEAVY = ("ortools", "numpy", "kubernetes", "matplotlib", "flask", "gunicorn", "yaml",
         "prometheus_client", "grpc", "google", "pandas", "orjson", "pynvml")
# Of our own packages, only the CLI's wiring may be loaded.
OURS = ("packing", "kube", "scheduler", "webhook", "nodeagent", "serving", "sim")

PROBE = r"""
import json, sys
from gpupack.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})), file=sys.stderr)
"""


def loaded(*argv: str) -> tuple[str, set[str]]:
    r = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                       text=True, timeout=60)
    return r.stdout, set(json.loads(r.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["bogus-command"]],
                         ids=["version", "help", "unknown-command"])
def test_top_level_options_import_no_heavy_package(argv: list[str]) -> None:
    out, mods = loaded(*argv)
    assert not mods & set(HEAVY), sorted(mods & set(HEAVY))
    assert not mods & set(OURS), sorted(mods & set(OURS))
    if argv == ["--version"]:
        assert out.startswith("gpupack ")
    if argv == ["--help"]:
        for name in ("plan", "simulate", "serve", "webhook", "explain", "defrag", "agent"):
            assert name in out


def test_a_subcommand_loads_its_own_module_only() -> None:
    _, mods = loaded("explain", "--help")
    assert "webhook" in mods  # explain's own stack
    assert not mods & {"matplotlib", "scheduler", "sim"}


def test_probe_sees_heavy_imports() -> None:
    # The probe is not blind: a subcommand that needs the solver loads it.
    _, mods = loaded("plan", "--help")
    assert "ortools" in mods or "numpy" in mods
