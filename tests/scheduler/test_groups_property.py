"""A Hypothesis property of the reservation book: at every step of any sequence of group
pods appearing, binding, being deleted, small pods taking room and the clock moving,
every group either holds room for all its members not bound yet, or holds nothing; and
room is held only for reserved groups, never twice."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_builders import node, whole_pod
from test_groups_builders import bound, lws_pod, rig

from kube.annotations import placement_annotations
from packing.groups.members import RESERVE_MARK
from packing.status import Status
from scheduler.groups.loop import hold_key
from scheduler.groups.plugin import GroupVerbs

NAMES = ("a", "b", "c", "d")
SHAPES = {"a": (2, 4), "b": (2, 4), "c": (3, 2), "d": (1, 4)}  # size, GPUs per pod

ops = st.lists(st.one_of(
    st.tuples(st.just("leader"), st.sampled_from(NAMES), st.integers(0, 2)),
    st.tuples(st.just("worker"), st.sampled_from(NAMES), st.integers(1, 2)),
    st.tuples(st.just("bind"), st.sampled_from(NAMES), st.integers(0, 2)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES), st.integers(0, 2)),
    st.tuples(st.just("tick"), st.sampled_from((1, 30, 70)), st.just(0)),
    st.tuples(st.just("small"), st.integers(0, 5), st.just(0)),
), max_size=25)


def pod_name(g: str, w: int) -> str:
    return f"llm/{g}-0" if w == 0 else f"llm/{g}-0-{w}"


def check(r: Any, world: dict[str, dict[str, Any]]) -> None:
    cache, book = r.cache, r.book
    owners = [g.whole_owner for n in cache.state.nodes.values() for g in n.gpus
              if g.whole_owner is not None]
    for owner in owners:
        if RESERVE_MARK in owner:
            group = owner.split(RESERVE_MARK)[0]
            assert group in book.reservations, f"{owner} held for a group with no reservation"
    for key, res in book.reservations.items():
        covered = 0
        for slot in range(res.size):
            pod = res.pods.get(slot)
            member_bound = pod is not None and cache.counted(pod) is not None
            if member_bound or cache.counted(hold_key(key, slot)) is not None:
                covered += 1
        assert covered == res.size, f"group {key}: {covered} of {res.size} members covered"
    for g in NAMES:
        key = f"llm/{g}/0"
        if key not in book.reservations:
            assert all(cache.counted(hold_key(key, s)) is None for s in range(3))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_every_group_is_whole_or_holds_nothing(steps: list[tuple[str, Any, int]]) -> None:
    nodes = [node(f"n{i}", gpus=4, reconfigurable=False) for i in range(3)]
    r = rig(nodes, [], ttl=60)
    world: dict[str, dict[str, Any]] = {}
    for op, arg, n in steps:
        if op == "leader":
            size, gpus = SHAPES[arg]
            key = pod_name(arg, 0)
            if key not in world:
                world[key] = lws_pod(arg, 0, size, gpus, priority=n)
                r.tap.upsert_pod(world[key])
        elif op == "worker":
            size, gpus = SHAPES[arg]
            key = pod_name(arg, n)
            if n < size and pod_name(arg, 0) in world and key not in world:
                world[key] = lws_pod(arg, n, size, gpus)
                r.tap.upsert_pod(world[key])
        elif op == "bind":
            key = pod_name(arg, n)
            req = r.cache.pending_pod(key)
            res = r.book.reservations.get(f"llm/{arg}/0")
            slot = None if res is None else r.book.slot_of(res, key)
            if req is not None and res is not None and slot is not None:
                target = res.slots[slot].node
                got = GroupVerbs(r.book).reserve(req, req.uid, target)
                if got is not None and not isinstance(got, Status):
                    ann = placement_annotations(got, "gpupack")
                    world[key] = bound(world[key], target, ann)
                    r.tap.upsert_pod(world[key])
        elif op == "delete":
            key = pod_name(arg, n)
            if key in world:
                del world[key]
                r.tap.delete_pod(key)
        elif op == "tick":
            r.clock.advance(arg)
        elif op == "small":
            key = f"x/small-{arg}"
            if key not in world:
                p = whole_pod(f"small-{arg}", 1, namespace="x")
                with r.cache.view() as view:
                    from kube.objects import pod_request

                    req = pod_request(p)
                    option = next((o for name in view.node_names()
                                   for o in view.state.options(req, name)), None)
                    if option is not None:
                        view.assume(req, req.uid, option)
                        world[key] = bound(p, option.node, placement_annotations(option, "x"))
                        r.tap.upsert_pod(world[key])
        r.sync()
        check(r, world)
