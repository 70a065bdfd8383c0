"""What the extender takes from a node agent's inventory annotation: one check decides
for the GPU detail (node_info) and for pod peaks, shares and used memory
(observation_of, in build_snapshot and the live cache), the inventory must be the
node's own, and a pod's peak comes from the node it runs on."""

from __future__ import annotations

import json
from typing import Any

from test_kube_objects import k8s_node, k8s_pod

from kube.cache import ClusterCache
from kube.node_objects import NO_OBSERVATION, node_info, observation_of
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


def two_gpu_inventory(node: str, second_layout_start: int) -> str:
    """GPU 0 a time-sliced H100 whose pod peaked at 1,000 MiB; GPU 1 a MIG H100 with a
    3g.40gb instance at ``second_layout_start`` (0 and 4 are allowed, 2 is not) whose pod
    peaked at 9,000 MiB."""
    return json.dumps({"v": 1, "node": node, "ts": 1_700_000_000, "gpus": [
        {"i": 0, "uuid": "GPU-1", "model": "NVIDIA-H100-80GB-HBM3", "mem": 81559, "used": 0,
         "mode": "shared", "pods": [{"pod": "ml/s", "used": 0, "peak": 1000}]},
        {"i": 1, "uuid": "GPU-2", "model": "NVIDIA-H100-80GB-HBM3", "mem": 81559, "used": 0,
         "mode": "mig", "mig": [{"p": "3g.40gb", "s": second_layout_start, "pod": "ml/m"}],
         "pods": [{"pod": "ml/m", "used": 0, "peak": 9000}]}]})


def test_one_gpu_breaking_the_catalog_leaves_out_that_gpu_only() -> None:
    # A re-partition caught midway, a driver bug: GPU 1's layout is not one the H100
    # allows. The node was inferred whole (every GPU's mode, layout and owner guessed,
    # every peak lost); now GPU 1 is left out, as a GPU the agent did not see, and GPU 0
    # stands as observed.
    labels = {**LABELS, "nvidia.com/gpu.count": "2"}
    n = k8s_node("a", labels, ALLOC)
    n["metadata"]["annotations"] = {"gpupack.io/inventory": two_gpu_inventory("a", 2)}
    notes: list[str] = []
    info = node_info(n, notes)
    assert [(g.index, g.inferred) for g in info.gpus] == [(0, False)]
    assert len(notes) == 1 and "GPU 1 left out" in notes[0] and "start 2" in notes[0], notes
    obs = observation_of(two_gpu_inventory("a", 2), "a")
    assert obs.peaks == {"ml/s": 1000}  # GPU 1's pod is not taken from it either
    good = node_info({**n, "metadata": {**n["metadata"], "annotations": {
        "gpupack.io/inventory": two_gpu_inventory("a", 4)}}}, notes := [])
    assert [(g.index, g.inferred) for g in good.gpus] == [(0, False), (1, False)]
    assert notes == [] and observation_of(two_gpu_inventory("a", 4), "a").peaks == {
        "ml/s": 1000, "ml/m": 9000}
