"""One reader per sizing annotation (``gpupack.io/gpu-memory``, ``gpupack.io/gpu-compute``):
the webhook sizing a pod and the extender reading one (to place, or already bound) agree
on every value, through :func:`kube.annotations.gpu_memory_mib` and
:func:`kube.annotations.gpu_compute_milli`.

The rule chosen is the safe one: a memory of zero or less is refused everywhere (the
extender used to read "0" as a pod declaring no GPU memory, to be placed as taking none,
where the webhook refused it); a pod already bound is never skipped for its annotation
(it holds its share whatever the annotation says: skipped, its share was free for the
next pod), it is read as declaring nothing."""

from __future__ import annotations

from typing import Any

import pytest
from webhook_builders import cluster, node, pod

from kube import annotations as A
from kube.cache import ClusterCache
from kube.objects import ObjectError, pod_request
from webhook.config import WebhookConfig
from webhook.decide import decide_admission
from webhook.decision import Kind

MEM, COMPUTE = A.GPU_MEMORY, A.GPU_COMPUTE

# (value, MiB read, or the words of the refusal)
MEMORY: list[tuple[str, int | str]] = [
    ("8Gi", 8192),
    ("8192Mi", 8192),
    ("1.5Gi", 1536),
    ("1", 1),  # a byte rounds up to one MiB: more than zero
    ("0", "must be more than zero"),
    ("0Gi", "must be more than zero"),
    ("-1Gi", "is negative"),
    ("much", "much"),
    ("1e999999", "out of range"),
]
COMPUTE_VALUES: list[tuple[str, int | str]] = [
    ("0.25", 250),
    ("1", 1000),
    ("0.0001", 1),  # rounded up: never a share of nothing
    ("0", "must be a fraction in (0, 1]"),
    ("1.5", "must be a fraction in (0, 1]"),
    ("-0.5", "is negative"),
    ("half", "half"),
]


@pytest.mark.parametrize(("value", "want"), MEMORY)
def test_gpu_memory_has_one_rule(value: str, want: int | str) -> None:
    if isinstance(want, int):
        assert A.gpu_memory_mib({MEM: value}) == want
    else:
        with pytest.raises(A.AnnotationError, match=want.replace("(", r"\(")) as e:
            A.gpu_memory_mib({MEM: value})
        assert e.value.key == MEM
    assert A.gpu_memory_mib({}) is None


@pytest.mark.parametrize(("value", "want"), COMPUTE_VALUES)
def test_gpu_compute_has_one_rule(value: str, want: int | str) -> None:
    if isinstance(want, int):
        assert A.gpu_compute_milli({COMPUTE: value}) == want
    else:
        with pytest.raises(A.AnnotationError, match=want.replace("(", r"\(")) as e:
            A.gpu_compute_milli({COMPUTE: value})
        assert e.value.key == COMPUTE
    assert A.gpu_compute_milli({}) is None


def shared_pod(ann: dict[str, str], node_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "gpupack", "containers": [{
        "name": "main", "image": "x",
        "resources": {"limits": {A.SHARED_RESOURCE: "1"}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "speech", "uid": "u1", "annotations": ann},
            "spec": spec, "status": {"phase": "Running" if node_name else "Pending"}}


@pytest.mark.parametrize(("key", "value", "want"),
                         [(MEM, v, w) for v, w in MEMORY]
                         + [(COMPUTE, v, w) for v, w in COMPUTE_VALUES])
def test_the_webhook_and_the_extender_agree(key: str, value: str, want: int | str) -> None:
    ann = {key: value} if key == MEM else {MEM: "8Gi", key: value}
    # The extender, a pod to place.
    if isinstance(want, int):
        req = pod_request(shared_pod(ann))
        assert (req.gpu_memory_mib if key == MEM else req.gpu_milli) == want
    else:
        with pytest.raises(ObjectError, match=f"metadata.annotations.{key}: "):
            pod_request(shared_pod(ann))
    # The webhook, the same annotations on a small pod.
    d = decide_admission(pod(annotations={**ann, A.ISOLATION: "shared"}),
                         cluster(node("s0", "L40S", 4, "shared")), WebhookConfig())
    if isinstance(want, int):
        assert d.kind is not Kind.DENY, d.reason
    else:
        assert d.kind is Kind.DENY and d.status_code == 400, d.reason
        assert f"metadata.annotations.{key}" in d.reason


@pytest.mark.parametrize("value", ["0", "-1Gi", "much"])
def test_a_bound_pod_with_an_unusable_memory_is_counted_not_skipped(value: str) -> None:
    bound = shared_pod({MEM: value, COMPUTE: "0.5"}, node_name="s0")
    req = pod_request(bound, strict=False)
    assert req.gpu_memory_mib == 0 and req.gpu_milli == 500  # its share still counted
    cache = ClusterCache("gpupack")
    cache.replace([node("s0", "L40S", 1, "shared")], [bound])
    assert cache.bad_objects == 0
    assert cache.counted("speech/p") is not None
