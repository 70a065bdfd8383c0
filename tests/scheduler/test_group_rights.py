"""scheduler.groups.rights: a group's size, allowed nodes and quota claims, as a pure
function of its pods, the nodes, the quotas and the LeaderWorkerSet object (table)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from kube.constraints import PodConstraints, Taint, Toleration
from kube.groups.lws import LwsShape
from kube.quotas import Quota, ScopeRule
from packing.model import GroupRef, PodRequest, RequestKind
from scheduler.groups.rights import (
    GroupRights,
    MemberFacts,
    NodeFacts,
    RightsSettings,
    group_rights,
    quota_left,
)

KEY = "llm/vllm/0"
ZONE = "topology.kubernetes.io/zone"
NODES = [NodeFacts("a1", {ZONE: "a"}), NodeFacts("b1", {ZONE: "b"}),
         NodeFacts("b2", {ZONE: "b"}, (Taint("maint", "", "NoSchedule"),))]
IN_B = PodConstraints(node_selector=((ZONE, "b"),), lws="vllm")
LWS_ONLY = PodConstraints(lws="vllm")
TOLERANT = PodConstraints(tolerations=(Toleration("maint", "Exists"),), lws="vllm")


def req(index: int, gpus: int = 8, size: int = 2, key: str = KEY) -> PodRequest:
    name = "vllm-0" if index == 0 else f"vllm-0-{index}"
    return PodRequest(f"llm/{name}", kind=RequestKind.WHOLE, gpu_count=gpus,
                      group=GroupRef(key, size, index))


def member(index: int, gpus: int = 8, size: int = 2, c: PodConstraints | str | None = None,
           bound: bool = False, scheduler: str = "gpupack") -> MemberFacts:
    return MemberFacts(req(index, gpus, size), TOLERANT if c is None else c, bound, scheduler)


def shape(size: int = 2, replicas: int = 1, *templates: PodConstraints) -> LwsShape:
    return LwsShape("llm", "vllm", size, replicas, tuple(templates))


GPU_QUOTA = Quota("llm", "gpus", {"nvidia.com/gpu": 24})


@dataclass
class Case:
    name: str
    members: list[MemberFacts]
    expect_size: int
    refused: str | None = None  # a part of the reason
    never: bool = False
    allowed: frozenset[str] | None = None
    lws: LwsShape | None = None
    quotas: list[Quota] = field(default_factory=list)
    claims: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    cap: int = 64


CASES = [
    Case("labels give the size", [member(0, c=TOLERANT)], 2),
    Case("labels over --max-group-gpus", [member(0, 8, 4)], 4, "--max-group-gpus 16", True,
         cap=16),
    Case("the LeaderWorkerSet's size wins over a forged label", [member(0, 8, 4)], 2,
         lws=shape(2), cap=16),
    Case("a LeaderWorkerSet size is capped like a labelled one (issue 35)",
         [member(0, 8, 8)], 8, "sized by LeaderWorkerSet llm/vllm), more than "
         "--max-group-gpus 16", True, lws=shape(8), cap=16),
    Case("a group index beyond spec.replicas is being scaled away",
         [member(0)], 2, "scaled away", True, lws=shape(2, 0)),
    Case("members disagree on the size", [member(0, 8, 2), member(1, 8, 4)], 4,
         "disagree", True),
    Case("a pending member of another scheduler", [member(0), member(1, scheduler="default")],
         2, "scheduled by 'default'", True),
    Case("a bound member of another scheduler is the truth",
         [member(0), member(1, bound=True, scheduler="default")], 2),
    Case("unreadable constraints", [member(0, c="Pod llm/vllm-0: spec.tolerations: bad")], 2,
         "spec.tolerations", True),
    Case("a zone selector keeps zone b untainted", [member(0, c=IN_B)], 2,
         allowed=frozenset({"b1"})),
    Case("every member's constraints count", [member(0, c=IN_B), member(1, c=TOLERANT)], 2,
         allowed=frozenset({"b1"})),
    Case("tolerating the taint opens every node", [member(0, c=TOLERANT)], 2),
    Case("an untolerated taint closes its node", [member(0, c=LWS_ONLY)], 2,
         allowed=frozenset({"a1", "b1"})),
    Case("the worker template binds members not created yet", [member(0, c=TOLERANT)], 2,
         allowed=frozenset({"b1", "b2"}), lws=shape(2, 1, PodConstraints(
             node_selector=((ZONE, "b"),), tolerations=(Toleration("maint", "Exists"),)))),
    Case("no node for every member", [member(0, c=PodConstraints(node_selector=(
        (ZONE, "c"),)))], 2, "no node is one every member could run on"),
    Case("over the quota's hard limit", [member(0)], 2, "ResourceQuota llm/gpus allows (8)",
         True, quotas=[Quota("llm", "gpus", {"nvidia.com/gpu": 8})]),
    Case("within the quota: a claim of the whole group, the leader already counted",
         [member(0)], 2, quotas=[GPU_QUOTA], claims={("llm/gpus", "nvidia.com/gpu"): (16, 8)}),
    Case("a quota of another priority class does not apply", [member(0)], 2,
         quotas=[Quota("llm", "gpus", {"nvidia.com/gpu": 1},
                       (ScopeRule("PriorityClass", "In", ("batch",)),))]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_group_rights(case: Case) -> None:
    got = group_rights(KEY, case.members, NODES, case.quotas, case.lws,
                       RightsSettings(max_group_gpus=case.cap))
    assert got.size == case.expect_size
    if case.refused is None:
        assert got.refused is None, got.refused
    else:
        assert got.refused is not None and case.refused in got.refused, got.refused
    assert got.never is case.never
    if case.refused is None:
        assert got.allowed == case.allowed
    assert dict(got.claims) == case.claims


def test_mig_members_count_one_device_each() -> None:
    mig = MemberFacts(PodRequest("llm/vllm-0", kind=RequestKind.MIG, mig_profile="1g.10gb",
                                 group=GroupRef(KEY, 3, 0)), TOLERANT, False, "gpupack")
    assert group_rights(KEY, [mig], NODES, [], None, RightsSettings(2)).never
    assert group_rights(KEY, [mig], NODES, [], None, RightsSettings(3)) == GroupRights(
        3, reserves=3)


@pytest.mark.parametrize(("members", "reserves"), [
    ([member(0)], 16),  # the leader pending, one worker not created: both rooms held
    ([member(0, bound=True)], 8),  # a bound leader holds its own GPUs, not a room
    ([member(0, bound=True), member(1, bound=True)], 0),
])
def test_reserves_counts_rooms_for_members_not_bound(members: list[MemberFacts],
                                                     reserves: int) -> None:
    assert group_rights(KEY, members, NODES, [], None, RightsSettings()).reserves == reserves


def _exclusive(index: int) -> MemberFacts:
    r = req(index)
    assert r.group is not None
    return MemberFacts(replace(r, group=replace(r.group, topology_key="rack", exclusive=True)),
                       TOLERANT, False, "gpupack")


@pytest.mark.parametrize(("lws", "backed"), [
    (None, False),  # forged LWS labels, no object: no exclusive domain
    (LwsShape("llm", "vllm", 2, 1), False),  # the object asks for no exclusivity
    (LwsShape("llm", "vllm", 2, 1, (), "zone"), False),  # another key
    (LwsShape("llm", "vllm", 2, 1, (), "rack"), True),
])
def test_exclusivity_must_be_the_leaderworkersets(lws: LwsShape | None, backed: bool) -> None:
    got = group_rights(KEY, [_exclusive(0)], NODES, [], lws, RightsSettings())
    assert got.exclusive_backed is backed
    # A group that asks for none is backed whatever its object says.
    assert group_rights(KEY, [member(0)], NODES, [], lws, RightsSettings()).exclusive_backed


def test_quota_left_counts_pods_and_rooms_for_members_not_created() -> None:
    pods = [(req(0), LWS_ONLY), (PodRequest("llm/x", kind=RequestKind.WHOLE, gpu_count=2),
                                 PodConstraints(priority_class="batch"))]
    future = [(req(1), None)]  # unknown constraints: counted
    left = quota_left([GPU_QUOTA, Quota("llm", "batch", {"nvidia.com/gpu": 4}, (
        ScopeRule("PriorityClass", "In", ("batch",)),))], "llm", pods, future)
    assert left == {("llm/gpus", "nvidia.com/gpu"): 24 - 8 - 2 - 8,
                    ("llm/batch", "nvidia.com/gpu"): 4 - 2 - 8}
