"""MIG compaction on DynamicMIG GPUs (a DRA node's partitionable GPUs: instances made per
claim): where the allocator would create the moved pods' instances (its first fit per
node, on other GPUs in use), fences instead of holds, a GPU emptied when its last
instance goes even though it leaves MIG mode, and the actuator leaving such nodes alone.
A Hypothesis property checks every drain against an independent replay of the
allocator's first fit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.catalog import get_model
from packing.mig.layout import MigSlot, free_starts
from packing.model import MigReconfigure
from scheduler.mig.compact.decide import (
    DEFAULT_COMPACT,
    CompactSettings,
    CompactState,
    Drain,
    DynamicRoom,
    Tenant,
    decide_compaction,
    keeps_mig_mode,
)
from scheduler.mig.compact.steer import steer_fences
from scheduler.mig.decide import (
    ActuatorState,
    GpuView,
    MigPod,
    NodeView,
    decide_mig,
)

H100, A100 = "H100-80GB", "A100-80GB"
NOW = 10_000.0
S = CompactSettings(min_pod_age_s=300, max_pods=3, evictions_per_hour=100, min_excess=1,
                    keep_room=False)
ON = MigReconfigure.ON
GEOM = get_model(H100).mig
assert GEOM is not None

# A DynamicMIG GPU as {start: (profile, pod)}; "whole" holds it whole; {} is idle.
Gpu = dict[int, tuple[str, str]] | str


def view(i: int, g: Gpu, model: str = H100) -> GpuView:
    if g == "whole":
        return GpuView(i, model, False, holders=frozenset({f"whole-{i}"}), dynamic=True)
    assert isinstance(g, dict)
    layout = tuple(MigSlot(p, s) for s, (p, _) in sorted(g.items()))
    return GpuView(i, model, bool(layout), layout, (), frozenset(o for _, o in g.values()),
                   dynamic=True)


def node(name: str, gpus: Sequence[Gpu], model: str = H100, **kw: object) -> NodeView:
    return NodeView(name, ON, tuple(view(i, g, model) for i, g in enumerate(gpus)),
                    **kw)  # type: ignore[arg-type]


def tenants(nodes: Sequence[NodeView], since: float = 0.0) -> dict[str, Tenant]:
    out = {}
    for n in nodes:
        for g in n.gpus:
            for s in g.layout:
                owner = next(h for h in g.holders if h.startswith(f"{n.name}/{g.index}/{s.start}"))
                out[owner] = Tenant(owner, n.name, g.index, s.profile, since, True)
    return out


def pods(node_name: str, gpu: int, *slots: tuple[str, int]) -> dict[int, tuple[str, str]]:
    return {s: (p, f"{node_name}/{gpu}/{s}/{p}") for p, s in slots}


def ones(node_name: str, gpu: int, n: int) -> dict[int, tuple[str, str]]:
    return pods(node_name, gpu, *[("1g.10gb", i) for i in range(n)])


def decide(nodes: Sequence[NodeView], settings: CompactSettings = S, since: float = 0.0,
           **kw: object) -> tuple[list[tuple[str, int]], object]:
    cs = CompactState(tuple(nodes), tenants(nodes, since), **kw)  # type: ignore[arg-type]
    d = decide_compaction(cs, NOW, settings)
    return sorted(dr.gpu_key for dr in d.starts), d


CASES = [
    ("a lone pod moves beside the pods of another GPU in use",
     [node("a", [ones("a", 0, 1), ones("a", 1, 4)])], [("a", 0)]),
    ("room only on an idle GPU: nothing",
     [node("a", [ones("a", 0, 1), {}])], []),
    ("an idle GPU before the one in use is steered off: the GPU in use takes it",
     [node("a", [ones("a", 0, 1)]), node("b", [{}, ones("b", 1, 4)])], [("a", 0)]),
    ("another node's GPU in use takes it",
     [node("a", [ones("a", 0, 1)]), node("b", [ones("b", 0, 4)])], [("a", 0)]),
    ("a whole GPU in use has no room",
     [node("a", [ones("a", 0, 1), "whole"])], []),
    ("a 3g fits only at slice 4 of a GPU whose 0-3 are taken",
     [node("a", [pods("a", 0, ("3g.40gb", 4)), ones("a", 1, 4)])], [("a", 0)]),
    ("no room for a 3g beside three 1g and a 2g",
     [node("a", [pods("a", 0, ("3g.40gb", 4)),
                 pods("a", 1, ("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2),
                      ("2g.20gb", 4))])], []),
    ("cordoned destination: nothing",
     [node("a", [ones("a", 0, 1)]), node("b", [ones("b", 0, 4)], unschedulable=True)], []),
]


@pytest.mark.parametrize("name,nodes,want", CASES, ids=[c[0] for c in CASES])
def test_dynamic_starts(name: str, nodes: list[NodeView], want: list[tuple[str, int]]) -> None:
    got, d = decide(nodes)
    assert got == want
    assert sorted(d.fences) == want  # type: ignore[attr-defined]
    assert d.holds == ()  # type: ignore[attr-defined]
    for dr in d.starts:  # type: ignore[attr-defined]
        assert {p for drain, p in d.evict if drain == dr} == set(dr.pods)  # type: ignore[attr-defined]


def test_unsteered_first_fit_on_an_idle_gpu_takes_nothing() -> None:
    """Without steering the allocator's first fit on node b is the idle GPU 0, where a
    moved pod would only move the use."""
    nodes = [node("a", [ones("a", 0, 1)]), node("b", [{}, ones("b", 1, 4)])]
    assert decide(nodes, replace(S, dynamic_steer_margin=0))[0] == []
    _, d = decide(nodes)
    assert ("b", 0, "1g.10gb") in d.steer  # type: ignore[attr-defined]


def test_pending_pods_take_the_room_first() -> None:
    nodes = [node("a", [ones("a", 0, 1), ones("a", 1, 6)])]
    assert decide(nodes)[0] == [("a", 0)]
    assert decide(nodes, pending=(MigPod("ns/w", "1g.10gb", frozenset({H100})),))[0] == []


def test_a_drained_gpu_stays_fenced_and_ends_emptied_when_it_leaves_mig_mode() -> None:
    nodes = [node("a", [ones("a", 0, 1), ones("a", 1, 4)])]
    _, d = decide(nodes)
    dr = d.starts[0]  # type: ignore[attr-defined]
    # Next step: the pod is still there: fenced, not started again.
    got, d2 = decide(nodes, drains=(dr,))
    assert got == [] and d2.fences == (("a", 0),) and not d2.ends  # type: ignore[attr-defined]
    # Its instance gone, the Hopper GPU is whole again (MIG off): emptied, not gone.
    after = [node("a", [{}, ones("a", 1, 5)])]
    _, d3 = decide(after, drains=(dr,))
    assert [e.result for e in d3.ends] == ["emptied"]  # type: ignore[attr-defined]
    assert d3.fences == ()  # type: ignore[attr-defined]


def test_the_fence_of_an_idle_gpu_is_no_stranger() -> None:
    # The cache holds a tainted idle GPU in its taint's name: the fence itself.
    nodes = [node("a", [ones("a", 0, 1), ones("a", 1, 4)])]
    dr = decide(nodes)[1].starts[0]  # type: ignore[attr-defined]
    fenced = NodeView("a", ON, (GpuView(0, H100, False, holders=frozenset(
        {"a/gpu-0#dra-tainted"}), dynamic=True), view(1, ones("a", 1, 5))))
    _, d = decide([fenced], drains=(dr,))
    assert [e.result for e in d.ends] == ["emptied"]  # type: ignore[attr-defined]


def test_the_actuator_never_changes_a_dynamic_node() -> None:
    nodes = (node("a", [{}, {}]),)
    state = ActuatorState(nodes, mig_pods=(MigPod("ns/w", "1g.10gb", frozenset({H100}),
                                                 NOW - 60),))
    d = decide_mig(state, NOW)
    assert not d.starts


def _first_fit(rows: dict[str, list[tuple[int, list[MigSlot], bool]]], profile: str,
               steered: frozenset[tuple[str, int, str]] = frozenset()
               ) -> list[tuple[str, int]]:
    """Per node, the allocator's first GPU with room for ``profile``, if in use; the
    ``profile`` devices of a steered (node, GPU, profile) are tainted, so skipped."""
    out = []
    for n, gpus in rows.items():
        for i, lay, used in gpus:
            if (n, i, profile) in steered:
                continue
            if free_starts(GEOM, lay, profile):
                if used:
                    out.append((n, i))
                break
    return out


GPU = st.one_of(
    st.just({}), st.just("whole"),
    st.lists(st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"]), min_size=1, max_size=4))


def built_nodes(spec: list[list[object]]) -> list[NodeView]:
    """Nodes of H100s from a drawn spec: each GPU idle, whole, or its profiles placed at
    their first free starts (one pod each)."""
    nodes = []
    for ni, gpus in enumerate(spec):
        name = f"n{ni}"
        built: list[Gpu] = []
        for gi, g in enumerate(gpus):
            if isinstance(g, list):
                lay: list[MigSlot] = []
                slots: dict[int, tuple[str, str]] = {}
                for p in g:
                    starts = free_starts(GEOM, lay, p)
                    if starts:
                        lay.append(MigSlot(p, starts[0]))
                        slots[starts[0]] = (p, f"{name}/{gi}/{starts[0]}/{p}")
                built.append(slots)
            else:
                built.append(g)  # type: ignore[arg-type]
        nodes.append(node(name, built))
    return nodes


@settings(max_examples=120, deadline=None)
@given(st.lists(st.lists(GPU, min_size=1, max_size=3), min_size=1, max_size=3))
def test_every_drain_has_an_in_use_first_fit_for_each_pod(spec: list[list[object]]) -> None:
    nodes = built_nodes(spec)
    _, d = decide(nodes)
    fenced = set(d.fences)  # type: ignore[attr-defined]
    rows = {n.name: [(g.index, list(g.layout), bool(g.holders)) for g in n.gpus
                     if g.mig_enabled or not g.holders] for n in nodes}
    for dr in d.starts:  # type: ignore[attr-defined]
        assert dr.gpu_key in fenced
        src = next(g for n in nodes if n.name == dr.node for g in n.gpus if g.index == dr.gpu)
        profiles = sorted((s.profile for s in src.layout),
                          key=lambda p: -GEOM.profile(p).compute_slices)
        rows = {n: [r for r in gpus if (n, r[0]) not in fenced] for n, gpus in rows.items()}
        for p in profiles:
            fits = _first_fit(rows, p, frozenset(d.steer))  # type: ignore[attr-defined]
            assert fits, (dr, p)
            # Take the fit the decision would (the fullest), for the next pod's check.
            n, i = min(fits, key=lambda k: (sum(GEOM.profile(s.profile).compute_slices
                                                for s in next(r for r in rows[k[0]]
                                                              if r[0] == k[1])[1]) * -1, k[0]))
            row = next(r for r in rows[n] if r[0] == i)
            row[1].append(MigSlot(p, free_starts(GEOM, row[1], p)[0]))


def test_dynamic_room_alone() -> None:
    nodes = [node("a", [ones("a", 0, 6)]), node("b", [ones("b", 0, 2)])]
    room = DynamicRoom(nodes, frozenset(), set(), ())
    assert room.take(("a", 0), H100, ["1g.10gb"])
    assert not room.take(("b", 0), H100, ["3g.40gb", "3g.40gb"])
    assert Drain  # the record type drains carry


# -- the DynamicMIG rules of issue 34: what emptying a GPU costs later ---------------------

KEEP = replace(S, keep_room=True)
THREE_G_BESIDE_FOUR_ONES = [pods("a", 0, ("3g.40gb", 4)), ones("a", 1, 4)]

ROOM_CASES = [
    # (name, nodes, settings, drained)
    ("keep_room: a Hopper GPU is not emptied when the 3g in use would find no room after",
     [node("a", THREE_G_BESIDE_FOUR_ONES)], KEEP, []),
    ("without keep_room the same GPU is emptied",
     [node("a", THREE_G_BESIDE_FOUR_ONES)], S, [("a", 0)]),
    ("keep_room: room for every profile in use stays on a third GPU in use: emptied",
     [node("a", [*THREE_G_BESIDE_FOUR_ONES, pods("a", 2, ("3g.40gb", 4))])], KEEP,
     [("a", 0)]),
    ("an Ampere GPU keeps MIG mode once empty: keep_room does not apply",
     [node("a", THREE_G_BESIDE_FOUR_ONES, A100)], KEEP, [("a", 0)]),
    ("keep_room: only the model's own profiles count (a 3g on an A100 asks no H100 room)",
     [node("a", [ones("a", 0, 1), ones("a", 1, 5)]),
      node("b", [pods("b", 0, ("3g.40gb", 0))], A100)], KEEP, [("a", 0)]),
    ("keep_room: the moved pod's own profile must still fit once it moved",
     [node("a", [ones("a", 0, 1), ones("a", 1, 6)])], KEEP, []),
]


@pytest.mark.parametrize("name,nodes,settings,want", ROOM_CASES,
                         ids=[c[0] for c in ROOM_CASES])
def test_keep_room(name: str, nodes: list[NodeView], settings: CompactSettings,
                   want: list[tuple[str, int]]) -> None:
    assert decide(nodes, settings)[0] == want


GUARD_CASES = [
    # (name, nodes, settings, pods' age in s, drained)
    ("Hopper: a pod younger than min_pod_age_s stays",
     [node("a", [ones("a", 0, 1), ones("a", 1, 4)])], S, 60.0, []),
    ("Ampere: the kept-mode age (0 s) lets a young pod move",
     [node("a", [ones("a", 0, 1), ones("a", 1, 4)], A100)], S, 60.0, [("a", 0)]),
    ("Ampere: a kept-mode age set above the pod's keeps it",
     [node("a", [ones("a", 0, 1), ones("a", 1, 4)], A100)],
     replace(S, kept_mode_min_pod_age_s=120), 60.0, []),
    ("Hopper: GPUs of 2 pods are past max_pods (1)",
     [node("a", [ones("a", 0, 2), ones("a", 1, 2)])], replace(S, max_pods=1), 1e4, []),
    ("Ampere: up to kept_mode_max_pods (7) pods leave one GPU",
     [node("a", [ones("a", 0, 2), ones("a", 1, 2)], A100)], replace(S, max_pods=1), 1e4,
     [("a", 0)]),
    ("dynamic_min_excess: one GPU of excess is enough on DynamicMIG GPUs",
     [node("a", [ones("a", 0, 1), ones("a", 1, 4)])],
     replace(S, min_excess=2, dynamic_min_excess=1), 1e4, [("a", 0)]),
    ("dynamic_min_excess 2: one GPU of excess is not",
     [node("a", [ones("a", 0, 1), ones("a", 1, 4)])],
     replace(S, min_excess=1, dynamic_min_excess=2), 1e4, []),
]


@pytest.mark.parametrize("name,nodes,settings,age,want", GUARD_CASES,
                         ids=[c[0] for c in GUARD_CASES])
def test_dynamic_guards(name: str, nodes: list[NodeView], settings: CompactSettings,
                        age: float, want: list[tuple[str, int]]) -> None:
    assert decide(nodes, settings, since=NOW - age)[0] == want


@pytest.mark.parametrize("recent,limit,started", [
    (95, 100, True),   # 95 + 1 within the DynamicMIG budget, past evictions_per_hour (10)
    (99, 100, True),
    (100, 100, False),
])
def test_the_dynamic_eviction_budget(recent: int, limit: int, started: bool) -> None:
    nodes = [node("a", [ones("a", 0, 1), ones("a", 1, 4)])]
    s = replace(S, evictions_per_hour=10, dynamic_evictions_per_hour=limit)
    got, _ = decide(nodes, s, evictions=tuple(NOW - 60 for _ in range(recent)))
    assert (got == [("a", 0)]) is started


def test_which_gpus_keep_mig_mode() -> None:
    assert keeps_mig_mode(view(0, {}, A100)) and not keeps_mig_mode(view(0, {}, H100))
    # The shipped defaults are the ones bench/README.md measured (issue 34).
    d = DEFAULT_COMPACT
    assert (d.dynamic_min_excess, d.kept_mode_max_pods, d.kept_mode_min_pod_age_s,
            d.keep_room, d.dynamic_evictions_per_hour) == (1, 7, 0.0, True, 240)


def _fits_in_use(nodes: Sequence[NodeView], fenced: set[tuple[str, int]], taken: list[
        tuple[str, int, MigSlot]], profile: str,
        steered: frozenset[tuple[str, int, str]] = frozenset()) -> bool:
    """Whether some node's first fit for ``profile`` (fenced GPUs and steered devices
    skipped, the moved pods' instances added) is a GPU in use."""
    rows = {n.name: [(g.index, [*g.layout, *(sl for tn, ti, sl in taken
                                          if (tn, ti) == (n.name, g.index))], bool(g.holders))
                     for g in n.gpus if (g.mig_enabled or not g.holders)
                     and (n.name, g.index) not in fenced] for n in nodes}
    return bool(_first_fit(rows, profile, steered))


@settings(max_examples=120, deadline=None)
@given(st.lists(st.lists(GPU, min_size=1, max_size=3), min_size=1, max_size=3))
def test_keep_room_leaves_a_fit_for_every_profile_in_use(spec: list[list[object]]) -> None:
    nodes = built_nodes(spec)
    _, d = decide(nodes, KEEP)
    starts = d.starts  # type: ignore[attr-defined]
    assert len(starts) <= 1  # one drain per GPU model at a time
    for dr in starts:
        in_use = {s.profile for n in nodes for g in n.gpus for s in g.layout}
        # The drained pods land somewhere in use (the other property); after them, one
        # more pod of each profile in use still has a first fit on a GPU in use.
        src = next(g for n in nodes if n.name == dr.node for g in n.gpus if g.index == dr.gpu)
        steered = frozenset(steer_fences(nodes, (), KEEP.dynamic_steer_margin))
        room = DynamicRoom(nodes, frozenset(), set(), (), steered)
        assert room.take(dr.gpu_key, H100, [s.profile for s in src.layout])
        taken = room._taken  # the moved pods' instances, as the decision placed them
        for p in sorted(in_use):
            assert _fits_in_use(nodes, {dr.gpu_key}, taken, p,
                                frozenset(d.steer)), (dr, p)  # type: ignore[attr-defined]
