"""tls/make-self-signed.sh with the real openssl, and the real webhook server serving the
certificate it made, verified the way the API server and Prometheus verify it."""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from manifests_helpers import REPO, Obj, find, tool
from stack import free_port

SERVICE_DNS = "gpupack-webhook.gpupack.svc"


@pytest.fixture(scope="module")
def generated(manifests_copy: Path) -> Path:
    return manifests_copy / "overlays" / "plain" / "generated"


def openssl(*args: str) -> str:
    out = subprocess.run([tool("openssl"), *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_script_outputs(generated: Path) -> None:
    for name in ("webhook-tls-secret.yaml", "cabundle-patch.yaml", "ca.crt", "tls.crt",
                 "tls.key"):
        assert (generated / name).is_file(), name
    assert (generated / "tls.key").stat().st_mode & 0o077 == 0
    assert (generated / "webhook-tls-secret.yaml").stat().st_mode & 0o077 == 0
    openssl("verify", "-CAfile", str(generated / "ca.crt"), str(generated / "tls.crt"))
    text = openssl("x509", "-in", str(generated / "tls.crt"), "-noout", "-text")
    for dns in ("gpupack-webhook", "gpupack-webhook.gpupack", SERVICE_DNS,
                f"{SERVICE_DNS}.cluster.local"):
        assert f"DNS:{dns}" in text
    assert "TLS Web Server Authentication" in text
    assert "CA:FALSE" in text


def test_rendered_ca_bundle_is_the_ca(generated: Path, plain: list[Obj]) -> None:
    ca = (generated / "ca.crt").read_bytes()
    mwc = find(plain, "MutatingWebhookConfiguration")
    for w in mwc["webhooks"]:
        assert base64.b64decode(w["clientConfig"]["caBundle"]) == ca
    secret = find(plain, "Secret", "gpupack-webhook-tls")
    assert base64.b64decode(secret["data"]["tls.crt"]) == (generated / "tls.crt").read_bytes()


def test_script_is_rerunnable_with_other_names(tmp_path: Path) -> None:
    script = REPO / "manifests" / "tls" / "make-self-signed.sh"
    out = subprocess.run(["bash", str(script), str(tmp_path), "gpu-system", "hook", "30"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = openssl("x509", "-in", str(tmp_path / "tls.crt"), "-noout", "-text")
    assert "DNS:hook.gpu-system.svc" in text
    assert "namespace: gpu-system" in (tmp_path / "webhook-tls-secret.yaml").read_text()


@pytest.fixture(scope="module")
def webhook_server(generated: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real ``gpupack webhook`` on the generated certificate (static cluster view: the
    in-cluster source does not exist yet)."""
    port = free_port()
    log = tmp_path_factory.mktemp("webhook") / "webhook.log"
    gpupack = shutil.which("gpupack")
    cmd = ([gpupack] if gpupack else [sys.executable, "-m", "gpupack"]) + [
        "webhook", "--host", "127.0.0.1", "--port", str(port),
        "--tls-cert", str(generated / "tls.crt"), "--tls-key", str(generated / "tls.key"),
        "--nodes", str(REPO / "gpupack" / "examples" / "nodes.yaml"),
        "--pods", str(REPO / "gpupack" / "examples" / "pods.yaml"), "--log-level", "warning"]
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        ctx = ssl.create_default_context(cafile=str(generated / "ca.crt"))
        ctx.check_hostname = False  # readiness only; the tests below check the name
        end_url = f"https://127.0.0.1:{port}/healthz"
        deadline = 30.0
        t0 = time.monotonic()
        while True:
            try:
                with urllib.request.urlopen(end_url, timeout=2, context=ctx) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() - t0 > deadline:
                pytest.fail(f"webhook did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class _ServiceNameHTTPS(http.client.HTTPSConnection):
    """Connects to the loopback address, verifies the certificate as the Service name."""

    def __init__(self, addr: str, ctx: ssl.SSLContext) -> None:
        host, port = addr.split(":")
        super().__init__(host, int(port), context=ctx, timeout=10)
        self._ctx = ctx

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._ctx.wrap_socket(raw, server_hostname=SERVICE_DNS)


def _https(generated: Path, addr: str, path: str, body: bytes | None = None) -> bytes:
    """HTTPS as the API server calls the webhook: trust only the caBundle's CA and check
    the certificate against the Service DNS name (TLS SNI = that name)."""
    ctx = ssl.create_default_context(cafile=str(generated / "ca.crt"))
    conn = _ServiceNameHTTPS(addr, ctx)
    conn.request("POST" if body is not None else "GET", path, body=body,
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    assert resp.status == 200, data
    return data


def test_webhook_answers_over_verified_tls(generated: Path, webhook_server: str) -> None:
    uid = str(uuid.uuid4())
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "asr-x", "namespace": "speech",
                        "annotations": {"gpupack.io/class": "asr",
                                        "gpupack.io/gpu-memory": "8Gi"}},
           "spec": {"containers": [{"name": "main", "image": "img"}]}}
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                          "resource": {"group": "", "version": "v1", "resource": "pods"},
                          "namespace": "speech", "operation": "CREATE", "object": pod,
                          "userInfo": {"username": "tester"}, "dryRun": False}}
    out = json.loads(_https(generated, webhook_server, "/mutate", json.dumps(review).encode()))
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == uid and out["response"]["allowed"] is True
    patch = json.loads(base64.b64decode(out["response"]["patch"]))
    assert any(op["path"] == "/spec/schedulerName" and op["value"] == "gpupack" for op in patch)


def test_webhook_metrics_scrapable_as_the_servicemonitor_says(
        generated: Path, webhook_server: str, plain: list[Obj]) -> None:
    sm = find(plain, "ServiceMonitor", "gpupack-webhook")
    (ep,) = sm["spec"]["endpoints"]
    assert ep["scheme"] == "https" and ep["tlsConfig"]["serverName"] == SERVICE_DNS
    assert ep["tlsConfig"]["ca"]["secret"] == {"name": "gpupack-webhook-tls", "key": "ca.crt"}
    assert "ca.crt" in find(plain, "Secret", "gpupack-webhook-tls")["data"]
    text = _https(generated, webhook_server, ep["path"]).decode()
    assert "gpupack_webhook_latency_seconds_bucket" in text
