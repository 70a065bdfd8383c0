"""Nodes and pods from the API that are wrong in ways the API server lets through (or a
hostile or buggy client could write): counts that would build millions of GPUs, label
integers Python's int() is too lenient for, MIG detail that breaks the model's geometry,
time-sliced MIG resources, malformed metadata, recorded placements that disagree with
the request. Each is refused with the field named, or read as the device plugin meant."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kube.node_objects import node_info
from kube.objects import ObjectError, bound_node, object_name, pod_key
from kube.snapshot import build_snapshot
from packing.inventory import GpuInventory, Inventory, encode_inventory
from packing.model import MAX_NODE_GPUS, GpuMode, MigInstance, RequestKind

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
T4 = {"nvidia.com/gpu.product": "Tesla-T4"}


def k8s_node(labels: dict[str, str], alloc: dict[str, Any],
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": "n", "labels": labels, "annotations": annotations or {}},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", **alloc}},
    }


@pytest.mark.parametrize(
    ("labels", "alloc", "needle"),
    [
        (H100, {"nvidia.com/gpu": "1000000"}, "allocatable.nvidia.com/gpu: 1000000 is more"),
        ({**H100, "nvidia.com/gpu.count": "100000"}, {}, "gpu.count: 100000 is more"),
        ({**H100, "nvidia.com/gpu.replicas": "2"}, {"nvidia.com/gpu.shared": "100000"},
         "gpu.shared / replicas: 50000 is more"),
        (H100, {"nvidia.com/mig-1g.10gb": "100000"}, "MIG instances: 100000 is more"),
        ({**H100, "nvidia.com/gpu.count": "8_0"}, {}, "gpu.count: '8_0' is not"),
        ({**H100, "nvidia.com/gpu.count": " 8"}, {}, "gpu.count: ' 8' is not"),
        ({**H100, "nvidia.com/gpu.replicas": "-2"}, {}, "gpu.replicas: '-2' is not"),
        ({**H100, "nvidia.com/gpu.memory": "٨٠"}, {}, "gpu.memory: '٨٠' is not"),
    ],
)
def test_counts_past_any_real_node_are_refused_naming_the_field(
    labels: dict[str, str], alloc: dict[str, Any], needle: str
) -> None:
    start = time.perf_counter()
    with pytest.raises(ObjectError, match="Node n: ") as e:
        node_info(k8s_node(labels, alloc))
    assert needle in str(e.value)
    assert time.perf_counter() - start < 1.0  # refused before any work is done


def test_the_largest_real_shapes_still_read() -> None:
    info = node_info(k8s_node({**H100, "nvidia.com/gpu.count": "16"}, {"nvidia.com/gpu": "16"}))
    assert len(info.gpus) == 16
    info = node_info(k8s_node(H100, {"nvidia.com/mig-1g.10gb": str(7 * MAX_NODE_GPUS)}))
    assert len(info.gpus) == MAX_NODE_GPUS
    assert all(len(g.mig) == 7 for g in info.gpus)


@pytest.mark.parametrize("resource", ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.10gb.shared"])
def test_time_sliced_mig_resources_count_instances_not_replicas(resource: str) -> None:
    # GFD labels the replicas under the configured name, renamed (".shared") or not.
    labels = {**H100, "nvidia.com/gpu.count": "1", "nvidia.com/mig-1g.10gb.replicas": "4"}
    info = node_info(k8s_node(labels, {resource: "28"}))
    assert len(info.gpus) == 1
    assert [i.profile for i in info.gpus[0].mig] == ["1g.10gb"] * 7


def _inv(model: str, memory: int, mode: GpuMode, mig: tuple[MigInstance, ...]) -> str:
    gpu = GpuInventory(0, "GPU-a", model, memory, 0, mode, mig)
    return encode_inventory(Inventory("n", 1700000000, (gpu,)))


@pytest.mark.parametrize(
    ("labels", "inventory", "needle"),
    [
        (T4, _inv("Tesla-T4", 15360, GpuMode.MIG, ()), "T4 has no MIG"),
        (H100, _inv("NVIDIA-H100-80GB-HBM3", 81559, GpuMode.MIG,
                    (MigInstance("3g.40gb", 2),)), "start 2 not allowed"),
        (H100, _inv("NVIDIA-H100-80GB-HBM3", 81559, GpuMode.MIG,
                    (MigInstance("4g.40gb", 0), MigInstance("3g.40gb", 0))), "overlap"),
    ],
)
def test_inventory_mig_detail_is_checked_against_the_geometry(
    labels: dict[str, str], inventory: str, needle: str
) -> None:
    notes: list[str] = []
    info = node_info(k8s_node(labels, {"nvidia.com/gpu": "1"},
                              {"gpupack.io/inventory": inventory}), notes)
    assert all(g.inferred and g.mode is GpuMode.WHOLE for g in info.gpus)
    assert len(notes) == 1 and needle in notes[0] and "inferred instead" in notes[0]


@pytest.mark.parametrize(
    "obj",
    [
        {"metadata": ["a", "list"]},
        {"metadata": "x"},
        [],
        "a string",
        {"metadata": {"name": 7}},
        {},
    ],
)
def test_malformed_metadata_never_raises_from_the_name_helpers(obj: Any) -> None:
    assert isinstance(pod_key(obj), str)
    assert object_name(obj) is None
    if isinstance(obj, dict) and not isinstance(obj.get("metadata"), dict | type(None)):
        with pytest.raises(ObjectError, match="metadata"):
            node_info(obj)


def test_a_node_name_that_is_not_a_string_is_refused() -> None:
    assert bound_node({"spec": {"nodeName": "a"}}) == "a"
    assert bound_node({"spec": {"nodeName": ""}}) is None
    assert bound_node({"spec": {}}) is None
    with pytest.raises(ObjectError, match=r"spec.nodeName: 5 is not a string"):
        bound_node({"metadata": {"name": "p"}, "spec": {"nodeName": 5}})


def _pod(name: str, limits: dict[str, str], ann: dict[str, str]) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "annotations": ann},
        "spec": {"nodeName": "n",
                 "containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


def test_static_snapshot_refits_recorded_placements_that_disagree_with_the_request() -> None:
    node = k8s_node({**H100, "nvidia.com/gpu.count": "1"}, {"nvidia.com/mig-3g.40gb": "2"})
    pods = [
        # A MIG pod recorded with a GPU and no slice, and one at a start 3g cannot use.
        _pod("a", {"nvidia.com/mig-3g.40gb": "1"}, {"gpupack.io/gpus": "0"}),
        _pod("b", {"nvidia.com/mig-3g.40gb": "1"},
             {"gpupack.io/gpus": "0", "gpupack.io/mig": "3g.40gb@2"}),
        # A third 3g pod where there are two 3g slices: CPU and memory only.
        _pod("c", {"nvidia.com/mig-3g.40gb": "1", "cpu": "2"}, {}),
    ]
    built = build_snapshot([node], pods)
    running = {req.key: (req, p) for req, p in built.snapshot.running}
    assert sorted(running) == ["ml/a", "ml/b", "ml/c"]
    assert {running[k][1].mig_start for k in ("ml/a", "ml/b")} == {0, 4}
    req, p = running["ml/c"]
    assert req.kind is RequestKind.MIG and p.gpus == ()
    text = "\n".join(built.notes)
    assert "recorded placement" in text and "ignored" in text
    assert "counted without GPUs" in text
