"""Growth trend on synthetic series: steady growth, a load step, noise."""

from __future__ import annotations

import random

import pytest

from nodeagent.growth import (
    MIB,
    GrowthParams,
    Sample,
    analyze,
    remove_single_step,
    theil_sen_slope,
)

GIB = 1024 * MIB
STEP = 15.0  # agent interval


def series(values: list[float]) -> list[Sample]:
    return [Sample(k * STEP, int(v)) for k, v in enumerate(values)]


def test_steady_growth_rate_and_exhaustion() -> None:
    rate = 2 * MIB  # bytes per second
    s = series([4 * GIB + rate * STEP * k for k in range(40)])
    g = analyze(s, pool_free_bytes=10 * GIB)
    assert g.rate_bytes_per_s == pytest.approx(rate, rel=0.01)
    assert g.exhaustion_s == pytest.approx(10 * GIB / rate, rel=0.01)
    assert g.used_bytes == s[-1].used_bytes and g.peak_bytes == s[-1].used_bytes


def test_load_step_then_flat_is_not_growth() -> None:
    # Idle runtime, then the model loads (+12 GiB in one interval), then flat.
    s = series([300 * MIB] * 10 + [12 * GIB + 300 * MIB] * 30)
    g = analyze(s, pool_free_bytes=20 * GIB)
    assert g.rate_bytes_per_s == 0.0 and g.exhaustion_s is None
    assert g.peak_bytes == 12 * GIB + 300 * MIB


def test_step_in_the_middle_of_the_window_is_ignored() -> None:
    s = series([2 * GIB] * 20 + [10 * GIB] * 20)
    assert analyze(s, pool_free_bytes=GIB).exhaustion_s is None


def test_noise_is_no_false_alarm() -> None:
    rng = random.Random(7)
    for _ in range(20):
        s = series([8 * GIB + rng.gauss(0, 100 * MIB) for _ in range(60)])
        g = analyze(s, pool_free_bytes=GIB)
        assert g.exhaustion_s is None and g.rate_bytes_per_s == 0.0


def test_growth_under_noise_is_found() -> None:
    rng = random.Random(11)
    rate = 3 * MIB
    s = series([8 * GIB + rate * STEP * k + rng.gauss(0, 50 * MIB) for k in range(60)])
    g = analyze(s, pool_free_bytes=20 * GIB)
    assert g.rate_bytes_per_s == pytest.approx(rate, rel=0.2)
    assert g.exhaustion_s is not None


def test_chunked_leak_still_shows() -> None:
    # A caching allocator grabbing 1 GiB every 2.5 minutes: several steps in the window.
    s = series([4 * GIB + GIB * (k // 10) for k in range(60)])
    g = analyze(s, pool_free_bytes=20 * GIB)
    assert g.rate_bytes_per_s > 0 and g.exhaustion_s is not None


def test_shrinking_and_too_few_samples() -> None:
    assert analyze(series([9 * GIB - k * 50 * MIB for k in range(30)]), GIB).exhaustion_s is None
    assert analyze(series([1 * GIB, 5 * GIB]), GIB).rate_bytes_per_s == 0.0
    assert analyze([], GIB, peak_bytes=7).peak_bytes == 7


def test_window_only_recent_samples_count() -> None:
    # Growth long ago, flat for longer than the window: not growing now.
    old = [GIB + k * 100 * MIB for k in range(40)]
    s = series(old + [old[-1]] * 80)
    assert analyze(s, GIB, params=GrowthParams(window_s=900)).exhaustion_s is None


def test_helpers() -> None:
    assert theil_sen_slope([0, 1, 2, 3, 4, 5], [0, 2, 4, 6, 8, 100]) == 2.0  # outlier ignored
    assert theil_sen_slope([1, 1], [0, 5]) == 0.0
    assert remove_single_step([0, 0, 10, 10], 4.0) == [0, 0, 0, 0]
    assert remove_single_step([0, 1, 2, 3], 4.0) == [0, 1, 2, 3]
