"""Steering kube-scheduler's DRA allocator off an idle DynamicMIG GPU end to end
(``scheduler.mig.compact.steer``, issue 34): on an opted-in node of two H100s published
by the NVIDIA DRA driver double with DynamicMIG, GPU 0 idle (MIG mode off) and GPU 1 in
MIG mode with one ASR instance and room for six more:

* the extender (compaction's step on the leader, ``--mig-compact``) fences the MIG
  devices of GPU 0 whose profiles GPU 1 has room for with NoSchedule DeviceTaintRules,
  never GPU 0's whole-GPU device nor any device of GPU 1;
* the real allocator skips them: six ASR pods get instances on GPU 1 (without the
  fences its first fit is GPU 0, turning its MIG mode on);
* once GPU 1 is full the fences are lifted, and a seventh ASR pod, submitted with the
  six and kept off GPU 0 while they stood, is allocated on GPU 0.

Real components: etcd, kube-apiserver, kube-scheduler v1.37.2 with the extender,
kube-controller-manager's resourceclaim controller; ``kubelet_double`` runs the pods;
the DRA driver double makes and destroys the instances. Bare pods: compaction moves only
pods a controller recreates, so nothing here is evicted.
"""

from __future__ import annotations

import time
from typing import Any

import dra_workload as W
from cluster import pending_report, wait_for
from conftest import Space
from kubernetes import client
from test_e2e_dra_compact import _fences, _gpu_of_pods, dynamic_mig_node


def _submit(core: Any, ns: str, pool: str, names: list[str]) -> None:
    for n in names:
        core.create_namespaced_pod(ns, W._pod(n, pool, "gpupack", template="mig-1g"))


# How long kube-scheduler may take to see a DeviceTaintRule after the API has it.
INFORMER_PAUSE_S = 2.0


def _devices(admin: Any, node: str, prefix: str, profile: str) -> set[str]:
    """Names of ``node``'s published devices of MIG ``profile`` whose names start with
    ``prefix`` (``gpu-0-``: GPU 0's)."""
    out = set()
    for s in client.CustomObjectsApi(admin).list_cluster_custom_object(
            W.GROUP, W.VERSION, "resourceslices")["items"]:
        if s["spec"].get("nodeName") != node:
            continue
        for d in s["spec"].get("devices", []):
            attrs = d.get("attributes", {})
            if (d["name"].startswith(prefix)
                    and attrs.get("profile", {}).get("string") == profile):
                out.add(d["name"])
    return out


def _fenced(admin: Any) -> set[str]:
    """Device names (``gpu-0-mig-...``) the fences of gpupack name."""
    return {f["metadata"]["annotations"]["gpupack.io/device"].rsplit("/", 1)[1]
            for f in _fences(admin)}


def test_an_idle_gpu_is_steered_off_while_a_gpu_in_mig_mode_has_room(
        space: Space, core: Any, admin: Any, kcm: None, stack: Any) -> None:
    with dynamic_mig_node(space, core, admin, stack, "steer") as (ns, pool, node, double):
        # Seven pods fill GPU 0 (the allocator's first fit), an eighth opens GPU 1;
        # the seven end, so GPU 0 leaves MIG mode (Hopper) and is idle.
        fill = [f"fill-{i}" for i in range(7)]
        _submit(core, ns, pool, fill)
        try:
            wait_for(lambda: len(_gpu_of_pods(admin, ns)) == 7, 90, "7 fill pods")
        except AssertionError:
            raise AssertionError(pending_report(core, ns)) from None
        _submit(core, ns, pool, ["lone"])
        wait_for(lambda: "lone" in _gpu_of_pods(admin, ns), 60, "the lone pod")
        assert _gpu_of_pods(admin, ns)["lone"] == "gpu-1"
        for name in fill:
            core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        wait_for(lambda: not double.instances.get(node.name, {}).get(0), 60,
                 "GPU 0's instances destroyed")
        # GPU 1 has room: GPU 0's MIG devices of those profiles are fenced. The step
        # writes its ~20 rules one by one; the pods come only once every 1g.10gb device
        # of GPU 0 is fenced (a pod sent after the first rule found the next device open
        # and took GPU 0: CI, 2026-12-06), and after a pause for kube-scheduler's
        # DeviceTaintRule informer, a watch apart from the pods'.
        asr_on_0 = _devices(admin, node.name, "gpu-0-", "1g.10gb")
        assert len(asr_on_0) == 7, sorted(asr_on_0)
        steered = wait_for(lambda: (lambda f: f if asr_on_0 <= f else None)(_fenced(admin)),
                           30, "all of GPU 0's 1g.10gb devices fenced")
        time.sleep(INFORMER_PAUSE_S)
        # Six pods fill GPU 1; a seventh finds GPU 1 full and GPU 0 fenced until the
        # next step lifts the fences.
        more = [f"asr-{i}" for i in range(7)]
        _submit(core, ns, pool, more)
        try:
            wait_for(lambda: all(p in _gpu_of_pods(admin, ns) for p in more), 90,
                     "the seven ASR pods allocated")
        except AssertionError:
            raise AssertionError(f"fences {sorted(_fenced(admin))}\n"
                                 + pending_report(core, ns)) from None
        on = _gpu_of_pods(admin, ns)
        wait_for(lambda: _fenced(admin) == set(), 30, "the fences lifted")
        errors = list(double.errors)
    # Only MIG devices of GPU 0: its whole device and GPU 1 left alone.
    assert steered and all(d.startswith("gpu-0-mig-") for d in steered), sorted(steered)
    assert "gpu-0" not in steered
    # 7g and 4g need a whole GPU: GPU 1 in use has no room for them, so not fenced.
    assert not any("7g80gb" in d or "4g40gb" in d for d in steered), sorted(steered)
    gpus = sorted(on[p] for p in more)
    assert gpus == ["gpu-0"] + ["gpu-1"] * 6, on
    assert on["lone"] == "gpu-1"
    assert errors == [], errors
