"""One health convention on every gpupack server, checked against real processes:

* ``GET /healthz`` (liveness): 200, ``{"ok": true}``;
* ``GET /readyz`` (readiness): 200 ``{"ready": true, ...}`` or 503 ``{"ready": false,
  "why": ...}``;
* every error, an unknown path or method included: JSON ``{"error": ...}`` with its code.

The servers: the extender's verbs port, its ``--metrics-port`` listener (what the kubelet
probes, the verbs being on loopback), the webhook (HTTPS) and the node agent's metrics
listener. A start-up line says the
mode and what was loaded."""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "serving"))

from serving_certs import self_signed  # noqa: E402

EXAMPLES = REPO / "gpupack" / "examples"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str, tls: bool = False,
        method: str = "GET") -> tuple[int, str, object]:
    conn: http.client.HTTPConnection
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # a health check of a self-signed test server
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=ctx)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        body = resp.read().decode()
        kind = resp.getheader("Content-Type", "")
    finally:
        conn.close()
    try:
        doc: object = json.loads(body)
    except ValueError:
        doc = body
    return resp.status, kind, doc


def wait_ready(proc: subprocess.Popen[str], port: int, lines: list[str],
               tls: bool = False) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            time.sleep(0.5)
            out = "\n".join(lines)
            raise RuntimeError(f"server exited {proc.returncode}:\n{out}")
        try:
            if get(port, "/readyz", tls)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not become ready")


def collect(proc: subprocess.Popen[str]) -> list[str]:
    """The process's output lines, appended as they come (a reader thread)."""
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    return lines


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def startup_lines(lines: list[str], command: str) -> list[str]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [ln for ln in lines if ln.startswith(f"gpupack {command}: ready: ")]
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("no start-up line in:\n" + "\n".join(lines))


@pytest.fixture(scope="module")
def extender() -> Iterator[tuple[int, int, list[str]]]:
    port, metrics = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupack", "serve", "--port", str(port), "--metrics-port",
         str(metrics), "--no-planner", "--log-level", "INFO"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = collect(proc)
    try:
        wait_ready(proc, port, lines)
        yield port, metrics, lines
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, list[str]]]:
    cert, key = self_signed(tmp_path_factory.mktemp("health-webhook"))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupack", "webhook", "--port", str(port), "--host",
         "127.0.0.1", "--tls-cert", str(cert), "--tls-key", str(key), "--nodes",
         str(EXAMPLES / "nodes.yaml"), "--pods", str(EXAMPLES / "pods.yaml")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = collect(proc)
    try:
        wait_ready(proc, port, lines, tls=True)
        yield port, lines
    finally:
        stop(proc)


def check_convention(port: int, tls: bool = False) -> None:
    status, kind, doc = get(port, "/healthz", tls)
    assert (status, doc) == (200, {"ok": True}) and kind.startswith("application/json")
    status, kind, doc = get(port, "/readyz", tls)
    assert status == 200 and kind.startswith("application/json")
    assert isinstance(doc, dict) and doc["ready"] is True
    for path, method, code in (("/no-such-path", "GET", 404), ("/healthz", "DELETE", 405)):
        status, kind, doc = get(port, path, tls, method)
        assert status == code, (path, method, status, doc)
        assert kind.startswith("application/json"), (path, method, kind, doc)
        assert isinstance(doc, dict) and isinstance(doc.get("error"), str)


def test_extender_verbs_port(extender: tuple[int, int, list[str]]) -> None:
    check_convention(extender[0])


def test_extender_metrics_port(extender: tuple[int, int, list[str]]) -> None:
    check_convention(extender[1])
    status, kind, _ = get(extender[1], "/metrics")
    assert status == 200 and kind.startswith("text/plain")


def test_webhook(webhook: tuple[int, list[str]]) -> None:
    check_convention(webhook[0], tls=True)


def test_metrics_readyz_follows_the_cache() -> None:
    from serving.metrics_app import create_metrics_app

    synced = False
    client = create_metrics_app(lambda: b"", lambda: synced,
                                not_ready_why="cache not synced yet").test_client()
    r = client.get("/readyz")
    assert r.status_code == 503 and r.get_json() == {"ready": False,
                                                     "why": "cache not synced yet"}
    synced = True
    assert client.get("/readyz").get_json() == {"ready": True}


def test_node_agent_metrics_port() -> None:
    """The agent's listener (real sockets): not ready until its first inventory, then the
    same convention as the others; /metrics is the agent's registry."""
    from prometheus_client import CollectorRegistry, Counter

    from nodeagent.metrics import serve_metrics

    registry = CollectorRegistry()
    Counter("gpupack_probe_total", "a series of this registry", registry=registry).inc()
    inventories = 0
    listener = serve_metrics(registry, free_port(), host="127.0.0.1",
                             ready=lambda: inventories > 0)
    try:
        status, _, doc = get(listener.port, "/readyz")
        assert (status, doc) == (503, {"ready": False, "why": "no inventory taken yet"})
        inventories = 1
        check_convention(listener.port)
        status, kind, _ = get(listener.port, "/metrics")
        assert status == 200 and kind.startswith("text/plain")
    finally:
        listener.stop()


def test_extender_says_what_it_loaded(extender: tuple[int, int, list[str]]) -> None:
    port, metrics, lines = extender
    (line,) = startup_lines(lines, "serve")
    assert "mode static (bundled example cluster" in line
    assert re.search(r"; \d+ nodes, \d+ pods \(\d+ pending\) loaded;", line), line
    assert "policy gpupack" in line
    assert f"http://127.0.0.1:{port}" in line and f":{metrics}" in line


def test_webhook_says_what_it_loaded(webhook: tuple[int, list[str]]) -> None:
    port, lines = webhook
    (line,) = startup_lines(lines, "webhook")
    assert f"mode static (files {EXAMPLES / 'nodes.yaml'}, {EXAMPLES / 'pods.yaml'})" in line
    assert re.search(r"; [1-9]\d* nodes, [1-9]\d* pods \(\d+ pending\) loaded;", line), line
    assert line.endswith(f"listening on https://127.0.0.1:{port}")


def test_startup_line_words() -> None:
    import argparse

    from gpupack.startup import source_words, startup_line

    assert source_words(argparse.Namespace(in_cluster=True)) == (
        "mode in-cluster (API server, service account)")
    assert source_words(argparse.Namespace(in_cluster=False, kubeconfig="k")) == (
        "mode kubeconfig k")
    line = startup_line("serve", "mode static", {"nodes": 3, "pods": 5, "pending": 2},
                        ["http://127.0.0.1:8888"], ["policy bestfit"])
    assert line == ("gpupack serve: ready: mode static; 3 nodes, 5 pods (2 pending) loaded; "
                    "policy bestfit; listening on http://127.0.0.1:8888")
