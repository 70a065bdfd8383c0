"""The extender's scorer applies the sum-of-squares price (packing/policies/squares.py) to
time-sliced shares only, from the histogram it holds: a MIG pod's rank (after its MIG
preference) does not move with the histogram, a share's does."""

from __future__ import annotations

from packing_builders import mig, node, shared, whole

from packing.model import GpuMode, Snapshot
from packing.policies.gpupack import free_sizes, make_gpupack_scorer, share_gpu_free
from packing.state import ClusterState


def test_the_price_moves_shares_and_not_mig_pods() -> None:
    # w = 12,000 / (12,000 + 20 x 300 + 2 MIG slices) ~ 0.66: the price is on.
    workload = ([whole(f"a/w{i}") for i in range(12)]
                + [shared(f"a/s{i}", milli=300) for i in range(20)]
                + [mig(f"a/m{i}") for i in range(2)])
    nodes = (node("t", gpus=4, model="L40S", mode=GpuMode.SHARED),
             node("m", gpus=2, mode=GpuMode.MIG))
    scorer = make_gpupack_scorer(Snapshot(nodes=nodes, pending=tuple(workload)))
    squares = scorer.rules.squares  # type: ignore[attr-defined]
    assert squares is not None and squares.active
    state = ClusterState(Snapshot(nodes=nodes))
    first = shared("a/r0", milli=300)
    state.apply(first, next(iter(state.options(first, "t"))))
    counts, gpus = free_sizes(share_gpu_free(n) for n in state.nodes.values())
    assert gpus == 4 and counts.sum() == 1  # one time-sliced GPU partly used
    held = scorer.at_free_sizes(counts, gpus)  # type: ignore[attr-defined]

    share = shared("a/r1", milli=300)
    share_opts = list(state.options(share, "t"))
    moved = [scorer.rank(state, share, o) != held.rank(state, share, o)  # type: ignore[attr-defined]
             for o in share_opts]
    assert any(moved)
    slice_pod = mig("a/q")
    mig_opts = list(state.options(slice_pod, "m"))
    assert mig_opts
    for o in mig_opts:
        assert scorer.rank(state, slice_pod, o) == held.rank(state, slice_pod, o)  # type: ignore[attr-defined]
