"""The sum-of-squares price for shares: keep the cluster's free sizes spread out.

Online bin packing's sum-of-squares rule (Csirik, Johnson, Kenyon, Orlin, Shor and Weber,
J. ACM 2006) places an item where it least raises sum_h N(h)^2, N(h) the number of bins
with gap h. For shares on GPUs: N(h) counts the GPUs with h milli free, in 10-milli
buckets (``BUCKET``), over 0 < h < 1000 (a fully free GPU and a full one are not
counted). A share of m milli on a GPU with f free moves that GPU from bucket f to bucket
f - m, which changes sum_h N(h)^2 by::

    change = 2 (N(f - m) - N(f)) + 2        (both buckets counted, and not the same)
             2 N(f - m) + 1                 (f = 1000: the GPU was fully free)
             1 - 2 N(f)                     (f - m = 0: the GPU is left full)

A share so prefers a GPU whose free size is common in the cluster (many GPUs have f free:
its N(f) drops) and leaves a size that is rare (N(f - m) small), so that every size a
later share may ask for stays available somewhere, instead of the sizes piling up in a
few buckets that no share fits. The price enters the share's score in FGD levels:

    price = weight x change x REFERENCE_GPUS / gpus

``gpus`` being the cluster's GPUs that take shares: the change grows with the cluster,
and ``weight`` (``SQUARES_WEIGHT`` levels a unit) was measured on the openb cluster of
``REFERENCE_GPUS`` GPUs, so the price is scaled to keep its balance against the FGD
level at other sizes (measured only at that size).

**The histogram is held, not live.** The score of a node would otherwise depend on every
other node, and both callers keep per-node memos (the extender's by node state, the
replay's by node version). The rule holds a copy of the histogram (``counts``) and is
replaced (:meth:`SquaresRule.at`) when the cluster's histogram has moved from it by more
than ``SQUARES_DRIFT`` of the GPUs in L1 distance (:meth:`SquaresRule.due`): the replay
checks after each placement, the extender's planner at each cycle, and each replacement
is a new scorer generation (its memo is recomputed). Measured on openb default, seed 42
(bench/README.md, "Packing quality", idea 7): the live histogram 96.229, held and
replaced at 200 GPUs of drift (10 replacements in the run) 96.256, at 500 96.241,
every 1,000 placements 96.228, every 5,000 96.160; a node-local histogram (the node's
own GPUs only, no cluster state) 96.107, no better than without the price (96.113).

**Where it is on** (:meth:`SquaresRule.of`): where the sliver price is on and the
fresh-GPU rule's clean-node form is not in effect (the default, cpu and gpuspec openb
traces; on multigpu20-40 the form is, on the other traces the sliver price is off). Beside
the clean-node form it lost (seed 42: multigpu50 -0.30, gpushare40 -0.37, multigpu40
-0.04): that form keeps one open GPU per node, and the price pulls shares apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from packing.fragmentation import FloatArray, IntArray, MilliRequest
from packing.model import GPU_MILLI

BUCKET = 10  # milli per bucket of free size
BUCKETS = GPU_MILLI // BUCKET  # 0..99: bucket 0 (under 10 milli free) counts, 1000 not
SQUARES_WEIGHT = 0.03  # FGD levels per unit of change at REFERENCE_GPUS
REFERENCE_GPUS = 6212  # the openb cluster's GPUs, where SQUARES_WEIGHT was measured
SQUARES_DRIFT = 0.03  # L1 drift, as a share of the GPUs, that replaces the held histogram


def free_size_counts(free: IntArray) -> IntArray:
    """N(h) per bucket (``[BUCKETS]``) of the GPUs whose free milli ``free`` (any shape)
    is strictly between 0 and 1000."""
    f = np.asarray(free, dtype=np.int64).ravel()
    f = f[(f > 0) & (f < GPU_MILLI)]
    return np.asarray(np.bincount(f // BUCKET, minlength=BUCKETS), dtype=np.int64)


@dataclass(frozen=True, eq=False)
class SquaresRule:
    """The sum-of-squares price (module docstring) with the histogram it holds."""

    active: bool
    counts: IntArray = field(default_factory=lambda: np.zeros(BUCKETS, dtype=np.int64))
    gpus: int = REFERENCE_GPUS
    weight: float = SQUARES_WEIGHT

    @staticmethod
    def of(sliver_on: bool, clean_nodes_on: bool) -> SquaresRule:
        """On where the sliver price is on and the clean-node form is off; it holds an
        empty histogram (no GPU partly used) until :meth:`at` gives it the cluster's."""
        return SquaresRule(active=sliver_on and not clean_nodes_on)

    def applies(self, req: MilliRequest) -> bool:
        return self.active and req.shared

    def at(self, counts: IntArray, gpus: int) -> SquaresRule:
        """The rule holding ``counts`` (:func:`free_size_counts`) of a cluster of
        ``gpus`` GPUs that take shares."""
        if len(counts) != BUCKETS:
            raise ValueError(f"counts must have {BUCKETS} buckets, got {len(counts)}")
        return replace(self, counts=np.asarray(counts, dtype=np.int64).copy(),
                       gpus=max(1, int(gpus)))

    def due(self, counts: IntArray, gpus: int) -> bool:
        """Whether the cluster's histogram ``counts`` has moved from the held one by more
        than ``SQUARES_DRIFT`` of its ``gpus`` (L1): then :meth:`at` should replace it."""
        if not self.active:
            return False
        moved = int(np.abs(np.asarray(counts, dtype=np.int64) - self.counts).sum())
        return moved > SQUARES_DRIFT * max(1, gpus)

    def penalty_of(self, free: IntArray, req: MilliRequest) -> FloatArray:
        """``[n, G]``: the price of the share on each GPU (module docstring); 0 where it
        does not fit (the score there is INFEASIBLE anyway)."""
        n = self.counts.astype(np.float64)
        left = free - req.milli
        counted = (free > 0) & (free < GPU_MILLI)
        n_f = np.where(counted, n[np.clip(free // BUCKET, 0, BUCKETS - 1)], 0.0)
        n_left = np.where(left > 0, n[np.clip(left // BUCKET, 0, BUCKETS - 1)], 0.0)
        change = 2.0 * (n_left - n_f) + (left > 0) + counted
        # A share under 10 milli may leave its GPU in the same bucket: no change.
        change = np.where(counted & (left > 0) & (free // BUCKET == left // BUCKET), 0.0,
                          change)
        scale = self.weight * REFERENCE_GPUS / self.gpus
        return np.asarray(np.where(left >= 0, scale * change, 0.0), dtype=np.float64)
