"""Builders and probes for workloads on the real control plane: GPU nodes as the NVIDIA
GPU Operator labels them (capacity set through the status subresource, as
scheduler_perf does: no kubelet runs), pods as users write them, and checks of what the
API server holds afterwards."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.rest import ApiException

POOL = "e2e.gpupack.io/pool"
H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"
GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
LWS = "leaderworkerset.sigs.k8s.io/"


# -- nodes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSpec:
    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, str]


def h100_whole(name: str, pool: str, clique: str | None = None, gpus: int = 8) -> NodeSpec:
    labels = {"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": str(gpus),
              "nvidia.com/gpu.memory": "81559", "nvidia.com/mig.capable": "true",
              "nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.replicas": "1",
              "nvidia.com/gpu.sharing-strategy": "none",
              # Whole GPUs stay whole: no MIG slices are promised on them.
              "gpupack.io/mig-reconfigure": "false"}
    if clique is not None:
        labels["nvidia.com/gpu.clique"] = clique
    return NodeSpec(name, {**labels, POOL: pool}, {GPU: str(gpus)})


def h100_mig(name: str, pool: str, slices: Mapping[str, int], whole: int = 0) -> NodeSpec:
    """An H100 node in MIG mixed strategy with the given slice counts (and whole GPUs)."""
    labels = {"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": "8",
              "nvidia.com/gpu.memory": "81559", "nvidia.com/mig.capable": "true",
              "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "custom",
              "nvidia.com/mig.config.state": "success", "nvidia.com/gpu.replicas": "1",
              "nvidia.com/gpu.sharing-strategy": "none", "gpupack.io/mig-reconfigure": "false"}
    alloc = {f"nvidia.com/mig-{p}": str(n) for p, n in slices.items()}
    if whole:
        alloc[GPU] = str(whole)
    return NodeSpec(name, {**labels, POOL: pool}, alloc)


def l40s_shared(name: str, pool: str, gpus: int = 4, replicas: int = 4) -> NodeSpec:
    labels = {"nvidia.com/gpu.product": L40S, "nvidia.com/gpu.count": str(gpus),
              "nvidia.com/gpu.memory": "46068", "nvidia.com/mig.capable": "false",
              "nvidia.com/gpu.replicas": str(replicas),
              "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    return NodeSpec(name, {**labels, POOL: pool}, {SHARED: str(gpus * replicas)})


def create_nodes(core: Any, specs: Iterable[NodeSpec]) -> list[str]:
    names = []
    for spec in specs:
        labels = {"kubernetes.io/hostname": spec.name, "kubernetes.io/os": "linux",
                  **spec.labels}
        core.create_node({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": spec.name, "labels": labels}})
        alloc = {"cpu": "126", "memory": "1000Gi", "pods": "110", **spec.allocatable}
        status = {"status": {
            "capacity": alloc, "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "e2e: no kubelet, ready by fiat",
                            "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}]}}
        core.patch_node_status(spec.name, status)
        # The TaintNodesByCondition admission plugin taints every new Node not-ready; the
        # node lifecycle controller (kube-controller-manager, not run here) would lift it
        # once the kubelet reports Ready, as the status above says.
        core.patch_node(spec.name, {"spec": {"taints": None}})
        names.append(spec.name)
    return names


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# -- pods ------------------------------------------------------------------------------------


def pod(name: str, *, annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None, limits: Mapping[str, str] | None = None,
        pool: str | None = None, scheduler: str | None = None,
        cpu: str = "1", memory: str = "2Gi") -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if limits:
        resources["limits"] = dict(limits)
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.example/e2e:1",
                        "resources": resources}],
        "terminationGracePeriodSeconds": 0,
    }
    if pool is not None:
        spec["nodeSelector"] = {POOL: pool}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": dict(annotations or {}),
                         "labels": dict(labels or {})},
            "spec": spec}


def restricted(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` meeting Pod Security's restricted level (gpupack's namespace enforces it):
    non-root, the runtime's seccomp profile, no privilege escalation, no capabilities."""
    body["spec"]["securityContext"] = {"runAsNonRoot": True, "runAsUser": 65532,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    for c in body["spec"]["containers"]:
        c["securityContext"] = {"allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}}
    return body


# A scheduler name no scheduler serves: a pod with it waits until a test binds it itself.
MANUAL_SCHEDULER = "e2e-manual"


def bind_with_records(core: Any, namespace: str, name: str, node: str,
                      records: Mapping[str, str]) -> None:
    """Bind pod ``name`` to ``node`` as gpupack's bind does: one Binding whose annotations
    (the placement records) the API server copies onto the pod."""
    from kubernetes import client

    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace,
                                     annotations=dict(records)),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name=node))
    # The client cannot read the Binding the API server answers with (no target in it).
    core.create_namespaced_binding(namespace, body, _preload_content=False)


def lws_member(lws: str, worker: int, size: int, gpus: int, pool: str) -> dict[str, Any]:
    """A pod as the LeaderWorkerSet controller makes it for group 0 of ``lws``."""
    name = f"{lws}-0" if worker == 0 else f"{lws}-0-{worker}"
    return pod(name, pool=pool, limits={GPU: str(gpus)},
               labels={LWS + "name": lws, LWS + "group-index": "0",
                       LWS + "worker-index": str(worker),
                       "role": "leader" if worker == 0 else "worker"},
               annotations={LWS + "size": str(size), "gpupack.io/class": "whole"})


def create_pods(core: Any, namespace: str, pods: Iterable[Mapping[str, Any]]
                ) -> list[dict[str, Any]]:
    """Create each pod (through admission) and return the objects the API server stored."""
    out = []
    for p in pods:
        made = core.create_namespaced_pod(namespace, dict(p))
        out.append(core.api_client.sanitize_for_serialization(made))
    return out


def wait_for(check: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.25
             ) -> Any:
    end = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < end:
        last = check()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last})")


def wait_for_webhook(core: Any, namespace: str, probe: Mapping[str, Any], resource_prefix: str,
                     timeout_s: float = 30.0) -> Any:
    """Until the webhook's view has caught up with nodes just created: a dry-run create of
    ``probe`` (admission runs, nothing is stored) comes back with a GPU resource starting
    with ``resource_prefix``. A denial meanwhile (the webhook does not see the nodes yet)
    means try again."""
    def converted() -> Any:
        try:
            out = core.create_namespaced_pod(namespace, dict(probe), dry_run="All")
        except ApiException as e:
            if e.status == 403:
                return None
            raise
        limits = out.spec.containers[0].resources.limits or {}
        return out if any(k.startswith(resource_prefix) for k in limits) else None

    return wait_for(converted, timeout_s, f"the webhook to see the new nodes ({resource_prefix})")


def pods_in(core: Any, namespace: str) -> list[dict[str, Any]]:
    items = core.list_namespaced_pod(namespace).items
    return [core.api_client.sanitize_for_serialization(p) for p in items]


def bound(pods: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods
            if p["spec"].get("nodeName")}


def pending_report(core: Any, namespace: str, limit: int = 8) -> str:
    """The pods of ``namespace`` not bound yet, each with kube-scheduler's last word."""
    out = []
    for p in pods_in(core, namespace):
        if p["spec"].get("nodeName"):
            continue
        why = next((c.get("message", "") for c in (p.get("status") or {}).get("conditions") or []
                    if c.get("type") == "PodScheduled"), "no PodScheduled condition yet")
        limits = p["spec"]["containers"][0].get("resources", {}).get("limits", {})
        out.append(f"{p['metadata']['name']} {limits}: {why}")
    return f"{len(out)} pending" + "".join(f"\n  {line}" for line in out[:limit])


def bound_in(core: Any, namespace: str, count: int, timeout_s: float = 180) -> dict[str, str]:
    """Pod name -> node, once ``count`` pods of ``namespace`` are bound (the pending ones
    reported if they are not in time)."""
    def done() -> dict[str, str] | None:
        got = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods_in(core, namespace)
               if p["spec"].get("nodeName")}
        return got if len(got) == count else None

    try:
        found = wait_for(done, timeout_s, f"{count} pods bound in {namespace}")
    except AssertionError as e:
        raise AssertionError(f"{e}; {pending_report(core, namespace)}") from e
    assert isinstance(found, dict)
    return found


def force_delete_pods(core: Any, namespace: str) -> None:
    """No kubelet confirms a deletion here: grace period 0 removes bound pods at once."""
    for p in core.list_namespaced_pod(namespace).items:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(p.metadata.name, namespace, grace_period_seconds=0)


# -- checks ------------------------------------------------------------------------------------


def quantity(text: str) -> float:
    from kubernetes.utils import parse_quantity

    return float(parse_quantity(text))


def pod_requests(p: Mapping[str, Any]) -> dict[str, float]:
    total: dict[str, float] = defaultdict(float)
    for c in p["spec"]["containers"]:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for k, v in merged.items():
            total[k] += quantity(str(v))
    return total


@dataclass
class Overcommit:
    node: str
    resource: str
    used: float
    allocatable: float


def overcommits(core: Any, pods: Sequence[Mapping[str, Any]]) -> list[Overcommit]:
    """Every (node, extended resource) whose bound pods ask for more than the node has, as
    the API server sees nodes and pods now."""
    used: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for p in pods:
        node = p["spec"].get("nodeName")
        if node:
            for resource, n in pod_requests(p).items():
                used[node][resource] += n
    out = []
    for node, counts in used.items():
        alloc = core.read_node(node).status.allocatable or {}
        for resource, n in counts.items():
            if resource.startswith("nvidia.com/") and n > quantity(alloc.get(resource, "0")):
                out.append(Overcommit(node, resource, n, quantity(alloc.get(resource, "0"))))
    return out


@dataclass
class GroupOutcome:
    name: str
    nodes: list[str] = field(default_factory=list)
    cliques: set[str] = field(default_factory=set)
    size: int = 0

    @property
    def complete(self) -> bool:
        return len(self.nodes) == self.size

    @property
    def partial(self) -> bool:
        return 0 < len(self.nodes) < self.size

    @property
    def one_clique(self) -> bool:
        return self.complete and len(self.cliques) == 1


def group_outcomes(core: Any, pods: Sequence[Mapping[str, Any]]
                   ) -> dict[str, GroupOutcome]:
    cliques = {n.metadata.name: (n.metadata.labels or {}).get("nvidia.com/gpu.clique", "")
               for n in core.list_node().items}
    out: dict[str, GroupOutcome] = {}
    for p in pods:
        labels = p["metadata"].get("labels") or {}
        name = labels.get(LWS + "name")
        if name is None:
            continue
        g = out.setdefault(name, GroupOutcome(
            name, size=int(p["metadata"]["annotations"][LWS + "size"])))
        node = p["spec"].get("nodeName")
        if node:
            g.nodes.append(node)
            g.cliques.add(cliques.get(node, ""))
    return out


def double_bookings(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """Conflicts among the placements gpupack recorded on bound pods
    (``gpupack.io/gpus``, ``gpupack.io/mig``): a whole GPU held by two pods, a MIG slice
    (GPU, profile@start) held by two, or a whole GPU that also holds a slice."""
    whole: dict[tuple[str, str], str] = {}
    slices: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    out = []
    for p in pods:
        node = p["spec"].get("nodeName")
        ann = p["metadata"].get("annotations") or {}
        gpus = ann.get("gpupack.io/gpus")
        if not node or not gpus:
            continue
        name = p["metadata"]["name"]
        if any(SHARED in ((c.get("resources") or {}).get("limits") or {})
               for c in p["spec"]["containers"]):
            continue  # shares are booked by memory, not held
        mig = ann.get("gpupack.io/mig")
        for g in gpus.split(","):
            key = (node, g)
            if mig:
                other = slices[key].get(mig) or whole.get(key)
                slices[key][mig] = name
            else:
                other = whole.get(key) or next(iter(slices[key].values()), None)
                whole[key] = name
            if other is not None and other != name:
                out.append(f"{node} GPU {g}{' ' + mig if mig else ''}: {other} and {name}")
    return out
