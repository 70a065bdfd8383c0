"""packing.dra.world: a cluster's DRA objects read once; bad objects are reported by
field and left out, the rest still predicts."""

from __future__ import annotations

from typing import Any

from packing.dra import nvidia
from packing.dra.allocator import Verdict
from packing.dra.objects import Node
from packing.dra.parse import parse_resource_claim


def _claim(name: str, allocation: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": "ns"}, "spec": {
        "devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    if allocation:
        obj["status"] = {"allocation": allocation}
    return obj


def test_world_reads_predicts_and_reports_bad_objects() -> None:
    from packing.dra.world import world_from_api

    slices = nvidia.node_slices("n1", [nvidia.GpuSpec(i, "H100-80GB") for i in range(2)])
    bad_slice = {"metadata": {"name": "broken"}, "spec": {"driver": "x", "pool": {}}}
    held = _claim("held", {"devices": {"results": [
        {"request": "r", "driver": nvidia.DRIVER, "pool": "n1", "device": "gpu-0"}]}})
    rule = {"metadata": {"name": "keep"}, "spec": {
        "deviceSelector": {"device": "gpu-1"}, "taint": {"key": "k", "effect": "NoSchedule"}}}
    world, errors = world_from_api([*slices, bad_slice], nvidia.device_classes(), [held],
                                   [rule])
    assert len(errors) == 1 and "ResourceSlice broken: spec.pool.name" in str(errors[0])
    assert len(world.node_slices("n1")) == 3 and "ns/held" in world.claims
    pod_claim = parse_resource_claim(_claim("new"))
    # gpu-0 is held, gpu-1 tainted by the rule: no whole GPU left
    assert world.predict(Node("n1"), [pod_claim]).verdict is Verdict.UNSCHEDULABLE
    untainted, _ = world_from_api(slices, nvidia.device_classes(), [held])
    p = untainted.predict(Node("n1"), [pod_claim])
    assert p.verdict is Verdict.ALLOCATED and p.devices == (("gpu.nvidia.com/n1/gpu-1",),)
    in_flight = parse_resource_claim(_claim("flight", {"devices": {"results": [
        {"request": "r", "driver": nvidia.DRIVER, "pool": "n1", "device": "gpu-1"}]}}))
    busy, _ = world_from_api(slices, nvidia.device_classes(), [held], in_flight=[in_flight])
    assert busy.predict(Node("n1"), [pod_claim]).verdict is Verdict.UNSCHEDULABLE
