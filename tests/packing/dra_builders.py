"""Builders for the DRA model's tests: devices, slices, classes and claims as values,
and NVIDIA-shaped nodes through :mod:`packing.dra.nvidia` (parsed from its JSON, as the
cache will read them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from packing.dra import nvidia
from packing.dra.allocator import AllocatedState, Prediction, predict
from packing.dra.objects import (
    AllocatedDevice,
    Allocation,
    Constraint,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceCapacity,
    DeviceClass,
    DeviceRequest,
    DeviceTaint,
    DeviceToleration,
    Node,
    Request,
    RequestPolicy,
    ResourceClaim,
    ResourceSlice,
    Semver,
    frozen_map,
)
from packing.dra.parse import parse_device_class, parse_resource_slice
from packing.quantity import parse_quantity

DRIVER = "test.example.com"
NODE = Node("n1", frozen_map({"kubernetes.io/hostname": "n1", "zone": "a"}))
ANY = DeviceClass("any")  # no selectors: every device


def q(text: str | int) -> Decimal:
    return parse_quantity(text)


def device(name: str, *, attrs: Mapping[str, Any] | None = None,
           capacity: Mapping[str, str | int] | None = None,
           counters: Mapping[str, Mapping[str, int]] | None = None,
           taints: Sequence[DeviceTaint] = (), multi: bool | None = None,
           policy: Mapping[str, RequestPolicy] | None = None,
           binding: Sequence[str] = ()) -> Device:
    """A device; ``counters``: counter set -> counter -> amount consumed."""
    return Device(
        name=name,
        attributes=frozen_map(dict(attrs or {})),
        capacity=frozen_map({k: DeviceCapacity(q(v), (policy or {}).get(k))
                             for k, v in (capacity or {}).items()}),
        consumes_counters=tuple(CounterConsumption(cs, frozen_map(
            {k: Decimal(v) for k, v in c.items()})) for cs, c in (counters or {}).items()),
        taints=tuple(taints), allow_multiple_allocations=multi,
        binding_conditions=tuple(binding))


def slice_(name: str, *devices: Device, pool: str = "pool", node: str | None = "n1",
           driver: str = DRIVER, generation: int = 1, count: int = 1,
           counters: Mapping[str, Mapping[str, int]] | None = None,
           all_nodes: bool = False) -> ResourceSlice:
    return ResourceSlice(
        name=name, driver=driver, pool=pool, generation=generation,
        resource_slice_count=count, node_name=node, all_nodes=all_nodes,
        devices=tuple(devices),
        shared_counters=tuple(CounterSet(n, frozen_map({k: Decimal(v) for k, v in c.items()}))
                              for n, c in (counters or {}).items()))


def exact(name: str, cls: str = "any", *selectors: str, count: int = 1, mode: str = "ExactCount",
          tolerations: Sequence[DeviceToleration] = (),
          capacity: Mapping[str, str] | None = None, admin: bool | None = None) -> Request:
    return Request(name, cls, tuple(selectors), mode, count if mode == "ExactCount" else 0,
                   tuple(tolerations),
                   None if capacity is None else frozen_map({k: q(v)
                                                             for k, v in capacity.items()}),
                   admin)


def req(r: Request) -> DeviceRequest:
    return DeviceRequest(r.name, exactly=r)


def first(name: str, *subs: Request) -> DeviceRequest:
    return DeviceRequest(name, first_available=tuple(subs))


def claim(name: str, *requests: DeviceRequest | Request,
          constraints: Sequence[Constraint] = (), namespace: str = "ns") -> ResourceClaim:
    reqs = tuple(r if isinstance(r, DeviceRequest) else req(r) for r in requests)
    return ResourceClaim(namespace, name, uid=f"uid-{name}", requests=reqs,
                         constraints=tuple(constraints))


def allocated(name: str, *devices: str, pool: str = "pool", driver: str = DRIVER,
              share: str | None = None, consumed: Mapping[str, str] | None = None,
              admin: bool = False) -> ResourceClaim:
    """A claim already allocated ``devices`` (names in ``pool``)."""
    results = tuple(AllocatedDevice("r", driver, pool, d, admin_access=admin, share_id=share,
                                    consumed_capacity=None if consumed is None else frozen_map(
                                        {k: q(v) for k, v in consumed.items()}))
                    for d in devices)
    return ResourceClaim("ns", name, uid=f"uid-{name}", allocation=Allocation(results))


def run(slices: Sequence[ResourceSlice], *claims: ResourceClaim,
        classes: Sequence[DeviceClass] = (ANY,), state: AllocatedState | None = None,
        node: Node = NODE, max_steps: int = 200_000) -> Prediction:
    return predict(node, slices, {c.name: c for c in classes}, state or AllocatedState(),
                   claims, max_steps=max_steps)


def names(p: Prediction) -> list[list[str]]:
    """Per claim, the device names allocated."""
    return [[d.device for d in c] for c in p.results]


# -- NVIDIA-shaped ---------------------------------------------------------------------


def nvidia_node(node: str = "n1", gpus: int = 2, model: str = "H100-80GB", *,
                layout: nvidia.Layout = nvidia.Layout.SPLIT,
                info: nvidia.DriverInfo | None = None,
                specs: Sequence[nvidia.GpuSpec] | None = None) -> list[ResourceSlice]:
    specs = specs or [nvidia.GpuSpec(i, model) for i in range(gpus)]
    return [parse_resource_slice(s) for s in nvidia.node_slices(node, specs, layout=layout,
                                                                 info=info)]


def nvidia_classes() -> list[DeviceClass]:
    return [parse_device_class(c) for c in nvidia.device_classes()]


def profile_sel(profile: str) -> str:
    return f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"


def semver(text: str) -> Semver:
    return Semver.parse(text)
