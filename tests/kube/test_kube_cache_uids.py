"""kube.cache: an assumption belongs to one incarnation of a pod, its UID, as
kube-scheduler keys assumed pods (kube.assumptions). Events of another incarnation of
the same name, a failed bind of another, and node events leave it; only its own pod's
events and its own bind's outcome end it. A counted pod that goes because its name now
has another UID goes as a deleted one does, its "pod gone" hooks called."""

from __future__ import annotations

import sys
from collections.abc import Callable
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "scheduler"))
from sched_builders import make_cache, node, whole_pod
from test_groups_builders import bound, lws_pod, rig
from test_scheduler_cache_bound import consistent, replays

from kube.annotations import placement_annotations
from kube.assumptions import AssumeError
from kube.cache import ClusterCache
from kube.objects import pod_request
from packing.model import Placement
from packing.status import Status
from scheduler.groups.plugin import GroupVerbs

KEY = "x/a"


def a_pod(uid: str, **kw: Any) -> dict[str, Any]:
    """Pod x/a, one whole GPU, incarnation ``uid``."""
    return whole_pod("a", 1, namespace="x", uid=uid, **kw)


def one_gpu(pods: list[dict[str, Any]] | None = None) -> ClusterCache:
    return make_cache([node("n1", gpus=1, reconfigurable=False)], pods or [])


def assume_a(cache: ClusterCache, uid: str) -> None:
    """The bind of x/a (``uid``) to n1's GPU 0, in flight."""
    cache.assume(pod_request(a_pod(uid)), uid, Placement(KEY, "n1", (0,)))


def gpu_taken(cache: ClusterCache) -> bool:
    """Whether another pod is refused n1's GPU 0."""
    other = whole_pod("b", 1, namespace="x", uid="uid-b")
    cache.upsert_pod(other)
    try:
        cache.assume(pod_request(other), "uid-b", Placement("x/b", "n1", (0,)))
    except AssumeError:
        return True
    cache.forget("x/b")
    cache.delete_pod("x/b")
    return False


def pending(cache: ClusterCache) -> bool:
    """Whether x/a waits for a bind (among what the planner places)."""
    return KEY in {p.key for p in cache.pending()}


Events = Callable[[ClusterCache], object]


def shows(*objs: dict[str, Any]) -> Events:
    """The watch shows these Pod objects, in order."""
    def run(cache: ClusterCache) -> None:
        for obj in objs:
            cache.upsert_pod(obj)
    return run


def then(*steps: Events) -> Events:
    def run(cache: ClusterCache) -> None:
        for step in steps:
            step(cache)
    return run


def deleted(cache: ClusterCache) -> None:
    """The watch's DELETED of x/a."""
    cache.delete_pod(KEY)


def listed_without(cache: ClusterCache) -> None:
    """A list (after 410 Gone) without x/a."""
    cache.replace(None, [])


# (what the watch shows after the bind of x/a (uid-2) was assumed from a request pod,
#  whether the assumption is still in force)
NEW_INCARNATION_EVENTS: list[tuple[str, Events, bool]] = [
    ("stale ADDED of the old pod", shows(a_pod("uid-1")), True),
    ("stale ADDED of the old pod, bound to n1",
     shows(a_pod("uid-1", node="n1", scheduler="x")), True),
    ("stale ADDED of the old pod, finished",
     shows(a_pod("uid-1", node="n1", phase="Succeeded")), True),
    ("stale ADDED then DELETED of the old pod", then(shows(a_pod("uid-1")), deleted), True),
    ("stale ADDED of the old pod, then a list without x/a",
     then(shows(a_pod("uid-1")), listed_without), True),
    ("stale ADDED of the old pod, then the new one's",
     shows(a_pod("uid-1"), a_pod("uid-2")), True),
    ("its own ADDED, pending", shows(a_pod("uid-2")), True),
    ("its own ADDED then DELETED", then(shows(a_pod("uid-2")), deleted), False),
    ("its own DELETED with nothing shown before", deleted, False),
    ("its own pod bound elsewhere", shows(a_pod("uid-2", node="n2", scheduler="x")), False),
]


@pytest.mark.parametrize(("events", "assumed"), [(e, a) for _, e, a in NEW_INCARNATION_EVENTS],
                         ids=[n for n, _, _ in NEW_INCARNATION_EVENTS])
def test_only_its_own_pods_events_end_an_assumption(events: Events, assumed: bool) -> None:
    cache = one_gpu()
    assume_a(cache, "uid-2")
    events(cache)
    assert cache.is_assumed(KEY) == assumed
    assert gpu_taken(cache) == assumed
    consistent(cache)
    replays(cache)


def test_its_own_bound_pod_confirms_it_and_another_incarnations_does_not() -> None:
    cache = one_gpu()
    assume_a(cache, "uid-2")
    cache.upsert_pod(a_pod("uid-1", node="n1", scheduler="x", annotations={
        "gpupack.io/gpus": "0"}))
    assert cache.is_assumed(KEY)  # not confirmed by the old pod bound to the same node
    cache.delete_pod(KEY)  # the old pod's DELETED: the count is still the assumption's
    cache.upsert_pod(a_pod("uid-2", node="n1", annotations={"gpupack.io/gpus": "0"}))
    assert not cache.is_assumed(KEY) and cache.counted(KEY) is not None
    assert gpu_taken(cache)
    consistent(cache)


# (the incarnation the watch showed when the bind was assumed, what shows next,
#  whether the assumption is still in force)
LISTED_AGAIN = [
    # A list (after 410 Gone) shows another UID in its place: the old pod was deleted,
    # and with it the bind assumed for it (its Binding fails on the UID precondition).
    ("uid-1", a_pod("uid-2"), False),
    # The same pod, its object changed: still its bind.
    ("uid-1", a_pod("uid-1", memory="2Gi"), True),
]


@pytest.mark.parametrize(("uid", "shown", "assumed"), LISTED_AGAIN)
def test_a_list_showing_another_uid_ends_the_old_pods_assumption(
    uid: str, shown: dict[str, Any], assumed: bool
) -> None:
    cache = one_gpu([a_pod(uid)])
    assume_a(cache, uid)
    cache.upsert_pod(shown)
    assert cache.is_assumed(KEY) == assumed and gpu_taken(cache) == assumed
    consistent(cache)


# (the UID forget names, whether the assumption made for uid-2 is still in force)
FORGET_CASES = [
    ("uid-1", True),  # the failed bind of the old pod: not this assumption's
    ("uid-2", False),
    (None, False),  # no UID given: whichever assumption the name has (the old call)
]


@pytest.mark.parametrize(("uid", "assumed"), FORGET_CASES)
def test_forget_drops_only_the_assumption_of_the_uid_it_names(
    uid: str | None, assumed: bool
) -> None:
    cache = one_gpu([a_pod("uid-2")])
    assume_a(cache, "uid-2")
    cache.forget(KEY, uid)
    assert cache.is_assumed(KEY) == assumed and gpu_taken(cache) == assumed
    assert pending(cache) != assumed
    consistent(cache)


def test_is_assumed_with_a_uid_names_the_incarnation() -> None:
    cache = one_gpu()
    assume_a(cache, "uid-2")
    assert cache.is_assumed(KEY) and cache.is_assumed(KEY, "uid-2")
    assert not cache.is_assumed(KEY, "uid-1") and not cache.is_assumed("x/other", "uid-2")


# ---- node events leave assumptions (kube-scheduler keeps a removed node's assumed pods) ---


def test_an_assumption_survives_its_node_deleted_and_added_again() -> None:
    n1 = node("n1", gpus=1, reconfigurable=False)
    cache = make_cache([n1], [a_pod("uid-1")])
    assume_a(cache, "uid-1")
    cache.delete_node("n1")
    assert cache.is_assumed(KEY) and not pending(cache)
    assert cache.counted(KEY) is None  # nowhere to count it while the node is gone
    consistent(cache)
    cache.upsert_node(n1)
    assert cache.is_assumed(KEY) and cache.counted(KEY) == (
        pod_request(a_pod("uid-1")), Placement(KEY, "n1", (0,)))
    assert gpu_taken(cache)
    consistent(cache)
    replays(cache)


def test_a_relist_without_the_node_keeps_the_assumption() -> None:
    n1 = node("n1", gpus=1, reconfigurable=False)
    cache = make_cache([n1], [a_pod("uid-1")])
    assume_a(cache, "uid-1")
    cache.replace([], None)
    cache.replace([n1], None)
    assert cache.is_assumed(KEY) and gpu_taken(cache)
    consistent(cache)


# (what ends the bind while n1 is gone, whether x/a is pending after n1 is back)
WHILE_GONE: list[tuple[str, Events, bool]] = [
    ("the bind fails", lambda c: c.forget(KEY, "uid-1"), True),
    ("the bind is confirmed",
     shows(a_pod("uid-1", node="n1", annotations={"gpupack.io/gpus": "0"})), False),
]


@pytest.mark.parametrize(("ends", "waits"), [(e, p) for _, e, p in WHILE_GONE],
                         ids=[n for n, _, _ in WHILE_GONE])
def test_an_assumption_on_a_deleted_node_ends_with_its_bind(ends: Events, waits: bool
                                                            ) -> None:
    n1 = node("n1", gpus=1, reconfigurable=False)
    cache = make_cache([n1], [a_pod("uid-1")])
    assume_a(cache, "uid-1")
    cache.delete_node("n1")
    ends(cache)
    assert not cache.is_assumed(KEY)
    assert pending(cache) == waits
    cache.upsert_node(n1)
    assert (cache.counted(KEY) is None) == waits  # bound: counted once the node is back
    consistent(cache)
    replays(cache)


def test_an_assumption_whose_gpu_is_gone_stays_counted_without_gpus() -> None:
    a = whole_pod("a", 1, namespace="x", uid="uid-1", cpu="60")
    cache = make_cache([node("n1", gpus=2, reconfigurable=False)], [a])
    cache.assume(pod_request(a), "uid-1", Placement(KEY, "n1", (1,)))
    cache.upsert_node(node("n1", gpus=1, reconfigurable=False))  # GPU 1 is gone
    assert cache.is_assumed(KEY) and cache.counted(KEY) == (
        pod_request(a), Placement(KEY, "n1"))
    assert cache.state.nodes["n1"].cpu_free == 4_000  # its 60 CPUs stay taken
    consistent(cache)
    replays(cache)
    cache.forget(KEY, "uid-1")  # the bind failed after all: pending, its CPUs free
    assert pending(cache) and cache.state.nodes["n1"].cpu_free == 64_000
    consistent(cache)


# ---- a counted pod gone because its name has another UID: the "pod gone" hooks ----------

# (the pod counted before, what the watch or a list shows next, hook calls expected)
GONE_CASES = [
    (a_pod("uid-1", node="n1"), a_pod("uid-2"), [KEY]),  # recreated, pending
    (a_pod("uid-1", node="n1"), a_pod("uid-2", node="n1"), [KEY]),  # recreated, bound
    (a_pod("uid-1", node="n1"), a_pod("uid-1", node="n1", memory="2Gi"), []),  # updated
    (a_pod("uid-1"), a_pod("uid-2"), []),  # never counted
]


@pytest.mark.parametrize(("before", "after", "calls"), GONE_CASES)
def test_a_counted_pod_replaced_by_another_uid_calls_the_gone_hooks(
    before: dict[str, Any], after: dict[str, Any], calls: list[str]
) -> None:
    cache = one_gpu([before])
    seen: list[tuple[str, str | None]] = []

    def gone(key: str) -> None:
        entry = cache.pod_entry(key)
        seen.append((key, None if entry is None else entry.uid))

    cache.on_pod_gone(gone)
    assert cache.upsert_pod(after)
    # Called once the new pod is in place: the hook sees what the next answer sees.
    assert seen == [(k, after["metadata"]["uid"]) for k in calls]
    consistent(cache)


def test_a_recreated_group_member_has_its_room_held_again_at_once() -> None:
    """A bound member listed again under a new UID (a relist after 410 Gone: no DELETED)
    gets its room held again before any other pod is answered, as a deleted one does."""
    r = rig([node("n1", gpus=8, reconfigurable=False)],
            [lws_pod("a", 0, 2, 4), lws_pod("a", 1, 2, 4)])
    member = lws_pod("a", 1, 2, 4)
    req = r.cache.pending_pod("llm/a-0-1")
    assert req is not None
    placed = GroupVerbs(r.book).reserve(req, req.uid, "n1")
    assert isinstance(placed, Placement) and not isinstance(placed, Status)
    r.tap.upsert_pod(bound(member, "n1", placement_annotations(placed, "gpupack")))
    r.sync()
    assert r.held("llm/a/0") == [0]
    again = deepcopy(member)
    again["metadata"]["uid"] = "uid-new"
    r.tap.upsert_pod(again)  # no step of the keeper after it
    assert r.held("llm/a/0") == [0, 1]
    filler = pod_request(whole_pod("filler", 4, namespace="x"))
    assert r.cache.state.options(filler, "n1") == []
