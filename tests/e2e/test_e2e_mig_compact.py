"""MIG compaction end to end (``--mig-compact``, the chart's ``migActuator.compact``): on an
opted-in node of two MIG GPUs, a Deployment's lone ASR pod on GPU 1 while GPU 0 has free
1g slices is evicted through the Eviction API; the ReplicaSet's replacement lands on GPU
0 (GPU 1's slices are held while it drains), GPU 1 ends empty, and the node has the
``MigDrainStarted`` / ``MigDrained`` Events; the eviction is kept in compaction's memory
across leaders, which a restarted extender reads back. A drain in flight when the
leading extender restarts (the evicted pod slow to stop) is taken up by the new process
from that memory and ends there. A bare pod (no controller recreates it) in the same
place is never moved.

Real components: etcd, kube-apiserver, kube-scheduler with the extender (compaction in
the MIG actuator's step on the leader), kube-controller-manager's ReplicaSet and
Deployment controllers; ``kubelet_double`` confirms the deletion of the evicted pod.
"""

from __future__ import annotations

import time
from typing import Any

from cluster import (
    H100,
    POOL,
    NodeSpec,
    create_nodes,
    create_pods,
    overcommits,
    pending_report,
    pod,
    pods_in,
    wait_for,
)
from conftest import Space
from controlplane import NAMESPACE, Stack, active_replica
from kubelet_double import workloads
from kubernetes import client
from kubernetes.client.rest import ApiException

from kube.annotations import GPUS, MIG, NODE
from kube.mig.compaction_memory import KEY, CompactionMemory, decode
from kube.mig.compaction_memory import NAME as MEMORY

SLICE = "nvidia.com/mig-1g.10gb"


def two_mig_gpus(name: str, pool: str) -> NodeSpec:
    """An opted-in H100 node of two GPUs, each laid out 7 x 1g.10gb."""
    labels = {"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": "2",
              "nvidia.com/gpu.memory": "81559", "nvidia.com/mig.capable": "true",
              "nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.replicas": "1",
              "nvidia.com/gpu.sharing-strategy": "none", "gpupack.io/mig-reconfigure": "true",
              POOL: pool}
    return NodeSpec(name, labels, {SLICE: "14"})


def report_layout(core: Any, name: str) -> None:
    """What the node agent would report: both GPUs in MIG mode, 7 x 1g.10gb each."""
    from packing.inventory import GpuInventory, Inventory, encode_inventory
    from packing.model import GpuMode, MigInstance

    seven = tuple(MigInstance("1g.10gb", s) for s in range(7))
    inv = Inventory(name, int(time.time()), tuple(
        GpuInventory(i, f"GPU-e2e-{name}-{i}", H100, 81559, 0, GpuMode.MIG, seven)
        for i in range(2)))
    core.patch_node(name, {"metadata": {"annotations": {
        "gpupack.io/inventory": encode_inventory(inv)}}})


def deployment(apps: Any, ns: str, name: str, replicas: int, pool: str,
               grace_s: int = 0) -> None:
    """``grace_s``: the pods' terminationGracePeriodSeconds (0, the e2e default, makes
    an eviction delete the pod at once, as no kubelet is there to wait for)."""
    template = pod(name, pool=pool, scheduler="gpupack", limits={SLICE: "1"},
                   labels={"app": name})
    template["spec"]["terminationGracePeriodSeconds"] = grace_s
    apps.create_namespaced_deployment(ns, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": template["spec"]}}})


def live(core: Any, ns: str, app: str | None = None) -> list[dict[str, Any]]:
    return [p for p in pods_in(core, ns) if not p["metadata"].get("deletionTimestamp")
            and (app is None or p["metadata"].get("labels", {}).get("app") == app)]


def gpu_of(p: dict[str, Any]) -> int | None:
    ann = p["metadata"].get("annotations") or {}
    return int(ann[GPUS]) if GPUS in ann and MIG in ann else None


def bound_on(core: Any, ns: str, app: str, n: int) -> list[dict[str, Any]] | None:
    got = [p for p in live(core, ns, app) if p["spec"].get("nodeName") and gpu_of(p) is not None]
    return got if len(got) == n else None


def node_events(core: Any, node: str) -> list[str]:
    items = core.list_namespaced_event("default",
                                       field_selector=f"involvedObject.name={node}").items
    return [e.reason for e in items
            if e.source and e.source.component == "gpupack-mig-actuator"]


def mig_node(space: Space, core: Any) -> tuple[str, str, str]:
    """(namespace, pool, node): a fresh namespace and an opted-in two-GPU MIG node."""
    ns = space.namespace()
    pool = space.name
    (name,) = create_nodes(core, [two_mig_gpus(f"{pool}-0", pool)])
    space.nodes.append(name)
    report_layout(core, name)
    return ns, pool, name


def remembered(core: Any) -> CompactionMemory | None:
    """Compaction's memory across leaders, once it holds an eviction."""
    try:
        cm = core.read_namespaced_config_map(MEMORY, NAMESPACE)
    except ApiException:
        return None
    mem = decode((cm.data or {}).get(KEY))
    return mem if mem.evictions else None


def lone_beside_free_slices(apps: Any, core: Any, ns: str, pool: str, lone_grace_s: int = 0
                            ) -> tuple[int | None, dict[str, Any]]:
    """Seven pods fill one GPU (the extender prefers GPUs in use); the eighth, of another
    Deployment, opens the other GPU; then three fill pods go, and the lone pod fits in
    the full GPU's three free slices. (The full GPU, the lone pod.)"""
    deployment(apps, ns, "fill", 7, pool)
    try:
        fill = wait_for(lambda: bound_on(core, ns, "fill", 7), 60, "7 fill pods bound")
    except AssertionError:
        raise AssertionError(pending_report(core, ns)) from None
    (full,) = {gpu_of(p) for p in fill}
    deployment(apps, ns, "lone", 1, pool, lone_grace_s)
    (lone,) = wait_for(lambda: bound_on(core, ns, "lone", 1), 60, "the lone pod bound")
    assert gpu_of(lone) != full
    apps.patch_namespaced_deployment_scale("fill", ns, {"spec": {"replicas": 4}})
    return full, lone


def test_a_lone_pod_moves_to_free_slices_and_its_gpu_empties(
        space: Space, core: Any, admin: Any, kcm: None, stack: Stack) -> None:
    ns, pool, name = mig_node(space, core)
    apps = client.AppsV1Api(admin)
    with workloads(core, admin, ns):
        full, lone = lone_beside_free_slices(apps, core, ns, pool)

        def moved() -> dict[str, Any] | None:
            got = bound_on(core, ns, "lone", 1)
            if not got or got[0]["metadata"]["name"] == lone["metadata"]["name"]:
                return None
            return got[0]

        try:
            new = wait_for(moved, 90, "the lone pod's replacement bound elsewhere")
        except AssertionError:
            raise AssertionError(f"events {node_events(core, name)}\n"
                                 + pending_report(core, ns)) from None
        assert gpu_of(new) == full, (gpu_of(new), full)
        wait_for(lambda: "MigDrained" in node_events(core, name), 30, "the MigDrained Event")
        reasons = node_events(core, name)
        assert reasons.count("MigDrainStarted") == 1, reasons
        assert "MigDrainStopped" not in reasons, reasons
        on = {gpu_of(p) for p in live(core, ns) if p["spec"].get("nodeName")}
        assert on == {full}, on  # the other GPU is empty
        assert overcommits(core, live(core, ns)) == []
        pod_events = [e.reason for e in core.list_namespaced_event(ns).items
                      if e.involved_object.name == lone["metadata"]["name"]]
        assert "MigCompactionEvicted" in pod_events, pod_events
    # The hourly budget outlives the leader: the eviction is in compaction's memory, and
    # a restarted extender reads it back before it moves anything.
    mem = wait_for(lambda: remembered(core), 15, "the eviction in gpupack-mig-compaction")
    assert all(time.time() - t < 600 for t in mem.evictions), mem
    extender = f"extender{active_replica(stack, admin)}"  # the leader (after a failover: b)
    log = stack.log_file(extender)
    before = log.read_text(errors="replace").count("remembered from the last leader")
    stack.restart(extender)
    wait_for(lambda: log.read_text(errors="replace").count(
        "remembered from the last leader") > before, 30, "the restarted extender to read it")


def drain_remembered(core: Any) -> CompactionMemory | None:
    """Compaction's memory, once it holds a drain whose eviction the API accepted."""
    mem = remembered(core)
    return mem if mem is not None and any(d.evicted for d in mem.drains) else None


def test_a_drain_goes_on_across_a_restart_of_its_leader(
        space: Space, core: Any, admin: Any, kcm: None, stack: Stack) -> None:
    # The lone pod takes long to stop (the kubelet double does not confirm its
    # deletion): the drain is in flight when the leading extender restarts. The new
    # process reads the drain back from compaction's memory and ends it (MigDrained)
    # once the pod is gone; forgotten, the drain would never end and the GPU's slices
    # would not be held meanwhile.
    ns, pool, name = mig_node(space, core)
    apps = client.AppsV1Api(admin)
    with workloads(core, admin, ns) as kubelet:
        kubelet.lingering.add("lone-")
        # A grace period, so that the evicted pod stays (terminating) until the kubelet
        # double confirms it: without one the eviction deletes it at once.
        full, lone = lone_beside_free_slices(apps, core, ns, pool, lone_grace_s=300)
        mem = wait_for(lambda: drain_remembered(core), 90, "the drain in gpupack-mig-compaction")
        (drain,) = mem.drains
        assert drain.pods == (f"{ns}/{lone['metadata']['name']}",), drain
        assert "MigDrained" not in node_events(core, name)
        extender = f"extender{active_replica(stack, admin)}"
        log = stack.log_file(extender)
        before = log.read_text(errors="replace").count("taken up from the last leader")
        stack.restart(extender)
        wait_for(lambda: log.read_text(errors="replace").count(
            "taken up from the last leader") > before, 30, "the restarted extender to take "
            "the drain up")
        kubelet.lingering.clear()  # the pod stops
        try:
            wait_for(lambda: "MigDrained" in node_events(core, name), 60,
                     "the MigDrained Event from the restarted extender")
        except AssertionError:
            raise AssertionError(f"events {node_events(core, name)}\n"
                                 + stack.log_tail(extender)) from None
        reasons = node_events(core, name)
        assert reasons.count("MigDrainStarted") == 1, reasons
        assert "MigDrainStopped" not in reasons, reasons
        new = wait_for(lambda: bound_on(core, ns, "lone", 1), 60, "the replacement bound")
        assert gpu_of(new[0]) == full
        assert overcommits(core, live(core, ns)) == []
        wait_for(lambda: (remembered(core) or CompactionMemory()).drains == (), 15,
                 "the ended drain gone from the memory")


def test_a_bare_pod_is_never_moved(space: Space, core: Any, admin: Any, kcm: None) -> None:
    ns, pool, name = mig_node(space, core)
    apps = client.AppsV1Api(admin)
    with workloads(core, admin, ns):
        deployment(apps, ns, "fill", 4, pool)
        fill = wait_for(lambda: bound_on(core, ns, "fill", 4), 60, "4 fill pods bound")
        (full,) = {gpu_of(p) for p in fill}
        # A bare pod, placed on the other GPU by hand (as gpupack would record it).
        other = 1 - int(full or 0)
        bare = pod("bare", pool=pool, scheduler="gpupack", limits={SLICE: "1"},
                   annotations={GPUS: str(other), MIG: "1g.10gb@0",
                                NODE: name})
        bare["spec"]["nodeName"] = name
        create_pods(core, ns, [bare])
        time.sleep(8.0)
        assert [p["metadata"]["name"] for p in live(core, ns)
                if p["metadata"]["name"] == "bare"] == ["bare"]
        assert "MigDrainStarted" not in node_events(core, name)
