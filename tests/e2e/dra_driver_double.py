"""A double of the NVIDIA DRA driver's GPU kubelet plugin for the end-to-end tests, run as
the cluster admin (it stands for the driver's DaemonSet on every fake node).

What it publishes is :mod:`packing.dra.nvidia`'s: the DeviceClasses of the driver's chart
(``gpu.nvidia.com`` with ``extendedResourceName: nvidia.com/gpu``, ``mig.nvidia.com``),
and for each node the ResourceSlices of its GPUs, created as the kubelet's ResourceSlice
controller creates them: ``generateName`` ``<index>-gpu.nvidia.com-<node>-`` (the API
server adds the random suffix), pool named after the node, generation 1. A republish (a
device taint after a health event, say) updates the slices in place, keeping the
generation when one slice changes and bumping it otherwise, as the controller does.

Nothing is prepared on the node: no kubelet runs, so claims are only allocated, never
prepared (``status.devices`` stays empty).

    python dra_driver_double.py --kubeconfig K --nodes 4 [--gpus 8] [--layout split]

creates ``dra-node-<i>`` Nodes with H100 GPUs (DynamicMIG layout) and their slices.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from packing.dra import nvidia  # noqa: E402

GROUP, VERSION = "resource.k8s.io", "v1"


class DraDriverDouble:
    """Publishes NVIDIA-shaped DRA objects through the API (``api``: an ApiClient)."""

    def __init__(self, api: Any) -> None:
        self.objects = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        # node -> published slices (API JSON), index order
        self.published: dict[str, list[dict[str, Any]]] = {}

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
