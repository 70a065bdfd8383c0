"""Which extender replica acts: the one beside the kube-scheduler that holds its Lease.

The extender is a sidecar of kube-scheduler (same pod, loopback), and only the leading
kube-scheduler schedules, so the extender follows kube-scheduler's own leader election
instead of holding a lease of its own: one election, and the replica that writes is
always the one its scheduler calls. Two leases could disagree (extender A leads while
scheduler B schedules through extender B, which would then refuse or act without the
book).

kube-scheduler's ``holderIdentity`` is ``<hostname>_<uuid>`` and both containers of a
pod share the pod's hostname, so this replica leads iff the Lease's holder, up to its
last ``_``, is this replica's identity, and the lease has not run out
(``renewTime + leaseDurationSeconds`` is after now, on the injected wall clock).

:func:`holds_lease` is the pure rule; :class:`LeaseWatcher` polls the Lease (``get``)
in a daemon thread; :class:`AlwaysLeader` is for a single replica without leader
election, and static mode.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kube.objects import parse_time

log = logging.getLogger("gpupack.kube.leader")

Clock = Callable[[], float]


class Leadership(Protocol):
    def is_leader(self) -> bool: ...


# leaseDurationSeconds is an int32 in the API: anything outside 1..2**31-1 is not one
# (10**400 would overflow a float when added to the renew time).
MAX_DURATION_S = 2**31 - 1


def holds_lease(lease: Mapping[str, Any] | None, identity: str, now: float) -> bool:
    """Whether ``identity`` leads by this Lease object (the API's JSON) at ``now``. A
    Lease that cannot be judged (:func:`lease_problem`) leads nobody."""
    spec = lease.get("spec") if isinstance(lease, Mapping) else None
    if not isinstance(spec, Mapping):
        return False
    holder = spec.get("holderIdentity")
    if not isinstance(holder, str) or "_" not in holder:
        return False
    if holder.rsplit("_", 1)[0] != identity:
        return False
    until = _held_until(spec)
    return until is not None and until > now


def _held_until(spec: Mapping[str, Any]) -> float | None:
    """``renewTime + leaseDurationSeconds``; None when either is unreadable."""
    renewed = parse_time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    if (renewed is None or isinstance(duration, bool) or not isinstance(duration, int)
            or not 0 < duration <= MAX_DURATION_S):
        return None
    return renewed + duration


def lease_problem(lease: Mapping[str, Any] | None) -> str | None:
    """Why a Lease that names a holder cannot be judged, naming the field; None when it
    can (or names no holder: nobody leads, which is no problem)."""
    if lease is None:
        return None
    spec = lease.get("spec")
    if not isinstance(spec, Mapping):
        return f"spec: {type(spec).__name__}, not an object"
    holder = spec.get("holderIdentity")
    if holder is None or holder == "":
        return None
    if not isinstance(holder, str):
        return f"spec.holderIdentity: {type(holder).__name__}, not text"
    if parse_time(spec.get("renewTime")) is None:
        return f"spec.renewTime: {_show(spec.get('renewTime'))} is not a time"
    if _held_until(spec) is None:
        return (f"spec.leaseDurationSeconds: {_show(spec.get('leaseDurationSeconds'))} is "
                f"not a duration (1..{MAX_DURATION_S} s)")
    return None


def _show(v: object) -> str:
    try:
        text = repr(v)
    except ValueError:  # an int past Python's digit limit for text
        return "a number too long to show"
    return text if len(text) <= 40 else text[:37] + "..."


class AlwaysLeader:
    """No leader election: the only replica always acts."""

    def is_leader(self) -> bool:
        return True


class LeaseWatcher:
    """Polls kube-scheduler's Lease ``namespace/name`` every ``poll_s`` seconds.

    Between polls the last Lease seen is judged against the clock, so a lease that runs
    out makes this replica a standby at once, without waiting for the next poll. An API
    error keeps the last Lease (it still runs out on time). A Lease that cannot be
    judged (a field out of range: :func:`lease_problem`) makes this replica a standby,
    logged once per reason naming the field; nothing read from the API stops the
    polling thread (a dead thread would leave the last answer standing for ever).
    ``on_change(leader)`` is called from the polling thread when the answer changes.
    """

    def __init__(self, api_client: Any, namespace: str, name: str, identity: str,
                 poll_s: float = 1.0, clock: Clock = time.time,
                 on_change: Callable[[bool], None] | None = None) -> None:
        from kubernetes import client

        self.coordination = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.poll_s = poll_s
        self.clock = clock
        self.on_change = on_change
        self.lease: Mapping[str, Any] | None = None
        self.errors = 0
        self.problem: str | None = None  # why the last Lease read cannot be judged
        self._was = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        try:
            return holds_lease(self.lease, self.identity, self.clock())
        except Exception:  # a Lease no rule foresaw: nobody leads by it (see poll)
            return False

    def poll(self) -> bool:
        """Read the Lease once; whether this replica leads now."""
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.coordination.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=5)
            self.lease = _json(resp)
        except ApiException as e:
            self.errors += 1
            if e.status == 404:
                self.lease = None  # no election yet: nobody leads
            else:
                log.warning("lease %s/%s: API error %s", self.namespace, self.name, e.status)
        except Exception as e:  # network trouble: the last lease still runs out on time
            self.errors += 1
            log.warning("lease %s/%s: %s", self.namespace, self.name, e)
        self._note_problem()
        leader = self.is_leader()
        if leader != self._was:
            self._was = leader
            log.info("%s the leader (lease %s/%s)", "now" if leader else "no longer",
                     self.namespace, self.name)
            if self.on_change is not None:
                self.on_change(leader)
        return leader

    def _note_problem(self) -> None:
        """Log why the Lease cannot be judged, once per reason (it is read every poll)."""
        try:
            problem = lease_problem(self.lease)
        except Exception as e:
            problem = f"unreadable ({type(e).__name__}: {e})"
        if problem != self.problem:
            self.problem = problem
            if problem is not None:
                log.warning("lease %s/%s cannot be judged: %s; this replica does not "
                            "lead by it", self.namespace, self.name, problem)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="gpupack-lease")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:  # on_change, or a bug: logged; the next poll goes on
                log.exception("lease %s/%s: poll failed", self.namespace, self.name)
            self._stop.wait(self.poll_s)


def _json(resp: Any) -> Mapping[str, Any] | None:
    import json

    data = resp.data if hasattr(resp, "data") else resp.read()
    obj = json.loads(data)
    return obj if isinstance(obj, Mapping) else None
