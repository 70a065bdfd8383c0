"""Self-sizing inference servers on time-sliced shares: warn, or deny in strict mode."""

from __future__ import annotations

from typing import Any

import pytest
from webhook_builders import cluster, dynamic, node, pod

from webhook.admit import admit
from webhook.config import WebhookConfig
from webhook.decide import decide_admission
from webhook.decision import Kind
from webhook.sizing import find_self_sizing

CFG = WebhookConfig()
L40S = cluster(node("s0", "L40S", 4, "shared"))  # 48Gi GPUs
MIXED = dynamic(node("h0"), node("s0", "L40S", 4, "shared"))
SHARE = {"gpupack.io/gpu-memory": "12Gi", "gpupack.io/isolation": "shared"}


def _c(**body: Any) -> list[dict[str, Any]]:
    return [{"name": "server", "image": "registry/app:1", **body}]


# (container, expected fraction found or None for no finding, over a 12Gi share of 48Gi?)
FLAG_TABLE: list[tuple[list[dict[str, Any]], float | None, bool]] = [
    (_c(args=["--model", "m", "--gpu-memory-utilization", "0.9"]), 0.9, True),
    (_c(args=["--model", "m", "--gpu-memory-utilization=0.9"]), 0.9, True),
    (_c(args=["--gpu_memory_utilization=0.5"]), 0.5, True),  # underscores are accepted
    (_c(command=["vllm", "serve", "m", "--gpu-memory-utilization", "0.25"]), 0.25, False),
    (_c(command=["sh", "-c", "exec vllm serve m --gpu-memory-utilization 0.6 --port 8000"]),
     0.6, True),
    (_c(command=["python3", "-m", "vllm.entrypoints.openai.api_server"],
        args=["--gpu-memory-utilization", "0.2", "--gpu-memory-utilization", "0.5"]), 0.5, True),
    # vLLM without the flag takes its default 0.9.
    ([{"name": "server", "image": "vllm/vllm-openai:v0.6.3", "args": ["--model", "m"]}], 0.9, True),
    (_c(command=["python", "-m", "sglang.launch_server"], args=["--mem-fraction-static", "0.8"]),
     0.8, True),
    (_c(command=["python", "-m", "sglang.launch_server"], args=["--mem-fraction-static=0.2"]),
     0.2, False),
    # SGLang sizes by GPU when the flag is absent: no fixed default, so nothing bounds it
    # by the share (issue #18: refused in strict mode, warned otherwise).
    (_c(command=["python", "-m", "sglang.launch_server"]), None, True),
    (_c(args=["--cuda-memory-fraction", "0.3"]), 0.3, True),
    ([{"name": "server", "image": "ghcr.io/huggingface/text-generation-inference:2.3"}], 1.0, True),
    (_c(env=[{"name": "CUDA_MEMORY_FRACTION", "value": "0.2"}],
        image="ghcr.io/huggingface/text-generation-inference:2.3"), 0.2, False),
    (_c(args=["--port", "8000"]), None, False),
    (_c(args=["--gpu-memory-utilization"]), None, False),  # no value: unreadable, warned
]


@pytest.mark.parametrize(("containers", "fraction", "over"), FLAG_TABLE)
def test_flag_table_warns_on_shares(containers: list[dict[str, Any]], fraction: float | None,
                                    over: bool) -> None:
    found = [f.fraction for f in find_self_sizing(containers[0])]
    if fraction is not None:
        assert found == [fraction]
    d = decide_admission(pod(annotations=SHARE, containers=containers), L40S, CFG)
    assert d.kind is Kind.SHARED
    over_share = [w for w in d.warnings if "12Gi share" in w and "OOM its neighbours" in w]
    assert bool(over_share) is over, d.warnings
    # Strict mode by pod annotation turns exactly those warnings into a denial.
    strict = dict(SHARE, **{"gpupack.io/strict": "true"})
    s = decide_admission(pod(annotations=strict, containers=containers), L40S, CFG)
    assert (s.kind is Kind.DENY) is over
    if over:
        assert s.status_code == 403 and "strict mode" in s.reason


def test_message_names_the_numbers() -> None:
    c = _c(args=["--gpu-memory-utilization", "0.9"])
    d = decide_admission(pod(annotations=SHARE, containers=c), L40S, CFG)
    assert d.warnings == (
        "container server: vLLM --gpu-memory-utilization 0.9 takes 43.2Gi of a time-sliced "
        "L40S (48Gi), more than its 12Gi share, and can OOM its neighbours; use <= 0.25 or "
        "gpupack.io/isolation: mig",
    )
    assert all(len(w) <= 256 for w in d.warnings)


def test_namespace_label_opts_into_strict_mode() -> None:
    c = _c(args=["--gpu-memory-utilization", "0.9"])
    p = pod(annotations=SHARE, containers=c)
    assert decide_admission(p, L40S, CFG, {"gpupack.io/strict": "true"}).kind is Kind.DENY
    assert decide_admission(p, L40S, CFG, {"gpupack.io/strict": "false"}).kind is Kind.SHARED
    # The pod's own "false" does not override a strict namespace.
    p2 = pod(annotations=dict(SHARE, **{"gpupack.io/strict": "false"}), containers=c)
    assert decide_admission(p2, L40S, CFG, {"gpupack.io/strict": "true"}).kind is Kind.DENY


def test_mig_slices_are_safe_for_self_sizing_servers() -> None:
    c = _c(args=["--gpu-memory-utilization", "0.95"])
    d = decide_admission(
        pod(annotations={"gpupack.io/gpu-memory": "12Gi", "gpupack.io/strict": "true"},
            containers=c), MIXED, CFG)
    assert d.kind is Kind.MIG and d.warnings == ()


def test_only_the_gpu_container_is_checked() -> None:
    containers: list[dict[str, Any]] = [{"name": "sidecar", "image": "vllm/vllm-openai"},
                  {"name": "model", "image": "app", "args": ["--port", "1"]}]
    ann = dict(SHARE, **{"gpupack.io/container": "model", "gpupack.io/strict": "true"})
    a = admit(pod(annotations=ann, containers=containers), L40S, CFG)
    assert a.allowed and a.decision.warnings == ()


def test_reinvocation_still_warns_and_stays_empty() -> None:
    import jsonpatch

    c = _c(args=["--gpu-memory-utilization", "0.9"])
    p = pod(annotations=SHARE, containers=c)
    a = admit(p, L40S, CFG)
    out = jsonpatch.apply_patch(p, list(a.patch))
    again = admit(out, L40S, CFG)
    assert again.patch == () and again.decision.warnings == a.decision.warnings
