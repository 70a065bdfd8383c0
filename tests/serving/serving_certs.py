"""A self-signed serving certificate for 127.0.0.1 written to files, for the tests of
tests/serving and tests/cli: the one certificate maker of the webhook tests
(``tests/webhook/webhook_server.make_cert``), laid out as ``tls.crt``/``tls.key``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "webhook"))

from webhook_server import make_cert


def self_signed(tmp: Path) -> tuple[Path, Path]:
    cert = make_cert("127.0.0.1")
    cert_path, key_path = tmp / "tls.crt", tmp / "tls.key"
    cert_path.write_bytes(cert.cert_pem)
    key_path.write_bytes(cert.key_pem)
    return cert_path, key_path
