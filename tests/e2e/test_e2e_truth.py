"""Truth over records on the real control plane (issue 18).

- GPU memory comes from the node: an L40S that GFD labels 46,068 MiB takes two 16Gi
  shares, not three (the catalog's 49,152 MiB would take three); when the label says
  49,152 the third binds.
- The node agent's observation wins: the fake kubelet (tests/e2e/agent_double.py) says a
  pod holds another MIG slice than the one gpupack recorded on it; the extender counts
  the pod on the observed slice and its disagreement counter moves. A share the agent
  sees using more memory than it declared is booked at its observed peak plus 10%.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import (
    MANUAL_SCHEDULER,
    SHARED,
    bind_with_records,
    bound,
    create_nodes,
    l40s_shared,
    pod,
    pods_in,
    wait_for,
    wait_for_webhook,
)
from conftest import Space
from controlplane import (
    AGENT_NODE,
    SCHEDULER_NAME,
    Stack,
    extender_metrics,
    metric_sample,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "nodeagent"))
from fake_nvml import L40S_UUID, MIG_1G_B

GIB = 1024


def _shares(pool: str, n: int) -> list[dict[str, Any]]:
    return [pod(f"s-{i}", pool=pool, scheduler=SCHEDULER_NAME, limits={SHARED: "1"},
                annotations={"gpupack.io/gpu-memory": "16Gi"}) for i in range(n)]


def test_gfd_memory_label_decides_what_fits(space: Space, core: Any) -> None:
    pool = space.name
    node = f"{pool}-l40s"
    space.nodes += create_nodes(core, [l40s_shared(node, pool, gpus=1)])
    ns = space.namespace()
    first, second, third = _shares(pool, 3)
    # Pods only once gpupack's views have the node (kube-scheduler's informer is as
    # quick): a pod refused by a plugin for a node it has not seen yet waits for
    # kube-scheduler's 5-minute flush.
    probe = pod("probe", pool=pool, annotations={"gpupack.io/gpu-memory": "16Gi",
                                                 "gpupack.io/isolation": "shared"})
    wait_for_webhook(core, ns, probe, SHARED)

    def n_bound() -> int:
        return len(bound(pods_in(core, ns)))

    core.create_namespaced_pod(ns, first)
    core.create_namespaced_pod(ns, second)
    wait_for(lambda: n_bound() == 2, 60, "two 16Gi shares bound")
    core.create_namespaced_pod(ns, third)
    time.sleep(5)  # kube-scheduler tries the third meanwhile
    assert n_bound() == 2  # 3 x 16Gi = 49,152 MiB > the 46,068 MiB GFD reports
    core.patch_node(node, {"metadata": {"labels": {"nvidia.com/gpu.memory": "49152"}}})
    wait_for(lambda: n_bound() == 3, 60, "the third share bound once the GPU is 49,152 MiB")


# ---- the agent's observation ----------------------------------------------------------------


@pytest.fixture
def kubelet_pods(stack: Stack) -> Iterator[Path]:
    """The fake kubelet's script (see agent_double.py); emptied again at the end."""
    path = stack.dir / "kubelet" / "pods.json"
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _on_agent_node(core: Any, ns: str, name: str, limits: dict[str, str],
                   record: dict[str, str], memory: str = "4Gi") -> None:
    """A pod bound to the agent's node with the placement gpupack recorded on it (as its
    bind records it: on the Binding, the only way the placement records reach a pod)."""
    p = pod(name, limits=limits, cpu="10m", memory="16Mi", scheduler=MANUAL_SCHEDULER,
            annotations={"gpupack.io/gpu-memory": memory})
    p["spec"]["tolerations"] = [{"operator": "Exists"}]
    core.create_namespaced_pod(ns, p)
    bind_with_records(core, ns, name, AGENT_NODE, record)


def test_agent_observation_wins_over_the_record(stack: Stack, admin: Any, core: Any,
                                                space: Space, scraper: str,
                                                kubelet_pods: Path) -> None:
    ns = space.namespace()
    fams = wait_for(lambda: extender_metrics(stack, admin, scraper), 30,
                    "the extender's /metrics")
    before = metric_sample(fams, "gpupack_device_plugin_disagreements", kind="mig") or 0.0
    # gpupack recorded the slice at start 2; the kubelet gave the pod the one at start 3.
    _on_agent_node(core, ns, "mig-obs", {"nvidia.com/mig-1g.10gb": "1"},
                   {"gpupack.io/gpus": "0", "gpupack.io/mig": "1g.10gb@2"})
    # A 4Gi share on the time-sliced L40S (GPU 1): its GPU's processes are its own.
    _on_agent_node(core, ns, "share-obs", {SHARED: "1"}, {"gpupack.io/gpus": "1"})
    kubelet_pods.write_text(json.dumps([
        [ns, "mig-obs", [["main", [["nvidia.com/mig-1g.10gb", [MIG_1G_B]]]]]],
        [ns, "share-obs", [["main", [[SHARED, [f"{L40S_UUID}::0"]]]]]],
    ]))

    def moved() -> dict[str, Any] | None:
        f = extender_metrics(stack, admin, scraper)
        got = None if f is None else metric_sample(f, "gpupack_device_plugin_disagreements",
                                             kind="mig")
        return f if got is not None and got >= before + 1 else None

    fams = wait_for(moved, 60, "the extender to count the MIG disagreement")
    assert metric_sample(fams, "gpupack_device_plugin_disagreements", kind="mig") == before + 1
    # The share is booked at its observed peak plus 10% (the fake L40S's three processes,
    # 24 GiB, are the one holder's), far above the 4Gi it declared.
    def booked() -> float | None:
        f = extender_metrics(stack, admin, scraper)
        v = None if f is None else metric_sample(f, "gpupack_gpu_memory_booked_mib",
                                           node=AGENT_NODE, gpu="1")
        return v if v is not None and v > 4 * GIB else None

    got = wait_for(booked, 60, "the share booked at its observed peak")
    assert got == -(-24 * GIB * 110 // 100)
    fams = extender_metrics(stack, admin, scraper) or {}
    assert metric_sample(fams, "gpupack_gpu_memory_observed_mib", node=AGENT_NODE,
                         gpu="1") == 25 * GIB
