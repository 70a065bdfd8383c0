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

Writes go through :class:`RecordWriter`: a queue drained by a daemon thread (no API call
is ever made under the scheduler's cache lock), and only while this replica is the
leader. :class:`ReservationTap` is the sink the sources feed: nodes and pods to the
cache, records to the reservation book.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kube.annotations import MAX_GROUP_SIZE, small_int
from kube.source import RecordSink, Sink
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


# ---- the ConfigMap ---------------------------------------------------------------------------

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


# ---- writing ---------------------------------------------------------------------------------


class RecordStore(Protocol):
    def put(self, obj: Mapping[str, Any]) -> None:
        """Create or replace the ConfigMap ``obj``; raise on failure."""
        ...

    def delete(self, name: str) -> None:
        """Delete the ConfigMap ``name`` (gone already is fine); raise on failure."""
        ...


class ApiRecordStore:
    """ConfigMaps in ``namespace`` through the ``kubernetes`` client."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace

    def put(self, obj: Mapping[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        name = obj["metadata"]["name"]
        body: Any = dict(obj)  # the client sends a dict as it is
        try:
            # An update without resourceVersion is unconditional: only the leader writes.
            self.core.replace_namespaced_config_map(name, self.namespace, body,
                                                    _request_timeout=10)
        except ApiException as e:
            if e.status != 404:
                raise
            self.core.create_namespaced_config_map(self.namespace, body,
                                                   _request_timeout=10)

    def delete(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.delete_namespaced_config_map(name, self.namespace, _request_timeout=10)
        except ApiException as e:
            if e.status != 404:
                raise


class StaticRecordStore:
    """Static mode: records kept in memory and fed back to the sink, as the watch would."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.sink: RecordSink | None = None
        self._lock = threading.Lock()

    def start(self, sink: RecordSink) -> None:
        self.sink = sink
        with self._lock:
            items = list(self.objects.values())
        sink.replace_records(items)

    def put(self, obj: Mapping[str, Any]) -> None:
        stored = json.loads(json.dumps(obj))
        with self._lock:
            self.objects[stored["metadata"]["name"]] = stored
        if self.sink is not None:
            self.sink.upsert_record(stored)

    def delete(self, name: str) -> None:
        with self._lock:
            self.objects.pop(name, None)
        if self.sink is not None:
            self.sink.delete_record(name)


class Submitter(Protocol):
    """A queue of writes keyed by name: :class:`RecordWriter` (and fakes in tests)."""

    def submit(self, name: str, obj: Mapping[str, Any] | None) -> None: ...


# API answers that the same write will get again, however long one waits: the object is
# malformed (400) or invalid (422). Anything else (a timeout, 5xx, 429, a 403 an
# operator may yet fix in RBAC) may pass later.
PERMANENT = frozenset({400, 422})


def join_thread(thread: threading.Thread | None, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds (none if negative) for ``thread`` to end; whether
    it has, or never ran. The shutdown's bounded wait on each loop and writer."""
    if thread is not None:
        thread.join(max(0.0, timeout_s))
        return not thread.is_alive()
    return True


class RecordWriter:
    """Writes records outside the request path, and only while this replica leads.

    ``submit`` only queues (latest object per record wins) and may be called under the
    scheduler's lock; a daemon thread (``start``) or ``drain`` makes the API calls, each
    after checking ``is_leader`` (a replica that lost the lease writes nothing, not even
    what it queued before). A failed write is retried up to ``retries`` times with a
    short backoff; if it still fails it is tried again ``later_s`` seconds on (doubling
    up to ``later_max_s``) until it passes, a newer object for the same name replaces it,
    this replica stops leading, or the API answers that it never will (``PERMANENT``:
    then it is logged and dropped). Nothing else would write it again: a wake patched on
    a pod, or the last change of a record, has no later change behind it.

    ``stop`` ends the thread after a last, bounded flush (a shutdown): what is queued
    and what waits to be tried again is written, one try each, while this replica still
    leads and for at most ``drain_s`` seconds; what is left is logged as not written.
    ``join`` waits for that.
    """

    def __init__(
        self, store: RecordStore, is_leader: Callable[[], bool] = lambda: True,
        retries: int = 3, backoff_s: float = 0.5, sleep: Callable[[float], None] = time.sleep,
        what: str = "record", later_s: float = 5.0, later_max_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.what = what  # what is written, for the log and the thread's name
        self.is_leader = is_leader
        self.retries = retries
        self.backoff_s = backoff_s
        self.sleep = sleep
        self.later_s = later_s
        self.later_max_s = later_max_s
        self.clock = clock
        self._queue: dict[str, Mapping[str, Any] | None] = {}
        # Writes that failed: name -> (when to try again, the object, the next delay).
        self._later: dict[str, tuple[float, Mapping[str, Any] | None, float]] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._flush_by = math.inf  # on stop: the last flush writes until then (clock)
        self._thread: threading.Thread | None = None
        self.writes = 0
        self.failures = 0  # writes that failed all their retries (tried again later)
        self.dropped = 0  # queued writes dropped because this replica no longer leads
        self.given_up = 0  # writes the API will never take (PERMANENT)

    def submit(self, name: str, obj: Mapping[str, Any] | None) -> None:
        """Queue the record ``name``: ``obj`` to write it, None to delete it."""
        with self._cond:
            self._queue[name] = obj
            self._later.pop(name, None)  # the newer object wins
            self._cond.notify()

    def pending(self) -> dict[str, Mapping[str, Any] | None]:
        with self._cond:
            return dict(self._queue)

    def later(self) -> dict[str, Mapping[str, Any] | None]:
        """Writes that failed and wait to be tried again."""
        with self._cond:
            return {k: v[1] for k, v in self._later.items()}

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name=f"gpupack-{self.what.replace(' ', '-')}-writer")
            self._thread.start()

    def stop(self, drain_s: float = 3.0) -> None:
        """Ask the thread to end; it first flushes what is queued or waits to be tried
        again, for at most ``drain_s`` seconds (a write in progress is finished first)."""
        with self._cond:
            self._stop = True
            self._flush_by = self.clock() + drain_s
            self._cond.notify()

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the thread to end; whether it has (or
        never ran)."""
        return join_thread(self._thread, timeout_s)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    due = min((v[0] for v in self._later.values()), default=None)
                    if due is not None and due <= self.clock():
                        break
                    self._cond.wait(None if due is None else due - self.clock())
                if self._stop:
                    break
            try:
                self.drain()
            except Exception:
                # This thread is the only writer: dying would leave every later write
                # queued for ever. Waiting a little keeps a failure that repeats from
                # spinning (a submit or stop still wakes it).
                log.exception("%s writer: a drain failed; going on", self.what)
                with self._cond:
                    if not self._stop:
                        self._cond.wait(self.later_s)
        try:
            self._flush()
        except Exception:
            log.exception("%s writer: the last flush failed", self.what)

    def _flush(self) -> int:
        """On stop: every write queued or waiting to be tried again, one try each (no
        waits between tries: the process is ending), while leading and before the
        deadline ``stop`` set; returns how many succeeded."""
        with self._cond:
            items = list(self._queue.items())
            items += [(k, v[1]) for k, v in self._later.items() if k not in self._queue]
            self._queue.clear()
            self._later.clear()
        done = 0
        for i, (name, obj) in enumerate(items):
            why = ("out of time" if self.clock() >= self._flush_by
                   else None if self.is_leader() else "not the leader")
            if why is not None:
                if why == "not the leader":
                    self.dropped += len(items) - i
                log.warning("%s writer stopping (%s): %d write(s) not made", self.what,
                            why, len(items) - i)
                break
            try:
                self._apply(name, obj)
                done += 1
            except Exception as e:
                self.failures += 1
                log.warning("%s writer stopping: %s %s not written: %s", self.what,
                            self.what, name, e)
        return done

    def drain(self) -> int:
        """Write everything queued now, and the failed writes whose time has come;
        returns how many writes succeeded."""
        now = self.clock()
        with self._cond:
            items = [(k, v, self.later_s) for k, v in self._queue.items()]
            self._queue.clear()
            for k, (due, obj, delay) in list(self._later.items()):
                if due <= now:
                    items.append((k, obj, delay))
                    del self._later[k]
        done = 0
        for name, obj, delay in items:
            try:
                done += self._write(name, obj, delay)
            except Exception as e:
                # The leader check (or a bug) raised: kept and tried again later rather
                # than dropped. Nothing else would write it again (the last change of a
                # record has no later one behind it), and the check runs again before
                # that try, so a replica that lost the lease still writes nothing.
                self.failures += 1
                self._again(name, obj, delay, e)
        return done

    def _apply(self, name: str, obj: Mapping[str, Any] | None) -> None:
        """One call to the store: ``obj`` written, or ``name`` deleted when it is None."""
        if obj is None:
            self.store.delete(name)
        else:
            self.store.put(obj)
        self.writes += 1

    def _write(self, name: str, obj: Mapping[str, Any] | None, delay: float) -> int:
        """One queued write with its quick retries: 1 when written, else 0 (dropped,
        given up, or kept for later)."""
        for attempt in range(self.retries + 1):
            if not self.is_leader():
                self.dropped += 1
                log.info("not the leader: %s %s not written", self.what, name)
                return 0
            try:
                self._apply(name, obj)
                return 1
            except Exception as e:  # API errors, timeouts: retry, then later
                status = getattr(e, "status", None)
                if status in PERMANENT:
                    self.given_up += 1
                    log.warning("could not write %s %s, and never will (%s): %s",
                                self.what, name, status, e)
                    return 0
                if attempt == self.retries:
                    self.failures += 1
                    self._again(name, obj, delay, e)
                    return 0
                self.sleep(self.backoff_s * (attempt + 1))
        return 0

    def _again(self, name: str, obj: Mapping[str, Any] | None, delay: float,
               e: Exception) -> None:
        with self._cond:
            if name in self._queue:
                return  # a newer object was submitted meanwhile: it is written instead
            self._later[name] = (self.clock() + delay, obj, min(delay * 2, self.later_max_s))
            self._cond.notify()
        log.warning("could not write %s %s: %s; trying again in %.0f s", self.what, name,
                    e, delay)


# ---- reading ---------------------------------------------------------------------------------


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
