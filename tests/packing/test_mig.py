"""MIG layouts: validity, free starts, maximal layouts (tables and Hypothesis properties)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from packing.catalog import CATALOG, MigGeometry, get_model
from packing.mig.layout import (
    MigSlot,
    fewest_layouts,
    free_starts,
    is_valid_layout,
    layout_errors,
    layout_from_counts,
    maximal_layouts,
    memory_range,
    slice_bound,
    used_slices,
)
from packing.model import MigInstance


def geometry_of(model: str) -> MigGeometry:
    geometry = get_model(model).mig
    assert geometry is not None
    return geometry


A100 = geometry_of("A100-40GB")
H100 = geometry_of("H100-80GB")
A30 = geometry_of("A30-24GB")
A100_CLASSIC = ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
A30_CLASSIC = ("1g.6gb", "2g.12gb", "4g.24gb")

# One entry per distinct geometry (H20 shares H100-96GB's).
GEOMETRIES: dict[str, MigGeometry] = {}
for _model in CATALOG.values():
    if _model.mig is not None and _model.mig not in GEOMETRIES.values():
        GEOMETRIES[_model.name] = _model.mig


def slots(text: str) -> list[MigSlot]:
    """``"3g.20gb@0 1g.5gb@6"`` -> slots."""
    out = []
    for item in text.split():
        profile, start = item.split("@")
        out.append(MigSlot(profile, int(start)))
    return out


# --- tables ---------------------------------------------------------------------------


def test_slot_order_and_str() -> None:
    assert sorted(slots("2g.10gb@4 1g.5gb@6 1g.5gb@0")) == slots("1g.5gb@0 1g.5gb@6 2g.10gb@4")
    assert str(MigSlot("3g.20gb", 4)) == "3g.20gb@4"


@pytest.mark.parametrize(
    ("geometry", "slot", "expected"),
    [
        (A100, MigSlot("1g.5gb", 6), range(6, 7)),
        (A100, MigSlot("1g.10gb", 6), range(6, 8)),
        (A100, MigSlot("3g.20gb", 4), range(4, 8)),
        (A100, MigSlot("7g.40gb", 0), range(0, 8)),
        (A30, MigSlot("2g.12gb", 2), range(2, 4)),
    ],
)
def test_memory_range(geometry: MigGeometry, slot: MigSlot, expected: range) -> None:
    assert memory_range(geometry, slot) == expected


def test_memory_range_unknown_profile() -> None:
    with pytest.raises(KeyError):
        memory_range(A30, MigSlot("1g.5gb", 0))


@pytest.mark.parametrize(
    ("geometry", "layout", "expected"),
    [
        (A100, "", (0, 0)),
        (A100, "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 1g.5gb@4 1g.5gb@5 1g.5gb@6", (7, 7)),
        (A100, "3g.20gb@0 3g.20gb@4", (6, 8)),  # 3g + 3g: one compute slice idle
        (A100, "4g.20gb@0 3g.20gb@4", (7, 8)),
        (A100, "1g.10gb@0 1g.10gb@2 1g.10gb@4 1g.10gb@6", (4, 8)),
        (A30, "2g.12gb@0 1g.6gb@2 1g.6gb@3", (4, 4)),
    ],
)
def test_used_slices(geometry: MigGeometry, layout: str, expected: tuple[int, int]) -> None:
    assert used_slices(geometry, slots(layout)) == expected


# Layouts from the reference (A100-40GB, classic profiles) and the mig-parted defaults.
VALID = [
    (A100, ""),
    (A100, "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 1g.5gb@4 1g.5gb@5 1g.5gb@6"),
    (A100, "3g.20gb@0 3g.20gb@4"),
    (A100, "4g.20gb@0 2g.10gb@4 1g.5gb@6"),
    (A100, "2g.10gb@0 2g.10gb@2 2g.10gb@4 1g.5gb@6"),
    (A100, "3g.20gb@0 2g.10gb@4 1g.5gb@6"),
    (A100, "7g.40gb@0"),
    (A100, "1g.5gb+me@3 1g.10gb@0 3g.20gb@4"),
    (A100, "1g.10gb@0 1g.10gb@2 1g.10gb@4 1g.10gb@6"),
    (H100, "1g.10gb@0 1g.10gb@1 2g.20gb@2 3g.40gb@4"),  # all-balanced
    (A30, "1g.6gb@0 1g.6gb@1 2g.12gb@2"),  # all-balanced on A30
    (A30, "2g.12gb+me@0 1g.6gb@2 1g.6gb@3"),
    (A30, "4g.24gb@0"),
]


@pytest.mark.parametrize(("geometry", "layout"), VALID)
def test_valid_layouts(geometry: MigGeometry, layout: str) -> None:
    assert layout_errors(geometry, slots(layout)) == []
    assert is_valid_layout(geometry, slots(layout))


# Hand-made invalid layouts: (layout, words every error line set must contain).
INVALID = [
    (A100, "3g.20gb@0 4g.20gb@0", ["3g.20gb@0 overlaps 4g.20gb@0 on memory slices 0-3"]),
    (A100, "1g.5gb@0 1g.5gb@0", ["1g.5gb@0 overlaps 1g.5gb@0"]),
    (A100, "2g.10gb@0 1g.5gb@1", ["2g.10gb@0 overlaps 1g.5gb@1 on memory slices 1"]),
    (A100, "3g.20gb@4 1g.10gb@6", ["3g.20gb@4 overlaps 1g.10gb@6 on memory slices 6-7"]),
    (A100, "3g.20gb@2", ["3g.20gb@2: start 2 not allowed", "allowed starts: 0, 4"]),
    (A100, "1g.5gb@7", ["1g.5gb@7: start 7 not allowed"]),  # slice 7 is not 1g's
    (A100, "2g.10gb@6", ["2g.10gb@6: start 6 not allowed"]),
    (A100, "4g.20gb@4", ["4g.20gb@4: start 4 not allowed"]),
    (A100, "7g.40gb@1", ["7g.40gb@1: start 1 not allowed"]),
    (A100, "1g.10gb@1", ["1g.10gb@1: start 1 not allowed"]),
    (A100, "1g.5gb@-1", ["1g.5gb@-1: start -1 not allowed"]),
    (A100, "1g.5gb+me@0 1g.5gb+me@1", ["more than one +me instance: 1g.5gb+me@0, 1g.5gb+me@1"]),
    (A30, "1g.6gb+me@0 2g.12gb+me@2", ["more than one +me instance: 1g.6gb+me@0, 2g.12gb+me@2"]),
    (A100, "1g.6gb@0", ["1g.6gb@0: unknown profile", "1g.5gb"]),
    (A30, "3g.20gb@0 1g.6gb@3", ["3g.20gb@0: unknown profile"]),
    (A100, "7g.40gb@0 1g.5gb@0", ["7g.40gb@0 overlaps 1g.5gb@0", "compute slices 8 exceed"]),
    (A30, "4g.24gb@0 4g.24gb@0", ["2 x 4g.24gb exceeds the maximum of 1"]),
]


@pytest.mark.parametrize(("geometry", "layout", "words"), INVALID)
def test_invalid_layouts(geometry: MigGeometry, layout: str, words: list[str]) -> None:
    errors = layout_errors(geometry, slots(layout))
    assert errors
    assert not is_valid_layout(geometry, slots(layout))
    text = "\n".join(errors)
    for word in words:
        assert word in text, (word, errors)


def test_error_names_each_slot() -> None:
    errors = layout_errors(A100, slots("3g.20gb@2 1g.5gb@7 2g.10gb@0 1g.5gb@1"))
    assert any("3g.20gb@2" in e and "start" in e for e in errors)
    assert any("1g.5gb@7" in e and "start" in e for e in errors)
    assert any("2g.10gb@0 overlaps 1g.5gb@1" in e for e in errors)


def test_max_count_and_compute_checked_beyond_catalog_tables() -> None:
    """A geometry where neither rule follows from overlap still gets both checked."""
    from packing.catalog import MigProfile

    geometry = MigGeometry(
        compute_slices=2,
        memory_slices=4,
        profiles=(MigProfile("1g.1gb", 1, 1, 1024, (0, 1, 2, 3), 2, False),),
    )
    layout = slots("1g.1gb@0 1g.1gb@1 1g.1gb@2")
    text = "\n".join(layout_errors(geometry, layout))
    assert "3 x 1g.1gb exceeds the maximum of 2 per GPU: 1g.1gb@0, 1g.1gb@1, 1g.1gb@2" in text
    assert "compute slices 3 exceed the GPU's 2" in text
    assert free_starts(geometry, layout[:2], "1g.1gb") == ()
    assert free_starts(geometry, layout[:1], "1g.1gb") == (1, 2, 3)


def test_accepts_model_instances() -> None:
    layout = [MigInstance("3g.20gb", 0, owner="ns/a"), MigInstance("2g.10gb", 4)]
    assert is_valid_layout(A100, layout)
    assert free_starts(A100, layout, "1g.5gb") == (6,)
    assert used_slices(A100, layout) == (5, 6)


@pytest.mark.parametrize(
    ("geometry", "layout", "profile", "expected"),
    [
        (A100, "", "1g.5gb", (0, 1, 2, 3, 4, 5, 6)),
        (A100, "", "3g.20gb", (0, 4)),
        (A100, "3g.20gb@4", "3g.20gb", (0,)),
        (A100, "3g.20gb@4", "4g.20gb", (0,)),
        (A100, "3g.20gb@0", "4g.20gb", ()),
        (A100, "1g.5gb@6", "7g.40gb", ()),
        (A100, "1g.5gb@0", "2g.10gb", (2, 4)),
        (A100, "1g.5gb@0", "1g.10gb", (2, 4, 6)),
        (A100, "1g.5gb+me@0", "1g.5gb+me", ()),
        (A100, "1g.5gb+me@0", "1g.5gb", (1, 2, 3, 4, 5, 6)),
        (A100, "3g.20gb@0 3g.20gb@4", "1g.5gb", ()),
        (A100, "", "1g.6gb", ()),  # not an A100 profile
        (A100, "3g.20gb@0 4g.20gb@0", "1g.5gb", ()),  # invalid layout stays invalid
        (A30, "1g.6gb@1", "2g.12gb", (2,)),
        (A30, "2g.12gb+me@0", "1g.6gb+me", ()),
    ],
)
def test_free_starts_table(
    geometry: MigGeometry, layout: str, profile: str, expected: tuple[int, ...]
) -> None:
    assert free_starts(geometry, slots(layout), profile) == expected


# --- maximal layouts ------------------------------------------------------------------

DOC_EXAMPLES = [
    "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 1g.5gb@4 1g.5gb@5 1g.5gb@6",
    "3g.20gb@0 3g.20gb@4",
    "4g.20gb@0 2g.10gb@4 1g.5gb@6",
    "2g.10gb@0 2g.10gb@2 2g.10gb@4 1g.5gb@6",
    "3g.20gb@0 2g.10gb@4 1g.5gb@6",
]


def test_a100_40gb_classic_has_19_maximal_layouts() -> None:
    layouts = maximal_layouts(A100, A100_CLASSIC)
    assert len(layouts) == 19
    for example in DOC_EXAMPLES:
        assert tuple(sorted(slots(example))) in layouts, example
    # Drivers before R510 refused 4g + 3g: 18 layouts without that pair.
    with_4g_3g = [
        layout for layout in layouts if {"4g.20gb", "3g.20gb"} <= {slot.profile for slot in layout}
    ]
    assert len(layouts) - len(with_4g_3g) == 18


def test_a30_has_5_maximal_layouts() -> None:
    layouts = maximal_layouts(A30, A30_CLASSIC)
    assert len(layouts) == 5
    assert tuple(sorted(slots("2g.12gb@0 2g.12gb@2"))) in layouts
    assert tuple(sorted(slots("4g.24gb@0"))) in layouts
    assert tuple(sorted(slots("1g.6gb@0 1g.6gb@1 1g.6gb@2 1g.6gb@3"))) in layouts


def test_maximal_layouts_default_is_classic_and_deterministic() -> None:
    default = maximal_layouts(A100)
    assert default == maximal_layouts(A100, [p.name for p in A100.classic])
    assert default == maximal_layouts(A100, reversed([p.name for p in A100.classic]))
    assert list(default) == sorted(default)
    assert all(list(layout) == sorted(layout) for layout in default)
    assert not any(slot.profile.endswith("+me") for layout in default for slot in layout)


def test_maximal_layouts_edge_cases() -> None:
    assert maximal_layouts(A100, []) == ((),)
    assert maximal_layouts(A100, ["7g.40gb"]) == ((MigSlot("7g.40gb", 0),),)
    with pytest.raises(KeyError):
        maximal_layouts(A100, ["1g.6gb"])
    # A lone 1g can never use memory slice 7: the best 1g-only layout leaves it idle.
    assert maximal_layouts(A100, ["1g.5gb"]) == (tuple(MigSlot("1g.5gb", i) for i in range(7)),)


@pytest.mark.parametrize("name", list(GEOMETRIES))
@pytest.mark.parametrize("which", ["classic", "all"])
def test_every_maximal_layout_is_valid_and_maximal(name: str, which: str) -> None:
    geometry = GEOMETRIES[name]
    names = (
        [p.name for p in geometry.classic]
        if which == "classic"
        else [p.name for p in geometry.profiles]
    )
    layouts = maximal_layouts(geometry, names)
    assert layouts
    assert len(set(layouts)) == len(layouts)
    for layout in layouts:
        assert layout_errors(geometry, layout) == []
        for profile in names:
            assert free_starts(geometry, layout, profile) == (), (layout, profile)


# --- layout_from_counts ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("geometry", "counts", "expected"),
    [
        (A100, {}, ""),
        (A100, {"3g.20gb": 1}, "3g.20gb@4"),  # a lone 3g belongs at start 4
        (A100, {"3g.20gb": 1, "4g.20gb": 1}, "4g.20gb@0 3g.20gb@4"),
        (A100, {"3g.20gb": 2}, "3g.20gb@0 3g.20gb@4"),
        (A100, {"1g.5gb": 7}, "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 1g.5gb@4 1g.5gb@5 1g.5gb@6"),
        (H100, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, None),
        (A30, {"1g.6gb": 2, "2g.12gb": 1}, None),
        (A100, {"1g.5gb": 8}, "-"),
        (A100, {"1g.5gb": 6, "2g.10gb": 1}, "-"),  # 2g needs an even start: slice 7 lost
        (A100, {"1g.5gb+me": 2}, "-"),
        (A100, {"7g.40gb": 1, "1g.5gb": 1}, "-"),
    ],
)
def test_layout_from_counts(
    geometry: MigGeometry, counts: dict[str, int], expected: str | None
) -> None:
    layout = layout_from_counts(geometry, counts)
    if expected == "-":
        assert layout is None
        return
    assert layout is not None
    assert is_valid_layout(geometry, layout)
    assert Counter(s.profile for s in layout) == Counter(counts)
    if expected is not None:
        assert layout == tuple(sorted(slots(expected)))


def test_layout_from_counts_accepts_pairs_and_rejects_unknown() -> None:
    assert layout_from_counts(A30, [("2g.12gb", 2)]) == tuple(slots("2g.12gb@0 2g.12gb@2"))
    with pytest.raises(KeyError):
        layout_from_counts(A30, {"1g.5gb": 1})


# --- properties -----------------------------------------------------------------------

geometry_names = st.sampled_from(sorted(GEOMETRIES))


@st.composite
def random_slots(draw: st.DrawFn, geometry: MigGeometry) -> list[MigSlot]:
    """Arbitrary (mostly invalid) layouts, with the odd unknown profile or wild start."""
    names = [*geometry.profile_names, "9g.99gb"]
    starts = st.integers(-1, geometry.memory_slices)
    return draw(
        st.lists(st.builds(MigSlot, st.sampled_from(names), starts), max_size=6),
    )


@st.composite
def grown_layout(draw: st.DrawFn, geometry: MigGeometry) -> list[MigSlot]:
    """A layout grown by adding instances at random free starts (always valid)."""
    layout: list[MigSlot] = []
    for _ in range(draw(st.integers(0, 10))):
        profile = draw(st.sampled_from(geometry.profile_names))
        starts = free_starts(geometry, layout, profile)
        if starts:
            layout.append(MigSlot(profile, draw(st.sampled_from(starts))))
    return layout


def brute_force_free_starts(
    geometry: MigGeometry, layout: list[MigSlot], profile: str
) -> tuple[int, ...]:
    return tuple(
        start
        for start in range(geometry.memory_slices)
        if not layout_errors(geometry, [*layout, MigSlot(profile, start)])
    )


@settings(max_examples=300)
@given(st.data(), geometry_names)
def test_free_starts_matches_brute_force(data: st.DataObject, name: str) -> None:
    geometry = GEOMETRIES[name]
    layout = data.draw(st.one_of(random_slots(geometry), grown_layout(geometry)))
    profile = data.draw(st.sampled_from([*geometry.profile_names, "9g.99gb"]))
    assert free_starts(geometry, layout, profile) == brute_force_free_starts(
        geometry, layout, profile
    )


@settings(max_examples=300)
@given(st.data(), geometry_names)
def test_growing_at_free_starts_stays_valid(data: st.DataObject, name: str) -> None:
    geometry = GEOMETRIES[name]
    layout: list[MigSlot] = []
    for _ in range(data.draw(st.integers(0, 12))):
        profile = data.draw(st.sampled_from(geometry.profile_names))
        starts = free_starts(geometry, layout, profile)
        if not starts:
            continue
        layout.append(MigSlot(profile, data.draw(st.sampled_from(starts))))
        assert layout_errors(geometry, layout) == []
        compute, memory = used_slices(geometry, layout)
        assert compute <= geometry.compute_slices and memory <= geometry.memory_slices


# No deadline: the first example of each geometry fills maximal_layouts' cache, which
# takes longer than the default 200 ms on a loaded machine (a flaky failure, not a bug).
@settings(max_examples=200, deadline=None)
@given(st.data(), geometry_names)
def test_every_valid_layout_extends_to_a_listed_maximal_one(data: st.DataObject, name: str) -> None:
    """maximal_layouts is complete: fill any grown layout and it is in the list."""
    geometry = GEOMETRIES[name]
    names = list(geometry.profile_names)
    layout = data.draw(grown_layout(geometry))
    while True:
        open_profiles = [p for p in names if free_starts(geometry, layout, p)]
        if not open_profiles:
            break
        profile = data.draw(st.sampled_from(open_profiles))
        start = data.draw(st.sampled_from(free_starts(geometry, layout, profile)))
        layout.append(MigSlot(profile, start))
    assert tuple(sorted(layout)) in maximal_layouts(geometry, names)


@settings(max_examples=200)
@given(st.data(), geometry_names)
def test_layout_from_counts_finds_every_feasible_count(data: st.DataObject, name: str) -> None:
    geometry = GEOMETRIES[name]
    layout = data.draw(grown_layout(geometry))
    counts = Counter(s.profile for s in layout)
    found = layout_from_counts(geometry, dict(counts))
    assert found is not None
    assert is_valid_layout(geometry, found)
    assert Counter(s.profile for s in found) == counts


@settings(max_examples=300)
@given(st.data(), geometry_names)
def test_validity_agrees_with_the_rules(data: st.DataObject, name: str) -> None:
    """layout_errors is empty exactly when a direct reading of the rules says valid."""
    geometry = GEOMETRIES[name]
    layout = data.draw(random_slots(geometry))

    def valid() -> bool:
        if any(not geometry.has_profile(s.profile) for s in layout):
            return False
        profiles = [geometry.profile(s.profile) for s in layout]
        if any(s.start not in p.starts for s, p in zip(layout, profiles, strict=True)):
            return False
        cells = [i for s in layout for i in memory_range(geometry, s)]
        if len(cells) != len(set(cells)):
            return False
        if sum(p.media_extensions for p in profiles) > 1:
            return False
        if any(
            n > geometry.profile(p).max_count for p, n in Counter(s.profile for s in layout).items()
        ):
            return False
        return sum(p.compute_slices for p in profiles) <= geometry.compute_slices

    assert (layout_errors(geometry, layout) == []) == valid()


@pytest.mark.parametrize(("compute", "memory", "gpus"), [
    (0, 0, 0), (7, 7, 1), (7, 8, 1), (8, 1, 2), (1, 9, 2), (21, 24, 3), (22, 24, 4),
])
def test_slice_bound_is_the_larger_of_compute_and_memory(compute: int, memory: int,
                                                         gpus: int) -> None:
    # H100/A100: 7 compute and 8 memory slices per GPU.
    assert slice_bound(geometry_of("H100-80GB"), compute, memory) == gpus


# --- fewest_layouts: the slice bound with the layout rules kept -------------------------


@pytest.mark.parametrize(("counts", "gpus"), [
    ({}, 0),
    ({"1g.10gb": 0}, 0),
    ({"3g.40gb": 2}, 1),
    ({"3g.40gb": 3}, 2),  # at most two 3g per GPU
    ({"3g.40gb": 1, "2g.20gb": 2}, 1),  # 2g@0 2g@2 3g@4: all 7 compute slices
    ({"2g.20gb": 3, "1g.10gb": 1}, 1),
    ({"2g.20gb": 4}, 2),
    ({"1g.10gb": 7, "2g.20gb": 1}, 2),
    ({"4g.40gb": 3}, 3),  # 12 of 21 compute slices, but one 4g per GPU: above slice_bound
    ({"3g.40gb": 3, "1g.10gb": 1}, 2),
])
def test_fewest_layouts_table(counts: dict[str, int], gpus: int) -> None:
    assert len(fewest_layouts(H100, counts)) == gpus


def test_fewest_layouts_rejects_unknown_profiles_and_negative_counts() -> None:
    with pytest.raises(KeyError, match=r"9g\.90gb"):
        fewest_layouts(H100, {"9g.90gb": 1})
    with pytest.raises(ValueError, match="negative"):
        fewest_layouts(H100, {"1g.10gb": 2, "2g.20gb": -1})


def covers(geometry: MigGeometry, layouts: tuple[tuple[MigSlot, ...], ...],
           counts: dict[str, int]) -> bool:
    held = Counter(s.profile for layout in layouts for s in layout)
    return all(held[p] >= k for p, k in counts.items())


@settings(max_examples=150, deadline=None)
@given(st.data(), geometry_names)
def test_fewest_layouts_are_valid_cover_and_are_fewest(data: st.DataObject, name: str) -> None:
    geometry = GEOMETRIES[name]
    profiles = [p.name for p in geometry.classic]
    counts = {p: data.draw(st.integers(0, 2), label=p) for p in profiles}
    assume(sum(counts.values()) <= 5)  # keeps the brute force below small
    layouts = fewest_layouts(geometry, counts)
    assert all(layout_errors(geometry, layout) == [] for layout in layouts)
    assert covers(geometry, layouts, counts)
    compute = sum(geometry.profile(p).compute_slices * k for p, k in counts.items())
    memory = sum(geometry.profile(p).memory_slices * k for p, k in counts.items())
    assert len(layouts) >= slice_bound(geometry, compute, memory)
    # Fewest: no smaller multiset of maximal layouts covers the counts.
    options = maximal_layouts(geometry)
    for k in range(len(layouts)):
        assert not any(covers(geometry, pick, counts)
                       for pick in itertools.combinations_with_replacement(options, k))
