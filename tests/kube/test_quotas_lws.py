"""kube.quotas and kube.groups.lws: ResourceQuota GPU limits and scopes, LeaderWorkerSet shapes;
kube.groups.inputs keeps them, and the version moves on every change."""

from __future__ import annotations

from typing import Any

import pytest

from kube.constraints import PodConstraints
from kube.groups.inputs import GroupInputs
from kube.groups.lws import lws_of
from kube.objects import ObjectError
from kube.quotas import Quota, ScopeRule, covers, quota_of


def rq(hard: dict[str, Any], ns: str = "llm", name: str = "gpus", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name}, "spec": {"hard": hard, **spec}}


@pytest.mark.parametrize(("hard", "expect"), [
    ({"requests.nvidia.com/gpu": "8"}, {"nvidia.com/gpu": 8}),
    ({"nvidia.com/gpu": 4}, {"nvidia.com/gpu": 4}),
    ({"limits.nvidia.com/gpu": "6", "requests.nvidia.com/gpu": "4"}, {"nvidia.com/gpu": 4}),
    ({"requests.nvidia.com/mig-1g.10gb": "3", "requests.nvidia.com/gpu.shared": "2"},
     {"nvidia.com/mig-1g.10gb": 3, "nvidia.com/gpu.shared": 2}),
    ({"requests.cpu": "10", "pods": "5"}, {}),
])
def test_gpu_limits_are_read(hard: dict[str, Any], expect: dict[str, int]) -> None:
    assert dict(quota_of(rq(hard)).hard) == expect


@pytest.mark.parametrize(("obj", "field"), [
    (rq({"requests.nvidia.com/gpu": "lots"}), "spec.hard.requests.nvidia.com/gpu"),
    (rq({"requests.nvidia.com/gpu": "1.5"}), "spec.hard.requests.nvidia.com/gpu"),
    (rq({}, scopes="Terminating"), "spec.scopes"),
    (rq({}, scopeSelector={"matchExpressions": [{"scopeName": "PriorityClass",
                                                 "operator": "Near"}]}), "operator"),
    ({"metadata": {"name": "x"}}, "metadata.namespace"),
])
def test_unreadable_quotas_name_the_field(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(ObjectError, match="ResourceQuota") as e:
        quota_of(obj)
    assert field in str(e.value)


HIGH = PodConstraints(priority_class="high")
PLAIN = PodConstraints()
TERM = PodConstraints(terminating=True)


@pytest.mark.parametrize(("rules", "c", "expect"), [
    ((), PLAIN, True),
    ((ScopeRule("PriorityClass"),), HIGH, True),
    ((ScopeRule("PriorityClass"),), PLAIN, False),
    ((ScopeRule("PriorityClass", "In", ("high",)),), HIGH, True),
    ((ScopeRule("PriorityClass", "In", ("low",)),), HIGH, False),
    ((ScopeRule("PriorityClass", "NotIn", ("low",)),), PLAIN, True),
    ((ScopeRule("PriorityClass", "DoesNotExist"),), HIGH, False),
    ((ScopeRule("Terminating"),), TERM, True),
    ((ScopeRule("NotTerminating"),), TERM, False),
    ((ScopeRule("BestEffort"),), PodConstraints(best_effort=True), True),
    ((ScopeRule("NotBestEffort"),), PodConstraints(best_effort=True), False),
    ((ScopeRule("CrossNamespacePodAffinity"),), PLAIN, True),  # not judged: covers
])
def test_scopes(rules: tuple[ScopeRule, ...], c: PodConstraints, expect: bool) -> None:
    q = Quota("llm", "q", {"nvidia.com/gpu": 1}, rules)
    assert covers(q, "llm", c) is expect
    assert covers(q, "other", c) is False


def lws(size: Any = 4, replicas: Any = 2, **tmpl: Any) -> dict[str, Any]:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"namespace": "llm", "name": "vllm"},
            "spec": {"replicas": replicas,
                     "leaderWorkerTemplate": {"size": size, **tmpl}}}


def test_lws_shape() -> None:
    worker = {"spec": {"nodeSelector": {"zone": "b"}, "containers": []}}
    s = lws_of(lws(workerTemplate=worker))
    assert (s.namespace, s.name, s.size, s.replicas) == ("llm", "vllm", 4, 2)
    assert s.templates[0].node_selector == (("zone", "b"),)
    d = lws_of({"metadata": {"namespace": "llm", "name": "x"}, "spec": {}})
    assert (d.size, d.replicas) == (1, 1)  # the CRD's defaults


@pytest.mark.parametrize(("obj", "field"), [
    (lws(size=0), "leaderWorkerTemplate.size"),
    (lws(size="4"), "leaderWorkerTemplate.size"),
    (lws(size=5000), "at most"),
    (lws(replicas=-1), "spec.replicas"),
    (lws(workerTemplate={"spec": {"tolerations": "x"}}), "workerTemplate.spec.tolerations"),
])
def test_unreadable_lws_names_the_field(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(ObjectError, match="LeaderWorkerSet llm/vllm") as e:
        lws_of(obj)
    assert field in str(e.value)


def test_inputs_keep_quotas_and_lws_and_move_their_version() -> None:
    inputs = GroupInputs()
    assert not inputs.listed()
    v = inputs.version
    inputs.replace([rq({"requests.nvidia.com/gpu": "8"}), rq({"pods": "3"}, name="pods"),
                    rq({"requests.nvidia.com/gpu": "x"}, name="bad")])
    assert [q.name for q in inputs.quotas("llm")] == ["gpus"]  # no GPU limit: not kept
    assert inputs.bad_objects == 1 and inputs.version > v
    v = inputs.version
    inputs.upsert(rq({"requests.nvidia.com/gpu": "2"}))
    assert inputs.quotas("llm")[0].hard == {"nvidia.com/gpu": 2} and inputs.version > v
    inputs.upsert(rq({"requests.nvidia.com/gpu": "two"}))  # unreadable now: forgotten
    assert inputs.quotas("llm") == ()
    inputs.upsert(rq({"requests.nvidia.com/gpu": "2"}))
    inputs.delete(rq({}))
    assert inputs.quotas("llm") == ()
    inputs.replace_lws([lws(), {"metadata": {}}], installed=True)
    inputs.lws_listed()
    assert inputs.listed()
    found = inputs.lws("llm", "vllm")
    assert found is not None and found.size == 4 and inputs.bad_objects == 3
    asked: list[int] = []
    inputs.on_unknown_lws = lambda: asked.append(1)
    assert inputs.lws("llm", "other") is None and asked == [1]
    inputs.replace_lws([], installed=False)
    assert inputs.lws("llm", "vllm") is None and asked == [1]  # not installed: nothing to ask
