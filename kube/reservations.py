"""Group reservations in the API: the ``gpupack.io/reservation`` pod annotation.

Why an annotation on the leader pod (and not a ConfigMap, a CRD or a Lease):

* It lives and dies with the group. LWS deletes and recreates a whole group by deleting
  its pods; the annotation goes with them, so a stale reservation cannot outlive its
  group, and nothing has to be garbage-collected.
* It comes back through the watch the extender already runs: on start the cache's pod
  list carries every reservation, so rebuilding needs no extra API call, no new RBAC
  verb on a new kind and no CRD to install (the extender already patches pods).
* It is written with a JSON merge patch of one annotation key, so it never conflicts
  with what controllers write elsewhere on the pod and needs no resourceVersion
  round-trip.
* Each member's Binding also carries the current reservation (the API server merges
  Binding annotations into the pod in the same write as the bind). So whenever any
  member is bound, the API already holds a reservation at least as new as that bind,
  even if the leader patch (asynchronous, outside the request path) has not landed or
  the process dies right after the bind. Before the first bind nothing is held in the
  API's eyes, and a restart that finds no annotation simply places the group again:
  nothing is lost either way. On restart the newest record (``rev``) of a group wins.

The record is compact JSON (``encode`` / ``decode``)::

    {"v":1,"g":"llm/vllm/0","s":2,"pr":100,"t":"nvidia.com/gpu.clique","x":false,
     "d":"clique-a","at":1700000000.0,"exp":1700000600.0,"rev":3,
     "m":{"0":{"n":"gpu-1","g":[0,1,2,3],"p":"llm/vllm-0"},"1":{"n":"gpu-2","g":[0,1,2,3]}}}

``m`` maps each member slot (the LWS worker index) to its node and GPUs (``mig``:
``[profile, start, created]`` for a MIG member) and, once known, its pod (``p``).
``at``/``exp`` are wall-clock seconds (the expiry must survive a restart).

This module also holds the writers (a queue drained by a daemon thread, so no API call
is ever made under the scheduler's cache lock) and :class:`ReservationTap`, a sink that
forwards every object to the cache and hands the annotation to the reservation book.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kube.annotations import MAX_GROUP_SIZE, small_int
from kube.objects import pod_key
from kube.source import Sink
from packing.model import Placement

log = logging.getLogger("gpupack.kube.reservations")

RESERVATION = "gpupack.io/reservation"
VERSION = 1
MAX_TEXT = 64 * 1024  # a record larger than this is not ours: ignored


class ReservationError(ValueError):
    """An annotation that is not a readable reservation record."""


@dataclass(frozen=True)
class ReservationRecord:
    group: str
    size: int
    priority: int
    topology_key: str | None
    exclusive: bool
    domain: str | None
    first_seen: float
    expires: float
    rev: int
    slots: Mapping[int, Placement]  # slot -> placement (``pod`` left empty)
    pods: Mapping[int, str] = field(default_factory=dict)  # slot -> member pod key


def encode(rec: ReservationRecord) -> str:
    members: dict[str, dict[str, Any]] = {}
    for slot, p in sorted(rec.slots.items()):
        item: dict[str, Any] = {"n": p.node, "g": list(p.gpus)}
        if p.mig_profile is not None:
            item["mig"] = [p.mig_profile, p.mig_start, p.mig_created]
        if slot in rec.pods:
            item["p"] = rec.pods[slot]
        members[str(slot)] = item
    body = {
        "v": VERSION, "g": rec.group, "s": rec.size, "pr": rec.priority,
        "t": rec.topology_key, "x": rec.exclusive, "d": rec.domain,
        "at": round(rec.first_seen, 3), "exp": round(rec.expires, 3), "rev": rec.rev,
        "m": members,
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def _show(v: object) -> str:
    """A value for an error message: its repr, cut short (a record may be 64 KiB)."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _num(obj: Mapping[str, Any], key: str) -> float:
    """A finite number (wall-clock seconds). JSON as Python reads it allows NaN and
    ±Infinity, and an integer too large for a float: an ``exp`` like that would hold the
    group's GPUs for ever (or never compare sanely), so it is refused."""
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ReservationError(f"{RESERVATION}: {key!r} must be a number, got {_show(v)}")
    try:
        f = float(v)
    except OverflowError:  # an integer beyond a float's range
        f = math.inf
    if not math.isfinite(f):
        raise ReservationError(f"{RESERVATION}: {key!r} must be a finite number, got {_show(v)}")
    return f


def _index(v: object) -> bool:
    """A non-negative integer that is not a bool."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    v = obj.get(key)
    if v is not None and not isinstance(v, str):
        raise ReservationError(f"{RESERVATION}: {key!r} must be a string, got {_show(v)}")
    return v


def decode(text: object) -> ReservationRecord:
    """A record from the annotation text; ReservationError saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ReservationError(f"{RESERVATION}: empty or not a string")
    if len(text) > MAX_TEXT:
        raise ReservationError(f"{RESERVATION}: {len(text)} characters, over {MAX_TEXT}")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ReservationError(f"{RESERVATION}: not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ReservationError(f"{RESERVATION}: expected a JSON object")
    if obj.get("v") != VERSION:
        raise ReservationError(f"{RESERVATION}: 'v' (version) {_show(obj.get('v'))} is unknown")
    group = obj.get("g")
    if not isinstance(group, str) or not group:
        raise ReservationError(f"{RESERVATION}: 'g' (group) {_show(group)} is not a group key")
    size = obj.get("s")
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_GROUP_SIZE:
        raise ReservationError(f"{RESERVATION}: 's' (size) {_show(size)} is not a group size")
    prio = obj.get("pr", 0)
    if not isinstance(prio, int) or isinstance(prio, bool):
        raise ReservationError(f"{RESERVATION}: 'pr' (priority) {_show(prio)} is not an integer")
    rev = obj.get("rev", 0)
    if not isinstance(rev, int) or isinstance(rev, bool):
        raise ReservationError(f"{RESERVATION}: 'rev' {_show(rev)} is not an integer")
    raw = obj.get("m")
    if not isinstance(raw, dict) or not raw:
        raise ReservationError(f"{RESERVATION}: 'm' (members) {_show(raw)} is missing or empty")
    slots: dict[int, Placement] = {}
    pods: dict[int, str] = {}
    for k, item in raw.items():
        slot = small_int(k)
        if slot is None or slot >= size:
            raise ReservationError(f"{RESERVATION}: member slot {_show(k)} is not below {size}")
        if not isinstance(item, dict):
            raise ReservationError(f"{RESERVATION}: member {k}: expected an object, got "
                                   f"{_show(item)}")
        node = item.get("n")
        gpus = item.get("g", [])
        if not isinstance(node, str) or not node:
            raise ReservationError(f"{RESERVATION}: member {k}: 'n' (node) {_show(node)} is not "
                                   "a node name")
        if not isinstance(gpus, list) or not all(_index(i) for i in gpus):
            raise ReservationError(f"{RESERVATION}: member {k}: 'g' (GPUs) {_show(gpus)} must be "
                                   "a list of GPU indices (non-negative integers)")
        if len(set(gpus)) != len(gpus):
            raise ReservationError(f"{RESERVATION}: member {k}: 'g' (GPUs) {_show(gpus)} names "
                                   "a GPU twice")
        mig = item.get("mig")
        if mig is None:
            p = Placement("", node, tuple(gpus))
        else:
            if not isinstance(mig, list) or len(mig) != 3:
                raise ReservationError(f"{RESERVATION}: member {k}: 'mig' {_show(mig)} must be "
                                       "[profile, start, created]")
            profile, start, created = mig
            if not isinstance(profile, str) or not profile:
                raise ReservationError(f"{RESERVATION}: member {k}: 'mig' profile "
                                       f"{_show(profile)} is not a MIG profile name")
            if not _index(start):
                raise ReservationError(f"{RESERVATION}: member {k}: 'mig' start {_show(start)} "
                                       "is not a non-negative integer")
            if not isinstance(created, bool):
                raise ReservationError(f"{RESERVATION}: member {k}: 'mig' created "
                                       f"{_show(created)} is not true or false")
            if len(gpus) != 1:
                raise ReservationError(f"{RESERVATION}: member {k}: 'g' (GPUs) {_show(gpus)} "
                                       "must be one GPU for a MIG member")
            p = Placement("", node, tuple(gpus), profile, start, created)
        slots[slot] = p
        pod = item.get("p")
        if pod is not None:
            if not isinstance(pod, str) or not pod:
                raise ReservationError(f"{RESERVATION}: member {k}: 'p' (pod) {_show(pod)} "
                                       "must be a pod key")
            pods[slot] = pod
    return ReservationRecord(
        group=group, size=size, priority=prio, topology_key=_opt_str(obj, "t"),
        exclusive=bool(obj.get("x", False)), domain=_opt_str(obj, "d"),
        first_seen=_num(obj, "at"), expires=_num(obj, "exp"), rev=rev,
        slots=slots, pods=pods,
    )


# ---- writing ---------------------------------------------------------------------------------


class AnnotationPatcher(Protocol):
    def patch(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        """Merge ``annotations`` into the pod's (None removes a key); raise on failure."""
        ...


class ApiAnnotationPatcher:
    """A JSON merge patch of pod annotations through the ``kubernetes`` client."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)

    def patch(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self.core.patch_namespaced_pod(
            name, namespace, {"metadata": {"annotations": dict(annotations)}},
            _content_type="application/merge-patch+json", _request_timeout=10,
        )


class StaticPatcher(Protocol):
    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None: ...


class StaticAnnotationPatcher:
    """Static mode: the same merge applied to the static source's pods (fed back to the cache)."""

    def __init__(self, source: StaticPatcher) -> None:
        self.source = source

    def patch(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self.source.patch_pod_annotations(namespace, name, annotations)


class ReservationWriter:
    """Writes reservation annotations outside the request path.

    ``submit`` only queues (latest text per pod wins) and may be called under the
    scheduler's lock; a daemon thread (``start``) or ``drain`` makes the API calls.
    A failed write is retried up to ``retries`` times with a short backoff, then
    logged and dropped: the next change of the reservation writes it again, and a
    member's Binding carries the record anyway.
    """

    def __init__(
        self, patcher: AnnotationPatcher, retries: int = 3, backoff_s: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.patcher = patcher
        self.retries = retries
        self.backoff_s = backoff_s
        self.sleep = sleep
        self._queue: dict[str, str | None] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.writes = 0
        self.failures = 0

    def submit(self, pod: str, text: str | None) -> None:
        with self._cond:
            self._queue[pod] = text
            self._cond.notify()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="gpupack-reservation-writer")
            self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
            self.drain()

    def drain(self) -> int:
        """Write everything queued now; returns how many writes succeeded."""
        with self._cond:
            items = list(self._queue.items())
            self._queue.clear()
        done = 0
        for pod, text in items:
            ns, _, name = pod.partition("/")
            for attempt in range(self.retries + 1):
                try:
                    self.patcher.patch(ns, name, {RESERVATION: text})
                    done += 1
                    self.writes += 1
                    break
                except Exception as e:  # API errors, timeouts: retry, then give up loudly
                    if attempt == self.retries or _not_found(e):
                        self.failures += 1
                        log.warning("could not write %s on %s: %s", RESERVATION, pod, e)
                        break
                    self.sleep(self.backoff_s * (attempt + 1))
        return done


def _not_found(e: Exception) -> bool:
    return getattr(e, "status", None) == 404 or "not found" in str(e)


# ---- reading ---------------------------------------------------------------------------------


class ReservationNotes(Protocol):
    """What the tap tells (the scheduler's reservation book implements it)."""

    def note(self, pod: str, text: str | None) -> None: ...

    def pod_deleted(self, pod: str) -> None: ...


def reservation_text(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    text = ann.get(RESERVATION) if isinstance(ann, Mapping) else None
    return text if isinstance(text, str) else None


class ReservationTap:
    """A sink in front of the cache: forwards every event, and hands each pod's
    reservation annotation (and pod deletions) to the notes, so reservations can be
    rebuilt from the pods on start and a deleted leader releases its group at once."""

    def __init__(self, sink: Sink, notes: ReservationNotes) -> None:
        self.sink = sink
        self.notes = notes

    def upsert_node(self, obj: Mapping[str, Any]) -> bool:
        return self.sink.upsert_node(obj)

    def delete_node(self, name: str) -> None:
        self.sink.delete_node(name)

    def upsert_pod(self, obj: Mapping[str, Any]) -> bool:
        if isinstance(obj, Mapping):
            self.notes.note(pod_key(obj), reservation_text(obj))
        return self.sink.upsert_pod(obj)

    def delete_pod(self, key: str) -> None:
        self.notes.note(key, None)
        self.sink.delete_pod(key)
        self.notes.pod_deleted(key)

    def replace(self, nodes: Any, pods: Any) -> None:
        pod_list = None if pods is None else list(pods)
        for p in pod_list or ():
            if isinstance(p, Mapping):
                self.notes.note(pod_key(p), reservation_text(p))
        self.sink.replace(nodes, pod_list)

    def mark_synced(self) -> None:
        self.sink.mark_synced()

    def note_bad_object(self) -> None:
        self.sink.note_bad_object()
