"""packing.dra.extended: the claim kube-scheduler makes for DRA-backed extended resources
(KEP-5004): which class serves a resource, on which nodes, and the requests it gets."""

from __future__ import annotations

import pytest
from dra_builders import names, nvidia_classes, nvidia_node, run

from packing.dra.extended import (
    Container,
    class_for,
    containers_from_pod,
    extended_resource_claim,
    is_extended_resource,
)
from packing.dra.objects import DeviceClass


@pytest.mark.parametrize(("name", "want"), [
    ("nvidia.com/gpu", True), ("deviceclass.resource.kubernetes.io/gpu.nvidia.com", True),
    ("cpu", False), ("hugepages-2Mi", False), ("kubernetes.io/x", False),
    ("node.kubernetes.io/x", False), ("requests.nvidia.com/gpu", False)])
def test_extended_resource_names(name: str, want: bool) -> None:
    assert is_extended_resource(name) is want


def test_which_class_serves() -> None:
    old = DeviceClass("b-old", extended_resource_name="x.com/gpu",
                      creation_timestamp="2026-01-01T00:00:00Z")
    new = DeviceClass("c-new", extended_resource_name="x.com/gpu",
                      creation_timestamp="2026-02-01T00:00:00Z")
    twin = DeviceClass("a-new", extended_resource_name="x.com/gpu",
                       creation_timestamp="2026-02-01T00:00:00Z")
    assert class_for("x.com/gpu", [old, new]) == new  # the newest wins
    assert class_for("x.com/gpu", [old, new, twin]) == twin  # then the smallest name
    assert class_for("deviceclass.resource.kubernetes.io/b-old", [old]) == old
    assert class_for("y.com/gpu", [old]) is None


def pod(*containers: dict[str, object], init: tuple[dict[str, object], ...] = ()
        ) -> list[Container]:
    return containers_from_pod({"spec": {"containers": list(containers),
                                         "initContainers": list(init)}})


def test_requests_per_container_sorted_by_name() -> None:
    cs = pod({"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}},
             {"name": "b", "resources": {"requests": {"nvidia.com/gpu": 1}}})
    made = extended_resource_claim("ns", "p", cs, nvidia_classes(), {})
    assert made.claim is not None
    reqs = [(r.name, r.exactly.count, r.exactly.device_class_name)  # type: ignore[union-attr]
            for r in made.claim.requests]
    # cpu sorts before nvidia.com/gpu in container a: its request is the second (index 1)
    assert reqs == [("container-0-request-1", 2, "gpu.nvidia.com"),
                    ("container-1-request-0", 1, "gpu.nvidia.com")]


def test_init_containers_reuse_later_devices() -> None:
    gpu = "nvidia.com/gpu"
    cs = pod({"name": "main", "resources": {"limits": {gpu: "1"}}},
             init=({"name": "i0", "resources": {"limits": {gpu: "3"}}},
                   {"name": "i1", "resources": {"limits": {gpu: "2"}}},
                   {"name": "side", "restartPolicy": "Always",
                    "resources": {"limits": {gpu: "1"}}}))
    made = extended_resource_claim("ns", "p", cs, nvidia_classes(), {})
    assert made.claim is not None
    reqs = {r.name: r.exactly.count for r in made.claim.requests}  # type: ignore[union-attr]
    # i0 needs 3, the sidecar and main give it 2: 1 more; i1 needs nothing more; only the
    # largest short-lived request stays.
    assert reqs == {"container-0-request-0": 1, "container-2-request-0": 1,
                    "container-3-request-0": 1}


def test_device_plugin_nodes_and_misfits() -> None:
    cs = pod({"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    assert extended_resource_claim("ns", "p", cs, nvidia_classes(),
                                   {"nvidia.com/gpu": 8}).claim is None
    unknown = pod({"name": "a", "resources": {"limits": {"example.com/fpga": "1"}}})
    assert extended_resource_claim("ns", "p", unknown, nvidia_classes(), {}).misfit == (
        "example.com/fpga")
    with pytest.raises(ValueError, match=r"spec.containers\[0\].resources: nvidia.com/gpu"):
        pod({"name": "a", "resources": {"limits": {"nvidia.com/gpu": "0.5"}}})


def test_the_claim_allocates_after_the_pods_own() -> None:
    cs = pod({"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}})
    made = extended_resource_claim("ns", "p", cs, nvidia_classes(), {})
    assert made.claim is not None
    p = run(nvidia_node(gpus=2), made.claim, classes=nvidia_classes())
    assert names(p) == [["gpu-0", "gpu-1"]]
    assert [r.request for r in p.results[0]] == ["container-0-request-0"] * 2
