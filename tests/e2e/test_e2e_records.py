"""gpupack's placement records on the real API server: they reach a pod only through its
Binding. The webhook removes them from a new pod; the chart's ValidatingAdmissionPolicy
``placement-records`` refuses a create (where the webhook is not called) or an update
that adds, changes or removes them, for every user (these requests are the cluster
admin's: an admission policy binds admins too). A pod gpupack binds carries them."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from cluster import (
    GPU,
    MANUAL_SCHEDULER,
    POOL,
    bind_with_records,
    create_nodes,
    h100_whole,
    pod,
    restricted,
    wait_for,
)
from conftest import Space
from controlplane import NAMESPACE
from kubernetes.client.rest import ApiException

FORGED = {"gpupack.io/node": "elsewhere", "gpupack.io/gpus": "0,1",
          "gpupack.io/mig": "1g.10gb@2", "gpupack.io/policy": "gpupack"}
REFUSAL = "placement records are written only through the pod's Binding"


def _annotations(core: Any, ns: str, name: str) -> dict[str, str]:
    return dict(core.read_namespaced_pod(name, ns).metadata.annotations or {})


def _merge(core: Any, ns: str, name: str, annotations: dict[str, str | None]) -> None:
    core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": annotations}},
                              _content_type="application/merge-patch+json")


def test_the_webhook_removes_records_from_a_new_pod(core: Any, space: Space) -> None:
    ns = space.namespace()
    core.create_namespaced_pod(ns, pod("copied", annotations={**FORGED, "team.io/x": "1"},
                                       scheduler=MANUAL_SCHEDULER))
    ann = _annotations(core, ns, "copied")
    assert not set(FORGED) & set(ann), ann
    assert ann["team.io/x"] == "1"


def test_a_create_the_webhook_does_not_see_is_refused(core: Any) -> None:
    # gpupack's own namespace is outside the webhook's namespaceSelector.
    # A pod Pod Security's restricted level (gpupack's namespace) admits.
    body = restricted(pod("e2e-forged-records", annotations={"gpupack.io/gpus": "3"},
                          scheduler=MANUAL_SCHEDULER))
    try:
        with pytest.raises(ApiException) as err:
            core.create_namespaced_pod(NAMESPACE, body)
        assert err.value.status == 403, err.value
        assert REFUSAL in str(err.value.body) and "gpupack.io/gpus" in str(err.value.body)
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod("e2e-forged-records", NAMESPACE, grace_period_seconds=0)


@pytest.mark.parametrize(("change", "named"), [
    ({"gpupack.io/gpus": "5"}, "gpupack.io/gpus"),  # point the record at another GPU
    ({"gpupack.io/gpus": None}, "gpupack.io/gpus"),  # drop it
    ({"gpupack.io/mig": "1g.10gb@0"}, "gpupack.io/mig"),  # add one
])
def test_an_update_of_a_record_is_refused(core: Any, space: Space, change: dict[str, Any],
                                          named: str) -> None:
    ns = space.namespace()
    node = f"{space.name}-n"
    space.nodes += create_nodes(core, [h100_whole(node, space.name)])
    core.create_namespaced_pod(ns, pod("manual", limits={GPU: "1"}, pool=space.name,
                                       scheduler=MANUAL_SCHEDULER))
    records = {"gpupack.io/node": node, "gpupack.io/gpus": "2",
               "gpupack.io/policy": "gpupack"}
    bind_with_records(core, ns, "manual", node, records)
    assert {k: _annotations(core, ns, "manual").get(k) for k in records} == records
    with pytest.raises(ApiException) as err:
        _merge(core, ns, "manual", change)
    assert err.value.status == 403, err.value
    assert REFUSAL in str(err.value.body) and named in str(err.value.body)
    # Other annotations of the same pod stay the author's to change.
    _merge(core, ns, "manual", {"team.io/owner": "speech"})
    ann = _annotations(core, ns, "manual")
    assert ann["team.io/owner"] == "speech"
    assert {k: ann.get(k) for k in records} == records


def test_gpupack_binds_with_its_records(core: Any, space: Space) -> None:
    ns = space.namespace()
    node = f"{space.name}-n"
    space.nodes += create_nodes(core, [h100_whole(node, space.name)])
    # The default scheduler name: the webhook hands the pod to gpupack.
    core.create_namespaced_pod(ns, pod("reranker", limits={GPU: "1"}, pool=space.name))

    def records() -> dict[str, str] | None:
        p = core.read_namespaced_pod("reranker", ns)
        ann = p.metadata.annotations or {}
        return ann if p.spec.node_name and "gpupack.io/gpus" in ann else None

    ann = wait_for(records, 60, "gpupack to bind the pod with its placement records")
    assert ann["gpupack.io/node"] == node
    assert ann["gpupack.io/gpus"] in {str(i) for i in range(8)}
    assert core.read_namespaced_pod("reranker", ns).spec.node_selector == {POOL: space.name}
