"""A double of the NVIDIA DRA driver's GPU kubelet plugin for the end-to-end tests, run as
the cluster admin (it stands for the driver's DaemonSet on every fake node).

What it publishes is :mod:`packing.dra.nvidia`'s: the DeviceClasses of the driver's chart
(``gpu.nvidia.com`` with ``extendedResourceName: nvidia.com/gpu``, ``mig.nvidia.com``),
and for each node the ResourceSlices of its GPUs, created as the kubelet's ResourceSlice
controller creates them: ``generateName`` ``<index>-gpu.nvidia.com-<node>-`` (the API
server adds the random suffix), pool named after the node, generation 1. A republish (a
device taint after a health event, say) updates the slices in place, keeping the
generation when one slice changes and bumping it otherwise, as the controller does.

No kubelet runs, so nothing prepares a claim by itself. :meth:`DraDriverDouble.prepare`
does what the driver's kubelet plugin does with DynamicMIG when claims are prepared and
released (call it, or :meth:`DraDriverDouble.serve` in a thread, once pods are bound): an
allocated claim holding a MIG device of a partitionable GPU gets its instance created at
that device's placement (recorded in :attr:`DraDriverDouble.instances` and in the claim's
``status.devices``), beside the GPU's other instances, which keep running; an instance
whose claim is gone or no longer allocated is destroyed (its counters were freed by the
deallocation). A GPU's MIG mode turns on with its first instance; after its last it
turns off on a Hopper part, while an Ampere part stays in MIG mode and is published
again without its whole device (the driver's rule for an A100 already in MIG mode). An
instance that would overlap one that exists, or a whole GPU allocated beside an
instance, is a failed prepare: recorded in :attr:`DraDriverDouble.errors`.

    python dra_driver_double.py --kubeconfig K --nodes 4 [--gpus 8] [--layout split]

creates ``dra-node-<i>`` Nodes with H100 GPUs (DynamicMIG layout) and their slices.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from packing.catalog import get_model  # noqa: E402
from packing.dra import nvidia  # noqa: E402

GROUP, VERSION = "resource.k8s.io", "v1"


@dataclass(frozen=True)
class Instance:
    """A MIG instance the double made: profile, placement, the claim's uid, the device."""

    profile: str
    start: int
    claim: str
    device: str


class DraDriverDouble:
    """Publishes NVIDIA-shaped DRA objects through the API (``api``: an ApiClient)."""

    def __init__(self, api: Any) -> None:
        self.objects = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        # node -> published slices (API JSON), index order
        self.published: dict[str, list[dict[str, Any]]] = {}
        # DynamicMIG: node -> its GPUs as published, and node -> minor -> start ->
        # the instance there (profile, the claim's uid); prepare failures.
        self.gpus: dict[str, list[nvidia.GpuSpec]] = {}
        self.layouts: dict[str, nvidia.Layout] = {}
        self.infos: dict[str, nvidia.DriverInfo | None] = {}
        self.instances: dict[str, dict[int, dict[int, Instance]]] = {}
        self.errors: list[str] = []
        self.created = 0
        self.destroyed = 0

    def install_classes(self) -> list[dict[str, Any]]:
        """The chart's DeviceClasses (created, or left as they are when present)."""
        out = []
        for body in nvidia.device_classes():
            try:
                out.append(self.objects.create_cluster_custom_object(
                    GROUP, VERSION, "deviceclasses", body))
            except ApiException as e:
                if e.status != 409:
                    raise
                out.append(self.objects.get_cluster_custom_object(
                    GROUP, VERSION, "deviceclasses", body["metadata"]["name"]))
        return out

    def publish(self, node: str, gpus: Sequence[nvidia.GpuSpec], *,
                layout: nvidia.Layout = nvidia.Layout.SPLIT,
                info: nvidia.DriverInfo | None = None) -> list[dict[str, Any]]:
        """Create (or update in place) the node's slices; the API's objects, index order."""
        self.gpus[node] = list(gpus)
        self.layouts[node] = layout
        self.infos[node] = info
        desired = nvidia.node_slices(node, gpus, layout=layout, info=info, name_suffix=None)
        current = self.published.get(node)
        if current is None or len(current) != len(desired):
            if current:
                self.unpublish(node)
            made = [self.objects.create_cluster_custom_object(GROUP, VERSION,
                                                              "resourceslices", body)
                    for body in desired]
            self.published[node] = made
            return made
        changed = [i for i, (have, want) in enumerate(zip(current, desired, strict=True))
                   if _body(have) != _body(want)]
        generation = current[0]["spec"]["pool"]["generation"]
        if len(changed) > 1:
            generation += 1
            changed = list(range(len(desired)))
        out = list(current)
        for i in changed:
            obj = dict(current[i])
            obj["spec"] = {**desired[i]["spec"],
                           "pool": {**desired[i]["spec"]["pool"], "generation": generation}}
            out[i] = self.objects.replace_cluster_custom_object(
                GROUP, VERSION, "resourceslices", obj["metadata"]["name"], obj)
        self.published[node] = out
        return out

    # -- DynamicMIG: instances made and destroyed as claims are prepared and released ----

    def _placements(self, node: str) -> dict[str, tuple[int, str, int]]:
        """The node's MIG device names -> (minor, profile, start), partitionable GPUs."""
        out: dict[str, tuple[int, str, int]] = {}
        if self.layouts.get(node) is not nvidia.Layout.SPLIT:
            return out
        for spec in self.gpus.get(node, ()):
            model = get_model(spec.model)
            if model.mig is None:
                continue
            for p in model.mig.profiles:
                pid, _ = nvidia.profile_info(model, p)
                for start in p.starts:
                    out[nvidia.mig_device_name(spec.minor, p.name, pid, start)] = (
                        spec.minor, p.name, start)
        return out

    def prepare(self) -> list[str]:
        """One pass of the kubelet plugins of every node this double serves (see the
        module docstring); what it did, one line per instance created or destroyed."""
        claims = self.objects.list_cluster_custom_object(GROUP, VERSION,
                                                         "resourceclaims")["items"]
        wanted: dict[str, dict[int, dict[int, Instance]]] = {}
        whole: dict[str, set[int]] = {}
        owners: dict[str, dict[str, Any]] = {}
        for c in claims:
            alloc = (c.get("status") or {}).get("allocation")
            if not alloc:
                continue
            uid = c["metadata"]["uid"]
            owners[uid] = c
            for r in (alloc.get("devices") or {}).get("results") or []:
                node = r["pool"]
                if r["driver"] != nvidia.DRIVER or node not in self.gpus:
                    continue
                place = self._placements(node).get(r["device"])
                if place is None:
                    if r["device"].startswith("gpu-") and "-mig-" not in r["device"]:
                        whole.setdefault(node, set()).add(int(r["device"].split("-")[1]))
                    continue
                minor, profile, start = place
                wanted.setdefault(node, {}).setdefault(minor, {})[start] = Instance(
                    profile, start, uid, r["device"])
        done: list[str] = []
        for node in sorted(self.gpus):
            have = self.instances.setdefault(node, {})
            want = wanted.get(node, {})
            for minor in sorted(set(have) | set(want)):
                now, then = have.get(minor, {}), want.get(minor, {})
                for start, inst in sorted(now.items()):
                    if then.get(start) != inst:
                        del now[start]
                        self.destroyed += 1
                        done.append(f"{node} GPU {minor}: destroyed {inst.profile}@{start}")
                for start, inst in sorted(then.items()):
                    if now.get(start) == inst:
                        continue
                    why = self._clash(node, minor, now, inst, whole.get(node, set()))
                    if why:
                        self.errors.append(why)
                        continue
                    now[start] = inst
                    self.created += 1
                    done.append(f"{node} GPU {minor}: created {inst.profile}@{start}")
                    self._status(owners[inst.claim], node, inst)
                if not now:
                    have.pop(minor, None)
                else:
                    have[minor] = now
            self._mig_mode(node)
        return done

    def _clash(self, node: str, minor: int, now: dict[int, Instance], inst: Instance,
               whole: set[int]) -> str:
        spec = next(g for g in self.gpus[node] if g.minor == minor)
        geom = get_model(spec.model).mig
        assert geom is not None
        size = geom.profile(inst.profile).memory_slices
        mine = set(range(inst.start, inst.start + size))
        for other in now.values():
            other_size = geom.profile(other.profile).memory_slices
            theirs = set(range(other.start, other.start + other_size))
            if mine & theirs:
                return (f"{node} GPU {minor}: {inst.profile}@{inst.start} overlaps "
                        f"{other.profile}@{other.start} (prepare fails)")
        if minor in whole:
            return f"{node} GPU {minor}: {inst.profile}@{inst.start} beside the whole GPU"
        return ""

    def _status(self, claim: dict[str, Any], node: str, inst: Instance) -> None:
        """The claim's ``status.devices``: the instance the driver made for it."""
        ns, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        entry = {"driver": nvidia.DRIVER, "pool": node, "device": inst.device,
                 "data": {"profile": inst.profile, "start": inst.start,
                          "instance": f"{node}/{inst.device}"}}
        with contextlib.suppress(ApiException):  # a claim deleted meanwhile
            self.objects.patch_namespaced_custom_object_status(
                GROUP, VERSION, ns, "resourceclaims", name, {"status": {"devices": [entry]}})

    def _mig_mode(self, node: str) -> None:
        """An Ampere GPU with an instance is in MIG mode for good: published again
        without its whole device. (A Hopper GPU's whole device stays published; its
        counters keep it from being allocated beside an instance.)"""
        specs = self.gpus[node]
        flips = [i for i, g in enumerate(specs)
                 if not g.mig_mode and g.model in nvidia.MIG_MODE_NEEDS_RESET
                 and self.instances.get(node, {}).get(g.minor)]
        if not flips:
            return
        for i in flips:
            specs[i] = replace(specs[i], mig_mode=True)
        self.publish(node, specs, layout=self.layouts[node], info=self.infos[node])

    def serve(self, stop: threading.Event, every_s: float = 0.5) -> None:
        """:meth:`prepare` every ``every_s`` until ``stop`` (run it in a thread)."""
        while not stop.wait(every_s):
            try:
                self.prepare()
            except ApiException as e:  # the API server restarting: the next pass retries
                self.errors.append(f"prepare pass failed: {e.status} {e.reason}")

    def unpublish(self, node: str) -> None:
        for obj in self.published.pop(node, []):
            with contextlib.suppress(ApiException):
                self.objects.delete_cluster_custom_object(
                    GROUP, VERSION, "resourceslices", obj["metadata"]["name"])

    def all_slices(self) -> list[dict[str, Any]]:
        """Every ResourceSlice in the cluster, as the API holds it."""
        return list(self.objects.list_cluster_custom_object(
            GROUP, VERSION, "resourceslices")["items"])


def _body(obj: dict[str, Any]) -> Any:
    spec = dict(obj["spec"])
    spec["pool"] = {k: v for k, v in spec["pool"].items() if k != "generation"}
    return _canonical(spec)


def _canonical(x: Any) -> Any:
    """Quantities as the API prints them may differ in form from what was sent: compare
    their values."""
    from packing.quantity import QuantityError, parse_quantity

    if isinstance(x, dict):
        return {k: _canonical(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_canonical(v) for v in x]
    if isinstance(x, str):
        with contextlib.suppress(QuantityError):
            return ("q", parse_quantity(x))
    return x


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dra_driver_double.py")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--model", default="H100-80GB")
    p.add_argument("--layout", choices=[x.value for x in nvidia.Layout], default="split")
    args = p.parse_args(argv)
    api = config.new_client_from_config(config_file=args.kubeconfig)
    double = DraDriverDouble(api)
    double.install_classes()
    for i in range(args.nodes):
        name = f"dra-node-{i}"
        with contextlib.suppress(ApiException):
            double.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": name, "labels": {"kubernetes.io/hostname": name}}})
        gpus = [nvidia.GpuSpec(g, args.model) for g in range(args.gpus)]
        double.publish(name, gpus, layout=nvidia.Layout(args.layout))
        print(f"{name}: {len(double.published[name])} slices", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
