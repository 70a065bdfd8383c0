"""Fences: NoSchedule DeviceTaintRules that keep kube-scheduler's DRA allocator off the
devices of DynamicMIG GPUs that MIG compaction drains (docs/mig.md, "Compaction on
DynamicMIG nodes"), and off the MIG devices of idle DynamicMIG GPUs while a GPU in MIG
mode on the same node has room for their profile (``scheduler.mig.compact.steer``: the
whole-GPU device stays untainted).

On a DRA node the allocator, not gpupack, picks the device: a replacement pod would get
its first fit, which can be a placement of the very GPU being emptied. A device taint is
the API's own way to keep it off (``resource.k8s.io/v1`` DeviceTaintRule; its selector
names a driver, a pool and a device, nothing wider that is narrower than a node, so a
GPU takes one rule per device). Every rule gpupack writes carries the label
``gpupack.io/fence: mig-drain`` and is named after a hash of the device id, so the set
can be brought to what the drains in flight want in one pass: missing ones created,
others deleted (a rule a past leader left is deleted by the next leader's first pass).

Pure apart from :class:`ApiFences`, which does the API calls.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

log = logging.getLogger("gpupack.kube.mig")

GROUP, VERSION, PLURAL = "resource.k8s.io", "v1", "devicetaintrules"
LABEL, VALUE = "gpupack.io/fence", "mig-drain"
TAINT_KEY = "gpupack.io/mig-drain"
DEVICE_ANNOTATION = "gpupack.io/device"


def rule_name(device_id: str) -> str:
    """The rule of device ``driver/pool/device``: a DNS name whatever the node's name."""
    return "gpupack-drain-" + hashlib.sha256(device_id.encode()).hexdigest()[:20]


def rule_object(device_id: str) -> dict[str, Any]:
    """The DeviceTaintRule fencing one device (``driver/pool/device``)."""
    driver, pool, device = device_id.split("/", 2)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DeviceTaintRule",
            "metadata": {"name": rule_name(device_id), "labels": {LABEL: VALUE},
                         "annotations": {DEVICE_ANNOTATION: device_id}},
            "spec": {"deviceSelector": {"driver": driver, "pool": pool, "device": device},
                     "taint": {"key": TAINT_KEY, "effect": "NoSchedule"}}}


def plan(wanted: Iterable[str], existing: Iterable[str]) -> tuple[list[str], list[str]]:
    """(device ids whose rule to create, rule names to delete)."""
    want = {rule_name(d): d for d in wanted}
    have = set(existing)
    return ([d for n, d in sorted(want.items()) if n not in have],
            sorted(have - set(want)))


class Fences(Protocol):
    def sync(self, devices: Iterable[str]) -> str | None:
        """Fence exactly ``devices`` (ids); None when done, else why not."""


class ApiFences:
    """The fences in the API (``create``, ``delete`` and ``list`` on
    ``devicetaintrules``, cluster-scoped)."""

    def __init__(self, api: Any) -> None:
        from kubernetes import client

        self.objects = client.CustomObjectsApi(api)
        self._known: set[str] | None = None  # rule names, once listed

    def _list(self) -> set[str]:
        found: Any = self.objects.list_cluster_custom_object(
            GROUP, VERSION, PLURAL, label_selector=f"{LABEL}={VALUE}")
        return {o["metadata"]["name"] for o in found.get("items", [])}

    def sync(self, devices: Iterable[str]) -> str | None:
        from kubernetes.client.rest import ApiException

        try:
            if self._known is None:
                self._known = self._list()
            create, delete = plan(devices, self._known)
            for d in create:
                try:
                    self.objects.create_cluster_custom_object(GROUP, VERSION, PLURAL,
                                                              rule_object(d))
                except ApiException as e:
                    if e.status != 409:
                        raise
                self._known.add(rule_name(d))
            for name in delete:
                try:
                    self.objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
                except ApiException as e:
                    if e.status != 404:
                        raise
                self._known.discard(name)
        except ApiException as e:
            self._known = None  # list again next time
            return f"DeviceTaintRules not written: {e.status} {e.reason}"
        except Exception as e:  # the API unreachable: the next step tries again
            self._known = None
            return f"DeviceTaintRules not written: {e}"
        return None


def gpu_devices(devices: Mapping[str, Any], gpu: int) -> list[str]:
    """Ids of the devices of GPU ``gpu`` in an inventory's ``devices`` (id -> device
    with a ``gpu`` index)."""
    return sorted(d for d, dev in devices.items() if getattr(dev, "gpu", None) == gpu)


def mig_devices(devices: Mapping[str, Any], gpu: int, profile: str) -> list[str]:
    """Ids of the MIG devices of profile ``profile`` on GPU ``gpu`` (every placement;
    the whole-GPU device and other profiles left out)."""
    return sorted(d for d, dev in devices.items()
                  if getattr(dev, "gpu", None) == gpu and getattr(dev, "profile", None) == profile)


__all__ = [
    "LABEL",
    "TAINT_KEY",
    "VALUE",
    "ApiFences",
    "Fences",
    "gpu_devices",
    "mig_devices",
    "plan",
    "rule_name",
    "rule_object",
]
