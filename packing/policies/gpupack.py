"""The ``gpupack`` policy: greedy portfolio, then CP-SAT over the batch.

1. Greedy answers from two scorers (gpupack's own and best fit) on the same snapshot.
2. CP-SAT (:mod:`packing.cpsat`) solves the whole batch, hinted with the better greedy
   answer, under an explicit time limit, worker count and seed. OPTIMAL and FEASIBLE
   answers are both accepted; UNKNOWN, a model too large to build, or an answer the
   validator rejects fall back to the greedy answer.
3. Of all valid candidates the one with the best objective key wins (see
   :func:`objective_key`), so gpupack never does worse on that key than best fit.
"""

from __future__ import annotations

from collections.abc import Sequence

from packing.cpsat import SolverParams, priority_weights, solve_batch
from packing.model import Placement, PlanResult, PodRequest, Snapshot, Unschedulable
from packing.policies.base import checked
from packing.policies.fgd import (
    NodeFigures,
    fragmentation_delta,
    typical_shapes,
    workload_of,
)
from packing.policies.greedy import Score, Scorer, exclusive_domains_in_use, greedy
from packing.policies.scores import bestfit, gpupack_greedy
from packing.state import ClusterState
from packing.validate import validate


def make_gpupack_scorer(snapshot: Snapshot) -> Scorer:
    shapes = typical_shapes(workload_of(snapshot))
    memo: dict[int, NodeFigures] = {}  # by node state version (see fragmentation_delta)

    def score(state: ClusterState, pod: PodRequest, option: Placement) -> Score:
        delta = fragmentation_delta(state, pod, option, shapes, memo)
        return gpupack_greedy(state, pod, option, delta)

    return score


def objective_key(snapshot: Snapshot, placements: Sequence[Placement]) -> tuple[int, ...]:
    """Higher is better: (weighted pods placed, whole nodes free, whole GPUs free,
    existing MIG instances reused, -nodes touched). Same order as the CP-SAT objective."""
    state = ClusterState(snapshot)
    pods = {p.key: p for p in snapshot.pending}
    weights = priority_weights(snapshot.pending)
    touched = set()
    reused = 0
    for p in placements:
        state.apply(pods[p.pod], p, allow_overcommit=True)
        touched.add(p.node)
        if p.mig_profile is not None and not p.mig_created:
            reused += 1
    return (
        sum(weights[p.pod] for p in placements),
        state.whole_nodes_free(),
        state.whole_gpus_free(),
        reused,
        -len(touched),
    )


class GpupackPolicy:
    name = "gpupack"

    def __init__(self, params: SolverParams | None = None) -> None:
        self.params = params or SolverParams()
        self.last_status = "greedy"

    def make_scorer(self, snapshot: Snapshot) -> Scorer:
        return make_gpupack_scorer(snapshot)

    def plan(self, snapshot: Snapshot) -> PlanResult:
        running = [p for p, _ in snapshot.running]
        candidates: list[tuple[str, list[Placement], list[Unschedulable]]] = []
        for label, scorer in (("greedy", self.make_scorer(snapshot)), ("greedy-bestfit", bestfit)):
            placements, failed = greedy(ClusterState(snapshot), snapshot.pending, scorer, running)
            candidates.append((label, placements, failed))
        best_greedy = max(candidates, key=lambda c: objective_key(snapshot, c[1]))
        status = "greedy"
        if snapshot.pending:
            state = ClusterState(snapshot)
            taken = frozenset(exclusive_domains_in_use(state, running))
            solved = solve_batch(state, snapshot.pending, best_greedy[1], self.params, taken)
            status = solved.status
            if solved.placements and not validate(snapshot, solved.placements, check_running=False):
                placed = {p.pod for p in solved.placements}
                # Reasons for the pods CP-SAT left out come from the greedy pass.
                reasons = {u.pod: u.reason for _, _, f in candidates for u in f}
                failed = [
                    Unschedulable(p.key, reasons.get(p.key, "no room in the batch solution"))
                    for p in snapshot.pending
                    if p.key not in placed
                ]
                # First in the list: on a tie of the objective key the solver's answer wins.
                candidates.insert(0, (f"cpsat-{solved.status}", list(solved.placements), failed))
            elif solved.placements:
                status = f"{solved.status}-invalid"
        label, placements, failed = max(candidates, key=lambda c: objective_key(snapshot, c[1]))
        if not label.startswith("cpsat"):
            status = f"{status}/fallback-{label}" if status != "greedy" else label
        self.last_status = status
        return checked(
            snapshot, PlanResult(tuple(placements), tuple(failed), self.name, solver_status=status)
        )
