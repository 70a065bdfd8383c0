"""Group reservations within a tenant's rights (issue 35 item 2).

A tenant who may only create pods in its own namespace used to hold what it liked: two
pending 1-GPU pods labelled as groups of 64 held all 128 GPUs of a 16-node cluster,
re-reserving after each expiry; a group sized by its LeaderWorkerSet object had no GPU
cap; two 1-GPU pods with forged LWS labels and the exclusive-topology annotation, one
per NVLink clique, left a real LLM group of another namespace waiting. Now:

- one namespace's reservations hold at most ``--max-namespace-reserved-gpus`` (default
  50% of the cluster; scheduler.groups.namespace_cap);
- a group sized by its LeaderWorkerSet object is capped by ``--max-group-gpus`` too;
- a group whose reservation expired waits a cool-down that doubles with each expiry in
  a row, unless it gains member pods;
- an exclusive domain keeps out only the groups of its own namespace, and only when the
  group's LeaderWorkerSet object asks for it.
"""

from __future__ import annotations

from typing import Any

import pytest
from sched_builders import node, whole_pod
from test_groups_builders import Rig, lws_inputs, lws_object, lws_pod, rig

from packing.groups.members import RESERVE_MARK
from scheduler.groups.namespace_cap import ReservedCap, parse_reserved_cap

CLIQUE = "nvidia.com/gpu.clique"


def cluster(n: int = 16, cliques: int = 0) -> list[dict[str, Any]]:
    """``n`` whole-GPU nodes of 8 H100s (in ``cliques`` NVLink cliques, round robin)."""
    return [node(f"n{i:02d}", reconfigurable=False,
                 labels={CLIQUE: f"c{i % cliques}"} if cliques else None) for i in range(n)]


def labelled_group(name: str, size: int, namespace: str = "evil") -> dict[str, Any]:
    """One pending 1-GPU pod that says it is the first of a group of ``size``."""
    return whole_pod(name, 1, namespace=namespace, annotations={
        "gpupack.io/group": name, "gpupack.io/group-size": str(size)})


def held(r: Rig, namespace: str | None = None) -> int:
    """GPUs held by reservations (of groups of ``namespace``)."""
    return sum(1 for s in r.cache.state.nodes.values() for g in s.gpus
               if g.whole_owner is not None and RESERVE_MARK in g.whole_owner
               and (namespace is None or g.whole_owner.startswith(namespace + "/")))


def test_issue_attack_two_labelled_pods_hold_at_most_the_namespace_cap() -> None:
    pods = [labelled_group("a", 64), labelled_group("b", 64)]
    # As before (no cap): the two pods hold all 128 GPUs.
    assert held(rig(cluster(), pods)) == 128
    r = rig(cluster(), pods, namespace_cap=parse_reserved_cap("50%"))
    assert held(r) == 63 + 1  # one group: 63 rooms for members not created, its pod's own
    waiting = r.book.waiting["evil/b"]
    assert waiting.category == "no_rights"
    assert "namespace evil may hold 0 more GPUs in reservations" in waiting.reason
    # Another namespace's group is not charged for evil's.
    r.tap.upsert_pod(lws_pod("llm", 0, 4, 8))
    r.sync()
    assert held(r, "llm") == 32


def test_a_reservation_over_the_whole_cap_is_refused_for_good() -> None:
    r = rig(cluster(), [labelled_group("a", 64)], namespace_cap=ReservedCap(gpus=32))
    assert held(r) == 0
    w = r.book.waiting["evil/a"]
    assert "would hold 64 GPUs, more than namespace evil may hold in reservations" in w.reason
    assert "--max-namespace-reserved-gpus 32" in w.reason


def test_a_group_sized_by_its_leaderworkerset_is_capped_like_a_labelled_one() -> None:
    nodes = cluster()
    p = lws_pod("big", 0, 16, 8)  # the object says 16 pods of 8 GPUs: 128
    r = rig(nodes, [p], inputs=lws_inputs(lws_object("big", 16)))
    assert held(r) == 0
    assert "sized by LeaderWorkerSet llm/big), more than --max-group-gpus 64" in \
        r.book.waiting["llm/big/0"].reason


def test_an_expired_group_without_new_members_backs_off() -> None:
    """TTL 100 s and a cool-down of 10 s in the rig: the group re-reserves after 10 s,
    then 20 s, then 40 s; a new member pod makes it due at once."""
    r = rig(cluster(), [labelled_group("a", 16)], ttl=100.0)
    assert held(r) == 16
    waits = []
    for _ in range(3):
        r.clock.advance(100)
        r.sync()
        assert held(r) == 0
        w = r.book.waiting["evil/a"]
        waits.append(w.next_try - r.clock.now)
        r.clock.advance(w.next_try - r.clock.now - 1)
        r.sync()
        assert held(r) == 0  # not before its time
        r.clock.advance(1)
        r.sync()
        assert held(r) == 16
    assert waits == [10.0, 20.0, 40.0]
    r.clock.advance(100)
    r.sync()
    w = r.book.waiting["evil/a"]
    assert held(r) == 0 and "4 in a row" in w.reason and w.next_try - r.clock.now == 80.0
    # The workload creates a member: it is reserved again at once.
    r.tap.upsert_pod(whole_pod("a-1", 1, namespace="evil", annotations={
        "gpupack.io/group": "a", "gpupack.io/group-size": "16"}))
    r.sync()
    assert held(r) == 16


def test_forged_exclusive_pods_of_another_namespace_leave_a_real_group_its_domain() -> None:
    """The issue's case: one forged 1-GPU "group" per NVLink clique, with the exclusive
    annotation and no LeaderWorkerSet object, in namespace evil; then a real group of
    namespace llm whose LeaderWorkerSet asks for exclusive cliques."""
    nodes = cluster(6, cliques=2)  # two cliques of three 8-GPU nodes
    forged = [lws_pod(f"f{c}", 0, 1, 1, namespace="evil", exclusive=CLIQUE,
                      node=f"n{c:02d}") for c in range(2)]  # bound, one per clique
    real = lws_pod("vllm", 0, 2, 8, exclusive=CLIQUE)
    r = rig(nodes, [*forged, real],
            inputs=lws_inputs(lws_object("vllm", 2, exclusive=CLIQUE)))
    assert "llm/vllm/0" in r.book.reservations
    # Even a real exclusive LeaderWorkerSet of another namespace keeps nothing from llm.
    legit = [lws_pod(f"e{c}", 0, 1, 1, namespace="evil", exclusive=CLIQUE,
                     node=f"n{c:02d}") for c in range(2)]
    objs = [lws_object(f"e{c}", 1, namespace="evil", exclusive=CLIQUE) for c in range(2)]
    r2 = rig(nodes, [*legit, real],
             inputs=lws_inputs(*objs, lws_object("vllm", 2, exclusive=CLIQUE)))
    assert "llm/vllm/0" in r2.book.reservations


def test_exclusive_domains_still_hold_within_a_namespace() -> None:
    nodes = cluster(6, cliques=2)
    other = lws_pod("other", 0, 1, 1, exclusive=CLIQUE, node="n00")  # llm, clique c0
    real = lws_pod("vllm", 0, 2, 8, exclusive=CLIQUE)
    objs = [lws_object("other", 1, exclusive=CLIQUE), lws_object("vllm", 2, exclusive=CLIQUE)]
    r = rig(nodes, [other, real], inputs=lws_inputs(*objs))
    rec = r.book.reservations["llm/vllm/0"]
    assert rec.exclusive and rec.domain == "c1"  # c0 is taken by llm's other group
    # Forged in llm itself (no object): placed, but it claims no domain.
    r3 = rig(nodes, [lws_pod("vllm", 0, 2, 8, exclusive=CLIQUE)], inputs=lws_inputs())
    assert not r3.book.reservations["llm/vllm/0"].exclusive


@pytest.mark.parametrize(("text", "cluster_gpus", "cap"), [
    ("50%", 128, 64), ("50%", 15, 7), ("25%", 0, 0), ("0.5%", 10, 1), ("32", 128, 32),
    ("100%", 7, 7),
])
def test_parse_reserved_cap(text: str, cluster_gpus: int, cap: int) -> None:
    assert parse_reserved_cap(text).of(cluster_gpus) == cap


@pytest.mark.parametrize("text", ["", "-1", "0%", "101%", "half", "5 GPUs", "1e3"])
def test_parse_reserved_cap_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"not a number|share must"):
        parse_reserved_cap(text)
