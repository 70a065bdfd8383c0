"""scheduler.extender.points: a failed Binding frees its own claim only (not the assumption of a
pod recreated under the same name since), and a refused filter remembers a bounded
number of candidate names (scheduler.extender.refusals)."""

from __future__ import annotations

from typing import Any

import pytest
from sched_builders import FakeClock, filter_args, whole_pod
from test_scheduler_points import points

from kube.source import BindError
from scheduler.extender.points import BindClaim
from scheduler.extender.refusals import UNKNOWN_KEPT, RecentRefusals, remembered
from scheduler.extender.wire import BindingArgs, BindingResult, ExtenderArgs


class UidBinder:
    """The API server: refuses the Binding of a deleted pod (its UID is not the name's)."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error
        self.deleted: set[str] = set()

    def bind(self, namespace: str, name: str, uid: str, node_name: str, annotations: Any,
             pod: Any = None) -> None:
        if uid in self.deleted:
            raise self.error(f"Precondition failed: UID in precondition: {uid}")


def bind_args(name: str, uid: str) -> BindingArgs:
    return BindingArgs.decode({"PodName": name, "PodNamespace": "x", "PodUID": uid,
                               "Node": "n1"})


@pytest.mark.parametrize("error", [BindError, RuntimeError])
def test_a_failed_bind_of_a_deleted_pod_keeps_the_recreated_pods_claim(
    error: type[Exception]
) -> None:
    binder = UidBinder(error)
    p = points([whole_pod("a", 1, namespace="x", uid="uid-1")], binder, gpus=1)
    old = p.claim(bind_args("a", "uid-1"))
    assert isinstance(old, BindClaim)
    # While its Binding is in flight the pod is deleted and recreated (a StatefulSet
    # pod: same name), and kube-scheduler binds the new one.
    binder.deleted.add("uid-1")
    p.cache.delete_pod("x/a")
    p.cache.upsert_pod(whole_pod("a", 1, namespace="x", uid="uid-2"))
    new = p.claim(bind_args("a", "uid-2"))
    assert isinstance(new, BindClaim) and p.cache.is_assumed("x/a")
    assert p.write(bind_args("a", "uid-1"), old).error  # the UID precondition
    assert p.cache.is_assumed("x/a")  # the new pod's claim
    assert p.write(bind_args("a", "uid-2"), new) == BindingResult()
    # The watch has not shown x/a (uid-2) bound yet: its GPU is still not free.
    p.cache.upsert_pod(whole_pod("b", 1, namespace="x", uid="uid-b"))
    refused = p.claim(bind_args("b", "uid-b"))
    assert isinstance(refused, BindingResult) and refused.error


def test_a_failed_bind_frees_its_own_claim() -> None:
    binder = UidBinder(BindError)
    binder.deleted.add("uid-1")
    p = points([whole_pod("a", 1, namespace="x", uid="uid-1")], binder, gpus=1)
    claim = p.claim(bind_args("a", "uid-1"))
    assert isinstance(claim, BindClaim)
    assert p.write(bind_args("a", "uid-1"), claim).error
    assert not p.cache.is_assumed("x/a")
    assert "x/a" in {r.key for r in p.cache.pending()}


# ---- refused filters remember what the cache knows, and a few more --------------------


# (candidates, known, kept)
REMEMBERED_CASES = [
    (["n1", "n2"], {"n1", "n2"}, ["n1", "n2"]),
    (["n1", "ghost"], {"n1"}, ["n1", "ghost"]),  # a node the watch has not shown yet
    (["g0", "n1", "g1", "g2"], {"n1"}, ["g0", "n1", "g1"]),  # two unknown kept, at most
    (["n1"] * 3, {"n1"}, ["n1"] * 3),
    ([], set(), []),
]


@pytest.mark.parametrize(("candidates", "known", "kept"), REMEMBERED_CASES)
def test_remembered_keeps_known_names_and_a_bounded_few_others(
    candidates: list[str], known: set[str], kept: list[str]
) -> None:
    assert remembered(candidates, known.__contains__, unknown_kept=2) == kept


def test_a_refused_filter_naming_many_unknown_nodes_remembers_a_bounded_set() -> None:
    clock = FakeClock()
    refusals = RecentRefusals(clock)
    p = points([], gpus=1, unschedulable=True, refusals=refusals, clock=clock)
    names = ["n1"] + [f"ghost{i}" for i in range(10_000)]
    args = ExtenderArgs.decode(filter_args(whole_pod("a", 1, uid="u"), names))
    assert p.filter(args).error  # within the view-lag grace: "the view is behind"
    clock.advance(60)
    got = p.filter(args)  # after it: a refusal, remembered
    assert not got.error and not got.node_names
    assert refusals.stale("ghost9999") == []  # past the bound: not kept
    assert refusals.stale("n1") == ["default/a"]  # the node the cache knows: kept
    p.filter(args)
    assert refusals.stale(f"ghost{UNKNOWN_KEPT - 1}") == ["default/a"]
