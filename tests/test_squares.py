"""The sum-of-squares price (packing.policies.squares): its change is the exact change
of sum_h N(h)^2, it is scaled to the cluster, gated, and its held histogram is replaced
only past the drift."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from packing.fragmentation import MilliRequest
from packing.model import GPU_MILLI, PodRequest, RequestKind
from packing.policies.gpupack import GpupackScorer
from packing.policies.squares import (
    BUCKETS,
    REFERENCE_GPUS,
    SQUARES_DRIFT,
    SquaresRule,
    free_size_counts,
)


def _share(milli: int) -> MilliRequest:
    return MilliRequest(1000, 1024, 1, milli, np.ones(1, dtype=bool))


def _sum_of_squares(free: list[int]) -> int:
    return int((free_size_counts(np.array(free, dtype=np.int64)) ** 2).sum())


@given(st.lists(st.integers(0, GPU_MILLI), min_size=1, max_size=40), st.data())
def test_the_price_is_the_change_in_the_sum_of_squares(free: list[int], data) -> None:  # type: ignore[no-untyped-def]
    g = data.draw(st.integers(0, len(free) - 1))
    milli = data.draw(st.integers(1, GPU_MILLI - 1))
    rule = SquaresRule(active=True, weight=1.0).at(
        free_size_counts(np.array(free)), REFERENCE_GPUS)
    price = rule.penalty_of(np.array([free], dtype=np.int64), _share(milli))[0, g]
    if free[g] < milli:
        assert price == 0.0  # does not fit: the score is INFEASIBLE there anyway
        return
    after = list(free)
    after[g] -= milli
    assert price == _sum_of_squares(after) - _sum_of_squares(free)


@pytest.mark.parametrize(("free", "expect"), [
    (1000, None), (999, 99), (10, 1), (9, 0), (0, None), (420, 42)])
def test_buckets(free: int, expect: int | None) -> None:
    counts = free_size_counts(np.array([free]))
    assert len(counts) == BUCKETS
    assert (counts.sum() == 0) if expect is None else counts[expect] == 1


def test_the_price_scales_with_the_cluster() -> None:
    counts = np.zeros(BUCKETS, dtype=np.int64)
    counts[19] = 4  # four GPUs with 190-199 milli free
    free = np.array([[1000, 195]], dtype=np.int64)
    big = SquaresRule(active=True).at(counts, REFERENCE_GPUS).penalty_of(free, _share(810))
    small = SquaresRule(active=True).at(counts, REFERENCE_GPUS // 10).penalty_of(
        free, _share(810))
    assert np.allclose(small, big * REFERENCE_GPUS / (REFERENCE_GPUS // 10))
    # The fully free GPU would become a fifth with 190 free: 2 * 4 + 1; an 810 does not
    # fit the GPU with 195 free.
    assert big[0, 0] == pytest.approx(0.03 * 9) and big[0, 1] == 0.0


@pytest.mark.parametrize(("sliver", "clean", "on"), [
    (True, False, True), (True, True, False), (False, False, False), (False, True, False)])
def test_where_it_is_on(sliver: bool, clean: bool, on: bool) -> None:
    rule = SquaresRule.of(sliver, clean)
    assert rule.active is on
    assert rule.applies(_share(500)) is on
    assert not rule.applies(MilliRequest(1000, 1024, 1, GPU_MILLI, np.ones(1, dtype=bool)))


def test_the_held_histogram_is_replaced_only_past_the_drift() -> None:
    gpus = 1000
    rule = SquaresRule(active=True)
    moved = np.zeros(BUCKETS, dtype=np.int64)
    moved[50] = int(SQUARES_DRIFT * gpus)  # exactly at the drift: kept
    assert not rule.due(moved, gpus)
    moved[51] = 1
    assert rule.due(moved, gpus)
    held = rule.at(moved, gpus)
    assert not held.due(moved, gpus)
    assert not SquaresRule(active=False).due(moved, gpus)  # off: never replaced
    with pytest.raises(ValueError, match="buckets"):
        rule.at(np.zeros(3, dtype=np.int64), gpus)


@pytest.mark.parametrize(("whole", "shares", "milli", "on"), [
    (12, 20, 300, True),  # tests/e2e/test_e2e_squares.py: w 0.67, sliver price on
    (14, 18, 300, True),  # w 0.72: the clean-node form would be chosen, but the fresh-GPU
    # rule is off for these shapes, so it is not in effect
    (8, 40, 300, False),  # w 0.40: no sliver price
    (20, 2, 300, False),  # w 0.97: no sliver price (above its upper gate)
])
def test_the_extenders_scorer_turns_it_on_by_the_workload(whole: int, shares: int,
                                                          milli: int, on: bool) -> None:
    pods = ([PodRequest(f"a/w{i}", 100, 256, RequestKind.WHOLE, gpu_count=1)
             for i in range(whole)]
            + [PodRequest(f"a/s{i}", 100, 256, RequestKind.SHARED, gpu_milli=milli,
                          gpu_memory_mib=8192) for i in range(shares)])
    rules = GpupackScorer(pods).rules
    assert rules.squares is not None and rules.squares.active is on
