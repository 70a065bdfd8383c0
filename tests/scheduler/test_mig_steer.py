"""Steering the DRA allocator off idle DynamicMIG GPUs (``scheduler.mig.compact.steer``):
a table of node shapes, a property over random layouts (no pod that fits a node without
the fences is kept off it by them, and the first fit of a fenced profile lands on a GPU
in MIG mode), and the decision carries the steer set."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.catalog import get_model
from packing.mig.layout import MigSlot, free_starts
from packing.model import MigReconfigure
from scheduler.mig.compact.decide import CompactSettings, CompactState, decide_compaction
from scheduler.mig.compact.steer import room, steer_fences
from scheduler.mig.decide import GpuView, NodeView

H100 = "H100-80GB"
GEOM = get_model(H100).mig
assert GEOM is not None


def idle(i: int, model: str = H100, dynamic: bool = True) -> GpuView:
    return GpuView(i, model, False, dynamic=dynamic)


def whole_pod(i: int) -> GpuView:
    return GpuView(i, H100, False, holders=frozenset({"ns/whole"}), dynamic=True)


def mig(i: int, *slots: tuple[str, int], model: str = H100) -> GpuView:
    layout = tuple(MigSlot(p, s) for p, s in slots)
    return GpuView(i, model, True, layout, (),
                   frozenset(f"ns/p{i}-{s}" for _, s in slots), dynamic=True)


def node(*gpus: GpuView, name: str = "a", unschedulable: bool = False) -> NodeView:
    return NodeView(name, MigReconfigure.ON, gpus, unschedulable)


def profiles_of(steer: tuple[tuple[str, int, str], ...], gpu: int) -> set[str]:
    return {p for _, g, p in steer if g == gpu}


# A GPU in MIG mode holding a 3g.40gb at 4 and a 1g.10gb at 0: room for three 1g.10gb
# (memory slices 1-3), one 1g.20gb or 2g.20gb (at 2), the +me once; no 3g (slices 0-3
# partly used), no 4g, no 7g.
BUSY = mig(5, ("3g.40gb", 4), ("1g.10gb", 0))
FULL = mig(6, ("3g.40gb", 4), ("4g.40gb", 0))


@pytest.mark.parametrize(("nodes", "margin", "want"), [
    # idle GPUs of lower index than the open GPU: every profile it has room for
    ([node(idle(0), idle(1), BUSY)], 1,
     {0: {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb"},
      1: {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb"}}),
    # an idle GPU after the open one comes later in the allocator's order: left alone
    ([node(BUSY, idle(7))], 1, {}),
    # the open GPU full: nothing to steer to
    ([node(idle(0), FULL)], 1, {}),
    # a whole-GPU pod's GPU is not idle; the other idle one is steered
    ([node(whole_pod(0), idle(1), BUSY)], 1,
     {1: {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb"}}),
    # margin 2: only the profiles with room for two more (1g.10gb: at 1 and 2)
    ([node(idle(0), BUSY)], 2, {0: {"1g.10gb"}}),
    ([node(idle(0), BUSY)], 0, {}),
    # an unschedulable node is left alone; GPUs the MIG manager lays are not DynamicMIG
    ([node(idle(0), BUSY, unschedulable=True)], 1, {}),
    ([node(idle(0, dynamic=False), BUSY)], 1, {}),
    # an open GPU with an empty layout (an A100 kept in MIG mode) has room for all
    ([node(idle(0, "A100-80GB"), mig(3, model="A100-80GB"))], 1,
     {0: set(get_model("A100-80GB").mig.profile_names)}),  # type: ignore[union-attr]
])
def test_steer_table(nodes: list[NodeView], margin: int, want: dict[int, set[str]]) -> None:
    got = steer_fences(nodes, (), margin)
    assert {g: profiles_of(got, g) for g in {g for _, g, _ in got}} == want


def test_a_drained_gpu_has_no_room_to_steer_to() -> None:
    assert steer_fences([node(idle(0), BUSY)], {("a", 5)}) == ()


def test_room_counts_first_fits() -> None:
    assert room(GEOM, [], "1g.10gb") == 7
    assert room(GEOM, [], "3g.40gb") == 2
    assert room(GEOM, BUSY.layout, "3g.40gb") == 0
    assert room(GEOM, BUSY.layout, "1g.10gb") == 3  # memory slices 1-3; compute 4 + 3 = 7
    assert room(GEOM, FULL.layout, "1g.10gb") == 0


PROFILES = [p.name for p in GEOM.profiles]


@st.composite
def gpus(draw: st.DrawFn) -> list[GpuView]:
    """Up to 8 H100s: idle, holding a whole-GPU pod, or in MIG mode with random
    instances placed one at a time at a free start (a valid layout)."""
    out = []
    for i in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["idle", "whole", "mig"]))
        if kind == "idle":
            out.append(idle(i))
        elif kind == "whole":
            out.append(whole_pod(i))
        else:
            slots: list[MigSlot] = []
            for p in draw(st.lists(st.sampled_from(PROFILES), max_size=6)):
                starts = free_starts(GEOM, slots, p)
                if starts:
                    slots.append(MigSlot(p, draw(st.sampled_from(starts))))
            out.append(mig(i, *((s.profile, s.start) for s in slots)))
    return out


@settings(max_examples=200, deadline=None)
@given(gpus(), st.integers(1, 3), st.integers(0, 3), st.sets(st.sampled_from(PROFILES)))
def test_no_fit_is_lost_and_first_fit_is_in_mig_mode(gs: list[GpuView], margin: int,
                                                     keep: int, up_profiles: set[str]
                                                     ) -> None:
    """Walk the node in the allocator's order (GPU index, then start) for every profile:
    where some GPU has a free start without the fences, one is left with them, and when
    the profile is steered the first one left is on a GPU in MIG mode. With fences up
    already (``up_profiles`` on every idle GPU) and a keep below the margin, the same
    holds, the room of a steered profile is at least the keep, and the fences are a
    superset of those without the keep rule (it only keeps fences up longer)."""
    up = {("a", g.index, p) for g in gs for p in up_profiles}
    plain = set(steer_fences([node(*gs)], (), margin))
    steer = set(steer_fences([node(*gs)], (), margin, keep, up))
    assert plain <= steer
    least = keep if 0 < keep < margin else margin
    def fits(g: GpuView, p: str) -> bool:
        if g.holders and not g.mig_enabled:
            return False  # a whole-GPU pod's
        return bool(free_starts(GEOM, g.layout, p))

    for p in PROFILES:
        before = [g for g in gs if fits(g, p)]
        after = [g for g in before if ("a", g.index, p) not in steer]
        assert bool(before) == bool(after)
        if any(("a", g.index, p) in steer for g in gs):
            assert after[0].mig_enabled
            have = sum(room(GEOM, g.layout, p) for g in gs if g.mig_enabled)
            assert have >= (least if p in up_profiles else margin)
        # never a GPU in MIG mode or one a pod holds
        assert all(not g.mig_enabled and not g.holders for g in gs
                   if ("a", g.index, p) in steer)


def test_the_decision_carries_the_steer_set() -> None:
    cs = CompactState((node(idle(0), BUSY),), {}, (), (), frozenset(), (), {})
    d = decide_compaction(cs, 0.0, CompactSettings())
    assert profiles_of(d.steer, 0) == {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb"}
    off = decide_compaction(cs, 0.0, CompactSettings(dynamic_steer_margin=0))
    assert off.steer == ()
    # a node with a MIG change in flight (or not opted in) is not steered
    changing = CompactState((node(idle(0), BUSY),), {}, (), (), frozenset({"a"}), (), {})
    assert decide_compaction(changing, 0.0, CompactSettings()).steer == ()


@pytest.mark.parametrize(("margin", "keep", "up", "want"), [
    # margin 2 alone: only 1g.10gb (room 3) goes up; 2g.20gb (room 1) does not
    (2, 0, set(), {"1g.10gb"}),
    # 2g.20gb's fences up already: kept at room 1 with keep 1, not with keep 0 (= margin)
    (2, 1, {"2g.20gb"}, {"1g.10gb", "2g.20gb"}),
    (2, 0, {"2g.20gb"}, {"1g.10gb"}),
    # keep above the margin means the margin; a keep never raises fences not up
    (2, 5, {"2g.20gb"}, {"1g.10gb"}),
    (2, 1, set(), {"1g.10gb"}),
    # fences up for a profile the GPUs in MIG mode have no room for (3g) are lifted
    (2, 1, {"3g.40gb"}, {"1g.10gb"}),
])
def test_keep_rule(margin: int, keep: int, up: set[str], want: set[str]) -> None:
    got = steer_fences([node(idle(0), BUSY)], (), margin, keep, {("a", 0, p) for p in up})
    assert profiles_of(got, 0) == want


def test_the_decision_keeps_the_fences_up_it_is_told_of() -> None:
    settings_ = CompactSettings(dynamic_steer_margin=2, dynamic_steer_keep=1)
    cs = CompactState((node(idle(0), BUSY),), {}, (), (), frozenset(), (), {})
    assert profiles_of(decide_compaction(cs, 0.0, settings_).steer, 0) == {"1g.10gb"}
    up = CompactState((node(idle(0), BUSY),), {}, (), (), frozenset(), (), {},
                      frozenset({("a", 0, "2g.20gb")}))
    assert profiles_of(decide_compaction(up, 0.0, settings_).steer, 0) == {"1g.10gb",
                                                                           "2g.20gb"}
