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
