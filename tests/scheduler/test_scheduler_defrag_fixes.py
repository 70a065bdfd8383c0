"""The defragmenter's handler (scheduler/defrag/loop.py) on the cases a review found:

* a kept move must never count on room freed by a move that is not carried out (a lone
  pod's, a group's that cannot get a campaign now): only the units a move may serve
  are planned;
* the room holds the CPU and memory the group's members take, not only the GPUs: the
  planner evicts pods for those too, and a replacement bound back in their place would
  leave the group without its room (and the next campaign would evict it again)."""

from __future__ import annotations

from typing import Any

import pytest
from sched_builders import node, pod, whole_pod
from test_defrag_act import GROUP, owned, rig
from test_groups_builders import lws_pod

from kube.assumptions import AssumeError
from kube.objects import pod_request
from packing.defrag.plan import DefragParams, DefragPlan, Evictability, plan_defrag
from packing.model import Placement, Snapshot
from scheduler.defrag.loop import defrag_hold_key


def sel(p: dict[str, Any], **labels: str) -> dict[str, Any]:
    p["spec"]["nodeSelector"] = dict(labels)
    return p


def test_a_kept_move_never_counts_on_a_lone_pods_move() -> None:
    """x: a 7-GPU pod (it may go to y); z: a 2-GPU pod w that fits only z and x. A lone
    6-GPU pod h of high priority (x only) waits, and a group of one 8-GPU pod (z only).
    Planned together, h's move sends v1 to y and frees x, and the group's move counts on
    that to send w to x; h's move is never carried out (a lone pod is only told), so w
    would be evicted with nowhere to go. Planned alone, the group has no move."""
    pods = [
        owned(whole_pod("v1", 7, namespace="web", node="x", uid="u-v1"), rs="v1-rs"),
        owned(sel(whole_pod("w", 2, namespace="web", node="z", uid="u-w"), wok="1"),
              rs="w-rs"),
        sel(whole_pod("h", 6, namespace="hi", uid="u-h", priority=100), hok="1"),
        sel(lws_pod("vllm", 0, 1, 8), lok="1"),
    ]
    r = rig(pods, nodes=())
    r.tap.upsert_node(node("x", labels={"wok": "1", "hok": "1"}))
    r.tap.upsert_node(node("y", labels={}))
    r.tap.upsert_node(node("z", labels={"wok": "1", "lok": "1"}))
    r.book.step()
    wreq = pod_request(sel(whole_pod("w2", 2, namespace="web", uid="u-w2"), wok="1"))
    assert r.cache.state.options(wreq, "x") == []  # w fits no node but its own now
    for _ in range(3):
        r.tick()
        assert r.book.waiting[GROUP].category == "no_room"
    assert r.defrag.campaign is None and r.evictor.asked == []
    assert r.defrag.last_plan_moves == ()


def test_only_the_units_a_move_may_serve_are_planned() -> None:
    """act: the group waiting for room, not a lone pod nor a group cooling down; plan:
    the group and the lone pod."""
    def spy_on(r: Any) -> list[list[str]]:
        seen: list[list[str]] = []

        def planner(snap: Snapshot, ev: Evictability, prm: DefragParams) -> DefragPlan:
            seen.append(sorted({p.group.key if p.group else p.key for p in snap.pending}))
            return plan_defrag(snap, ev, prm)

        r.defrag.planner = planner
        return seen

    def pods() -> list[dict[str, Any]]:
        return [owned(whole_pod("web-1", 2, namespace="web", node="a", uid="u-web-1")),
                owned(whole_pod("web-2", 2, namespace="web", node="b", uid="u-web-2")),
                whole_pod("lone", 8, namespace="hi", uid="u-lone", priority=100),
                lws_pod("vllm", 0, 1, 8)]

    r = rig(pods())
    seen = spy_on(r)
    r.tick()
    assert seen == [[GROUP]]
    assert r.defrag.campaign is not None and r.defrag.campaign.group == GROUP

    r = rig(pods(), mode="plan")
    seen = spy_on(r)
    r.tick()
    assert seen == [sorted([GROUP, "hi/lone"])]

    r = rig(pods())
    seen = spy_on(r)
    r.defrag.cooldown = {GROUP: r.clock.now + 3600}
    for _ in range(3):
        r.tick()
    assert seen == [] and r.defrag.campaign is None  # only the lone pod: never acted on


def test_the_room_holds_the_cpu_the_move_frees() -> None:
    """a: a 2-GPU web pod and a 60-CPU pod (64 CPUs in all); the group's 8-GPU pod asks
    8 CPUs, so both go. The room's hold counts the members' CPU as it frees: the CPU
    pod's replacement cannot come back to a, lands on another node, and the group gets
    its room; nothing is evicted again."""
    pods = [
        owned(whole_pod("web-1", 2, namespace="web", node="a", uid="u-web-1")),
        owned(pod("cpu-1", None, namespace="batch", node="a", uid="u-cpu-1", cpu="60"),
              rs="cpu-rs"),
        whole_pod("bare-b", 2, namespace="web", node="b", uid="u-bare-b"),  # never evicted
        whole_pod("bare-c", 2, namespace="web", node="c", uid="u-bare-c"),
        lws_pod("vllm", 0, 1, 8, cpu="8"),
    ]
    r = rig(pods, nodes=("a", "b", "c"))
    r.tick()
    c = r.defrag.campaign
    assert c is not None
    assert {t.pod for t in c.targets} == {"web/web-1", "batch/cpu-1"}
    assert c.takes == {"a": (8000, 1024)}
    hk = defrag_hold_key(GROUP, "a")
    held = r.cache.counted(hk)
    assert held is not None and len(held[1].gpus) == 6
    assert (held[0].cpu_milli, held[0].memory_mib) == (3000, 1024)  # what is free now
    r.tick()
    assert sorted(r.evictor.asked) == ["batch/cpu-1", "web/web-1"]
    r.tap.delete_pod("batch/cpu-1")
    held = r.cache.counted(hk)
    assert held is not None and held[0].cpu_milli == 8000  # held in the step it went
    repl = pod_request(owned(pod("cpu-2", None, namespace="batch", uid="u-cpu-2", cpu="60"),
                             rs="cpu-rs"))
    assert r.cache.state.options(repl, "a") == []
    with pytest.raises(AssumeError):
        r.cache.assume(repl, "u-cpu-2", Placement(repl.key, "a"))
    assert r.cache.state.options(repl, "b")
    r.tap.upsert_pod(owned(pod("cpu-2", None, namespace="batch", node="b", uid="u-cpu-2",
                               cpu="60"), rs="cpu-rs"))
    r.tap.delete_pod("web/web-1")
    rec = r.book.reservations.get(GROUP)
    assert rec is not None and {p.node for p in rec.slots.values()} == {"a"}
    assert not any("#defrag-" in k for k in r.cache.holds())  # given back at hand-over
    for _ in range(4):
        r.tick(20)
    assert sorted(r.evictor.asked) == ["batch/cpu-1", "web/web-1"]
    assert r.metric("gpupack_defrag_campaigns_stopped_total", reason="handed_over") == 1
    assert r.metric("gpupack_defrag_campaigns_stopped_total", reason="not_placed") == 0


def test_cpu_freed_before_any_gpu_of_a_node_is_held_too() -> None:
    """a: two 4-GPU web pods (no GPU idle) and a 60-CPU pod; the 8-GPU group (8 CPUs)
    needs all three gone. While no GPU of a is free the CPU and memory are held alone (a
    hold without GPUs), as they free; then with the GPUs, until the hand-over."""
    pods = [
        owned(whole_pod("web-1", 4, namespace="web", node="a", uid="u-web-1")),
        owned(whole_pod("web-2", 4, namespace="web", node="a", uid="u-web-2")),
        owned(pod("cpu-1", None, namespace="batch", node="a", uid="u-cpu-1", cpu="60"),
              rs="cpu-rs"),
        whole_pod("bare-b", 4, namespace="web", node="b", uid="u-bare-b"),
        whole_pod("bare-c", 4, namespace="web", node="c", uid="u-bare-c"),
        lws_pod("vllm", 0, 1, 8, cpu="8"),
    ]
    r = rig(pods, nodes=("a", "b", "c"), per_minute=3)
    r.tick()
    c = r.defrag.campaign
    assert c is not None and set(c.room) == {"a"} and len(c.targets) == 3
    hk = defrag_hold_key(GROUP, "a")
    held = r.cache.counted(hk)
    assert held is not None and held[1].gpus == ()
    assert (held[0].cpu_milli, held[0].memory_mib) == (2000, 1024)
    r.tick()
    assert len(r.evictor.asked) == 3
    r.tap.delete_pod("batch/cpu-1")
    held = r.cache.counted(hk)
    assert held is not None and held[1].gpus == () and held[0].cpu_milli == 8000
    r.tap.delete_pod("web/web-1")
    held = r.cache.counted(hk)
    assert held is not None and len(held[1].gpus) == 4 and held[0].cpu_milli == 8000
    r.tap.delete_pod("web/web-2")
    rec = r.book.reservations.get(GROUP)
    assert rec is not None and {p.node for p in rec.slots.values()} == {"a"}
    assert not any("#defrag-" in k for k in r.cache.holds())
