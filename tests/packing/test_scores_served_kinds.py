"""The extender's scorer counts a workload's shape in a node's capacity and fragment only
where the node's GPUs take pods of that kind (packing/policies/gpupack.py,
``served_kinds``): time-sliced shares on time-sliced GPUs, MIG pods on MIG GPUs (or whole
GPUs the MIG actuator may convert), whole-GPU pods on whole GPUs; the openb replay's
FRACTIONAL GPUs take whole GPUs and shares alike.

The regression (tests/e2e/test_e2e_burst_packing.py, the second burst): with time-sliced
shares in the workload, a share that names no GPU memory counted as a thousand shares on
every free GPU of a whole-GPU H100 node, so a one-GPU pod's last GPUs there ranked below
a fresh node's, and a burst opened a third node before the second was full."""

from __future__ import annotations

from dataclasses import replace

import pytest
from packing_builders import node, shared, whole

from packing.model import GpuMode, PodRequest, RequestKind, Snapshot
from packing.policies.gpupack import make_gpupack_scorer, served_kinds
from packing.scoring import Score, best_option
from packing.state import ClusterState

WHOLE, SHARED, MIG = RequestKind.WHOLE, RequestKind.SHARED, RequestKind.MIG


@pytest.mark.parametrize(("mode", "reconfigurable", "kinds"), [
    (GpuMode.WHOLE, False, {WHOLE}),
    (GpuMode.WHOLE, True, {WHOLE, MIG}),  # the MIG actuator may convert an idle GPU
    (GpuMode.SHARED, False, {SHARED}),
    (GpuMode.MIG, False, {MIG}),
    (GpuMode.FRACTIONAL, False, {WHOLE, SHARED}),  # the openb replay's GPUs
])
def test_served_kinds(mode: GpuMode, reconfigurable: bool, kinds: set[RequestKind]) -> None:
    info = node("n", gpus=2, mode=mode, reconfigurable=reconfigurable)
    assert served_kinds(ClusterState(Snapshot(nodes=(info,))).nodes["n"]) == kinds


def test_no_gpus_serve_no_kind() -> None:
    info = node("cpu", gpus=0)
    assert served_kinds(ClusterState(Snapshot(nodes=(info,))).nodes["cpu"]) == frozenset()


def _tiny_share(key: str) -> PodRequest:
    """A time-sliced share as ``nvidia.com/gpu.shared: 1`` alone asks: no compute share,
    no GPU memory (1 milli in the typical shapes)."""
    return replace(shared(key, milli=0, gmem=0), cpu_milli=100)


def _preferences(mode: GpuMode, workload: list[PodRequest]) -> list[Score]:
    """The scorer's key (up to the tie-breaks) for one more one-GPU pod on an 8-GPU node
    of ``mode`` holding 0..7 one-GPU pods: the preference part, per fill level."""
    info = node("n", gpus=8, mode=mode, reconfigurable=False)
    scorer = make_gpupack_scorer(Snapshot(nodes=(info,), pending=tuple(workload)))
    state = ClusterState(Snapshot(nodes=(info,)))
    keys: list[Score] = []
    for k in range(8):
        pod = replace(whole(f"ns/g{k}", cpu=100), klass="whole")
        option = best_option(state, pod, scorer)
        assert option is not None
        keys.append(scorer(state, pod, option)[:2])  # (opens whole node, -rank)
        state.apply(pod, option)
    return keys


@pytest.mark.parametrize(("name", "workload"), [
    # The e2e burst's mix: 2 of 3 pods time-sliced shares, 1 of 3 one-GPU pods.
    ("shares and one-GPU pods", [_tiny_share(f"ns/s{i}") if i % 3 else
                                 replace(whole(f"ns/w{i}", cpu=100), klass="whole")
                                 for i in range(48)]),
    ("one-GPU pods only", [replace(whole(f"ns/w{i}", cpu=100), klass="whole")
                           for i in range(16)]),
])
def test_shares_do_not_price_a_whole_gpu_node(name: str, workload: list[PodRequest]) -> None:
    """On a whole-GPU node, no time-sliced share can run: every GPU a one-GPU pod takes
    there, the first to the last, is worth the same to the workload, so the node's
    fill level does not move the pod's preference, and ties go to the node in use."""
    keys = _preferences(GpuMode.WHOLE, workload)
    assert len(set(keys)) == 1, (name, keys)


def test_fractional_gpus_still_count_shares() -> None:
    """The openb replay's GPUs take shares too: there the shares' capacity still prices a
    whole-GPU pod's placement (the replay and the extender rank alike,
    tests/test_one_policy.py), so the fill level may move the preference."""
    workload = [shared(f"ns/s{i}", milli=250) if i % 3 else whole(f"ns/w{i}")
                for i in range(48)]
    keys = _preferences(GpuMode.FRACTIONAL, workload)
    assert len(set(keys)) > 1, keys
