"""The 409s of the eviction subresource (kube/evictions.py), as kube-apiserver writes
them (``pkg/registry/core/pod/storage/eviction.go``, ``errors.NewConflict``): the UID
precondition failing means the pod the defragmenter meant is gone; a conflicting update
of the PodDisruptionBudget's status (or of the pod under the server's own
resourceVersion precondition) means "try again": the pod is still there."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kube.evictions import ApiEvictor, PodRef, outcome_of


def conflict(kind: str, name: str, cause: str, group: str = "") -> str:
    resource = f"{kind}.{group}" if group else kind
    return json.dumps({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f'Operation cannot be fulfilled on {resource} "{name}": {cause}',
        "reason": "Conflict", "details": {"name": name, "group": group, "kind": kind},
        "code": 409})


UID_REST = conflict("Pod", "web-1", "the UID in the precondition (u-1) does not match the "
                    "UID in record (u-2). The object might have been deleted and then "
                    "recreated")
UID_STORAGE = conflict("pods", "web-1", "Precondition failed: UID in precondition: u-1, UID "
                       "in object meta: u-2")
PDB = conflict("poddisruptionbudgets", "web-pdb", "the object has been modified; please "
               "apply your changes to the latest version and try again", group="policy")
RV = conflict("Pod", "web-1", "the ResourceVersion in the precondition (41) does not match "
              "the ResourceVersion in record (42). The object might have been modified")


@pytest.mark.parametrize("body, outcome", [
    (UID_REST, "gone"), (UID_STORAGE, "gone"), (UID_STORAGE.encode(), "gone"),
    (PDB, "error"), (PDB.encode(), "error"), (RV, "error"),
    (None, "gone"), ("not json", "gone"),
])
def test_a_409_is_gone_only_when_the_pod_meant_is(body: Any, outcome: str) -> None:
    assert outcome_of(409, body) == outcome


def test_the_evictor_reads_the_status_of_a_409() -> None:
    from kubernetes.client.exceptions import ApiException

    class Core:
        body = PDB

        def create_namespaced_pod_eviction(self, *args: Any, **kw: Any) -> Any:
            e = ApiException(status=409, reason="Conflict")
            e.body = self.body
            raise e

    ev = ApiEvictor.__new__(ApiEvictor)  # no API client: the API is the double above
    core: Any = Core()
    ev.core, ev.timeout_s = core, 1.0
    got = ev.evict(PodRef("web/web-1", "u-1"))
    assert got.outcome == "error" and "poddisruptionbudgets" in got.message
    Core.body = UID_REST
    assert ev.evict(PodRef("web/web-1", "u-1")).outcome == "gone"
