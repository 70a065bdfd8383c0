"""The one builder of GPU Node objects as the API server sends them (plain dicts), for
every test directory: GPU Feature Discovery labels, the device plugin's allocatable
resources, optionally gpupack's own labels. The directories' builders
(``tests/scheduler/sched_builders.py``, ``tests/webhook/webhook_builders.py``) give it
their defaults. ``tests/`` is on the import path through ``tests/conftest.py``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Short model names (packing.catalog) -> the product label GFD writes.
PRODUCTS = {
    "H100-80GB": "NVIDIA-H100-80GB-HBM3",
    "A100-40GB": "NVIDIA-A100-SXM4-40GB",
    "A100-80GB": "NVIDIA-A100-SXM4-80GB",
    "L40S": "NVIDIA-L40S",
    "L4": "NVIDIA-L4",
    "H200-141GB": "NVIDIA-H200",
    "A30-24GB": "NVIDIA-A30",
}
H100 = PRODUCTS["H100-80GB"]
L40S = PRODUCTS["L40S"]


def gpu_node(
    name: str,
    product: str,
    *,
    gpus: int = 8,
    whole: int = 0,
    mig: Mapping[str, int] | None = None,
    replicas: int = 0,
    sharing: str = "time-slicing",
    cpu: str = "64",
    memory: str = "512Gi",
    max_pods: str | None = None,
    gpu_memory_mib: int | None = None,
    mig_strategy: str | None = None,
    reconfigure: bool | None = None,
    hostname: bool = False,
    resource_version: str | None = None,
    unschedulable: bool = False,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A node with ``gpus`` GPUs of ``product`` (``nvidia.com/gpu.product``).

    Allocatable: with ``replicas``, ``gpus * replicas`` shares of ``nvidia.com/gpu.shared``
    (time-slicing, or the device plugin's MPS renamed, ``sharing="mps"``); else ``whole``
    ``nvidia.com/gpu`` and each ``mig`` profile's ``nvidia.com/mig-<profile>`` (a ``+``
    in a profile name is written ``.``, as the device plugin does). Labels, in order:
    ``kubernetes.io/hostname`` (``hostname``), product, ``nvidia.com/gpu.memory``
    (``gpu_memory_mib``), count, the sharing labels, ``nvidia.com/mig.strategy``,
    ``gpupack.io/mig-reconfigure`` (``reconfigure`` true/false; None: no label), then
    ``labels``, which win over all of them."""
    lab: dict[str, str] = {}
    if hostname:
        lab["kubernetes.io/hostname"] = name
    lab["nvidia.com/gpu.product"] = product
    if gpu_memory_mib is not None:
        lab["nvidia.com/gpu.memory"] = str(gpu_memory_mib)
    lab["nvidia.com/gpu.count"] = str(gpus)
    alloc: dict[str, str] = {"cpu": cpu, "memory": memory}
    if max_pods is not None:
        alloc["pods"] = max_pods
    if replicas:
        lab["nvidia.com/gpu.replicas"] = str(replicas)
        lab["nvidia.com/gpu.sharing-strategy"] = sharing
        if sharing == "mps":
            lab["nvidia.com/mps.capable"] = "true"
        alloc["nvidia.com/gpu.shared"] = str(gpus * replicas)
    else:
        if whole:
            alloc["nvidia.com/gpu"] = str(whole)
        for profile, n in (mig or {}).items():
            alloc["nvidia.com/mig-" + profile.replace("+", ".")] = str(n)
    if mig_strategy is not None:
        lab["nvidia.com/mig.strategy"] = mig_strategy
    if reconfigure is not None:
        lab["gpupack.io/mig-reconfigure"] = "true" if reconfigure else "false"
    lab.update(labels or {})
    meta: dict[str, Any] = {"name": name, "labels": lab}
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": meta,
                           "status": {"allocatable": alloc}}
    if unschedulable:
        obj["spec"] = {"unschedulable": True}
    return obj
