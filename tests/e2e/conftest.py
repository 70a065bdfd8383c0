"""Fixtures of the end-to-end tests: one real control plane (tests/e2e/controlplane.py)
for the whole session, started once and stopped at the end; each test works in its own
namespace and node pool and removes its pods and nodes afterwards."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import controlplane  # noqa: E402
from cluster import force_delete_pods  # noqa: E402

_counter = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: runs against the real etcd, kube-apiserver and kube-scheduler")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)


def need_go() -> None:
    """Skip where Go is missing: the real control plane is built from its Go modules.
    The README's test command installs Go (tests/install-tools.sh), so CI never skips."""
    if shutil.which("go") is None:
        pytest.skip("Go is not installed: the real control plane is built from its Go "
                    "modules (tests/e2e/build.sh)")


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.Stack]:
    need_go()
    keep = os.environ.get("GPUPACK_E2E_DIR")
    base = Path(keep) if keep else tmp_path_factory.mktemp("control-plane")
    try:
        s = controlplane.up(base)
    except controlplane.StackError as e:
        st = controlplane.Stack(base.resolve())
        if st.state_file.exists():
            st.down()
        raise AssertionError(f"the control plane did not come up: {e}") from None
    try:
        yield s
    finally:
        s.down()


@pytest.fixture(scope="session")
def admin(stack: controlplane.Stack) -> Any:
    return controlplane._api(stack.kubeconfig)


@pytest.fixture(scope="session")
def core(admin: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(admin)


class Space:
    """A test's namespace and node pool; nodes and pods are removed at the end."""

    def __init__(self, core: Any, admin: Any, name: str) -> None:
        self.core, self.admin, self.name = core, admin, name
        self.nodes: list[str] = []
        self.namespaces: list[str] = []

    def namespace(self, suffix: str = "") -> str:
        ns = f"{self.name}{suffix}"
        controlplane.ensure_namespace(self.admin, ns)
        self.namespaces.append(ns)
        return ns

    def cleanup(self) -> None:
        for ns in self.namespaces:
            force_delete_pods(self.core, ns)
        for node in self.nodes:
            with contextlib.suppress(Exception):
                self.core.delete_node(node)


@pytest.fixture(scope="module")
def kcm(stack: controlplane.Stack) -> Iterator[None]:
    """kube-controller-manager's ReplicaSet, Deployment and disruption controllers, for a
    module's tests (Deployments whose evicted pods come back)."""
    with controlplane.controllers(stack):
        yield


SCRAPER = "gpupack-e2e-scraper"


@pytest.fixture
def scraper(stack: controlplane.Stack, admin: Any) -> Iterator[str]:
    """A token allowed to GET /metrics (delegated authentication of the extender)."""
    with controlplane.metrics_reader(admin, SCRAPER, SCRAPER) as token:
        yield token


@pytest.fixture
def space(core: Any, admin: Any, request: pytest.FixtureRequest) -> Iterator[Space]:
    name = f"e2e{next(_counter)}-{request.node.name.split('[')[0][5:][:30]}".lower()
    name = "".join(c if c.isalnum() or c == "-" else "-" for c in name).strip("-")
    s = Space(core, admin, name)
    try:
        yield s
    finally:
        s.cleanup()
