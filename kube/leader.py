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


def holds_lease(lease: Mapping[str, Any] | None, identity: str, now: float) -> bool:
    """Whether ``identity`` leads by this Lease object (the API's JSON) at ``now``."""
    spec = lease.get("spec") if isinstance(lease, Mapping) else None
    if not isinstance(spec, Mapping):
        return False
    holder = spec.get("holderIdentity")
    if not isinstance(holder, str) or "_" not in holder:
        return False
    if holder.rsplit("_", 1)[0] != identity:
        return False
    renewed = parse_time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or isinstance(duration, bool) or not isinstance(duration, int):
        return False
    return renewed + duration > now


class AlwaysLeader:
    """No leader election: the only replica always acts."""

    def is_leader(self) -> bool:
        return True


class LeaseWatcher:
    """Polls kube-scheduler's Lease ``namespace/name`` every ``poll_s`` seconds.

    Between polls the last Lease seen is judged against the clock, so a lease that runs
    out makes this replica a standby at once, without waiting for the next poll. An API
    error keeps the last Lease (it still runs out on time). ``on_change(leader)`` is
    called from the polling thread when the answer changes.
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
        self._was = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        return holds_lease(self.lease, self.identity, self.clock())

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
        leader = self.is_leader()
        if leader != self._was:
            self._was = leader
            log.info("%s the leader (lease %s/%s)", "now" if leader else "no longer",
                     self.namespace, self.name)
            if self.on_change is not None:
                self.on_change(leader)
        return leader

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="gpupack-lease")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.poll_s)


def _json(resp: Any) -> Mapping[str, Any] | None:
    import json

    data = resp.data if hasattr(resp, "data") else resp.read()
    obj = json.loads(data)
    return obj if isinstance(obj, Mapping) else None
