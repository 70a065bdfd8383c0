"""``gpupack serve --webhook-port``: one process answers kube-scheduler on the extender
port and the API server's AdmissionReviews over HTTPS on the webhook port."""

from __future__ import annotations

import base64
import datetime
import http.client
import ipaddress
import json
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sched_builders import L40S, filter_args, mig_pod, node, pod

NODES = [node("gpu-a", mig={"1g.10gb": 7}), node("gpu-l40s", product=L40S, gpus=2,
                                                  shared_replicas=4)]
PODS = [mig_pod("asr-0", namespace="speech")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _self_signed(tmp: Path) -> tuple[Path, Path, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpupack-webhook")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (tmp / "tls.crt").write_bytes(pem)
    (tmp / "tls.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return tmp / "tls.crt", tmp / "tls.key", pem


def _review(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "review-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"}, "name": "",
        "namespace": "speech", "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
        "object": obj, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}


def _serve(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "gpupack", "serve", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, bytes]]:
    d = tmp_path_factory.mktemp("serve-webhook")
    (d / "nodes.yaml").write_text(yaml.safe_dump({"kind": "NodeList", "items": NODES}))
    (d / "pods.yaml").write_text(yaml.safe_dump({"kind": "PodList", "items": PODS}))
    cert, key, pem = _self_signed(d)
    port, hook = _free_port(), _free_port()
    proc = _serve(["--port", str(port), "--nodes", str(d / "nodes.yaml"),
                   "--pods", str(d / "pods.yaml"), "--no-planner", "--log-level", "WARNING",
                   "--webhook-port", str(hook), "--webhook-host", "127.0.0.1",
                   "--tls-cert", str(cert), "--tls-key", str(key)])
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "gpupack serve did not get ready"
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/readyz")
                if conn.getresponse().status == 200:
                    with socket.create_connection(("127.0.0.1", hook), timeout=1):
                        break
            except OSError:
                pass
            time.sleep(0.1)
        yield port, hook, pem
    finally:
        proc.terminate()
        proc.wait(20)


def test_admission_review_over_https_and_filter_on_the_extender_port(
        served: tuple[int, int, bytes]) -> None:
    port, hook, pem = served
    ctx = ssl.create_default_context(cadata=pem.decode())
    obj = pod("asr-1", namespace="speech", annotations={"gpupack.io/class": "asr"})
    obj["spec"]["schedulerName"] = "default-scheduler"
    obj["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    conn = http.client.HTTPSConnection("127.0.0.1", hook, context=ctx, timeout=10)
    conn.request("POST", "/mutate", body=json.dumps(_review(obj)),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    doc = json.loads(resp.read())
    assert resp.status == 200, doc
    assert doc["kind"] == "AdmissionReview" and doc["response"]["uid"] == "review-1"
    assert doc["response"]["allowed"] is True and doc["response"]["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(doc["response"]["patch"]))
    assert any("nvidia.com/mig-1g.10gb" in json.dumps(op) for op in patch)  # the live view
    # The connection is kept alive: a second review on it.
    conn.request("GET", "/healthz")
    health = conn.getresponse()
    assert health.status == 200 and json.loads(health.read()) == {"ok": True}
    conn.close()

    plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    plain.request("POST", "/filter", body=json.dumps(filter_args(mig_pod("asr-2"),
                                                                  ["gpu-a", "gpu-l40s"])),
                  headers={"Content-Type": "application/json"})
    out = plain.getresponse()
    result = json.loads(out.read())
    assert out.status == 200 and result["NodeNames"] == ["gpu-a"]
    assert "gpu-l40s" in result["FailedAndUnresolvableNodes"]


def test_plain_http_to_the_webhook_port_is_refused(served: tuple[int, int, bytes]) -> None:
    _, hook, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", hook, timeout=5)
    with pytest.raises((OSError, http.client.HTTPException)):
        conn.request("GET", "/healthz")
        conn.getresponse().read()


@pytest.mark.parametrize(("extra", "text"), [
    (["--webhook-port", "9443"], "needs --tls-cert and --tls-key"),
    (["--tls-cert", "x.pem"], "give --webhook-port too"),
    (["--webhook-port", "9443", "--tls-cert", "nope.pem", "--tls-key", "nope.key"],
     "--tls-cert/--tls-key"),
])
def test_bad_webhook_arguments_are_refused_before_serving(extra: list[str], text: str) -> None:
    proc = _serve(["--port", str(_free_port()), *extra])
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and text in out.decode()


def test_a_metrics_port_that_cannot_be_bound_is_refused_before_serving() -> None:
    # Inside the gunicorn worker the failure would restart the worker for ever.
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _serve(["--port", str(_free_port()), "--metrics-port", str(port)])
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in out.decode()
    proc = _serve(["--port", str(_free_port()), "--metrics-port", str(_free_port()),
                   "--metrics-host", "no-such-host.invalid"])
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "cannot listen on no-such-host.invalid" in out.decode()


@pytest.mark.parametrize(("extra", "text"), [
    (["--in-cluster"], "gpupack serve: --in-cluster: Service host/port is not set"),
    (["--kubeconfig", "/nonexistent/kubeconfig"], "gpupack serve: --kubeconfig /nonexistent"),
])
def test_a_cluster_config_that_cannot_load_is_refused_before_serving(extra: list[str],
                                                                      text: str) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    proc = subprocess.Popen([sys.executable, "-m", "gpupack", "serve",
                             "--port", str(_free_port()), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and text in out.decode(), out.decode()
