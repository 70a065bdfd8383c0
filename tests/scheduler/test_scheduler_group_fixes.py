"""Reservation book fixes (scheduler/groups: loop.py, decide.py, plugin.py): a group
complete only once every bind is confirmed, deadlines across a clock step back, writes
dropped during a lapse of the lease, rooms on nodes kube-scheduler rules out, revision
maps that do not grow for ever, and group names that contain the hold-key mark."""

from __future__ import annotations

from typing import Any

from sched_builders import FakeClock, filter_args, node, whole_pod
from test_groups_builders import bound, lws_pod, rig

from kube.annotations import placement_annotations
from kube.cache import ClusterCache
from kube.groups.reservations import ReservationTap, record_name, record_of
from kube.objects import pod_request
from kube.record_writer import RecordWriter, StaticRecordStore
from packing.model import Placement
from packing.status import Status
from scheduler.extender.wire import ExtenderArgs, FilterResult
from scheduler.groups.keys import hold_key, split_hold_key
from scheduler.groups.loop import MAX_RETIRED, ReservationBook
from scheduler.groups.plugin import SAMPLED_MIN, GroupVerbs

A, B = "llm/a/0", "llm/b/0"
ONE = [node("n1", gpus=8, reconfigurable=False)]
TWO = [node("n1", reconfigurable=False), node("n2", reconfigurable=False)]
THREE = [node(f"n{i}", reconfigurable=False) for i in (1, 2, 3)]


def claim(r: Any, pod: dict[str, Any], node_name: str) -> Any:
    """reserve as the app's bind does it: the member is assumed, its Binding in
    flight."""
    req = r.cache.pending_pod(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
    assert req is not None
    p = GroupVerbs(r.book).reserve(req, req.uid, node_name)
    assert p is not None and not isinstance(p, Status), p
    return p


def filter_member(r: Any, pod: dict[str, Any], names: list[str]) -> FilterResult:
    got = GroupVerbs(r.book).filter(ExtenderArgs.decode(filter_args(pod, names)))
    assert got is not None
    return got


# ---- 1. complete only once the watch confirms every bind -------------------------------------


def test_a_group_is_not_complete_while_its_last_bind_is_in_flight() -> None:
    """The last member's Binding was in flight (assumed only) when the book stepped: the
    group was released as complete, and when the Binding then failed, its room was not
    held again (no record named the pod) and a filler took it: a half-placed group."""
    w0, w1 = lws_pod("a", 0, 2, 4), lws_pod("a", 1, 2, 4)
    r = rig(ONE, [w0, w1])
    rec = r.book.reservations[A]
    p0 = claim(r, w0, rec.slots[0].node)
    r.tap.upsert_pod(bound(w0, "n1", placement_annotations(p0, "gpupack")))
    r.sync()
    claim(r, w1, rec.slots[1].node)
    r.sync()
    assert A in r.book.reservations  # every member bound, one bind not confirmed yet
    assert r.book.released["complete"] == 0
    r.book.forget("llm/a-0-1")  # the Binding failed
    assert r.held(A) == [1]
    filler = pod_request(whole_pod("filler", 4, namespace="x"))
    assert r.cache.state.options(filler, "n1") == []


def test_a_group_is_complete_once_the_watch_shows_the_last_bind() -> None:
    w0, w1 = lws_pod("a", 0, 2, 4), lws_pod("a", 1, 2, 4)
    r = rig(ONE, [w0, w1], ttl=100)
    rec = r.book.reservations[A]
    p0 = claim(r, w0, rec.slots[0].node)
    p1 = claim(r, w1, rec.slots[1].node)
    r.clock.advance(200)  # past the TTL: a bind in flight keeps it anyway
    r.sync()
    assert A in r.book.reservations
    r.tap.upsert_pod(bound(w0, "n1", placement_annotations(p0, "gpupack")))
    r.tap.upsert_pod(bound(w1, "n1", placement_annotations(p1, "gpupack")))
    r.sync()
    assert A not in r.book.reservations
    assert r.book.released["complete"] == 1 and r.book.released["expired"] == 0


# ---- 2. a clock step back --------------------------------------------------------------------


def test_a_reservation_does_not_outlive_the_ttl_after_the_clock_steps_back() -> None:
    r = rig(TWO, [lws_pod("a", 0, 2, 8)], ttl=100)
    assert A in r.book.reservations
    r.clock.now -= 3600  # an NTP step back by an hour
    r.sync()
    r.clock.advance(101)  # more than the TTL since the reservation, by any clock
    r.sync()
    assert A not in r.book.reservations
    assert r.book.released["expired"] == 1


def test_a_waiting_group_is_not_stalled_by_a_clock_step_back() -> None:
    r = rig(TWO, [lws_pod("a", 0, 2, 8), lws_pod("b", 0, 2, 8)], ttl=100)
    assert set(r.book.reservations) == {A} and B in r.book.waiting
    r.clock.now -= 3600
    r.tap.delete_pod("llm/a-0")  # A's room is free
    r.clock.advance(5)
    r.sync()
    assert B in r.book.reservations


def test_a_clock_step_back_keeps_the_time_left() -> None:
    """Deadlines move back by the step: what was left of the TTL is left, no more."""
    r = rig(TWO, [lws_pod("a", 0, 2, 8)], ttl=100)
    r.clock.advance(40)
    r.sync()
    r.clock.now -= 1000
    r.sync()
    assert r.book.reservations[A].expires == r.clock.now + 60


# ---- 3. writes dropped during a lapse of the lease -------------------------------------------


def leader_rig(pods: list[dict[str, Any]]) -> tuple[ReservationBook, Any, RecordWriter,
                                                    StaticRecordStore, list[bool]]:
    """A book whose records go through a RecordWriter into a store that echoes them."""
    leading = [True]

    def is_leader() -> bool:
        return leading[0]

    store = StaticRecordStore()
    writer = RecordWriter(store, is_leader=is_leader, sleep=lambda s: None)
    cache = ClusterCache("gpupack")
    book = ReservationBook(cache, ttl=100, clock=FakeClock(), writer=writer, retry_s=0.0,
                           is_leader=is_leader)
    tap = ReservationTap(cache, book)
    store.start(tap)
    tap.replace(TWO, pods)
    tap.mark_synced()
    book.step()
    return book, tap, writer, store, leading


def test_a_record_dropped_during_a_lapse_of_the_lease_is_written_when_leading_again() -> None:
    book, _, writer, store, leading = leader_rig([lws_pod("a", 0, 2, 8)])
    assert A in book.reservations
    leading[0] = False  # the renewal lapses while the writer drains
    writer.drain()
    assert writer.dropped == 1 and record_name(A) not in store.objects
    leading[0] = True  # the same replica leads again; no step saw it lose the lease
    book.step()
    writer.drain()
    assert record_name(A) in store.objects


def test_a_delete_dropped_during_a_lapse_of_the_lease_is_sent_again() -> None:
    book, tap, writer, store, leading = leader_rig([lws_pod("a", 0, 2, 8)])
    writer.drain()
    assert record_name(A) in store.objects
    tap.delete_pod("llm/a-0")  # its leader deleted: released
    book.step()
    assert A not in book.reservations
    leading[0] = False
    writer.drain()  # the delete is dropped
    leading[0] = True
    book.step()
    writer.drain()
    assert record_name(A) not in store.objects


# ---- 4. rooms on nodes kube-scheduler rules out ----------------------------------------------


def test_a_room_on_a_node_kube_scheduler_rules_out_is_placed_again_elsewhere() -> None:
    w1 = lws_pod("a", 1, 2, 8)
    r = rig(THREE, [lws_pod("a", 0, 2, 8), w1], ttl=100)
    rec = r.book.reservations[A]
    bad = rec.slots[1].node
    offered = [n for n in ("n1", "n2", "n3") if n != bad]
    assert filter_member(r, w1, offered).node_names == ()  # refused: its room is on `bad`
    r.clock.advance(1)
    r.sync()
    moved = r.book.reservations[A]
    assert moved.slots[1].node not in (bad, moved.slots[0].node)
    assert moved.slots[0] == rec.slots[0]  # the other room stays
    assert r.held(A) == [0, 1]
    assert any(k == "llm/a-0-1" for k, _ in r.requeue.writes)  # woken for its new room
    assert filter_member(r, w1, offered).node_names == (moved.slots[1].node,)


def test_a_node_that_changed_a_moment_ago_is_not_ruled_out() -> None:
    # kube-scheduler's view may still hold a pod that just left the room's node (one
    # evicted to free it): a miss then is a lag, not a rule. The room stays.
    w1 = lws_pod("a", 1, 2, 8)
    r = rig(THREE, [lws_pod("a", 0, 2, 8), w1], ttl=100, view_settle_s=10.0)
    rec = r.book.reservations[A]
    bad = rec.slots[1].node
    assert r.cache.quiet_s(bad) < 10.0
    offered = [n for n in ("n1", "n2", "n3") if n != bad]
    assert filter_member(r, w1, offered).node_names == ()  # refused, as before
    r.clock.advance(1)
    r.sync()
    assert r.book.reservations[A].slots[1].node == bad


def test_a_group_stays_off_a_ruled_out_node_for_a_while_then_may_use_it_again() -> None:
    w1 = lws_pod("a", 1, 2, 8)
    r = rig(TWO, [lws_pod("a", 0, 2, 8), w1], ttl=100)
    bad = r.book.reservations[A].slots[1].node
    filter_member(r, w1, [n for n in ("n1", "n2") if n != bad])
    r.clock.advance(1)
    r.sync()
    assert A not in r.book.reservations  # no other room: released, waits whole
    assert r.held(A) == [] and A in r.book.waiting
    r.clock.advance(60)
    r.sync()
    assert A not in r.book.reservations  # still off `bad`
    r.clock.advance(r.book.ruled_out_s)
    r.sync()
    assert A in r.book.reservations  # remembered for a bounded time only


def test_a_sampled_candidate_list_or_a_nominated_try_rules_nothing_out() -> None:
    """A list of SAMPLED_MIN names or more may be kube-scheduler's sample; a nominated
    pod's first try offers its nominated node alone: neither says the room's node is
    ruled out."""
    w1 = lws_pod("a", 1, 2, 8)
    r = rig(THREE, [lws_pod("a", 0, 2, 8), w1])
    rec = r.book.reservations[A]
    bad = rec.slots[1].node
    others = [n for n in ("n1", "n2", "n3") if n != bad]
    sampled = others + [f"x{i}" for i in range(SAMPLED_MIN)]
    filter_member(r, w1, sampled)
    nominated = dict(w1, status={"nominatedNodeName": others[0]})
    filter_member(r, nominated, others[:1])
    r.clock.advance(1)
    r.sync()
    assert r.book.reservations[A].slots == rec.slots


def test_a_node_offered_again_is_not_ruled_out_any_more() -> None:
    w1 = lws_pod("a", 1, 2, 8)
    r = rig(THREE, [lws_pod("a", 0, 2, 8), w1])
    rec = r.book.reservations[A]
    bad = rec.slots[1].node
    filter_member(r, w1, [n for n in ("n1", "n2", "n3") if n != bad])
    r.sync()
    new = r.book.reservations[A].slots[1].node
    assert filter_member(r, w1, ["n1", "n2", "n3"]).node_names == (new,)  # `bad` offered
    # The new room is taken by a pod bound there: placed again, `bad` allowed again.
    intruder = whole_pod("intruder", 8, namespace="x")
    r.tap.upsert_pod(bound(intruder, new, placement_annotations(
        Placement("x/intruder", new, tuple(range(8))), "gpupack")))
    r.sync()
    assert r.book.reservations[A].slots[1].node == bad


# ---- 5. revision maps ------------------------------------------------------------------------


def test_revisions_of_groups_that_went_are_not_kept_for_ever() -> None:
    r = rig(TWO, [])
    for i in range(30):
        r.tap.upsert_pod(lws_pod(f"job{i}", 0, 2, 8))
        r.sync()
        assert f"llm/job{i}/0" in r.book.reservations
        r.tap.delete_pod(f"llm/job{i}-0")
        r.sync()
    assert r.book._revs == {} and r.book._own_revs == {}
    assert len(r.book._retired) == 30 <= MAX_RETIRED


def test_a_retired_group_still_ignores_a_late_echo_and_comes_back_above_it() -> None:
    r = rig(TWO, [lws_pod("a", 0, 2, 8)])
    written = r.writer.last(A)
    r.tap.delete_pod("llm/a-0")
    r.sync()
    assert A not in r.book._revs and A not in r.book._own_revs
    r.tap.upsert_record(written)  # the late echo of the first write
    assert A not in r.book.reservations
    r.tap.upsert_pod(lws_pod("a", 0, 2, 8))  # the group is created again
    r.sync()
    assert r.book.reservations[A].rev > record_of(written).rev


# ---- 7. group names that contain the hold-key mark -------------------------------------------


def plain(name: str, group: str, size: int) -> dict[str, Any]:
    return whole_pod(name, 8, namespace="llm",
                     annotations={"gpupack.io/group": group, "gpupack.io/group-size": str(size)})


def test_split_hold_key_takes_the_group_before_the_last_mark() -> None:
    assert split_hold_key(hold_key("llm/x#reserve-1", 0)) == ("llm/x#reserve-1", 0)
    assert split_hold_key(hold_key("llm/x", 12)) == ("llm/x", 12)
    assert split_hold_key("llm/x") is None
    assert split_hold_key("llm/x#reserve-01") is None


def test_releasing_a_group_leaves_the_holds_of_a_group_named_after_its_hold_keys() -> None:
    """Group "llm/x" released: its scratch release used to take the holds of group
    "llm/x#reserve-1" too (a prefix match), and a group waiting behind them was reserved
    on GPUs that group still held."""
    x, y = "llm/x", "llm/x#reserve-1"
    r = rig(TWO, [plain("y-0", "x#reserve-1", 1)])  # first seen first: its record goes first
    r.clock.advance(1)
    for p in (plain("x-0", "x", 1), plain("z-0", "z", 2), plain("z-1", "z", 2)):
        r.tap.upsert_pod(p)
    r.sync()
    assert set(r.book.reservations) == {x, y} and "llm/z" in r.book.waiting
    r.tap.delete_pod("llm/x-0")  # x released: one node free, z needs two
    r.sync()
    assert "llm/z" not in r.book.reservations
    assert r.held(y) == [0] and r.held(x) == []
