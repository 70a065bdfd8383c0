"""Helpers for webhook HTTPS tests: self-signed certificates, a Secret-like volume and a
real ``gpupack webhook`` server process."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REPO = Path(__file__).resolve().parents[2]
# The production entry point (webhook_cmd.run under gunicorn), without importing the
# whole CLI (its other subcommands pull in the solver and plotting libraries).
LAUNCH = (
    "import argparse, sys\n"
    "from gpupack import webhook_cmd\n"
    "p = argparse.ArgumentParser()\n"
    "webhook_cmd.add_arguments(p)\n"
    "sys.exit(webhook_cmd.run(p.parse_args(sys.argv[1:])))\n"
)


@dataclass(frozen=True)
class Cert:
    cert_pem: bytes
    key_pem: bytes
    der: bytes


def make_cert(common_name: str) -> Cert:
    """A self-signed serving certificate for 127.0.0.1/localhost."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return Cert(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()),
        cert.public_bytes(serialization.Encoding.DER),
    )


class SecretVolume:
    """Files laid out as the kubelet mounts a Secret: ``tls.crt -> ..data/tls.crt`` with
    ``..data`` a symlink swapped atomically on update (what cert-manager rotation does)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0
        root.mkdir(parents=True, exist_ok=True)

    @property
    def cert(self) -> Path:
        return self.root / "tls.crt"

    @property
    def key(self) -> Path:
        return self.root / "tls.key"

    def write(self, cert_pem: bytes, key_pem: bytes) -> None:
        self.version += 1
        ts = self.root / f"..v{self.version}"
        ts.mkdir()
        (ts / "tls.crt").write_bytes(cert_pem)
        (ts / "tls.key").write_bytes(key_pem)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(ts.name)
        os.replace(tmp, self.root / "..data")
        for name in ("tls.crt", "tls.key"):
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def context(self, *certs: Cert) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata="".join(c.cert_pem.decode() for c in certs))
        return ctx

    def peer_der(self, ctx: ssl.SSLContext) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            return der

    def request(self, ctx: ssl.SSLContext, method: str, path: str, body: Any = None
                ) -> tuple[int, bytes]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx, timeout=10)
        try:
            data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


def start_server(tmp: Path, volume: SecretVolume, nodes: list[dict[str, Any]],
                 extra: list[str] | None = None) -> Server:
    nodes_file = tmp / "nodes.yaml"
    nodes_file.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    port = free_port()
    log = tmp / "server.log"
    args = ["--host", "127.0.0.1", "--port", str(port), "--threads", "4",
            "--tls-cert", str(volume.cert), "--tls-key", str(volume.key),
            "--nodes", str(nodes_file), *(extra or [])]
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", LAUNCH, *args], cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"webhook exited {proc.returncode}: {log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return Server(port, proc, log)
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"webhook did not listen: {log.read_text()}")


def stop_server(server: Server) -> None:
    server.proc.terminate()  # gunicorn's graceful stop
    try:
        server.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
