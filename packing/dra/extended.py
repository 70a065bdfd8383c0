"""The ResourceClaim kube-scheduler v1.37.2 makes for a pod that asks for an extended
resource a DeviceClass serves (KEP-5004, ``DRAExtendedResource``, GA in 1.37): a pod with
``nvidia.com/gpu: 1`` and no claim is allocated as if it had this claim.

Which class serves a resource (the scheduler's ``ExtendedResourceCache``): the class whose
``extendedResourceName`` is the resource (when several do, the newest by
``creationTimestamp``, then the smallest name), or the class ``<name>`` for the implicit
resource ``deviceclass.resource.kubernetes.io/<name>``.

On a node, a resource the pod asks for is served by DRA when a class serves it and the
node's allocatable has none of it (a node whose device plugin advertises it is not a DRA
node for it); a resource neither served nor in the node's allocatable does not fit there.

The claim (``createRequestsAndMappings``): for each served resource, in name order, each
long-lived container (regular containers and restartable init containers, "sidecars")
asking for it gets a request ``container-<i>-request-<j>`` (``i``: the container's index
among init containers then containers; ``j``: the resource's index among the container's
requests in name order) for that many devices, ExactCount, of the class, no selectors.
An init container that runs to completion first reuses the devices of the long-lived
containers after it; only what it needs beyond them becomes a request, and of those only
the largest is kept. Requests are sorted by name. The claim comes after the pod's own
claims in allocation order.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packing.dra.objects import (
    DEVICE_CLASS_RESOURCE_PREFIX,
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    DeviceClass,
    DeviceRequest,
    Request,
    ResourceClaim,
    frozen_map,
)
from packing.quantity import QuantityError, parse_quantity

# The name the scheduler gives the claim until PreBind creates it (the API then names it
# "<pod>-extended-resources-<random>").
IN_MEMORY_NAME = "<extended-resources>"


@dataclass(frozen=True, slots=True)
class Container:
    """What the claim reads of a container: its extended resource requests (whole
    numbers), the names of all its requests (cpu and memory included: they number the
    claim's requests), and whether it is an init container and a restartable one (a
    sidecar)."""

    name: str
    requests: Mapping[str, int]
    init: bool = False
    sidecar: bool = False
    request_names: tuple[str, ...] = ()

    def position(self, resource: str) -> int:
        """The resource's index among the container's requests in name order."""
        return sorted(set(self.request_names) | set(self.requests)).index(resource)

    @property
    def long_lived(self) -> bool:
        return not self.init or self.sidecar


def is_extended_resource(name: str) -> bool:
    """``IsDRAExtendedResourceName``: a domain-qualified name outside ``kubernetes.io``
    (and not ``requests.*``), or the implicit ``deviceclass.resource.kubernetes.io/``."""
    if name.startswith(DEVICE_CLASS_RESOURCE_PREFIX):
        return True
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def class_for(resource: str, classes: Sequence[DeviceClass]) -> DeviceClass | None:
    """The DeviceClass that serves ``resource``, or None."""
    explicit = [c for c in classes if c.extended_resource_name == resource]
    if explicit:
        # Newest first (RFC 3339 UTC timestamps order as text), then the smallest name.
        newest = max(c.creation_timestamp for c in explicit)
        return min((c for c in explicit if c.creation_timestamp == newest),
                   key=lambda c: c.name)
    if resource.startswith(DEVICE_CLASS_RESOURCE_PREFIX):
        name = resource[len(DEVICE_CLASS_RESOURCE_PREFIX):]
        return next((c for c in classes if c.name == name), None)
    return None


def containers_from_pod(pod: Mapping[str, Any]) -> list[Container]:
    """The init containers then the containers of a Pod's JSON; ValueError naming the
    field on a bad extended resource quantity."""
    spec = pod.get("spec") or {}
    out = []
    for key, init in (("initContainers", True), ("containers", False)):
        for i, c in enumerate(spec.get(key) or []):
            resources = c.get("resources") or {}
            # The API server defaults a request to its limit: the requests' names are both.
            asked = dict(resources.get("limits") or {})
            asked.update(resources.get("requests") or {})
            requests: dict[str, int] = {}
            for name, value in asked.items():
                if not is_extended_resource(str(name)):
                    continue
                try:
                    q = parse_quantity(value)
                except QuantityError as e:
                    raise ValueError(f"spec.{key}[{i}].resources: {name}: {e}") from None
                if q != q.to_integral_value():
                    raise ValueError(f"spec.{key}[{i}].resources: {name}: {value!r} is not "
                                     "a whole number")
                requests[str(name)] = int(q)
            out.append(Container(str(c.get("name", "")), requests, init,
                                 init and c.get("restartPolicy") == "Always",
                                 tuple(sorted(str(k) for k in asked))))
    return out


@dataclass(frozen=True, slots=True)
class ExtendedClaim:
    """The outcome on one node: the claim (None when no resource is served by DRA there),
    or ``misfit``: a resource the node neither serves by DRA nor has."""

    claim: ResourceClaim | None = None
    misfit: str = ""


def extended_resource_claim(namespace: str, pod: str, containers: Sequence[Container],
                            classes: Sequence[DeviceClass],
                            allocatable: Mapping[str, int]) -> ExtendedClaim:
    """The claim for the extended resources of a pod on a node with ``allocatable``."""
    wanted = sorted({r for c in containers for r, n in c.requests.items() if n})
    served: dict[str, DeviceClass] = {}
    for resource in wanted:
        klass = class_for(resource, classes)
        if klass is not None and not allocatable.get(resource, 0):
            served[resource] = klass
        elif resource not in allocatable:
            return ExtendedClaim(misfit=resource)
    if not served:
        return ExtendedClaim()
    requests: list[Request] = []
    for resource, klass in served.items():
        long_lived: list[Request | None] = [
            _container_request(i, c, resource, klass.name, ()) if c.long_lived else None
            for i, c in enumerate(containers)]
        largest: Request | None = None
        short_names: set[str] = set()
        for i, c in enumerate(containers):
            if c.long_lived:
                continue
            r = _container_request(i, c, resource, klass.name, long_lived[i:])
            if r is not None:
                short_names.add(r.name)
                if largest is None or largest.count < r.count:
                    largest = r
        if largest is not None:
            requests.append(largest)
        requests.extend(r for r in long_lived if r is not None)
    requests.sort(key=lambda r: r.name)
    claim = ResourceClaim(namespace, IN_MEMORY_NAME,
                          requests=tuple(DeviceRequest(r.name, exactly=r) for r in requests),
                          annotations=frozen_map({EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"}))
    return ExtendedClaim(claim)


def _container_request(index: int, c: Container, resource: str, klass: str,
                       reusable: Sequence[Request | None]) -> Request | None:
    asked = c.requests.get(resource, 0)
    if not asked:
        return None
    covered = 0
    for r in reusable:
        if r is not None:
            covered += r.count
            if covered >= asked:
                return None
    return Request(f"container-{index}-request-{c.position(resource)}", klass,
                   count=asked - covered)
