"""kube-scheduler's Workload API as gpupack reads it (kube.groups.workload_api): the
PodGroup and Workload readers and the pod's ``spec.schedulingGroup`` (tables: every bad
field is named), the one rule for which source names a pod's group, and the watch of
PodGroups and Workloads through kube.api_source.ApiSource against a FAKE API server: a
404 means "not served" (listed at once, asked again later), and objects served later,
changed or deleted reach the inputs."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import FakeApiServer
from test_group_inputs_api import wait_for

sys.path.insert(0, str(Path(__file__).parent.parent / "scheduler"))
from sched_builders import whole_pod

from kube.api_source import ApiSource
from kube.cache import ClusterCache
from kube.fields import ObjectError
from kube.groups.inputs import GroupInputs
from kube.groups.workload_api import (
    PODGROUPS,
    WORKLOADS,
    PodGroupShape,
    WorkloadShape,
    pod_group_of,
    workload_of,
)
from kube.objects import pod_request

LWS = "leaderworkerset.sigs.k8s.io/"


def pod_group(name: str = "pg", namespace: str = "llm", gang: int | None = 2,
              **spec: Any) -> dict[str, Any]:
    policy: dict[str, Any] = {"basic": {}} if gang is None else {"gang": {"minCount": gang}}
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"schedulingPolicy": policy, **spec}}


def workload(name: str = "w", namespace: str = "llm", controller: Any = None
             ) -> dict[str, Any]:
    spec: dict[str, Any] = {"podGroupTemplates": [
        {"name": "replica", "schedulingPolicy": {"gang": {"minCount": 2}}}]}
    if controller is not None:
        spec["controllerRef"] = controller
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


# ---- readers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("obj, want", [
    (pod_group(), PodGroupShape("llm", "pg", True, 2)),
    (pod_group(gang=None), PodGroupShape("llm", "pg", False, 1)),
    (pod_group(schedulingConstraints={"topology": [{"key": "nvidia.com/gpu.clique"}]},
               workloadRef={"workloadName": "w", "templateName": "replica"}),
     PodGroupShape("llm", "pg", True, 2, "nvidia.com/gpu.clique", "w")),
])
def test_pod_group_shapes(obj: dict[str, Any], want: PodGroupShape) -> None:
    assert pod_group_of(obj) == want


@pytest.mark.parametrize("obj, field", [
    ({"metadata": {"name": "pg"}}, "metadata.name and metadata.namespace"),
    (pod_group(name="Not_A_Name"), "metadata.name and metadata.namespace"),
    ({**pod_group(), "spec": []}, "PodGroup llm/pg: spec: expected an object"),
    ({**pod_group(), "spec": {"schedulingPolicy": {}}}, "neither basic nor gang"),
    (pod_group(gang=0), "spec.schedulingPolicy.gang.minCount: 0 is not an integer"),
    (pod_group(gang=True), "spec.schedulingPolicy.gang.minCount: True"),  # type: ignore[arg-type]
    ({**pod_group(), "spec": {"schedulingPolicy": {"gang": {"minCount": "2"}}}},
     "minCount: '2' is not an integer"),
    (pod_group(gang=5000), "5000 pods is more than gpupack places as one group"),
    (pod_group(schedulingConstraints={"topology": [{"key": ""}]}),
     "spec.schedulingConstraints.topology: expected a list"),
    (pod_group(workloadRef={"workloadName": "../x"}), "spec.workloadRef.workloadName"),
])
def test_pod_groups_gpupack_cannot_read_are_named(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(ObjectError, match=field.replace(".", r"\.").replace("(", r"\(")):
        pod_group_of(obj)


LWS_REF = {"apiGroup": "leaderworkerset.x-k8s.io", "kind": "LeaderWorkerSet", "name": "vllm"}


@pytest.mark.parametrize("obj, want, lws", [
    (workload(), WorkloadShape("llm", "w"), None),
    (workload(controller=LWS_REF),
     WorkloadShape("llm", "w", ("leaderworkerset.x-k8s.io", "LeaderWorkerSet", "vllm")), "vllm"),
    (workload(controller={"apiGroup": "batch", "kind": "Job", "name": "j"}),
     WorkloadShape("llm", "w", ("batch", "Job", "j")), None),
])
def test_workload_shapes(obj: dict[str, Any], want: WorkloadShape, lws: str | None) -> None:
    got = workload_of(obj)
    assert got == want and got.lws == lws


@pytest.mark.parametrize("controller", [[], {"kind": "Job"}, {"kind": "Job", "name": 3},
                                        {"kind": "", "name": "j"}])
def test_a_controller_ref_gpupack_cannot_read_is_named(controller: Any) -> None:
    with pytest.raises(ObjectError, match=r"Workload llm/w: spec\.controllerRef"):
        workload_of(workload(controller=controller))


# ---- the one rule: which source names a pod's group --------------------------------------


def member(name: str = "p", sg: Any = "pg", labels: dict[str, str] | None = None,
           annotations: dict[str, str] | None = None, bound: bool = False,
           namespace: str = "llm") -> dict[str, Any]:
    p = whole_pod(name, 8, namespace=namespace, annotations=annotations or {})
    p["metadata"]["labels"] = labels or {}
    if sg is not None:
        p["spec"]["schedulingGroup"] = sg if isinstance(sg, dict) else {"podGroupName": sg}
    if bound:
        p["spec"]["nodeName"] = "gpu-a"
    return p


LWS_LABELS = {LWS + "name": "vllm", LWS + "group-index": "0", LWS + "worker-index": "1"}
LWS_SIZE = {LWS + "size": "2"}
GPUPACK = {"gpupack.io/group": "g", "gpupack.io/group-size": "3"}


@pytest.mark.parametrize("pod, key, size, pod_group, index", [
    # spec.schedulingGroup first: whatever else the pod says.
    (member(), "llm/pg", 1, "pg", 0),
    (member(labels=LWS_LABELS, annotations=LWS_SIZE), "llm/pg", 1, "pg", 1),
    (member(annotations=GPUPACK), "llm/pg", 1, "pg", 0),
    (member(labels=LWS_LABELS, annotations={**LWS_SIZE, **GPUPACK}), "llm/pg", 1, "pg", 1),
    # Then the LeaderWorkerSet labels, then gpupack's annotations (as before).
    (member(sg=None, labels=LWS_LABELS, annotations={**LWS_SIZE, **GPUPACK}), "llm/vllm/0",
     2, None, 1),
    (member(sg=None, annotations=GPUPACK), "llm/g", 3, None, 0),
    # Every key starts with the pod's own namespace.
    (member(namespace="evil"), "evil/pg", 1, "pg", 0),
])
def test_one_rule_names_the_group(pod: dict[str, Any], key: str, size: int,
                                  pod_group: str | None, index: int) -> None:
    ref = pod_request(pod).group
    assert ref is not None
    assert (ref.key, ref.size, ref.pod_group, ref.index) == (key, size, pod_group, index)


@pytest.mark.parametrize("sg", [{"podGroupName": None}, {}, {"podGroupName": 7},
                                {"podGroupName": "UPPER"}, {"podGroupName": "a" * 254},
                                "pg-as-a-string"])
def test_a_scheduling_group_gpupack_cannot_read(sg: Any) -> None:
    """A pod to place is refused naming the field; a bound one is read as no group (it
    holds what it holds)."""
    bad = member(sg=sg) if isinstance(sg, dict) else member(sg=None)
    if not isinstance(sg, dict):
        bad["spec"]["schedulingGroup"] = sg
    with pytest.raises(ObjectError, match=r"spec\.schedulingGroup"):
        pod_request(bad)
    bad["spec"]["nodeName"] = "gpu-a"
    assert pod_request(bad, strict=False).group is None


# ---- the watch ----------------------------------------------------------------------------------


def test_not_served_is_listed_at_once_and_asked_again_later(fake: FakeApiServer,
                                                            api: Any) -> None:
    """The gate off: the first 404 lets the verbs answer (the cache syncs, the inputs are
    listed) and says "not served"; it is asked again at the interval only (no error
    loop); once the API server serves the kind, its objects arrive and are watched."""
    cache = ClusterCache("gpupack")
    inputs = GroupInputs(quotas_listed=True, lws_listed=True, workload_api_listed=False)
    assert not inputs.listed()
    source = ApiSource(api, watch_timeout_s=2, backoff_initial_s=0.01, workload_api=inputs,
                       rediscover_s=0.3)
    source.start(cache)
    try:
        wait_for(lambda: cache.synced and inputs.listed())
        assert inputs.served == {PODGROUPS: False, WORKLOADS: False}
        time.sleep(1.0)
        tries = fake.list_requests.count("try:podgroups")
        assert 2 <= tries <= 6, tries  # ~ every 0.3 s
        fake.put("podgroups", pod_group())
        fake.put("workloads", workload(controller=LWS_REF))
        fake.workload_api_served = True
        wait_for(lambda: inputs.pod_group("llm", "pg") is not None)
        wait_for(lambda: inputs.workload("llm", "w") is not None)
        assert inputs.served == {PODGROUPS: True, WORKLOADS: True}
        shape = inputs.workload("llm", "w")
        assert shape is not None and shape.lws == "vllm"
        # Watched: a change of minCount (mutable) and a deletion reach the inputs.
        version = inputs.version
        fake.put("podgroups", pod_group(gang=3))
        wait_for(lambda: (pg := inputs.pod_group("llm", "pg")) is not None
                 and pg.min_count == 3)
        assert inputs.version > version
        assert any(k == "podgroups" for k, _ in fake.watch_requests)
        fake.delete("podgroups", "llm/pg")
        wait_for(lambda: inputs.pod_group("llm", "pg") is None)
        # Another namespace's PodGroup of the same name is another PodGroup.
        fake.put("podgroups", pod_group(namespace="other"))
        wait_for(lambda: inputs.pod_group("other", "pg") is not None)
        assert inputs.pod_group("llm", "pg") is None
    finally:
        source.stop()


def test_an_unreadable_pod_group_is_counted_and_forgotten(fake: FakeApiServer,
                                                          api: Any) -> None:
    fake.workload_api_served = True
    fake.put("podgroups", pod_group())
    cache = ClusterCache("gpupack")
    inputs = GroupInputs(quotas_listed=True, lws_listed=True, workload_api_listed=False)
    source = ApiSource(api, watch_timeout_s=2, backoff_initial_s=0.01, workload_api=inputs)
    source.start(cache)
    try:
        wait_for(lambda: inputs.pod_group("llm", "pg") is not None)
        fake.put("podgroups", pod_group(gang=0))
        # Unreadable now: what it said before no longer holds either.
        wait_for(lambda: inputs.pod_group("llm", "pg") is None)
        assert inputs.bad_objects == 1
    finally:
        source.stop()
