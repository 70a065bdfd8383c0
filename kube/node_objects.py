"""Kubernetes Node objects (plain dicts, as JSON/YAML decodes them) to packing NodeInfos.

Node-level truth comes from ``status.allocatable`` and GPU Feature Discovery labels.
Per-GPU detail (which GPU is MIG, shared or whole; the MIG layout) is not in the API:
unless the node agent reported it (the ``gpupack.io/inventory`` annotation, checked here
against the catalog), it is inferred here and marked ``inferred=True``. What the agent
observed beyond the GPUs (the GPU of each time-sliced pod, peaks, memory in use) is
read into a :class:`NodeObservation`.

Every error names the node and the field (:class:`kube.fields.ObjectError`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from dataclasses import field as dc_field
from functools import lru_cache
from typing import Any

from kube import annotations as A
from kube.constraints import node_taints
from kube.fields import ObjectError, field_map, obj_name, str_map
from kube.objects import object_name
from packing.catalog import (
    SHARING_MPS,
    GpuModel,
    get_model,
    match_product,
    profile_from_resource,
)
from packing.device_plugin import AllocationPolicy
from packing.inventory import GpuInventory, Inventory, InventoryError, decode_inventory
from packing.mig.layout import MigSlot, layout_errors, layout_from_counts
from packing.model import (
    MAX_NODE_GPUS,
    GpuInfo,
    GpuMode,
    MigInstance,
    MigReconfigure,
    NodeInfo,
    Taint,
)
from packing.quantity import QuantityError, count, cpu_milli, memory_mib

# Stands for a node's taints when they cannot be read: no pod tolerates it.
UNREADABLE_TAINTS = Taint("gpupack.io/unreadable-taints", "", "NoSchedule")


def node_info(node: Mapping[str, Any], notes: list[str] | None = None, *,
              mig_actuator: bool = False) -> NodeInfo:
    """A NodeInfo from a v1 Node.

    Per-GPU modes and MIG layouts come from the node agent's ``gpupack.io/inventory``
    annotation when it is present and readable; otherwise they are inferred from
    allocatable and labels (and marked inferred). An unreadable inventory is noted in
    ``notes`` and ignored: the node is still usable with inferred detail.
    ``mig_actuator``: whether something creates MIG slices on nodes that opt in
    (``gpupack.io/mig-reconfigure: "true"``); only then may their layouts change.
    """
    if not isinstance(node, Mapping):
        raise ObjectError(f"Node: expected an object, got {type(node).__name__}")
    who = obj_name(node, "Node")
    field_map(node, "metadata", who)
    name = object_name(node)
    if name is None:
        raise ObjectError(f"{who}: metadata.name: missing")
    labels = str_map(node, "metadata.labels", who)
    annotations = str_map(node, "metadata.annotations", who)
    alloc = field_map(node, "status.allocatable", who)

    def q(resource: str, conv: Any, default: Any = 0) -> Any:
        if resource not in alloc:
            return default
        try:
            return conv(alloc[resource])
        except QuantityError as e:
            raise ObjectError(f"{who}: status.allocatable.{resource}: {e}") from None

    cpu = q("cpu", cpu_milli)
    mem = q("memory", memory_mib)
    whole = q(A.GPU_RESOURCE, count)
    shared = q(A.SHARED_RESOURCE, count)
    mig_counts: dict[str, int] = {}
    for res in alloc:
        profile = profile_from_resource(str(res))
        if profile is not None:
            # Time-sliced MIG devices are advertised once per replica; GFD labels the
            # replicas under the resource's configured name, without the ".shared" the
            # device plugin adds when it renames it. gpupack counts the instances.
            base = str(res).removesuffix(".shared")
            replicas = _label_int(who, labels, f"{base}.replicas") or 1
            n = q(str(res), count)
            mig_counts[profile] = max(1, n // replicas) if n else 0
    gpus = _infer_gpus(who, labels, whole, shared, mig_counts)
    if A.INVENTORY in annotations:
        field = f"{who}: metadata.annotations.{A.INVENTORY}"
        try:
            inv, models, refused = _checked(annotations[A.INVENTORY], name)
            if refused and not inv.gpus:
                raise ValueError(refused[0][1])  # nothing left of it: the node inferred
            gpus = _observed_gpus(inv, models, labels, gpus)
            if notes is not None:
                notes.extend(f"{field}: {why}; GPU {index} left out (as if the agent had "
                             "not seen it)" for index, why in refused)
        except (InventoryError, ValueError) as e:
            if notes is not None:
                notes.append(f"{field}: {e}; inferred instead")
    spec = node.get("spec") or {}
    opt_in = _mig_opt_in(who, labels, annotations, notes)
    share_policy = AllocationPolicy.DISTRIBUTED
    policy_label = labels.get(A.SHARE_ALLOCATION_POLICY)
    if policy_label is not None:
        try:
            share_policy = AllocationPolicy(policy_label)
        except ValueError:
            if notes is not None:
                notes.append(f"{who}: metadata.labels.{A.SHARE_ALLOCATION_POLICY}: "
                             f"{policy_label[:40]!r} is not one of "
                             f"{'|'.join(AllocationPolicy)}; distributed assumed")
    try:
        taints = node_taints(node)
    except ObjectError as e:
        # Usable for pods kube-scheduler places, but gpupack cannot tell which pods
        # tolerate it: counted as tainted for every pod.
        taints = (UNREADABLE_TAINTS,)
        if notes is not None:
            notes.append(f"{e}; counted as tainted for every pod")
    return NodeInfo(
        name=name,
        cpu_milli=cpu,
        memory_mib=mem,
        gpus=gpus,
        labels=labels,
        unschedulable=bool(spec.get("unschedulable", False))
        if isinstance(spec, Mapping)
        else False,
        mig_reconfigure=MigReconfigure.of(opt_in, mig_actuator),
        share_policy=share_policy,
        taints=taints,
    )


def advertises_gpus(node: Mapping[str, Any]) -> bool:
    """Whether the Node's allocatable has a GPU resource of the device plugin
    (``nvidia.com/gpu``, ``nvidia.com/gpu.shared``, ``nvidia.com/mig-<profile>``) with a
    count above zero: its GPUs are the device plugin's, whatever ResourceSlices name the
    node (KEP-5004 decides per node: the device plugin serves a resource the node
    advertises, DRA one it does not). An unreadable count counts as advertised."""
    status = node.get("status") if isinstance(node, Mapping) else None
    alloc = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(alloc, Mapping):
        return False
    for res, value in alloc.items():
        res = str(res)
        if res in (A.GPU_RESOURCE, A.SHARED_RESOURCE) or profile_from_resource(res):
            try:
                if count(value):
                    return True
            except (QuantityError, ValueError, TypeError):
                return True
    return False


def _mig_opt_in(who: str, labels: Mapping[str, str], annotations: Mapping[str, str],
                notes: list[str] | None) -> bool | None:
    """The node's ``gpupack.io/mig-reconfigure`` label: True for "true", False for
    "false", None when absent or unreadable (noted): no opt-in. The annotation of that
    name may only freeze a node ("false"): the node agent may write ``gpupack.io/``
    annotations of its Node (its ValidatingAdmissionPolicy), never labels, so a
    compromised agent must not be able to opt its node in; an annotation "true" is
    ignored (noted)."""
    value = labels.get(A.MIG_RECONFIGURE)
    if value is not None:
        if value in ("true", "false"):
            return value == "true"
        if notes is not None:
            notes.append(f'{who}: metadata.labels.{A.MIG_RECONFIGURE}: {value!r} is not '
                         '"true" or "false"; the node does not opt in')
        return None
    value = annotations.get(A.MIG_RECONFIGURE)
    if value == "false":
        return False
    if value is not None and notes is not None:
        notes.append(f'{who}: metadata.annotations.{A.MIG_RECONFIGURE}: {value[:40]!r} '
                     'ignored: only the label opts a node in (the node agent may write '
                     'gpupack.io/ annotations)')
    return None


def checked_inventory(text: str, node: str | None) -> Inventory:
    """The node agent's inventory of ``node`` (None: any), decoded and checked against the
    catalog; InventoryError or ValueError naming the field otherwise. A GPU that breaks
    the catalog (memory over its model's, a MIG layout its model does not allow) is left
    out, as if the agent had not seen it; the rest stands. Both readers use it:
    :func:`node_info` (GPU detail) and :func:`observation_of` (pod peaks, shares, used
    memory), so what is refused for one is refused for the other."""
    return _checked(text, node)[0]


def _checked(text: str, node: str | None
             ) -> tuple[Inventory, list[Any], list[tuple[int, str]]]:
    """:func:`checked_inventory`, with each kept GPU's catalog model (what node_info builds
    on) and the (index, reason) of each GPU left out."""
    inv = decode_inventory(text)
    if node is not None and inv.node != node:
        raise ValueError(f"node: {inv.node[:63]!r} wrote it, not {node[:63]!r} (copied from "
                         "another node?)")
    if len(inv.gpus) > MAX_NODE_GPUS:
        raise ValueError(f"{len(inv.gpus)} GPUs, more than one node has (at most "
                         f"{MAX_NODE_GPUS})")
    kept, models, refused = [], [], []
    for k, g in enumerate(inv.gpus):
        try:
            models.append(_catalog_model(g, k))
        except (InventoryError, ValueError) as e:
            refused.append((g.index, str(e)))
            continue
        kept.append(g)
    if refused:
        inv = replace(inv, gpus=tuple(kept))
    return inv, models, refused


def _catalog_model(g: GpuInventory, k: int) -> Any:
    """The catalog model of reported GPU ``k``; ValueError when the catalog does not know
    it at that memory, or its MIG layout is not one its model allows."""
    model = match_product(g.model, g.memory_mib)
    _within_catalog(model, g.memory_mib, f"gpus[{k}].mem")
    if g.mode is GpuMode.MIG:
        # The layout is checked against the model's geometry here, where the model is
        # known: a MIG GPU the catalog has no MIG for, or an instance off its allowed
        # starts, would otherwise reach the scorers and the planner as truth.
        geom = model.mig
        if geom is None:
            raise ValueError(f"GPU {g.index} ({model.name}) is reported in MIG mode, "
                             f"but {model.name} has no MIG")
        errors = layout_errors(geom, g.mig)
        if errors:
            raise ValueError(f"GPU {g.index} ({model.name}): MIG layout: " + "; ".join(errors))
    return model


def _observed_gpus(
    inv: Inventory, models: list[Any], labels: Mapping[str, str],
    inferred: tuple[GpuInfo, ...]
) -> tuple[GpuInfo, ...]:
    """GPUs as the node agent saw them: real modes, MIG layouts and owners."""
    if not inv.gpus:
        return inferred  # the agent saw nothing (no driver yet): keep what the API says
    replicas = A.small_int(labels.get(A.GPU_REPLICAS, "1")) or 1
    out = []
    for g, model in zip(inv.gpus, models, strict=True):
        out.append(
            GpuInfo(
                index=g.index,
                model=model.name,
                memory_mib=g.memory_mib,
                mode=g.mode,
                mig=g.mig,
                replicas=replicas if g.mode is GpuMode.SHARED else 1,
                inferred=False,
                mps=g.mode is GpuMode.SHARED and labels.get(A.SHARING_STRATEGY) == SHARING_MPS,
                memory_source="nvml",
            )
        )
    return tuple(out)


# How far above its catalog size a known model's memory, as the node agent reports it,
# is taken. NVML reports at most the nominal size (a few percent less: an L40S is 46,068
# MiB of 49,152, an H100-80GB 81,559 of 81,920); the margin leaves room for a part the
# catalog reads as its nearest sibling (a GH200 with 144 GB is read as an H200-141GB:
# +1.2%). More than that is not the GPU the model says, and every share would be packed
# into memory it does not have. A model the catalog does not know is sized by the figure
# itself: packing.inventory.MAX_GPU_MIB bounds it.
CATALOG_MEMORY_MARGIN_PCT = 10


def _within_catalog(model: GpuModel, memory_mib: int, field: str) -> None:
    """InventoryError naming ``field`` when ``memory_mib`` is more than known ``model``
    has (its catalog size plus the margin); nothing for a generic model."""
    if model.generic:
        return
    limit = model.memory_mib * (100 + CATALOG_MEMORY_MARGIN_PCT) // 100
    if memory_mib > limit:
        raise InventoryError(field, memory_mib,
                             f"at most {limit} MiB for a {model.name} (its catalog "
                             f"{model.memory_mib} MiB + {CATALOG_MEMORY_MARGIN_PCT}%)")


@dataclass(frozen=True)
class NodeObservation:
    """What the node agent saw on a node (its inventory), beyond the GPUs themselves:
    the time-sliced GPU each pod holds a replica of (PodResources), each pod's peak GPU
    memory, and the memory in use on each GPU. MIG owners are in the node's GPUs."""

    shares: Mapping[str, int] = dc_field(default_factory=dict)  # pod -> GPU index
    peaks: Mapping[str, int] = dc_field(default_factory=dict)  # pod -> MiB
    used: Mapping[int, int] = dc_field(default_factory=dict)  # GPU index -> MiB in use


NO_OBSERVATION = NodeObservation()


def inventory_text(node: Mapping[str, Any]) -> str | None:
    """The node's inventory annotation, if it has one."""
    meta = node.get("metadata") if isinstance(node, Mapping) else None
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    text = ann.get(A.INVENTORY) if isinstance(ann, Mapping) else None
    return text if isinstance(text, str) else None


def observation_of(text: str | None, node: str | None = None) -> NodeObservation:
    """The :class:`NodeObservation` of ``node``'s inventory annotation; empty when there
    is none or it is refused (:func:`checked_inventory`; node_info notes why)."""
    if text is None:
        return NO_OBSERVATION
    try:
        inv = checked_inventory(text, node)
    except (InventoryError, ValueError):
        return NO_OBSERVATION
    shares: dict[str, int] = {}
    twice: set[str] = set()
    peaks: dict[str, int] = {}
    used: dict[int, int] = {}
    for g in inv.gpus:
        used[g.index] = g.used_mib
        for u in g.pods:
            peaks[u.pod] = max(peaks.get(u.pod, 0), u.peak_mib)
            if g.mode is GpuMode.SHARED:
                if u.pod in shares:
                    twice.add(u.pod)  # replicas of two GPUs: not one share's GPU
                shares[u.pod] = g.index
    for pod in twice:
        del shares[pod]
    return NodeObservation(shares, peaks, used)


def observed_peaks(node: Mapping[str, Any]) -> dict[str, int]:
    """Peak GPU memory (MiB) per pod key from the node's inventory, if readable."""
    return dict(observation_of(inventory_text(node), object_name(node)).peaks)


def _label_int(who: str, labels: Mapping[str, str], key: str) -> int | None:
    if key not in labels:
        return None
    value = A.small_int(labels[key])
    if value is None:
        raise ObjectError(
            f"{who}: metadata.labels.{key}: {labels[key][:40]!r} is not a non-negative integer"
        )
    return value


def _at_most(who: str, what: str, n: int, limit: int) -> None:
    if n > limit:
        raise ObjectError(
            f"{who}: {what}: {n} is more than gpupack handles on one node (at most {limit})"
        )


def _infer_gpus(
    who: str,
    labels: Mapping[str, str],
    whole: int,
    shared: int,
    mig_counts: Mapping[str, int],
) -> tuple[GpuInfo, ...]:
    product = labels.get(A.PRODUCT)
    mem_label = _label_int(who, labels, A.GPU_MEMORY_LABEL)
    total = _label_int(who, labels, A.GPU_COUNT)
    if product is None and mem_label is None and not (whole or shared or mig_counts):
        return ()  # a CPU node
    try:
        model = match_product(product, mem_label)
    except ValueError as e:
        raise ObjectError(f"{who}: metadata.labels.{A.PRODUCT}: {e}") from None
    replicas = _label_int(who, labels, A.GPU_REPLICAS) or 1
    strategy = labels.get(A.SHARING_STRATEGY, "none")
    n_shared = 0
    if shared:
        n_shared = max(1, shared // replicas)
    elif strategy in ("time-slicing", "mps") and replicas > 1 and whole:
        # Sharing without renaming: nvidia.com/gpu counts replicas, not GPUs.
        n_shared, whole = max(1, whole // replicas), 0
    # Bounds first: every count below becomes objects, and the MIG spread is a search.
    _at_most(who, f"metadata.labels.{A.GPU_COUNT}", total or 0, MAX_NODE_GPUS)
    _at_most(who, f"status.allocatable.{A.GPU_RESOURCE}", whole, MAX_NODE_GPUS)
    _at_most(who, f"status.allocatable.{A.SHARED_RESOURCE} / replicas", n_shared,
             MAX_NODE_GPUS)
    layouts = _infer_mig_layouts(who, model, mig_counts)
    if total is None:
        total = whole + n_shared + len(layouts)
    n_mig = max(len(layouts), total - whole - n_shared)
    _at_most(who, "GPUs (whole + shared + MIG)", whole + n_shared + n_mig, MAX_NODE_GPUS)
    gpus: list[GpuInfo] = []
    # The node's own figure wins over the catalog's nominal one (an L40S is 49,152 MiB
    # in the catalog, 46,068 MiB as GFD reports it): GFD's nvidia.com/gpu.memory, except
    # under the single MIG strategy, where it is a MIG device's size (the product then
    # names the profile) and on MIG GPUs, whose instances have the catalog's sizes.
    mem, source = model.memory_mib, "catalog"
    if mem_label and "-MIG-" not in (product or "").upper():
        mem, source = mem_label, "gfd"
    for _ in range(whole):
        gpus.append(GpuInfo(len(gpus), model.name, mem, GpuMode.WHOLE, inferred=True,
                            memory_source=source))
    mps = strategy == SHARING_MPS
    for _ in range(n_shared):
        gpus.append(
            GpuInfo(len(gpus), model.name, mem, GpuMode.SHARED, replicas=replicas, inferred=True,
                    mps=mps, memory_source=source)
        )
    for i in range(n_mig):
        layout = layouts[i] if i < len(layouts) else ()
        instances = tuple(MigInstance(s.profile, s.start) for s in layout)
        if model.mig_capable:
            gpus.append(GpuInfo(len(gpus), model.name, model.memory_mib, GpuMode.MIG, instances,
                                inferred=True))
        else:
            gpus.append(GpuInfo(len(gpus), model.name, mem, GpuMode.WHOLE, instances,
                                inferred=True, memory_source=source))
    return tuple(gpus)


def _infer_mig_layouts(
    who: str, model: GpuModel, mig_counts: Mapping[str, int]
) -> list[tuple[MigSlot, ...]]:
    """Spread the node's MIG instance counts over GPUs, largest instances first."""
    if not any(mig_counts.values()):
        return []
    geom = model.mig
    if geom is None:
        raise ObjectError(
            f"{who}: status.allocatable: MIG resources on {model.name}, which has no MIG"
        )
    for p in mig_counts:
        if not geom.has_profile(p):
            raise ObjectError(
                f"{who}: status.allocatable.{A.MIG_RESOURCE_PREFIX}{p}: "
                f"not a profile of {model.name}"
            )
    # Every instance takes at least one compute slice of its GPU.
    _at_most(who, "status.allocatable: MIG instances", sum(mig_counts.values()),
             MAX_NODE_GPUS * geom.compute_slices)
    return list(_spread_instances(model.name, tuple(sorted(mig_counts.items()))))


@lru_cache(maxsize=4096)
def _layout(
    model_name: str, counts: tuple[tuple[str, int], ...]
) -> tuple[MigSlot, ...] | None:
    """``layout_from_counts`` memoised: the spread below asks the same few questions of
    every GPU it fills."""
    geom = get_model(model_name).mig
    assert geom is not None
    return layout_from_counts(geom, counts)


@lru_cache(maxsize=1024)
def _spread_instances(
    model_name: str, counts: tuple[tuple[str, int], ...]
) -> tuple[tuple[MigSlot, ...], ...]:
    """Memoised: the search is ~0.1 s per node, and a cluster has few distinct
    (model, instance counts) shapes, so thousands of nodes share a handful of answers."""
    geom = get_model(model_name).mig
    assert geom is not None
    wanted = sorted(
        (p for p, n in counts for _ in range(n)),
        key=lambda p: (-geom.profile(p).memory_slices, p),
    )
    per_gpu: list[Counter[str]] = []
    # Memory and compute slices taken on each GPU: necessary conditions checked before
    # the layout search, so a full GPU costs O(1) to pass over, not a search.
    used: list[tuple[int, int]] = []
    for p in wanted:
        prof = geom.profile(p)
        for i, c in enumerate(per_gpu):
            mem, comp = used[i]
            if (mem + prof.memory_slices > geom.memory_slices
                    or comp + prof.compute_slices > geom.compute_slices
                    or c[p] >= prof.max_count):
                continue
            c[p] += 1
            if _layout(model_name, tuple(sorted((+c).items()))) is not None:
                used[i] = (mem + prof.memory_slices, comp + prof.compute_slices)
                break
            c[p] -= 1
        else:
            per_gpu.append(Counter({p: 1}))
            used.append((prof.memory_slices, prof.compute_slices))
    out = []
    for c in per_gpu:
        layout = _layout(model_name, tuple(sorted((+c).items())))
        assert layout is not None
        out.append(layout)
    return tuple(out)
