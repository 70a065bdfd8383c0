"""``gpupack explain`` and ``gpupack webhook`` argument handling, in process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from webhook_builders import node, opted_in, pod

from gpupack.cli import build_parser, main


def _files(tmp: Path, pods: list[dict[str, Any]]) -> tuple[Path, Path]:
    """An idle whole-GPU H100 node opting in to MIG re-partitioning, and a time-sliced
    L40S node: the issue 19 reproduction."""
    nodes = tmp / "nodes.yaml"
    nodes.write_text(yaml.safe_dump_all([opted_in(node("h100-0", mode="whole")),
                                         node("l40s-0", "L40S", 4, "shared")]))
    pod_file = tmp / "pod.yaml"
    pod_file.write_text(yaml.safe_dump_all(pods))
    return nodes, pod_file


@pytest.mark.parametrize(
    ("flags", "what", "why"),
    [
        # The MIG actuator is on: the H100 may be partitioned, MIG is the safe default.
        (["--mig-actuator"], "MIG slice nvidia.com/mig-1g.10gb on H100-80GB",
         "why: smallest MIG slice holding 8Gi; 56 creatable by the MIG actuator"),
        # Off (the default): no slice exists and none will be made; the share is chosen
        # and the reason says why MIG was not.
        ([], "time-sliced share nvidia.com/gpu.shared on L40S",
         "8 on nodes that opt in to MIG reconfiguration while the MIG actuator is off"),
    ],
)
def test_explain_text(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
                      what: str, why: str) -> None:
    p = pod("asr-0", annotations={"gpupack.io/class": "asr"})
    nodes, pod_file = _files(tmp_path, [p])
    assert main(["explain", str(pod_file), "--nodes", str(nodes), *flags]) == 0
    out = capsys.readouterr().out
    assert f"pod speech/asr-0 (class asr): {what}" in out
    assert why in out
    assert '"path": "/spec/containers/0/resources"' in out
    assert 'schedulerName: "gpupack"' in out


def test_explain_json_patch_applies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = pod("tts-0", annotations={"gpupack.io/gpu-memory": "6Gi", "gpupack.io/isolation": "shared"},
            containers=[{"name": "s", "image": "vllm/vllm-openai"}])
    nodes, pod_file = _files(tmp_path, [p])
    assert main(["explain", str(pod_file), "--nodes", str(nodes), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "shared" and doc["allowed"] is True
    assert "vLLM --gpu-memory-utilization (default 0.9)" in doc["warnings"][0]
    out = jsonpatch.apply_patch(p, doc["patch"])
    assert out["spec"]["containers"][0]["resources"] == doc["result"]["resources"]["s"]


def test_explain_denials_and_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    too_big = pod("big", annotations={"gpupack.io/gpu-memory": "120Gi"})
    vllm = pod("v", namespace="prod",
               annotations={"gpupack.io/gpu-memory": "6Gi", "gpupack.io/isolation": "shared"},
               containers=[{"name": "s", "image": "vllm/vllm-openai"}])
    whole = pod("llm", containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 8}}}])
    nodes, pod_file = _files(tmp_path, [too_big, vllm, whole])
    assert main(["explain", str(pod_file), "--nodes", str(nodes),
                 "--strict-namespace", "prod"]) == 1  # a denial is an answer, exit 1
    out = capsys.readouterr().out
    assert "pod speech/big (class small): DENIED" in out
    assert "largest is H100-80GB with 80Gi" in out
    assert "pod prod/v (class small): DENIED" in out and "strict mode" in out
    assert "pod speech/llm (class whole): whole GPUs: resources unchanged" in out


@pytest.mark.parametrize(
    ("pod_text", "nodes_text", "needle"),
    [
        ("{", None, "pod.yaml: not valid YAML"),
        ("kind: Service\nmetadata: {name: x}\n", None, "kind: expected Pod, got 'Service'"),
        ("", None, "no Pod object in the file"),
        (None, "kind: Node\nmetadata: {name: n}\nstatus: {allocatable: {cpu: lots}}\n",
         "Node n: status.allocatable.cpu: 'lots' is not a quantity"),
    ],
)
def test_explain_unreadable_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          pod_text: str | None, nodes_text: str | None,
                                          needle: str) -> None:
    nodes, pod_file = _files(tmp_path, [pod()])
    if pod_text is not None:
        pod_file.write_text(pod_text)
    if nodes_text is not None:
        nodes.write_text(nodes_text)
    assert main(["explain", str(pod_file), "--nodes", str(nodes)]) == 2
    assert needle in capsys.readouterr().err


def test_webhook_command_rejects_bad_tls_files(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    nodes, _ = _files(tmp_path, [pod()])
    (tmp_path / "c.pem").write_text("not a cert")
    args = ["webhook", "--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "c.pem"),
            "--nodes", str(nodes)]
    assert main(args) == 2
    assert "--tls-cert/--tls-key" in capsys.readouterr().err
    assert main([*args[:-1], str(tmp_path / "missing.yaml")]) == 2


def test_parser_has_both_subcommands() -> None:
    args = build_parser().parse_args(["webhook", "--tls-cert", "c", "--tls-key", "k",
                                      "--nodes", "n"])
    assert args.port == 8443 and args.scheduler_name == "gpupack"
    assert build_parser().parse_args(["explain", "p.yaml", "--nodes", "n"]).format == "text"


def test_explain_an_mps_share(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump_all([node("l4-0", "L4", 2, "mps", replicas=2)]))
    pod_file = tmp_path / "pod.yaml"
    pod_file.write_text(yaml.safe_dump(pod("emb-0", annotations={
        "gpupack.io/gpu-memory": "8Gi"})))
    assert main(["explain", str(pod_file), "--nodes", str(nodes)]) == 0
    assert "pod speech/emb-0 (class small): MPS share nvidia.com/gpu.shared on L4" in (
        capsys.readouterr().out)
