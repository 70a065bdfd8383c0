"""WorkloadRules.of: the one place the score's workload terms are built (the extender's
scorer and the openb replay both call it), and the replay's switches for comparisons."""

from __future__ import annotations

import numpy as np
import pytest

from packing.fragmentation import ShapeKey, TypicalShapes, make_shapes
from packing.policies.lookahead import (
    CLEAN_NODES_GATE,
    SLIVER_GATE,
    SLIVER_GATE_HIGH,
    CapacityModel,
    CoreDeficitRule,
    FreshGpuRule,
    GpupackWeights,
    KeepCoresRule,
    SliverRule,
    WorkloadRules,
    whole_gpu_share,
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


# (name, shapes): whole-GPU heavy with shares (w 0.73: sliver price and the fresh-GPU
# rule's clean-node form on), share heavy (fresh-GPU rule on, plain), cpu-bound (no
# level, no deficit price).
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
    assert rules.fresh == FreshGpuRule.of(shapes, clean_nodes=name == "whole-heavy")
    assert rules.keep == KeepCoresRule.of(shapes)
    assert rules.deficit == CoreDeficitRule.of(shapes, w)
    assert rules.sliver == SliverRule.of(shapes, w)
    assert _counts(rules.cap, shapes)


def test_the_mixes_switch_different_rules_on() -> None:
    # Without this the table above could pass with every rule off.
    on = {name: WorkloadRules.of(s) for name, s in MIXES}
    assert on["whole-heavy"].sliver is not None and on["whole-heavy"].sliver.active
    assert on["share-heavy"].fresh is not None and on["share-heavy"].fresh.active
    assert on["whole-heavy"].fresh is not None and on["whole-heavy"].fresh.clean_nodes
    assert on["cpu-bound"].weights.levels is None
    assert on["whole-heavy"].weights.levels is not None


def _whole_mix(w: float) -> TypicalShapes:
    """1-GPU pods (8 cores), 810- and 230-milli shares (4 cores) at 2:1 by count, and
    CPU-only pods; whole-GPU pods ask w of the GPU demand (the 230s are common enough for
    the sliver price, which is on for 0.6 <= w < 0.83)."""
    share = 0.6 * (1 - w) / w * 1000 / ((2 * 810 + 230) / 3)
    return _mix((8_000, 1, 1000, 0.6), (4_000, 1, 810, share * 2 / 3),
                (4_000, 1, 230, share / 3), (8_000, 0, 0, 0.2))


# (w, sliver price on, clean-node form on): the form is on from FRESH_GPU_GATE, except
# where the sliver price is on below CLEAN_NODES_GATE.
CLEAN_TABLE = [
    (0.55, False, True),                       # below the sliver price's gate
    (SLIVER_GATE + 0.01, True, False),         # the price alone
    (CLEAN_NODES_GATE - 0.01, True, False),
    (CLEAN_NODES_GATE + 0.01, True, True),     # both
    (SLIVER_GATE_HIGH + 0.02, False, True),    # above the price's upper gate
]


@pytest.mark.parametrize(("w", "sliver", "clean"), CLEAN_TABLE)
def test_where_the_clean_node_form_is_on(w: float, sliver: bool, clean: bool) -> None:
    shapes = _whole_mix(w)
    assert whole_gpu_share(shapes) == pytest.approx(w)
    rules = WorkloadRules.of(shapes)
    assert rules.sliver is not None and rules.sliver.active is sliver
    assert rules.fresh is not None and (rules.fresh.active and rules.fresh.clean_nodes) is clean
    if clean:
        assert rules.fresh == FreshGpuRule.of(shapes, clean_nodes=True)
    # Dropping the sliver term for a comparison does not move the gate.
    assert WorkloadRules.of(shapes, sliver=False).fresh == rules.fresh
    # Off where whole nodes are kept for LLM groups (an idle node is clean), with
    # fresh_clean False, and without the FGD level; the other rules stay as they were.
    for other in (WorkloadRules.of(shapes, keep_whole_nodes=True),
                  WorkloadRules.of(shapes, fresh_clean=False),
                  WorkloadRules.of(shapes, GpupackWeights(levels=None))):
        assert other.fresh is not None and not other.fresh.active
        assert other.keep == rules.keep


def test_share_heavy_keeps_the_plain_form() -> None:
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
