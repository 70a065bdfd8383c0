"""Evictions through the Eviction API, and Events, for the defragmenter.

:class:`ApiEvictor` posts a policy/v1 ``Eviction`` to the pod's ``eviction``
subresource (RBAC: ``create pods/eviction``) with the pod's UID as a precondition (a
pod recreated under the same name is never evicted by mistake). The API server enforces
PodDisruptionBudgets: it answers 429 when a budget allows no disruption now (the
outcome ``pdb``: try later), 404 when the pod is gone already (``gone``: what was
wanted), 409 when the UID no longer matches (``gone`` too: the pod we meant is gone),
403 when gpupack may not evict it (``forbidden``), anything else ``error``. A 409 is
also the answer when the server's own update of the PodDisruptionBudget's status (or of
the pod, under the resourceVersion precondition it sets itself) kept conflicting with
other writers (``pkg/registry/core/pod/storage/eviction.go``): the pod is still there,
so that one is ``error`` (not evicted: defragmentation tries it again with backoff,
MIG compaction ends the drain and cools the GPU down), told apart by what the Status
names (see :func:`outcome_of`).

:class:`ApiEvents` creates core/v1 Events (RBAC: ``create events``) on pods, as
``kubectl describe pod`` shows them. Events are best effort: a failure is logged, never
raised. :class:`LogEvents` only logs (no API: static mode, tests).

The ``kubernetes`` package is imported inside the methods that use it.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from kube.responses import finish

log = logging.getLogger("gpupack.kube.evictions")

OUTCOMES = ("evicted", "pdb", "gone", "forbidden", "error")
COMPONENT = "gpupack-defrag"


@dataclass(frozen=True)
class EvictionResult:
    outcome: str  # one of OUTCOMES
    message: str = ""


@dataclass(frozen=True)
class PodRef:
    key: str  # namespace/name
    uid: str = ""

    @property
    def namespace(self) -> str:
        return self.key.partition("/")[0]

    @property
    def name(self) -> str:
        return self.key.partition("/")[2]


class Evictor(Protocol):
    def evict(self, pod: PodRef) -> EvictionResult: ...


class EventSink(Protocol):
    def emit(self, pod: PodRef, reason: str, message: str, warning: bool = False) -> None: ...


def outcome_of(status: int, body: Any = None) -> str:
    """The outcome of an eviction answered ``status``; ``body``: the Status the server
    sent (JSON text or bytes), read for a 409 only."""
    if 200 <= status < 300:
        return "evicted"
    if status == 429:
        return "pdb"
    if status == 409:
        return "error" if conflict_is_retryable(body) else "gone"
    if status == 404:
        return "gone"
    if status == 403:
        return "forbidden"
    return "error"


def conflict_is_retryable(body: Any) -> bool:
    """Whether a 409 of the eviction subresource says "try again" rather than "the pod
    you meant is gone". Both are ``reason: Conflict``; the server writes them as
    ``errors.NewConflict(resource, name, cause)``: ``details.kind`` is the resource and
    the message ``Operation cannot be fulfilled on <resource> "<name>": <cause>``.

    * the UID precondition failed (the pod was deleted, maybe recreated under the same
      name): kind ``Pod``, cause ``the UID in the precondition (...) does not match`` or,
      from the storage layer, ``Precondition failed: UID in precondition: ...``: gone;
    * the PodDisruptionBudget's status update conflicted (other evictions, the
      disruption controller): kind ``poddisruptionbudgets``: retryable;
    * the pod changed under the resourceVersion precondition the server set itself (a
      terminal or unready pod), or any other write conflict on it (``the object has
      been modified``): retryable; the pod is still there.

    A 409 naming none of these (no Status body at all) stays ``gone``, as before.
    """
    data = _status(body)
    if data is None:
        return False
    details = data.get("details")
    kind = details.get("kind") if isinstance(details, dict) else None
    raw = data.get("message")
    message = raw if isinstance(raw, str) else ""
    if _UID_PRECONDITION.search(message):
        return False
    if isinstance(kind, str) and kind.lower().startswith("poddisruptionbudget"):
        return True
    if "poddisruptionbudgets.policy" in message:
        return True
    return bool(_RETRYABLE_CONFLICT.search(message))


_UID_PRECONDITION = re.compile(r"UID in (the )?precondition", re.IGNORECASE)
_RETRYABLE_CONFLICT = re.compile(
    r"ResourceVersion in (the )?precondition|the object has been modified", re.IGNORECASE)


def _status(body: Any) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except (TypeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


M = TypeVar("M")


def _model(m: M | None) -> M:
    """The client's ``from_dict`` answers None only for None."""
    assert m is not None
    return m


def _message(body: Any, fallback: str) -> str:
    try:
        data = json.loads(body)
    except (TypeError, ValueError):
        return fallback
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return data["message"][:500]
    return fallback


class ApiEvictor:
    def __init__(self, api_client: Any, timeout_s: float = 10.0) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.timeout_s = timeout_s

    def evict(self, pod: PodRef) -> EvictionResult:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        body: dict[str, Any] = {
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
        }
        if pod.uid:
            body["deleteOptions"] = {"preconditions": {"uid": pod.uid}}
        try:
            resp = self.core.create_namespaced_pod_eviction(
                pod.name, pod.namespace, _model(client.V1Eviction.from_dict(body)),
                _preload_content=False,
                _request_timeout=self.timeout_s)
        except ApiException as e:
            status = int(e.status or 0)
            return EvictionResult(outcome_of(status, e.body),
                                  _message(e.body, f"HTTP {status}: {e.reason}"))
        except (HTTPError, OSError) as e:
            return EvictionResult("error", f"evicting {pod.key}: {e}")
        status = int(getattr(resp, "status", 201))
        finish(resp)
        return EvictionResult(outcome_of(status), "" if status < 300 else f"HTTP {status}")


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_object(pod: PodRef, reason: str, message: str, warning: bool, host: str,
                 component: str = COMPONENT) -> dict[str, Any]:
    """A core/v1 Event about ``pod`` (the name is unique: the pod's, a time and a nonce)."""
    now = _now_rfc3339()
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{pod.name}.{int(time.time() * 1e6):x}{uuid.uuid4().hex[:6]}",
                     "namespace": pod.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.name,
                           "namespace": pod.namespace, **({"uid": pod.uid} if pod.uid else {})},
        "reason": reason, "message": message[:1000],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component, "host": host},
        "reportingComponent": component, "reportingInstance": host,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


class ApiEvents:
    def __init__(self, api_client: Any, host: str = "", timeout_s: float = 5.0,
                 component: str = COMPONENT) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.host = host
        self.component = component
        self.timeout_s = timeout_s

    def emit(self, pod: PodRef, reason: str, message: str, warning: bool = False) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        log.info("event %s on %s: %s", reason, pod.key, message)
        try:
            finish(self.core.create_namespaced_event(
                pod.namespace, _model(client.CoreV1Event.from_dict(
                    event_object(pod, reason, message, warning, self.host,
                                 self.component))),
                _preload_content=False, _request_timeout=self.timeout_s))
        except ApiException as e:
            log.warning("event %s on %s not recorded: HTTP %s %s", reason, pod.key, e.status,
                        _message(e.body, str(e.reason)))
        except (HTTPError, OSError) as e:
            log.warning("event %s on %s not recorded: %s", reason, pod.key, e)


class LogEvents:
    def emit(self, pod: PodRef, reason: str, message: str, warning: bool = False) -> None:
        (log.warning if warning else log.info)("event %s on %s: %s", reason, pod.key, message)
