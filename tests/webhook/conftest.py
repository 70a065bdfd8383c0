"""Fixtures for webhook tests: a real HTTPS server process shared by a module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from webhook_builders import node, opted_in
from webhook_server import Cert, SecretVolume, Server, make_cert, start_server, stop_server

# The H100 node's MIG layouts are made on demand: it opts in and the server runs with
# --mig-actuator (the real process reads both).
CLUSTER_NODES = [opted_in(node("h100-0")), node("l40s-0", "L40S", 4, "shared")]


@pytest.fixture(scope="module")
def https_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Cert]]:
    tmp = tmp_path_factory.mktemp("webhook-https")
    cert = make_cert("gpupack-webhook")
    volume = SecretVolume(tmp / "certs")
    volume.write(cert.cert_pem, cert.key_pem)
    server = start_server(tmp, volume, CLUSTER_NODES, ["--strict-namespace", "prod",
                                                         "--mig-actuator"])
    try:
        yield server, cert
    finally:
        stop_server(server)
