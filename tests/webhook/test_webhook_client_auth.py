"""Only the API server's client certificate may post AdmissionReviews (issue 35 item 1).

``gpupack webhook --client-ca FILE --client-name NAME`` (``gpupack serve
--webhook-client-ca``): the TLS handshake asks for a client certificate and verifies one
against the CA; ``/mutate`` then answers 401 without one and 403 for a name not allowed,
while ``/healthz`` (the kubelet's probes) needs none. Real server processes on loopback.
"""

from __future__ import annotations

import datetime
import http.client
import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client import CollectorRegistry
from webhook_builders import node, pod, review
from webhook_server import (
    LAUNCH,
    REPO,
    Cert,
    SecretVolume,
    make_cert,
    start_server,
    stop_server,
)

from serving.client_auth import ClientAuth, identities
from serving.gate import Limits
from serving.https import HttpsListener
from webhook.app import create_webhook_app
from webhook.config import WebhookConfig

API_SERVER = "kube-apiserver-webhook-client"
NODES = [node("h100-0", mig={"1g.10gb": 7})]


@dataclass(frozen=True)
class ClientCert:
    cert: Path
    key: Path


class Authority:
    """A CA that signs client certificates, written under ``root``."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                     .sign(self.key, hashes.SHA256()))
        self.file = root / f"{name}.crt"
        self.file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def client(self, cn: str, dns: tuple[str, ...] = ()) -> ClientCert:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
             .issuer_name(self.name).public_key(key.public_key())
             .serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False))
        if dns:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(d) for d in dns]),
                                False)
        cert = b.sign(self.key, hashes.SHA256())
        out = ClientCert(self.root / f"{cn}.crt", self.root / f"{cn}.key")
        out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                              serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
        return out


def _context(server_cert: Cert, client: ClientCert | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=server_cert.cert_pem.decode())
    if client is not None:
        ctx.load_cert_chain(str(client.cert), str(client.key))
    return ctx


def _call(port: int, ctx: ssl.SSLContext, method: str, path: str, body: Any = None
          ) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


REVIEW = review(pod("asr", annotations={"gpupack.io/gpu-memory": "8Gi"}), uid="u1")


@dataclass
class Setup:
    port: int
    server_cert: Cert
    ca: Authority
    other_ca: Authority


@pytest.fixture(scope="module")
def gunicorn_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("client-auth")
    cert = make_cert("gpupack-webhook")
    volume = SecretVolume(tmp / "certs")
    volume.write(cert.cert_pem, cert.key_pem)
    ca, other = Authority(tmp / "ca", "apiserver-ca"), Authority(tmp / "other", "other-ca")
    server = start_server(tmp, volume, NODES, ["--client-ca", str(ca.file),
                                               "--client-name", API_SERVER])
    try:
        yield Setup(server.port, cert, ca, other)
    finally:
        stop_server(server)


def _refusals(s: Setup) -> None:
    """The table every server must pass."""
    apiserver = s.ca.client(API_SERVER)
    by_san = s.ca.client("someone", dns=(API_SERVER,))
    tenant = s.ca.client("system:serviceaccount:evil:default")
    status, body = _call(s.port, _context(s.server_cert, apiserver), "POST", "/mutate", REVIEW)
    assert status == 200 and body["response"]["allowed"] is True, body
    status, body = _call(s.port, _context(s.server_cert, by_san), "POST", "/mutate", REVIEW)
    assert status == 200, body
    status, body = _call(s.port, _context(s.server_cert, None), "POST", "/mutate", REVIEW)
    assert status == 401 and "client certificate is required" in body["error"], body
    status, body = _call(s.port, _context(s.server_cert, tenant), "POST", "/mutate", REVIEW)
    assert status == 403 and "system:serviceaccount:evil:default" in body["error"], body
    # The kubelet's probes carry no certificate.
    assert _call(s.port, _context(s.server_cert, None), "GET", "/healthz")[0] == 200
    # A certificate of another CA fails the handshake itself.
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        _call(s.port, _context(s.server_cert, s.other_ca.client(API_SERVER)), "POST",
              "/mutate", REVIEW)
    # The server survived all of that.
    assert _call(s.port, _context(s.server_cert, apiserver), "POST", "/mutate", REVIEW)[0] == 200


def test_gunicorn_webhook_acts_only_on_the_api_servers_certificate(
        gunicorn_server: Setup) -> None:
    _refusals(gunicorn_server)


def test_listener_webhook_acts_only_on_the_api_servers_certificate(tmp_path: Path) -> None:
    """``gpupack serve --webhook-port``'s listener (serving.listener)."""
    from webhook_builders import cluster

    cert = make_cert("gpupack-webhook")
    (tmp_path / "tls.crt").write_bytes(cert.cert_pem)
    (tmp_path / "tls.key").write_bytes(cert.key_pem)
    ca, other = Authority(tmp_path / "ca", "apiserver-ca"), Authority(tmp_path / "o", "o-ca")
    snap = cluster(*NODES)
    auth = ClientAuth(ca.file, frozenset({API_SERVER}))
    app = create_webhook_app(lambda: snap, CollectorRegistry(), WebhookConfig(),
                             client_auth=auth)
    listener = HttpsListener(app, "127.0.0.1", 0, tmp_path / "tls.crt", tmp_path / "tls.key",
                             limits=Limits(), name="test-webhook", client_auth=auth)
    listener.start()
    try:
        _refusals(Setup(listener.port, cert, ca, other))
    finally:
        listener.stop()


def test_identities_read_cn_and_sans() -> None:
    peer = {"subject": ((("organizationName", "x"),), (("commonName", "a"),)),
            "subjectAltName": (("DNS", "b.svc"), ("IP Address", "10.0.0.1"), ("URI", "spiffe://c"))}
    assert identities(peer) == {"a", "b.svc", "spiffe://c"}
    assert ClientAuth(Path("ca"), frozenset({"b.svc"})).refusal(peer) is None
    assert ClientAuth(Path("ca")).refusal(peer) is None  # any name of that CA
    assert ClientAuth(Path("ca")).refusal(None) == (401, ClientAuth(Path("ca")).refusal({})[1])


@pytest.mark.parametrize(("args", "message"), [
    (["--client-name", "x"], "--client-name needs --client-ca"),
    (["--client-ca", "/nonexistent/ca.crt"], "--client-ca: /nonexistent/ca.crt"),
])
def test_cli_refuses_bad_client_auth_options(tmp_path: Path, args: list[str],
                                             message: str) -> None:
    cert = make_cert("w")
    (tmp_path / "tls.crt").write_bytes(cert.cert_pem)
    (tmp_path / "tls.key").write_bytes(cert.key_pem)
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": NODES}))
    done = subprocess.run([sys.executable, "-c", LAUNCH, "--tls-cert", str(tmp_path / "tls.crt"),
                           "--tls-key", str(tmp_path / "tls.key"), "--nodes", str(nodes), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
