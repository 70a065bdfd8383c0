"""Conditions gpupack writes on a waiting pod's status: they tell people what gpupack
did for the pod, and make kube-scheduler try it again.

Why a write is needed: kube-scheduler parks a pod an extender refused until a cluster
event (in v1.37 any event, for such a pod: the refusal's ``Extender`` rejector matches
every event), or at most its five-minute flush of unschedulable pods. Some of what
gpupack does is no such event, or one kube-scheduler may act on before gpupack's watch
has shown it: the reservation book reserves a waiting group's room when another group's
reservation expires (a timer), after a ResourceQuota change (kube-scheduler does not
watch quotas) or when a cool-down ends (``ROOM_RESERVED``); a MIG change ends with new
allocatable that kube-scheduler may have retried the pod on before gpupack's cache had
it (``SLICES_CREATED``). An update of the pod itself is an event for that pod: its
status, with one of these conditions, requeues it.

A condition says what gpupack last did and when (``lastTransitionTime``), not what holds
now: it is not taken back when a reservation ends. A wake whose write fails is retried
by its :class:`kube.record_writer.RecordWriter` like any other write: a few quick tries,
then again every few seconds (doubling up to a minute) while this replica leads, until
it passes, a newer wake of the same pod replaces it, or the API refuses it for good (400,
422: dropped). A wake dropped because this replica stopped leading is not written by
the next leader; the pod then waits for the next cluster event (at most kube-scheduler's
five-minute flush).

Only ``pods/status`` is patched (kube-scheduler's own grant, on the ServiceAccount the
extender shares with it), never the pod's spec or metadata; the condition is merged by
its type (a strategic merge patch), so other conditions stay as they are.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

ROOM_RESERVED = "gpupack.io/RoomReserved"  # the condition's type
REASON = "GroupRoomReserved"
# A pod waiting for a MIG profile (or whole GPUs) the MIG actuator has just created: the
# new allocatable was an event, but kube-scheduler may have retried the pod before
# gpupack's watch showed it, and parked it again on gpupack's older view.
SLICES_CREATED = "gpupack.io/MigSlicesCreated"
SLICES_REASON = "MigReconfigured"
# A pod refused on a node whose change gpupack's watch showed just after (the retry that
# kube-scheduler made on that change came first): scheduler/extender/refusals.py.
NODE_CHANGED = "gpupack.io/NodeChanged"
NODE_REASON = "ViewCaughtUp"
REQUEST_TIMEOUT_S = 10  # one patch; the writer retries it (see the module docstring)


def _patch(key: str, kind: str, reason: str, message: str, now: dt.datetime
           ) -> dict[str, Any]:
    """A status patch of pod ``key`` ("namespace/name") setting one True condition, in
    the shape :class:`kube.record_writer.RecordWriter` queues (metadata names the pod)."""
    namespace, _, name = key.partition("/")
    return {
        "metadata": {"namespace": namespace, "name": name},
        "status": {"conditions": [{
            "type": kind, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }]},
    }


def room_reserved(key: str, group: str, slot: int, node: str, rev: int, now: dt.datetime
                  ) -> dict[str, Any]:
    """Member ``slot`` of ``group`` (pod ``key``) has its room on ``node``, in revision
    ``rev`` of the group's record (a second wake within the same second differs from
    the first, so it is an update too)."""
    return _patch(key, ROOM_RESERVED, REASON,
                  f"gpupack reserved room for member {slot} of group {group} on node {node} "
                  f"(reservation revision {rev})", now)


def slices_created(key: str, node: str, config: str, what: str, now: dt.datetime
                   ) -> dict[str, Any]:
    """Pod ``key`` waited for what the MIG change ``config`` on ``node`` made."""
    return _patch(key, SLICES_CREATED, SLICES_REASON,
                  f"gpupack's MIG change {config} on node {node} is done: {what}", now)


class ApiPodStatusStore:
    """Writes those patches to the API (a :class:`kube.record_writer.RecordStore`)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)

    def put(self, obj: Mapping[str, Any]) -> None:
        """Patch the pod's status; a pod gone meanwhile (404) needs no waking: done."""
        from kubernetes.client.rest import ApiException

        meta = obj["metadata"]
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": obj["status"]},
                _content_type="application/strategic-merge-patch+json",
                _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as e:
            if e.status != 404:
                raise

    def delete(self, name: str) -> None:
        """Nothing to delete: a condition goes with its pod."""
        del name


def node_changed(key: str, node: str, now: dt.datetime) -> dict[str, Any]:
    """Pod ``key`` was refused just before gpupack's view of ``node`` changed."""
    return _patch(key, NODE_CHANGED, NODE_REASON,
                  f"gpupack refused this pod on an older view of node {node}, which has "
                  "changed since; try again", now)
