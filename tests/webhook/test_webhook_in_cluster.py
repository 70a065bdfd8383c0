"""`gpupack webhook --kubeconfig`: the cluster view comes from a watched API server (the
fake from tests/kube), and a review is answered from it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kube"))

from fake_apiserver import FakeApiServer

from gpupack.cli import build_parser
from gpupack.webhook_cmd import live_snapshots


def test_live_snapshot_provider_follows_the_api(tmp_path: Path) -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "h100-0",
            "resourceVersion": "1",
            "labels": {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": "8",
            },
        },
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}},
    }
    api = FakeApiServer().start()
    try:
        api.put("nodes", node)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters: [{{name: fake, cluster: {{server: '{api.url}'}}}}]\n"
            "users: [{name: fake, user: {token: t}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
        )
        args = build_parser().parse_args(
            ["webhook", "--kubeconfig", str(kubeconfig), "--tls-cert", "c", "--tls-key", "k"]
        )
        provider = live_snapshots(args)
        try:
            deadline = time.monotonic() + 10
            while (provider() is None or not provider().nodes) and time.monotonic() < deadline:
                time.sleep(0.05)
            first = provider()
            assert first is not None and provider.ready()
            assert [n.name for n in first.nodes] == ["h100-0"]
            assert provider() is first  # unchanged cache: the same object, no view rebuild
        finally:
            provider.stop()  # no watch left reconnecting to a stopped server
    finally:
        api.stop()


def test_webhook_needs_a_cluster_source() -> None:
    from gpupack.webhook_cmd import run

    args = build_parser().parse_args(["webhook", "--tls-cert", "c", "--tls-key", "k"])
    assert isinstance(args, argparse.Namespace)
    assert run(args) == 2


def test_webhook_refuses_a_cluster_config_that_cannot_load(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from gpupack.webhook_cmd import run

    for k in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(k, raising=False)
    for extra, text in ((["--in-cluster"], "--in-cluster: Service host/port is not set"),
                        (["--kubeconfig", "/nonexistent/kc"], "--kubeconfig /nonexistent/kc")):
        args = build_parser().parse_args(["webhook", "--tls-cert", "c", "--tls-key", "k",
                                          *extra])
        assert run(args) == 2
        assert text in capsys.readouterr().err


def _kubeconfig(tmp_path: Path, url: str) -> Path:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters: [{{name: fake, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: fake, user: {token: t}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
    )
    return kubeconfig


@pytest.mark.parametrize("dra", ["auto", "off"])
def test_the_live_view_reads_dra_objects(tmp_path: Path, dra: str) -> None:
    """The standalone webhook's own watch lists ResourceSlices and DeviceClasses: a DRA
    node's MIG devices size a pod (``--dra off``: that node offers nothing)."""
    from packing.dra import nvidia, served
    from webhook.admit import admit
    from webhook.config import WebhookConfig

    api = FakeApiServer().start()
    try:
        api.put("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": "d0", "resourceVersion": "1", "labels": {"kubernetes.io/hostname": "d0"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}}})
        for i, s in enumerate(nvidia.node_slices("d0", [nvidia.GpuSpec(0, "H100-80GB")])):
            s["metadata"]["resourceVersion"] = str(10 + i)
            api.put("resourceslices", s)
        for i, c in enumerate([*nvidia.device_classes(), *served.device_classes()]):
            c["metadata"]["resourceVersion"] = str(100 + i)
            api.put("deviceclasses", c)
        args = build_parser().parse_args(
            ["webhook", "--kubeconfig", str(_kubeconfig(tmp_path, api.url)),
             "--tls-cert", "c", "--tls-key", "k", "--dra", dra])
        provider = live_snapshots(args)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (
                    provider() is None or (dra == "auto" and provider().dra is None)):
                time.sleep(0.05)
            snap = provider()
            assert snap is not None
            adm = admit({"metadata": {"name": "p", "namespace": "ns", "annotations": {
                "gpupack.io/gpu-memory": "8Gi"}}, "spec": {"containers": [{"name": "c"}]}},
                snap, WebhookConfig())
            if dra == "auto":
                assert adm.allowed and adm.decision.resource == "nvidia.com/mig-1g.10gb", (
                    adm.decision.reason)
            else:
                assert snap.dra is None and not adm.allowed
        finally:
            provider.stop()
    finally:
        api.stop()
