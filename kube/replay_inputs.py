"""A cluster's Nodes and Pods as a day to replay (``gpupack simulate --from-cluster`` and
``--nodes FILE --pods FILE``): its pods created again, in creation order, on its nodes.

Each pod that is not finished becomes one creation at its ``metadata.creationTimestamp``
(seconds after the earliest), read as it was created: its node (``spec.nodeName``), its
status and gpupack's placement records are left out, so both schedulers place it anew.
Its request as written is what plain kube-scheduler places (:func:`pod_request`, with
the GPU memory the node agent saw it use when a node reports it); the object itself is
what gpupack's webhook admits. Pods of one workload (a Deployment's ReplicaSets, a
StatefulSet, a LeaderWorkerSet) are told apart by their controller, as PodTopologySpread
and the ReplicaSet controller tell them apart.

Nodes become pools of nodes of the same kind (same GPUs and modes, layouts, CPU and
memory), named after their names' common stem, for the sizing search, which may add
nodes of a pool's kind (copies of its first node).

What the replay cannot model is listed in :attr:`ClusterDay.unmodelled`, never dropped
in silence: a pod asking for a device gpupack does not know (another vendor's resource,
a DRA resource claim), a pod gpupack cannot place as it asks (more than one MIG slice
or share), a DaemonSet's or a static pod that asks for a GPU. DaemonSet and static pods
that ask for none run on their node whoever schedules the rest: their CPU and memory
are taken off that node's (and its pool's added nodes') allocatable, and a note says so.
A Node or Pod that cannot be read is an :class:`ObjectError` naming the object and the
field.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kube import annotations as A
from kube.node_objects import inventory_text, node_info, observation_of
from kube.objects import (
    ObjectError,
    is_finished,
    object_name,
    parse_time,
    pod_key,
    pod_request,
)
from kube.snapshot import with_observed_peak
from packing.day import Create, Day, DayPod, Pool
from packing.model import NodeInfo, PodRequest, RequestKind

# Extended resources a pod may ask for that are devices gpupack places.
_KNOWN_DEVICES = (A.GPU_RESOURCE, A.SHARED_RESOURCE)
# Resources with a domain that are not devices (kube-scheduler counts them by name).
_NOT_DEVICES = ("hugepages-", "ephemeral-storage", "kubernetes.io/")
_MIRROR = "kubernetes.io/config.mirror"
_HASH = "pod-template-hash"


@dataclass(frozen=True)
class ClusterDay:
    day: Day
    unmodelled: tuple[str, ...]  # "Pod ns/name: why", not replayed
    notes: tuple[str, ...]  # what was read in a particular way
    replayed: int  # pods replayed


def _field(obj: Any, key: str) -> Mapping[str, Any]:
    """``obj[key]`` when both are mappings, else an empty one (what a field that is
    absent or of another type holds, as far as these readers go)."""
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _devices(pod: Mapping[str, Any]) -> list[str]:
    """Extended resources the pod's containers ask for that gpupack does not place."""
    out = set()
    for key in ("containers", "initContainers"):
        containers = _field(pod, "spec").get(key)
        for c in containers if isinstance(containers, list) else []:
            res = _field(c, "resources")
            for part in ("requests", "limits"):
                for raw in _field(res, part):
                    name = str(raw)
                    if ("/" in name and name not in _KNOWN_DEVICES
                            and not name.startswith(A.MIG_RESOURCE_PREFIX)
                            and not name.startswith(_NOT_DEVICES)):
                        out.add(name)
    return sorted(out)


def _owner(pod: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, name) of the pod's controller; ("", "") for none."""
    refs = _field(pod, "metadata").get("ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return str(ref.get("kind", "")), str(ref.get("name", ""))
    return "", ""


def workload_of(pod: Mapping[str, Any]) -> str:
    """The workload a pod belongs to: its LeaderWorkerSet, its Deployment (its
    ReplicaSet without the pod-template hash), or its controller; "" for none."""
    meta = _field(pod, "metadata")
    ns = meta.get("namespace") or "default"
    labels = _field(meta, "labels")
    if A.LWS_NAME in labels:
        return f"{ns}/{labels[A.LWS_NAME]}"
    kind, name = _owner(pod)
    if not name:
        return ""
    digest = labels.get(_HASH)
    if kind == "ReplicaSet" and digest and name.endswith(f"-{digest}"):
        name = name[: -len(digest) - 1]
    return f"{ns}/{name}"


def as_created(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod as it was created: no node, no status, no placement records."""
    out = {k: v for k, v in pod.items() if k != "status"}
    spec = dict(out.get("spec") or {})
    spec.pop("nodeName", None)
    out["spec"] = spec
    meta = dict(out.get("metadata") or {})
    ann = {k: v for k, v in (meta.get("annotations") or {}).items()
           if k not in A.BIND_RECORDS}
    meta["annotations"] = ann
    for k in ("resourceVersion", "managedFields", "deletionTimestamp"):
        meta.pop(k, None)
    out["metadata"] = meta
    return out


def _request(pod: Mapping[str, Any], who: str) -> tuple[PodRequest | None, str]:
    """The pod's request, or None and why gpupack cannot place it as it asks. A pod
    that cannot be read at all raises ObjectError."""
    try:
        return pod_request(pod), ""
    except ObjectError as strict:
        pod_request(pod, strict=False)  # unreadable: raises, naming the field
        return None, str(strict).removeprefix(f"{who}: ")


def _signature(n: NodeInfo) -> tuple[Any, ...]:
    gpus = tuple((g.model, g.mode.value, g.replicas, g.mps,
                  tuple((i.profile, i.start) for i in g.mig)) for g in n.gpus)
    return (gpus, n.cpu_milli, n.memory_mib, n.mig_reconfigure.value,
            tuple(sorted((t.key, t.value, t.effect) for t in n.taints)))


def _stem(names: Sequence[str]) -> str:
    stems = {re.sub(r"[-_.]?\d+$", "", n) or n for n in names}
    return stems.pop() if len(stems) == 1 else ""


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def pools_of(nodes: Sequence[NodeInfo], spare: int,
             kinds_of: Mapping[str, NodeInfo] | None = None) -> tuple[Pool, ...]:
    """Nodes of the same kind as one pool each, with ``spare`` times as many copies of
    the pool's first node the sizing search may add. ``kinds_of``: the node whose kind
    counts, by name (the node before DaemonSet pods were taken off it)."""
    kinds: dict[tuple[Any, ...], list[NodeInfo]] = defaultdict(list)
    for n in nodes:
        kinds[_signature((kinds_of or {}).get(n.name, n))].append(n)
    pools: list[Pool] = []
    used: set[str] = set()
    for i, members in enumerate(kinds.values()):
        members.sort(key=lambda n: _natural(n.name))
        first = members[0]
        # One node: its own name; more: their common stem ("h100-mig" of h100-mig-0..3).
        name = (first.name if len(members) == 1
                else _stem([n.name for n in members]) or f"pool-{i}")
        while name in used:
            name = f"{name}-k{i}"
        used.add(name)
        extra = tuple(replace(first, name=f"{name}-added-{k}",
                              labels={**first.labels,
                                      "kubernetes.io/hostname": f"{name}-added-{k}"})
                      for k in range(spare * len(members)))
        pools.append(Pool(name, (*members, *extra), len(members)))
    return tuple(pools)


def _pinned(pod: Mapping[str, Any]) -> bool:
    """A DaemonSet's pod or a static (mirror) pod: it runs on its node whatever
    schedules the rest."""
    ann = _field(_field(pod, "metadata"), "annotations")
    return _owner(pod)[0] == "DaemonSet" or _MIRROR in ann


def cluster_day(nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
                spare: int = 2) -> ClusterDay:
    """See the module docstring; ObjectError on a Node or Pod that cannot be read."""
    notes: list[str] = []
    unmodelled: list[str] = []
    infos: dict[str, NodeInfo] = {}
    peaks: dict[str, Mapping[str, int]] = {}
    for obj in nodes:
        info = node_info(obj, notes)
        if info.name in infos:
            raise ObjectError(f"Node {info.name}: metadata.name: duplicate node")
        infos[info.name] = info
        peaks[info.name] = observation_of(inventory_text(obj), info.name).peaks
    overhead: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    creates: list[tuple[float, str, DayPod]] = []
    finished = 0
    seen: set[str] = set()
    for obj in pods:
        if not isinstance(obj, Mapping):
            raise ObjectError(f"Pod: expected an object, got {type(obj).__name__}")
        key = pod_key(obj) if object_name(obj) else "Pod"
        who = f"Pod {key}"
        if key in seen:
            raise ObjectError(f"{who}: metadata.name: duplicate pod")
        seen.add(key)
        if is_finished(obj):
            finished += 1
            continue
        created = parse_time(_field(obj, "metadata").get("creationTimestamp"))
        devices = _devices(obj)
        spec = _field(obj, "spec")
        if spec.get("resourceClaims"):
            unmodelled.append(f"{who}: asks for devices through DRA resource claims "
                              f"(spec.resourceClaims), which the replay does not model")
            continue
        if devices:
            unmodelled.append(f"{who}: asks for {', '.join(devices)}, a device gpupack "
                              "does not place")
            continue
        req, why = _request(obj, who)
        if req is None:
            unmodelled.append(f"{who}: {why}")
            continue
        node = spec.get("nodeName")
        if _pinned(obj):
            if req.kind is not RequestKind.NONE:
                unmodelled.append(f"{who}: a DaemonSet's or static pod that asks for a GPU "
                                  "(it runs on its own node, not where a scheduler puts it)")
            elif isinstance(node, str) and node in infos:
                overhead[node][0] += req.cpu_milli
                overhead[node][1] += req.memory_mib
            continue
        if created is None:
            raise ObjectError(f"{who}: metadata.creationTimestamp: "
                              f"{_field(obj, 'metadata').get('creationTimestamp')!r} "
                              "is not a time (RFC 3339)")
        if isinstance(node, str):
            req = with_observed_peak(req, peaks.get(node, {}).get(key))
        creates.append((created, key, DayPod(key, workload_of(obj), req, as_created(obj),
                                             req.priority)))
    if finished:
        notes.append(f"{finished} finished pod(s) (Succeeded or Failed) not replayed")
    bare = dict(infos)
    for name, (cpu, mem) in sorted(overhead.items()):
        n = infos[name]
        infos[name] = replace(n, cpu_milli=max(0, n.cpu_milli - cpu),
                              memory_mib=max(0, n.memory_mib - mem))
    if overhead:
        notes.append(f"DaemonSet and static pods on {len(overhead)} node(s): their CPU and "
                     "memory are taken off their node's allocatable, not replayed")
    creates.sort(key=lambda c: (c[0], c[1]))
    start = creates[0][0] if creates else 0.0
    events = tuple(Create(t - start, (p,)) for t, _, p in creates)
    ordered = tuple(infos.values())
    day = Day(ordered, {}, events, (creates[-1][0] - start) if creates else 0.0,
              pools_of(ordered, spare, bare))
    return ClusterDay(day, tuple(unmodelled), tuple(notes), len(creates))
