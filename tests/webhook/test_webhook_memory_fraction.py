"""gpupack.io/memory-fraction: "set": a vLLM or SGLang server on a time-sliced share gets
its memory-fraction flag set to the share; strict mode refuses a self-sizing server that
its neighbours could not survive."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest
from webhook_builders import cluster, dynamic, node, pod

from webhook.admit import admit
from webhook.config import WebhookConfig
from webhook.decision import Kind

CFG = WebhookConfig()
L40S = cluster(node("s0", "L40S", 4, "shared"))  # 48Gi GPUs: a 12Gi share is 0.25
SET = {"gpupack.io/gpu-memory": "12Gi", "gpupack.io/memory-fraction": "set"}
STRICT = {**SET, "gpupack.io/strict": "true"}
SGLANG = ["python", "-m", "sglang.launch_server"]


def _c(**body: Any) -> list[dict[str, Any]]:
    return [{"name": "server", "image": "registry/app:1", **body}]


# (container, the container's command and args after the patch)
SET_TABLE: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
    (_c(args=["--model", "m", "--gpu-memory-utilization", "0.9"]),
     {"args": ["--model", "m", "--gpu-memory-utilization", "0.25"]}),
    (_c(args=["--gpu-memory-utilization=0.9"]), {"args": ["--gpu-memory-utilization=0.25"]}),
    (_c(args=["--gpu_memory_utilization=0.5"]), {"args": ["--gpu_memory_utilization=0.25"]}),
    # Already at the share: left as it is.
    (_c(args=["--gpu-memory-utilization", "0.25"]), {"args": ["--gpu-memory-utilization", "0.25"]}),
    # vLLM named by its image, flag absent (default 0.9): appended.
    ([{"name": "server", "image": "vllm/vllm-openai:v0.6.3", "args": ["--model", "m"]}],
     {"args": ["--model", "m", "--gpu-memory-utilization=0.25"]}),
    ([{"name": "server", "image": "vllm/vllm-openai:v0.6.3"}],
     {"args": ["--gpu-memory-utilization=0.25"]}),
    # Inside a shell script: the value is replaced where it stands.
    (_c(command=["sh", "-c", "exec vllm serve m --gpu-memory-utilization 0.6 --port 8000"]),
     {"command": ["sh", "-c", "exec vllm serve m --gpu-memory-utilization 0.25 --port 8000"]}),
    (_c(command=SGLANG, args=["--mem-fraction-static", "0.8"]),
     {"command": SGLANG, "args": ["--mem-fraction-static", "0.25"]}),
    # SGLang without the flag sizes itself from the GPU: the flag is added.
    (_c(command=SGLANG), {"command": SGLANG, "args": ["--mem-fraction-static=0.25"]}),
]


@pytest.mark.parametrize(("containers", "after"), SET_TABLE)
def test_set_writes_the_share_fraction(containers: list[dict[str, Any]],
                                       after: dict[str, Any]) -> None:
    for ann in (SET, STRICT):  # strict mode admits what the setting made safe
        p = pod(annotations=ann, containers=containers)
        adm = admit(p, L40S, CFG)
        assert adm.decision.kind is Kind.SHARED, adm.decision.reason
        assert not [w for w in adm.decision.warnings if "OOM" in w], adm.decision.warnings
        out = jsonpatch.JsonPatch(list(adm.patch)).apply(p)  # a valid RFC 6902 patch
        assert out == adm.result
        c = out["spec"]["containers"][0]
        assert {k: c[k] for k in ("command", "args") if k in c} == after
        # Re-invocation on the stored pod changes nothing.
        assert admit(out, L40S, CFG).patch == ()


def test_without_the_annotation_nothing_is_edited() -> None:
    c = _c(args=["--gpu-memory-utilization", "0.9"])
    adm = admit(pod(annotations={"gpupack.io/gpu-memory": "12Gi"}, containers=c), L40S, CFG)
    assert adm.decision.arg_edits == ()
    assert adm.result["spec"]["containers"][0]["args"] == ["--gpu-memory-utilization", "0.9"]
    assert any("can OOM its neighbours" in w for w in adm.decision.warnings)


def test_a_script_without_the_flag_is_not_edited_and_strict_refuses_it() -> None:
    c = _c(command=["sh", "-c", "exec vllm serve m --port 8000"])
    adm = admit(pod(annotations=SET, containers=c), L40S, CFG)
    assert adm.decision.kind is Kind.SHARED
    assert any("gpupack does not edit scripts; add --gpu-memory-utilization 0.25" in w
               for w in adm.decision.warnings), adm.decision.warnings
    assert adm.result["spec"]["containers"][0]["command"] == c[0]["command"]
    denied = admit(pod(annotations=STRICT, containers=c), L40S, CFG).decision
    assert denied.kind is Kind.DENY and denied.status_code == 403
    assert "vLLM --gpu-memory-utilization (default 0.9) takes 43.2Gi" in denied.reason


@pytest.mark.parametrize(
    ("containers", "memory", "denied"),
    [
        # SGLang without an explicit fraction on a share smaller than the GPU: refused.
        (_c(command=SGLANG), "12Gi", "spec.containers[0].command: SGLang without "
         "--mem-fraction-static sizes its memory from the whole time-sliced L40S (48Gi), not "
         "its 12Gi share, and can OOM its neighbours; set --mem-fraction-static <= 0.25, "
         'gpupack.io/memory-fraction: "set" or gpupack.io/isolation: mig'),
        (_c(command=SGLANG, args=["--port", "30000"]), "24Gi",
         "spec.containers[0].args: SGLang without --mem-fraction-static"),
        # vLLM's own default fraction: the existing refusal.
        ([{"name": "server", "image": "vllm/vllm-openai:v0.6.3"}], "12Gi",
         "vLLM --gpu-memory-utilization (default 0.9) takes 43.2Gi of a time-sliced L40S"),
        # An explicit fraction within the share survives its neighbours.
        (_c(command=SGLANG, args=["--mem-fraction-static", "0.2"]), "12Gi", None),
        # The share is the whole GPU: no neighbours to protect.
        (_c(command=SGLANG), "48Gi", None),
    ],
)
def test_strict_refuses_self_sizing_servers(containers: list[dict[str, Any]], memory: str,
                                            denied: str | None) -> None:
    ann = {"gpupack.io/gpu-memory": memory, "gpupack.io/strict": "true"}
    d = admit(pod(annotations=ann, containers=containers), L40S, CFG).decision
    if denied is None:
        assert d.kind is Kind.SHARED, d.reason
    else:
        assert d.kind is Kind.DENY and d.status_code == 403, d.reason
        assert d.reason.startswith("strict mode (gpupack.io/strict): ")
        assert denied in d.reason


def test_bad_value_is_a_400_naming_field_and_value() -> None:
    d = admit(pod(annotations={**SET, "gpupack.io/memory-fraction": "yes"}), L40S, CFG).decision
    assert d.kind is Kind.DENY and d.status_code == 400
    assert d.reason.startswith("metadata.annotations.gpupack.io/memory-fraction: 'yes' is not "
                               '"set"')


def test_mig_and_mps_are_left_alone() -> None:
    """The fraction applies to the slice on MIG, and MPS caps the client itself."""
    c = _c(args=["--gpu-memory-utilization", "0.9"])
    mig = admit(pod(annotations=SET, containers=c), dynamic(node("h0")), CFG)
    assert mig.decision.kind is Kind.MIG and mig.decision.arg_edits == ()
    mps = admit(pod(annotations=SET, containers=c), cluster(node("m0", "L40S", 1, "mps")), CFG)
    assert mps.decision.kind is Kind.MPS and mps.decision.arg_edits == ()
    assert not mps.decision.warnings
