"""MIG density through DynamicMIG on the real control plane (issue 34): H100s whose MIG
instances the NVIDIA DRA driver makes one claim at a time (the driver double models
DynamicMIG: an instance created at its claim's placement when prepared, destroyed when
released, the GPU's other instances running on).

Through kube-scheduler v1.37.2 with gpupack's extender (its DRA participant hands the
scheduler the node whose allocator fit ranks best: ``packing.dra.mig_fit``):

* 20 ASR pods (a claim for a ``1g.10gb`` partition each) are allocated and bound on the
  layout bound's GPU count (``packing.mig.layout.fewest_layouts``: 3 GPUs), every
  instance made by the driver double without a clash;
* a GPU with busy slices takes a new slice beside them: after two ASR pods of the third
  GPU end (their instances destroyed), a ``3g.40gb`` pod gets the placement at memory
  slice 4 of that GPU, next to the four ``1g`` instances still running there (the same
  claims, never re-made), not an idle GPU.

The same 20 pods through plain kube-scheduler, on an identical pool, for contrast (its
default scoring spreads them by CPU over the nodes, each node's first fit filling its
own GPUs)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import dra_workload as W
from cluster import pending_report
from conftest import Space
from controlplane import PLAIN_SCHEDULER_NAME, claim_controller
from dra_driver_double import DraDriverDouble
from kubernetes import client

from packing.catalog import get_model
from packing.dra import nvidia
from packing.mig.layout import fewest_layouts

ASR = 20
TEMPLATES = (("mig-1g", W.MIG_1G),
             ("mig-3g", W._claim_spec(nvidia.MIG_CLASS, [f"{W.ATTR}.profile == '3g.40gb'"])))


def _pool(prefix: str) -> list[W.DraNode]:
    return [W.DraNode(f"{prefix}-dyn-{i}", {W.POOL: prefix},
                      tuple(nvidia.GpuSpec(g, "H100-80GB") for g in range(4)),
                      layout=nvidia.Layout.SPLIT) for i in range(2)]


def _submit(admin: Any, ns: str, pool: str, scheduler: str, names: list[str],
            template: str) -> None:
    core = client.CoreV1Api(admin)
    for n in names:
        core.create_namespaced_pod(ns, W._pod(n, pool, scheduler, template=template))


def _allocations(admin: Any, ns: str) -> dict[str, tuple[str, str]]:
    """Pod name -> (node, device) of its claim's allocation."""
    out = {}
    for c in W.claims_in(admin, ns):
        alloc = (c.get("status") or {}).get("allocation")
        owner = next((r["name"] for r in c["metadata"].get("ownerReferences") or []
                      if r["kind"] == "Pod"), None)
        if alloc and owner:
            r = alloc["devices"]["results"][0]
            out[owner] = (r["pool"], r["device"])
    return out


def _gpus(allocs: dict[str, tuple[str, str]]) -> set[tuple[str, str]]:
    return {(node, W._gpu_of(device)) for node, device in allocs.values()}


def _wait(cond: Any, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_dynamic_mig_asr_on_the_layout_bound_and_a_slice_beside_busy_ones(
        space: Space, admin: Any, core: Any, stack: Any, capsys: Any) -> None:
    ours, plain = space.name, f"{space.name}-p"
    ns, plain_ns = space.namespace(), space.namespace("-plain")
    double = DraDriverDouble(admin)
    pools = {p: _pool(p) for p in (ours, plain)}
    stop = threading.Event()
    server = threading.Thread(target=double.serve, args=(stop,), daemon=True)
    objects = client.CustomObjectsApi(admin)
    geom = get_model("H100-80GB").mig
    assert geom is not None
    bound = len(fewest_layouts(geom, {"1g.10gb": ASR}))
    try:
        with claim_controller(stack):
            for nodes in pools.values():
                space.nodes += W.publish(admin, nodes, double)
            server.start()
            for namespace in (ns, plain_ns):
                for name, spec in TEMPLATES:
                    objects.create_namespaced_custom_object(
                        W.GROUP, W.VERSION, namespace, "resourceclaimtemplates",
                        {"apiVersion": f"{W.GROUP}/{W.VERSION}", "kind": "ResourceClaimTemplate",
                         "metadata": {"name": name}, "spec": {"spec": spec}})
            asr = [f"asr-{i}" for i in range(ASR)]
            _submit(admin, ns, ours, "gpupack", asr, "mig-1g")
            placed, _ = W.settle(admin, ns, ASR, 180)
            _wait(lambda: len(_allocations(admin, ns)) == ASR, 60, "20 allocations")
            _wait(lambda: double.created >= ASR, 30, "the double to make 20 instances")
            first = _allocations(admin, ns)
            _submit(admin, plain_ns, plain, PLAIN_SCHEDULER_NAME, asr, "mig-1g")
            plain_placed, _ = W.settle(admin, plain_ns, ASR, 120)
            _wait(lambda: len(_allocations(admin, plain_ns)) == ASR, 60, "plain allocations")
            theirs = _allocations(admin, plain_ns)

            # Two ASR pods of the least full GPU end: their instances are destroyed.
            by_gpu: dict[tuple[str, str], list[tuple[int, str]]] = {}
            for pod, (node, device) in first.items():
                by_gpu.setdefault((node, W._gpu_of(device)), []).append(
                    (int(device.rsplit("-", 1)[1]), pod))
            target = min(by_gpu, key=lambda k: len(by_gpu[k]))
            leaving = [pod for start, pod in sorted(by_gpu[target]) if start >= 4]
            kept = {pod for start, pod in by_gpu[target] if start < 4}
            node, gpu = target
            running_before = {s: i for s, i in double.instances[node][int(gpu[4:])].items()
                              if s < 4}
            for pod in leaving:
                core.delete_namespaced_pod(pod, ns, grace_period_seconds=0)
            _wait(lambda: all(s < 4 for s in double.instances[node][int(gpu[4:])]), 60,
                  "the instances of the pods that ended to be destroyed")
            _submit(admin, ns, ours, "gpupack", ["mid-0"], "mig-3g")
            W.settle(admin, ns, ASR - len(leaving) + 1, 120)
            _wait(lambda: "mid-0" in _allocations(admin, ns), 60, "the 3g allocation")
            mid = _allocations(admin, ns)["mid-0"]
            _wait(lambda: 4 in double.instances[node].get(int(gpu[4:]), {}), 30,
                  "the 3g instance")
            after = double.instances[node][int(gpu[4:])]
            errors = list(double.errors)
    finally:
        stop.set()
        server.join(timeout=5)
        W.cleanup(admin, [ns, plain_ns], [n.name for v in pools.values() for n in v])
    with capsys.disabled():
        print("\n  e2e DynamicMIG, 20 ASR pods: " + json.dumps({
            "layout bound (GPUs)": bound, "gpupack GPUs": len(_gpus(first)),
            "plain kube-scheduler GPUs": len(_gpus(theirs)),
            "3g pod": f"{mid[0]}/{mid[1]}", "beside": sorted(
                f"{i.profile}@{s}" for s, i in after.items()),
            "instances created": double.created, "destroyed": double.destroyed}))
    unbound = [p["metadata"]["name"] for p in placed if not p["spec"].get("nodeName")]
    assert not unbound, f"pending: {unbound}; " + pending_report(core, ns)
    assert errors == [], errors
    assert len(_gpus(first)) == bound == 3, sorted(_gpus(first))
    # Plain kube-scheduler binds them too, on no fewer GPUs.
    assert sum(1 for p in plain_placed if p["spec"].get("nodeName")) == ASR
    assert len(_gpus(theirs)) >= bound
    # The busy GPU took the 3g slice beside its running 1g instances, untouched.
    assert mid == (node, f"{gpu}-mig-3g40gb-9-4"), (mid, target)
    assert {s: i for s, i in after.items() if s < 4} == running_before
    assert len(running_before) == len(kept) == 4
    assert after[4].profile == "3g.40gb"
