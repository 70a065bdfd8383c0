"""Helpers of the manifest tests: rendering with the real tools (``kubectl kustomize``,
``helm template``; tests/manifests/install-k8s-tools.sh installs them when missing) and
lookups in the rendered object lists. Not named ``conftest`` so that test modules can
import it without clashing with the other test directories' conftest modules."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
CHART = MANIFESTS / "helm" / "gpupack"
K8S_VERSION = "1.37.0"
# The cluster version `helm template` renders for (--kube-version): the chart derives
# kube-scheduler's tag from it, and the kustomize base pins the same tag.
CLUSTER_VERSION = "v1.37.1"

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
                  expect_ok: bool = True, release: str = "gpupack",
                  kube_version: str = CLUSTER_VERSION) -> tuple[list[Obj], str]:
    cmd = [tool("helm"), "template", release, str(CHART), "--namespace", "gpupack",
           "--kube-version", kube_version]
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


SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def container_account(objs: list[Obj], pod_spec: Obj, container: Obj) -> str:
    """The ServiceAccount a container's API calls run as: the one whose token Secret it
    mounts where the client looks for one, else its pod's (issue 35: the extender runs
    as an account of its own beside kube-scheduler)."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        if m["mountPath"] != SA_MOUNT:
            continue
        secret = volumes[m["name"]].get("secret")
        if secret is not None:
            s = find(objs, "Secret", secret["secretName"])
            assert s["type"] == "kubernetes.io/service-account-token"
            return str(s["metadata"]["annotations"]["kubernetes.io/service-account.name"])
    return str(pod_spec["serviceAccountName"])
