"""The fresh-GPU and keep-cores rules of gpupack's score
(packing.policies.lookahead.FreshGpuRule, KeepCoresRule).

Table-driven: when the workload turns it on (the gate on whole-GPU pods' share of the
GPU demand), which shares it moves (too large for the common big share's sliver, smaller
than that share), how many cores a node must keep per GPU left fully free, and that its
term outranks any FGD level on exactly the fully free GPUs of such nodes (in its
clean-node form, where whole-GPU pods ask more, only on nodes without a partly used GPU);
which nodes keep
the workload's cores per fully free GPU for a CPU-only pod.
"""

from __future__ import annotations

import numpy as np
import pytest

from packing.fragmentation import MilliRequest, ShapeKey, make_shapes
from packing.policies.lookahead import (
    FRESH_GPU_GATE,
    FreshGpuRule,
    KeepCoresRule,
    cores_per_gpu,
)

ANY = np.ones(1, dtype=bool)


def _shape(cpu: int, k: int, milli: int) -> ShapeKey:
    return ShapeKey(cpu_milli=cpu, num_gpu=k, gpu_milli=milli, gpu_spec=frozenset())


def _req(milli: int, cpu: int = 4000) -> MilliRequest:
    return MilliRequest(cpu=cpu, mem=1024, num_gpu=1, milli=milli, model_ok=ANY)


@pytest.mark.parametrize(("mix", "active", "lo", "hi", "clean"), [
    # shares only: m* = 810 (the most frequent share above half a GPU)
    ([(_shape(3000, 1, 810), 0.5), (_shape(8000, 1, 470), 0.5)], True, 191, 809, False),
    # 650 more frequent than 810: m* = 650
    ([(_shape(3000, 1, 810), 0.2), (_shape(8000, 1, 650), 0.5), (_shape(8000, 1, 300), 0.3)],
     True, 351, 649, False),
    # no share above half a GPU: nothing to block
    ([(_shape(3000, 1, 470), 0.6), (_shape(8000, 1, 300), 0.4)], False, 1000, 0, False),
    # whole-GPU pods ask most of the demand: the clean-node form
    ([(_shape(3000, 1, 810), 0.3), (_shape(8000, 1, 1000), 0.7)], True, 191, 809, True),
    # CPU-only pods only
    ([(_shape(8000, 0, 0), 1.0)], False, 1000, 0, False),
])
def test_gate_and_sizes(mix: list[tuple[ShapeKey, float]], active: bool, lo: int,
                        hi: int, clean: bool) -> None:
    rule = FreshGpuRule.of(make_shapes(mix, ("G2",)), clean_nodes=True)
    assert (rule.active, rule.lo, rule.hi, rule.clean_nodes) == (active, lo, hi, clean)
    # Without the clean-node form (the default; WorkloadRules.of decides) the rule is off
    # wherever that form would be on.
    plain = FreshGpuRule.of(make_shapes(mix, ("G2",)))
    assert plain.active is (active and not clean) and not plain.clean_nodes


def test_gate_threshold_and_cores() -> None:
    # whole share w of the GPU demand: 1000 p / (1000 p + 810 (1 - p))
    def rule_at(w: float, clean_nodes: bool = True) -> FreshGpuRule:
        p = w * 810 / (1000 - w * 190)
        return FreshGpuRule.of(make_shapes(
            [(_shape(8000, 1, 1000), p), (_shape(4050, 1, 810), 1 - p)], ("G2",)),
            clean_nodes=clean_nodes)

    below, above = rule_at(FRESH_GPU_GATE - 0.01), rule_at(FRESH_GPU_GATE + 0.01)
    assert below.active and not below.clean_nodes
    assert below == rule_at(FRESH_GPU_GATE - 0.01, clean_nodes=False)
    assert above.active and above.clean_nodes
    assert not rule_at(FRESH_GPU_GATE + 0.01, clean_nodes=False).active
    # the same cores formula on both sides of the gate
    assert rule_at(0.9).cores > above.cores > below.cores
    # cores = 2 (1 + 4 w^2) x cpu per GPU of demand; at w = 0 (shares only) 2 x 5000
    assert rule_at(0.0).cores == 10_000
    assert rule_at(0.4).cores > rule_at(0.2).cores > rule_at(0.0).cores


def test_bonus_on_fresh_gpus_of_nodes_that_keep_cores() -> None:
    rule = FreshGpuRule(active=True, lo=191, hi=809, cores=10_000)
    free = np.array([[1000, 1000, 500, 0],    # 2 fresh: keeps 1 fresh, needs 10 cores
                     [1000, 1000, 500, 0],    # same GPUs, too little cpu
                     [600, 500, 0, 0],        # no fresh GPU
                     [1000, 0, 0, 0]])        # its last fresh GPU: keeps none, needs 0
    cpu = np.array([14_000, 13_999, 50_000, 4_000])
    got = rule.bonus_of(free, cpu, _req(470))
    want = np.zeros_like(got)
    want[0, :2] = rule.bonus
    want[3, 0] = rule.bonus
    assert np.array_equal(got, want)
    assert rule.applies(_req(470)) and rule.applies(_req(191)) and rule.applies(_req(809))
    assert not rule.applies(_req(190)) and not rule.applies(_req(810))
    assert not FreshGpuRule(active=False).applies(_req(470))
    whole = MilliRequest(cpu=1000, mem=1024, num_gpu=1, milli=1000, model_ok=ANY)
    assert not rule.applies(whole)


# (free GPUs of a node, its free cpu, whether its fully free GPUs get the clean-node
# form's bonus for a 470-milli share asking 4 cores); the rule keeps 10 cores per GPU it
# leaves fully free.
CLEAN_NODES = [
    ([1000, 1000, 1000, 1000], 34_000, True),    # idle node with the cores: clean
    ([1000, 1000, 1000, 1000], 33_999, False),   # one core short for 3 fully free GPUs
    ([1000, 1000, 0, 0], 14_000, True),          # the rest fully taken: clean
    ([1000, 1000, 190, 0], 50_000, False),       # a sliver left: not clean
    ([1000, 1000, 999, 0], 50_000, False),       # a GPU not takeable whole: not clean
    ([1000, 0, 0, 0], 4_000, True),              # its last fully free GPU
    ([530, 0, 0, 0], 50_000, False),             # no fully free GPU at all
]


@pytest.mark.parametrize(("gpus", "cpu", "bonus"), CLEAN_NODES)
def test_clean_node_form_only_on_nodes_without_partly_used_gpus(
        gpus: list[int], cpu: int, bonus: bool) -> None:
    rule = FreshGpuRule(active=True, lo=191, hi=809, cores=10_000, clean_nodes=True)
    free = np.array([gpus])
    got = rule.bonus_of(free, np.array([cpu]), _req(470))[0]
    want = np.where(free[0] == 1000, rule.bonus if bonus else 0.0, 0.0)
    assert np.array_equal(got, want)
    # The plain form gives the bonus whatever the other GPUs hold.
    plain = FreshGpuRule(active=True, lo=191, hi=809, cores=10_000)
    keeps = cpu - 4000 >= 10_000 * max(int((free[0] == 1000).sum()) - 1, 0)
    assert np.array_equal(plain.bonus_of(free, np.array([cpu]), _req(470))[0],
                          np.where(free[0] == 1000, plain.bonus if keeps else 0.0, 0.0))


def _cpu_only(cpu: int) -> MilliRequest:
    return MilliRequest(cpu=cpu, mem=1024, num_gpu=0, milli=0, model_ok=ANY)


@pytest.mark.parametrize(("mix", "active", "cores"), [
    # cpu per GPU of demand: (0.5 x 3000 + 0.5 x 8000) / (0.5 x 810 + 0.5 x 470) x 1000
    ([(_shape(3000, 1, 810), 0.5), (_shape(8000, 1, 470), 0.5)], True, 8593),
    # CPU-only shapes do not count; a 2-GPU pod asks 2000 milli
    ([(_shape(16000, 2, 1000), 0.5), (_shape(8000, 0, 0), 0.5)], True, 8000),
    # no GPU shape: nothing to keep cores for
    ([(_shape(8000, 0, 0), 1.0)], False, 0),
])
def test_keep_cores_of_the_workload(mix: list[tuple[ShapeKey, float]], active: bool,
                                    cores: int) -> None:
    shapes = make_shapes(mix, ("G2",))
    rule = KeepCoresRule.of(shapes)
    assert (rule.active, rule.cores) == (active, cores)
    assert int(cores_per_gpu(shapes)) == cores


def test_keep_cores_bonus_on_nodes_that_keep_cores_for_their_free_gpus() -> None:
    rule = KeepCoresRule(active=True, cores=8000)
    free = np.array([[1000, 1000, 500, 0],    # 2 fully free GPUs: must keep 16 cores
                     [1000, 1000, 500, 0],    # same, one core short
                     [600, 500, 0, 0],        # none fully free: always keeps
                     [0, 0, 0, 0]])           # no GPU free (or none at all)
    cpu = np.array([20_000, 19_999, 4_000, 4_000])
    got = rule.bonus_of(free, cpu, _cpu_only(4000))
    assert np.array_equal(got, np.array([rule.bonus, 0.0, rule.bonus, rule.bonus]))
    assert rule.applies(_cpu_only(4000))
    assert not rule.applies(_req(470)) and not KeepCoresRule(active=False).applies(
        _cpu_only(4000))
