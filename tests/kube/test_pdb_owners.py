"""PodDisruptionBudgets, ownerReferences and mixed-kind pod files (kube/defrag/pdb.py,
kube/owners.py, kube/defrag/inputs.py): what the defragmentation planner is told."""

from __future__ import annotations

from typing import Any

import pytest

from kube.defrag.inputs import evictability
from kube.defrag.pdb import read_budget
from kube.files import split_objects
from kube.objects import ObjectError
from kube.owners import recreator


def pod(name: str, labels: dict[str, str] | None = None, ns: str = "app", bound: bool = True,
        ready: str | None = "True", owner: tuple[str, str] | None = ("ReplicaSet", "rs"),
        **meta: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels or {"app": "web"}}
    m.update(meta)
    if owner is not None:
        m["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    p: dict[str, Any] = {"kind": "Pod", "metadata": m, "spec": {}, "status": {"phase": "Running"}}
    if bound:
        p["spec"]["nodeName"] = "n0"
    if ready is not None:
        p["status"]["conditions"] = [{"type": "Ready", "status": ready}]
    return p


def pdb(spec: dict[str, Any], status: dict[str, Any] | None = None, ns: str = "app"
        ) -> dict[str, Any]:
    obj: dict[str, Any] = {"kind": "PodDisruptionBudget",
                           "metadata": {"name": "pdb", "namespace": ns}, "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


WEB = {"matchLabels": {"app": "web"}}
FIVE = [pod(f"w{i}") for i in range(5)]


@pytest.mark.parametrize(
    ("spec", "pods", "allowed"),
    [
        ({"minAvailable": 3, "selector": WEB}, FIVE, 2),
        ({"minAvailable": 5, "selector": WEB}, FIVE, 0),
        ({"minAvailable": 9, "selector": WEB}, FIVE, 0),  # never negative
        ({"maxUnavailable": 1, "selector": WEB}, FIVE, 1),
        ({"maxUnavailable": "50%", "selector": WEB}, FIVE, 3),  # 5 - (5 - ceil(2.5)) = 3
        ({"minAvailable": "50%", "selector": WEB}, FIVE, 2),  # ceil(2.5) = 3 desired
        ({"minAvailable": "100%", "selector": WEB}, FIVE, 0),
        # an unready pod counts towards expected, not healthy
        ({"maxUnavailable": 1, "selector": WEB}, [*FIVE[:4], pod("w4", ready="False")], 0),
        # a terminating pod is not healthy either
        ({"minAvailable": 3, "selector": WEB},
         [*FIVE[:4], pod("w4", deletionTimestamp="2026-01-01T00:00:00Z")], 1),
        # files without conditions: a bound pod counts as healthy
        ({"minAvailable": 3, "selector": WEB}, [pod(f"w{i}", ready=None) for i in range(5)], 2),
        ({"minAvailable": 1, "selector": WEB}, [], 0),  # no pods: nothing allowed
        ({"selector": WEB}, FIVE, 0),  # neither field: the controller allows nothing
        ({"minAvailable": 1}, FIVE, 0),  # a null selector picks no pods
        ({"minAvailable": 1, "selector": {}}, FIVE, 4),  # an empty one picks them all
        ({"minAvailable": 1, "selector": {"matchExpressions": [
            {"key": "app", "operator": "In", "values": ["web", "api"]}]}}, FIVE, 4),
        ({"minAvailable": 1, "selector": {"matchExpressions": [
            {"key": "tier", "operator": "Exists"}]}}, FIVE, 0),
        ({"minAvailable": 1, "selector": {"matchExpressions": [
            {"key": "app", "operator": "NotIn", "values": ["api"]},
            {"key": "tier", "operator": "DoesNotExist"}]}}, FIVE, 4),
    ],
)
def test_disruptions_allowed_as_the_disruption_controller_computes_them(
        spec: dict[str, Any], pods: list[dict[str, Any]], allowed: int) -> None:
    assert read_budget(pdb(spec), pods).allowed == allowed


def test_status_wins_and_only_the_namespace_and_selector_count() -> None:
    pods = [*FIVE, pod("x", ns="other"), pod("api", {"app": "api"})]
    b = read_budget(pdb({"minAvailable": 4, "selector": WEB}, {"disruptionsAllowed": 3}), pods)
    assert b.allowed == 3 and b.name == "app/pdb"
    assert b.pods == frozenset(f"app/w{i}" for i in range(5))


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (pdb({"minAvailable": 1, "maxUnavailable": 1, "selector": WEB}),
         "spec: minAvailable and maxUnavailable are both set"),
        (pdb({"minAvailable": "lots", "selector": WEB}), "spec.minAvailable: 'lots'"),
        (pdb({"maxUnavailable": "150%", "selector": WEB}), "spec.maxUnavailable: '150%'"),
        (pdb({"maxUnavailable": -1, "selector": WEB}), "spec.maxUnavailable: -1 is negative"),
        (pdb({"minAvailable": True, "selector": WEB}), "spec.minAvailable: True"),
        (pdb({"minAvailable": 1, "selector": {"matchExpressions": [
            {"key": "a", "operator": "Near", "values": ["b"]}]}}),
         "spec.selector.matchExpressions[0].operator: 'Near'"),
        (pdb({"minAvailable": 1, "selector": {"matchExpressions": [
            {"key": "a", "operator": "In"}]}}),
         "spec.selector.matchExpressions[0].values: operator In needs values"),
        (pdb({"minAvailable": 1, "selector": {"matchLabels": {"a": 1}}}),
         "spec.selector.matchLabels.a: 1 is not a string"),
        (pdb({"minAvailable": 1, "selector": WEB}, {"disruptionsAllowed": "two"}),
         "status.disruptionsAllowed: 'two'"),
        ({"kind": "PodDisruptionBudget", "metadata": {"namespace": "app"}, "spec": {}},
         "metadata.name: missing"),
    ],
)
def test_bad_budgets_are_refused_naming_the_field(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(ObjectError, match="PodDisruptionBudget app/") as e:
        read_budget(obj, FIVE)
    assert field in str(e.value)


@pytest.mark.parametrize(
    ("owner", "who", "why"),
    [
        (("ReplicaSet", "web-5d8f"), "ReplicaSet/web-5d8f", ""),
        (("StatefulSet", "db"), "StatefulSet/db", ""),
        (("Job", "train"), "Job/train", ""),
        (("LeaderWorkerSet", "vllm"), "LeaderWorkerSet/vllm", ""),
        (None, None, "without a controller that recreates them"),
        (("DaemonSet", "dcgm"), None, "of a DaemonSet"),
        (("Node", "n0"), None, "static"),
        (("RayCluster", "r"), None, "owned by a RayCluster"),
    ],
)
def test_who_recreates_a_pod(owner: tuple[str, str] | None, who: str | None, why: str) -> None:
    got, reason = recreator(pod("p", owner=owner))
    assert got == who and why in reason


def test_an_owner_that_is_not_the_controller_recreates_nothing_and_kinds_extend() -> None:
    p = pod("p", owner=None)
    p["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "rs", "controller": False}]
    assert recreator(p)[0] is None
    assert recreator(pod("p", owner=("RayCluster", "r")), {"RayCluster"})[0] == "RayCluster/r"


@pytest.mark.parametrize(
    ("refs", "field"),
    [
        ("rs", "metadata.ownerReferences: expected a list"),
        ([{"kind": "ReplicaSet"}], "metadata.ownerReferences[0].name: None"),
        ([{"kind": "ReplicaSet", "name": "a", "controller": "yes"}],
         "metadata.ownerReferences[0].controller: 'yes'"),
        ([{"kind": "ReplicaSet", "name": "a", "controller": True},
          {"kind": "Job", "name": "b", "controller": True}],
         "metadata.ownerReferences[1]: a second controller owner"),
    ],
)
def test_bad_owner_references_name_the_field(refs: Any, field: str) -> None:
    p = pod("p", owner=None)
    p["metadata"]["ownerReferences"] = refs
    with pytest.raises(ObjectError, match="Pod app/p") as e:
        recreator(p)
    assert field in str(e.value)


def test_evictability_of_a_file() -> None:
    text = """
kind: List
items:
- {kind: Pod, metadata: {name: a, namespace: app, labels: {app: web},
   ownerReferences: [{kind: ReplicaSet, name: rs, controller: true}]}, spec: {nodeName: n0}}
- {kind: Pod, metadata: {name: bare, namespace: app}, spec: {nodeName: n0}}
- {kind: Pod, metadata: {name: going, namespace: app, deletionTimestamp: "2026-01-01T00:00:00Z",
   ownerReferences: [{kind: ReplicaSet, name: rs, controller: true}]}, spec: {nodeName: n0}}
- {kind: PodDisruptionBudget, metadata: {name: web, namespace: app},
   spec: {maxUnavailable: 1, selector: {matchLabels: {app: web}}}}
---
kind: Pod
metadata: {name: b, namespace: app}
"""
    found = split_objects(text, "pods.yaml", ("Pod", "PodDisruptionBudget"))
    assert [p["metadata"]["name"] for p in found["Pod"]] == ["a", "bare", "going", "b"]
    ev = evictability(found["Pod"], found["PodDisruptionBudget"])
    assert dict(ev.recreated_by) == {"app/a": "ReplicaSet/rs", "app/going": "ReplicaSet/rs"}
    assert ev.blocked["app/bare"] == "without a controller that recreates them"
    assert ev.blocked["app/going"] == "already terminating"
    (b,) = ev.budgets
    assert b.name == "app/web" and b.allowed == 1 and b.pods == frozenset({"app/a"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: List\nitems:\n- {kind: Service, metadata: {name: s}}\n",
         "pods.yaml: document 0 item 0: kind: expected Pod or PodDisruptionBudget, got 'Service'"),
        ("kind: List\nitems: 3\n", "pods.yaml: document 0: items: expected a list"),
        ("- a\n- b\n", "pods.yaml: document 0: expected an object, got list"),
        ("a: [\n", "pods.yaml: not valid YAML"),
    ],
)
def test_bad_files_name_the_source_and_item(text: str, message: str) -> None:
    with pytest.raises(ObjectError) as e:
        split_objects(text, "pods.yaml", ("Pod", "PodDisruptionBudget"))
    assert str(e.value).startswith(message)
