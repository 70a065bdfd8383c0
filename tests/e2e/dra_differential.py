"""The differential run of :mod:`packing.dra.allocator` against the real kube-scheduler:
random claims on NVIDIA-shaped nodes, each pod scheduled by the plain kube-scheduler
(pinned to its node with a ``kubernetes.io/hostname`` node selector, so that the
scheduler's DynamicResources plugin allocates: ``spec.nodeName`` would bypass it), and
for every claim the model's prediction, made from the objects the API server holds just
before, compared with what the scheduler wrote into ``status.allocation``.

Used by ``tests/e2e/test_e2e_dra_allocator.py`` (CI size) and ``bench/dra_agreement.py``
(any size).

The fleet (``fleet``), cycling over node kinds: H100 x4 with DynamicMIG slices (the
1.35+ layout: a counter slice and a slice per GPU), A100-40GB x4 whose first GPU is in
MIG mode (no whole ``gpu-0``), H100 x4 with static MIG (whole GPUs and existing MIG
devices in one slice, no counters), H100 x2 with the driver's ConsumableShares
(``memory`` mode: shared devices, capacity requests), and H100 x4 with device taints
(``NoSchedule``, ``NoExecute``, ``None``) and a DeviceTaintRule.

Claims (``random_claim``): whole GPUs (count 1-2, some with CEL on capacity, product or
driver version), MIG profiles through ``mig.nvidia.com`` and a profile selector (several
CEL spellings, count 1-3, some with ``matchAttribute`` on the parent GPU),
``firstAvailable`` lists small to large, two requests on one GPU (``matchAttribute``) or
on two (``distinctAttribute``), ``All`` of a profile, tolerations on tainted nodes,
capacity requests on shared devices, and a few claims the scheduler must refuse with an
error (a selector reading an attribute the whole GPU lacks, ``All`` over more than 32
devices). One pod in five has two claims; one claim in six comes from a
ResourceClaimTemplate (kube-controller-manager's resourceclaim controller makes it). One pod
in ten has no claim but asks for ``nvidia.com/gpu`` (the ``gpu.nvidia.com`` class's
``extendedResourceName``) or a class's implicit extended resource, in one or two
containers: the scheduler makes that claim (KEP-5004), modelled by
:mod:`packing.dra.extended`.
Between batches a share of the bound pods is deleted and their claims released, so
state churns.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster import NodeSpec, create_nodes
from kubernetes import client
from kubernetes.client.rest import ApiException

from packing.dra import nvidia
from packing.dra.allocator import Prediction, Verdict
from packing.dra.extended import containers_from_pod, extended_resource_claim
from packing.dra.objects import AllocatedDevice, Node
from packing.dra.parse import parse_resource_claim
from packing.dra.world import world_from_api

GROUP, VERSION = "resource.k8s.io", "v1"
PLAIN = "plain-kube-scheduler"
ATTR = "device.attributes['gpu.nvidia.com']"
UNHEALTHY = "gpu.nvidia.com/unhealthy"


@dataclass(frozen=True)
class NodePlan:
    name: str
    kind: str
    gpus: tuple[nvidia.GpuSpec, ...]
    layout: nvidia.Layout
    info: nvidia.DriverInfo

    @property
    def model(self) -> str:
        return self.gpus[0].model


def fleet(prefix: str, count: int) -> list[NodePlan]:
    """``count`` nodes cycling over the node kinds (see the module docstring)."""
    kinds = ("h100", "h100", "a100-mig", "h100", "h100-static", "h100-shares", "h100",
             "h100-tainted", "h100-shares4", "h100")
    plans = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        name = f"{prefix}-{i:02d}"
        info = nvidia.DriverInfo()
        layout = nvidia.Layout.SPLIT
        if kind == "a100-mig":
            gpus = tuple(nvidia.GpuSpec(g, "A100-40GB", mig_mode=g == 0) for g in range(4))
        elif kind == "h100-static":
            layout = nvidia.Layout.STATIC
            gpus = (nvidia.GpuSpec(0, "H100-80GB"),
                    nvidia.GpuSpec(1, "H100-80GB", mig_mode=True, static_mig=(
                        ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4))),
                    nvidia.GpuSpec(2, "H100-80GB"),
                    nvidia.GpuSpec(3, "H100-80GB", mig_mode=True, static_mig=tuple(
                        ("1g.10gb", s) for s in range(7))))
        elif kind in ("h100-shares", "h100-shares4"):
            gpus = tuple(nvidia.GpuSpec(g, "H100-80GB") for g in range(2))
            info = nvidia.DriverInfo(consumable_shares="memory" if kind == "h100-shares"
                                     else "4")
        elif kind == "h100-tainted":
            gpus = tuple(nvidia.GpuSpec(g, "H100-80GB") for g in range(4))
            info = nvidia.DriverInfo(taints={
                "gpu-0": [{"key": UNHEALTHY, "value": "xid-79", "effect": "NoSchedule"}],
                "gpu-1-mig-1g10gb-19-0": [{"key": UNHEALTHY, "value": "xid-48",
                                           "effect": "NoExecute"}],
                "gpu-2": [{"key": "example.com/maintenance", "effect": "None"}]})
        else:
            gpus = tuple(nvidia.GpuSpec(g, "H100-80GB") for g in range(4))
        plans.append(NodePlan(name, kind, gpus, layout, info))
    return plans


# -- claims --------------------------------------------------------------------------------


def _sel(expr: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": expr}}]


def _profile_sel(rng: random.Random, profile: str, other: str | None = None) -> str:
    spelling = rng.randrange(4)
    if spelling == 0:
        return f"{ATTR}.profile == '{profile}'"
    if spelling == 1:
        return f'device.attributes["gpu.nvidia.com"]["profile"] == "{profile}"'
    if spelling == 2:
        return f"{ATTR}.profile in ['{profile}', '{other or profile}']"
    return (f"device.driver == 'gpu.nvidia.com' && {ATTR}.type == 'mig' && "
            f"{ATTR}.profile == '{profile}'")


def _profiles(plan: NodePlan) -> list[str]:
    from packing.catalog import get_model

    mig = get_model(plan.model).mig
    assert mig is not None
    return [p.name for p in mig.profiles]


def random_claim(rng: random.Random, plan: NodePlan) -> tuple[str, dict[str, Any]]:
    """(kind, claim spec) for a claim meant for ``plan``'s node."""
    profiles = _profiles(plan)
    small = [p for p in profiles if p.startswith(("1g", "2g")) and "+me" not in p]
    roll = rng.random()
    if plan.kind == "h100-tainted" and roll < 0.3:
        tol = rng.choice([
            [{"key": UNHEALTHY, "operator": "Exists", "effect": "NoSchedule"}],
            [{"key": UNHEALTHY, "operator": "Equal", "value": "xid-48"}],
            [{"operator": "Exists"}], []])
        cls = rng.choice([nvidia.GPU_CLASS, nvidia.MIG_CLASS])
        req: dict[str, Any] = {"deviceClassName": cls, "tolerations": tol}
        if cls == nvidia.MIG_CLASS:
            req["selectors"] = _sel(_profile_sel(rng, "1g.10gb"))
        return "tolerate", {"devices": {"requests": [{"name": "gpu", "exactly": req}]}}
    if plan.kind.startswith("h100-shares") and roll < 0.5:
        amount = rng.choice(["10Gi", "512Mi", "30Gi", "1500Mi", "70Gi", "1000000000"])
        cls = rng.choice([nvidia.GPU_CLASS, nvidia.MIG_CLASS])
        asked = {"memory": amount}
        if plan.kind == "h100-shares4" and rng.random() < 0.5:
            asked = rng.choice([{"shares": "2"}, {"shares": "1", "memory": amount}, {}])
        req = {"deviceClassName": cls, "capacity": {"requests": asked}}
        if rng.random() < 0.3:
            req["count"] = 2
        if cls == nvidia.MIG_CLASS:
            req["selectors"] = _sel(_profile_sel(rng, rng.choice(["1g.10gb", "3g.40gb"])))
        return "capacity", {"devices": {"requests": [{"name": "share", "exactly": req}]}}
    if roll < 0.02:
        return "error-cel", {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": nvidia.GPU_CLASS,
            "selectors": _sel(f"{ATTR}.profile == '1g.10gb'")}}]}}
    if roll < 0.03:
        return "error-all", {"devices": {"requests": [{"name": "all", "exactly": {
            "deviceClassName": nvidia.MIG_CLASS, "allocationMode": "All"}}]}}
    if roll < 0.22:
        req = {"deviceClassName": nvidia.GPU_CLASS, "count": rng.choice([1, 1, 1, 2])}
        extra = rng.random()
        if extra < 0.1:
            req["selectors"] = _sel(f"device.capacity['gpu.nvidia.com'].memory"
                                    f".compareTo(quantity('{rng.choice(['40Gi', '79Gi'])}'))"
                                    " >= 0")
        elif extra < 0.2:
            req["selectors"] = _sel(f"{ATTR}.driverVersion.isGreaterThan(semver('550.0.0'))"
                                    f" && {ATTR}.architecture != 'Volta'")
        elif extra < 0.25:
            req["selectors"] = _sel(f"{ATTR}.productName.startsWith('NVIDIA H100')")
        return "gpu", {"devices": {"requests": [{"name": "gpu", "exactly": req}]}}
    if roll < 0.55:
        profile = rng.choice(profiles if rng.random() < 0.3 else small)
        count = rng.choice([1, 1, 1, 1, 2, 3, 4])
        spec: dict[str, Any] = {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": nvidia.MIG_CLASS, "count": count,
            "selectors": _sel(_profile_sel(rng, profile, rng.choice(small)))}}]}
        if count > 1 and rng.random() < 0.5:
            spec["constraints"] = [{"matchAttribute": "gpu.nvidia.com/parentUUID"}]
        return "mig", {"devices": spec}
    if roll < 0.72:
        ladder = sorted(rng.sample(small, 2), key=profiles.index)
        subs = [{"name": f"p{i}", "deviceClassName": nvidia.MIG_CLASS,
                 "selectors": _sel(_profile_sel(rng, p))} for i, p in enumerate(ladder)]
        if rng.random() < 0.3:
            subs[0]["count"] = 2
        subs.append({"name": "whole", "deviceClassName": nvidia.GPU_CLASS})
        spec = {"requests": [{"name": "any", "firstAvailable": subs}]}
        if rng.random() < 0.3:
            # A second request on the same GPU as the first's choice (constraints name
            # subrequests as <request>/<subrequest>, or the whole request).
            spec["requests"].append({"name": "more", "exactly": {
                "deviceClassName": nvidia.MIG_CLASS,
                "selectors": _sel(_profile_sel(rng, rng.choice(small)))}})
            spec["constraints"] = [{"requests": [rng.choice(["any", "any/p0"]), "more"],
                                    "matchAttribute": "gpu.nvidia.com/parentUUID"}]
        return "first-available", {"devices": spec}
    if roll < 0.85:
        a, b = rng.sample(small, 2)
        same = rng.random() < 0.6
        spec = {"requests": [
            {"name": "a", "exactly": {"deviceClassName": nvidia.MIG_CLASS,
                                      "selectors": _sel(_profile_sel(rng, a))}},
            {"name": "b", "exactly": {"deviceClassName": nvidia.MIG_CLASS,
                                      "selectors": _sel(_profile_sel(rng, b))}}],
            "constraints": [{"requests": ["a", "b"], (
                "matchAttribute" if same else "distinctAttribute"): "gpu.nvidia.com/parentUUID"}]}
        return "two-requests", {"devices": spec}
    profile = rng.choice([p for p in profiles if p.startswith(("3g", "4g", "7g"))])
    return "all", {"devices": {"requests": [{"name": "all", "exactly": {
        "deviceClassName": nvidia.MIG_CLASS, "allocationMode": "All",
        "selectors": _sel(f"{ATTR}.profile == '{profile}'")}}]}}


# -- the run -------------------------------------------------------------------------------


@dataclass
class Report:
    claims: int = 0  # claims of settled pods
    allocated: int = 0  # of them, claims kube-scheduler allocated
    same_device: int = 0  # claims whose predicted devices are exactly the allocated ones
    pods: int = 0
    agree_pods: int = 0  # pods whose predicted verdict (and devices) held
    verdicts: Counter[str] = field(default_factory=Counter)  # predicted
    kinds: Counter[str] = field(default_factory=Counter)
    mismatches: list[str] = field(default_factory=list)
    released: int = 0
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"claims": self.claims, "same_device": self.same_device,
                "allocated": self.allocated, "pods": self.pods, "agree_pods": self.agree_pods,
                "verdicts": dict(self.verdicts), "kinds": dict(self.kinds),
                "released": self.released, "seconds": round(self.seconds, 1),
                "mismatches": self.mismatches[:20]}


def _result_key(r: AllocatedDevice) -> tuple[Any, ...]:
    consumed = tuple(sorted((k, str(v.normalize())) for k, v in
                            (r.consumed_capacity or {}).items()))
    return (r.request, r.driver, r.pool, r.device, r.share_id is not None, consumed)


class _Cluster:
    def __init__(self, admin: Any, namespace: str) -> None:
        self.objects = client.CustomObjectsApi(admin)
        self.core = client.CoreV1Api(admin)
        self.ns = namespace

    def list(self, plural: str) -> list[dict[str, Any]]:
        """Every object of ``plural`` in the cluster (all namespaces)."""
        return list(self.objects.list_cluster_custom_object(GROUP, VERSION, plural)["items"])

    def create(self, plural: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return dict(self.objects.create_namespaced_custom_object(GROUP, VERSION, self.ns,
                                                                 plural, dict(body)))

    def claim(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.objects.get_namespaced_custom_object(GROUP, VERSION, self.ns,
                                                                  "resourceclaims", name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise


@dataclass
class _PodPlan:
    name: str
    node: NodePlan
    claims: list[tuple[str, str, dict[str, Any], bool]]  # (pod claim name, kind, spec, template)
    # Extended resources per container (KEP-5004): the scheduler makes the claim.
    extended: list[dict[str, str]] = field(default_factory=list)
    prediction: Prediction | None = None

    @property
    def kinds(self) -> list[str]:
        return [k for _c, k, _s, _t in self.claims] + (["extended"] if self.extended else [])

    def containers(self) -> list[dict[str, Any]]:
        out = []
        for i, extended in enumerate(self.extended or [{}]):
            limits = {"cpu": "100m", **extended}
            c: dict[str, Any] = {"name": f"c{i}", "image": "registry.example/dra:e2e",
                                 "resources": {"limits": limits}}
            if i == 0 and self.claims:
                c["resources"]["claims"] = [{"name": n} for n, *_r in self.claims]
            out.append(c)
        return out


def random_extended(rng: random.Random) -> list[dict[str, str]]:
    """Extended resources of a pod's containers: ``nvidia.com/gpu`` (the gpu.nvidia.com
    class's extendedResourceName) or a class's implicit resource."""
    implicit = "deviceclass.resource.kubernetes.io/" + nvidia.MIG_CLASS
    first = {rng.choice([nvidia.EXTENDED_RESOURCE, nvidia.EXTENDED_RESOURCE, implicit]):
             str(rng.choice([1, 1, 2]))}
    return [first] + ([{nvidia.EXTENDED_RESOURCE: "1"}] if rng.random() < 0.3 else [])


def run(admin: Any, namespace: str, *, prefix: str, nodes: int = 22, claims: int = 300,
        seed: int = 20261206, release: float = 0.35, batch: int | None = None,
        log: Callable[[str], None] = print, timeout_s: float = 60.0) -> Report:
    """Publish the fleet, run random claims through kube-scheduler until ``claims`` of
    them were allocated (the refused ones come on top), compare each.

    The caller provides the namespace (with its ``default`` ServiceAccount), runs the
    claim controller, and removes nodes, pods and DRA objects afterwards
    (:func:`cleanup`).
    """
    from dra_driver_double import DraDriverDouble

    rng = random.Random(seed)
    started = time.monotonic()
    k8s = _Cluster(admin, namespace)
    double = DraDriverDouble(admin)
    double.install_classes()
    plans = fleet(prefix, nodes)
    create_nodes(k8s.core, [NodeSpec(p.name, {"e2e.gpupack.io/dra": prefix}, {})
                            for p in plans])
    for p in plans:
        double.publish(p.name, p.gpus, layout=p.layout, info=p.info)
    tainted = [p for p in plans if p.kind == "h100-tainted"]
    if tainted:
        # A DeviceTaintRule (as an admin would write to keep a device): the scheduler's
        # slice tracker adds its taint to the device before allocating.
        k8s.objects.create_cluster_custom_object(GROUP, VERSION, "devicetaintrules", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "DeviceTaintRule",
            "metadata": {"name": f"{prefix}-keep"},
            "spec": {"deviceSelector": {"driver": nvidia.DRIVER, "pool": tainted[0].name,
                                        "device": "gpu-3"},
                     "taint": {"key": "gpupack.io/kept", "value": "group",
                               "effect": "NoSchedule"}}})
    report = Report()
    live: list[tuple[str, list[str], bool]] = []  # (pod, direct claim names, template?)
    serial = 0
    batch = batch or nodes
    # Let the scheduler's informers see every slice, class and rule first.
    time.sleep(2.0)
    while report.allocated < claims:
        pods: list[_PodPlan] = []
        for plan in rng.sample(plans, min(batch, len(plans))):
            serial += 1
            roll = rng.random()
            n = 0 if roll < 0.1 else 2 if roll < 0.3 else 1
            cs = []
            for j in range(n):
                kind, spec = random_claim(rng, plan)
                cs.append((f"c{j}", kind, spec, rng.random() < 1 / 6))
            extended = random_extended(rng) if n == 0 or rng.random() < 0.05 else []
            pods.append(_PodPlan(f"p{serial:04d}", plan, cs, extended))
        _predict(k8s, pods)
        _submit(k8s, pods)
        settled = _wait(k8s, [p.name for p in pods], timeout_s)
        for p in pods:
            _compare(k8s, p, settled.get(p.name), report)
        bound = [p for p in pods if settled.get(p.name, ("", ""))[0] == "bound"]
        for p in pods:
            if p not in bound:
                _delete_pod(k8s, p.name, [n for n, _k, _s, t in _direct(p)])
            else:
                live.append((p.name, [n for n, _k, _s, _t in _direct(p)], any(
                    t for *_x, t in p.claims)))
        rng.shuffle(live)
        gone = live[:int(len(live) * release)]
        live = live[len(gone):]
        for name, direct, _t in gone:
            _delete_pod(k8s, name, direct)
        report.released += len(gone)
        _wait_released(k8s, timeout_s)
        log(f"batch: {len(pods)} pods, claims {report.claims}, same_device "
            f"{report.same_device}/{report.allocated} allocated, released {len(gone)}")
    report.seconds = time.monotonic() - started
    return report


def _direct(p: _PodPlan) -> list[tuple[str, str, dict[str, Any], bool]]:
    """The pod's claims with their API names (direct claims: ``<pod>-<claim>``)."""
    return [(f"{p.name}-{c}", kind, spec, template) for c, kind, spec, template in p.claims
            if not template]


def _predict(k8s: _Cluster, pods: Sequence[_PodPlan]) -> None:
    world, errors = world_from_api(k8s.list("resourceslices"), k8s.list("deviceclasses"),
                                   k8s.list("resourceclaims"), k8s.list("devicetaintrules"))
    assert errors == [], errors
    classes = world.classes
    for p in pods:
        claims = [parse_resource_claim({"metadata": {"name": f"{p.name}-{c}",
                                                     "namespace": k8s.ns}, "spec": spec})
                  for c, _kind, spec, _t in p.claims]
        if p.extended:
            made = extended_resource_claim(
                k8s.ns, p.name, containers_from_pod({"spec": {"containers": p.containers()}}),
                list(classes.values()), {})
            assert made.claim is not None, made
            claims.append(made.claim)
        p.prediction = world.predict(Node(p.node.name, {"kubernetes.io/hostname": p.node.name}),
                                     claims)


def _submit(k8s: _Cluster, pods: Sequence[_PodPlan]) -> None:
    for p in pods:
        refs = []
        for c, _kind, spec, template in p.claims:
            name = f"{p.name}-{c}"
            if template:
                k8s.create("resourceclaimtemplates", {
                    "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": name}, "spec": {"spec": spec}})
                refs.append({"name": c, "resourceClaimTemplateName": name})
            else:
                k8s.create("resourceclaims", {"apiVersion": f"{GROUP}/{VERSION}",
                                              "kind": "ResourceClaim",
                                              "metadata": {"name": name}, "spec": spec})
                refs.append({"name": c, "resourceClaimName": name})
        k8s.core.create_namespaced_pod(k8s.ns, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": p.name},
            "spec": {"schedulerName": PLAIN,
                     "nodeSelector": {"kubernetes.io/hostname": p.node.name},
                     "resourceClaims": refs, "containers": p.containers()}})


def _wait(k8s: _Cluster, names: Sequence[str], timeout_s: float
          ) -> dict[str, tuple[str, str]]:
    """Pod -> ("bound", node) / ("Unschedulable" | "SchedulerError", message)."""
    want = set(names)
    out: dict[str, tuple[str, str]] = {}
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and len(out) < len(want):
        for pod in k8s.core.list_namespaced_pod(k8s.ns).items:
            name = pod.metadata.name
            if name not in want or name in out:
                continue
            if pod.spec.node_name:
                out[name] = ("bound", pod.spec.node_name)
                continue
            for cond in pod.status.conditions or []:
                if cond.type == "PodScheduled" and cond.status == "False" and cond.reason in (
                        "Unschedulable", "SchedulerError"):
                    out[name] = (cond.reason, cond.message or "")
        time.sleep(0.15)
    return out


def _claim_names(k8s: _Cluster, p: _PodPlan) -> dict[str, str]:
    pod = k8s.core.read_namespaced_pod(p.name, k8s.ns)
    names = {c: f"{p.name}-{c}" for c, _k, _s, t in p.claims if not t}
    for st in pod.status.resource_claim_statuses or []:
        if st.resource_claim_name:
            names[st.name] = st.resource_claim_name
    ext = pod.status.extended_resource_claim_status
    if ext is not None and ext.resource_claim_name:
        names["<extended>"] = ext.resource_claim_name
    return names


def _compare(k8s: _Cluster, p: _PodPlan, settled: tuple[str, str] | None,
             report: Report) -> None:
    pred = p.prediction
    assert pred is not None
    report.pods += 1
    report.verdicts[pred.verdict.value] += 1
    report.claims += len(p.kinds)
    for kind in p.kinds:
        report.kinds[kind] += 1
    where = f"{p.name} on {p.node.name} ({p.node.kind}; {p.kinds})"
    if settled is None:
        report.mismatches.append(f"{where}: not settled; predicted {pred.verdict.value}")
        return
    state, detail = settled
    expected = {Verdict.ALLOCATED: "bound", Verdict.UNSCHEDULABLE: "Unschedulable",
                Verdict.ERROR: "SchedulerError"}.get(pred.verdict, "?")
    if state != expected:
        report.mismatches.append(f"{where}: predicted {pred.verdict.value} ({pred.reason}), "
                                 f"scheduler: {state} {detail[:300]}")
        return
    if state != "bound":
        report.agree_pods += 1
        return
    names = _claim_names(k8s, p)
    all_same = True
    pod_claims = [c for c, *_r in p.claims] + (["<extended>"] if p.extended else [])
    for i, c in enumerate(pod_claims):
        report.allocated += 1
        obj = k8s.claim(names.get(c, ""))
        actual = parse_resource_claim(obj) if obj else None
        got = () if actual is None or actual.allocation is None else actual.allocation.results
        if tuple(map(_result_key, got)) == tuple(map(_result_key, pred.results[i])):
            report.same_device += 1
        else:
            all_same = False
            report.mismatches.append(
                f"{where} claim {c}: predicted {[_result_key(r)[3] for r in pred.results[i]]}"
                f", allocated {[_result_key(r)[3] for r in got]}")
    report.agree_pods += all_same


def _delete_pod(k8s: _Cluster, pod: str, direct: Sequence[str]) -> None:
    """Remove a pod at once (no kubelet runs) and its direct claims: the claim controller
    then takes the pod out of their reservedFor, deallocates them and lets them go."""
    try:
        k8s.core.delete_namespaced_pod(pod, k8s.ns, grace_period_seconds=0)
    except ApiException as e:
        if e.status != 404:
            raise
    for name in direct:
        try:
            k8s.objects.delete_namespaced_custom_object(GROUP, VERSION, k8s.ns,
                                                        "resourceclaims", name)
        except ApiException as e:
            if e.status != 404:
                raise


def _wait_released(k8s: _Cluster, timeout_s: float) -> None:
    """Until no claim of a deleted pod holds an allocation (and then a moment for the
    scheduler's informer)."""
    live = {p.metadata.uid for p in k8s.core.list_namespaced_pod(k8s.ns).items}
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        stale = [o for o in k8s.list("resourceclaims")
                 if o["metadata"].get("namespace") == k8s.ns
                 and (o["metadata"].get("deletionTimestamp")
                      or (o.get("status", {}).get("allocation") and not any(
                          r.get("uid") in live for r in o["status"].get("reservedFor", []))))]
        if not stale:
            time.sleep(0.5)
            return
        time.sleep(0.2)
    raise AssertionError("claims of deleted pods were not released within "
                         f"{timeout_s:.0f} s")


def cleanup(admin: Any, namespace: str, prefix: str) -> None:
    """Pods, claims, templates of the namespace; the fleet's nodes, slices and rule."""
    k8s = _Cluster(admin, namespace)
    for pod in k8s.core.list_namespaced_pod(namespace).items:
        _delete_pod(k8s, pod.metadata.name, ())
    for plural in ("resourceclaims", "resourceclaimtemplates"):
        for o in k8s.objects.list_namespaced_custom_object(GROUP, VERSION, namespace,
                                                           plural)["items"]:
            try:
                if plural == "resourceclaims" and o["metadata"].get("finalizers"):
                    k8s.objects.patch_namespaced_custom_object(
                        GROUP, VERSION, namespace, plural, o["metadata"]["name"],
                        {"metadata": {"finalizers": None}})
                k8s.objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, plural,
                                                            o["metadata"]["name"])
            except ApiException as e:
                if e.status != 404:
                    raise
    for o in k8s.list("resourceslices"):
        if o["spec"].get("nodeName", "").startswith(prefix):
            k8s.objects.delete_cluster_custom_object(GROUP, VERSION, "resourceslices",
                                                     o["metadata"]["name"])
    try:
        k8s.objects.delete_cluster_custom_object(GROUP, VERSION, "devicetaintrules",
                                                 f"{prefix}-keep")
    except ApiException as e:
        if e.status != 404:
            raise
    for node in k8s.core.list_node(label_selector=f"e2e.gpupack.io/dra={prefix}").items:
        k8s.core.delete_node(node.metadata.name)


def scheduler_gates(stack: Any, component: str = "plain-scheduler") -> dict[str, bool]:
    """The feature gates kube-scheduler runs with, from its ``kubernetes_feature_enabled``
    metric (read with the admin's client certificate)."""
    import ssl
    import urllib.error
    import urllib.request

    argv = stack.state()["components"][component]["argv"]
    port = next(a.split("=", 1)[1] for a in argv if a.startswith("--secure-port="))
    pki = stack.dir / "pki"
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # kube-scheduler serves a self-signed certificate
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    end = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx,
                                        timeout=10) as resp:
                text = resp.read().decode()
            break
        except urllib.error.HTTPError as e:
            # Until kube-scheduler has loaded the client CA of its delegated
            # authentication, the certificate is not recognised.
            if e.code not in (401, 403) or time.monotonic() > end:
                raise
            time.sleep(1)
    out = {}
    for line in text.splitlines():
        if line.startswith("kubernetes_feature_enabled{"):
            name = line.split('name="', 1)[1].split('"', 1)[0]
            out[name] = line.rsplit(" ", 1)[1].strip() == "1"
    return out


# -- CEL through the real allocator ----------------------------------------------------------

ANY_CLASS = "any.gpupack.io"  # a class with no selectors: the claim's selector decides
_C = "device.capacity['gpu.nvidia.com']"
_ATOMS = (
    f"{ATTR}.type == 'mig'", f"{ATTR}.type != 'gpu'", f"has({ATTR}.profile)",
    f"'parentUUID' in {ATTR}", f"{ATTR}.profile == '1g.10gb'",
    f"{ATTR}.profile in ['2g.20gb', '3g.40gb', '7g.80gb']",
    'device.attributes["gpu.nvidia.com"]["profile"].startsWith("1g")',
    f"{ATTR}.productName.startsWith('NVIDIA H100')", f"{ATTR}.productName.contains('A100')",
    f"{_C}.memory.compareTo(quantity('20Gi')) >= 0", f"{_C}.memory.isLessThan(quantity('10Gi'))",
    f"{_C}.multiprocessors.isGreaterThan(quantity('60'))",
    f"{_C}.memory.asApproximateFloat() > 3.0e10", f"{_C}.decoders.asInteger() % 2 == 0",
    f"{_C}.ofaEngines == quantity('1')",
    f"{ATTR}.driverVersion.isGreaterThan(semver('575.0.0'))",
    f"{ATTR}.cudaComputeCapability.major() >= 9", f"size({ATTR}.productName) > 12",
    "device.attributes['resource.kubernetes.io'].numaNode == 0",
    "device.attributes['resource.kubernetes.io'].pciBusID.endsWith(':00.0')",
    "device.allowMultipleAllocations", "device.driver == 'gpu.nvidia.com'",
    f"{ATTR}.uuid.lowerAscii().startsWith('gpu-')", "'other.example.com' in device.attributes",
    "device.attributes['other.example.com'].x == 1", f"{ATTR}.architecture > 3",
    f"{ATTR}.architecture == 3", f"int({_C}.multiprocessors.asInteger() / 16) == 1",
)


def random_selector(rng: random.Random, depth: int = 0) -> str:
    roll = rng.random()
    if depth >= 2 or roll < 0.35:
        return rng.choice(_ATOMS)
    if roll < 0.55:
        return f"({random_selector(rng, depth + 1)} && {random_selector(rng, depth + 1)})"
    if roll < 0.75:
        return f"({random_selector(rng, depth + 1)} || {random_selector(rng, depth + 1)})"
    if roll < 0.85:
        return f"!({random_selector(rng, depth + 1)})"
    return (f"({random_selector(rng, depth + 1)} ? {random_selector(rng, depth + 1)} : "
            f"{random_selector(rng, depth + 1)})")


@dataclass
class CelReport:
    expressions: int = 0
    rejected: int = 0  # refused by the API server (its CEL type check)
    agree: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    mismatches: list[str] = field(default_factory=list)


def run_cel(admin: Any, namespace: str, *, prefix: str, count: int = 60, nodes: int = 6,
            seed: int = 5, timeout_s: float = 60.0) -> CelReport:
    """``count`` random selectors, each as ``All`` devices of a class without selectors,
    on nodes with static MIG (two whole GPUs, an H100 and an A100, and eleven MIG devices)
    or one DynamicMIG H100 (26 devices): the devices the scheduler allocates are exactly
    those the selector matches; none matching (or a set whose counters do not fit) is
    "unschedulable"; a runtime error on a device makes the scheduler fail the pod."""
    from dra_driver_double import DraDriverDouble

    rng = random.Random(seed)
    k8s = _Cluster(admin, namespace)
    double = DraDriverDouble(admin)
    try:
        k8s.objects.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "DeviceClass",
            "metadata": {"name": ANY_CLASS}, "spec": {}})
    except ApiException as e:
        if e.status != 409:
            raise
    static = (nvidia.GpuSpec(0, "H100-80GB"),
              nvidia.GpuSpec(1, "H100-80GB", mig_mode=True, static_mig=(
                  ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4))),
              nvidia.GpuSpec(2, "H100-80GB", mig_mode=True, static_mig=tuple(
                  ("1g.10gb", s) for s in range(7))),
              nvidia.GpuSpec(3, "A100-40GB", numa_node=1))
    # Static MIG (no counters: any matching set can be allocated), and a DynamicMIG H100
    # (every placement, counters: a set of overlapping placements cannot).
    plans = [NodePlan(f"{prefix}-{i:02d}", "static-mix", static, nvidia.Layout.STATIC,
                      nvidia.DriverInfo()) if i % 3 else
             NodePlan(f"{prefix}-{i:02d}", "h100-one", (nvidia.GpuSpec(0, "H100-80GB"),),
                      nvidia.Layout.SPLIT, nvidia.DriverInfo()) for i in range(nodes)]
    create_nodes(k8s.core, [NodeSpec(p.name, {"e2e.gpupack.io/dra": prefix}, {})
                            for p in plans])
    for p in plans:
        double.publish(p.name, p.gpus, layout=p.layout, info=p.info)
    time.sleep(2.0)
    report = CelReport()
    serial = 0
    while report.expressions < count:
        batch = []
        for plan in plans:
            serial += 1
            expr = random_selector(rng)
            spec = {"devices": {"requests": [{"name": "all", "exactly": {
                "deviceClassName": ANY_CLASS, "allocationMode": "All",
                "selectors": _sel(expr)}}]}}
            batch.append(_PodPlan(f"cel{serial:04d}", plan, [("c0", expr, spec, False)]))
        _predict(k8s, batch)  # before anything is created: the state the scheduler starts from
        pods = []
        for pod in batch:
            try:
                _submit(k8s, [pod])
            except ApiException as e:
                if e.status not in (400, 422):
                    raise
                report.rejected += 1
                _delete_pod(k8s, pod.name, [f"{pod.name}-c0"])
                continue
            pods.append(pod)
        settled = _wait(k8s, [p.name for p in pods], timeout_s)
        for p in pods:
            report.expressions += 1
            assert p.prediction is not None
            report.outcomes[p.prediction.verdict.value] += 1
            sub = Report()
            _compare(k8s, p, settled.get(p.name), sub)
            if sub.mismatches:
                report.mismatches += [f"{m} [{p.claims[0][1]}]" for m in sub.mismatches]
            else:
                report.agree += 1
            _delete_pod(k8s, p.name, [f"{p.name}-c0"])
        _wait_released(k8s, timeout_s)
    return report


def cleanup_cel(admin: Any) -> None:
    try:
        client.CustomObjectsApi(admin).delete_cluster_custom_object(GROUP, VERSION,
                                                                    "deviceclasses", ANY_CLASS)
    except ApiException as e:
        if e.status != 404:
            raise
