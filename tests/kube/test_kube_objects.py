"""Node and Pod objects to packing types: inference and errors that name the field."""

from __future__ import annotations

from typing import Any

import pytest

from kube.files import load_objects
from kube.node_objects import node_info
from kube.objects import ObjectError, pod_request
from kube.snapshot import build_snapshot
from packing.model import GpuMode, RequestKind


def k8s_node(name: str, labels: dict[str, str], alloc: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", **alloc}},
    }


def k8s_pod(
    name: str,
    limits: dict[str, Any],
    ann: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if node:
        spec["nodeName"] = node
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "annotations": ann or {},
            "labels": labels or {},
        },
        "spec": spec,
    }


H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}


def test_mixed_mig_node_infers_layouts_and_whole_gpus() -> None:
    n = node_info(
        k8s_node(
            "a",
            H100,
            {"nvidia.com/gpu": "4", "nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-3g.40gb": "2"},
        )
    )
    modes = [g.mode for g in n.gpus]
    assert modes.count(GpuMode.WHOLE) == 4 and modes.count(GpuMode.MIG) == 4
    mig_gpus = [g for g in n.gpus if g.mode is GpuMode.MIG]
    instances = [i.profile for g in mig_gpus for i in g.mig]
    assert instances.count("1g.10gb") == 14 and instances.count("3g.40gb") == 2
    assert all(g.inferred for g in n.gpus)


def test_time_sliced_node() -> None:
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-L40S",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    }
    n = node_info(k8s_node("s", labels, {"nvidia.com/gpu.shared": "16"}))
    assert [g.mode for g in n.gpus] == [GpuMode.SHARED] * 4
    assert n.gpus[0].replicas == 4 and n.gpus[0].model == "L40S"


def test_cpu_node_has_no_gpus() -> None:
    assert node_info(k8s_node("c", {}, {})).gpus == ()


@pytest.mark.parametrize(
    ("obj", "needle"),
    [
        (k8s_node("a", H100, {"cpu": "lots"}), "Node a: status.allocatable.cpu: 'lots'"),
        (k8s_node("a", {**H100, "nvidia.com/gpu.count": "x"}, {}), "nvidia.com/gpu.count"),
        (
            k8s_node(
                "a", {"nvidia.com/gpu.product": "NVIDIA-L40S"}, {"nvidia.com/mig-1g.10gb": "1"}
            ),
            "has no MIG",
        ),
        ({"kind": "Node", "metadata": {}}, "metadata.name"),
    ],
)
def test_bad_nodes_name_the_field(obj: dict[str, Any], needle: str) -> None:
    with pytest.raises(ObjectError, match=None) as e:
        node_info(obj)
    assert needle in str(e.value)


@pytest.mark.parametrize(
    ("pod", "kind", "extra"),
    [
        (
            k8s_pod("w", {"nvidia.com/gpu": "2", "cpu": "4"}),
            RequestKind.WHOLE,
            {"gpu_count": 2, "cpu_milli": 4000},
        ),
        (k8s_pod("m", {"nvidia.com/mig-1g.10gb": 1}), RequestKind.MIG, {"mig_profile": "1g.10gb"}),
        (
            k8s_pod(
                "s",
                {"nvidia.com/gpu.shared": 1},
                {"gpupack.io/gpu-memory": "8Gi", "gpupack.io/gpu-compute": "0.25"},
            ),
            RequestKind.SHARED,
            {"gpu_memory_mib": 8192, "gpu_milli": 250},
        ),
        (
            k8s_pod("c", {"cpu": "500m", "memory": "1Gi"}),
            RequestKind.NONE,
            {"cpu_milli": 500, "memory_mib": 1024},
        ),
    ],
)
def test_pod_requests(pod: dict[str, Any], kind: RequestKind, extra: dict[str, Any]) -> None:
    r = pod_request(pod)
    assert r.kind is kind
    for k, v in extra.items():
        assert getattr(r, k) == v


def test_lws_group_from_labels() -> None:
    p = k8s_pod(
        "llm-0",
        {"nvidia.com/gpu": 8},
        ann={
            "leaderworkerset.sigs.k8s.io/size": "2",
            "leaderworkerset.sigs.k8s.io/exclusive-topology": "nvidia.com/gpu.clique",
        },
        labels={
            "leaderworkerset.sigs.k8s.io/name": "llm",
            "leaderworkerset.sigs.k8s.io/group-index": "0",
            "leaderworkerset.sigs.k8s.io/worker-index": "0",
        },
    )
    g = pod_request(p).group
    assert g is not None and g.key == "ml/llm/0" and g.size == 2 and g.exclusive


@pytest.mark.parametrize(
    ("pod", "needle"),
    [
        (
            k8s_pod("a", {"cpu": "lots"}),
            "Pod ml/a: spec.containers[0].resources.limits.cpu: 'lots'",
        ),
        (
            k8s_pod("a", {"nvidia.com/gpu.shared": 1}, {"gpupack.io/gpu-memory": "much"}),
            "metadata.annotations.gpupack.io/gpu-memory",
        ),
        (
            k8s_pod("a", {"nvidia.com/gpu.shared": 1}, {"gpupack.io/gpu-compute": "3"}),
            "gpu-compute",
        ),
        (k8s_pod("a", {"nvidia.com/gpu": "1.5"}), "whole number"),
        (k8s_pod("a", {"nvidia.com/mig-9g.1tb": 1}), "no known GPU"),
        # Found by fuzzing the extender: each of these used to answer 500, hang for
        # seconds under the cache lock, or be read with another meaning.
        (k8s_pod("a", {"cpu": "1e1000000"}), "limits.cpu: '1e1000000' is out of range"),
        (k8s_pod("a", {"memory": "1e999999Ki"}), "is out of range"),
        (k8s_pod("a", {"cpu": "9" * 5000}), "is out of range"),
        (k8s_pod("a", {"nvidia.com/gpu": "1"}, {"gpupack.io/gpu-memory": "1e999999"}),
         "gpupack.io/gpu-memory: '1e999999' is out of range"),
        (k8s_pod("a", {"cpu": -1000}), "limits.cpu: -1000 is negative"),
        (k8s_pod("a", {"nvidia.com/gpu": -1}), "is negative"),
        (k8s_pod("a", {"nvidia.com/mig-3g.40gb": "7"}), "exactly one MIG slice per pod"),
        (k8s_pod("a", {"nvidia.com/mig-1g.10gb": "0.5"}), "exactly one MIG slice"),
        (k8s_pod("a", {"nvidia.com/gpu.shared": "3"}), "exactly one GPU share per pod"),
        (k8s_pod("a", {"nvidia.com/gpu": "1"}, {"gpupack.io/group": "g",
                                                "gpupack.io/group-size": "\u00b2"}),
         "group-size: '\u00b2' is not a group size"),
        (k8s_pod("a", {"nvidia.com/gpu": "1"}, {"gpupack.io/group": "g",
                                                "gpupack.io/group-size": "300000"}),
         "300000 pods is more than gpupack places as one group (at most 1024)"),
        (k8s_pod("a", {}, {"leaderworkerset.sigs.k8s.io/size": "2"},
                 {"leaderworkerset.sigs.k8s.io/name": "l",
                  "leaderworkerset.sigs.k8s.io/worker-index": "\u00b9"}),
         "worker-index: '\u00b9' is not an index below the group size 2"),
        (k8s_pod("a", {}, {"leaderworkerset.sigs.k8s.io/size": "2"},
                 {"leaderworkerset.sigs.k8s.io/name": "l",
                  "leaderworkerset.sigs.k8s.io/worker-index": "2"}),
         "not an index below the group size 2"),
        ({"metadata": {"name": "a"}, "spec": {"containers": {}}}, "spec.containers: expected"),
        ({"metadata": {"name": "a"}, "spec": {"containers": 0}}, "spec.containers: expected"),
        ({"metadata": {"name": "a"}, "spec": {"containers": [{"resources": {"limits": 0}}]}},
         "resources.limits: expected an object"),
        ({"metadata": {"name": "a"}, "spec": {"priority": True}}, "spec.priority"),
        ({"metadata": {"name": "a"}, "spec": {"priority": ""}}, "spec.priority"),
        ({"metadata": {"name": "a"}, "spec": {"priority": 2**31}},
         "spec.priority: 2147483648 is outside a 32-bit integer"),
        ({"metadata": {"name": "a"}, "spec": {"priority": -(2**31) - 1}},
         "spec.priority: -2147483649 is outside"),
        ({"metadata": {"name": "a", "namespace": [1]}, "spec": {}}, "metadata.namespace"),
    ],
)
def test_bad_pods_name_the_field(pod: dict[str, Any], needle: str) -> None:
    with pytest.raises(ObjectError) as e:
        pod_request(pod)
    assert needle in str(e.value)


def test_snapshot_running_and_pending_with_recorded_placement() -> None:
    nodes = [k8s_node("a", H100, {"nvidia.com/gpu": "8"})]
    running = k8s_pod("r", {"nvidia.com/gpu": 2}, {"gpupack.io/gpus": "3,4"}, node="a")
    inferred = k8s_pod("i", {"nvidia.com/gpu": 1}, node="a")
    built = build_snapshot(nodes, [running, inferred, k8s_pod("p", {"nvidia.com/gpu": 1})])
    placements = {pod.key: pl for pod, pl in built.snapshot.running}
    assert placements["ml/r"].gpus == (3, 4)
    assert placements["ml/i"].gpus == (0,)
    assert any("inferred" in n for n in built.notes)
    assert [p.key for p in built.snapshot.pending] == ["ml/p"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a: [", "not valid YAML"),
        ("kind: Pod\nmetadata: {name: x}", "expected Node"),
        ("- 1\n- 2", "expected an object"),
        ("kind: NodeList\nitems: 3", "items: expected a list"),
    ],
)
def test_load_objects_errors(text: str, needle: str) -> None:
    with pytest.raises(ObjectError) as e:
        load_objects(text, "f.yaml", "Node")
    assert needle in str(e.value) and "f.yaml" in str(e.value)


def test_load_objects_forms() -> None:
    one = "kind: Node\nmetadata: {name: a}\n---\nkind: Node\nmetadata: {name: b}\n"
    lst = "kind: List\nitems:\n- {kind: Node, metadata: {name: a}}\n"
    nl = "kind: NodeList\nitems:\n- {metadata: {name: a}}\n"
    assert len(load_objects(one, "x", "Node")) == 2
    assert len(load_objects(lst, "x", "Node")) == 1
    assert len(load_objects(nl, "x", "Node")) == 1


def _inventory(node: str) -> str:
    from packing.inventory import GpuInventory, Inventory, PodGpuUsage, encode_inventory
    from packing.model import MigInstance

    return encode_inventory(
        Inventory(
            node,
            1700000000,
            (
                GpuInventory(
                    0,
                    "GPU-a",
                    "NVIDIA-H100-80GB-HBM3",
                    81559,
                    12000,
                    GpuMode.MIG,
                    (MigInstance("3g.40gb", 4, "ml/m"), MigInstance("1g.10gb", 0, None)),
                ),
                GpuInventory(
                    1,
                    "GPU-b",
                    "NVIDIA-H100-80GB-HBM3",
                    81559,
                    30000,
                    GpuMode.SHARED,
                    pods=(PodGpuUsage("ml/s", 20000, 24000),),
                ),
            ),
        )
    )


def test_inventory_annotation_replaces_inferred_detail_and_peaks_count() -> None:
    labels = {**H100, "nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "4"}
    n = k8s_node(
        "a",
        labels,
        {
            "nvidia.com/mig-3g.40gb": "1",
            "nvidia.com/mig-1g.10gb": "1",
            "nvidia.com/gpu.shared": "4",
        },
    )
    n["metadata"]["annotations"] = {"gpupack.io/inventory": _inventory("a")}
    info = node_info(n)
    assert [g.mode for g in info.gpus] == [GpuMode.MIG, GpuMode.SHARED]
    assert not any(g.inferred for g in info.gpus) and info.gpus[1].replicas == 4
    mig_pod = k8s_pod("m", {"nvidia.com/mig-3g.40gb": 1}, node="a")
    shared_pod = k8s_pod(
        "s", {"nvidia.com/gpu.shared": 1}, {"gpupack.io/gpu-memory": "8Gi"}, node="a"
    )
    built = build_snapshot([n], [mig_pod, shared_pod])
    running = {p.key: (p, pl) for p, pl in built.snapshot.running}
    assert running["ml/m"][1].mig_start == 4  # the instance the agent saw it own
    assert running["ml/s"][0].gpu_memory_mib == 26400  # observed peak 24000 + 10%


def test_bad_inventory_is_noted_and_inferred_detail_used() -> None:
    n = k8s_node("a", H100, {"nvidia.com/gpu": "8"})
    n["metadata"]["annotations"] = {"gpupack.io/inventory": "{not json"}
    notes: list[str] = []
    info = node_info(n, notes)
    assert all(g.inferred for g in info.gpus)
    assert notes and "gpupack.io/inventory" in notes[0]


@pytest.mark.parametrize(
    ("limits", "ann", "kind"),
    [
        ({"nvidia.com/mig-3g.40gb": "2"}, {}, RequestKind.MIG),
        ({"nvidia.com/gpu.shared": "3"}, {}, RequestKind.SHARED),
        ({"nvidia.com/gpu": "1"}, {"gpupack.io/group": "g", "gpupack.io/group-size": "5000"},
         RequestKind.WHOLE),
    ],
)
def test_a_bound_pod_is_read_leniently_so_its_resources_still_count(
    limits: dict[str, Any], ann: dict[str, str], kind: RequestKind
) -> None:
    # What gpupack refuses to place (strict) is still counted once bound by someone else.
    pod = k8s_pod("a", {"cpu": "2", **limits}, ann, node="n1")
    with pytest.raises(ObjectError):
        pod_request(pod)
    req = pod_request(pod, strict=False)
    assert req.kind is kind and req.cpu_milli == 2000 and req.group is None


def test_a_deeply_nested_inventory_annotation_falls_back_to_inference() -> None:
    from packing.inventory import InventoryError, decode_inventory

    with pytest.raises(InventoryError):
        decode_inventory("[" * 5000)
    labels = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    n = k8s_node("n", labels, {"nvidia.com/gpu": "2"})
    n["metadata"]["annotations"] = {"gpupack.io/inventory": "[" * 5000}
    notes: list[str] = []
    info = node_info(n, notes=notes)
    assert len(info.gpus) == 2 and "inferred instead" in notes[0]


def test_node_taints_are_read_into_the_node_info() -> None:
    from kube.node_objects import UNREADABLE_TAINTS
    from packing.model import Taint

    n = k8s_node("g0", {}, {"cpu": "8", "memory": "16Gi"})
    n["spec"] = {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"},
                            {"key": "soft", "effect": "PreferNoSchedule"}]}
    assert node_info(n).taints == (Taint("gpu", "yes", "NoSchedule"),
                                   Taint("soft", "", "PreferNoSchedule"))
    assert node_info(k8s_node("g1", {}, {"cpu": "8"})).taints == ()
    # Unreadable taints: the node stays, tainted for every pod, and a note names the field.
    n["spec"] = {"taints": [{"key": "gpu"}]}
    notes: list[str] = []
    assert node_info(n, notes).taints == (UNREADABLE_TAINTS,)
    assert any("spec.taints[0]" in x for x in notes), notes
