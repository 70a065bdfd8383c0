"""MPS-shared GPUs in the packing model: a share fits an MPS replica only when its memory
need is at most the GPU's memory / replicas (the device plugin's per-client cap)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from packing_builders import node, shared

from packing.catalog import mps_client_mib
from packing.cpsat import SolverParams, solve_batch
from packing.model import GpuMode, NodeInfo, Placement, PodRequest, Snapshot
from packing.state import ClusterState
from packing.validate import validate


def _mps(n: NodeInfo) -> NodeInfo:
    return replace(n, gpus=tuple(replace(g, mps=True) for g in n.gpus))


# L40S 48Gi x 4 replicas: 12Gi per MPS client.
MPS = _mps(node("mps", gpus=1, model="L40S", mode=GpuMode.SHARED, replicas=4))
TS = node("ts", gpus=1, model="L40S", mode=GpuMode.SHARED, replicas=4)


@pytest.mark.parametrize(
    ("pod", "on_mps", "on_ts"),
    [
        (shared("a", milli=0, gmem=8 * 1024), True, True),
        (shared("b", milli=0, gmem=12 * 1024), True, True),  # exactly the cap
        (shared("c", milli=0, gmem=12 * 1024 + 1), False, True),
        (shared("d", milli=0, gmem=30 * 1024), False, True),
    ],
)
def test_mps_cap_per_client(pod: PodRequest, on_mps: bool, on_ts: bool) -> None:
    state = ClusterState(Snapshot((MPS, TS)))
    assert bool(state.options(pod, "mps")) is on_mps
    assert bool(state.options(pod, "ts")) is on_ts


def test_mps_replicas_bound_the_count() -> None:
    pods = tuple(shared(f"p{i}", milli=0, gmem=4 * 1024) for i in range(6))
    snap = Snapshot((MPS,), pending=pods)
    result = solve_batch(ClusterState(snap), pods, params=SolverParams(workers=1, seed=1))
    assert result.status in ("OPTIMAL", "FEASIBLE")
    assert len(result.placements) == 4  # four replicas, though 6 x 4Gi fit in 48Gi
    assert validate(snap, result.placements) == []


def test_validate_refuses_a_share_over_the_mps_cap() -> None:
    big = shared("big", milli=0, gmem=20 * 1024)
    snap = Snapshot((MPS,), pending=(big,))
    errors = validate(snap, [Placement("big", "mps", (0,))])
    assert errors, "a 20Gi share on a 12Gi MPS client must be refused"


@pytest.mark.parametrize(("memory", "replicas", "cap"),
                         [(49152, 4, 12288), (46068, 4, 11517), (49152, 1, 49152),
                          (49152, 0, 49152)])
def test_mps_client_cap(memory: int, replicas: int, cap: int) -> None:
    assert mps_client_mib(memory, replicas) == cap
