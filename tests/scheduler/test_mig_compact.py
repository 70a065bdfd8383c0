"""MIG compaction's pure decision (scheduler/mig/compact/decide.py): one table row per rule,
builders for GPUs and their pods, and a Hypothesis property: a drain only starts where
every pod it moves has a free slice of its profile on another GPU in use."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.mig.layout import MigSlot
from packing.model import MigReconfigure
from scheduler.mig.compact.decide import (
    DRAIN_PREFIX,
    CompactSettings,
    CompactState,
    Drain,
    Tenant,
    decide_compaction,
)
from scheduler.mig.decide import GpuView, MigPod, NodeView

H100, A100 = "H100-80GB", "A100-80GB"
NOW = 10_000.0
S = CompactSettings(min_pod_age_s=300, max_pods=2, evictions_per_hour=10,
                    drain_timeout_s=600, cooldown_s=1800, min_excess=1)
ON, OFF = MigReconfigure.ON, MigReconfigure.NOT_OPTED_IN

# A GPU as (profile per start, owner or None); owners are pod keys.
Slots = dict[int, tuple[str, str | None]]


def gpu(i: int, slots: Slots, model: str = H100) -> GpuView:
    layout = tuple(MigSlot(p, s) for s, (p, _) in sorted(slots.items()))
    free = tuple(MigSlot(p, s) for s, (p, o) in sorted(slots.items()) if o is None)
    return GpuView(i, model, True, layout, free, frozenset(o for _, o in slots.values() if o))


def seven(*owners: str | None) -> Slots:
    """A 7 x 1g.10gb GPU whose first instances are held by ``owners``."""
    return {s: ("1g.10gb", owners[s] if s < len(owners) else None) for s in range(7)}


def node(name: str, gpus: list[GpuView], reconf: MigReconfigure = ON, **kw: object
         ) -> NodeView:
    return NodeView(name, reconf, tuple(gpus), **kw)  # type: ignore[arg-type]


# Pod key -> its profile, written by gpu_owned (keys are unique to their profile in
# every test here), read back by tenants().
_PROFILE: dict[str, str] = {}


def gpu_owned(i: int, slots: Slots, model: str = H100) -> GpuView:
    for profile, owner in slots.values():
        if owner is not None:
            _PROFILE[owner] = profile
    return gpu(i, slots, model)


def tenants(nodes: list[NodeView], since: float = 0.0, immovable: tuple[str, ...] = ()
            ) -> dict[str, Tenant]:
    """Every pod holding a slot, started at ``since``, movable unless named."""
    return {h: Tenant(h, n.name, g.index, _PROFILE[h], since, h not in immovable)
            for n in nodes for g in n.gpus for h in g.holders
            if not h.startswith(DRAIN_PREFIX)}


def cstate(nodes: list[NodeView], **kw: object) -> CompactState:
    ts = kw.pop("tenants", None)
    return CompactState(tuple(nodes), ts if ts is not None else tenants(nodes),  # type: ignore[arg-type]
                        **kw)  # type: ignore[arg-type]


def two_gpus(**node_kw: object) -> list[NodeView]:
    """GPU 0 holds one ASR pod; GPU 1 holds three and has four free 1g slices."""
    return [node("a", [gpu_owned(0, seven("ns/lone")),
                       gpu_owned(1, seven("ns/p1", "ns/p2", "ns/p3"))], **node_kw)]


# ---- starts -----------------------------------------------------------------------------------

START_CASES = [
    # (name, nodes, extra state, settings, expected drained GPUs)
    ("a lone pod moves to free slices of a GPU in use", two_gpus(), {}, S, [("a", 0)]),
    ("node not opted in: nothing", two_gpus(reconf=OFF), {}, S, []),
    ("cordoned node: nothing", two_gpus(unschedulable=True), {}, S, []),
    ("tainted node: nothing", two_gpus(tainted=True), {}, S, []),
    ("a MIG change in flight on the node: nothing", two_gpus(),
     {"changing": frozenset({"a"})}, S, []),
    ("no destination: free slices on an idle GPU do not count",
     [node("a", [gpu_owned(0, seven("ns/lone")), gpu_owned(1, seven())])], {}, S, []),
    ("wrong profile free elsewhere: nothing",
     [node("a", [gpu_owned(0, {0: ("2g.20gb", "ns/tts"), 2: ("2g.20gb", None)}),
                 gpu_owned(1, seven("ns/p1"))])], {}, S, []),
    ("pending pods take the free slices first",
     two_gpus(), {"pending": tuple(MigPod(f"ns/w{i}", "1g.10gb") for i in range(11))}, S, []),
    ("a pending pod of another profile leaves them",
     two_gpus(), {"pending": (MigPod("ns/w", "2g.20gb"),)}, S, [("a", 0)]),
    ("a cooling-down GPU is left", two_gpus(), {"cooldown": {("a", 0): NOW + 1}}, S, []),
    ("an expired cool-down is over", two_gpus(), {"cooldown": {("a", 0): NOW - 1}}, S,
     [("a", 0)]),
    ("eviction budget spent", two_gpus(), {"evictions": tuple([NOW - 60] * 10)}, S, []),
    ("evictions older than an hour do not count", two_gpus(),
     {"evictions": tuple([NOW - 3700] * 10)}, S, [("a", 0)]),
    ("a drain of the same model in flight: no second",
     [*two_gpus(), node("b", [gpu_owned(0, seven("ns/b1")), gpu_owned(1, seven("ns/b2"))])],
     {"drains": (Drain("a", 1, H100, ("ns/p1", "ns/p2", "ns/p3"), NOW - 5),)}, S, []),
    ("another model drains alongside",
     [node("a", [gpu_owned(0, seven("ns/lone")), gpu_owned(1, seven("ns/p1"))]),
      node("b", [gpu_owned(0, seven("ns/b1"), A100), gpu_owned(1, seven("ns/b2"), A100)])],
     {}, S, [("a", 0), ("b", 0)]),
    ("packing already tight: the model's excess is below min_excess",
     two_gpus(), {}, CompactSettings(min_pod_age_s=300, max_pods=2, min_excess=2), []),
    ("more pods than max_pods: nothing",
     [node("a", [gpu_owned(0, seven("ns/x1", "ns/x2", "ns/x3")),
                 gpu_owned(1, seven("ns/p1", "ns/p2", "ns/p3"))])], {}, S, []),
]


@pytest.mark.parametrize("name,nodes,extra,cfg,want", START_CASES,
                         ids=[c[0] for c in START_CASES])
def test_starts(name: str, nodes: list[NodeView], extra: dict[str, object],
                cfg: CompactSettings, want: list[tuple[str, int]]) -> None:
    d = decide_compaction(cstate(nodes, **extra), NOW, cfg)
    assert sorted(dr.gpu_key for dr in d.starts) == want
    for dr in d.starts:
        assert {p for drain, p in d.evict if drain == dr} == set(dr.pods)
        assert dr.gpu_key in d.why


def test_young_and_immovable_pods_stay() -> None:
    nodes = two_gpus()
    young = tenants(nodes, since=NOW - 100)
    assert not decide_compaction(cstate(nodes, tenants=young), NOW, S).starts
    bare = tenants(nodes, immovable=("ns/lone",))
    assert not decide_compaction(cstate(nodes, tenants=bare), NOW, S).starts


def test_a_gpu_with_a_reservation_or_hold_is_not_drained() -> None:
    nodes = [node("a", [gpu_owned(0, seven("ns/lone", "group-x#0")),
                        gpu_owned(1, seven("ns/p1", "ns/p2", "ns/p3"))])]
    ts = {k: t for k, t in tenants(nodes).items() if k != "group-x#0"}
    assert not decide_compaction(cstate(nodes, tenants=ts), NOW, S).starts


def test_fewest_pods_first_then_fewest_slices() -> None:
    nodes = [node("a", [gpu_owned(0, {0: ("3g.40gb", "ns/mid"), 4: ("3g.40gb", None)}),
                        gpu_owned(1, seven("ns/lone")),
                        gpu_owned(2, {0: ("3g.40gb", "ns/m2"), 4: ("3g.40gb", None)}),
                        gpu_owned(3, seven("ns/p1", "ns/p2"))])]
    d = decide_compaction(cstate(nodes), NOW, S)
    assert [dr.gpu_key for dr in d.starts] == [("a", 1)]  # one pod, 1 memory slice
    assert d.starts[0].pods == ("ns/lone",)


def test_the_source_own_free_slices_are_no_destination() -> None:
    # GPU 0's own free slices could take its two pods, but no other GPU has a free 1g
    # slice (GPU 1's pod is not movable, so GPU 1 is no source either): nothing starts.
    nodes = [node("a", [gpu_owned(0, seven("ns/x1", "ns/x2")),
                        gpu_owned(1, {0: ("1g.10gb", "ns/p1"), 4: ("3g.40gb", None)})])]
    ts = tenants(nodes, immovable=("ns/p1",))
    assert not decide_compaction(cstate(nodes, tenants=ts), NOW, S).starts


# ---- drains in flight -------------------------------------------------------------------------


def drain(**kw: object) -> Drain:
    base: dict[str, object] = {"node": "a", "gpu": 0, "model": H100, "pods": ("ns/lone",),
                               "started": NOW - 10}
    base.update(kw)
    return Drain(**base)  # type: ignore[arg-type]


END_CASES = [
    # (name, GPU 0's slots, the drain, expected result or None)
    ("emptied", seven(), drain(evicted=frozenset({"ns/lone"})), "emptied"),
    ("still there", seven("ns/lone"), drain(), None),
    ("a stranger landed", {**seven("ns/lone"), 1: ("1g.10gb", "ns/new")}, drain(),
     "refilled"),
    ("refused", seven("ns/lone"), drain(refused="ns/lone: pdb"), "refused"),
    ("timed out", seven("ns/lone"), drain(started=NOW - 601), "timeout"),
]


@pytest.mark.parametrize("name,slots,dr,want", END_CASES, ids=[c[0] for c in END_CASES])
def test_ends(name: str, slots: Slots, dr: Drain, want: str | None) -> None:
    nodes = [node("a", [gpu_owned(0, slots), gpu_owned(1, seven("ns/p1"))])]
    d = decide_compaction(cstate(nodes, drains=(dr,)), NOW, S)
    assert [e.result for e in d.ends] == ([want] if want else [])
    cooled = ("a", 0) in d.cooldown
    assert cooled == (want not in (None, "emptied"))


def test_gone_gpu_ends_the_drain() -> None:
    nodes = [node("a", [gpu_owned(1, seven("ns/p1"))])]
    d = decide_compaction(cstate(nodes, drains=(drain(),)), NOW, S)
    assert [e.result for e in d.ends] == ["gone"]


def test_drain_holds_every_free_instance_and_evicts_once() -> None:
    slots = seven("ns/lone")
    g0 = gpu_owned(0, slots)
    nodes = [node("a", [g0, gpu_owned(1, seven("ns/p1"))])]
    d = decide_compaction(cstate(nodes), NOW, S)
    (dr,) = d.starts
    assert sorted(h.start for h in d.holds) == list(range(1, 7))
    assert all(h.key.startswith(DRAIN_PREFIX) for h in d.holds)
    # Next step: the eviction accepted, the pod still terminating: not evicted again.
    dr2 = Drain(dr.node, dr.gpu, dr.model, dr.pods, dr.started, frozenset(dr.pods))
    d2 = decide_compaction(cstate(nodes, drains=(dr2,)), NOW + 1, S)
    assert not d2.evict and not d2.ends and not d2.starts
    assert len(d2.holds) == 6


# ---- property ---------------------------------------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeView]:
    nodes = []
    k = 0
    for n in range(draw(st.integers(1, 3))):
        gpus = []
        for i in range(draw(st.integers(1, 4))):
            used = draw(st.integers(0, 7))
            owners: list[str | None] = []
            for _ in range(used):
                k += 1
                owners.append(f"ns/p{k}")
            gpus.append(gpu_owned(i, seven(*owners)))
        nodes.append(node(f"n{n}", gpus))
    return nodes


@given(clusters(), st.integers(0, 6))
@settings(max_examples=150, deadline=None)
def test_drains_only_where_the_pods_have_somewhere_to_go(nodes: list[NodeView],
                                                        pending: int) -> None:
    pods = tuple(MigPod(f"ns/w{i}", "1g.10gb") for i in range(pending))
    d = decide_compaction(cstate(nodes, pending=pods), NOW, S)
    assert len(d.starts) <= 1  # one model
    free_on_used = sum(len(g.free) for n in nodes for g in n.gpus if g.holders)
    for dr in d.starts:
        g = next(g for n in nodes for g in n.gpus if (n.name, g.index) == dr.gpu_key)
        assert 0 < len(dr.pods) <= S.max_pods and set(dr.pods) == set(g.holders)
        need = Counter("1g.10gb" for _ in dr.pods)
        elsewhere = free_on_used - len(g.free)
        assert elsewhere - pending >= need["1g.10gb"]
        assert all(h.node == dr.node and h.gpu == dr.gpu for h in d.holds)
