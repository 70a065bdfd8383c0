"""Builders of Node and Pod objects as the API server sends them (plain dicts)."""

from __future__ import annotations

from typing import Any

from builders_nodes import H100, gpu_node
from builders_nodes import L40S as L40S  # re-exported: tests name the product


def node(
    name: str,
    product: str = H100,
    gpus: int = 8,
    whole: int | None = None,
    mig: dict[str, int] | None = None,
    shared_replicas: int = 0,
    cpu: str = "64",
    memory: str = "512Gi",
    labels: dict[str, str] | None = None,
    reconfigurable: bool = True,
    unschedulable: bool = False,
) -> dict[str, Any]:
    """A GFD-labelled GPU node (:func:`builders_nodes.gpu_node`). Default: ``gpus`` whole
    GPUs; with ``mig``, ``whole`` whole ones beside the slices."""
    # Opted in (the cache is made with the MIG actuator on) or frozen: the two cases
    # these tests need; tests/scheduler/test_scheduler_mig_reconfigure.py has the others.
    return gpu_node(
        name, product, gpus=gpus, whole=gpus if whole is None and not mig else (whole or 0),
        mig=mig, replicas=shared_replicas, cpu=cpu, memory=memory, max_pods="110",
        reconfigure=reconfigurable, hostname=True, resource_version="1",
        unschedulable=unschedulable, labels=labels)


def pod(
    name: str,
    resources: dict[str, str] | None = None,
    namespace: str = "default",
    uid: str | None = None,
    node: str | None = None,
    scheduler: str = "gpupack",
    cpu: str = "1",
    memory: str = "1Gi",
    annotations: dict[str, str] | None = None,
    priority: int | None = None,
    phase: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{
            "name": "main", "image": "registry.example/app:1",
            "resources": {"requests": {"cpu": cpu, "memory": memory},
                          "limits": dict(resources or {})},
        }],
    }
    if node:
        spec["nodeName"] = node
    if priority is not None:
        spec["priority"] = priority
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "uid": uid or f"uid-{namespace}-{name}"}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": phase or ("Running" if node else "Pending")}}


def mig_pod(name: str, profile: str = "1g.10gb", **kw: Any) -> dict[str, Any]:
    return pod(name, {f"nvidia.com/mig-{profile}": "1"}, **kw)


def whole_pod(name: str, count: int = 1, **kw: Any) -> dict[str, Any]:
    return pod(name, {"nvidia.com/gpu": str(count)}, **kw)


def shared_pod(name: str, memory: str = "8Gi", compute: str = "0.25", **kw: Any) -> dict[str, Any]:
    ann = {"gpupack.io/gpu-memory": memory, "gpupack.io/gpu-compute": compute,
           **(kw.pop("annotations", None) or {})}
    return pod(name, {"nvidia.com/gpu.shared": "1"}, annotations=ann, **kw)


def filter_args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": p, "Nodes": None, "NodeNames": names}


class FakeClock:
    """A clock the test moves by hand (assume TTLs, plan age)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_cache(nodes: list[dict[str, Any]], pods: list[dict[str, Any]] | None = None,
               clock: FakeClock | None = None) -> Any:
    """A synced cache of these objects (``clock`` is accepted for the callers that move
    time for other parts; the cache itself keeps no time)."""
    from kube.cache import ClusterCache

    del clock
    cache = ClusterCache("gpupack", mig_actuator=True)
    cache.replace(nodes, pods or [])
    cache.mark_synced()
    return cache
