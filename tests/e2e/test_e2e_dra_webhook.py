"""The webhook on DRA nodes (docs/dra.md, "The webhook on DRA nodes"), through the real
kube-scheduler v1.37.2 and its DRA allocator: nodes whose GPUs are ResourceSlices of the
NVIDIA driver double (two DynamicMIG H100s; an L40S published shareable, the driver's
ConsumableShares; an L40S without), gpupack's DeviceClasses from the chart. Sized ASR
and TTS pods are admitted with their gpupack annotations only; kube-scheduler makes each
pod's claim from the class that serves the resource the webhook wrote (KEP-5004) and the
allocator hands out the device: for every pod, the smallest that holds it (the smallest
MIG profile of the H100, a share of the L40S, a whole L40S last). A bad annotation is
refused by the API server with the webhook's message naming the field. The pods go to
gpupack's scheduler profile (the webhook names it), whose extender places pods on DRA
nodes by the allocator model; the alternative mechanism's pods name the plain one."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from cluster import (
    H100,
    L40S,
    POOL,
    NodeSpec,
    create_nodes,
    h100_mig,
    pod,
    wait_for,
    wait_for_webhook,
)
from conftest import Space
from controlplane import Stack, claim_controller, render_chart
from dra_differential import _Cluster
from dra_driver_double import DraDriverDouble
from kubernetes import client
from kubernetes.client.rest import ApiException

from kube import annotations as A
from packing.catalog import get_model, smallest_fitting_profile
from packing.dra import nvidia

GROUP, VERSION = "resource.k8s.io", "v1"
PLAIN = "plain-kube-scheduler"
CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
MIB = 1 << 20


@pytest.fixture(scope="module")
def device_classes(stack: Stack, admin: Any) -> Iterator[list[dict[str, Any]]]:
    """gpupack's DeviceClasses as the chart renders them, for this module's tests."""
    objects = client.CustomObjectsApi(admin)
    classes = [o for o in render_chart("eA==") if o["kind"] == "DeviceClass"]
    assert classes, "the chart renders no DeviceClass"
    DraDriverDouble(admin).install_classes()
    for body in classes:
        try:
            objects.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", body)
        except ApiException as e:
            if e.status != 409:
                raise
    try:
        yield classes
    finally:
        for body in classes:
            with contextlib.suppress(ApiException):
                objects.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses",
                                                     body["metadata"]["name"])


def _dra_node(name: str, pool: str, product: str) -> NodeSpec:
    """A node whose GPUs are ResourceSlices only: GPU Feature Discovery's product label,
    no GPU in its allocatable."""
    return NodeSpec(name, {POOL: pool, "nvidia.com/gpu.product": product}, {})


class _Api(_Cluster):
    """The differential test's API helpers, and what this module reads of pods."""

    def allocated(self, pod_name: str) -> dict[str, Any]:
        """The device the scheduler allocated to the pod's extended-resource claim, as
        the slices publish it."""
        for c in self.objects.list_namespaced_custom_object(GROUP, VERSION, self.ns,
                                                            "resourceclaims")["items"]:
            owners = c["metadata"].get("ownerReferences") or []
            if c["metadata"].get("annotations", {}).get(CLAIM_ANNOTATION) == "true" and any(
                    o["name"] == pod_name for o in owners):
                (result,) = c["status"]["allocation"]["devices"]["results"]
                for s in self.list("resourceslices"):
                    if s["spec"]["pool"]["name"] != result["pool"]:
                        continue
                    for d in s["spec"].get("devices") or []:
                        if d["name"] == result["device"]:
                            return {"node": s["spec"]["nodeName"], **d}
                raise AssertionError(f"{result} is in no slice")
        raise AssertionError(f"pod {pod_name} has no allocated extended-resource claim")

    def pending(self, name: str, timeout_s: float = 30) -> str:
        """The message of the pod's PodScheduled=False condition."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            p = self.core.read_namespaced_pod(name, self.ns)
            assert not p.spec.node_name, f"pod {name} bound to {p.spec.node_name}"
            for c in p.status.conditions or []:
                if c.type == "PodScheduled" and c.status == "False" and c.message:
                    return str(c.message)
            time.sleep(0.2)
        raise AssertionError(f"pod {name}: no PodScheduled condition in {timeout_s} s")

    def bound(self, name: str, timeout_s: float = 60) -> str:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            p = self.core.read_namespaced_pod(name, self.ns)
            if p.spec.node_name:
                return str(p.spec.node_name)
            time.sleep(0.2)
        conds = [(c.reason, c.message) for c in p.status.conditions or []]
        raise AssertionError(f"pod {name} not bound in {timeout_s} s: {conds}")


def _create(api: _Api, body: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The pod created through the real webhook: its decision (gpupack.io/decision) and
    the pod as stored."""
    made = api.core.create_namespaced_pod(api.ns, body)
    decision = json.loads(made.metadata.annotations["gpupack.io/decision"])
    return decision, made


def _until_decided(api: _Api, body: dict[str, Any], words: str) -> dict[str, Any]:
    """A dry-run create of ``body`` until the webhook's decision says ``words`` (its view
    has caught up with the claims allocated last)."""
    def decided() -> Any:
        out = api.core.create_namespaced_pod(api.ns, body, dry_run="All")
        doc = json.loads(out.metadata.annotations["gpupack.io/decision"])
        return doc if words in doc["reason"] else None

    return dict(wait_for(decided, 30, f"the webhook to say {words!r}"))


def _attr(d: Mapping[str, Any], name: str) -> Any:
    value = d.get("attributes", {}).get(name, {})
    return next(iter(value.values()), None)


SIZED: Sequence[tuple[str, dict[str, str], str]] = (
    # name, annotations, the device the allocator must hand out: the smallest MIG profile
    # of an H100 that holds the pod, or a share of the L40S
    ("asr-0", {"gpupack.io/class": "asr"}, "1g.10gb"),
    ("tts-0", {"gpupack.io/class": "tts"}, "1g.10gb"),
    ("emb-12", {"gpupack.io/gpu-memory": "12Gi"}, "1g.20gb"),
    ("asr-1", {"gpupack.io/class": "asr", "gpupack.io/gpu-compute": "0.25"}, "2g.20gb"),
    ("tts-30", {"gpupack.io/gpu-memory": "30Gi"}, "3g.40gb"),
    ("big-60", {"gpupack.io/gpu-memory": "60Gi"}, "7g.80gb"),
    ("shared-8", {"gpupack.io/gpu-memory": "8Gi", "gpupack.io/isolation": "shared"},
     "share"),
)


def test_sized_pods_get_the_smallest_dra_device_that_holds_them(
        space: Space, admin: Any, device_classes: list[dict[str, Any]]) -> None:
    ns = space.namespace()
    api = _Api(admin, ns)
    double = DraDriverDouble(admin)
    h, s, w = (f"{space.name}-{k}"[:50] for k in ("h", "s", "w"))
    space.nodes += create_nodes(api.core, [_dra_node(h, space.name, H100),
                                           _dra_node(s, space.name, L40S),
                                           _dra_node(w, f"{space.name}-w", L40S)])
    try:
        double.publish(h, [nvidia.GpuSpec(g, "H100-80GB") for g in range(3)])
        double.publish(s, [nvidia.GpuSpec(0, "L40S")],
                       info=nvidia.DriverInfo(consumable_shares="4"))
        double.publish(w, [nvidia.GpuSpec(0, "L40S")])
        # Until the webhook's view has the DRA nodes (their slices and classes).
        wait_for_webhook(api.core, ns, pod("probe", annotations={
            "gpupack.io/gpu-memory": "60Gi"}, pool=space.name), "nvidia.com/mig-7g.80gb")
        for name, ann, want in SIZED:
            body = pod(name, annotations=ann, pool=space.name)
            decision, made = _create(api, body)
            assert made.spec.scheduler_name == "gpupack"
            limits = made.spec.containers[0].resources.limits
            node = api.bound(name)
            device = api.allocated(name)
            assert device["node"] == node
            if want != "share":
                memory = A.gpu_memory_mib(made.metadata.annotations) or 0
                compute = A.gpu_compute_milli(made.metadata.annotations) or 0
                smallest = smallest_fitting_profile(get_model("H100-80GB"), memory, compute)
                assert smallest is not None and smallest.name == want
                assert limits == {smallest.resource_name: "1"}, limits
                assert (node, _attr(device, "type"), _attr(device, "profile")) == (
                    h, "mig", want), (name, decision["reason"], device["name"])
            else:
                assert limits == {"nvidia.com/gpu.shared": "1"}, limits
                assert (node, _attr(device, "type"), device.get("allowMultipleAllocations")
                        ) == (s, "gpu", True), (name, decision["reason"], device["name"])
        # First fit packs the H100s in order: gpu-0 takes the 1g, 1g.20gb and 2g slices,
        # the 3g.40gb no longer fits there and opens gpu-1, the 7g.80gb gpu-2.
        assert [api.allocated(n)["name"].split("-mig-")[0] for n, _a, _k in SIZED[:6]] == [
            "gpu-0", "gpu-0", "gpu-0", "gpu-0", "gpu-1", "gpu-2"]
        # Nothing left that holds another 60Gi: the webhook says the pod waits for its
        # slice, and the scheduler keeps it pending.
        body = pod("big-60b", annotations={"gpupack.io/gpu-memory": "60Gi"}, pool=space.name)
        _until_decided(api, body, "the pod waits for one")
        decision, _made = _create(api, body)
        assert decision["profile"] == "7g.80gb", decision
        assert "cannot allocate all claims" in api.pending("big-60b")
        # The last resort: on the pool of the plain L40S, a whole GPU.
        body = pod("whole-8", annotations={"gpupack.io/gpu-memory": "8Gi"},
                   pool=f"{space.name}-w")
        decision, made = _create(api, body)
        assert decision["kind"] == "gpu", decision
        assert made.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
        assert api.bound("whole-8") == w
        device = api.allocated("whole-8")
        assert (device["name"], _attr(device, "type")) == ("gpu-0", "gpu")
    finally:
        for node in (h, s, w):
            double.unpublish(node)


def test_bad_annotation_refused_naming_the_field(space: Space, admin: Any,
                                                 device_classes: list[dict[str, Any]]
                                                 ) -> None:
    ns = space.namespace()
    core = client.CoreV1Api(admin)
    bad = pod("bad", annotations={"gpupack.io/gpu-memory": "8Gi",
                                  "gpupack.io/isolation": "vm"})
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, bad)
    text = str(err.value.body)
    assert "metadata.annotations.gpupack.io/isolation" in text and "'vm'" in text, text


def test_the_alternative_a_claim_template_with_first_available(
        stack: Stack, space: Space, admin: Any, device_classes: list[dict[str, Any]]
) -> None:
    """What the mechanism not chosen (docs/dra.md, "Why DeviceClasses and not claim
    templates") does on the same allocator: a ResourceClaimTemplate whose request lists
    MIG profiles small to large, then a share with a memory request, gets the smallest
    profile free (kube-scheduler's DynamicResources score prefers the node where an earlier
    subrequest fits), the share once no profile is left; where the driver accounts
    memory (ConsumableShares ``memory``) shares of 12, 16 and 16Gi fit one L40S, where a
    share through an extended resource (no capacity request: the policy's default, the
    whole memory) no longer does."""
    ns = space.namespace()
    api = _Api(admin, ns)
    double = DraDriverDouble(admin)
    h, s = (f"{space.name}-{k}"[:50] for k in ("h", "s"))
    space.nodes += create_nodes(api.core, [_dra_node(h, space.name, H100),
                                           _dra_node(s, space.name, L40S)])
    mig = "device.attributes['gpu.nvidia.com']"

    def sub(name: str, klass: str, expr: str | None = None,
            memory: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "deviceClassName": klass}
        if expr:
            out["selectors"] = [{"cel": {"expression": expr}}]
        if memory:
            out["capacity"] = {"requests": {"memory": memory}}
        return out

    def template(name: str, subs: list[dict[str, Any]]) -> None:
        api.create("resourceclaimtemplates", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "firstAvailable": subs}]}}}})

    def claim_pod(name: str, tmpl: str, pool: str) -> None:
        body = pod(name, pool=pool, scheduler=PLAIN)
        body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": tmpl}]
        body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
        api.core.create_namespaced_pod(ns, body)

    def device_of(name: str) -> str:
        for c in api.objects.list_namespaced_custom_object(GROUP, VERSION, ns,
                                                           "resourceclaims")["items"]:
            owners = c["metadata"].get("ownerReferences") or []
            if any(o["name"] == name for o in owners) and c.get("status", {}).get(
                    "allocation"):
                results = c["status"]["allocation"]["devices"]["results"]
                return f"{results[0]['request']}:{results[0]['device']}"
        raise AssertionError(f"{name}: no allocated claim")

    try:
        double.publish(h, [nvidia.GpuSpec(0, "H100-80GB")])
        double.publish(s, [nvidia.GpuSpec(0, "L40S")],
                       info=nvidia.DriverInfo(consumable_shares="memory"))
        time.sleep(1.0)
        ladder = [sub(p.replace(".", "-"), "mig.nvidia.com", f"{mig}.profile == '{p}'")
                  for p in ("1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb")]
        template("twelve", [*ladder, sub("share", "gpupack-gpu-shared", memory="12Gi")])
        template("sixteen", [sub("share", "gpupack-gpu-shared", memory="16Gi")])
        with claim_controller(stack):
            got = []
            for i in range(5):
                claim_pod(f"t{i}", "twelve", space.name)
                got.append((api.bound(f"t{i}"), device_of(f"t{i}")))
            # Four 1g.20gb placements, then the 2g/3g/7g ones overlap them: the share.
            assert got == [(h, f"gpu/1g-20gb:gpu-0-mig-1g20gb-15-{i}") for i in (0, 2, 4, 6)
                           ] + [(s, "gpu/share:gpu-0")], got
            for i in range(2):
                claim_pod(f"m{i}", "sixteen", space.name)
                assert api.bound(f"m{i}") == s
            # Through the extended resource the share's default is the whole memory.
            adm = pod("ext", limits={"nvidia.com/gpu.shared": "1"}, pool=space.name,
                      scheduler=PLAIN)
            adm["metadata"]["annotations"] = {}
            api.core.create_namespaced_pod(ns, adm)
            assert "cannot allocate all claims" in api.pending("ext")
    finally:
        for node in (h, s):
            double.unpublish(node)


def test_mixed_pool_device_plugin_and_dra_nodes(space: Space, admin: Any,
                                                device_classes: list[dict[str, Any]]) -> None:
    """One pool, a device-plugin MIG node with one free 3g.40gb and a DRA H100: the
    webhook counts both, writes the same resource for either, and kube-scheduler serves
    it per node (KEP-5004): from the device plugin where the node's allocatable has it
    (no claim), from the DRA class where it has not. An 8Gi pod gets a 1g.10gb, which
    only the DRA node has; two 30Gi pods get the two 3g.40gb left, one on each node; the
    third waits."""
    ns = space.namespace()
    api = _Api(admin, ns)
    double = DraDriverDouble(admin)
    dp, dra = (f"{space.name}-{k}"[:50] for k in ("dp", "dra"))
    space.nodes += create_nodes(api.core, [h100_mig(dp, space.name, {"3g.40gb": 1}),
                                           _dra_node(dra, space.name, H100)])
    try:
        double.publish(dra, [nvidia.GpuSpec(0, "H100-80GB")])
        wait_for_webhook(api.core, ns, pod("probe", annotations={
            "gpupack.io/gpu-memory": "8Gi"}, pool=space.name), "nvidia.com/mig-1g.10gb")
        _create(api, pod("p8", annotations={"gpupack.io/gpu-memory": "8Gi"}, pool=space.name))
        assert api.bound("p8") == dra
        assert api.allocated("p8")["name"] == "gpu-0-mig-1g10gb-19-0"
        where = {}
        for name in ("q1", "q2"):
            body = pod(name, annotations={"gpupack.io/gpu-memory": "30Gi"}, pool=space.name)
            _until_decided(api, body, "free on H100-80GB")
            decision, made = _create(api, body)
            assert made.spec.containers[0].resources.limits == {
                "nvidia.com/mig-3g.40gb": "1"}, decision
            where[name] = api.bound(name)
        assert sorted(where.values()) == sorted([dp, dra]), where
        on_dra = next(n for n, node in where.items() if node == dra)
        on_dp = next(n for n, node in where.items() if node == dp)
        assert api.allocated(on_dra)["name"] == "gpu-0-mig-3g40gb-9-4"
        with pytest.raises(AssertionError, match="no allocated extended-resource claim"):
            api.allocated(on_dp)  # the device plugin's slice: no claim
        body = pod("q3", annotations={"gpupack.io/gpu-memory": "30Gi"}, pool=space.name)
        _until_decided(api, body, "the pod waits for one")
        _create(api, body)
        api.pending("q3")
    finally:
        double.unpublish(dra)
