"""What the kubelet would do for a test's namespace, where no kubelet runs: report bound
pods Running and Ready (the disruption controller counts healthy pods by their Ready
condition) and confirm the deletion of terminating pods (an evicted pod is only marked for
deletion until its kubelet has stopped it). Used by the tests that evict pods of
Deployments (defragmentation, MIG compaction)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException


class KubeletDouble(threading.Thread):
    """Ready for bound pods, and the deletion of terminating ones, in one namespace."""

    def __init__(self, core: Any, namespace: str) -> None:
        super().__init__(daemon=True, name=f"kubelet-double-{namespace}")
        self.core, self.ns = core, namespace
        self.halt = threading.Event()
        # Name prefixes of pods whose deletion is not confirmed while they are here (a
        # pod that takes long to stop: its preStop hook, its grace period).
        self.lingering: set[str] = set()

    def run(self) -> None:
        while not self.halt.wait(0.2):
            with contextlib.suppress(ApiException):
                self._once()

    def _once(self) -> None:
        for p in self.core.list_namespaced_pod(self.ns).items:
            name = p.metadata.name
            if p.metadata.deletion_timestamp is not None:
                if any(name.startswith(k) for k in set(self.lingering)):
                    continue
                with contextlib.suppress(ApiException):
                    self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)
                continue
            ready = any(c.type == "Ready" and c.status == "True"
                        for c in (p.status.conditions or []))
            if p.spec.node_name and not ready:
                now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                self.core.patch_namespaced_pod_status(name, self.ns, {"status": {
                    "phase": "Running", "startTime": now,
                    "conditions": [{"type": t, "status": "True", "lastTransitionTime": now}
                                   for t in ("Initialized", "ContainersReady", "Ready")]}})


@contextlib.contextmanager
def workloads(core: Any, admin: Any, ns: str) -> Iterator[KubeletDouble]:
    """The kubelet double runs for ``ns`` inside the block; afterwards the namespace's
    Deployments, ReplicaSets (no garbage collector runs: a ReplicaSet left behind would
    recreate the pods the cleanup deletes) and PodDisruptionBudgets go."""
    apps, policy = client.AppsV1Api(admin), client.PolicyV1Api(admin)
    kubelet = KubeletDouble(core, ns)
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.lingering.clear()
        kubelet.halt.set()
        for delete in (apps.delete_collection_namespaced_deployment,
                       apps.delete_collection_namespaced_replica_set,
                       policy.delete_collection_namespaced_pod_disruption_budget):
            with contextlib.suppress(ApiException):
                delete(ns)
        kubelet.join(5)
