"""ResourceSlices and DeviceClasses shaped as the NVIDIA DRA driver publishes them
(kubernetes-sigs/dra-driver-nvidia-gpu, formerly NVIDIA/k8s-dra-driver-gpu, the GPU
kubelet plugin in ``cmd/gpu-kubelet-plugin``, as of its August 2026 sources), built as the
API's JSON so that a test double can publish them and :mod:`packing.dra.parse` read them.

What the driver publishes (driver ``gpu.nvidia.com``, one pool per node named after the
node, slices with ``nodeName`` set):

* A whole GPU is device ``gpu-<minor>`` with attributes ``type: gpu``, ``uuid``,
  ``productName``, ``brand``, ``architecture``, ``cudaComputeCapability``,
  ``driverVersion``, ``cudaDriverVersion`` (the last three are versions), and the standard
  ``resource.kubernetes.io/pciBusID``, ``resource.kubernetes.io/pcieRoot`` and
  ``resource.kubernetes.io/numaNode``; capacity ``memory`` (bytes). The ``index`` and
  ``minor`` attributes were removed in September 2025, ``pcieBusID`` replaced by the
  standard attribute.
* Static MIG (the default; DynamicMIG off): MIG devices that exist on the node are
  published beside the whole GPUs of non-MIG GPUs, one slice, no counters, devices in Go map
  order (unordered). A MIG device is ``gpu-<minor>-mig-<profile>-<profileID>-<start>``
  (profile without dots, ``+`` as ``-``: ``gpu-0-mig-1g10gb-me-20-0``), ``type: mig``,
  ``parentUUID``, ``profile`` (``1g.10gb``), the parent's other attributes, capacity
  ``multiprocessors``, ``copyEngines``, ``decoders``, ``encoders``, ``jpegEngines``,
  ``ofaEngines``, ``memory`` and one ``memorySlice<i>`` per memory slice it covers.
* DynamicMIG (alpha gate, KEP-4815 partitionable devices): every MIG profile with as many
  compute as GPU slices, at every placement NVML lists, is a device, beside the whole GPU
  (left out on an Ampere GPU already in MIG mode, which cannot toggle MIG without a
  reset). Each GPU has one counter set ``gpu-<minor>-counter-set`` with a counter per
  capacity dimension (names in DNS form: ``copy-engines``, ``jpeg-engines`` ...) holding
  the largest value any profile has, and ``memory-slice-<i>`` (1 each). A MIG device
  consumes its capacities and its memory slices; the whole GPU consumes everything.
  Devices of one GPU are sorted by name (so ``gpu-0`` first, then its MIG devices by
  profile name and placement). On Kubernetes 1.35+ (:data:`Layout.SPLIT`) the counter
  sets sit in one slice and each GPU's devices in a slice of their own, GPUs ordered by
  PCI bus id. (The 1.34 layout, counters and devices in one slice, is refused by the
  v1.37 API: a slice holds devices or counters, not both.)
* Slice names come from the kubelet's ResourceSlice controller:
  ``<index as 5 hex digits>-gpu.nvidia.com-<node>-<random>``; the allocator orders a
  pool's slices by name, i.e. by the driver's slice index.
* ``ConsumableShares`` (driver gate): every device gets ``allowMultipleAllocations`` and a
  ``memory`` request policy (step 1Mi; ``memory`` mode: default all, min 1Mi; a number of
  shares N: default 0 and a ``shares`` capacity N, default and minimum 1).
* DeviceClasses (the chart): ``gpu.nvidia.com`` (``type == 'gpu'``,
  ``extendedResourceName: nvidia.com/gpu``) and ``mig.nvidia.com`` (``type == 'mig'``).

MIG profile data (GI profile ids of ``nvidia-smi mig -lgip``, SMs and engines) is
nvidia-smi's for A100-40GB (Ampere) and H100-80GB (Hopper); other parts reuse their
family's figures (an assumption: the allocator only compares the counters' sums, which
the memory slices decide). Geometry and memory come from :mod:`packing.catalog`.

Pure: no I/O.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from packing.catalog import GpuModel, MigProfile, get_model

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
EXTENDED_RESOURCE = "nvidia.com/gpu"
MIB = 1 << 20
STANDARD = "resource.kubernetes.io/"


class Layout(StrEnum):
    STATIC = "static"  # DynamicMIG off: one slice, whole GPUs and existing MIG devices
    SPLIT = "split"  # DynamicMIG on Kubernetes 1.35+: a counter slice + a slice per GPU


@dataclass(frozen=True, slots=True)
class _Engines:
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int


# (compute slices, memory slices, +me) -> (GI profile id, engines), per family.
_HOPPER: dict[tuple[int, int, bool], tuple[int, _Engines]] = {
    (1, 1, False): (19, _Engines(16, 1, 1, 0, 0, 0)),
    (1, 1, True): (20, _Engines(16, 1, 1, 0, 1, 1)),
    (1, 2, False): (15, _Engines(26, 1, 1, 0, 0, 0)),
    (2, 2, False): (14, _Engines(32, 2, 2, 0, 0, 0)),
    (3, 4, False): (9, _Engines(60, 3, 3, 0, 0, 0)),
    (4, 4, False): (5, _Engines(64, 4, 4, 0, 0, 0)),
    (7, 8, False): (0, _Engines(132, 8, 7, 0, 1, 1)),
}
_AMPERE: dict[tuple[int, int, bool], tuple[int, _Engines]] = {
    (1, 1, False): (19, _Engines(14, 1, 0, 0, 0, 0)),
    (1, 1, True): (20, _Engines(14, 1, 1, 0, 1, 1)),
    (1, 2, False): (15, _Engines(14, 1, 1, 0, 0, 0)),
    (2, 2, False): (14, _Engines(28, 2, 1, 0, 0, 0)),
    (3, 4, False): (9, _Engines(42, 3, 2, 0, 0, 0)),
    (4, 4, False): (5, _Engines(56, 4, 2, 0, 0, 0)),
    (7, 8, False): (0, _Engines(98, 7, 5, 0, 1, 1)),
}
_A30: dict[tuple[int, int, bool], tuple[int, _Engines]] = {
    (1, 1, False): (14, _Engines(14, 1, 0, 0, 0, 0)),
    (1, 1, True): (21, _Engines(14, 1, 1, 0, 1, 1)),
    (2, 2, False): (5, _Engines(28, 2, 1, 0, 0, 0)),
    (2, 2, True): (6, _Engines(28, 2, 2, 0, 1, 1)),
    (4, 4, False): (0, _Engines(56, 4, 2, 0, 1, 1)),
}
_FAMILY = {"A100-40GB": ("Ampere", "8.0", _AMPERE), "A100-80GB": ("Ampere", "8.0", _AMPERE),
           "A30-24GB": ("Ampere", "8.0", _A30), "H100-80GB": ("Hopper", "9.0", _HOPPER),
           "H100-94GB": ("Hopper", "9.0", _HOPPER), "H100-96GB": ("Hopper", "9.0", _HOPPER),
           "H20": ("Hopper", "9.0", _HOPPER), "H200-141GB": ("Hopper", "9.0", _HOPPER),
           "B200": ("Blackwell", "10.0", _HOPPER)}
# Parts whose MIG mode changes only with a GPU reset (Ampere): under DynamicMIG one already
# in MIG mode publishes no whole-GPU device, and stays in MIG mode.
MIG_MODE_NEEDS_RESET = frozenset({"A100-40GB", "A100-80GB", "A30-24GB"})
# NVML product names (spaces), where they differ from the catalog's GFD spelling.
_PRODUCT = {"H100-80GB": "NVIDIA H100 80GB HBM3", "A100-40GB": "NVIDIA A100-SXM4-40GB",
            "A100-80GB": "NVIDIA A100-SXM4-80GB", "H200-141GB": "NVIDIA H200",
            "B200": "NVIDIA B200", "L40S": "NVIDIA L40S", "L4": "NVIDIA L4"}


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One physical GPU of a node as the driver discovers it.

    ``mig_mode``: MIG mode is on (static MIG: only ``static_mig`` devices are
    published; DynamicMIG on Ampere: the whole GPU is not). ``static_mig``: the MIG
    devices that exist, as (profile, placement start).
    """

    minor: int
    model: str
    uuid: str = ""
    pci_bus: int | None = None  # PCI bus number; defaults to 0x18 + 0x10 * minor
    numa_node: int = 0
    mig_mode: bool = False
    static_mig: tuple[tuple[str, int], ...] = ()

    @property
    def gpu_uuid(self) -> str:
        return self.uuid or f"GPU-{self.minor:08x}-0000-4000-8000-{_crc(self.model):012x}"

    @property
    def pci_bus_id(self) -> str:
        bus = 0x18 + 0x10 * self.minor if self.pci_bus is None else self.pci_bus
        return f"0000:{bus:02x}:00.0"


@dataclass(frozen=True, slots=True)
class DriverInfo:
    """What the node's driver stack reports, the same on every GPU."""

    driver_version: str = "580.126.20"
    cuda_driver_version: str = "13.0.0"
    consumable_shares: str = ""  # "", "memory", "unlimited" or a number of shares
    taints: Mapping[str, Sequence[Mapping[str, str]]] = field(default_factory=dict)


def _q(n: int) -> str:
    """A quantity as the API prints an integer of BinarySI format."""
    for suffix, size in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def _rfc1123(name: str) -> str:
    out = "".join(c if c.isascii() and (c.isalnum() or c in "-.") else "-"
                  for c in name.lower())
    return out.strip("-").removesuffix(".")


def _dns(camel: str) -> str:
    """``camelToDNSName``: ``copyEngines`` -> ``copy-engines``."""
    out = []
    for i, c in enumerate(camel):
        if c.isupper() and i and (camel[i - 1].islower() or camel[i - 1].isdigit()):
            out.append("-")
        out.append(c)
    return _rfc1123("".join(out))


def _bus(spec: GpuSpec) -> int:
    return int(spec.pci_bus_id[5:7], 16)


def _model(spec: GpuSpec) -> GpuModel:
    return get_model(spec.model)


def profile_info(model: GpuModel, profile: MigProfile) -> tuple[int, _Engines]:
    """The GI profile id and engines of ``profile`` on ``model``."""
    _arch, _cc, table = _FAMILY.get(model.name, ("Hopper", "9.0", _HOPPER))
    return table[(profile.compute_slices, profile.memory_slices, profile.media_extensions)]


def mig_device_name(minor: int, profile: str, profile_id: int, start: int) -> str:
    return f"gpu-{minor}-mig-{_rfc1123(profile.replace('.', ''))}-{profile_id}-{start}"


def _common_attributes(spec: GpuSpec, info: DriverInfo) -> dict[str, Any]:
    model = _model(spec)
    arch, cc, _t = _FAMILY.get(model.name, ("Ada Lovelace", "8.9", _HOPPER))
    product = _PRODUCT.get(model.name) or (model.products[0].replace("-", " ")
                                           if model.products else model.name)
    return {
        "productName": {"string": product},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": arch},
        "cudaComputeCapability": {"version": f"{cc}.0"},
        "driverVersion": {"version": info.driver_version},
        "cudaDriverVersion": {"version": info.cuda_driver_version},
        f"{STANDARD}pciBusID": {"string": spec.pci_bus_id},
        f"{STANDARD}pcieRoot": {"string": f"pci0000:{max(_bus(spec) - 1, 0):02x}"},
        f"{STANDARD}numaNode": {"int": spec.numa_node},
    }


def _engine_capacity(e: _Engines, memory_bytes: int) -> dict[str, int]:
    return {"multiprocessors": e.multiprocessors, "copyEngines": e.copy_engines,
            "decoders": e.decoders, "encoders": e.encoders, "jpegEngines": e.jpeg_engines,
            "ofaEngines": e.ofa_engines, "memory": memory_bytes}


def _max_capacity(spec: GpuSpec) -> dict[str, int]:
    """The whole GPU's capacity under DynamicMIG: per dimension, the largest value of any
    profile (``inspectMigProfilesAndPlacements``)."""
    model = _model(spec)
    assert model.mig is not None
    out: dict[str, int] = {}
    for p in model.mig.profiles:
        _pid, e = profile_info(model, p)
        for k, v in _engine_capacity(e, p.memory_mib * MIB).items():
            out[k] = max(out.get(k, 0), v)
    return out


def _apply_shares(dev: dict[str, Any], info: DriverInfo, memory_bytes: int) -> None:
    """The driver's ``applyConsumableShares``."""
    mode = info.consumable_shares.strip()
    if not mode or mode == "disabled":
        return
    dev["allowMultipleAllocations"] = True
    mem = dev["capacity"]["memory"]
    top = (memory_bytes // MIB) * MIB
    mem["value"] = _q(top)
    step = "1Mi"
    if mode == "unlimited":
        mem["requestPolicy"] = {"default": "0", "validRange": {"min": "0", "max": _q(top),
                                                               "step": step}}
    elif mode == "memory":
        mem["requestPolicy"] = {"default": _q(top), "validRange": {"min": step, "max": _q(top),
                                                                   "step": step}}
    elif mode.isdigit() and int(mode) > 0:
        mem["requestPolicy"] = {"default": "0", "validRange": {"min": "0", "max": _q(top),
                                                               "step": step}}
        dev["capacity"]["shares"] = {"value": mode, "requestPolicy": {
            "default": "1", "validRange": {"min": "1", "max": mode, "step": "1"}}}


def _capacity(values: Mapping[str, int]) -> dict[str, Any]:
    return {k: {"value": _q(v)} for k, v in values.items()}


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def _taints(dev: dict[str, Any], info: DriverInfo) -> dict[str, Any]:
    taints = info.taints.get(dev["name"])
    if taints:
        dev["taints"] = [dict(t) for t in taints]
    return dev


def gpu_device(spec: GpuSpec, info: DriverInfo, *, partitionable: bool) -> dict[str, Any]:
    """The whole GPU ``gpu-<minor>`` (with counters when ``partitionable``)."""
    model = _model(spec)
    attrs = {"type": {"string": "gpu"}, "uuid": {"string": spec.gpu_uuid},
             **_common_attributes(spec, info)}
    memory = model.memory_mib * MIB
    if partitionable and model.mig is not None:
        caps = _max_capacity(spec)
        memory = caps["memory"]
        dev: dict[str, Any] = {"name": f"gpu-{spec.minor}", "attributes": attrs,
                               "capacity": _capacity(caps)}
        counters = {_dns(k): v for k, v in caps.items()}
        counters.update({f"memory-slice-{i}": 1 for i in range(model.mig.memory_slices)})
        dev["consumesCounters"] = [{"counterSet": counter_set_name(spec),
                                    "counters": {k: {"value": _q(v)}
                                                 for k, v in counters.items()}}]
    else:
        dev = {"name": f"gpu-{spec.minor}", "attributes": attrs,
               "capacity": _capacity({"memory": memory})}
    _apply_shares(dev, info, memory)
    return _taints(dev, info)


def counter_set_name(spec: GpuSpec) -> str:
    return f"gpu-{spec.minor}-counter-set"


def counter_set(spec: GpuSpec) -> dict[str, Any]:
    """The GPU's shared counter set (DynamicMIG)."""
    model = _model(spec)
    assert model.mig is not None
    counters = {_dns(k): v for k, v in _max_capacity(spec).items()}
    counters.update({f"memory-slice-{i}": 1 for i in range(model.mig.memory_slices)})
    return {"name": counter_set_name(spec),
            "counters": {k: {"value": _q(v)} for k, v in counters.items()}}


def mig_device(spec: GpuSpec, info: DriverInfo, profile: str, start: int, *,
               partitionable: bool) -> dict[str, Any]:
    """MIG device ``profile`` at memory slice ``start`` of the GPU."""
    model = _model(spec)
    assert model.mig is not None
    p = model.mig.profile(profile)
    if start not in p.starts:
        raise ValueError(f"{profile} cannot start at memory slice {start} on {model.name}; "
                         f"placements: {p.starts}")
    pid, engines = profile_info(model, p)
    caps = _engine_capacity(engines, p.memory_mib * MIB)
    attrs = {"type": {"string": "mig"}, "parentUUID": {"string": spec.gpu_uuid},
             "profile": {"string": p.name}, **_common_attributes(spec, info)}
    name = mig_device_name(spec.minor, p.name, pid, start)
    dev: dict[str, Any] = {"name": name, "attributes": attrs, "capacity": _capacity(caps)}
    if partitionable:
        counters = {_dns(k): v for k, v in caps.items()}
        counters.update({f"memory-slice-{i}": 1 for i in range(start, start + p.memory_slices)})
        dev["consumesCounters"] = [{"counterSet": counter_set_name(spec),
                                    "counters": {k: {"value": _q(v)}
                                                 for k, v in counters.items()}}]
    else:
        attrs["uuid"] = {"string": f"MIG-{spec.minor:04x}{pid:04x}-{start:04x}-4000-8000-"
                                   f"{_crc(spec.gpu_uuid):012x}"}
        for i in range(start, start + p.memory_slices):
            dev["capacity"][f"memorySlice{i}"] = {"value": "1"}
    _apply_shares(dev, info, p.memory_mib * MIB)
    return _taints(dev, info)


def gpu_devices(spec: GpuSpec, info: DriverInfo, layout: Layout) -> list[dict[str, Any]]:
    """Every device the driver announces for one GPU, in the driver's order."""
    model = _model(spec)
    if layout is Layout.STATIC or model.mig is None:
        if spec.mig_mode and model.mig is not None:
            return [mig_device(spec, info, prof, start, partitionable=False)
                    for prof, start in spec.static_mig]
        return [gpu_device(spec, info, partitionable=False)]
    devices = []
    if not spec.mig_mode or model.name not in MIG_MODE_NEEDS_RESET:
        devices.append(gpu_device(spec, info, partitionable=True))
    for p in model.mig.profiles:
        for start in p.starts:
            devices.append(mig_device(spec, info, p.name, start, partitionable=True))
    return sorted(devices, key=lambda d: d["name"])


def slice_prefix(index: int, node: str) -> str:
    """The ``generateName`` the kubelet's ResourceSlice controller gives slice ``index``."""
    return f"{index:05x}-{DRIVER}-{node}-"


def node_slices(node: str, gpus: Iterable[GpuSpec], *, layout: Layout = Layout.SPLIT,
                info: DriverInfo | None = None, generation: int = 1,
                name_suffix: str | None = "x") -> list[dict[str, Any]]:
    """The ResourceSlices (API JSON) the driver publishes for ``node``.

    ``name_suffix``: appended to each slice's ``generateName`` to name it (None: leave
    the name to the API server, as the driver does).
    """
    info = info or DriverInfo()
    # A GPU's UUID is its own: unset ones are made from the node and the minor.
    gpus = sorted((g if g.uuid else replace(
        g, uuid=f"GPU-{_crc(node):08x}-{g.minor:04x}-4000-8000-{_crc(g.model):012x}")
        for g in gpus), key=lambda g: g.pci_bus_id)
    if layout is Layout.STATIC:
        devices = [d for g in gpus for d in gpu_devices(g, info, layout)]
        bodies: list[dict[str, Any]] = [{"devices": devices}]
    else:
        sets = [counter_set(g) for g in gpus if _model(g).mig is not None]
        bodies = ([{"sharedCounters": sets}] if sets else []) + [
            {"devices": gpu_devices(g, info, layout)} for g in gpus]
    out = []
    for i, body in enumerate(bodies):
        meta: dict[str, Any] = {"generateName": slice_prefix(i, node)}
        if name_suffix is not None:
            meta["name"] = f"{slice_prefix(i, node)}{name_suffix}"
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": meta,
                    "spec": {"driver": DRIVER, "nodeName": node,
                             "pool": {"name": node, "generation": generation,
                                      "resourceSliceCount": len(bodies)},
                             **body}})
    return out


def device_classes() -> list[dict[str, Any]]:
    """The chart's DeviceClasses for GPUs and MIG devices."""
    def klass(name: str, kind: str, extended: str | None) -> dict[str, Any]:
        spec: dict[str, Any] = {"selectors": [{"cel": {"expression": (
            f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'")}}]}
        if extended:
            spec["extendedResourceName"] = extended
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": name}, "spec": spec}

    return [klass(GPU_CLASS, "gpu", EXTENDED_RESOURCE), klass(MIG_CLASS, "mig", None)]
