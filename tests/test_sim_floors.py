"""Floors under the openb certificate (sim/openb/floors.py): each lies between the run it
comes from and the root relaxation, and the blocking floor lies under branch and bound's
certificate at any budget, as the module argues."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pytest
from builders_openb import openb_cluster, openb_pods
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.openb_floors import main as floors_main
from bench.openb_floors import parse_slices
from sim.openb.bound import SLICES, allocation_bound, dominates, make_instance, slice_ends
from sim.openb.cluster import Nodes, Pods
from sim.openb.floors import blocking_profile, floors, run_end
from sim.openb.policies import make
from sim.openb.replay import build_workload, replay, trace_shapes

SHAPES = [(1000, 2048, 1, 1000), (2000, 4096, 2, 1000), (1000, 2048, 1, 810),
          (4000, 8192, 1, 470), (2000, 4096, 1, 320), (500, 1024, 1, 160),
          (8000, 16384, 0, 0), (6000, 65536, 0, 0)]
DENSE = tuple(i / 10 for i in range(1, 11))


def _random_case(seed: int) -> tuple[Nodes, Pods, np.ndarray]:
    rng = np.random.default_rng(seed)
    node_spec = [(int(rng.choice([16000, 32000, 64000])), 131072, int(rng.choice([1, 2, 4, 8])))
                 for _ in range(int(rng.integers(3, 7)))]
    pod_spec = [SHAPES[int(rng.integers(len(SHAPES)))] for _ in range(40)]
    nodes = Nodes.from_trace(openb_cluster(node_spec))
    pods = Pods.from_trace(openb_pods(pod_spec), nodes.models)
    return nodes, pods, build_workload(pods, nodes.gpu_capacity_milli, seed)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.sampled_from(["random", "bestfit", "fgd", "gpupack"]),
       st.sampled_from([SLICES, DENSE]))
def test_each_floor_lies_between_its_run_and_the_root(seed: int, policy: str,
                                                      slices: tuple[float, ...]) -> None:
    nodes, pods, workload = _random_case(seed)
    inst = make_instance(nodes, pods, workload)
    run = replay(nodes, pods, workload[:inst.n_arrivals], make(policy), seed,
                 trace_shapes(pods, nodes.models))
    end = run_end(inst, workload, run.placements)
    got = floors(inst, end, slices)
    # the run is a point of every LP: no floor below it
    placed_milli = sum(int(pods.demand_milli[i]) for i, _, _ in run.placements)
    assert got.run == pytest.approx(100.0 * placed_milli / nodes.gpu_capacity_milli)
    for name in ("root", "blocking", "configurations", "both"):
        assert getattr(got, name) >= got.run - 1e-6, name
    # each is the root's LP restricted: never above it; both under either
    for name in ("blocking", "configurations", "both"):
        assert getattr(got, name) <= got.root + 1e-6, name
    assert got.both <= min(got.blocking, got.configurations) + 1e-6
    assert got.configs == len(set(end.configs))
    # branch and bound on b cannot certify below the blocking floor, whatever its budget
    for lps in (1, 6):
        cert = allocation_bound(inst, slices=slices, budget=lps)
        assert cert.alloc_130 >= got.blocking - 1e-4, lps  # a dual bound over a primal value


def test_blocking_profile_follows_the_first_failure_and_dominance() -> None:
    # one node with 1 GPU and 4 cores: a whole-GPU pod takes the GPU; the 810 share and
    # the whole-GPU pod after it fail; the CPU-only pod fits (read at the end: 281%)
    nodes = Nodes.from_trace(openb_cluster([(4000, 65536, 1)]))
    pods = Pods.from_trace(openb_pods([(2000, 1024, 1, 1000), (1000, 1024, 1, 810),
                                       (1000, 1024, 1, 1000), (1000, 1024, 0, 0)]),
                           nodes.models)
    order = np.arange(4, dtype=np.int64)
    inst = make_instance(nodes, pods, order, load_pct=281)
    assert inst.n_arrivals == 4
    placed = np.array([True, False, False, True])
    slices = tuple(i / inst.n_arrivals for i in range(1, inst.n_arrivals + 1))
    got = blocking_profile(inst, placed, slices)
    gs = slice_ends(inst.n_arrivals, slices)
    cls = {int(p[0]): q for q, p in enumerate(inst.positions) if len(p)}
    share, whole, cpu_only = cls[1], cls[2], cls[3]
    # blocked only after its own failure (arrival 1) ...
    assert [got[k, share] for k in range(len(gs))] == [g > 1 for g in gs]
    # ... and the whole-GPU class, which needs more than the share everywhere, with it
    assert dominates(inst, share, whole)
    assert [got[k, whole] for k in range(len(gs))] == [g > 1 for g in gs]
    # the CPU-only pod fitted: never blocked
    assert not any(got[k, cpu_only] for k in range(len(gs)))
    # nondecreasing in the slice, closed under dominance
    for (k, q), v in got.items():
        if v and k + 1 < len(gs):
            assert got[k + 1, q]
        for q2 in range(inst.n_classes):
            if v and (k, q2) in got and q2 != q and dominates(inst, q, q2):
                assert got[k, q2]


def test_run_end_refuses_a_run_of_another_workload() -> None:
    nodes, pods, workload = _random_case(3)
    inst = make_instance(nodes, pods, workload)
    run = replay(nodes, pods, workload[:inst.n_arrivals], make("fgd"), 3,
                 trace_shapes(pods, nodes.models))
    end = run_end(inst, workload, run.placements)
    assert end.placed.sum() == len(run.placements)
    assert sum(c for _, pods_ in end.configs for _, c in pods_) == len(run.placements)
    with pytest.raises(ValueError, match="not an arrival of the workload in order"):
        run_end(inst, workload, list(reversed(run.placements)))
    bad = [(run.placements[0][0], nodes.size + 3, run.placements[0][2])]
    with pytest.raises(ValueError, match="is not one of"):
        run_end(inst, workload, bad)
    with pytest.raises(ValueError, match="arrivals, the instance's cut"):
        run_end(inst, workload[:1], run.placements)


@pytest.mark.parametrize("text,want", [
    ("coarse", SLICES),
    ("0.5:1.0:0.25", (0.5, 0.75, 1.0)),
    ("0.6,0.9,1.0", (0.6, 0.9, 1.0)),
])
def test_parse_slices(text: str, want: tuple[float, ...]) -> None:
    assert parse_slices(text) == want


@pytest.mark.parametrize("text", ["", "fine", "0.9,0.6", "0.5:1.0:0", "0,1", "0.5,1.5",
                                  "0.5:1:x", "0.5:1.0:0.2", "0.5:1.0:0.3", "0:1:1e-12",
                                  "1.0:0.5:0.1"])
def test_parse_slices_names_the_bad_value(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(text))):
        parse_slices(text)


def test_each_restriction_binds() -> None:
    # three nodes of 4 cores and 2 GPUs, whole-GPU pods of 3 cores: one fits a node, but
    # the pooled cpu (12 cores) admits four; the run's configurations (one pod a node) do not
    nodes = Nodes.from_trace(openb_cluster([(4000, 65536, 2)] * 3))
    pods = Pods.from_trace(openb_pods([(3000, 1024, 1, 1000)] * 5), nodes.models)
    order = np.arange(5, dtype=np.int64)
    inst = make_instance(nodes, pods, order, load_pct=83)
    run = replay(nodes, pods, order, make("fgd"), 0, trace_shapes(pods, nodes.models))
    got = floors(inst, run_end(inst, order, run.placements))
    assert (got.run, got.configurations, got.both) == pytest.approx((50.0, 50.0, 50.0))
    assert got.root == pytest.approx(200 / 3) and got.blocking == pytest.approx(200 / 3)
    # a random case where all four differ: each restriction, and their sum, binds
    nodes, pods, workload = _random_case(0)
    inst = make_instance(nodes, pods, workload)
    run = replay(nodes, pods, workload[:inst.n_arrivals], make("fgd"), 0,
                 trace_shapes(pods, nodes.models))
    got = floors(inst, run_end(inst, workload, run.placements))
    assert got.root > got.blocking + 0.5 and got.root > got.configurations + 0.5
    assert got.blocking > got.both + 0.5 and got.configurations > got.both + 0.1


def test_run_end_matches_a_repeated_pod_to_its_own_arrival() -> None:
    # pods 0 and 1 arrive twice each, then pod 0 once more past the cut; the second
    # arrival of pod 1 fails; the placement past the cut is read (in order), not counted
    nodes = Nodes.from_trace(openb_cluster([(16000, 65536, 2)] * 2))
    pods = Pods.from_trace(openb_pods([(1000, 1024, 1, 1000), (1000, 1024, 1, 500)]),
                           nodes.models)
    workload = np.array([0, 1, 0, 1, 0], dtype=np.int64)
    inst = make_instance(nodes, pods, workload, load_pct=75)
    assert inst.n_arrivals == 4
    placements = [(0, 0, (0,)), (1, 0, (1,)), (0, 1, (0,)), (0, 1, (1,))]
    end = run_end(inst, workload, placements)
    assert end.placed.tolist() == [True, True, True, False]
    whole = next(q for q, p in enumerate(inst.positions) if 0 in p.tolist())
    share = 1 - whole
    assert end.configs == ((0, tuple(sorted(((whole, 1), (share, 1))))), (0, ((whole, 1),)))
    with pytest.raises(ValueError, match="does not fit node"):
        small = Nodes.from_trace(openb_cluster([(16000, 65536, 2), (500, 65536, 2)]))
        tiny = make_instance(small, Pods.from_trace(openb_pods([(1000, 1024, 1, 1000)]),
                                                    small.models),
                             np.array([0, 0], dtype=np.int64), load_pct=50)
        run_end(tiny, np.array([0, 0], dtype=np.int64), [(0, 1, (0,))])


def test_the_bench_reads_a_kept_seed_and_refuses_another_policys_record(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kept = {"run": 88.6, "root": 91.5, "blocking": 90.2, "configurations": 91.4,
            "both": 90.1, "configs": 700, "seconds": 20.0}
    doc = {"trace": "gpushare100", "policy": "gpupack", "slices": list(SLICES),
           "seeds": {"42": kept}}
    (tmp_path / "gpushare100.json").write_text(json.dumps(doc))
    # a kept seed is printed, not computed again (no LP would end this fast in a test)
    assert floors_main(["--traces", "gpushare100", "--out", str(tmp_path)]) == 0
    assert "| gpushare100 | 42 | 88.600 | 91.500 | 90.200 | 91.400 | 90.100 | 20 |" in (
        capsys.readouterr().out)
    with pytest.raises(SystemExit):
        floors_main(["--traces", "gpushare100", "--policy", "fgd", "--out", str(tmp_path)])
    assert "kept for policy gpupack" in capsys.readouterr().err
