"""What the extender takes from a node agent's inventory annotation: one check decides
for the GPU detail (node_info) and for pod peaks, shares and used memory
(observation_of, in build_snapshot and the live cache), the inventory must be the
node's own, and a pod's peak comes from the node it runs on."""

from __future__ import annotations

import json
from typing import Any

from test_kube_objects import k8s_node, k8s_pod

from kube.cache import ClusterCache
from kube.objects import NO_OBSERVATION, node_info, observation_of
from kube.snapshot import build_snapshot

LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "1",
          "nvidia.com/gpu.replicas": "4"}
ALLOC = {"nvidia.com/gpu.shared": "4"}


def inventory(node: str, mem: int = 81559, peak: int = 1000, pod: str = "ml/s") -> str:
    return json.dumps({"v": 1, "node": node, "ts": 1_700_000_000, "gpus": [
        {"i": 0, "uuid": "GPU-1", "model": "NVIDIA-H100-80GB-HBM3", "mem": mem, "used": 0,
         "mode": "shared", "pods": [{"pod": pod, "used": 0, "peak": peak}]}]})


def node(name: str, text: str) -> dict[str, Any]:
    n = k8s_node(name, LABELS, ALLOC)
    n["metadata"]["annotations"] = {"gpupack.io/inventory": text}
    return n


def shared_pod(on: str) -> dict[str, Any]:
    return k8s_pod("s", {"nvidia.com/gpu.shared": 1}, {"gpupack.io/gpu-memory": "8Gi"},
                   node=on)


def test_an_inventory_refused_for_its_gpus_gives_no_peaks_either() -> None:
    # An H100 reported with 900,000 MiB: node_info falls back to inferred detail, and
    # the same text sized the pod on it at 880,000 MiB all the same.
    text = inventory("a", mem=900_000, peak=800_000)
    notes: list[str] = []
    assert node_info(node("a", text), notes).gpus[0].inferred
    assert any("inferred instead" in n for n in notes)
    assert observation_of(text, "a") == NO_OBSERVATION
    req = build_snapshot([node("a", text)], [shared_pod("a")]).snapshot.running[0][0]
    assert req.gpu_memory_mib == 8192
    cache = ClusterCache("gpupack")
    cache.replace([node("a", text)], [shared_pod("a")])
    assert cache.observation("a") == NO_OBSERVATION


def test_an_inventory_written_for_another_node_is_refused_and_named() -> None:
    notes: list[str] = []
    info = node_info(node("b", inventory("a")), notes)
    assert info.gpus[0].inferred
    assert any("'a' wrote it, not 'b'" in n for n in notes), notes
    assert observation_of(inventory("a"), "b") == NO_OBSERVATION
    assert observation_of(inventory("b"), "b").peaks == {"ml/s": 1000}


def test_a_pods_peak_comes_from_the_node_it_runs_on() -> None:
    # Node b's inventory names ml/s (another pod of that name, or a stale entry) with
    # a 40 GB peak; ml/s runs on node a, which has not seen it yet.
    a = node("a", inventory("a", peak=0, pod="ml/other"))
    b = node("b", inventory("b", peak=40_000))
    req = build_snapshot([a, b], [shared_pod("a")]).snapshot.running[0][0]
    assert req.gpu_memory_mib == 8192
    req = build_snapshot([a, b], [shared_pod("b")]).snapshot.running[0][0]
    assert req.gpu_memory_mib > 40_000  # its own node's peak (plus headroom)
