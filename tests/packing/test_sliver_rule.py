"""The sliver price of gpupack's score (packing.policies.lookahead.SliverRule).

Table-driven: the price a share pays on each GPU for the dead sliver it leaves there
(0 < free - milli < the smallest common share), when a workload turns the rule on
(whole-GPU pods' share of the GPU demand between SLIVER_GATE and SLIVER_GATE_HIGH, a
level in the score, a common share size), and that the price moves a share's choice of
GPU inside a node the way the rule says: finish a GPU, or leave it usable, or leave the
smaller dead sliver.
"""

from __future__ import annotations

import numpy as np
import pytest

from packing.fragmentation import (
    MilliRequest,
    ShapeKey,
    TypicalShapes,
    fragment_stats,
    make_shapes,
)
from packing.policies.lookahead import (
    SLIVER_GATE,
    SLIVER_GATE_HIGH,
    SLIVER_MIN_FREQ,
    SLIVER_WEIGHT,
    CapacityModel,
    GpupackWeights,
    NodeArrays,
    SliverRule,
    WorkloadRules,
    best_on_nodes,
    ranks,
    whole_gpu_share,
)

ANY = np.ones(1, dtype=bool)


def _shape(k: int, milli: int, cpu: int = 4_000) -> ShapeKey:
    return ShapeKey(cpu_milli=cpu, num_gpu=k, gpu_milli=milli, gpu_spec=frozenset())


def _share(milli: int) -> MilliRequest:
    return MilliRequest(cpu=1_000, mem=1024, num_gpu=1, milli=milli, model_ok=ANY)


def _mix(whole: float, shares: dict[int, float]) -> TypicalShapes:
    """Whole-GPU pods with frequency ``whole``, shares of the given sizes and frequencies."""
    return make_shapes([(_shape(1, 1000), whole)]
                       + [(_shape(1, m), p) for m, p in shares.items()], ("G2",))


RULE = SliverRule(active=True, smallest=230)


@pytest.mark.parametrize(("free", "milli", "want"), [
    ([1000, 1000], 810, [190, 190]),        # an 810 on a free GPU leaves a dead 190
    ([1000, 900], 810, [190, 90]),          # beside a small share: a dead 90
    ([1000, 810], 810, [190, 0]),           # finishes the GPU: nothing dead
    ([1000, 500], 470, [0, 30]),            # 530 left is room for a common share
    ([1000, 700], 470, [0, 0]),             # 230 left: exactly the smallest common share
    ([1000, 699], 470, [0, 229]),           # 229: one milli short of it
    ([400, 100], 470, [0, 0]),              # does not fit: no price (the score is -inf)
])
def test_price_per_gpu(free: list[int], milli: int, want: list[int]) -> None:
    got = RULE.penalty_of(np.array([free]), _share(milli))
    assert got.shape == (1, len(free))
    assert np.allclose(got[0], [SLIVER_WEIGHT * w / 1000 for w in want])


def test_rule_prices_shares_only() -> None:
    assert RULE.applies(_share(470))
    assert not RULE.applies(MilliRequest(8_000, 1024, 1, 1000, ANY))
    assert not RULE.applies(MilliRequest(8_000, 1024, 0, 0, ANY))
    assert not SliverRule(active=False).applies(_share(470))


@pytest.mark.parametrize(("shapes", "weights", "active", "smallest"), [
    # w = 0.7 / (0.7 + 0.2 x 0.81 + 0.1 x 0.23) = 0.79: on; 230 is common
    (_mix(0.7, {810: 0.2, 230: 0.1}), GpupackWeights(), True, 230),
    # the 160 share is rarer than SLIVER_MIN_FREQ: not a common size
    (_mix(0.7, {810: 0.2, 230: 0.095, 160: 0.005}), GpupackWeights(), True, 230),
    (_mix(0.7, {810: 0.2, 230: 0.08, 160: 0.02}), GpupackWeights(), True, 160),
    # no level in the score: off
    (_mix(0.7, {810: 0.2, 230: 0.1}), GpupackWeights(levels=None), False, 0),
    # share-heavy: w = 0.2 / (0.2 + 0.8 x 0.5) = 0.33 < SLIVER_GATE: off
    (_mix(0.2, {500: 0.8}), GpupackWeights(), False, 0),
    # no shares: off
    (_mix(1.0, {}), GpupackWeights(), False, 0),
])
def test_rule_of_the_workload(shapes: TypicalShapes, weights: GpupackWeights,
                              active: bool, smallest: int) -> None:
    rule = SliverRule.of(shapes, weights)
    assert rule.active is active
    assert rule.smallest == smallest


@pytest.mark.parametrize(("w", "active"), [
    (SLIVER_GATE - 0.01, False),
    (SLIVER_GATE + 0.01, True),
    (SLIVER_GATE_HIGH - 0.01, True),
    (SLIVER_GATE_HIGH + 0.01, False),
])
def test_gates_on_the_whole_gpu_share(w: float, active: bool) -> None:
    # whole-GPU pods (1000) and 500-milli shares: w = p / (p + (1 - p) / 2)
    p = w / (2.0 - w)
    shapes = _mix(p, {500: 1.0 - p})
    assert whole_gpu_share(shapes) == pytest.approx(w)
    assert SliverRule.of(shapes, GpupackWeights()).active is active
    assert 1.0 - p > SLIVER_MIN_FREQ


def test_share_finishes_a_gpu_rather_than_leave_a_dead_sliver() -> None:
    # One node, GPUs with 1000, 900 and 810 free; the workload: whole GPUs, 810 and 230
    # shares. An 810 share fits all three: the price makes it take the 810 (nothing
    # left), and without the 810 the 900 (a dead 90 rather than a dead 190).
    shapes = _mix(0.7, {810: 0.2, 230: 0.1})
    weights = GpupackWeights()
    rule = SliverRule.of(shapes, weights)
    priced = WorkloadRules(shapes, CapacityModel(shapes), weights, sliver=rule)
    plain = WorkloadRules(shapes, CapacityModel(shapes), weights)
    for free, want in (([1000, 900, 810], 2), ([1000, 900, 0], 1)):
        f = np.array([free], dtype=np.int64)
        cpu = np.array([64_000], dtype=np.int64)
        mem = np.array([262_144], dtype=np.int64)
        model = np.zeros(1, dtype=np.int64)
        nodes = NodeArrays(f, cpu, mem, model, fragment_stats(f, cpu, mem, model, shapes))
        req = MilliRequest(cpu=4_000, mem=1024, num_gpu=1, milli=810, model_ok=ANY)
        _, gpu = best_on_nodes(nodes, req, priced)
        assert gpu[0] == want
        # the price is inside the rank: with and without it differ by it, GPU by GPU
        with_price = ranks(nodes, req, priced)
        without = ranks(nodes, req, plain)
        fits = np.isfinite(without)
        assert np.array_equal(np.isfinite(with_price), fits)
        assert np.allclose(without[fits] - with_price[fits],
                           rule.penalty_of(f, req)[fits], atol=1e-5)
