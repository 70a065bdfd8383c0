"""Writing objects to the API outside the request path, only while this replica leads:
:class:`RecordWriter` (a queue, latest object per name wins; quick retries, then later
ones; nothing written by a replica that lost the lease) over a :class:`RecordStore`
(ConfigMaps in gpupack's namespace: :class:`ApiRecordStore`, or in memory:
:class:`StaticRecordStore`). The reservation book's records, the pod conditions that
requeue waiting pods (:mod:`kube.pod_conditions`) and MIG compaction's memory
(:mod:`kube.mig.compaction_memory`) each go through one.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kube.source import RecordSink

log = logging.getLogger("gpupack.kube.reservations")
# API answers that the same write will get again, however long one waits: the object is
# malformed (400) or invalid (422). Anything else (a timeout, 5xx, 429, a 403 an
# operator may yet fix in RBAC) may pass later.
PERMANENT = frozenset({400, 422})


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
