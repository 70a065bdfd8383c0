"""The defragmenter's handler (scheduler/defrag/loop.py) on a real cache and reservation
book: a group waits, a controller-owned pod is evicted, the freed GPUs are held so no
other pod (the replacement included) gets them, the group is reserved there; a 429 is
tried again; a standby does nothing; plan mode only tells."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sched_builders import FakeClock, node, whole_pod
from test_groups_builders import bound, lws_pod

from kube.assumptions import AssumeError
from kube.cache import ClusterCache
from kube.defrag.inputs import PodOwners
from kube.evictions import EvictionResult, PodRef
from kube.groups.reservations import ReservationTap
from kube.objects import pod_request
from packing.defrag.plan import DefragParams
from packing.model import Placement
from scheduler.defrag.decide import DefragSettings
from scheduler.defrag.loop import Defragmenter, defrag_hold_key
from scheduler.groups.loop import ReservationBook, hold_key

GROUP = "llm/vllm/0"


def owned(p: dict[str, Any], rs: str = "web-7d9c") -> dict[str, Any]:
    p["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                         "name": rs, "uid": "rs-uid", "controller": True}]
    return p


@dataclass
class FakeEvictor:
    answers: list[str] = field(default_factory=list)  # outcomes to give, then "evicted"
    asked: list[str] = field(default_factory=list)

    def evict(self, pod: PodRef) -> EvictionResult:
        self.asked.append(pod.key)
        out = self.answers.pop(0) if self.answers else "evicted"
        return EvictionResult(out, "Cannot evict pod as it would violate the pod's "
                                   "disruption budget." if out == "pdb" else "")


@dataclass
class FakeEvents:
    got: list[tuple[str, str, str]] = field(default_factory=list)

    def emit(self, pod: PodRef, reason: str, message: str, warning: bool = False) -> None:
        self.got.append((pod.key, reason, message))

    def reasons(self, key: str | None = None) -> list[str]:
        return [r for k, r, _ in self.got if key is None or k == key]


@dataclass
class Rig:
    cache: ClusterCache
    book: ReservationBook
    tap: ReservationTap
    defrag: Defragmenter
    evictor: FakeEvictor
    events: FakeEvents
    clock: FakeClock
    registry: CollectorRegistry

    def metric(self, name: str, **labels: str) -> float:
        v = self.registry.get_sample_value(name, labels or None)
        return 0.0 if v is None else v

    def tick(self, seconds: float = 1.0) -> None:
        self.clock.advance(seconds)
        self.book.step()
        self.defrag.tick()


def rig(pods: list[dict[str, Any]], mode: str = "act", answers: list[str] | None = None,
        leader: bool = True, per_minute: int = 2, window: tuple[int, int] | None = None,
        nodes: tuple[str, ...] = ("a", "b")) -> Rig:
    """Two 8-GPU nodes: ``a`` with a 2-GPU web pod (ReplicaSet-owned), ``b`` with a
    2-GPU one; a group of one 8-GPU pod waits (6 + 6 GPUs free, none 8 on one node)."""
    clock = FakeClock()
    cache = ClusterCache("gpupack")
    book = ReservationBook(cache, ttl=600, clock=clock, retry_s=0.0, cooldown_s=10.0,
                           is_leader=lambda: leader)
    owners = PodOwners(cache)
    tap = ReservationTap(owners, book)
    tap.replace_records([])
    tap.replace([node(n) for n in nodes], pods)
    tap.mark_synced()
    ev, events, reg = FakeEvictor(list(answers or [])), FakeEvents(), CollectorRegistry()
    d = Defragmenter(cache, book, owners, mode, ev if mode == "act" else None, events,
                     settings=DefragSettings(evictions_per_minute=per_minute, retry_base_s=4.0,
                                       plan_every_s=1.0, plan_min_s=0.0),
                     params=DefragParams(max_time_s=2.0), registry=reg,
                     is_leader=lambda: leader, clock=clock, consolidate_window=window)
    r = Rig(cache, book, tap, d, ev, events, clock, reg)
    book.step()
    return r


def cluster() -> list[dict[str, Any]]:
    return [owned(whole_pod("web-1", 2, namespace="web", node="a", uid="u-web-1")),
            owned(whole_pod("web-2", 2, namespace="web", node="b", uid="u-web-2")),
            lws_pod("vllm", 0, 1, 8)]


def test_evicts_holds_the_freed_room_and_hands_it_to_the_group() -> None:
    r = rig(cluster())
    assert r.book.waiting[GROUP].category == "no_room"
    r.tick()  # plans, starts a campaign, holds the idle GPUs of the room
    c = r.defrag.campaign
    assert c is not None and c.group == GROUP
    assert len(c.targets) == 1
    victim = c.targets[0]
    room_node = victim.node
    hk = defrag_hold_key(GROUP, room_node)
    held = r.cache.counted(hk)
    assert held is not None and len(held[1].gpus) == 6  # the idle ones, held already
    assert r.events.reasons("llm/vllm-0") == ["DefragStarted"]
    r.tick()
    assert r.evictor.asked == [victim.pod]
    assert r.metric("gpupack_defrag_evictions_total", outcome="evicted") == 1
    assert "EvictedForGroup" in r.events.reasons(victim.pod)
    # The API server deletes the pod: in that same step its GPUs are held and, the room
    # being whole now, the book reserves it for the group (its hold replaces ours).
    r.tap.delete_pod(victim.pod)
    assert r.cache.counted(hk) is None
    rec = r.book.reservations.get(GROUP)
    assert rec is not None and {p.node for p in rec.slots.values()} == {room_node}
    held = r.cache.counted(hold_key(GROUP, 0))
    assert held is not None and held[1].node == room_node
    assert sorted(held[1].gpus) == list(range(8))
    # Its replacement (the ReplicaSet's new pod) cannot take them: bind refuses.
    name = victim.pod.split("/")[1] + "-new"
    repl = pod_request(owned(whole_pod(name, 2, namespace="web", uid="u-new")))
    assert r.cache.state.options(repl, room_node) == []
    with pytest.raises(AssumeError):
        r.cache.assume(repl, "u-new", Placement(repl.key, room_node, (0, 1)))
    other = "b" if room_node == "a" else "a"
    assert r.cache.state.options(repl, other)  # it lands on the other node
    r.tick()  # the pass after reports it
    assert r.defrag.campaign is None
    assert r.metric("gpupack_defrag_gpus_freed_total") == 2
    assert r.metric("gpupack_defrag_group_wait_seconds_count") == 1
    assert r.metric("gpupack_defrag_campaigns_stopped_total", reason="handed_over") == 1
    assert r.events.reasons("llm/vllm-0") == ["DefragStarted", "DefragRoomReserved"]


def test_a_pdb_refusal_is_tried_again_after_backoff() -> None:
    r = rig(cluster(), answers=["pdb", "pdb"])
    r.tick()
    r.tick(0.5)
    r.tick(1.0)  # backing off (4 s)
    assert len(r.evictor.asked) == 1
    assert r.metric("gpupack_defrag_evictions_total", outcome="pdb") == 1
    assert r.events.reasons("llm/vllm-0") == ["DefragStarted", "DefragEvictionRefused"]
    r.tick(3.0)
    assert len(r.evictor.asked) == 2  # again after 4 s; refused again: 8 s now
    r.tick(5.0)
    assert len(r.evictor.asked) == 2
    r.tick(4.0)
    assert len(r.evictor.asked) == 3
    assert r.metric("gpupack_defrag_evictions_total", outcome="evicted") == 1
    assert r.events.reasons("llm/vllm-0").count("DefragEvictionRefused") == 1  # told once


def test_stops_and_gives_the_room_back_when_the_group_is_deleted() -> None:
    r = rig(cluster())
    r.tick()
    c = r.defrag.campaign
    assert c is not None
    hk = defrag_hold_key(GROUP, c.targets[0].node)
    assert r.cache.counted(hk) is not None
    r.tap.delete_pod("llm/vllm-0")
    r.tick()
    assert r.defrag.campaign is None
    assert r.cache.counted(hk) is None
    assert r.evictor.asked == []
    assert r.metric("gpupack_defrag_campaigns_stopped_total", reason="gone") == 1


def test_a_standby_plans_nothing_and_holds_nothing() -> None:
    r = rig(cluster(), leader=False)
    for _ in range(3):
        r.tick()
    assert r.defrag.campaign is None and r.evictor.asked == [] and r.events.got == []
    assert not any("#defrag-" in k for k in r.cache.holds())


def test_plan_mode_tells_once_and_evicts_nothing() -> None:
    r = rig(cluster(), mode="plan")
    for _ in range(3):
        r.tick()
    assert r.events.reasons("llm/vllm-0") == ["DefragPlanned"]
    assert r.metric("gpupack_defrag_moves_planned_total") == 1
    assert r.defrag.campaign is None and not any("#defrag-" in k for k in r.cache.holds())


def test_bare_pods_are_never_evicted() -> None:
    pods = [whole_pod("nb-1", 2, namespace="web", node="a"),
            whole_pod("nb-2", 2, namespace="web", node="b"), lws_pod("vllm", 0, 1, 8)]
    r = rig(pods)
    for _ in range(3):
        r.tick()
    assert r.defrag.campaign is None and r.evictor.asked == []


def test_consolidation_empties_a_nearly_empty_node_in_its_window() -> None:
    """A group of one 8-GPU pod was seen (and placed on c); in the window, with no whole
    node left free, the one web pod of a nearly empty node is evicted: that node is whole
    and free again for the next such group."""
    pods = [owned(whole_pod("web-1", 2, namespace="web", node="a", uid="u-web-1")),
            owned(whole_pod("web-2", 2, namespace="web", node="b", uid="u-web-2")),
            lws_pod("vllm", 0, 1, 8)]
    r = rig(pods, window=(0, 0), nodes=("a", "b", "c"))
    rec = r.book.reservations[GROUP]
    assert {p.node for p in rec.slots.values()} == {"c"}
    r.tap.upsert_pod(bound(lws_pod("vllm", 0, 1, 8), "c",
                           {"gpupack.io/gpus": "0,1,2,3,4,5,6,7"}))
    r.tick()  # seen; no whole node free now (c is the group's): one more is wanted
    assert r.defrag.seen is not None and r.defrag.seen.total == 8
    c = r.defrag.campaign
    assert c is not None and c.group.startswith("gpupack-consolidate/")
    assert len(c.targets) == 1 and set(c.room) == {c.targets[0].node}
    freed = c.targets[0].node
    r.tick()
    assert r.evictor.asked == [c.targets[0].pod]
    assert "EvictedForConsolidation" in r.events.reasons(c.targets[0].pod)
    assert r.events.reasons("llm/vllm-0") == []  # no group to tell
    r.tap.delete_pod(c.targets[0].pod)
    r.tick()
    assert r.defrag.campaign is None
    assert r.metric("gpupack_defrag_campaigns_stopped_total", reason="consolidated") == 1
    assert r.metric("gpupack_defrag_gpus_freed_total") == 2
    assert r.cache.state.nodes[freed].whole_free
    assert not any("#defrag-" in k for k in r.cache.holds())
    for _ in range(3):
        r.tick(10)
    assert r.evictor.asked == [c.targets[0].pod]  # one whole node free: enough


def test_no_consolidation_outside_the_window() -> None:
    pods = [owned(whole_pod("web-1", 2, namespace="web", node="a", uid="u-web-1")),
            owned(whole_pod("web-2", 2, namespace="web", node="b", uid="u-web-2")),
            lws_pod("vllm", 0, 1, 8)]
    day = 86400 * 20000
    r = rig(pods, window=(60, 120), nodes=("a", "b", "c"))
    r.clock.now = day + 12 * 3600  # noon UTC; the window is 01:00-02:00
    for _ in range(3):
        r.tick()
    assert r.defrag.campaign is None and r.evictor.asked == []
    r.clock.now = day + 86400 + 3600 + 60  # 01:01 the next day
    r.tick()
    assert r.defrag.campaign is not None


def test_losing_leadership_mid_campaign_gives_the_room_back() -> None:
    r = rig(cluster())
    r.tick()
    c = r.defrag.campaign
    assert c is not None
    assert any("#defrag-" in k for k in r.cache.holds())
    r.defrag.is_leader = lambda: False
    r.tick()
    assert r.defrag.campaign is None and r.evictor.asked == []
    assert not any("#defrag-" in k for k in r.cache.holds())
    assert r.metric("gpupack_defrag_campaigns_stopped_total", reason="leadership") == 1


def test_rate_limit_holds_across_passes() -> None:
    """Three pods to evict, one per minute: the second waits a minute after the first."""
    pods = [owned(whole_pod(f"web-{i}", 1, namespace="web", node="a", uid=f"u-{i}"))
            for i in range(3)]
    pods += [owned(whole_pod(f"fill-{i}", 1, namespace="web", node="b", uid=f"f-{i}"))
             for i in range(3)]
    pods += [lws_pod("vllm", 0, 1, 8)]
    r = rig(pods, per_minute=1)
    r.tick()
    c = r.defrag.campaign
    assert c is not None and len(c.targets) == 3
    r.tick()
    assert len(r.evictor.asked) == 1
    for _ in range(5):
        r.tick(10)  # 50 s later: still one
    assert len(r.evictor.asked) == 1
    r.tick(11)
    assert len(r.evictor.asked) == 2
    assert r.metric("gpupack_defrag_evictions_total", outcome="evicted") == 2
