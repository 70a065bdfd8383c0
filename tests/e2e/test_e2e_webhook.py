"""The webhook as the API server calls it: registered by the chart's
MutatingWebhookConfiguration, over TLS with the caBundle of the project's script."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from cluster import (
    L40S,
    POOL,
    SHARED,
    create_nodes,
    h100_mig,
    l40s_shared,
    pending_report,
    pod,
    pods_in,
    wait_for_webhook,
)
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

    # The exact slice: a view still holding an earlier test's deleted MIG nodes would
    # convert the probe to a larger slice of theirs.
    wait_for_webhook(core, ns, body, "nvidia.com/mig-1g.10gb")
    made = core.create_namespaced_pod(ns, body)
    assert made.spec.scheduler_name == "gpupack"
    limits = _limits(made)
    assert limits.get("nvidia.com/mig-1g.10gb") == "1", limits
    assert made.metadata.annotations.get("gpupack.io/decision"), made.metadata.annotations


def test_pool_affinity_and_taints_bound_what_a_pod_is_given(space: Space, core: Any) -> None:
    """The webhook counts only the nodes a pod can reach: its node selector, required
    node affinity (any label, any operator) and tolerations against the nodes' taints.
    A pool pod that does not tolerate its pool's tainted MIG node gets a share of the
    pool's L40S (not the control plane's agent node's free slice, nor the tainted
    one); pods that tolerate it get its slices; all bind where kube-scheduler agrees."""
    ns = space.namespace()
    mig, l40s = f"{space.name}-mig", f"{space.name}-l40s"
    space.nodes += create_nodes(core, [h100_mig(mig, space.name, {"3g.40gb": 2}),
                                       l40s_shared(l40s, space.name, gpus=2)])
    taint = {"key": "e2e.gpupack.io/dedicated", "value": "asr", "effect": "NoSchedule"}
    core.patch_node(mig, {"spec": {"taints": [taint]}})
    # A marker node after the taint: the node watch is ordered, so once the webhook's
    # view has the marker (its probe converts), it has the taint too.
    marker = f"{space.name}-marker"
    space.nodes += create_nodes(core, [l40s_shared(marker, marker, gpus=1)])
    wait_for_webhook(core, ns, pod("probe", pool=marker,
                                   annotations={"gpupack.io/gpu-memory": "8Gi"}), SHARED)
    tolerate = [{"key": "e2e.gpupack.io/dedicated", "operator": "Exists",
                 "effect": "NoSchedule"}]

    def create(name: str, **spec: Any) -> Any:
        body = pod(name, annotations={"gpupack.io/gpu-memory": "30Gi"})
        body["spec"].update(spec)
        return core.create_namespaced_pod(ns, body)

    plain = create("plain", nodeSelector={POOL: space.name})
    tolerant = create("tolerant", nodeSelector={POOL: space.name}, tolerations=tolerate)
    by_affinity = create("affinity", tolerations=tolerate, affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
            "matchExpressions": [
                {"key": POOL, "operator": "In", "values": [space.name]},
                {"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": [L40S]}],
        }]}}})
    assert SHARED in _limits(plain), _limits(plain)
    reason = json.loads(plain.metadata.annotations["gpupack.io/decision"])["reason"]
    assert f"in reach of spec.nodeSelector.{POOL}={space.name}" in reason, reason
    assert "nvidia.com/mig-3g.40gb" in _limits(tolerant), _limits(tolerant)
    assert "nvidia.com/mig-3g.40gb" in _limits(by_affinity), _limits(by_affinity)
    # Nothing in reach: refused, naming the field.
    with pytest.raises(ApiException) as err:
        create("nowhere", nodeSelector={POOL: f"{space.name}-none"})
    assert f"spec.nodeSelector.{POOL}={space.name}-none: no node in reach" in str(
        err.value.body), err.value.body

    deadline = time.monotonic() + 60
    where: dict[str, str | None] = {}
    while time.monotonic() < deadline:
        where = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods_in(core, ns)}
        if all(where.values()):
            break
        time.sleep(0.5)
    assert where == {"plain": l40s, "tolerant": mig, "affinity": mig}, pending_report(core, ns)


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


def test_init_containers_and_node_name_as_the_api_server_sends_them(space: Space,
                                                                     core: Any) -> None:
    """Through the real API server and the chart's matchConditions: a GPU in an init
    container is seen (a sized pod with one is refused, naming the field; a pod whose
    only GPU is there is handed to gpupack), and spec.nodeName pins what a pod is given
    (a pod created on the L40S node gets a share, not the H100's slice)."""
    ns = space.namespace()
    mig, l40s = f"{space.name}-mig", f"{space.name}-l40s"
    space.nodes += create_nodes(core, [h100_mig(mig, space.name, {"1g.10gb": 28}),
                                       l40s_shared(l40s, space.name)])
    wait_for_webhook(core, ns, pod("probe", annotations={"gpupack.io/gpu-memory": "8Gi"}),
                     "nvidia.com/mig-")
    init = {"name": "fetch", "image": "registry.example/e2e:1",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    sized = pod("sized-init", annotations={"gpupack.io/gpu-memory": "8Gi"})
    sized["spec"]["initContainers"] = [init]
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, sized)
    assert "spec.initContainers[0]" in str(err.value.body), err.value.body
    only_init = pod("only-init")
    only_init["spec"]["initContainers"] = [init]
    made = core.create_namespaced_pod(ns, only_init)
    assert made.spec.scheduler_name == "gpupack", made.spec.scheduler_name
    on_l40s = pod("on-l40s", annotations={"gpupack.io/gpu-memory": "8Gi"})
    on_l40s["spec"]["nodeName"] = l40s
    made = core.create_namespaced_pod(ns, on_l40s)
    assert SHARED in _limits(made), _limits(made)
