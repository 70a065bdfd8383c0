"""Cluster-level figures of a state: allocation, whole GPUs and nodes free, fragmentation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from packing.policies.fgd import Shape, cluster_fragmentation
from packing.state import ClusterState


@dataclass(frozen=True)
class Summary:
    gpus_total: int
    gpus_allocated: float  # allocated GPU capacity in GPUs (a 1g.10gb slice counts 1/8)
    whole_gpus_free: int  # GPUs nobody uses
    whole_nodes_free: int  # GPU nodes whose GPUs nobody uses
    fragmentation: float  # share of idle GPU capacity the typical pods cannot use (FGD)

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)


def summarize(state: ClusterState, shapes: Sequence[tuple[Shape, float]]) -> Summary:
    gpus = [g for n in state.nodes.values() for g in n.gpus]
    used = sum(g.used_milli for g in gpus) / 1000
    return Summary(
        gpus_total=len(gpus),
        gpus_allocated=round(used, 3),
        whole_gpus_free=state.whole_gpus_free(),
        whole_nodes_free=state.whole_nodes_free(),
        fragmentation=round(cluster_fragmentation(state, shapes), 4),
    )
