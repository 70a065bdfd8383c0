"""Builders of DRA objects as the API server sends them (plain dicts), for the cache's and
the extender's tests: Nodes whose GPUs are ResourceSlices (no GPU resource in
allocatable), NVIDIA-shaped slices (:mod:`packing.dra.nvidia`), ResourceClaims (with or
without an allocation), ResourceClaimTemplates, and Pods that reference them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from packing.dra import nvidia

DRIVER = nvidia.DRIVER


def dra_node(name: str, *, cpu: str = "64", memory: str = "512Gi",
             labels: Mapping[str, str] | None = None, product: str | None = None
             ) -> dict[str, Any]:
    """A Node of the NVIDIA DRA driver: no GPU resource in allocatable (GFD may still
    label the product and count: ``product``)."""
    lab = {"kubernetes.io/hostname": name, **(labels or {})}
    if product is not None:
        lab.update({"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": "8"})
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": lab, "resourceVersion": "1"},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                       "capacity": {"cpu": cpu, "memory": memory, "pods": "110"}}}


def h100_slices(node: str, gpus: int = 8, *, layout: nvidia.Layout = nvidia.Layout.SPLIT,
                info: nvidia.DriverInfo | None = None,
                mig: Sequence[tuple[int, tuple[tuple[str, int], ...]]] = ()
                ) -> list[dict[str, Any]]:
    """The slices of ``gpus`` H100s (``mig``: (minor, static MIG devices) for GPUs in
    MIG mode under the static layout)."""
    static = dict(mig)
    specs = [nvidia.GpuSpec(i, "H100-80GB", mig_mode=i in static, static_mig=static.get(i, ()))
             for i in range(gpus)]
    return nvidia.node_slices(node, specs, layout=layout, info=info)


def result(node: str, device: str, request: str = "r", *, share: str | None = None,
           memory: str | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"request": request, "driver": DRIVER, "pool": node, "device": device}
    if share is not None:
        r["shareID"] = share
    if memory is not None:
        r["consumedCapacity"] = {"memory": memory}
    return r


def claim(name: str, *, namespace: str = "default", klass: str = nvidia.GPU_CLASS,
          count: int = 1, results: Sequence[Mapping[str, Any]] | None = None,
          selectors: Sequence[str] = (), reserved_for: Sequence[str] = (),
          owner_pod: str | None = None, extended: bool = False,
          first_available: Sequence[tuple[str, Sequence[str]]] = ()) -> dict[str, Any]:
    """A ResourceClaim with one request ``r`` (``first_available``: its subrequests as
    (class, selectors)); ``results``: its allocation, when allocated."""
    if first_available:
        req: dict[str, Any] = {"name": "r", "firstAvailable": [
            {"name": f"s{i}", "deviceClassName": k,
             "selectors": [{"cel": {"expression": e}} for e in sel]}
            for i, (k, sel) in enumerate(first_available)]}
    else:
        req = {"name": "r", "exactly": {
            "deviceClassName": klass, "count": count,
            "selectors": [{"cel": {"expression": e}} for e in selectors]}}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if owner_pod is not None:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner_pod,
                                    "uid": f"uid-{namespace}-{owner_pod}",
                                    "controller": True}]
    if extended:
        meta["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    obj: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "metadata": meta, "spec": {"devices": {"requests": [req]}}}
    status: dict[str, Any] = {}
    if results is not None:
        status["allocation"] = {"devices": {"results": list(results)}}
    if reserved_for:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{namespace}-{p}"}
                                 for p in reserved_for]
    if status:
        obj["status"] = status
    return obj


def template(name: str, *, namespace: str = "default", klass: str = nvidia.GPU_CLASS,
             count: int = 1, selectors: Sequence[str] = ()) -> dict[str, Any]:
    inner = claim(name, namespace=namespace, klass=klass, count=count, selectors=selectors)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": inner["spec"]}}


def claim_pod(name: str, *, claims: Sequence[str] = (), templates: Sequence[str] = (),
              namespace: str = "default", node: str | None = None, cpu: str = "1",
              memory: str = "1Gi", gpus: int = 0, generated: Mapping[str, str] | None = None,
              scheduler: str = "gpupack", labels: Mapping[str, str] | None = None,
              annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Pod with ``spec.resourceClaims`` naming ``claims`` and ``templates``
    (``generated``: template entry name -> the claim the controller made for it, as
    ``status.resourceClaimStatuses`` says); ``gpus``: ``nvidia.com/gpu`` asked (DRA-backed
    where a DeviceClass serves it)."""
    refs = [{"name": c, "resourceClaimName": c} for c in claims]
    refs += [{"name": t, "resourceClaimTemplateName": t} for t in templates]
    limits: dict[str, str] = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    container: dict[str, Any] = {
        "name": "main", "image": "registry.example/app:1",
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits}}
    if refs:
        container["resources"]["claims"] = [{"name": r["name"]} for r in refs]
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [container]}
    if refs:
        spec["resourceClaims"] = refs
    if node:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "uid": f"uid-{namespace}-{name}"}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    status: dict[str, Any] = {"phase": "Running" if node else "Pending"}
    if generated:
        status["resourceClaimStatuses"] = [{"name": k, "resourceClaimName": v}
                                           for k, v in generated.items()]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": status}
