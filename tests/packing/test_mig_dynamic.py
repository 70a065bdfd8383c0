"""DynamicMIG placement geometry (packing/mig/dynamic.py): reachable compute against the
maximal layouts of each geometry (an independent oracle), the dominated starts of the
catalog's parts, and the placement key's order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.catalog import MigGeometry, get_model
from packing.mig.dynamic import dominated_starts, placement_key, reachable_compute
from packing.mig.layout import MigSlot, free_starts, is_valid_layout, maximal_layouts, used_slices

H100 = get_model("H100-80GB").mig
A30 = get_model("A30-24GB").mig
assert H100 is not None and A30 is not None


def s(*pairs: tuple[str, int]) -> list[MigSlot]:
    return [MigSlot(p, start) for p, start in pairs]


REACH = [
    ("an empty GPU reaches all its compute", [], 7),
    ("3g at 0 leaves 4-7 for 3 compute", s(("3g.40gb", 0)), 6),
    ("3g at 4 leaves 0-3 for 4", s(("3g.40gb", 4)), 7),
    ("two 3g: six", s(("3g.40gb", 0), ("3g.40gb", 4)), 6),
    ("seven 1g: full", s(*[("1g.10gb", i) for i in range(7)]), 7),
    ("1g.20gb at 0 wastes a memory slice", s(("1g.20gb", 0)), 6),
    ("1g.20gb at 6 takes slice 7 that only it and 3g@4 use", s(("1g.20gb", 6)), 7),
    ("2g at 4 and 1g at 6 beside four 1g", s(("2g.20gb", 4), ("1g.10gb", 6),
                                            *[("1g.10gb", i) for i in range(4)]), 7),
    ("an overlap is no layout", s(("3g.40gb", 0), ("2g.20gb", 2)), 0),
]


@pytest.mark.parametrize("name,slots,want", REACH, ids=[r[0] for r in REACH])
def test_reachable_compute(name: str, slots: list[MigSlot], want: int) -> None:
    assert reachable_compute(H100, slots) == want


def _oracle(geom: MigGeometry, slots: list[MigSlot]) -> int:
    """The most compute of a maximal layout holding ``slots`` (0: none holds them)."""
    if not is_valid_layout(geom, slots):
        return 0
    want = set(slots)
    return max((used_slices(geom, lay)[0] for lay in maximal_layouts(geom)
                if want <= set(lay)), default=used_slices(geom, slots)[0])


@st.composite
def layouts(draw: st.DrawFn, geom: MigGeometry) -> list[MigSlot]:
    """A valid layout grown one free placement at a time."""
    slots: list[MigSlot] = []
    for _ in range(draw(st.integers(0, 5))):
        options = [(p.name, start) for p in geom.classic
                   for start in free_starts(geom, slots, p.name)]
        if not options:
            break
        slots.append(MigSlot(*draw(st.sampled_from(options))))
    return slots


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_reachable_compute_is_the_best_maximal_layout_holding_it(data: st.DataObject) -> None:
    for geom in (H100, A30):
        slots = data.draw(layouts(geom))
        reach = reachable_compute(geom, slots)
        assert reach == _oracle(geom, slots)
        assert used_slices(geom, slots)[0] <= reach <= geom.compute_slices


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_a_placement_never_raises_what_the_gpu_reaches(data: st.DataObject) -> None:
    slots = data.draw(layouts(H100))
    options = [(p.name, start) for p in H100.classic for start in free_starts(H100, slots, p.name)]
    if not options:
        return
    profile, start = data.draw(st.sampled_from(options))
    after = [*slots, MigSlot(profile, start)]
    lost, free_after, _, _ = placement_key(H100, slots, profile, start)
    assert lost == reachable_compute(H100, slots) - reachable_compute(H100, after) >= 0
    assert free_after == H100.compute_slices - used_slices(H100, after)[0]


DOMINATED = [
    ("H100-80GB", "3g.40gb", (0,)), ("H100-80GB", "1g.10gb", ()), ("H100-80GB", "2g.20gb", ()),
    ("H100-80GB", "1g.20gb", (0, 2, 4)), ("H100-80GB", "7g.80gb", ()),
    ("A100-40GB", "3g.20gb", (0,)), ("A30-24GB", "2g.12gb", ()),
]


@pytest.mark.parametrize("model,profile,want", DOMINATED)
def test_dominated_starts(model: str, profile: str, want: tuple[int, ...]) -> None:
    geom = get_model(model).mig
    assert geom is not None
    assert dominated_starts(geom, profile) == want


def test_placement_key_order() -> None:
    # On an empty GPU a 3g at 4 keeps all compute reachable; at 0 it strands one.
    assert placement_key(H100, [], "3g.40gb", 4) < placement_key(H100, [], "3g.40gb", 0)
    # Best fit by GPU: the fuller GPU first.
    fuller = s(*[("1g.10gb", i) for i in range(5)])
    assert placement_key(H100, fuller, "1g.10gb", 5) < placement_key(H100, [], "1g.10gb", 0)
    # Compute lost outranks fullness: beside a 3g at 4 a second 3g at 0 strands a slice.
    busy = s(("3g.40gb", 4))
    assert placement_key(H100, [], "3g.40gb", 4) < placement_key(H100, busy, "3g.40gb", 0)
    # Of equal fullness, the placement that keeps the larger run.
    one = s(("1g.10gb", 0))
    assert placement_key(H100, one, "1g.10gb", 1) < placement_key(H100, one, "1g.10gb", 4)
