"""packing.dra.inventory: a DRA node's GPUs in the packer's model, what claims hold as
model entries, the whole-GPU demand of claims, device states for the metrics."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from packing.dra import nvidia
from packing.dra.inventory import (
    claim_uses,
    device_states,
    node_inventory,
    whole_gpu_class,
    whole_gpu_demand,
    with_dra_gpus,
)
from packing.dra.objects import AllocatedDevice
from packing.dra.parse import parse_device_class, parse_resource_claim, parse_resource_slice
from packing.model import GpuMode, NodeInfo, RequestKind

H100 = "H100-80GB"


def slices(gpus: list[nvidia.GpuSpec], **kw: Any) -> list[Any]:
    return [parse_resource_slice(s) for s in nvidia.node_slices("n", gpus, **kw)]


def dev(name: str, **kw: Any) -> AllocatedDevice:
    return AllocatedDevice("r", nvidia.DRIVER, "n", name, **kw)


CASES = [
    ("whole-gpus", [nvidia.GpuSpec(0, H100), nvidia.GpuSpec(1, H100)],
     {"layout": nvidia.Layout.STATIC}, set(), [(GpuMode.WHOLE, ()), (GpuMode.WHOLE, ())]),
    ("dynamic-mig-idle", [nvidia.GpuSpec(0, H100)], {}, set(), [(GpuMode.WHOLE, ())]),
    ("dynamic-mig-held", [nvidia.GpuSpec(0, H100)], {},
     {"gpu.nvidia.com/n/gpu-0-mig-3g40gb-9-4"}, [(GpuMode.MIG, (("3g.40gb", 4),))]),
    ("static-mig", [nvidia.GpuSpec(0, "A100-40GB", mig_mode=True,
                                   static_mig=(("3g.20gb", 0), ("1g.5gb", 6)))],
     {"layout": nvidia.Layout.STATIC}, set(),
     [(GpuMode.MIG, (("3g.20gb", 0), ("1g.5gb", 6)))]),
    ("shared", [nvidia.GpuSpec(0, "L40S")],
     {"layout": nvidia.Layout.STATIC, "info": nvidia.DriverInfo(consumable_shares="memory")},
     set(), [(GpuMode.FRACTIONAL, ())]),
]


@pytest.mark.parametrize(("gpus", "kw", "held", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_inventory_modes(gpus: list[nvidia.GpuSpec], kw: dict[str, Any], held: set[str],
                         expected: list[Any]) -> None:
    inv = node_inventory("n", slices(gpus, **kw), held)
    assert inv is not None
    assert [(g.mode, tuple((i.profile, i.start) for i in g.mig)) for g in inv.gpus] == expected


def test_no_gpu_device_no_inventory_and_a_device_plugin_node_keeps_its_own() -> None:
    assert node_inventory("n", []) is None
    inv = node_inventory("n", slices([nvidia.GpuSpec(0, H100)]))
    base = NodeInfo("n", 1000, 1000)
    assert with_dra_gpus(base, inv, device_plugin=True) == (base, False)
    info, added = with_dra_gpus(base, inv)
    assert added and len(info.gpus) == 1


def test_taints_and_the_clique_attribute() -> None:
    taint = {"key": "gpu.nvidia.com/unhealthy", "effect": "NoExecute"}
    raw = nvidia.node_slices("n", [nvidia.GpuSpec(0, H100), nvidia.GpuSpec(1, H100)],
                             layout=nvidia.Layout.STATIC,
                             info=nvidia.DriverInfo(taints={"gpu-1": [taint]}))
    for d in raw[0]["spec"]["devices"]:
        d["attributes"]["cliqueID"] = {"string": "fabric-7.1"}
    inv = node_inventory("n", [parse_resource_slice(s) for s in raw])
    assert inv is not None and inv.tainted == {1} and inv.clique == "fabric-7.1"
    info, _ = with_dra_gpus(NodeInfo("n", 1, 1), inv)
    assert info.labels["nvidia.com/gpu.clique"] == "fabric-7.1"


def test_claim_uses_by_kind() -> None:
    inv = node_inventory("n", slices([nvidia.GpuSpec(0, H100), nvidia.GpuSpec(1, H100)]),
                         {"gpu.nvidia.com/n/gpu-1-mig-1g10gb-19-2"})
    assert inv is not None
    whole = claim_uses(inv, "ns/a", [dev("gpu-0")])
    assert [(r.kind, r.gpu_count, p.gpus) for r, p in whole] == [(RequestKind.WHOLE, 1, (0,))]
    (mig,) = claim_uses(inv, "ns/b", [dev("gpu-1-mig-1g10gb-19-2")])
    assert (mig[1].mig_profile, mig[1].mig_start, mig[1].mig_created) == ("1g.10gb", 2, False)
    (new,) = claim_uses(inv, "ns/c", [dev("gpu-1-mig-1g10gb-19-3")])
    assert new[1].mig_created  # not held: a partition the allocation creates
    assert claim_uses(inv, "ns/d", [dev("gpu-0", admin_access=True)]) == []
    assert claim_uses(inv, "ns/e", [AllocatedDevice("r", "other", "n", "gpu-0")]) == []


def test_a_share_counts_its_consumed_memory() -> None:
    inv = node_inventory("n", slices([nvidia.GpuSpec(0, "L40S")], layout=nvidia.Layout.STATIC,
                                     info=nvidia.DriverInfo(consumable_shares="memory")))
    assert inv is not None
    (use,) = claim_uses(inv, "ns/a", [dev("gpu-0", share_id="s1", consumed_capacity={
        "memory": Decimal(12 * 1024 ** 3)})])
    assert use[0].kind is RequestKind.SHARED and use[0].gpu_memory_mib == 12 * 1024


def test_whole_gpu_demand_of_claims() -> None:
    classes = {c["metadata"]["name"]: parse_device_class(c) for c in nvidia.device_classes()}
    assert whole_gpu_class(classes[nvidia.GPU_CLASS])
    assert not whole_gpu_class(classes[nvidia.MIG_CLASS])

    def claim(klass: str, count: int) -> Any:
        return parse_resource_claim({"metadata": {"name": "c", "namespace": "x"}, "spec": {
            "devices": {"requests": [{"name": "r", "exactly": {
                "deviceClassName": klass, "count": count}}]}}})

    assert whole_gpu_demand([claim(nvidia.GPU_CLASS, 8), claim(nvidia.MIG_CLASS, 1)],
                            classes) == 8
    assert whole_gpu_demand([claim("unknown", 4)], classes) == 0


def test_device_states_count_overlaps_as_unavailable() -> None:
    inv = node_inventory("n", slices([nvidia.GpuSpec(0, H100)]),
                         {"gpu.nvidia.com/n/gpu-0-mig-4g40gb-5-0"})
    assert inv is not None
    states = device_states(inv, {"gpu.nvidia.com/n/gpu-0-mig-4g40gb-5-0"})
    assert states[(H100, "4g.40gb", "used")] == 1
    assert states[(H100, "gpu", "unavailable")] == 1
    assert states[(H100, "3g.40gb", "free")] == 1  # at start 4, beside the 4g.40gb
    assert states[(H100, "3g.40gb", "unavailable")] == 1  # at start 0, under it
