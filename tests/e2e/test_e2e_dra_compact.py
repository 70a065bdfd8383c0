"""MIG compaction on a DynamicMIG (DRA) node end to end (``--mig-compact``, issue 34): on
an opted-in node of two H100s published by the NVIDIA DRA driver double with DynamicMIG,
a Deployment's lone ASR pod (its claim from a ResourceClaimTemplate) holds GPU 1 while
GPU 0, in use, has room. The extender fences GPU 1 with NoSchedule DeviceTaintRules
(one per device, labelled ``gpupack.io/fence``), evicts the pod (not its claim) through
the Eviction API; the ReplicaSet's replacement gets a new claim, which the allocator
fills on GPU 0; GPU 1 ends with nothing allocated, the drain ends ``MigDrained`` and the
fences are deleted.

Real components: etcd, kube-apiserver, kube-scheduler with the extender (compaction in
the MIG actuator's step on the leader), kube-controller-manager's ReplicaSet, Deployment
and resourceclaim controllers; ``kubelet_double`` confirms the deletion of the evicted
pod; the DRA driver double makes and destroys the instances.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dra_workload as W
from cluster import pending_report, wait_for
from conftest import Space
from controlplane import claim_controller
from dra_driver_double import DraDriverDouble
from kubelet_double import workloads
from kubernetes import client
from test_e2e_mig_compact import node_events

from kube.mig.fences import LABEL, VALUE
from packing.dra import nvidia


def _deployment(apps: Any, ns: str, name: str, replicas: int, pool: str) -> None:
    spec = W._pod(name, pool, "gpupack", template="mig-1g")["spec"]
    apps.create_namespaced_deployment(ns, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}})


def _gpu_of_pods(admin: Any, ns: str) -> dict[str, str]:
    """Live pod name -> the GPU (``gpu-<minor>``) its claim's device is on."""
    core = client.CoreV1Api(admin)
    live = {p.metadata.name for p in core.list_namespaced_pod(ns).items
            if not p.metadata.deletion_timestamp and p.spec.node_name}
    out = {}
    for c in W.claims_in(admin, ns):
        alloc = (c.get("status") or {}).get("allocation")
        owner = next((r["name"] for r in c["metadata"].get("ownerReferences") or []
                      if r["kind"] == "Pod"), None)
        if alloc and owner in live:
            out[owner] = W._gpu_of(alloc["devices"]["results"][0]["device"])
    return out


def _fences(admin: Any) -> list[dict[str, Any]]:
    return list(client.CustomObjectsApi(admin).list_cluster_custom_object(
        W.GROUP, W.VERSION, "devicetaintrules", label_selector=f"{LABEL}={VALUE}")["items"])


@contextmanager
def dynamic_mig_node(space: Space, core: Any, admin: Any, stack: Any, suffix: str
                     ) -> Iterator[tuple[str, str, W.DraNode, DraDriverDouble]]:
    """(namespace, pool, node, driver double): an opted-in node of two H100s the DRA
    driver double serves with DynamicMIG, the claim controller and the kubelet double
    running, the ``mig-1g`` ResourceClaimTemplate in the namespace; all gone after."""
    ns, pool = space.namespace(), space.name
    node = W.DraNode(f"{pool}-{suffix}", {W.POOL: pool, "gpupack.io/mig-reconfigure": "true"},
                     tuple(nvidia.GpuSpec(g, "H100-80GB") for g in range(2)),
                     layout=nvidia.Layout.SPLIT)
    double = DraDriverDouble(admin)
    stop = threading.Event()
    server = threading.Thread(target=double.serve, args=(stop,), daemon=True)
    try:
        with claim_controller(stack), workloads(core, admin, ns):
            space.nodes += W.publish(admin, [node], double)
            server.start()
            client.CustomObjectsApi(admin).create_namespaced_custom_object(
                W.GROUP, W.VERSION, ns, "resourceclaimtemplates",
                {"apiVersion": f"{W.GROUP}/{W.VERSION}", "kind": "ResourceClaimTemplate",
                 "metadata": {"name": "mig-1g"}, "spec": {"spec": W.MIG_1G}})
            yield ns, pool, node, double
    finally:
        stop.set()
        server.join(timeout=5)
        W.cleanup(admin, [ns], [node.name])


def test_a_lone_pod_leaves_a_dynamic_mig_gpu_behind_a_fence(
        space: Space, core: Any, admin: Any, kcm: None, stack: Any) -> None:
    apps = client.AppsV1Api(admin)
    seen_fences: list[int] = []
    fenced: set[str] = set()  # devices a fence was seen on
    with dynamic_mig_node(space, core, admin, stack, "dyn") as (ns, pool, node, double):
        # Seven pods fill GPU 0 (the allocator's first fit); the lone pod opens GPU 1;
        # three fill pods go, leaving GPU 0 in use with room.
        _deployment(apps, ns, "fill", 7, pool)
        try:
            wait_for(lambda: len(_gpu_of_pods(admin, ns)) == 7, 90, "7 fill pods")
        except AssertionError:
            raise AssertionError(pending_report(core, ns)) from None
        _deployment(apps, ns, "lone", 1, pool)
        lone = wait_for(lambda: [p for p, g in _gpu_of_pods(admin, ns).items()
                                 if p.startswith("lone-")], 60, "the lone pod")[0]
        assert _gpu_of_pods(admin, ns)[lone] == "gpu-1"
        apps.patch_namespaced_deployment_scale("fill", ns, {"spec": {"replicas": 4}})

        def moved() -> str | None:
            now = _fences(admin)
            seen_fences.append(len(now))
            fenced.update(f["metadata"]["annotations"]["gpupack.io/device"] for f in now)
            got = [p for p, g in _gpu_of_pods(admin, ns).items()
                   if p.startswith("lone-") and p != lone]
            return got[0] if got else None

        try:
            new = wait_for(moved, 120, "the lone pod's replacement bound")
        except AssertionError:
            raise AssertionError(f"events {node_events(core, node.name)}\n"
                                 + pending_report(core, ns)) from None
        assert _gpu_of_pods(admin, ns)[new] == "gpu-0"
        try:
            wait_for(lambda: "MigDrained" in node_events(core, node.name), 60,
                     "the MigDrained Event")
        except AssertionError:
            log = stack.log_file("extender").read_text(errors="replace")
            lines = [x for x in log.splitlines() if "MIG" in x]
            raise AssertionError(f"events {node_events(core, node.name)}\n"
                                 + "\n".join(lines[-20:])) from None
        wait_for(lambda: _fences(admin) == [], 30, "the fences deleted")
        on = set(_gpu_of_pods(admin, ns).values())
        wait_for(lambda: not double.instances.get(node.name, {}).get(1), 30,
                 "GPU 1's instance destroyed")
        errors = list(double.errors)
        evicted = [e.reason for e in core.list_namespaced_event(ns).items
                   if e.involved_object.name == lone]
    assert on == {"gpu-0"}, on
    # Fences only ever on GPU 1's devices (26: the whole GPU and every placement).
    assert fenced and all(d.startswith(f"{nvidia.DRIVER}/{node.name}/gpu-1") for d in fenced)
    assert max(seen_fences) <= 26, seen_fences
    assert errors == [], errors
    assert "MigCompactionEvicted" in evicted, evicted
    reasons = node_events(core, node.name)
    assert reasons.count("MigDrainStarted") == 1 and "MigDrainStopped" not in reasons, reasons
