"""A condition gpupack writes on a waiting group member's status: it tells people where
the group's room is, and it makes kube-scheduler try the pod again.

Why a write is needed: kube-scheduler parks a pod an extender refused until a cluster
event (in v1.37 any event, for such a pod: the refusal's ``Extender`` rejector matches
every event), or at most its five-minute flush of unschedulable pods. Some of gpupack's
decisions are no such event: the reservation book reserves a waiting group's room when
another group's reservation expires (a timer), after a ResourceQuota change
(kube-scheduler does not watch quotas) or when its cool-down ends. An update of the
pod itself is an event for that pod: its status, with this condition, requeues it.

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


def room_reserved(namespace: str, name: str, group: str, slot: int, node: str,
                  now: dt.datetime) -> dict[str, Any]:
    """The status patch for member ``slot`` of ``group`` whose room is on ``node``, in
    the shape :class:`kube.reservations.RecordWriter` queues (metadata names the pod)."""
    return {
        "metadata": {"namespace": namespace, "name": name},
        "status": {"conditions": [{
            "type": ROOM_RESERVED, "status": "True", "reason": REASON,
            "message": f"gpupack reserved room for member {slot} of group {group} on "
                       f"node {node}",
            "lastTransitionTime": now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }]},
    }


class ApiPodStatusStore:
    """Writes those patches to the API (a :class:`kube.reservations.RecordStore`)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)

    def put(self, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        self.core.patch_namespaced_pod_status(
            meta["name"], meta["namespace"], {"status": obj["status"]},
            _content_type="application/strategic-merge-patch+json")

    def delete(self, name: str) -> None:
        """Nothing to delete: a condition goes with its pod."""
        del name
