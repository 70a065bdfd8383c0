"""Fixtures of the node agent tests."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from fake_kubelet import KubeletState, PodResourcesServicer

from nodeagent.proto import podresources_pb2_grpc as pb_grpc


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[str, KubeletState]]:
    state = KubeletState()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(PodResourcesServicer(state), server)
    socket = str(tmp_path / "kubelet.sock")
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield socket, state
    finally:
        server.stop(grace=None)
