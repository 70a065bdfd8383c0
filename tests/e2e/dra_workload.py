"""A mixed AI workload on GPUs published as ResourceSlices, for the real control plane:
the pool (nodes and the NVIDIA DRA driver double's slices), the workload (claims,
claim templates and pods), and what the API server holds afterwards (bound pods,
groups, GPUs touched, whole nodes free, devices allocated twice). Used by
``test_e2e_dra_workload.py`` and ``bench/dra.py``.

The pool (one per scheduler, identical):

* ``small`` nodes: an H100 node whose GPUs 0-3 are in MIG mode (static MIG, the NVIDIA
  driver's default: the MIG devices that exist are published) and 4-7 whole;
* an L40S node whose GPUs are shared (the driver's ``ConsumableShares``: consumable
  ``memory`` capacity);
* whole-GPU H100 nodes of 8 GPUs in NVLink cliques (GPU feature discovery's
  ``nvidia.com/gpu.clique`` label), each a static slice of whole GPUs; plus, at
  benchmark sizes, any number of ``spare`` such nodes outside the cliques, and
  DynamicMIG H100 nodes (``dyn``: every MIG placement a device, with counters).

The workload: ASR pods with a claim for a ``1g.10gb`` MIG partition, TTS pods for
``2g.20gb``, embedders with a claim for 6Gi of a shared L40S, rerankers with a claim for
one whole GPU (or asking ``nvidia.com/gpu: 1``, served by DRA: the ``gpu.nvidia.com``
class names it, KEP-5004), and LeaderWorkerSet groups of 2 pods each asking 8 GPUs
through a ResourceClaimTemplate. Every claim comes from a ResourceClaimTemplate (the
resourceclaim controller makes it). Small pods come first (the fragmenting order). No pod
carries a ``gpupack.io/`` annotation: the webhook does not size them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster import LWS, NodeSpec, create_nodes
from kubernetes import client
from kubernetes.client.rest import ApiException

from packing.dra import nvidia

GROUP, VERSION = "resource.k8s.io", "v1"
CLIQUE = "nvidia.com/gpu.clique"
POOL = "e2e.gpupack.io/pool"
ATTR = f"device.attributes['{nvidia.DRIVER}']"
STATIC_MIG = (
    ((("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2), ("1g.10gb", 3), ("1g.10gb", 4),
      ("1g.10gb", 5), ("1g.10gb", 6))),
    ((("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2), ("1g.10gb", 3), ("1g.10gb", 4),
      ("1g.10gb", 5), ("1g.10gb", 6))),
    (("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)),
    (("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)),
)


@dataclass(frozen=True)
class DraNode:
    name: str
    labels: Mapping[str, str]
    gpus: tuple[nvidia.GpuSpec, ...]
    layout: nvidia.Layout = nvidia.Layout.STATIC
    info: nvidia.DriverInfo = field(default_factory=nvidia.DriverInfo)


def pool(prefix: str, *, cliques: Sequence[int] = (4, 2), small: int = 1, l40s: int = 1,
         spare: int = 0, dyn: int = 0) -> list[DraNode]:
    """The pool's nodes (see the module docstring)."""
    base = {POOL: prefix}
    out: list[DraNode] = []
    for i in range(small):
        gpus = tuple(nvidia.GpuSpec(g, "H100-80GB", mig_mode=g < len(STATIC_MIG),
                                    static_mig=STATIC_MIG[g] if g < len(STATIC_MIG) else ())
                     for g in range(8))
        out.append(DraNode(f"{prefix}-small-{i}", base, gpus))
    for i in range(l40s):
        out.append(DraNode(f"{prefix}-l40s-{i}", base,
                           tuple(nvidia.GpuSpec(g, "L40S") for g in range(4)),
                           info=nvidia.DriverInfo(consumable_shares="memory")))
    for c, n in enumerate(cliques):
        for i in range(n):
            out.append(DraNode(f"{prefix}-c{c}-{i}", {**base, CLIQUE: f"{prefix}-clique-{c}"},
                               tuple(nvidia.GpuSpec(g, "H100-80GB") for g in range(8))))
    for i in range(spare):
        out.append(DraNode(f"{prefix}-spare-{i}", base,
                           tuple(nvidia.GpuSpec(g, "H100-80GB") for g in range(8))))
    for i in range(dyn):
        out.append(DraNode(f"{prefix}-dyn-{i}", base,
                           tuple(nvidia.GpuSpec(g, "H100-80GB") for g in range(8)),
                           layout=nvidia.Layout.SPLIT))
    return out


def publish(admin: Any, nodes: Sequence[DraNode], double: Any = None) -> list[str]:
    """Create the Nodes (no GPU resource in allocatable: the DRA driver's) and, as the
    driver double (``double``, or a new one), their slices and the driver's
    DeviceClasses."""
    from dra_driver_double import DraDriverDouble

    double = double or DraDriverDouble(admin)
    double.install_classes()
    core = client.CoreV1Api(admin)
    names = create_nodes(core, [NodeSpec(n.name, {**n.labels, "e2e.gpupack.io/dra": "1"}, {})
                                for n in nodes])
    for n in nodes:
        double.publish(n.name, n.gpus, layout=n.layout, info=n.info)
    return names


# -- the workload ------------------------------------------------------------------------


def _claim_spec(klass: str, selectors: Sequence[str] = (), count: int = 1,
                capacity: Mapping[str, str] | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": klass, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if capacity:
        exactly["capacity"] = {"requests": dict(capacity)}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


MIG_1G = _claim_spec(nvidia.MIG_CLASS, [f"{ATTR}.profile == '1g.10gb'"])
MIG_2G = _claim_spec(nvidia.MIG_CLASS, [f"{ATTR}.profile == '2g.20gb'"])
SHARE = _claim_spec(nvidia.GPU_CLASS, [f"{ATTR}.productName == 'NVIDIA L40S'"],
                    capacity={"memory": "6Gi"})
ONE = _claim_spec(nvidia.GPU_CLASS)
EIGHT = _claim_spec(nvidia.GPU_CLASS, count=8)


@dataclass
class Workload:
    templates: list[dict[str, Any]]
    pods: list[dict[str, Any]]


def _pod(name: str, pool_name: str, scheduler: str, *, template: str | None = None,
         limits: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None,
         annotations: Mapping[str, str] | None = None, cpu: str = "1") -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.example/e2e:1",
                                 "resources": {"requests": {"cpu": cpu, "memory": "2Gi"}}}
    spec: dict[str, Any] = {"containers": [container], "schedulerName": scheduler,
                            "terminationGracePeriodSeconds": 0,
                            "nodeSelector": {POOL: pool_name}}
    if limits:
        container["resources"]["limits"] = dict(limits)
    if template:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
        container["resources"]["claims"] = [{"name": "gpu"}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": dict(labels or {}),
                         "annotations": dict(annotations or {})},
            "spec": spec}


def workload(pool_name: str, scheduler: str, *, asr: int = 10, tts: int = 4, embed: int = 6,
             rerank: int = 4, groups: int = 3, extended: bool = False) -> Workload:
    """The pods (small ones first, then the groups) and the claim templates they use.
    ``extended``: rerankers ask ``nvidia.com/gpu: 1`` (served by DRA, KEP-5004) instead
    of a claim for one GPU; such pods go through gpupack's webhook, which must then know
    DRA nodes."""
    templates = [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaimTemplate",
                  "metadata": {"name": name}, "spec": {"spec": spec}}
                 for name, spec in (("mig-1g", MIG_1G), ("mig-2g", MIG_2G), ("share", SHARE),
                                    ("one", ONE), ("eight", EIGHT))]
    pods = []
    pods += [_pod(f"asr-{i}", pool_name, scheduler, template="mig-1g") for i in range(asr)]
    pods += [_pod(f"tts-{i}", pool_name, scheduler, template="mig-2g") for i in range(tts)]
    pods += [_pod(f"embed-{i}", pool_name, scheduler, template="share") for i in range(embed)]
    pods += [_pod(f"rerank-{i}", pool_name, scheduler, limits={nvidia.EXTENDED_RESOURCE: "1"})
             if extended else _pod(f"rerank-{i}", pool_name, scheduler, template="one")
             for i in range(rerank)]
    for g in range(groups):
        for w in range(2):
            name = f"llm-{g}-0" if w == 0 else f"llm-{g}-0-{w}"
            pods.append(_pod(name, pool_name, scheduler, template="eight", labels={
                LWS + "name": f"llm-{g}", LWS + "group-index": "0",
                LWS + "worker-index": str(w)}, annotations={
                LWS + "size": "2"}))
    return Workload(templates, pods)


def submit(admin: Any, namespace: str, w: Workload) -> None:
    objects = client.CustomObjectsApi(admin)
    core = client.CoreV1Api(admin)
    for t in w.templates:
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace,
                                                "resourceclaimtemplates", t)
    for p in w.pods:
        core.create_namespaced_pod(namespace, p)


def settle(admin: Any, namespace: str, n: int, timeout_s: float, quiet_s: float = 15.0
           ) -> tuple[list[dict[str, Any]], float]:
    """Wait until ``n`` pods are bound, or nothing changed for ``quiet_s``; the pods and
    the seconds until the last bind seen."""
    core = client.CoreV1Api(admin)
    start = time.monotonic()
    last, since, last_bind = -1, start, start
    while True:
        pods = [core.api_client.sanitize_for_serialization(p)
                for p in core.list_namespaced_pod(namespace).items]
        done = sum(1 for p in pods if p["spec"].get("nodeName"))
        now = time.monotonic()
        if done != last:
            last, since = done, now
            last_bind = now
        if done >= n or now - since > quiet_s or now - start > timeout_s:
            return pods, last_bind - start
        time.sleep(0.3)


# -- what the API server holds -------------------------------------------------------------


@dataclass
class Outcome:
    pods: int = 0
    pods_bound: int = 0
    groups: int = 0
    groups_complete: int = 0  # every member bound, all in one clique
    gpus_touched: int = 0  # GPUs with any device allocated
    # GPUs touched by the claims of pods outside groups: the part of gpus_touched that
    # packing changes (a group member's 8 GPUs are 8 GPUs wherever it goes)
    ungrouped_gpus_touched: int = 0
    whole_nodes_free: int = 0  # nodes of the pool with no device allocated
    claims: int = 0
    claims_allocated: int = 0
    double_allocated: list[str] = field(default_factory=list)
    unbound: list[str] = field(default_factory=list)

    def as_json(self, seconds: float) -> dict[str, Any]:
        return {"pods_bound": self.pods_bound, "groups_complete": self.groups_complete,
                "gpus_touched": self.gpus_touched, "whole_nodes_free": self.whole_nodes_free,
                "pods_per_s": round(self.pods_bound / seconds, 2) if seconds > 0 else 0.0}


def _gpu_of(device: str) -> str:
    """The physical GPU of an NVIDIA device name: ``gpu-<minor>``."""
    parts = device.split("-")
    return "-".join(parts[:2])


def claims_in(admin: Any, namespace: str) -> list[dict[str, Any]]:
    return list(client.CustomObjectsApi(admin).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims")["items"])


def outcome(admin: Any, namespace: str, pods: Sequence[Mapping[str, Any]],
            nodes: Iterable[str]) -> Outcome:
    node_set = set(nodes)
    core = client.CoreV1Api(admin)
    cliques = {n.metadata.name: (n.metadata.labels or {}).get(CLIQUE, "")
               for n in core.list_node(label_selector="e2e.gpupack.io/dra=1").items}
    out = Outcome(pods=len(pods))
    groups: dict[str, list[str | None]] = {}
    for p in pods:
        node = p["spec"].get("nodeName")
        out.pods_bound += node is not None
        if node is None:
            out.unbound.append(p["metadata"]["name"])
        name = (p["metadata"].get("labels") or {}).get(LWS + "name")
        if name is not None:
            groups.setdefault(name, []).append(node)
    out.groups = len(groups)
    out.groups_complete = sum(
        1 for members in groups.values()
        if len(members) == 2 and all(members)
        and len({cliques.get(m or "", "") for m in members} - {""}) == 1)
    held: dict[str, str] = {}
    touched: set[tuple[str, str]] = set()
    ungrouped: set[tuple[str, str]] = set()
    grouped = {p["metadata"]["name"] for p in pods
               if (p["metadata"].get("labels") or {}).get(LWS + "name") is not None}
    used_nodes: set[str] = set()
    for c in claims_in(admin, namespace):
        out.claims += 1
        alloc = (c.get("status") or {}).get("allocation")
        if not alloc:
            continue
        out.claims_allocated += 1
        owner = next((o["name"] for o in c["metadata"].get("ownerReferences") or []
                      if o.get("kind") == "Pod"), None)
        for r in (alloc.get("devices") or {}).get("results") or []:
            pool_name, device = r["pool"], r["device"]
            if pool_name not in node_set:
                continue
            touched.add((pool_name, _gpu_of(device)))
            if owner not in grouped:
                ungrouped.add((pool_name, _gpu_of(device)))
            used_nodes.add(pool_name)
            if r.get("shareID"):
                continue  # a share of a device that takes many
            key = f"{pool_name}/{device}"
            if key in held:
                out.double_allocated.append(f"{key}: {held[key]} and {c['metadata']['name']}")
            held[key] = c["metadata"]["name"]
    # Overlapping MIG devices or a MIG device beside its whole GPU, by the memory slices
    # they cover: the allocator's counters (DynamicMIG) or existing devices (static)
    # prevent both, so any is a double allocation.
    by_gpu: dict[tuple[str, str], list[str]] = {}
    for key in held:
        node, device = key.split("/", 1)
        by_gpu.setdefault((node, _gpu_of(device)), []).append(device)
    for (node, gpu), devices in by_gpu.items():
        if gpu in devices and len(devices) > 1:
            out.double_allocated.append(f"{node}/{gpu}: whole and {sorted(devices)}")
    out.gpus_touched = len(touched)
    out.ungrouped_gpus_touched = len(ungrouped)
    out.whole_nodes_free = len(node_set - used_nodes)
    return out


def cleanup(admin: Any, namespaces: Sequence[str], nodes: Sequence[str]) -> None:
    """Pods, claims and templates of the namespaces; the nodes and their slices."""
    core = client.CoreV1Api(admin)
    objects = client.CustomObjectsApi(admin)
    for ns in namespaces:
        with contextlib.suppress(ApiException):
            core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        for plural in ("resourceclaims", "resourceclaimtemplates"):
            for o in objects.list_namespaced_custom_object(GROUP, VERSION, ns, plural)["items"]:
                with contextlib.suppress(ApiException):
                    if o["metadata"].get("finalizers"):
                        objects.patch_namespaced_custom_object(
                            GROUP, VERSION, ns, plural, o["metadata"]["name"],
                            {"metadata": {"finalizers": None}})
                    objects.delete_namespaced_custom_object(GROUP, VERSION, ns, plural,
                                                            o["metadata"]["name"])
    mine = set(nodes)
    for o in objects.list_cluster_custom_object(GROUP, VERSION, "resourceslices")["items"]:
        if o["spec"].get("nodeName") in mine:
            with contextlib.suppress(ApiException):
                objects.delete_cluster_custom_object(GROUP, VERSION, "resourceslices",
                                                     o["metadata"]["name"])
    for n in nodes:
        with contextlib.suppress(ApiException):
            core.delete_node(n)
