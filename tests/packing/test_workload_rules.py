"""WorkloadRules.of: the one place the score's workload terms are built (the extender's
scorer and the openb replay both call it), and the replay's switches for comparisons."""

from __future__ import annotations

import numpy as np
import pytest

from packing.fragmentation import ShapeKey, TypicalShapes, make_shapes
from packing.policies.lookahead import (
    CapacityModel,
    CoreDeficitRule,
    FreshGpuRule,
    GpupackWeights,
    KeepCoresRule,
    SliverRule,
    WorkloadRules,
    workload_weights,
)


def _key(cpu: int, k: int, milli: int) -> ShapeKey:
    return ShapeKey(cpu_milli=cpu, num_gpu=k, gpu_milli=milli, gpu_spec=frozenset())


def _counts(cap: CapacityModel, shapes: TypicalShapes) -> bool:
    """Whether ``cap`` weighs the demand of ``shapes`` (per shape, on model 0)."""
    want = CapacityModel(shapes).weights([0])
    got = cap.weights([0])
    return got.shape == want.shape and bool(np.allclose(got, want))


def _mix(*rows: tuple[int, int, int, float]) -> TypicalShapes:
    return make_shapes([(_key(c, k, m), p) for c, k, m, p in rows], ("G2",))


# (name, shapes): whole-GPU heavy with shares (sliver price on), share heavy (fresh-GPU
# rule on), cpu-bound (no level, no deficit price).
MIXES = [
    ("whole-heavy", _mix((8_000, 1, 1000, 0.5), (4_000, 1, 810, 0.2),
                         (4_000, 1, 230, 0.1), (8_000, 0, 0, 0.2))),
    ("share-heavy", _mix((4_000, 1, 700, 0.5), (4_000, 1, 250, 0.3), (8_000, 0, 0, 0.2))),
    ("cpu-bound", _mix((4_000, 1, 1000, 0.2), (32_000, 0, 0, 0.8))),
]


@pytest.mark.parametrize(("name", "shapes"), MIXES)
def test_of_builds_each_rule_from_the_workload_weights(name: str,
                                                       shapes: TypicalShapes) -> None:
    rules = WorkloadRules.of(shapes)
    w = workload_weights(shapes)
    assert rules.weights == w
    assert rules.fresh == FreshGpuRule.of(shapes)
    assert rules.keep == KeepCoresRule.of(shapes)
    assert rules.deficit == CoreDeficitRule.of(shapes, w)
    assert rules.sliver == SliverRule.of(shapes, w)
    assert _counts(rules.cap, shapes)


def test_the_mixes_switch_different_rules_on() -> None:
    # Without this the table above could pass with every rule off.
    on = {name: WorkloadRules.of(s) for name, s in MIXES}
    assert on["whole-heavy"].sliver is not None and on["whole-heavy"].sliver.active
    assert on["share-heavy"].fresh is not None and on["share-heavy"].fresh.active
    assert on["cpu-bound"].weights.levels is None
    assert on["whole-heavy"].weights.levels is not None


# Whole-GPU heavy (w ~0.55, above FRESH_GPU_GATE) with an 810 share and no share small
# enough for the sliver price's floor to matter: the price is off (w < SLIVER_GATE), so
# the fresh-GPU rule takes its clean-node form.
CLEAN = _mix((8_000, 1, 1000, 0.4), (4_000, 1, 810, 0.3), (4_000, 1, 470, 0.1),
             (8_000, 0, 0, 0.2))


def test_the_clean_node_form_is_on_only_where_the_sliver_price_is_off() -> None:
    on = WorkloadRules.of(CLEAN)
    assert on.fresh is not None and on.fresh.active and on.fresh.clean_nodes
    assert on.sliver is not None and not on.sliver.active
    assert on.fresh == FreshGpuRule.of(CLEAN, clean_nodes=True)
    # Off where whole nodes are kept for LLM groups (an idle node is clean), with
    # fresh_clean False, and without the FGD level; the other rules stay as they were.
    for rules in (WorkloadRules.of(CLEAN, keep_whole_nodes=True),
                  WorkloadRules.of(CLEAN, fresh_clean=False),
                  WorkloadRules.of(CLEAN, GpupackWeights(levels=None))):
        assert rules.fresh is not None and not rules.fresh.active
        assert rules.keep == on.keep
    # Dropping the sliver term for a comparison does not turn the form on where the
    # price would be on (whole-heavy: sliver price on).
    whole = MIXES[0][1]
    assert WorkloadRules.of(whole).sliver.active  # type: ignore[union-attr]
    for rules in (WorkloadRules.of(whole), WorkloadRules.of(whole, sliver=False)):
        assert rules.fresh is not None and not rules.fresh.active
    # Share heavy: the plain form, whether whole nodes are kept or not.
    for kept in (False, True):
        plain = WorkloadRules.of(MIXES[1][1], keep_whole_nodes=kept).fresh
        assert plain is not None and plain.active and not plain.clean_nodes


@pytest.mark.parametrize("flag", ["fresh", "keep", "deficit", "sliver"])
def test_a_switch_drops_its_rule_only(flag: str) -> None:
    shapes = MIXES[0][1]
    full = WorkloadRules.of(shapes)
    without = WorkloadRules.of(shapes, **{flag: False})
    assert getattr(without, flag) is None
    for other in {"fresh", "keep", "deficit", "sliver"} - {flag}:
        assert getattr(without, other) == getattr(full, other)


def test_without_the_cpu_bound_cost_the_weights_are_the_callers() -> None:
    shapes = MIXES[2][1]
    mine = GpupackWeights(levels=300)
    assert WorkloadRules.of(shapes, mine).weights.levels is None
    assert WorkloadRules.of(shapes, mine, cpu_bound_cost=False).weights == mine


def test_cap_shapes_choose_what_capacity_counts() -> None:
    shapes, other = MIXES[0][1], MIXES[1][1]
    cap = WorkloadRules.of(shapes, cap_shapes=other).cap
    assert _counts(cap, other) and not _counts(cap, shapes)
