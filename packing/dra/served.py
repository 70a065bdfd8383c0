"""The DeviceClasses gpupack's chart ships so that the NVIDIA DRA driver's devices serve the
extended resources gpupack's webhook writes (KEP-5004, ``DRAExtendedResource``, GA in
Kubernetes 1.37), built as the API's JSON.

The webhook sizes a pod the same way on every node: a MIG profile is
``nvidia.com/mig-<profile>`` (the device plugin's name, ``+`` written ``.``), a
time-sliced share ``nvidia.com/gpu.shared``, a whole GPU ``nvidia.com/gpu``. On a node
whose allocatable has such a resource, the device plugin serves it; on a node whose
allocatable has none of it, kube-scheduler allocates a claim of the DeviceClass whose
``extendedResourceName`` it is. So one pod spec lands on either kind of node and the
scheduler, not the webhook, decides which kind serves it:

* ``gpupack-mig-<profile>`` (one per MIG profile name of :data:`packing.catalog.CATALOG`,
  the resource's spelling after ``mig-``): the driver's MIG devices of that profile
  (``type == 'mig'``, then ``profile``: the type test comes first, so the
  ``profile`` attribute, which a whole GPU lacks, is never read on one; CEL's ``&&``
  absorbs the error only when the other side is false);
* ``gpupack-gpu-shared``: whole GPUs the driver publishes as shareable
  (``allowMultipleAllocations``, its ``ConsumableShares`` gate); what a pod takes of
  one is the driver's request-policy default, since an extended resource carries no
  capacity request (``docs/dra.md``, "Shares");
* whole GPUs: the driver's own class ``gpu.nvidia.com`` already serves
  ``nvidia.com/gpu``; gpupack ships none.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from packing.catalog import CATALOG
from packing.dra.nvidia import DRIVER

MIG_CLASS_PREFIX = "gpupack-mig-"
SHARED_CLASS = "gpupack-gpu-shared"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
_MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def mig_profiles() -> list[str]:
    """Every MIG profile name of the catalog, in the order of their resource names."""
    names = {p.name for m in CATALOG.values() if m.mig is not None for p in m.mig.profiles}
    return sorted(names, key=lambda n: n.replace("+", "."))


def mig_class_name(profile: str) -> str:
    return MIG_CLASS_PREFIX + profile.replace("+", ".")


def _klass(name: str, expression: str, resource: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name,
                         "labels": {"app.kubernetes.io/name": "gpupack",
                                    "app.kubernetes.io/component": "webhook",
                                    "app.kubernetes.io/part-of": "gpupack"}},
            "spec": {"selectors": [{"cel": {"expression": expression}}],
                     "extendedResourceName": resource}}


def mig_class(profile: str) -> dict[str, Any]:
    """The class serving ``nvidia.com/mig-<profile>``."""
    expr = (f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig' "
            f"&& device.attributes['{DRIVER}'].profile == '{profile}'")
    return _klass(mig_class_name(profile), expr,
                  _MIG_RESOURCE_PREFIX + profile.replace("+", "."))


def shared_class(resource: str = SHARED_RESOURCE) -> dict[str, Any]:
    """The class serving a share (``resource``: the webhook's ``--shared-resource``)."""
    expr = (f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu' "
            "&& device.allowMultipleAllocations")
    return _klass(SHARED_CLASS, expr, resource)


def device_classes(shared_resource: str = SHARED_RESOURCE) -> list[dict[str, Any]]:
    """Every class the chart ships: one per catalog MIG profile, then the share's."""
    return [*(mig_class(p) for p in mig_profiles()), shared_class(shared_resource)]
