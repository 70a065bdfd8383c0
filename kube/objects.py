"""Kubernetes Pod objects (plain dicts, as JSON/YAML decodes them) to packing types: the
request a pod makes (effective CPU and memory, its GPU resource, the sizing annotations
through their one reader in :mod:`kube.annotations`, its group), the placement gpupack
recorded on it, and the small readers of names and times the other modules share. Node
objects are :mod:`kube.node_objects`.

Every error names the object and the field: ``ObjectError("Pod speech/asr-0:
spec.containers[0].resources.limits.cpu: 'lots' is not a quantity ...")``.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from kube import annotations as A
from kube.fields import ObjectError, field_map, obj_name, str_map
from kube.groups.workload_api import scheduling_group
from packing.catalog import (
    models_with_profile,
    profile_from_resource,
)
from packing.model import (
    GroupRef,
    Placement,
    PodRequest,
    RequestKind,
)
from packing.quantity import QuantityError, parse_quantity


def pod_key(pod: Mapping[str, Any]) -> str:
    """ "namespace/name"; never fails (a malformed object gets a key naming nothing)."""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    if not isinstance(meta, Mapping):
        return "default/"
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


def object_name(obj: object) -> str | None:
    """``metadata.name`` when it is a non-empty string, else None (never fails)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) and name else None


def bound_node(pod: Mapping[str, Any]) -> str | None:
    """``spec.nodeName``, or None when unbound; ObjectError when it is not a string."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    if node is None or node == "":
        return None
    if not isinstance(node, str):
        raise ObjectError(f"{obj_name(pod, 'Pod')}: spec.nodeName: {node!r} is not a string")
    return sys.intern(node)  # one string per node, not one per pod bound to it


# spec.priority is an int32 in the API.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _containers(pod: Mapping[str, Any], field: str, who: str) -> list[Mapping[str, Any]]:
    spec = field_map(pod, "spec", who)
    items = spec.get(field)
    if items is None:
        return []
    if not isinstance(items, list) or not all(isinstance(c, Mapping) for c in items):
        raise ObjectError(f"{who}: spec.{field}: expected a list of containers")
    return items


def _container_resources(c: Mapping[str, Any], path: str, who: str) -> dict[str, Decimal]:
    """requests, falling back to limits (the API server defaults requests from limits)."""
    res = field_map(c, "resources", who)
    out: dict[str, Decimal] = {}
    for section in ("limits", "requests"):
        raw = res.get(section)
        if raw is None:
            continue
        if not isinstance(raw, Mapping):
            raise ObjectError(f"{who}: {path}.resources.{section}: expected an object")
        for k, v in raw.items():
            try:
                out[str(k)] = parse_quantity(v)
            except QuantityError as e:
                raise ObjectError(f"{who}: {path}.resources.{section}.{k}: {e}") from None
    return out


# One object per distinct set of GPU models: every MIG pod of a profile names the same
# models, and each frozenset costs ~200 bytes (an empty one is not shared either).
NO_MODELS: frozenset[str] = frozenset()


NO_SELECTOR: Mapping[str, str] = {}  # shared by every pod without a nodeSelector; read-only


_MODEL_SETS: dict[frozenset[str], frozenset[str]] = {NO_MODELS: NO_MODELS}


def shared_models(models: frozenset[str]) -> frozenset[str]:
    """The one kept frozenset equal to ``models`` (the catalog's profiles are few)."""
    if len(_MODEL_SETS) > 1024:
        _MODEL_SETS.clear()
    return _MODEL_SETS.setdefault(models, models)


def pod_request(pod: Mapping[str, Any], strict: bool = True) -> PodRequest:
    """A PodRequest from a v1 Pod: effective CPU/memory, the GPU resource, group membership.

    ``strict`` (a pod gpupack is to place) refuses what gpupack cannot place as asked:
    more than one MIG slice or share, a group size or worker index it cannot use. A pod
    already bound (``strict=False``) is read as well as it can be, since it holds its
    resources whatever gpupack thinks of it: a count of MIG slices or shares is read as
    one, an unusable group annotation as no group (it is not planned again)."""
    if not isinstance(pod, Mapping):
        raise ObjectError(f"Pod: expected an object, got {type(pod).__name__}")
    who = obj_name(pod, "Pod")
    meta = field_map(pod, "metadata", who)
    if not meta.get("name"):
        raise ObjectError(f"{who}: metadata.name: missing")
    for field in ("name", "namespace"):
        if meta.get(field) is not None and not isinstance(meta[field], str):
            raise ObjectError(f"{who}: metadata.{field}: expected a string")
    labels = str_map(pod, "metadata.labels", who)
    ann = str_map(pod, "metadata.annotations", who)
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for i, c in enumerate(_containers(pod, "containers", who)):
        for k, v in _container_resources(c, f"spec.containers[{i}]", who).items():
            totals[k] += v
    # Effective request: max(sum of containers, largest init container), per resource.
    for i, c in enumerate(_containers(pod, "initContainers", who)):
        for k, v in _container_resources(c, f"spec.initContainers[{i}]", who).items():
            totals[k] = max(totals[k], v)
    cpu = int((Decimal(totals.get("cpu", 0)) * 1000).to_integral_value(rounding="ROUND_CEILING"))
    mem = int(
        (Decimal(totals.get("memory", 0)) / 2**20).to_integral_value(rounding="ROUND_CEILING")
    )

    kind = RequestKind.NONE
    gpu_count = 0
    mig_profile = None
    milli = 0
    gpu_mem = _annotation(A.gpu_memory_mib, ann, who, strict)
    models: frozenset[str] = NO_MODELS
    # A limit of 0 asks for no device (as the device plugin reads it).
    mig_res = [(k, profile_from_resource(k)) for k, v in totals.items()
               if k.startswith(A.MIG_RESOURCE_PREFIX) and v]
    for k, profile in mig_res:
        if profile is None:
            raise ObjectError(f"{who}: resources: {k}: no known GPU has that MIG profile")
    if totals.get(A.GPU_RESOURCE):
        kind = RequestKind.WHOLE
        gpu_count = _whole(totals[A.GPU_RESOURCE], A.GPU_RESOURCE, who)
    elif totals.get(A.SHARED_RESOURCE):
        kind = RequestKind.SHARED
        if strict:
            _one_device(totals[A.SHARED_RESOURCE], A.SHARED_RESOURCE, "GPU share", who)
        milli = _annotation(A.gpu_compute_milli, ann, who, strict)
    elif mig_res:
        if len(mig_res) > 1:
            names = ", ".join(sorted(k for k, _ in mig_res))
            raise ObjectError(f"{who}: resources: more than one MIG resource ({names})")
        if strict:
            _one_device(totals[mig_res[0][0]], mig_res[0][0], "MIG slice", who)
        kind = RequestKind.MIG
        mig_profile = mig_res[0][1]
        models = shared_models(frozenset(m.name for m in models_with_profile(mig_profile or "")))
        if not models:
            raise ObjectError(f"{who}: resources: {mig_res[0][0]}: no known GPU has that profile")
    spec = field_map(pod, "spec", who)
    prio = spec.get("priority")
    if prio is None:
        prio = 0
    if not isinstance(prio, int) or isinstance(prio, bool):
        raise ObjectError(f"{who}: spec.priority: {prio!r} is not an integer")
    if not INT32_MIN <= prio <= INT32_MAX:
        # The API server stores an int32; a pod from a file or a hostile source may not.
        raise ObjectError(f"{who}: spec.priority: {prio} is outside a 32-bit integer")
    klass = ann.get(A.CLASS, "")
    if not klass:
        klass = {"whole": "whole", "mig": "small", "shared": "small", "none": "cpu"}[kind.value]
    return PodRequest(
        key=f"{meta.get('namespace') or 'default'}/{meta['name']}",
        cpu_milli=cpu,
        memory_mib=mem,
        kind=kind,
        gpu_count=gpu_count,
        mig_profile=mig_profile,
        gpu_milli=milli,
        gpu_memory_mib=gpu_mem,
        gpu_models=models,
        node_selector=str_map(pod, "spec.nodeSelector", who) or NO_SELECTOR,
        priority=prio,
        group=_group_of(meta.get("namespace") or "default", labels, ann, spec, who, strict),
        uid=str(meta.get("uid", "")),
        klass=sys.intern(klass),
        admission=admission_id(ann),
    )


def _whole(v: Decimal, field: str, who: str) -> int:
    if v != v.to_integral_value() or v < 1:
        raise ObjectError(f"{who}: resources.{field}: {v} is not a whole number of GPUs")
    return int(v)


def _one_device(v: Decimal, field: str, what: str, who: str) -> None:
    """gpupack places one MIG slice or one share per pod: a pod asking for more would be
    given more devices by the device plugin than gpupack reserved for it."""
    if v != 1:
        raise ObjectError(
            f"{who}: resources.{field}: {v} asked; gpupack places exactly one {what} per "
            f"pod (ask for 1, or use a larger profile or whole GPUs)"
        )


def admission_id(ann: Mapping[str, str]) -> str:
    """The ``id`` the webhook wrote into ``gpupack.io/decision`` ("" when absent or
    unreadable: the decision is the webhook's own record, never an error of the pod)."""
    raw = ann.get(A.DECISION)
    if not raw or '"id"' not in raw:
        return ""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return ""
    value = doc.get("id") if isinstance(doc, dict) else None
    return value if isinstance(value, str) and len(value) <= 128 else ""


def _annotation(read: Callable[[Mapping[str, str]], int | None], ann: Mapping[str, str],
                who: str, strict: bool) -> int:
    """A sizing annotation through its one reader (:mod:`kube.annotations`), 0 when
    absent. A pod to place (``strict``) with a value gpupack cannot use is refused,
    naming the field; a pod already bound holds what it holds whatever its annotation
    says, so it is read as declaring nothing (0) rather than skipped, which would free
    the GPU share it takes for the next pod."""
    try:
        return read(ann) or 0
    except A.AnnotationError as e:
        if strict:
            raise ObjectError(f"{who}: metadata.annotations.{e.key}: {e}") from None
        return 0


def _group_of(namespace: str, labels: Mapping[str, str], ann: Mapping[str, str],
              spec: Mapping[str, Any], who: str, strict: bool) -> GroupRef | None:
    try:
        return group_ref(namespace, labels, ann, who, scheduling_group(spec, who))
    except ObjectError:
        if strict:
            raise
        return None


def group_ref(
    namespace: str, labels: Mapping[str, str], ann: Mapping[str, str], who: str,
    pod_group: str | None = None,
) -> GroupRef | None:
    """Group membership, by the one rule (docs/groups.md): the first of

    1. ``spec.schedulingGroup.podGroupName`` (``pod_group``): the PodGroup of that name
       in the pod's namespace, kube-scheduler's own gang. Its size, minimum and topology
       come from the object (resolved by the reservation book): here size 1;
    2. the LeaderWorkerSet labels and ``leaderworkerset.sigs.k8s.io/size``;
    3. ``gpupack.io/group`` and ``gpupack.io/group-size``

    names the pod's group; what the others say of a group is not read for this pod.
    Every key starts with the pod's own namespace: no source lets a pod join a group of
    another namespace."""
    if pod_group is not None:
        worker = A.small_int(labels.get(A.LWS_WORKER_INDEX, "0"))
        return GroupRef(key=f"{namespace}/{pod_group}", size=1,
                        index=worker if worker is not None else 0, pod_group=pod_group)
    if A.LWS_NAME in labels:
        size = _group_size(ann.get(A.LWS_SIZE, "1"), f"metadata.annotations.{A.LWS_SIZE}", who)
        group_index = labels.get(A.LWS_GROUP_INDEX, "0")
        worker_text = labels.get(A.LWS_WORKER_INDEX, "0")
        worker = A.small_int(worker_text)
        if worker is None or worker >= size:
            raise ObjectError(
                f"{who}: metadata.labels.{A.LWS_WORKER_INDEX}: {worker_text[:40]!r} is not "
                f"an index below the group size {size}"
            )
        topo = ann.get(A.LWS_EXCLUSIVE)
        return GroupRef(
            key=f"{namespace}/{labels[A.LWS_NAME]}/{group_index}",
            size=size,
            index=worker,
            topology_key=topo,
            exclusive=topo is not None,
        )
    if A.GROUP in ann:
        size = _group_size(ann.get(A.GROUP_SIZE, ""), f"metadata.annotations.{A.GROUP_SIZE}",
                           who)
        return GroupRef(
            key=f"{namespace}/{ann[A.GROUP]}",
            size=size,
            topology_key=ann.get(A.GROUP_TOPOLOGY),
        )
    return None


def _group_size(text: str, field: str, who: str) -> int:
    size = A.small_int(text)
    if size is None or size < 1:
        raise ObjectError(f"{who}: {field}: {text[:40]!r} is not a group size")
    if size > A.MAX_GROUP_SIZE:
        raise ObjectError(
            f"{who}: {field}: {size} pods is more than gpupack places as one group "
            f"(at most {A.MAX_GROUP_SIZE})"
        )
    return size


def recorded_placement(pod: Mapping[str, Any], node: str) -> Placement | None:
    """The placement gpupack recorded on a bound pod (annotations), if any."""
    who = obj_name(pod, "Pod")
    ann = str_map(pod, "metadata.annotations", who)
    if A.GPUS not in ann:
        return None
    try:
        gpus = A.parse_gpus(ann[A.GPUS])
        mig = A.parse_mig(ann[A.MIG]) if A.MIG in ann else None
    except ValueError as e:
        raise ObjectError(f"{who}: metadata.annotations: {e}") from None
    key = pod_key(pod)
    if mig is None:
        return Placement(key, node, gpus)
    if len(gpus) != 1:
        # A MIG slice lives on one GPU: any other count is no placement at all (and
        # everything downstream reads the slice's GPU as gpus[0]).
        raise ObjectError(f"{who}: metadata.annotations: {A.MIG}={ann[A.MIG][:60]!r} "
                          f"needs exactly one GPU in {A.GPUS}, got {ann[A.GPUS][:60]!r}")
    return Placement(key, node, gpus, mig[0], mig[1], False)


# RFC 3339 as the API server writes a Time or MicroTime: date, "T", time, an optional
# fraction, and a zone ("Z" or an offset). ISO 8601's other forms (no zone, which would
# be read in this process's local time; a date alone; week dates; a space for the "T")
# are not times the API server writes, so not read as one.
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?"
    r"(?:(Z)|([+-])([0-9]{2}):([0-9]{2}))")


def parse_time(value: object) -> float | None:
    """An RFC 3339 time (a Time or MicroTime: ``2026-01-01T00:00:00.123456Z``) as epoch
    seconds; None when it is absent or not one."""
    if not isinstance(value, str):
        return None
    m = _RFC3339.fullmatch(value)
    if m is None:
        return None
    y, mo, d, h, mi, sec = (int(g) for g in m.groups()[:6])
    frac, zulu, sign, oh, om = m.group(7), m.group(8), m.group(9), m.group(10), m.group(11)
    try:
        offset = timedelta(0)
        if not zulu:
            if int(oh) > 23 or int(om) > 59:
                return None
            offset = timedelta(hours=int(oh), minutes=int(om)) * (-1 if sign == "-" else 1)
        t = datetime(y, mo, d, h, mi, sec, tzinfo=timezone(offset)).timestamp()
    except (ValueError, OverflowError):  # a month 13, a 25th hour, a 60th second
        return None
    return t + float(frac) if frac else t


def started_at(pod: object) -> float | None:
    """When the kubelet acknowledged the pod (``status.startTime``, the node's clock) as
    epoch seconds; None before it did, or when the field is not a time."""
    status = pod.get("status") if isinstance(pod, Mapping) else None
    return parse_time(status.get("startTime")) if isinstance(status, Mapping) else None


def is_finished(pod: Mapping[str, Any]) -> bool:
    phase = (
        (pod.get("status") or {}).get("phase") if isinstance(pod.get("status"), Mapping) else None
    )
    return phase in ("Succeeded", "Failed")
