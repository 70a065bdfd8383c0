"""kube.constraints: where a pod may run, as kube-scheduler's NodeSelector, NodeAffinity
and TaintToleration filters decide it; errors name the field."""

from __future__ import annotations

from typing import Any

import pytest

from kube.constraints import (
    PodConstraints,
    Taint,
    exclusion,
    node_level,
    node_taints,
    pod_constraints,
    reach_text,
    spec_constraints,
    spec_node_level,
    why_not,
)
from kube.objects import ObjectError


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "llm"},
            "spec": {"containers": [{"name": "c"}], **spec}}


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return e


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}


ZONE = "topology.kubernetes.io/zone"
LABELS = {ZONE: "b", "gpu": "h100", "rack": "12"}

CASES: list[tuple[str, dict[str, Any], list[Taint], str | None]] = [
    ("nothing asked", {}, [], None),
    ("selector matches", {"nodeSelector": {ZONE: "b"}}, [], None),
    ("selector differs", {"nodeSelector": {ZONE: "a"}}, [], "node selector"),
    ("selector label missing", {"nodeSelector": {"x": "y"}}, [], "node selector"),
    ("In matches", {"affinity": affinity({"matchExpressions": [expr(ZONE, "In", "a", "b")]})},
     [], None),
    ("In misses", {"affinity": affinity({"matchExpressions": [expr(ZONE, "In", "a")]})}, [],
     "affinity"),
    ("NotIn", {"affinity": affinity({"matchExpressions": [expr(ZONE, "NotIn", "b")]})}, [],
     "affinity"),
    ("NotIn on an absent label holds",
     {"affinity": affinity({"matchExpressions": [expr("x", "NotIn", "b")]})}, [], None),
    ("Exists", {"affinity": affinity({"matchExpressions": [expr("gpu", "Exists")]})}, [], None),
    ("DoesNotExist", {"affinity": affinity({"matchExpressions": [expr("gpu", "DoesNotExist")]})},
     [], "affinity"),
    ("Gt", {"affinity": affinity({"matchExpressions": [expr("rack", "Gt", "10")]})}, [], None),
    ("Lt", {"affinity": affinity({"matchExpressions": [expr("rack", "Lt", "10")]})}, [],
     "affinity"),
    ("terms are ORed", {"affinity": affinity(
        {"matchExpressions": [expr(ZONE, "In", "a")]},
        {"matchExpressions": [expr(ZONE, "In", "b")]})}, [], None),
    ("expressions in a term are ANDed", {"affinity": affinity(
        {"matchExpressions": [expr(ZONE, "In", "b"), expr("gpu", "In", "a100")]})}, [],
     "affinity"),
    ("an empty term matches nothing", {"affinity": affinity({})}, [], "affinity"),
    ("matchFields on the name", {"affinity": affinity(
        {"matchFields": [expr("metadata.name", "In", "n1")]})}, [], None),
    ("matchFields on another name", {"affinity": affinity(
        {"matchFields": [expr("metadata.name", "In", "n2")]})}, [], "affinity"),
    ("preferred affinity is not required", {"affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [expr(ZONE, "In", "a")]}}]}}},
     [], None),
    ("NoSchedule taint not tolerated", {}, [Taint("gpu", "yes", "NoSchedule")], "taint gpu=yes"),
    ("NoExecute taint not tolerated", {}, [Taint("maint", "", "NoExecute")], "taint maint"),
    ("PreferNoSchedule only scores", {}, [Taint("x", "", "PreferNoSchedule")], None),
    ("Equal toleration", {"tolerations": [{"key": "gpu", "value": "yes",
                                           "effect": "NoSchedule"}]},
     [Taint("gpu", "yes", "NoSchedule")], None),
    ("Equal toleration, other value", {"tolerations": [{"key": "gpu", "value": "no"}]},
     [Taint("gpu", "yes", "NoSchedule")], "taint"),
    ("Exists toleration, any effect", {"tolerations": [{"key": "gpu", "operator": "Exists"}]},
     [Taint("gpu", "yes", "NoExecute")], None),
    ("toleration of another effect", {"tolerations": [
        {"key": "gpu", "operator": "Exists", "effect": "NoExecute"}]},
     [Taint("gpu", "yes", "NoSchedule")], "taint"),
    ("empty key Exists tolerates all", {"tolerations": [{"operator": "Exists"}]},
     [Taint("a", "1", "NoSchedule"), Taint("b", "", "NoExecute")], None),
]


@pytest.mark.parametrize(("spec", "taints", "expect"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_why_not(spec: dict[str, Any], taints: list[Taint], expect: str | None) -> None:
    c = pod_constraints(pod(**spec))
    why = why_not(c, "n1", LABELS, taints)
    if expect is None:
        assert why is None
    else:
        assert why is not None and expect in why


BAD: list[tuple[dict[str, Any], str]] = [
    ({"nodeSelector": {"a": 1}}, "spec.nodeSelector.a"),
    ({"nodeSelector": "zone-b"}, "spec.nodeSelector"),
    ({"affinity": affinity({"matchExpressions": [expr(ZONE, "Near", "b")]})},
     "matchExpressions[0].operator"),
    ({"affinity": affinity({"matchExpressions": [expr(ZONE, "In")]})}, "values"),
    ({"affinity": affinity({"matchExpressions": [expr("rack", "Gt", "ten")]})}, "values"),
    ({"affinity": affinity({"matchFields": [expr("spec.x", "In", "a")]})}, "matchFields"),
    ({"tolerations": [{"key": "a", "operator": "Maybe"}]}, "tolerations[0].operator"),
    ({"tolerations": [{"value": "x"}]}, "tolerations[0]"),
    ({"tolerations": "all"}, "spec.tolerations"),
    ({"schedulerName": 7}, "spec.schedulerName"),
    ({"tolerations": [{"operator": "Exists"}] * 65}, "at most 64"),
]


@pytest.mark.parametrize(("spec", "field"), BAD, ids=[b[1] for b in BAD])
def test_unreadable_constraints_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ObjectError) as e:
        pod_constraints(pod(**spec))
    assert "Pod llm/p" in str(e.value) and field in str(e.value)


def test_scopes_and_owner_are_read() -> None:
    p = pod(priorityClassName="high", activeDeadlineSeconds=60, schedulerName="gpupack")
    p["metadata"]["labels"] = {"leaderworkerset.sigs.k8s.io/name": "vllm"}
    c = pod_constraints(p)
    assert (c.priority_class, c.terminating, c.best_effort, c.scheduler_name, c.lws) == (
        "high", True, True, "gpupack", "vllm")
    p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    assert not pod_constraints(p).best_effort
    assert spec_constraints(None, "t") == PodConstraints(best_effort=True)


def test_node_taints() -> None:
    n = {"metadata": {"name": "n1"}, "spec": {"taints": [
        {"key": "gpu", "value": "yes", "effect": "NoSchedule"},
        {"key": "b", "effect": "NoExecute"}]}}
    assert node_taints(n) == (Taint("gpu", "yes", "NoSchedule"), Taint("b", "", "NoExecute"))
    assert node_taints({"metadata": {"name": "n2"}}) == ()
    with pytest.raises(ObjectError, match=r"Node n3: spec.taints\[0\]"):
        node_taints({"metadata": {"name": "n3"}, "spec": {"taints": [{"key": "x"}]}})


# exclusion(): the same judgement as why_not, naming the pod's field that keeps the node out
# (the webhook's denials and reasons quote it). One row per operator and toleration rule.
AFF = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
FIELDS: list[tuple[str, dict[str, Any], list[Taint], bool, str | None]] = [
    ("nothing asked", {}, [], False, None),
    ("selector", {"nodeSelector": {ZONE: "a"}}, [], False, f"spec.nodeSelector.{ZONE}=a"),
    ("selector, second key", {"nodeSelector": {ZONE: "b", "pool": "x"}}, [], False,
     "spec.nodeSelector.pool=x"),
    ("In", {"affinity": affinity({"matchExpressions": [expr(ZONE, "In", "a", "c")]})}, [],
     False, f"{AFF}.nodeSelectorTerms[0].matchExpressions[0] ({ZONE} In [a, c])"),
    ("NotIn", {"affinity": affinity({"matchExpressions": [
        expr("gpu", "Exists"), expr(ZONE, "NotIn", "b")]})}, [], False,
     f"{AFF}.nodeSelectorTerms[0].matchExpressions[1] ({ZONE} NotIn [b])"),
    ("Exists", {"affinity": affinity({"matchExpressions": [expr("x", "Exists")]})}, [], False,
     f"{AFF}.nodeSelectorTerms[0].matchExpressions[0] (x Exists)"),
    ("DoesNotExist", {"affinity": affinity({"matchExpressions": [
        expr("rack", "DoesNotExist")]})}, [], False,
     f"{AFF}.nodeSelectorTerms[0].matchExpressions[0] (rack DoesNotExist)"),
    ("Gt", {"affinity": affinity({"matchExpressions": [expr("rack", "Gt", "12")]})}, [],
     False, f"{AFF}.nodeSelectorTerms[0].matchExpressions[0] (rack Gt [12])"),
    ("Lt", {"affinity": affinity({"matchExpressions": [expr("rack", "Lt", "13")]})}, [],
     False, None),
    ("Gt on a label that is not a number", {"affinity": affinity({"matchExpressions": [
        expr(ZONE, "Gt", "1")]})}, [], False,
     f"{AFF}.nodeSelectorTerms[0].matchExpressions[0] ({ZONE} Gt [1])"),
    ("matchFields", {"affinity": affinity({"matchFields": [
        expr("metadata.name", "NotIn", "n1")]})}, [], False,
     f"{AFF}.nodeSelectorTerms[0].matchFields[0] (metadata.name NotIn [n1])"),
    ("no term matches: the first is named", {"affinity": affinity(
        {"matchExpressions": [expr(ZONE, "In", "a")]},
        {"matchExpressions": [expr(ZONE, "In", "c")]})}, [], False,
     f"{AFF}.nodeSelectorTerms[0].matchExpressions[0] ({ZONE} In [a])"),
    ("one term matches", {"affinity": affinity(
        {"matchExpressions": [expr(ZONE, "In", "a")]},
        {"matchFields": [expr("metadata.name", "In", "n1")]})}, [], False, None),
    ("empty term", {"affinity": affinity({})}, [], False,
     f"{AFF}.nodeSelectorTerms[0] (an empty term matches no node)"),
    ("NoSchedule taint, no tolerations", {}, [Taint("gpu", "yes", "NoSchedule")], False,
     "spec.tolerations (none): taint gpu=yes:NoSchedule"),
    ("NoExecute taint, other tolerations", {"tolerations": [{"key": "a", "operator": "Exists"}]},
     [Taint("maint", "", "NoExecute")], False, "spec.tolerations: taint maint:NoExecute"),
    ("PreferNoSchedule", {}, [Taint("x", "", "PreferNoSchedule")], False, None),
    ("Equal with value", {"tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes"}]},
     [Taint("gpu", "yes", "NoExecute")], False, None),
    ("Equal, other value", {"tolerations": [{"key": "gpu", "value": "no"}]},
     [Taint("gpu", "yes", "NoSchedule")], False, "spec.tolerations: taint gpu=yes:NoSchedule"),
    ("Exists on the key", {"tolerations": [{"key": "gpu", "operator": "Exists",
                                            "effect": "NoSchedule"}]},
     [Taint("gpu", "yes", "NoSchedule")], False, None),
    ("effect must match", {"tolerations": [{"key": "gpu", "operator": "Exists",
                                            "effect": "NoSchedule"}]},
     [Taint("gpu", "yes", "NoExecute")], False, "spec.tolerations: taint gpu=yes:NoExecute"),
    ("empty key Exists tolerates all", {"tolerations": [{"operator": "Exists"}]},
     [Taint("a", "1", "NoSchedule"), Taint("b", "", "NoExecute")], True, None),
    ("cordoned", {}, [], True, "spec.unschedulable of the node (cordoned)"),
    ("cordoned, tolerated", {"tolerations": [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]}, [], True, None),
]


@pytest.mark.parametrize(("spec", "taints", "cordoned", "field"), [c[1:] for c in FIELDS],
                         ids=[c[0] for c in FIELDS])
def test_exclusion_names_the_field(spec: dict[str, Any], taints: list[Taint],
                                   cordoned: bool, field: str | None) -> None:
    c = pod_constraints(pod(**spec))
    e = exclusion(node_level(c), "n1", LABELS, taints, unschedulable=cordoned)
    assert (e.field if e else None) == field
    if not cordoned:  # why_not is the same judgement
        assert (why_not(c, "n1", LABELS, taints) is None) == (e is None)


def test_node_level_signature_and_text() -> None:
    c = pod_constraints(pod(nodeSelector={"pool": "a"}, tolerations=[{"operator": "Exists"}],
                            affinity=affinity({"matchExpressions": [expr(ZONE, "In", "b")]})))
    level = node_level(c)
    assert not level.empty and node_level(pod_constraints(pod())).empty
    # Hashable and equal for equal constraints: the webhook caches per signature.
    assert {level: 1}[node_level(pod_constraints(pod(
        nodeSelector={"pool": "a"}, tolerations=[{"operator": "Exists"}],
        affinity=affinity({"matchExpressions": [expr(ZONE, "In", "b")]}))))] == 1
    assert reach_text(level) == (f"spec.nodeSelector.pool=a, {AFF} ({ZONE} In [b]), "
                                 "spec.tolerations (1)")
    # The webhook's lighter read gives the same signature.
    spec = pod(nodeSelector={"pool": "a"}, tolerations=[{"operator": "Exists"}],
               affinity=affinity({"matchExpressions": [expr(ZONE, "In", "b")]}))["spec"]
    assert spec_node_level(spec, "spec") == level
