"""Fixtures of the cluster-layer tests that drive the real ``kubernetes`` client: a FAKE
API server (tests/kube/fake_apiserver.py) holding one 2-GPU node, and a client of it.
A test module that needs another starting state defines its own ``fake``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "scheduler"))
from fake_apiserver import FakeApiServer
from sched_builders import node


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    server.put("nodes", node("gpu-a", gpus=2, reconfigurable=False))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def api(fake: FakeApiServer) -> Any:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = fake.url
    return client.ApiClient(cfg)
