"""Bound pods that do not fit the cache's view of their node (a pod the device plugin
gave what our view lacks, a recorded placement that disagrees with the request, a node
that shrank under its pods): each is still counted, nothing crashes, and the books of
the cache and of the packing state stay in step."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from sched_builders import L40S, make_cache, mig_pod, node, pod, shared_pod, whole_pod

from packing.model import Placement, RequestKind
from packing.state import ClusterState
from scheduler.extender.verbs import preempt
from scheduler.extender.wire import PreemptionArgs, Victims


def consistent(cache: Any) -> None:
    """Every counted pod is on its node in the packing state, with its CPU taken."""
    for name, n in cache.state.nodes.items():
        counted = {k for k, (_, p) in cache._counted.items() if p.node == name}
        assert set(n.pods) == counted == cache._on_node.get(name, set())
        cpu = sum(cache._counted[k][0].cpu_milli for k in counted)
        assert n.cpu_free == n.info.cpu_milli - cpu
        for g in n.gpus:  # every owner recorded on a GPU is a pod counted there
            owners = {o for _, o in g.instances.values() if o} | set(g.shared_owners)
            if g.whole_owner:
                owners.add(g.whole_owner)
            assert owners <= counted


def replays(cache: Any) -> None:
    """The cache's state equals a replay of its own snapshot (what the planner builds):
    no slice or GPU use lingers that no counted pod explains."""
    def shape(state: ClusterState) -> dict[str, Any]:
        return {name: (n.cpu_free, n.mem_free, dict(n.pods),
                       [(g.whole_owner, dict(g.instances), dict(g.shared_owners), g.converted)
                        for g in n.gpus])
                for name, n in state.nodes.items()}
    assert shape(cache.state) == shape(ClusterState(cache.snapshot()))


def ann(gpus: str, mig: str | None = None) -> dict[str, str]:
    out = {"gpupack.io/gpus": gpus}
    if mig is not None:
        out["gpupack.io/mig"] = mig
    return out


MIG_NODE = node("w", gpus=1, mig={"3g.40gb": 2}, reconfigurable=False)


@pytest.mark.parametrize(
    ("nodes", "pods", "gpu_less"),
    [
        # A MIG pod on a node whose GPUs have no MIG.
        ([node("w", product=L40S, gpus=1)], [mig_pod("m", node="w", scheduler="x")], 1),
        # A third share on a GPU time-sliced two ways.
        ([node("w", gpus=1, shared_replicas=2)],
         [shared_pod(f"s{i}", node="w", scheduler="x") for i in range(3)], 1),
        # Recorded on a GPU the node does not have: re-fitted to one it has.
        ([node("w", gpus=2, reconfigurable=False)],
         [whole_pod("a", 1, node="w", annotations=ann("5"))], 0),
        # Recorded with more GPUs than it asks for.
        ([node("w", gpus=2, reconfigurable=False)],
         [whole_pod("a", 1, node="w", annotations=ann("0,1"))], 0),
        # A MIG pod recorded with a GPU but no slice.
        ([MIG_NODE], [mig_pod("m", "3g.40gb", node="w", annotations=ann("0"))], 0),
        # A slice at a start its profile does not allow, and one of another profile.
        ([MIG_NODE], [mig_pod("m", "3g.40gb", node="w", annotations=ann("0", "3g.40gb@2"))], 0),
        ([MIG_NODE], [mig_pod("m", "3g.40gb", node="w", annotations=ann("0", "1g.10gb@0"))], 0),
        # Three 3g pods on a GPU with two 3g slices: the third holds CPU only.
        ([MIG_NODE], [mig_pod(f"m{i}", "3g.40gb", node="w", scheduler="x") for i in range(3)], 1),
    ],
)
def test_bound_pods_the_view_has_no_room_for_are_counted(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], gpu_less: int
) -> None:
    cache = make_cache(nodes)
    for p in pods:
        assert cache.upsert_pod(p)
    consistent(cache)
    assert cache.counts()["counted"] == len(pods)
    items = [cache.counted(f"default/{p['metadata']['name']}") for p in pods]
    assert sum(1 for req, pl in items
               if req.kind is not RequestKind.NONE and not pl.gpus) == gpu_less
    for p in pods:  # and each goes away cleanly
        cache.delete_pod(f"default/{p['metadata']['name']}")
        consistent(cache)
    n = cache.state.nodes["w"]
    assert n.cpu_free == n.info.cpu_milli and all(g.idle for g in n.gpus)


def test_a_node_that_shrinks_under_its_pods_keeps_counting_all_of_them() -> None:
    cache = make_cache([node("w", gpus=4, reconfigurable=False)])
    for i in range(4):
        assert cache.upsert_pod(whole_pod(f"a{i}", 1, node="w", annotations=ann(str(i))))
    assert cache.upsert_pod(pod("cpu", node="w", cpu="2"))
    cache.upsert_node(node("w", gpus=2, reconfigurable=False))
    consistent(cache)
    assert cache.counts()["counted"] == 5
    assert cache.state.nodes["w"].cpu_free == 64_000 - 4 * 1000 - 2000
    held = sorted(p.gpus for _, p in (cache.counted(f"default/a{i}") for i in range(4)))
    assert held == [(), (), (0,), (1,)]
    cache.upsert_node(node("w", gpus=4, reconfigurable=False))  # and grows back
    consistent(cache)
    assert cache.state.whole_gpus_free() == 0


def test_a_mig_node_relaid_out_under_bound_slices_keeps_counting_them() -> None:
    cache = make_cache([node("w", gpus=1, mig={"1g.10gb": 7}, reconfigurable=False)])
    for i in range(3):
        assert cache.upsert_pod(
            mig_pod(f"m{i}", node="w", annotations=ann("0", f"1g.10gb@{i}"))
        )
    cache.upsert_node(node("w", gpus=1, mig={"7g.80gb": 1}, reconfigurable=False))
    consistent(cache)
    assert cache.counts()["counted"] == 3
    cache.upsert_node(node("w", gpus=1, mig={"1g.10gb": 7}, reconfigurable=False))
    consistent(cache)
    assert [cache.counted(f"default/m{i}")[1].mig_start for i in range(3)] == [0, 1, 2]


def test_a_share_recorded_on_a_whole_gpu_is_counted_without_it_and_mig_still_fits() -> None:
    # The share's record names a whole-mode GPU: it cannot be recorded there (and that GPU
    # then offered a MIG slice the record check refused: a PlacementError escaped).
    cache = make_cache([node("w", gpus=1)])  # reconfigurable: an idle GPU may become MIG
    assert cache.upsert_pod(shared_pod("s", node="w", scheduler="x", annotations=ann("0")))
    assert cache.counted("default/s")[1].gpus == ()
    assert cache.upsert_pod(mig_pod("m", node="w", scheduler="x"))
    assert cache.counted("default/m")[1].gpus == (0,)
    cache.upsert_node(node("w", gpus=1, cpu="32"))
    consistent(cache)
    assert cache.counts()["counted"] == 2


def test_two_pods_recording_one_gpu_count_it_once_and_deleting_one_keeps_it_held() -> None:
    cache = make_cache([node("w", gpus=1, reconfigurable=False)])
    for name in ("a", "b"):
        assert cache.upsert_pod(whole_pod(name, 1, node="w", scheduler="x",
                                          annotations=ann("0")))
    assert cache.counted("default/b")[1].gpus == ()  # counted without the GPU a holds
    cache.delete_pod("default/b")
    assert cache.state.whole_gpus_free() == 0
    consistent(cache)


def test_preempt_restores_the_live_state_exactly() -> None:
    cache = make_cache([node("w", gpus=1, shared_replicas=2)])
    assert cache.upsert_pod(shared_pod("a", node="w", scheduler="x", annotations=ann("0")))
    assert cache.upsert_pod(whole_pod("b", 1, node="w", scheduler="x", annotations=ann("0")))
    args = PreemptionArgs(pod=shared_pod("z", priority=100), meta=True, victims={
        "w": Victims(pods=(), uids=("uid-default-a", "uid-default-b"), num_pdb_violations=0)})
    before = {k: (n.cpu_free, dict(n.pods)) for k, n in cache.state.nodes.items()}
    with cache.view() as view:
        preempt(args, view)
    assert {k: (n.cpu_free, dict(n.pods)) for k, n in cache.state.nodes.items()} == before
    consistent(cache)
    for key in ("default/a", "default/b"):
        cache.delete_pod(key)
    consistent(cache)


def test_an_assumed_new_slice_that_appears_in_the_layout_stays_assumed() -> None:
    cache = make_cache([node("w", gpus=1, mig={"1g.10gb": 6})])
    req = cache.pending_pod("default/q") if cache.upsert_pod(mig_pod("q")) else None
    assert req is not None
    created = [o for o in cache.state.options(req, "w") if o.mig_created]
    assert created
    cache.assume(req, req.uid, created[0])
    # The MIG manager created the slice; the Node update shows it before the pod is seen
    # bound.
    cache.upsert_node(node("w", gpus=1, mig={"1g.10gb": 7}))
    assert cache.assumed_keys() == ["default/q"]
    assert cache.counted("default/q")[1].mig_start == created[0].mig_start
    other = cache.state.options(replace_key(req, "default/r"), "w")
    assert all(o.mig_start != created[0].mig_start for o in other)
    consistent(cache)


@pytest.mark.parametrize("reconfigurable", [False, True])
def test_a_recorded_slice_missing_from_the_layout_leaves_no_ghost_when_it_goes(
    reconfigurable: bool
) -> None:
    # 1g.10gb@0 is not in the node's layout (the view lags): counted as a slice that
    # will be gone with the pod, not as a free slice for ever after.
    cache = make_cache([node("m", gpus=1, mig={"3g.40gb": 1}, reconfigurable=reconfigurable)])
    assert cache.upsert_pod(mig_pod("a", node="m", scheduler="x",
                                    annotations=ann("0", "1g.10gb@0")))
    assert cache.counted("default/a")[1].mig_start == 0
    replays(cache)
    cache.delete_pod("default/a")
    replays(cache)
    assert set(cache.state.nodes["m"].gpus[0].instances) == {4}


def test_a_slice_recorded_on_a_gpu_converted_by_an_assumption_goes_with_both() -> None:
    cache = make_cache([node("r", gpus=1)])  # one whole, MIG-reconfigurable GPU
    assert cache.upsert_pod(mig_pod("q"))
    req = cache.pending_pod("default/q")
    cache.assume(req, req.uid, next(o for o in cache.state.options(req, "r") if o.mig_created))
    assert cache.upsert_pod(mig_pod("p", node="r", scheduler="x",
                                    annotations=ann("0", "1g.10gb@1")))
    cache.forget("default/q")
    for key in ("default/q", "default/p"):
        cache.delete_pod(key)
    replays(cache)
    assert cache.state.whole_gpus_free() == 1


def test_an_assumption_for_a_pod_object_that_changed_uid_is_dropped_with_its_count() -> None:
    cache = make_cache([node("w", gpus=1, reconfigurable=False)])
    assert cache.upsert_pod(without_uid(whole_pod("q", 1)))
    req = cache.pending_pod("default/q")
    cache.assume(req, "", Placement(req.key, "w", (0,)))
    assert cache.upsert_pod(whole_pod("q", 1, uid="uid-2"))  # another pod, same name
    assert cache.assumed_keys() == [] and cache.counted("default/q") is None
    assert cache.upsert_pod(whole_pod("q", 1, uid="uid-2", node="w", scheduler="x"))
    assert cache.counted("default/q") is not None and cache.state.whole_gpus_free() == 0
    consistent(cache)


def test_an_assumption_keeps_its_count_when_the_pod_object_gains_the_bound_uid() -> None:
    cache = make_cache([node("w", gpus=1, reconfigurable=False)])
    assert cache.upsert_pod(without_uid(whole_pod("q", 1)))
    req = cache.pending_pod("default/q")
    cache.assume(req, "uid-real", Placement(req.key, "w", (0,)))
    assert cache.upsert_pod(whole_pod("q", 1, uid="uid-real"))
    assert cache.assumed_keys() == ["default/q"] and cache.state.whole_gpus_free() == 0
    consistent(cache)


def test_a_hold_on_a_slice_to_create_that_now_exists_holds_the_existing_slice() -> None:
    cache = make_cache([node("m", gpus=1, mig={"1g.10gb": 6})])
    assert cache.upsert_pod(mig_pod("x"))
    req = replace_key(cache.pending_pod("default/x"), "gpupack.io/hold/g/0")
    created = next(o for o in cache.state.options(req, "m") if o.mig_created)
    cache.upsert_node(node("m", gpus=1, mig={"1g.10gb": 7}))  # the slice appeared
    assert cache.hold(req, created) is None
    assert cache.counted(req.key)[1].mig_created is False
    replays(cache)


def without_uid(obj: dict[str, Any]) -> dict[str, Any]:
    """A Pod object as some clients and fakes send it: no metadata.uid."""
    meta = {k: v for k, v in obj["metadata"].items() if k != "uid"}
    return {**obj, "metadata": meta}


def replace_key(req: Any, key: str) -> Any:
    from dataclasses import replace
    return replace(req, key=key)


def test_events_a_source_skips_count_as_bad_objects() -> None:
    cache = make_cache([node("w", gpus=1)])
    cache.note_bad_object()
    assert cache.bad_objects == 1


# ---- stateful: a world that does not agree with the cache ---------------------------------

NODE_SHAPES = {
    "w": [node("w", gpus=n, reconfigurable=False) for n in (0, 1, 2, 4)],
    "m": [node("m", gpus=1, mig=layout, reconfigurable=False)
          for layout in ({"3g.40gb": 2}, {"1g.10gb": 7}, {"7g.80gb": 1}, {"2g.20gb": 3})],
    "s": [node("s", gpus=n, shared_replicas=r) for n, r in ((1, 2), (2, 2), (1, 4))],
    "l": [node("l", product=L40S, gpus=n) for n in (1, 2)],
    "r": [node("r", gpus=n) for n in (1, 2)],  # MIG-reconfigurable whole GPUs
}
KINDS = {
    "whole1": lambda name, **kw: whole_pod(name, 1, **kw),
    "whole2": lambda name, **kw: whole_pod(name, 2, **kw),
    "mig1g": lambda name, **kw: mig_pod(name, "1g.10gb", **kw),
    "mig3g": lambda name, **kw: mig_pod(name, "3g.40gb", **kw),
    "share": lambda name, **kw: shared_pod(name, **kw),
}
RECORDS = st.one_of(
    st.none(),
    st.builds(lambda g: ann(g), st.sampled_from(["0", "1", "0,1", "3", "1,0", "7"])),
    st.builds(lambda g, m: ann(g, m), st.sampled_from(["0", "1"]),
              st.sampled_from(["1g.10gb@0", "1g.10gb@5", "3g.40gb@4", "3g.40gb@2",
                               "7g.80gb@0", "2g.20gb@2"])),
)


class HostileWorld(RuleBasedStateMachine):
    """Nodes change shape under their pods; pods are bound by others wherever, with any
    record; nothing the cache is told may crash it or put its books out of step."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = make_cache([shapes[0] for shapes in NODE_SHAPES.values()])
        self.nodes = set(NODE_SHAPES)
        self.pods: dict[str, str | None] = {}  # pod name -> node (None: pending)

    @rule(name=st.sampled_from(sorted(NODE_SHAPES)), shape=st.integers(0, 3))
    def node_changes(self, name: str, shape: int) -> None:
        shapes = NODE_SHAPES[name]
        self.cache.upsert_node(shapes[shape % len(shapes)])
        self.nodes.add(name)

    @rule(name=st.sampled_from(sorted(NODE_SHAPES)))
    def node_goes(self, name: str) -> None:
        self.cache.delete_node(name)
        self.nodes.discard(name)

    @rule(i=st.integers(0, 7), kind=st.sampled_from(sorted(KINDS)),
          where=st.sampled_from(sorted(NODE_SHAPES)), record=RECORDS)
    def bound_elsewhere(self, i: int, kind: str, where: str,
                        record: dict[str, str] | None) -> None:
        obj = KINDS[kind](f"p{i}", node=where, scheduler="x", annotations=record)
        assert self.cache.upsert_pod(obj)
        self.pods[f"p{i}"] = where

    @rule(i=st.integers(0, 7), kind=st.sampled_from(sorted(KINDS)))
    def pending_then_assumed(self, i: int, kind: str) -> None:
        name = f"q{i}"
        if name in self.pods:
            return
        assert self.cache.upsert_pod(KINDS[kind](name))
        self.pods[name] = None
        req = self.cache.pending_pod(f"default/{name}")
        for n in sorted(self.nodes):
            options = self.cache.state.options(req, n)
            if options:
                self.cache.assume(req, req.uid, options[0])
                return

    @rule(i=st.integers(0, 7), prefix=st.sampled_from(["p", "q"]))
    def deleted(self, i: int, prefix: str) -> None:
        self.cache.delete_pod(f"default/{prefix}{i}")
        self.pods.pop(f"{prefix}{i}", None)

    @invariant()
    def books_in_step(self) -> None:
        consistent(self.cache)

    @invariant()
    def the_snapshot_replays_to_the_same_state(self) -> None:
        replays(self.cache)  # what the planner builds is what the verbs see

    @rule(where=st.sampled_from(sorted(NODE_SHAPES)))
    def preempt_changes_nothing(self, where: str) -> None:
        with self.cache.view() as view:
            if where not in view.state.nodes:
                return
            before = {k: (n.cpu_free, dict(n.pods)) for k, n in view.state.nodes.items()}
            uids = tuple(req.uid for req, _ in view.pods_on(where) if req.uid)
            args = PreemptionArgs(pod=whole_pod("z", 1, priority=100), meta=True, victims={
                where: Victims(pods=(), uids=uids, num_pdb_violations=0)})
            preempt(args, view)
            assert {k: (n.cpu_free, dict(n.pods))
                    for k, n in view.state.nodes.items()} == before

    @invariant()
    def every_bound_pod_on_a_known_node_is_counted(self) -> None:
        for name, where in self.pods.items():
            if where is not None:
                item = self.cache.counted(f"default/{name}")
                assert (item is not None) == (where in self.nodes), (name, where)
                if item is not None:
                    assert item[1].node == where


HostileWorld.TestCase.settings = settings(max_examples=200, stateful_step_count=40,
                                          deadline=None)
TestHostileWorld = HostileWorld.TestCase


def test_a_bound_pod_on_a_cordoned_or_cpu_full_node_is_counted_with_its_gpu() -> None:
    cache = make_cache([node("c", gpus=1, cpu="1", unschedulable=True, reconfigurable=False)])
    assert cache.upsert_pod(whole_pod("a", 1, node="c", scheduler="x", cpu="4"))
    assert cache.counted("default/a")[1].gpus == (0,)
    assert cache.state.whole_gpus_free() == 0


def test_a_record_written_after_the_pod_was_seen_bound_is_read() -> None:
    cache = make_cache([node("w", gpus=2, reconfigurable=False)])
    assert cache.upsert_pod(whole_pod("a", 1, node="w", scheduler="x"))
    assert cache.counted("default/a")[1].gpus == (0,)  # guessed: first free
    assert cache.upsert_pod(whole_pod("a", 1, node="w", scheduler="x", annotations=ann("1")))
    assert cache.counted("default/a")[1].gpus == (1,)
    consistent(cache)
    replays(cache)


# Records a bound pod's annotations can carry that name no usable placement.
UNREADABLE_RECORDS = [
    pytest.param(ann("", "1g.10gb@0"), id="mig-slice-on-no-gpu"),
    pytest.param(ann("x", "1g.10gb@0"), id="mig-gpus-not-indices"),
    pytest.param(ann("0", "1g.10gb"), id="mig-no-start"),
]


def slice_owners(cache: Any, node_name: str) -> list[str | None]:
    return [o for g in cache.state.nodes[node_name].gpus for _, o in g.instances.values()]


@pytest.mark.parametrize("record", UNREADABLE_RECORDS)
def test_a_bound_pod_whose_record_turns_unreadable_keeps_its_slice(record: dict[str, str]
                                                                    ) -> None:
    # The one slice of the node stays the pod's: an update that crashed the accounting
    # midway once left it stored but uncounted, and every relist then skipped it.
    cache = make_cache([node("m", gpus=1, mig={"1g.10gb": 1}, reconfigurable=False)],
                       [mig_pod("v", node="m", annotations=ann("0", "1g.10gb@6"))])
    assert slice_owners(cache, "m") == ["default/v"]
    for _ in range(2):  # the update, then the same object again (a relist)
        cache.upsert_pod(mig_pod("v", node="m", annotations=record))
        assert cache.counted("default/v") is not None
        assert slice_owners(cache, "m") == ["default/v"]
        consistent(cache)


@pytest.mark.parametrize("record", [*UNREADABLE_RECORDS,
                                    pytest.param(ann(","), id="gpus-not-indices")])
def test_a_relist_with_an_unreadable_record_counts_that_pod_and_the_others(
        record: dict[str, str]) -> None:
    cache = make_cache([])
    kind = "whole" if "gpupack.io/mig" not in record else "mig"
    bad = (mig_pod("bad", node="m", annotations=record) if kind == "mig"
           else whole_pod("bad", 1, node="n", annotations=record))
    others = [whole_pod(f"w{i}", 1, node="n") for i in range(3)]
    cache.replace([node("m", gpus=1, mig={"1g.10gb": 1}, reconfigurable=False),
                   node("n", gpus=4, reconfigurable=False)], [bad, *others])
    for k in ("default/bad", "default/w0", "default/w1", "default/w2"):
        assert cache.counted(k) is not None, k
    assert cache.state.whole_gpus_free() == (0 if kind == "whole" else 1)
    if kind == "mig":
        assert slice_owners(cache, "m") == ["default/bad"]
    consistent(cache)


def test_an_update_whose_accounting_fails_keeps_the_pod_as_it_was(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cache = make_cache([node("w", gpus=2, reconfigurable=False)],
                       [whole_pod("a", 1, node="w", annotations=ann("0"))])
    before = cache.pod_entry("default/a")
    real = cache.observed.placement_for
    calls = []

    def broken(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in the accounting")
        return real(*args, **kw)

    monkeypatch.setattr(cache.observed, "placement_for", broken)
    moved = whole_pod("a", 1, node="w", annotations=ann("1"))
    assert not cache.upsert_pod(moved)  # logged and counted as a bad object, not raised
    assert cache.bad_objects == 1
    assert cache.pod_entry("default/a") == before
    assert cache.counted("default/a")[1].gpus == (0,)
    consistent(cache)
    assert cache.upsert_pod(moved)  # not found unchanged: the update is taken this time
    assert cache.counted("default/a")[1].gpus == (1,)
    consistent(cache)
