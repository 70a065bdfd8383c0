"""A bound pod whose gpupack inputs cannot be read is counted at its worst, never skipped.

A pod's author may change its annotations after it is bound (``kubectl annotate`` needs
only ``patch pods`` in its own namespace). A bound pod whose ``gpupack.io/gpu-memory``
no longer parses used to be skipped by the cache at the next list: its GPU looked free
and shares were over-committed after a restart. It holds its devices whatever its
annotations say, so :func:`worst_case_request` reads what it can and assumes the most it
could hold:

- its declared resource as written in its containers (the API server validated those,
  and they cannot change after creation): ``nvidia.com/gpu: N`` is N whole GPUs, a MIG
  resource is that slice;
- a time-sliced or MPS share (``nvidia.com/gpu.shared``) is counted as taking the whole
  GPU it holds: all of its memory (the largest GPU of its node, else the largest in the
  catalog) and all of its compute, so no other share is put beside it;
- group membership, which cannot be read, is dropped (a bound pod is not planned again).

What still cannot be read (a MIG resource no catalog model has, two MIG resources, a
priority outside int32 from a file) is counted with its CPU and memory only. Either
way the pod is named: :class:`kube.cache.ClusterCache` keeps it in
``worst_case_pods()`` (the metrics ``gpupack_pods_counted_worst_case`` and
``gpupack_pod_counted_worst_case{namespace,pod}``), and the leading extender posts a
Warning Event ``GpupackInputsUnreadable`` on it (:class:`UnreadableEvents`).
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from kube import annotations as A
from kube.objects import INT32_MAX, INT32_MIN, ObjectError, pod_key, pod_request
from packing.catalog import CATALOG
from packing.model import GPU_MILLI, PodRequest, RequestKind

log = logging.getLogger("gpupack.kube.worst_case")

# Annotations and labels whose values gpupack parses (and a pod's author may rewrite).
_INPUT_ANNOTATIONS = (A.GPU_MEMORY, A.GPU_COMPUTE, A.GROUP, A.GROUP_SIZE, A.GROUP_TOPOLOGY)
_LWS = "leaderworkerset.sigs.k8s.io/"
LARGEST_GPU_MIB = max(m.memory_mib for m in CATALOG.values())
EVENT_REASON = "GpupackInputsUnreadable"


def worst_case_request(obj: Mapping[str, Any], largest_gpu_mib: int | None = None
                       ) -> PodRequest | None:
    """The request of bound pod ``obj`` at its worst (see the module docstring), or None
    when not even its name can be read. ``largest_gpu_mib``: the memory of the largest
    GPU of its node (None: of the largest GPU the catalog knows)."""
    pod = _without_inputs(obj)
    try:
        req = pod_request(pod, strict=False)
    except (ObjectError, AttributeError, TypeError):
        try:
            req = pod_request(_without_devices(pod), strict=False)
        except (ObjectError, AttributeError, TypeError):
            return None
    if req.kind is RequestKind.SHARED:
        req = replace(req, gpu_memory_mib=largest_gpu_mib or LARGEST_GPU_MIB,
                      gpu_milli=GPU_MILLI)
    return req


def unreadable_input(obj: Mapping[str, Any]) -> str | None:
    """Why a sizing annotation of ``obj`` (``gpupack.io/gpu-memory``,
    ``gpupack.io/gpu-compute``) cannot be read, naming the pod and the field, or None.
    :func:`kube.objects.pod_request` reads a bound pod's unreadable sizing as declaring
    nothing: counted so, a share would take no memory of its GPU."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(ann, Mapping):
        return None
    for read in (A.gpu_memory_mib, A.gpu_compute_milli):
        try:
            read({k: v for k, v in ann.items() if isinstance(v, str)})
        except A.AnnotationError as e:
            return f"Pod {pod_key(obj)}: metadata.annotations.{e.key}: {e}"
    return None


def _without_inputs(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` without the inputs that may not parse."""
    pod = copy.deepcopy(dict(obj))
    meta = pod.get("metadata")
    if isinstance(meta, dict):
        ann = meta.get("annotations")
        if isinstance(ann, dict):
            meta["annotations"] = {k: v for k, v in ann.items() if isinstance(v, str)
                                   and k not in _INPUT_ANNOTATIONS and not k.startswith(_LWS)}
        labels = meta.get("labels")
        if isinstance(labels, dict):
            meta["labels"] = {k: v for k, v in labels.items()
                              if isinstance(v, str) and not k.startswith(_LWS)}
    spec = pod.get("spec")
    if isinstance(spec, dict):
        prio = spec.get("priority")
        if prio is not None and (not isinstance(prio, int) or isinstance(prio, bool)
                                 or not INT32_MIN <= prio <= INT32_MAX):
            spec["priority"] = 0
    return pod


def _without_devices(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` without its nvidia.com/ resources (CPU and memory only)."""
    spec = pod.get("spec")
    if isinstance(spec, dict):
        for field in ("containers", "initContainers"):
            for c in spec.get(field) or ():
                res = c.get("resources") if isinstance(c, dict) else None
                if not isinstance(res, dict):
                    continue
                for kind in ("requests", "limits"):
                    got = res.get(kind)
                    if isinstance(got, dict):
                        res[kind] = {k: v for k, v in got.items()
                                     if not str(k).startswith("nvidia.com/")}
    return pod


def message(why: str, req: PodRequest) -> str:
    """What the Event and the log say: why, and how the pod is counted."""
    if req.kind is RequestKind.WHOLE:
        counted = f"{req.gpu_count} whole GPU(s)"
    elif req.kind is RequestKind.MIG:
        counted = f"its MIG slice {req.mig_profile}"
    elif req.kind is RequestKind.SHARED:
        counted = "the whole GPU its share is on (all its memory and compute)"
    else:
        counted = "its CPU and memory only (its GPU resource cannot be read either)"
    return (f"gpupack cannot read this pod's inputs ({why[:400]}); it is bound, so it is "
            f"counted at its worst: {counted}. Fix or remove the value")


class EventSink(Protocol):
    def emit(self, pod: Any, reason: str, message: str, warning: bool = False) -> None: ...


class UnreadableEvents:
    """On the leader, one Warning Event per bound pod counted at its worst (and per
    reason: a pod fixed and broken again is named again), checked every ``interval_s``.
    ``pods``: the cache's ``worst_case_pods()`` (key -> (uid, why, message)); ``ref``:
    builds the Event's object reference from ("namespace/name", uid)."""

    def __init__(self, pods: Callable[[], Mapping[str, tuple[str, str, str]]],
                 events: EventSink, ref: Callable[[str, str], Any],
                 is_leader: Callable[[], bool], interval_s: float = 5.0) -> None:
        self.pods = pods
        self.events = events
        self.ref = ref
        self.is_leader = is_leader
        self.interval_s = interval_s
        self.posted: dict[str, tuple[str, str]] = {}  # key -> (uid, why) named last
        self._stop = threading.Event()

    def step(self) -> int:
        """Post what is new; the number of Events posted."""
        now = dict(self.pods())
        for key in [k for k in self.posted if k not in now]:
            del self.posted[key]  # fixed or gone: named again if it comes back
        if not self.is_leader():
            return 0
        n = 0
        for key, (uid, why, text) in sorted(now.items()):
            if self.posted.get(key) == (uid, why):
                continue
            self.events.emit(self.ref(key, uid), EVENT_REASON, text, warning=True)
            self.posted[key] = (uid, why)
            n += 1
        return n

    def start(self) -> None:
        threading.Thread(target=self._loop, name="gpupack-unreadable-events",
                         daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.step()
            except Exception:  # an Event is a courtesy: never let it stop the extender
                log.exception("posting GpupackInputsUnreadable events failed")
