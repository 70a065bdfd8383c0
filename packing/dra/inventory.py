"""A DRA node's GPUs as gpupack's model sees them (:class:`~packing.model.GpuInfo`), and
what allocated claims hold on them as entries of the model's accounting.

Where GPUs are ResourceSlices, a node's Node object advertises no GPU resource: its GPUs
are the devices the NVIDIA DRA driver publishes (:mod:`packing.dra.nvidia`). This module
reads them into the packer's model, so that scoring, the summary and the metrics see DRA
GPUs as they see device-plugin GPUs:

* A **physical GPU** is a device of type ``gpu`` (its ``uuid``) or the parent
  (``parentUUID``) of devices of type ``mig``. GPUs are numbered in PCI bus order
  (``resource.kubernetes.io/pciBusID``), the driver's order of its slices. The model
  is the catalog's for ``productName`` (:func:`packing.catalog.match_product`, with the
  whole GPU's ``memory`` capacity to pick a variant).
* **Whole GPU**: the GPU's own device. A GPU whose device has ``allowMultipleAllocations``
  (consumable capacity, KEP-5075) is split by the claims' consumed memory (mode
  FRACTIONAL: each share takes its memory's fraction of the GPU, gpupack's own choice of
  GPU, no device plugin picking a replica; an idle one can still be taken whole).
* **MIG**: with static MIG (no counters) the MIG devices that exist are the GPU's layout
  (mode MIG). With partitionable devices (DynamicMIG, KEP-4815: counters), every
  placement is a device and an instance exists only while a claim holds it: the GPU is
  in MIG mode with the instances allocated claims hold, and whole (mode WHOLE) while
  none does. A MIG device's start is the first memory slice it covers (its
  ``memory-slice-<i>`` counters, else its ``memorySlice<i>`` capacities, else the last
  number of its name); a device whose profile or start the catalog's geometry does not
  allow is left out (it stays allocatable; the model just does not count it).
* **Clique** (NVLink domain): a ``cliqueID`` attribute that every GPU of the node carries
  with one value. (The node label ``nvidia.com/gpu.clique`` that GPU feature discovery
  writes is read as on any node; the label wins where both exist.)

Uses (:func:`claim_uses`): an allocation's devices on the node as (request, placement)
pairs of the model, one per claim for its whole GPUs (``<claim>#dra``), one per MIG
device (``<claim>#dra-<device>``), one per share of a shared GPU
(``<claim>#dra-<device>-<share>``, its memory the consumed ``memory`` capacity, else all
of the device's). Admin-access results hold nothing (as the allocator counts them).

Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal

from packing.catalog import GpuModel, get_model, match_product
from packing.constraints import BLOCKING
from packing.dra.cel import Outcome, evaluate
from packing.dra.objects import (
    AllocatedDevice,
    AllocationMode,
    Device,
    DeviceClass,
    ResourceClaim,
    ResourceSlice,
    frozen_map,
)
from packing.groups.members import CLIQUE_LABEL
from packing.model import (
    GPU_MILLI,
    GpuInfo,
    GpuMode,
    MigInstance,
    NodeInfo,
    Placement,
    PodRequest,
    RequestKind,
)

GPU_DRIVER = "gpu.nvidia.com"
CLIQUE_ATTRIBUTE = "cliqueID"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
USE_MARK = "#dra"  # claim uses' keys: <namespace>/<claim>#dra...
TAINT_MARK = f"{USE_MARK}-tainted"  # a tainted idle GPU's hold: <node>/gpu-<i>#dra-tainted
MIB = 1 << 20
_SLICE_COUNTER = re.compile(r"^memory-slice-(\d+)$")
_SLICE_CAPACITY = re.compile(r"^memorySlice(\d+)$")
_NAME_START = re.compile(r"-(\d+)$")


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """A published device that is a physical GPU or a MIG partition of one."""

    id: str  # driver/pool/device
    gpu: int  # its GPU's index in the inventory
    profile: str | None  # MIG profile; None: the whole GPU
    start: int | None  # MIG: first memory slice
    memory_mib: int
    shared: bool = False  # allowMultipleAllocations


@dataclass(frozen=True, slots=True)
class DraInventory:
    """One node's GPUs as published in its ResourceSlices."""

    node: str
    gpus: tuple[GpuInfo, ...]
    devices: Mapping[str, GpuDevice]
    partitionable: frozenset[int] = frozenset()  # GPUs whose MIG devices use counters
    clique: str | None = None
    skipped: tuple[str, ...] = field(default=())  # devices left out, with why
    # GPUs whose own device (for a GPU without one: every MIG device) carries a
    # NoSchedule or NoExecute taint: no new claim that does not tolerate it gets them.
    tainted: frozenset[int] = frozenset()


def _attr(d: Device, driver: str, name: str) -> object:
    if name in d.attributes:
        return d.attributes[name]
    return d.attributes.get(f"{driver}/{name}")


def _memory_mib(d: Device) -> int:
    cap = d.capacity.get("memory")
    return 0 if cap is None else int(cap.value // MIB)


def _mig_start(d: Device) -> int | None:
    found = [int(m.group(1)) for use in d.consumes_counters for c in use.counters
             if (m := _SLICE_COUNTER.match(c))]
    if not found:
        found = [int(m.group(1)) for c in d.capacity if (m := _SLICE_CAPACITY.match(c))]
    if found:
        return min(found)
    m = _NAME_START.search(d.name)
    return int(m.group(1)) if m else None


@dataclass
class _Gpu:
    key: str
    bus: str
    whole: tuple[str, Device] | None = None
    migs: list[tuple[str, Device]] = field(default_factory=list)
    product: str | None = None
    clique: str | None = None


@dataclass(frozen=True, slots=True)
class _StaticGpu:
    index: int
    model: str
    memory_mib: int
    memory_source: str
    whole: str | None  # its own device's id
    shared: bool  # its own device has allowMultipleAllocations
    migs: tuple[GpuDevice, ...]  # its MIG devices the geometry allows
    partitionable: bool


@dataclass(frozen=True, slots=True)
class StaticInventory:
    """What a node's slices say of its GPUs whatever is held: the part of
    :class:`DraInventory` that changes only when the slices do (a cache keeps it per
    node; :func:`inventory_from` adds what the held devices decide)."""

    node: str
    gpus: tuple[_StaticGpu, ...]
    devices: Mapping[str, GpuDevice]
    clique: str | None
    skipped: tuple[str, ...]
    tainted: frozenset[int]


def node_inventory(node: str, slices: Iterable[ResourceSlice],
                   held: frozenset[str] | set[str] = frozenset(),
                   drivers: Sequence[str] = (GPU_DRIVER,)) -> DraInventory | None:
    """The GPUs of ``node`` in ``slices`` (the node's own, ``nodeName``), with
    ``held`` (ids of devices allocated claims hold, in flight included) deciding the
    mode of partitionable GPUs. None when the node publishes no GPU."""
    static = static_inventory(node, slices, drivers)
    return None if static is None else inventory_from(static, held)


def static_inventory(node: str, slices: Iterable[ResourceSlice],
                     drivers: Sequence[str] = (GPU_DRIVER,)) -> StaticInventory | None:
    """The held-independent part of :func:`node_inventory`."""
    gpus: dict[str, _Gpu] = {}
    skipped: list[str] = []
    newest: dict[tuple[str, str], int] = {}
    mine = [s for s in slices if s.node_name == node and s.driver in drivers]
    for s in mine:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    for s in sorted(mine, key=lambda s: (s.driver, s.pool, s.name)):
        if s.generation != newest[(s.driver, s.pool)]:
            continue  # an older generation the driver is replacing
        for d in s.devices:
            kind = _attr(d, s.driver, "type")
            did = f"{s.driver}/{s.pool}/{d.name}"
            if kind == "gpu":
                uuid = _attr(d, s.driver, "uuid")
                gkey = str(uuid) if isinstance(uuid, str) and uuid else d.name
            elif kind == "mig":
                parent = _attr(d, s.driver, "parentUUID")
                if not isinstance(parent, str) or not parent:
                    skipped.append(f"{d.name}: MIG device without parentUUID")
                    continue
                gkey = parent
            else:
                continue  # not a GPU (a channel, a NIC ...): the allocator's business only
            bus = d.attributes.get(PCI_BUS_ID)
            g = gpus.setdefault(gkey, _Gpu(gkey, bus if isinstance(bus, str) else ""))
            if isinstance(bus, str) and not g.bus:
                g.bus = bus
            product = _attr(d, s.driver, "productName")
            if isinstance(product, str) and product:
                g.product = g.product or product
            clique = _attr(d, s.driver, CLIQUE_ATTRIBUTE)
            if isinstance(clique, str) and clique:
                g.clique = clique
            if kind == "gpu":
                g.whole = (did, d)
            else:
                g.migs.append((did, d))
    if not gpus:
        return None
    ordered = sorted(gpus.values(), key=lambda g: (g.bus or "~", g.key))
    out: list[_StaticGpu] = []
    devices: dict[str, GpuDevice] = {}
    tainted: set[int] = set()
    cliques: set[str | None] = set()
    for index, g in enumerate(ordered):
        whole_mib = _memory_mib(g.whole[1]) if g.whole is not None else 0
        try:
            model = match_product(g.product, whole_mib or None)
        except ValueError as e:
            skipped.append(f"GPU {g.key}: {e}")
            continue
        counters = any(d.consumes_counters for _, d in g.migs) or (
            g.whole is not None and bool(g.whole[1].consumes_counters))
        migs: list[GpuDevice] = []
        for did, d in g.migs:
            profile = _attr(d, GPU_DRIVER, "profile")
            start = _mig_start(d)
            why = _mig_problem(model, profile, start)
            if why:
                skipped.append(f"{d.name}: {why}")
                continue
            assert isinstance(profile, str) and start is not None
            dev = GpuDevice(did, index, profile, start, _memory_mib(d),
                            bool(d.allow_multiple_allocations))
            devices[did] = dev
            migs.append(dev)
        memory = whole_mib or model.memory_mib
        if g.whole is not None:
            did, d = g.whole
            devices[did] = GpuDevice(did, index, None, None, memory,
                                     bool(d.allow_multiple_allocations))
        out.append(_StaticGpu(
            index, model.name, memory, "dra" if whole_mib else "catalog",
            g.whole[0] if g.whole is not None else None,
            g.whole is not None and bool(g.whole[1].allow_multiple_allocations),
            tuple(migs), counters and bool(g.migs)))
        cliques.add(g.clique)
        own = [g.whole[1]] if g.whole is not None else [d for _, d in g.migs]
        if own and all(any(t.effect in BLOCKING for t in d.taints) for d in own):
            tainted.add(index)
    clique = next(iter(cliques)) if len(cliques) == 1 else None
    return StaticInventory(node, tuple(out), frozen_map(devices), clique, tuple(skipped),
                           frozenset(tainted))


def inventory_from(static: StaticInventory, held: frozenset[str] | set[str]) -> DraInventory:
    """The node's inventory with ``held`` deciding the partitionable GPUs' modes: in MIG
    mode with the partitions held, whole while none is."""
    infos: list[GpuInfo] = []
    for g in static.gpus:
        instances = [MigInstance(d.profile or "", d.start or 0) for d in g.migs
                     if not g.partitionable or d.id in held]
        held_migs = g.partitionable and bool(instances)
        if g.whole is None or held_migs or (g.migs and not g.partitionable):
            mode = GpuMode.MIG
        elif g.shared:
            mode = GpuMode.FRACTIONAL
        else:
            mode = GpuMode.WHOLE
        infos.append(GpuInfo(
            index=g.index, model=g.model, memory_mib=g.memory_mib, mode=mode,
            mig=tuple(sorted(instances, key=lambda i: i.start)) if mode is GpuMode.MIG
            else (),
            replicas=1, memory_source=g.memory_source))
    return DraInventory(static.node, tuple(infos), static.devices,
                        frozenset(g.index for g in static.gpus if g.partitionable),
                        static.clique, static.skipped, static.tainted)


def with_dra_gpus(info: NodeInfo, inventory: DraInventory | None, *,
                  device_plugin: bool = False) -> tuple[NodeInfo, bool]:
    """``info`` (a Node object's reading) with the GPUs of its slices in place of any
    it inferred from labels, and whether they were put there. ``device_plugin``: the
    node's allocatable has GPU resources; it keeps its own GPUs then (KEP-5004: the
    device plugin serves a resource on a node that advertises it; a node runs either the
    device plugin or the DRA driver for its GPUs)."""
    if inventory is None or not inventory.gpus or device_plugin:
        return info, False
    labels = info.labels
    if inventory.clique and CLIQUE_LABEL not in labels:
        labels = {**labels, CLIQUE_LABEL: inventory.clique}
    return replace(info, gpus=inventory.gpus, labels=labels), True


def taint_uses(inventory: DraInventory, held: set[int]) -> list[tuple[PodRequest, Placement]]:
    """A tainted GPU nothing holds, held by its taint (``<node>/gpu-<i>#dra-tainted``):
    the model counts it as not free, as it is for every claim that does not tolerate
    the taint (a tolerating claim still gets it from the allocator)."""
    out = []
    for g in inventory.gpus:
        if g.index in inventory.tainted and g.index not in held and g.mode is GpuMode.WHOLE:
            key = f"{inventory.node}/gpu-{g.index}{TAINT_MARK}"
            out.append((PodRequest(key, kind=RequestKind.WHOLE, gpu_count=1),
                        Placement(key, inventory.node, (g.index,))))
    return out


def _mig_problem(model: GpuModel, profile: object, start: int | None) -> str:
    if not isinstance(profile, str) or not profile:
        return "MIG device without a profile attribute"
    geom = model.mig
    if geom is None or not geom.has_profile(profile):
        return f"{model.name} has no MIG profile {profile}"
    if start is None or start not in geom.profile(profile).starts:
        return f"{profile} cannot start at memory slice {start} on {model.name}"
    return ""


def claim_uses(inventory: DraInventory, claim_key: str,
               results: Iterable[AllocatedDevice], *, cpu_milli: int = 0,
               memory_mib: int = 0) -> list[tuple[PodRequest, Placement]]:
    """What the devices ``results`` of claim ``claim_key`` hold on the inventory's node,
    as the model's (request, placement) pairs (see the module docstring). Results on
    other nodes or on devices that are not GPUs are left out. ``cpu_milli`` and
    ``memory_mib`` go with the first pair (a pod's own, when scoring its prediction)."""
    node = inventory.node
    whole: list[int] = []
    out: list[tuple[PodRequest, Placement]] = []
    for r in results:
        if r.admin_access:
            continue
        dev = inventory.devices.get(f"{r.driver}/{r.pool}/{r.device}")
        if dev is None:
            continue
        gpu = inventory.gpus[dev.gpu] if dev.gpu < len(inventory.gpus) else None
        if gpu is None or gpu.index != dev.gpu:
            gpu = next((g for g in inventory.gpus if g.index == dev.gpu), None)
        if gpu is None:
            continue
        if dev.profile is None and not dev.shared:
            whole.append(dev.gpu)
            continue
        if dev.profile is None:
            mib = _consumed_mib(r, dev.memory_mib)
            milli = max(1, min(GPU_MILLI, math.ceil(GPU_MILLI * mib / max(dev.memory_mib, 1))))
            key = f"{claim_key}{USE_MARK}-{r.device}-{r.share_id or ''}"
            out.append((PodRequest(key, kind=RequestKind.SHARED, gpu_milli=milli,
                                   gpu_memory_mib=mib),
                        Placement(key, node, (dev.gpu,))))
            continue
        key = (f"{inventory.node}/{r.device}{USE_MARK}-shared" if dev.shared
               else f"{claim_key}{USE_MARK}-{r.device}")
        created = not any(i.start == dev.start and i.profile == dev.profile
                          for i in gpu.mig) or gpu.mode is not GpuMode.MIG
        out.append((PodRequest(key, kind=RequestKind.MIG, mig_profile=dev.profile),
                    Placement(key, node, (dev.gpu,), dev.profile, dev.start, created)))
    if whole:
        key = f"{claim_key}{USE_MARK}"
        out.insert(0, (PodRequest(key, kind=RequestKind.WHOLE, gpu_count=len(whole)),
                       Placement(key, node, tuple(sorted(whole)))))
    if out and (cpu_milli or memory_mib):
        req, p = out[0]
        out[0] = (PodRequest(req.key, cpu_milli=cpu_milli, memory_mib=memory_mib,
                             kind=req.kind, gpu_count=req.gpu_count,
                             mig_profile=req.mig_profile, gpu_milli=req.gpu_milli,
                             gpu_memory_mib=req.gpu_memory_mib), p)
    return out


def _consumed_mib(r: AllocatedDevice, device_mib: int) -> int:
    consumed = r.consumed_capacity or {}
    mem = consumed.get("memory")
    return device_mib if mem is None else _mib_up(mem)


def _mib_up(size: Decimal) -> int:
    """Bytes in MiB, rounded up (a share holds whole MiB)."""
    return int((size + Decimal(MIB - 1)) // MIB)


# A whole NVIDIA GPU and one of its MIG partitions, as the driver publishes them: what a
# DeviceClass's selectors are tried on to tell a class of whole GPUs.
_PROBE_GPU = Device("gpu-0", frozen_map({"type": "gpu", "uuid": "GPU-probe",
                                         "productName": "NVIDIA H100 80GB HBM3"}))
_PROBE_MIG = Device("gpu-0-mig-1g10gb-19-0", frozen_map({
    "type": "mig", "parentUUID": "GPU-probe", "profile": "1g.10gb",
    "productName": "NVIDIA H100 80GB HBM3"}))


def whole_gpu_class(klass: DeviceClass) -> bool:
    """Whether ``klass`` selects whole NVIDIA GPUs and not their MIG partitions (its
    selectors tried on a probe of each, :mod:`packing.dra.cel`; an expression outside
    the subset or an error counts as not selecting)."""
    def selects(d: Device) -> bool:
        return all(evaluate(e, d, GPU_DRIVER).outcome is Outcome.TRUE
                   for e in klass.selectors)

    return bool(klass.selectors) and selects(_PROBE_GPU) and not selects(_PROBE_MIG)


def whole_gpu_demand(claims: Iterable[ResourceClaim], classes: Mapping[str, DeviceClass]
                     ) -> int:
    """How many whole GPUs ``claims`` ask for: the counts of their ``ExactCount``
    requests of a whole-GPU class (:func:`whole_gpu_class`). Requests of other classes,
    ``All`` requests and ``firstAvailable`` lists count 0 (their devices are not
    known before allocation)."""
    n = 0
    for c in claims:
        for r in c.requests:
            req = r.exactly
            if req is None or req.allocation_mode != AllocationMode.EXACT_COUNT:
                continue
            klass = classes.get(req.device_class_name)
            if klass is not None and whole_gpu_class(klass):
                n += req.count
    return n


SHARE_PROFILE = "share"  # the metrics' profile of a whole GPU that claims share
WHOLE_PROFILE = "gpu"


def metric_profile(d: GpuDevice) -> str:
    """A device's profile as the metrics name it: its MIG profile, ``share`` for a whole
    GPU with ``allowMultipleAllocations`` (consumable capacity), else ``gpu``."""
    return d.profile or (SHARE_PROFILE if d.shared else WHOLE_PROFILE)


def device_states(inventory: DraInventory, held: set[str] | frozenset[str]
                  ) -> dict[tuple[str, str, str], int]:
    """(GPU model, profile, state) -> devices of the node, for the metrics: ``profile``
    as :func:`metric_profile` names it; ``state`` is ``used`` (a claim holds it; a shared
    GPU while any share of it is held), ``unavailable`` (not held, but what is held of its
    GPU overlaps it: the whole GPU, or MIG memory slices it covers; or its GPU is
    tainted) or ``free``."""
    models = {g.index: g.model for g in inventory.gpus}
    by_gpu: dict[int, list[GpuDevice]] = {}
    for d in inventory.devices.values():
        if d.id in held:
            by_gpu.setdefault(d.gpu, []).append(d)
    out: dict[tuple[str, str, str], int] = {}
    for d in inventory.devices.values():
        model = models.get(d.gpu)
        if model is None:
            continue
        if d.id in held:
            state = "used"
        elif d.gpu in inventory.tainted or any(
                _overlaps(model, d, h) for h in by_gpu.get(d.gpu, ())):
            state = "unavailable"
        else:
            state = "free"
        key = (model, metric_profile(d), state)
        out[key] = out.get(key, 0) + 1
    return out


def shared_memory(inventory: DraInventory, held: set[str] | frozenset[str],
                  consumed: Mapping[str, Mapping[str, Decimal]]
                  ) -> dict[tuple[str, str], int]:
    """(GPU model, state) -> MiB of the node's shared GPUs (whole GPUs with
    ``allowMultipleAllocations``), for the metrics. ``held``: the device ids claims hold
    (whole or shares); ``consumed``: capacity consumed per device id (the allocator's
    ``AllocatedState``). ``used`` = min(the GPU's memory, the ``memory`` its shares
    consumed), all of it when it is held but no share wrote a consumed memory (as
    :func:`claim_uses` counts such a share); ``free`` = the rest, ``unavailable``
    instead where the GPU is tainted or a MIG device of it is held."""
    models = {g.index: g.model for g in inventory.gpus}
    mig_held = {d.gpu for d in inventory.devices.values()
                if d.profile is not None and d.id in held}
    out: dict[tuple[str, str], int] = {}
    for d in inventory.devices.values():
        model = models.get(d.gpu)
        if model is None or not d.shared or d.profile is not None:
            continue
        mem = (consumed.get(d.id) or {}).get("memory")
        if mem is not None:
            used = min(d.memory_mib, _mib_up(mem))
        else:
            used = d.memory_mib if d.id in held else 0
        rest = "unavailable" if d.gpu in inventory.tainted or d.gpu in mig_held else "free"
        for state, mib in (("used", used), (rest, d.memory_mib - used)):
            out[(model, state)] = out.get((model, state), 0) + mib
    return out


def _overlaps(model: str, a: GpuDevice, b: GpuDevice) -> bool:
    """Whether two devices of one GPU cannot both be held (a shared whole GPU with
    shares left over admits more shares, never a MIG partition)."""
    if a.profile is None or b.profile is None:
        return not (a.profile is None and b.profile is None and a.shared and b.shared)
    geom = get_model(model).mig
    if geom is None or a.start is None or b.start is None:
        return True
    ra = range(a.start, a.start + geom.profile(a.profile).memory_slices)
    rb = range(b.start, b.start + geom.profile(b.profile).memory_slices)
    return ra.start < rb.stop and rb.start < ra.stop
