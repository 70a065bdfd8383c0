"""A cluster's Nodes and Pods as a day to replay (kube/replay_inputs.py, issue 36 item 2):
creation order, what is not modelled (listed, never dropped), errors that name the object
and the field, pools of nodes of one kind."""

from __future__ import annotations

from typing import Any

import pytest
from builders_nodes import H100, L40S, gpu_node

from kube.objects import ObjectError
from kube.replay_inputs import as_created, cluster_day, workload_of
from packing.day import Create
from packing.model import RequestKind

T0 = "2026-12-01T08:00:00Z"


def pod(name: str, *, at: str = T0, limits: dict[str, Any] | None = None, ns: str = "app",
        node: str | None = None, owner: tuple[str, str] | None = None,
        labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        phase: str | None = None, cpu: str = "1", extra_spec: dict[str, Any] | None = None
        ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "creationTimestamp": at,
                            "labels": labels or {}, "annotations": annotations or {}}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True,
                                    "apiVersion": "apps/v1", "uid": "u"}]
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {
        "requests": {"cpu": cpu, "memory": "4Gi"}, "limits": limits or {}}}],
        **(extra_spec or {})}
    if node is not None:
        spec["nodeName"] = node
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    if phase is not None:
        out["status"] = {"phase": phase}
    return out


NODES = [gpu_node("h100-0", H100, whole=8, hostname=True),
         gpu_node("h100-1", H100, whole=8, hostname=True),
         gpu_node("mig-0", H100, mig={"1g.10gb": 14, "3g.40gb": 4}, hostname=True),
         gpu_node("l40s-0", L40S, gpus=4, replicas=4, hostname=True)]


def test_pods_are_created_again_in_creation_order_from_the_first() -> None:
    pods = [pod("b", at="2026-12-01T08:05:00Z", limits={"nvidia.com/gpu": 1}, node="h100-0"),
            pod("a", at=T0, limits={"nvidia.com/mig-1g.10gb": 1}),
            pod("c", at="2026-12-01T08:05:00Z", limits={"nvidia.com/gpu.shared": 1})]
    cd = cluster_day(NODES, pods)
    assert cd.replayed == 3 and cd.unmodelled == () and cd.notes == ()
    creates = [e for e in cd.day.events if isinstance(e, Create)]
    assert [(e.t, e.pods[0].key) for e in creates] == [(0.0, "app/a"), (300.0, "app/b"),
                                                       (300.0, "app/c")]
    assert cd.day.end == 300.0
    b = creates[1].pods[0]
    assert b.request.kind is RequestKind.WHOLE and b.manifest is not None
    assert "nodeName" not in b.manifest["spec"]  # placed anew by both schedulers


@pytest.mark.parametrize(("obj", "says"), [
    (pod("amd", limits={"amd.com/gpu": 1}), "app/amd: asks for amd.com/gpu"),
    (pod("dra", extra_spec={"resourceClaims": [{"name": "gpu"}]}), "DRA resource claims"),
    (pod("two", limits={"nvidia.com/mig-1g.10gb": 2}), "app/two: resources."
     "nvidia.com/mig-1g.10gb: 2 asked; gpupack places exactly one MIG slice"),
    (pod("ds-gpu", limits={"nvidia.com/gpu": 1}, owner=("DaemonSet", "probe"), node="h100-0"),
     "a DaemonSet's or static pod that asks for a GPU"),
])
def test_what_cannot_be_modelled_is_listed_not_dropped(obj: dict[str, Any], says: str) -> None:
    cd = cluster_day(NODES, [obj, pod("ok", limits={"nvidia.com/gpu": 1})])
    assert cd.replayed == 1
    assert len(cd.unmodelled) == 1 and says in cd.unmodelled[0], cd.unmodelled


@pytest.mark.parametrize(("nodes", "pods", "says"), [
    (NODES, [pod("x", at="yesterday")],
     "Pod app/x: metadata.creationTimestamp: 'yesterday' is not a time"),
    (NODES, [pod("x", limits={"nvidia.com/gpu": "lots"})],
     "Pod app/x: spec.containers[0].resources.limits.nvidia.com/gpu: 'lots'"),
    (NODES, [pod("x", cpu="a lot")], "Pod app/x: spec.containers[0].resources.requests.cpu"),
    (NODES, [pod("x"), pod("x")], "Pod app/x: metadata.name: duplicate pod"),
    ([*NODES, NODES[0]], [], "Node h100-0: metadata.name: duplicate node"),
    ([{"kind": "Node", "metadata": {"name": "bad"}, "status": {"allocatable": {"cpu": "lots"}}}],
     [], "Node bad: status.allocatable.cpu"),
])
def test_unreadable_objects_name_the_object_and_field(nodes: list[dict[str, Any]],
                                                      pods: list[dict[str, Any]],
                                                      says: str) -> None:
    with pytest.raises(ObjectError) as info:
        cluster_day(nodes, pods)
    assert says in str(info.value), str(info.value)


def test_finished_pods_are_noted_and_pinned_pods_take_their_nodes_room() -> None:
    pods = [pod("done", phase="Succeeded"),
            pod("agent", owner=("DaemonSet", "agent"), node="h100-0", cpu="4"),
            pod("static", annotations={"kubernetes.io/config.mirror": "x"}, node="h100-0",
                cpu="2"),
            pod("job", limits={"nvidia.com/gpu": 1})]
    cd = cluster_day(NODES, pods)
    assert cd.replayed == 1
    assert any("1 finished pod(s)" in n for n in cd.notes)
    assert any("DaemonSet and static pods on 1 node(s)" in n for n in cd.notes)
    h0 = next(n for n in cd.day.nodes if n.name == "h100-0")
    assert h0.cpu_milli == 64_000 - 6_000
    # Still one pool with h100-1: the kind is the node's, before the pinned pods.
    assert (cd.day.pools[0].name, cd.day.pools[0].base) == ("h100", 2)


def test_pools_group_nodes_of_one_kind_and_may_grow() -> None:
    cd = cluster_day(NODES, [], spare=2)
    assert [(p.name, p.base, len(p.nodes)) for p in cd.day.pools] == [
        ("h100", 2, 6), ("mig-0", 1, 3), ("l40s-0", 1, 3)]
    added = cd.day.pools[0].nodes[2]
    assert added.name == "h100-added-0" and added.gpus == cd.day.pools[0].nodes[0].gpus
    assert added.labels["kubernetes.io/hostname"] == "h100-added-0"


def test_workloads_and_as_created() -> None:
    rs = pod("web-5d8f-abcde", owner=("ReplicaSet", "web-5d8f"),
             labels={"pod-template-hash": "5d8f"})
    assert workload_of(rs) == "app/web"
    lws = pod("big-0-1", labels={"leaderworkerset.sigs.k8s.io/name": "big"},
              owner=("StatefulSet", "big-0"))
    assert workload_of(lws) == "app/big"
    assert workload_of(pod("lonely")) == ""
    bound = pod("p", node="n", annotations={"gpupack.io/node": "n", "gpupack.io/gpus": "0",
                                            "gpupack.io/class": "asr"}, phase="Running")
    fresh = as_created(bound)
    assert "status" not in fresh and "nodeName" not in fresh["spec"]
    assert fresh["metadata"]["annotations"] == {"gpupack.io/class": "asr"}
    assert bound["spec"]["nodeName"] == "n"  # the input is left as it was
