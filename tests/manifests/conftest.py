"""Fixtures of the manifest tests: rendered kustomize overlays and Helm chart, as object
lists (see manifests_helpers.py)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from manifests_helpers import MANIFESTS, Obj, helm_template, kustomize, load_docs, tool


@pytest.fixture(scope="session")
def manifests_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of manifests/ in which tls/make-self-signed.sh has run (the real script,
    real openssl), so the plain overlay renders without touching the work tree."""
    tool("openssl")
    dest = tmp_path_factory.mktemp("manifests") / "manifests"
    shutil.copytree(MANIFESTS, dest, ignore=shutil.ignore_patterns("generated", "__pycache__"))
    out = subprocess.run(["bash", str(dest / "tls" / "make-self-signed.sh")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return dest


@pytest.fixture(scope="session")
def base() -> list[Obj]:
    return kustomize(MANIFESTS / "base")


@pytest.fixture(scope="session")
def plain(manifests_copy: Path) -> list[Obj]:
    return kustomize(manifests_copy / "overlays" / "plain")


@pytest.fixture(scope="session")
def cert_manager() -> list[Obj]:
    return kustomize(MANIFESTS / "overlays" / "cert-manager")


@pytest.fixture(scope="session")
def helm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm")


@pytest.fixture(scope="session")
def render_helm(helm_dir: Path) -> Callable[[dict[str, Any] | None], list[Obj]]:
    cache: dict[str, list[Obj]] = {}

    def render(values: dict[str, Any] | None = None) -> list[Obj]:
        key = repr(values)
        if key not in cache:
            cache[key] = helm_template(values, helm_dir)[0]
        return cache[key]

    return render


@pytest.fixture(scope="session")
def helm_default(render_helm: Callable[[dict[str, Any] | None], list[Obj]]) -> list[Obj]:
    return render_helm(None)


@pytest.fixture(scope="session")
def examples() -> list[Obj]:
    objs: list[Obj] = []
    for path in sorted((MANIFESTS / "examples").glob("*.yaml")):
        objs += load_docs(path.read_text())
    return objs
