"""Fixtures of the manifest tests: rendered kustomize overlays and Helm chart, as object
lists. Rendering uses the real tools: ``kubectl kustomize`` and ``helm template``
(tests/manifests/install-k8s-tools.sh installs them when missing)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
CHART = MANIFESTS / "helm" / "gpupack"
K8S_VERSION = "1.37.0"

Obj = dict[str, Any]


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (bash tests/manifests/install-k8s-tools.sh "
                    "installs it; .ci/run does)")
    return path


def load_docs(text: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(text) if d]


def kustomize(path: Path) -> list[Obj]:
    out = subprocess.run([tool("kubectl"), "kustomize", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return load_docs(out.stdout)


def helm_template(values: dict[str, Any] | None = None, tmp: Path | None = None,
                  expect_ok: bool = True) -> tuple[list[Obj], str]:
    cmd = [tool("helm"), "template", "gpupack", str(CHART), "--namespace", "gpupack"]
    if values:
        assert tmp is not None
        vf = tmp / f"values-{abs(hash(repr(values)))}.yaml"
        vf.write_text(yaml.safe_dump(values))
        cmd += ["-f", str(vf)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if expect_ok:
        assert out.returncode == 0, out.stderr
        return load_docs(out.stdout), out.stderr
    assert out.returncode != 0, "helm template should have failed"
    return [], out.stderr


def find(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    hits = [o for o in objs if o["kind"] == kind
            and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} objects"
    return hits[0]


def find_all(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


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
