"""GPU memory trend of one pod: used, peak, growth rate, time to exhaustion. Pure.

The question is "will this pod's memory keep growing until the GPU (or its MIG instance)
is full?", answered early enough to alert before a time-sliced neighbour OOMs. Two
normal patterns must not alarm:

* a model load: one big step, then flat. The single largest jump in the window is
  removed before fitting when it stands out from the other changes, so the rate is ~0
  right after a load rather than only once the step has left the window;
* allocator noise: the slope is the Theil-Sen estimator (median of pairwise slopes,
  robust to outliers), and growth counts only when the rise it implies over the window
  is both above an absolute floor and well above the noise (median absolute deviation
  of the residuals).

A leak that grows in chunks (caching allocators) still shows: with two or more steps
in the window only one is removed.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class Sample:
    t: float  # seconds (any monotonic origin)
    used_bytes: int


@dataclass(frozen=True)
class GrowthParams:
    window_s: float = 900.0  # fit over the last 15 minutes
    min_samples: int = 4
    min_rise_bytes: int = 256 * MIB  # less than this over the window is not a trend
    noise_factor: float = 4.0  # rise must exceed this many robust noise scales
    step_factor: float = 4.0  # a jump is a "step" when this many times the median jump


@dataclass(frozen=True)
class Growth:
    used_bytes: int
    peak_bytes: int
    rate_bytes_per_s: float  # 0.0 unless the growth is significant
    # At that rate, until the pool is full; None if not growing or the pool size is unknown.
    exhaustion_s: float | None


def theil_sen_slope(ts: Sequence[float], ys: Sequence[float]) -> float:
    """Median of the slopes of all pairs with distinct times (0.0 if there are none)."""
    slopes = [
        (ys[j] - ys[i]) / (ts[j] - ts[i])
        for i in range(len(ts))
        for j in range(i + 1, len(ts))
        if ts[j] != ts[i]
    ]
    return statistics.median(slopes) if slopes else 0.0


def remove_single_step(ys: Sequence[float], step_factor: float) -> list[float]:
    """The series with its largest upward jump subtracted from every later point, when
    that jump is ``step_factor`` times larger than the median absolute jump (always so
    when everything else is flat)."""
    if len(ys) < 3:
        return list(ys)
    diffs = [ys[k + 1] - ys[k] for k in range(len(ys) - 1)]
    k_max = max(range(len(diffs)), key=lambda k: diffs[k])
    jump = diffs[k_max]
    others = [abs(d) for k, d in enumerate(diffs) if k != k_max]
    typical = statistics.median(others) if others else 0.0
    if jump <= 0 or jump <= step_factor * typical:
        return list(ys)
    return [y if k <= k_max else y - jump for k, y in enumerate(ys)]


def analyze(samples: Sequence[Sample], pool_free_bytes: int | None, peak_bytes: int = 0,
            params: GrowthParams | None = None) -> Growth:
    """Trend of one series. ``samples`` in time order; ``pool_free_bytes`` is what is
    left in the memory pool the pod draws from (the GPU, or its MIG instance), None when
    unknown (then no time to exhaustion); ``peak_bytes`` a peak remembered from samples
    already dropped from the window."""
    p = params or GrowthParams()
    if not samples:
        return Growth(0, peak_bytes, 0.0, None)
    used = samples[-1].used_bytes
    peak = max(peak_bytes, max(s.used_bytes for s in samples))
    recent = [s for s in samples if s.t >= samples[-1].t - p.window_s]
    if len(recent) < p.min_samples:
        return Growth(used, peak, 0.0, None)
    ts = [s.t for s in recent]
    ys = remove_single_step([float(s.used_bytes) for s in recent], p.step_factor)
    slope = theil_sen_slope(ts, ys)
    span = ts[-1] - ts[0]
    if slope <= 0 or span <= 0:
        return Growth(used, peak, 0.0, None)
    intercept = statistics.median(y - slope * t for t, y in zip(ts, ys, strict=True))
    residuals = [y - (intercept + slope * t) for t, y in zip(ts, ys, strict=True)]
    noise = 1.4826 * statistics.median(abs(r) for r in residuals)  # MAD -> sigma
    rise = slope * span
    if rise < p.min_rise_bytes or rise < p.noise_factor * noise:
        return Growth(used, peak, 0.0, None)
    exhaustion = None if pool_free_bytes is None else max(0.0, pool_free_bytes / slope)
    return Growth(used, peak, slope, exhaustion)
