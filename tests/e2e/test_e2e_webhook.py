"""The webhook as the API server calls it: registered by the chart's
MutatingWebhookConfiguration, over TLS with the caBundle of the project's script."""

from __future__ import annotations

from typing import Any

import pytest
from cluster import create_nodes, h100_mig, l40s_shared, pod, wait_for_webhook
from conftest import Space
from controlplane import Stack, _find, render_chart
from kubernetes.client.rest import ApiException


def _limits(obj: Any) -> dict[str, str]:
    return dict(obj.spec.containers[0].resources.limits or {})


def test_sized_pod_comes_back_concrete(space: Space, core: Any) -> None:
    ns = space.namespace()
    space.nodes += create_nodes(core, [
        h100_mig(f"{space.name}-mig", space.name, {"1g.10gb": 28}),
        l40s_shared(f"{space.name}-l40s", space.name)])
    body = pod("asr", annotations={"gpupack.io/gpu-memory": "8Gi"})

    wait_for_webhook(core, ns, body, "nvidia.com/mig-")
    made = core.create_namespaced_pod(ns, body)
    assert made.spec.scheduler_name == "gpupack"
    limits = _limits(made)
    assert limits.get("nvidia.com/mig-1g.10gb") == "1", limits
    assert made.metadata.annotations.get("gpupack.io/decision"), made.metadata.annotations


def test_bad_value_refused_with_the_webhooks_message(space: Space, core: Any) -> None:
    ns = space.namespace()
    bad = pod("bad", annotations={"gpupack.io/gpu-memory": "lots"})
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, bad)
    assert err.value.status in (400, 403), err.value
    text = str(err.value.body)
    assert "gpupack.io/gpu-memory" in text and "lots" in text, text
    assert "gpu-pods.gpupack.io" in text, text  # the API server names the webhook


def test_failure_policy_holds_with_the_webhook_stopped(space: Space, core: Any,
                                                       stack: Stack) -> None:
    ns = space.namespace()
    policy = _find(render_chart("eA=="), "MutatingWebhookConfiguration")["webhooks"][0][
        "failurePolicy"]
    stack.stop("webhook")
    try:
        body = pod("no-webhook", annotations={"gpupack.io/gpu-memory": "8Gi"})
        if policy == "Ignore":
            made = core.create_namespaced_pod(ns, body)
            # Admitted unchanged: no concrete GPU resource, no gpupack scheduler.
            assert not any(k.startswith("nvidia.com/") for k in _limits(made))
            assert made.spec.scheduler_name == "default-scheduler"
        else:
            with pytest.raises(ApiException) as err:
                core.create_namespaced_pod(ns, body)
            assert "gpupack" in str(err.value.body)
    finally:
        stack.start("webhook")
