"""The cluster cache: incremental accounting, assume/confirm/forget (no expiry), concurrency,
and a stateful Hypothesis test against a simple model."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from sched_builders import FakeClock, make_cache, mig_pod, node, pod, whole_pod

from kube.assumptions import AssumeError
from packing.model import Placement
from packing.validate import validate
from scheduler.extender.metrics import GpuRows, node_rows


def bound(p: dict[str, Any], node_name: str, placement: Placement | None = None) -> dict[str, Any]:
    """The pod as the watch shows it once bound (with gpupack's annotations if given)."""
    out = {**p, "spec": {**p["spec"], "nodeName": node_name}, "status": {"phase": "Running"}}
    if placement is not None:
        ann = {"gpupack.io/gpus": ",".join(map(str, placement.gpus))}
        if placement.mig_profile:
            ann["gpupack.io/mig"] = f"{placement.mig_profile}@{placement.mig_start}"
        out["metadata"] = {**p["metadata"], "annotations": ann}
    return out


def test_assume_counts_at_once_then_confirmation_keeps_it() -> None:
    clock = FakeClock()
    p = whole_pod("llm", 2)
    cache = make_cache([node("w", gpus=2, reconfigurable=False)], [p], clock)
    req = cache.pending_pod("default/llm")
    placement = Placement(req.key, "w", (0, 1))
    cache.assume(req, req.uid, placement)
    assert cache.state.whole_gpus_free() == 0
    assert cache.pending() == []
    cache.upsert_pod(bound(p, "w", placement))
    assert cache.assumed_keys() == []
    clock.advance(100)
    assert cache.assumed_keys() == []
    assert cache.state.whole_gpus_free() == 0


def test_an_assumption_never_expires_however_long_the_watch_stalls() -> None:
    # kube-scheduler dropped its assume expiry for this reason: with the pod watch
    # stalled, an expired assumption frees GPUs the bound pod really holds, and the next
    # bind puts a second pod on them.
    clock = FakeClock()
    cache = make_cache([node("w", gpus=2, reconfigurable=False)],
                       [whole_pod("llm", 2), whole_pod("next", 2)], clock)
    req = cache.pending_pod("default/llm")
    cache.assume(req, req.uid, Placement(req.key, "w", (0, 1)))
    clock.advance(3600)
    with cache.view():
        assert cache.state.whole_gpus_free() == 0
    snap = cache.snapshot()
    assert [p.key for p in snap.pending] == ["default/next"]
    assert cache.assumed_keys() == ["default/llm"]
    nxt = cache.pending_pod("default/next")
    with pytest.raises(AssumeError):
        cache.assume(nxt, nxt.uid, Placement(nxt.key, "w", (0, 1)))


def test_an_assumption_ends_when_the_pod_is_deleted_or_bound_elsewhere() -> None:
    cache = make_cache([node("w", gpus=2, reconfigurable=False), node("v", gpus=2,
                        reconfigurable=False)], [whole_pod("a", 2), whole_pod("b", 2)])
    a = cache.pending_pod("default/a")
    b = cache.pending_pod("default/b")
    cache.assume(a, a.uid, Placement(a.key, "w", (0, 1)))
    cache.assume(b, b.uid, Placement(b.key, "v", (0, 1)))
    cache.delete_pod("default/a")
    cache.upsert_pod(bound(whole_pod("b", 2), "w"))  # someone else bound it elsewhere
    assert cache.assumed_keys() == []
    assert cache.state.nodes["v"].whole_free


def test_forget_frees_and_double_assume_is_refused() -> None:
    cache = make_cache([node("w", gpus=2, reconfigurable=False)],
                       [whole_pod("a", 1), whole_pod("b", 1)])
    a = cache.pending_pod("default/a")
    b = cache.pending_pod("default/b")
    cache.assume(a, a.uid, Placement(a.key, "w", (0,)))
    with pytest.raises(AssumeError, match="already being bound"):
        cache.assume(a, a.uid, Placement(a.key, "w", (1,)))
    with pytest.raises(AssumeError, match="GPU 0 of w is in use"):
        cache.assume(b, b.uid, Placement(b.key, "w", (0,)))
    cache.forget(a.key)
    cache.assume(b, b.uid, Placement(b.key, "w", (0,)))
    assert [p.key for p in cache.pending()] == ["default/a"]


def test_racing_assumptions_never_share_a_gpu() -> None:
    pods = [whole_pod(f"p{i}", 1) for i in range(16)]
    cache = make_cache([node("w", gpus=4, reconfigurable=False)], pods)
    won: list[str] = []
    barrier = threading.Barrier(16)

    def race(i: int) -> None:
        req = cache.pending_pod(f"default/p{i}")
        barrier.wait()
        for gpu in range(4):
            try:
                cache.assume(req, req.uid, Placement(req.key, "w", (gpu,)))
            except AssumeError:
                continue
            won.append(req.key)
            return

    threads = [threading.Thread(target=race, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 4
    assert validate(cache.snapshot(), ()) == []


def test_node_updates_rebuild_only_on_change_and_keep_pods() -> None:
    n = node("w", gpus=4, reconfigurable=False)
    cache = make_cache([n, node("other", gpus=1)], [whole_pod("a", 2, node="w")])
    gen_other = cache.gen("other")
    gen = cache.gen("w")
    cache.upsert_node({**n, "metadata": {**n["metadata"], "resourceVersion": "2"}})
    assert cache.gen("w") == gen  # nothing the packer sees changed
    cache.upsert_node(node("w", gpus=4, cpu="32", reconfigurable=False))
    assert cache.gen("w") != gen and cache.gen("other") == gen_other
    assert cache.state.nodes["w"].cpu_free == 31_000
    assert sum(1 for g in cache.state.nodes["w"].gpus if g.whole_owner) == 2


def test_pod_seen_before_its_node_is_counted_when_the_node_comes() -> None:
    cache = make_cache([], [whole_pod("a", 1, node="late")])
    assert cache.counted("default/a") is None
    cache.upsert_node(node("late", gpus=2, reconfigurable=False))
    assert cache.counted("default/a") is not None
    assert cache.state.whole_gpus_free() == 1
    cache.delete_node("late")
    cache.upsert_node(node("late", gpus=2, reconfigurable=False))
    assert cache.state.whole_gpus_free() == 1


def test_bad_objects_are_skipped_and_counted() -> None:
    cache = make_cache([node("w", gpus=1)], [])
    assert not cache.upsert_pod(pod("bad", {"nvidia.com/gpu": "lots"}))
    assert not cache.upsert_node({"metadata": {}})
    assert cache.bad_objects == 2
    assert cache.counts()["pods"] == 0


def test_relist_deletes_what_is_gone_and_keeps_assumptions() -> None:
    p, q = whole_pod("a", 1), whole_pod("b", 1, node="w")
    cache = make_cache([node("w", gpus=2, reconfigurable=False)], [p, q])
    a = cache.pending_pod("default/a")
    cache.assume(a, a.uid, Placement(a.key, "w", (1,)))
    cache.replace([node("w", gpus=2, reconfigurable=False)], [p])
    assert cache.counted("default/b") is None
    assert cache.assumed_keys() == ["default/a"]
    assert cache.state.whole_gpus_free() == 1


def test_finished_and_recreated_pods_free_their_gpus() -> None:
    cache = make_cache([node("w", gpus=1, reconfigurable=False)], [whole_pod("a", 1, node="w")])
    assert cache.state.whole_gpus_free() == 0
    cache.upsert_pod(whole_pod("a", 1, node="w", phase="Succeeded"))
    assert cache.state.whole_gpus_free() == 1
    cache.upsert_pod(whole_pod("a", 1, uid="new-uid"))
    assert [p.uid for p in cache.pending()] == ["new-uid"]


# ---- stateful --------------------------------------------------------------------------------

PODS = 6


def _pod_obj(i: int) -> dict[str, Any]:
    # Even pods want a whole GPU (node w: 2), odd ones a 3g.40gb slice (node m: 2 fit).
    return whole_pod(f"p{i}", 1) if i % 2 == 0 else mig_pod(f"p{i}", "3g.40gb")


class CacheMachine(RuleBasedStateMachine):
    """Model: which pods exist, which are bound (by the watch) and which are assumed."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.cache = make_cache(
            [node("w", gpus=2, reconfigurable=False), node("m", gpus=1, mig={"3g.40gb": 0})],
            [], self.clock)
        self.rows = GpuRows(self.cache)  # per-GPU metric rows cached per node generation
        self.exists: set[int] = set()
        self.bound: dict[int, str] = {}
        self.assumed: dict[int, Placement] = {}

    def _room(self, i: int) -> bool:
        held = [j for j in (*self.bound, *self.assumed) if j % 2 == i % 2]
        return len(held) < 2

    @rule(i=st.integers(0, PODS - 1))
    def create(self, i: int) -> None:
        if i in self.exists:
            return
        self.cache.upsert_pod(_pod_obj(i))
        self.exists.add(i)

    @rule(i=st.integers(0, PODS - 1))
    def bind(self, i: int) -> None:
        req = self.cache.pending_pod(f"default/p{i}")
        pending = i in self.exists and i not in self.bound and i not in self.assumed
        assert (req is not None) == (i in self.exists and i not in self.bound)
        if req is None:
            return
        node_name = "w" if i % 2 == 0 else "m"
        options = self.cache.state.options(req, node_name)
        if not pending or not options:
            assert not pending or not self._room(i)
            return
        self.cache.assume(req, req.uid, options[0])
        self.assumed[i] = options[0]

    @rule(i=st.integers(0, PODS - 1))
    def watch_confirms(self, i: int) -> None:
        if i not in self.assumed:
            return
        placement = self.assumed.pop(i)
        self.cache.upsert_pod(bound(_pod_obj(i), placement.node, placement))
        self.bound[i] = placement.node

    @rule(i=st.integers(0, PODS - 1))
    def bind_fails(self, i: int) -> None:
        self.cache.forget(f"default/p{i}")
        self.assumed.pop(i, None)

    @rule(i=st.integers(0, PODS - 1))
    def bound_by_someone_else(self, i: int) -> None:
        if i not in self.exists or i in self.bound or i in self.assumed or not self._room(i):
            return
        node_name = "w" if i % 2 == 0 else "m"
        self.cache.upsert_pod(bound(_pod_obj(i), node_name))
        self.bound[i] = node_name

    @rule(i=st.integers(0, PODS - 1))
    def delete(self, i: int) -> None:
        self.cache.delete_pod(f"default/p{i}")
        self.exists.discard(i)
        self.bound.pop(i, None)
        self.assumed.pop(i, None)

    @rule(seconds=st.sampled_from([1.0, 5.0, 11.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: bool(self.exists))
    @rule()
    def relist(self) -> None:
        objs = [bound(_pod_obj(i), self.bound[i]) if i in self.bound else _pod_obj(i)
                for i in sorted(self.exists)]
        # A relist shows pods without the annotations only the binder writes; bound pods
        # keep their accounting because their binding did not change.
        self.cache.replace(None, objs)

    @invariant()
    def matches_model_and_never_overcommits(self) -> None:
        snap = self.cache.snapshot()  # time passing changes nothing: no assume expiry
        assert validate(snap, ()) == []
        counted = {p.key for p, _ in snap.running}
        want = {f"default/p{i}" for i in (*self.bound, *self.assumed)}
        assert counted == want
        pending = {p.key for p in snap.pending}
        assert pending == {f"default/p{i}" for i in self.exists
                           if i not in self.bound and i not in self.assumed}
        assert set(self.cache.assumed_keys()) == {f"default/p{i}" for i in self.assumed}

    @invariant()
    def cached_metric_rows_equal_a_fresh_render(self) -> None:
        got = self.rows.current()
        with self.cache.lock:
            state = self.cache.state
            fresh = [node_rows(name, n, 0) for name, n in state.nodes.items()]
            assert got.whole_gpus == state.whole_gpus_free()
            assert got.whole_nodes == state.whole_nodes_free()
        assert got.text.endswith("".join(r.text for r in fresh))


CacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                          deadline=None)
TestCacheMachine = CacheMachine.TestCase


def test_a_bound_pod_gpupack_would_refuse_is_still_counted_and_a_pending_one_skipped() -> None:
    cache = make_cache([node("w", gpus=8, reconfigurable=False)])
    bound = pod("other", {"nvidia.com/gpu": "2"}, node="w", cpu="8", scheduler="default",
                annotations={"gpupack.io/group": "g", "gpupack.io/group-size": "5000"})
    assert cache.upsert_pod(bound)
    assert cache.state.nodes["w"].cpu_free == 64_000 - 8_000
    assert cache.state.whole_gpus_free() == 6
    pending = pod("big", {"nvidia.com/gpu": "1"},
                  annotations={"gpupack.io/group": "g2", "gpupack.io/group-size": "5000"})
    assert not cache.upsert_pod(pending) and cache.bad_objects == 1


def test_node_taints_reach_the_snapshot_and_follow_updates() -> None:
    """The webhook's capacity scopes read taints from the snapshot's NodeInfos: a taint
    added or lifted by a Node update is in the next snapshot (and in cache.taints)."""
    from packing.model import Taint

    n = node("h0")
    cache = make_cache([n])
    assert cache.snapshot().nodes[0].taints == ()
    n = {**n, "spec": {**n.get("spec", {}), "taints": [
        {"key": "maint", "effect": "NoExecute"}]}}
    cache.upsert_node(n)
    assert cache.snapshot().nodes[0].taints == (Taint("maint", "", "NoExecute"),)
    assert cache.taints("h0") == (Taint("maint", "", "NoExecute"),)
    n = {**n, "spec": {**n["spec"], "taints": []}}
    cache.upsert_node(n)
    assert cache.snapshot().nodes[0].taints == () and cache.taints("h0") == ()
