"""gpupack's model of the DRA allocator (packing/dra/allocator.py) against kube-scheduler
v1.37.2 itself: hundreds of random claims over a fleet of NVIDIA-shaped nodes (whole GPUs,
DynamicMIG placements with shared counters, static MIG, shared devices with consumable
capacity, device taints and a DeviceTaintRule), each pod scheduled by the plain
kube-scheduler; for every claim the devices the model predicted are exactly the devices
the scheduler wrote into ``status.allocation``, and every pod predicted not to fit (or to
make the scheduler fail) did. See tests/e2e/dra_differential.py for the fleet and the
claims; ``bench/dra_agreement.py`` runs it at any size."""

from __future__ import annotations

import json
from typing import Any

import controlplane
import dra_differential

from packing.dra.allocator import ASSUMED_GATES


def test_scheduler_runs_the_gates_the_model_assumes(stack: controlplane.Stack) -> None:
    """The model is of the allocator variant these gates select ("incubating"); a stack
    started with other gates would make its agreement meaningless."""
    gates = dra_differential.scheduler_gates(stack)
    assert {g: gates.get(g) for g in ASSUMED_GATES} == ASSUMED_GATES


def test_model_predicts_every_allocation_of_kube_scheduler(
        stack: controlplane.Stack, admin: Any, space: Any) -> None:
    ns = space.namespace()
    prefix = f"{space.name}-n"[:40]
    with controlplane.claim_controller(stack):
        try:
            report = dra_differential.run(admin, ns, prefix=prefix, nodes=22, claims=300)
        finally:
            dra_differential.cleanup(admin, ns, prefix)
    print(json.dumps({"agreement": report.as_json()}, indent=1))
    assert report.mismatches == [], "\n".join(report.mismatches[:20])
    assert report.allocated >= 300, report.as_json()
    assert report.same_device == report.allocated
    assert report.agree_pods == report.pods
    # The run exercised what it is meant to: refusals and errors as well as allocations.
    assert report.verdicts["unschedulable"] > 0 and report.verdicts["error"] > 0, report.verdicts


def test_cel_subset_matches_kube_scheduler(stack: controlplane.Stack, admin: Any,
                                           space: Any) -> None:
    """Random selectors built from what DeviceClasses and claims use (attributes, capacity
    with quantities, semvers, has/in, &&, ||, !, ?:, errors on missing attributes), each as
    an ``All`` request on a node of one H100: the scheduler allocates exactly the devices
    packing.dra.cel matches, refuses when none does, and fails the pod on a runtime error
    where the model says "error"."""
    ns = space.namespace()
    prefix = f"{space.name}-c"[:40]
    with controlplane.claim_controller(stack):
        try:
            report = dra_differential.run_cel(admin, ns, prefix=prefix, count=60)
        finally:
            dra_differential.cleanup(admin, ns, prefix)
            dra_differential.cleanup_cel(admin)
    print(json.dumps({"cel": {"expressions": report.expressions, "agree": report.agree,
                              "rejected": report.rejected,
                              "outcomes": dict(report.outcomes)}}, indent=1))
    assert report.mismatches == [], "\n".join(report.mismatches[:20])
    assert report.expressions >= 60 and report.agree == report.expressions
    assert report.outcomes["allocated"] and report.outcomes["unschedulable"] and (
        report.outcomes["error"]), report.outcomes


def test_driver_double_republishes_as_the_slice_controller_does(
        stack: controlplane.Stack, admin: Any, space: Any) -> None:
    """A health event taints a GPU: the double updates that one slice in place (same name,
    same pool generation, as the kubelet's ResourceSlice controller does for a single
    changed slice), kube-scheduler stops allocating the device at once, and the model,
    reading the same objects, predicts the other GPU."""
    from dra_driver_double import DraDriverDouble

    from packing.dra import nvidia

    ns = space.namespace()
    node = f"{space.name}-h"[:50]
    double = DraDriverDouble(admin)
    double.install_classes()
    dra_differential.create_nodes(double.core, [dra_differential.NodeSpec(
        node, {"e2e.gpupack.io/dra": node}, {})])
    gpus = [nvidia.GpuSpec(g, "H100-80GB") for g in range(2)]
    try:
        before = double.publish(node, gpus)
        taint = {"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
        after = double.publish(node, gpus, info=nvidia.DriverInfo(taints={"gpu-0": [taint]}))
        assert [s["metadata"]["name"] for s in after] == [s["metadata"]["name"]
                                                           for s in before]
        assert {s["spec"]["pool"]["generation"] for s in after} == {1}
        assert after[1]["metadata"]["resourceVersion"] != before[1]["metadata"]["resourceVersion"]
        with controlplane.claim_controller(stack):
            plan = dra_differential.NodePlan(node, "h100", tuple(gpus), nvidia.Layout.SPLIT,
                                             nvidia.DriverInfo())
            pod = dra_differential._PodPlan("whole", plan, [("c0", "gpu", {"devices": {
                "requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": nvidia.GPU_CLASS}}]}}, False)])
            k8s = dra_differential._Cluster(admin, ns)
            import time
            time.sleep(1.0)  # the scheduler's slice tracker takes the update in
            dra_differential._predict(k8s, [pod])
            assert pod.prediction is not None and pod.prediction.devices == (
                (f"{nvidia.DRIVER}/{node}/gpu-1",),)
            dra_differential._submit(k8s, [pod])
            settled = dra_differential._wait(k8s, ["whole"], 60)
            report = dra_differential.Report()
            dra_differential._compare(k8s, pod, settled.get("whole"), report)
            assert report.mismatches == [] and report.same_device == 1
    finally:
        dra_differential.cleanup(admin, ns, node)
