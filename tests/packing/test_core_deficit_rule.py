"""The core-deficit price and the cpu-bound weights of gpupack's score
(packing.policies.lookahead.CoreDeficitRule, cpu_bound, workload_weights).

Table-driven: a node's deficit (the free GPU capacity its free cores cannot serve at the
workload's cores per GPU), the price a whole-GPU pod and a share pay for the deficit they
add on each node and GPU, when the workload turns the rule on, and which workloads count
as cpu-bound (CPU-only cores over the GPU pods' cores, against CPU_BOUND_GATE), where the
score drops the FGD level and the price with it.
"""

from __future__ import annotations

import numpy as np
import pytest

from packing.fragmentation import MilliRequest, ShapeKey, TypicalShapes, make_shapes
from packing.policies.lookahead import (
    CORE_DEFICIT_WEIGHT,
    CORE_DEFICIT_WEIGHT_SHARES,
    CPU_BOUND_GATE,
    FRESH_GPU_GATE,
    CoreDeficitRule,
    GpupackWeights,
    cpu_bound,
    whole_gpu_share,
    workload_weights,
)

ANY = np.ones(1, dtype=bool)


def _shape(cpu: int, k: int, milli: int) -> ShapeKey:
    return ShapeKey(cpu_milli=cpu, num_gpu=k, gpu_milli=milli, gpu_spec=frozenset())


def _req(cpu: int, k: int, milli: int) -> MilliRequest:
    return MilliRequest(cpu=cpu, mem=1024, num_gpu=k, milli=milli, model_ok=ANY)


def _mix(cpu_only_share: float) -> TypicalShapes:
    """Whole-GPU pods of 10 cores and CPU-only pods of 10 cores, the latter with
    frequency ``cpu_only_share``: CPU-only cores / GPU pods' cores = s / (1 - s)."""
    return make_shapes([(_shape(10_000, 1, 1000), 1.0 - cpu_only_share),
                        (_shape(10_000, 0, 0), cpu_only_share)], ("G2",))


RULE = CoreDeficitRule(active=True, cores=10_000.0)


@pytest.mark.parametrize(("free", "cpu", "want"), [
    ([1000, 1000, 0, 0], 20_000, 0.0),      # 2 GPUs, 20 cores: served
    ([1000, 1000, 0, 0], 15_000, 0.5),      # half a GPU without cores
    ([1000, 1000, 0, 0], 0, 2.0),           # no cores: both GPUs idle for good
    ([500, 190, 0, 0], 5_000, 0.19),        # partial GPUs count by their free milli
    ([0, 0, 0, 0], 0, 0.0),                 # nothing free: no deficit
    ([1000, 0, 0, 0], 90_000, 0.0),         # spare cores are no credit
])
def test_deficit_of_a_node(free: list[int], cpu: int, want: float) -> None:
    got = RULE.deficit(np.array([free]), np.array([cpu]))
    assert got[0] == pytest.approx(want)


@pytest.mark.parametrize(("free", "cpu", "pod_cpu", "want"), [
    # 4 free GPUs, 40 cores: after a 12-core pod 3 GPUs, 28 cores: 0 -> 0.2 short
    ([1000, 1000, 1000, 1000], 40_000, 12_000, 0.2),
    # core-rich node: no deficit before or after
    ([1000, 1000, 1000, 1000], 100_000, 12_000, 0.0),
    # short node (2 GPUs, 15 cores: 0.5): a 3-core pod leaves 1 GPU 12 cores: -0.5
    ([1000, 1000, 0, 0], 15_000, 3_000, -0.5),
    # the same node, a 10-core pod: 1 GPU, 5 cores: 0.5 -> 0.5, no change
    ([1000, 1000, 0, 0], 15_000, 10_000, 0.0),
])
def test_whole_gpu_pod_pays_for_the_deficit_it_adds(free: list[int], cpu: int,
                                                    pod_cpu: int, want: float) -> None:
    got = RULE.penalty_of(np.array([free]), np.array([cpu]), _req(pod_cpu, 1, 1000))
    assert got.shape == (1,)
    assert got[0] == pytest.approx(CORE_DEFICIT_WEIGHT * want)


def test_share_pays_per_gpu_it_may_take() -> None:
    free = np.array([[1000, 500, 0, 0]])
    cpu = np.array([10_000])     # needs 15 cores for 1.5 GPUs: D = 0.5 before
    got = RULE.penalty_of(free, cpu, _req(4_000, 1, 500))
    # after, on GPU 0 or 1: 1.0 GPU free, 6 cores -> 0.4 (GPUs 2 and 3 do not fit: the
    # score is -inf there whatever the price)
    want = CORE_DEFICIT_WEIGHT * (0.4 - 0.5)
    assert np.allclose(got[0, :2], want)
    assert got.shape == (1, 4)


@pytest.mark.parametrize(("shapes", "weights", "active"), [
    (_mix(0.2), GpupackWeights(), True),                         # the default score
    (_mix(0.2), GpupackWeights(levels=None), False),             # no level: no price
    (make_shapes([(_shape(8_000, 0, 0), 1.0)], ("G2",)), GpupackWeights(), False),
])
def test_rule_of_the_workload(shapes: TypicalShapes, weights: GpupackWeights,
                              active: bool) -> None:
    rule = CoreDeficitRule.of(shapes, weights)
    assert rule.active is active
    assert rule.applies(_req(8_000, 1, 1000)) is active
    assert rule.applies(_req(4_000, 1, 300)) is active
    assert not rule.applies(_req(8_000, 0, 0))


def _shares_and_whole(whole_freq: float) -> TypicalShapes:
    """1-GPU pods with frequency ``whole_freq``, 500-milli shares the rest: the
    whole-GPU pods' share of the GPU demand is w = 1000 p / (1000 p + 500 (1 - p))."""
    return make_shapes([(_shape(8_000, 1, 1000), whole_freq),
                        (_shape(4_000, 1, 500), 1.0 - whole_freq)], ("G2",))


@pytest.mark.parametrize(("shapes", "weight"), [
    (_mix(0.2), CORE_DEFICIT_WEIGHT),                       # whole-GPU pods only: w = 1
    (_shares_and_whole(0.34), CORE_DEFICIT_WEIGHT),         # w 0.507: above the gate
    (_shares_and_whole(0.32), CORE_DEFICIT_WEIGHT_SHARES),  # w 0.485: below it
    (_shares_and_whole(0.0), CORE_DEFICIT_WEIGHT_SHARES),   # shares only
    # 1-GPU pods at 0.2 and 250-milli shares at 0.8: w = 200 / 400, exactly the gate
    (make_shapes([(_shape(8_000, 1, 1000), 0.2), (_shape(4_000, 1, 250), 0.8)], ("G2",)),
     CORE_DEFICIT_WEIGHT),
])
def test_price_weight_follows_the_whole_gpu_share(shapes: TypicalShapes,
                                                  weight: float) -> None:
    # the heavier price where whole-GPU pods ask at least FRESH_GPU_GATE of the demand;
    # where the plain fresh-GPU rule is on (below it) the lighter one
    assert (whole_gpu_share(shapes) >= FRESH_GPU_GATE) is (weight == CORE_DEFICIT_WEIGHT)
    rule = CoreDeficitRule.of(shapes, GpupackWeights())
    assert rule.active
    assert rule.weight == weight


@pytest.mark.parametrize(("cpu_only_share", "bound"), [
    (0.0, False),
    (0.3, False),                                   # 0.43 of the GPU pods' cores
    (CPU_BOUND_GATE / (1 + CPU_BOUND_GATE) - 0.01, False),
    (CPU_BOUND_GATE / (1 + CPU_BOUND_GATE) + 0.01, True),
    (0.5, True),                                    # as many cores as the GPU pods
])
def test_cpu_bound_gate(cpu_only_share: float, bound: bool) -> None:
    shapes = _mix(cpu_only_share)
    assert cpu_bound(shapes) is bound
    w = workload_weights(shapes)
    assert (w.levels is None) is bound
    assert (w.capacity_weight, w.fgd_weight) == (GpupackWeights().capacity_weight,
                                                 GpupackWeights().fgd_weight)
    # the price comes only with the level
    assert CoreDeficitRule.of(shapes, w).active is not bound


def test_cpu_only_workload_is_not_cpu_bound() -> None:
    # no GPU pods: nothing to compare with (and nothing to rank by GPU)
    assert not cpu_bound(make_shapes([(_shape(8_000, 0, 0), 1.0)], ("G2",)))
