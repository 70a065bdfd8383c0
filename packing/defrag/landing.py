"""Where the pods a move evicts land: the check that every one of them fits elsewhere.

Called on a :class:`ClusterState` from which the evicted pods are gone and on which the
group's room is already taken, so no evicted pod can land on it. First the extender's own
greedy preference, pod by pod, largest first (what kube-scheduler and gpupack would do
with the replacement pods, one at a time); when that leaves one out, CP-SAT places them
together (:func:`packing.cpsat.solve_batch`), which finds room the greedy order missed.
A pod never "lands" on the placement it is evicted from.
"""

from __future__ import annotations

from collections.abc import Sequence

from packing.cpsat import SolverParams, solve_batch
from packing.model import Placement, PodRequest
from packing.policies.gpupack import GpupackScorer
from packing.scoring import Scorer
from packing.state import ClusterState, PlacementError


def _size(pod: PodRequest) -> tuple[int, int, int, str]:
    return (-pod.gpu_demand_milli, -pod.gpu_count, -pod.cpu_milli, pod.key)


def _best(state: ClusterState, pod: PodRequest, old: Placement, scorer: Scorer
          ) -> Placement | None:
    best: tuple[tuple[object, ...], Placement] | None = None
    for name in state.nodes:
        for o in state.options(pod, name, dedupe=True):
            if o == old:
                continue
            key = scorer(state, pod, o)
            if best is None or key < best[0]:
                best = (key, o)
    return None if best is None else best[1]


def land_greedy(state: ClusterState,
                victims: Sequence[tuple[PodRequest, Placement]]) -> list[Placement] | None:
    """Each victim applied where the greedy preference puts it; None (state unchanged)
    when one finds no room."""
    done: list[tuple[PodRequest, Placement]] = []
    # The extender's scorer, with the evicted pods as the workload it keeps room for.
    scorer = GpupackScorer(pod for pod, _ in victims)
    for pod, old in sorted(victims, key=lambda v: _size(v[0])):
        p = _best(state, pod, old, scorer)
        if p is None:
            for q, pl in reversed(done):
                state.undo(q, pl)
            return None
        state.apply(pod, p)
        done.append((pod, p))
    return [p for _, p in done]


def land(state: ClusterState, victims: Sequence[tuple[PodRequest, Placement]],
         max_time_s: float | None, seed: int = 0) -> list[Placement] | None:
    """Landing places for every victim, applied to ``state``; None (state unchanged)
    when neither the greedy pass nor CP-SAT (``max_time_s``; None: no limit) finds them."""
    got = land_greedy(state, victims)
    if got is not None or not victims:
        return got
    limit = 1e9 if max_time_s is None else max_time_s
    pods = [pod for pod, _ in victims]
    res = solve_batch(state, pods, params=SolverParams(max_time_s=limit, workers=1, seed=seed,
                                                       max_wall_s=limit))
    old = {pod.key: p for pod, p in victims}
    if len(res.placements) != len(pods) or any(p == old[p.pod] for p in res.placements):
        return None
    by_key = {p.key: p for p in pods}
    done: list[tuple[PodRequest, Placement]] = []
    try:
        for p in res.placements:
            state.apply(by_key[p.pod], p)
            done.append((by_key[p.pod], p))
    except PlacementError:
        for q, pl in reversed(done):
            state.undo(q, pl)
        return None
    return [p for _, p in done]
