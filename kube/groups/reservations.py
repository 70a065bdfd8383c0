"""Group reservations in the API: one ConfigMap per group in gpupack's own namespace.

Why a ConfigMap in gpupack's namespace (and no longer an annotation on the leader pod):

* Only gpupack can write it. The extender's Role grants ConfigMap writes in its own
  namespace only; users who create pods elsewhere cannot create, change or forge one. A
  pod annotation could be set by anyone who can create a pod, in any namespace, and a
  forged record with a higher revision won on restart and split another namespace's
  group. Annotations on users' pods now never create or change a reservation.
* One object per group, at a name derived from the group key (:func:`record_name`): a
  record found under another name is not the group's and is ignored, so a group has at
  most one record.
* It needs no CRD (a ConfigMap is in every cluster, its ``data`` carries the JSON as
  is), and a ConfigMap is small and cheap to watch with a label selector. A Lease would
  also do, but its spec has no field for a payload (the record would live in an
  annotation of the Lease), and it reads as leader election to whoever looks.
* It outlives the pods it is for, so the leader deletes it when the reservation ends
  (complete, expired, released, or every pod of the group gone); a restart that finds
  one whose pods are gone deletes it.

The record is compact JSON (``encode_reservation`` / ``decode_reservation``) under
``data.reservation``::

    {"v":1,"g":"llm/vllm/0","s":2,"pr":100,"t":"nvidia.com/gpu.clique","x":false,
     "d":"clique-a","at":1700000000.0,"exp":1700000600.0,"rev":3,
     "m":{"0":{"n":"gpu-1","g":[0,1,2,3],"p":"llm/vllm-0"},"1":{"n":"gpu-2","g":[0,1,2,3]}}}

``m`` maps each member slot (the LWS worker index) to its node and GPUs (``mig``:
``[profile, start, created]`` for a MIG member) and, once known, its pod (``p``).
``at``/``exp`` are wall-clock seconds (the expiry must survive a restart).

Writes go through a :class:`kube.record_writer.RecordWriter`: a queue drained by a
daemon thread (no API call is ever made under the scheduler's cache lock), and only
while this replica is the leader. :class:`ReservationTap` is the sink the sources feed:
nodes and pods to the cache, records to the reservation book.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kube.annotations import MAX_GROUP_SIZE, small_int
from kube.source import Sink
from packing.model import Placement, is_pod_key

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


def encode_reservation(rec: ReservationRecord) -> str:
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


# ``pr`` is the group's pod priority (spec.priority, an int32 in the API); ``rev`` counts
# the record's writes from 0 (an int64 is more than any record lives to reach).
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


REV_MAX = 2**63 - 1


def _bounded_int(obj: Mapping[str, Any], key: str, what: str, lo: int, hi: int) -> int:
    """``obj[key]`` (0 when absent): an integer, not a bool, within ``[lo, hi]``."""
    v = obj.get(key, 0)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ReservationError(f"{RESERVATION}: {key!r} ({what}) {_show(v)} is not an integer")
    if not lo <= v <= hi:
        raise ReservationError(f"{RESERVATION}: {key!r} ({what}) {_show(v)} is not within "
                               f"[{lo}, {hi}]")
    return v


def _opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    v = obj.get(key)
    if v is not None and not isinstance(v, str):
        raise ReservationError(f"{RESERVATION}: {key!r} must be a string, got {_show(v)}")
    return v


def decode_reservation(text: object) -> ReservationRecord:
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
    prio = _bounded_int(obj, "pr", "priority", INT32_MIN, INT32_MAX)
    rev = _bounded_int(obj, "rev", "revision", 0, REV_MAX)
    exclusive = obj.get("x", False)
    if not isinstance(exclusive, bool):  # bool() would read "false" or [0] as true
        raise ReservationError(f"{RESERVATION}: 'x' (exclusive) {_show(exclusive)} is not "
                               "true or false")
    raw = obj.get("m")
    if not isinstance(raw, dict) or not raw:
        raise ReservationError(f"{RESERVATION}: 'm' (members) {_show(raw)} is missing or empty")
    slots: dict[int, Placement] = {}
    pods: dict[int, str] = {}
    for k, item in raw.items():
        slot = small_int(k)
        if slot is None or str(slot) != k:  # "00" and "0" would be one slot, silently
            raise ReservationError(f"{RESERVATION}: member slot {_show(k)} is not a slot "
                                   "number (decimal, no leading zero)")
        if slot >= size:
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
            if not is_pod_key(pod):
                raise ReservationError(f"{RESERVATION}: member {k}: 'p' (pod) {_show(pod)} "
                                       "must be a pod key (namespace/name)")
            pods[slot] = pod
    missing = [s for s in range(size) if s not in slots]
    if missing:
        # A record with a slot left out holds room for fewer members than the group has:
        # whole-or-nothing would quietly become "some".
        raise ReservationError(f"{RESERVATION}: 'm' (members) lacks slot {missing[0]}: a "
                               f"record of size {size} has slots 0..{size - 1}, each once")
    return ReservationRecord(
        group=group, size=size, priority=prio, topology_key=_opt_str(obj, "t"),
        exclusive=exclusive, domain=_opt_str(obj, "d"),
        first_seen=_num(obj, "at"), expires=_num(obj, "exp"), rev=rev,
        slots=slots, pods=pods,
    )


RECORD_KEY = "reservation"  # the ConfigMap's data key
MANAGED_BY = "app.kubernetes.io/managed-by"
COMPONENT = "app.kubernetes.io/component"
RECORD_LABELS = {MANAGED_BY: "gpupack", COMPONENT: "group-reservation"}
RECORD_SELECTOR = ",".join(f"{k}={v}" for k, v in RECORD_LABELS.items())
GROUP_ANNOTATION = "gpupack.io/group-key"  # for people reading the object; not trusted


def record_name(group: str) -> str:
    """The ConfigMap name of a group's record: group keys hold '/' and may be long, so a
    hash (a DNS label, stable across restarts and replicas)."""
    return "gpupack-group-" + hashlib.sha256(group.encode()).hexdigest()[:24]


def record_object(rec: ReservationRecord, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": record_name(rec.group), "namespace": namespace,
                     "labels": dict(RECORD_LABELS),
                     "annotations": {GROUP_ANNOTATION: rec.group}},
        "data": {RECORD_KEY: encode_reservation(rec)},
    }


def record_of(obj: object) -> ReservationRecord:
    """The record a ConfigMap carries; ReservationError saying why it is not one."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        raise ReservationError("record: object without metadata")
    labels = meta.get("labels")
    if not isinstance(labels, Mapping) or any(labels.get(k) != v
                                              for k, v in RECORD_LABELS.items()):
        raise ReservationError(f"record {_show(meta.get('name'))}: not labelled "
                               f"{RECORD_SELECTOR}")
    data = obj.get("data") if isinstance(obj, Mapping) else None
    if not isinstance(data, Mapping):
        raise ReservationError(f"record {_show(meta.get('name'))}: no data")
    rec = decode_reservation(data.get(RECORD_KEY))
    if meta.get("name") != record_name(rec.group):
        raise ReservationError(f"record {_show(meta.get('name'))}: group {rec.group!r} belongs "
                               f"at {record_name(rec.group)}")
    return rec




class Records(Protocol):
    """What the tap tells about records (the scheduler's reservation book implements it)."""

    def record_seen(self, name: str, obj: Mapping[str, Any] | None) -> None:
        """The record ConfigMap ``name`` as the API has it now (None: deleted)."""
        ...

    def records_listed(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """A full list of the record ConfigMaps (start-up, or after 410 Gone)."""
        ...

    def synced(self) -> None:
        """Nodes, pods and records are all listed: rebuild, then answer."""
        ...


class ReservationTap:
    """The sink sources feed: node and pod events to the cache, record events to the
    book, and the end of the first lists to both (the cache first, then the book's
    rebuild, so nothing is answered before the reservations are back)."""

    def __init__(self, sink: Sink, records: Records) -> None:
        self.sink = sink
        self.records = records

    def upsert_node(self, obj: Mapping[str, Any]) -> bool:
        return self.sink.upsert_node(obj)

    def delete_node(self, name: str) -> None:
        self.sink.delete_node(name)

    def upsert_pod(self, obj: Mapping[str, Any]) -> bool:
        return self.sink.upsert_pod(obj)

    def delete_pod(self, key: str) -> None:
        self.sink.delete_pod(key)

    def replace(self, nodes: Any, pods: Any) -> None:
        self.sink.replace(nodes, pods)

    def mark_synced(self) -> None:
        self.sink.mark_synced()
        self.records.synced()

    def note_bad_object(self) -> None:
        self.sink.note_bad_object()

    def upsert_record(self, obj: Mapping[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name") if isinstance(obj, Mapping) else None
        if isinstance(name, str) and name:
            self.records.record_seen(name, obj)
        else:
            self.note_bad_object()

    def delete_record(self, name: str) -> None:
        self.records.record_seen(name, None)

    def replace_records(self, objs: Any) -> None:
        self.records.records_listed([o for o in objs or () if isinstance(o, Mapping)])
