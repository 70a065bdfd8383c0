"""One line per placement, for people: what the pod takes, how many nodes could have
taken it, and what is left for whole-GPU pods. Pure: works on a ClusterState the caller
owns (``placement_reason`` applies the placement to it)."""

from __future__ import annotations

from packing.model import GpuMode, Placement, PodRequest, RequestKind
from packing.state import ClusterState, describe


def _taken(state: ClusterState, pod: PodRequest, p: Placement) -> str:
    """What the placement takes, read before it is applied."""
    if pod.kind is RequestKind.WHOLE:
        gpus = ",".join(map(str, p.gpus))
        return f"{len(p.gpus)} whole GPU(s) {gpus}"
    if pod.kind is RequestKind.MIG and p.mig_profile is not None:
        g = state.gpu(p.node, p.gpus[0])
        where = f"MIG {p.mig_profile} slice at start {p.mig_start} of GPU {p.gpus[0]}"
        if p.mig_created and g.mode is GpuMode.MIG and not g.converted:
            return f"{where}, created in free room of the partitioned GPU"
        if p.mig_created:
            return f"{where}, created on an idle GPU switched to MIG"
        return f"{where}, a free instance that already exists"
    if pod.kind is RequestKind.SHARED:
        g = state.gpu(p.node, p.gpus[0])
        before = "an unused GPU" if not g.shared_owners else (
            f"a GPU already shared by {len(g.shared_owners)} pod(s)")
        return f"GPU share {describe(pod).removeprefix('GPU share ')} of GPU {p.gpus[0]} ({before})"
    return "no GPU (CPU and memory fit)"


def placement_reason(state: ClusterState, pod: PodRequest, p: Placement) -> str:
    """Why ``p`` (one line), then apply it to ``state``: the next pod's reason sees it."""
    fit = sum(1 for name in state.nodes if state.options(pod, name, dedupe=True))
    taken = _taken(state, pod, p)
    state.apply(pod, p)
    return (f"{taken}; {fit} of {len(state.nodes)} node(s) fit; after it "
            f"{state.whole_nodes_free()} whole node(s) and {state.whole_gpus_free()} whole "
            "GPU(s) stay free")
