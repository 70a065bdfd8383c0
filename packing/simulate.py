"""Replay a scenario through a policy: the same placement code the extender uses.

Online mode: every arrival (a pod, or a whole group) is placed on arrival with the
policy's scorer, or fails and is dropped, as kube-scheduler does one pod at a time.
Windowed mode (``window > 1``): arrivals queue until ``window`` of them are pending, then
the policy plans them together (for ``gpupack``: greedy portfolio + CP-SAT), as the
extender's background planner sees a scheduling queue.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from packing.cpsat import SolverParams
from packing.model import Placement, PodRequest, Snapshot
from packing.policies import Policy, get_policy
from packing.policies.engine import greedy
from packing.policies.fgd import typical_shapes
from packing.policies.gpupack import GpupackPolicy
from packing.scenario import Scenario, arrival_pods
from packing.state import ClusterState
from packing.summary import Summary, summarize
from packing.validate import validate

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class SimResult:
    policy: str
    mode: str
    pods_total: int
    pods_placed: int
    groups_total: int
    groups_placed: int
    failed_by_class: dict[str, int]
    summary: Summary
    placements: tuple[tuple[PodRequest, Placement], ...]
    state: ClusterState = field(compare=False, repr=False)


def simulate(
    scenario: Scenario,
    policy_name: str,
    window: int = 1,
    progress: Progress | None = None,
    solver: SolverParams | None = None,
) -> SimResult:
    policy: Policy = (
        GpupackPolicy(solver) if policy_name == "gpupack" and solver else get_policy(policy_name)
    )
    pods = arrival_pods(scenario.arrivals)
    # The typical shapes come from the whole workload, as in the FGD experiment.
    base = Snapshot(scenario.nodes, pending=tuple(pods))
    scorer = policy.make_scorer(base)
    shapes = typical_shapes(pods)
    state = ClusterState(Snapshot(scenario.nodes))
    placed: list[tuple[PodRequest, Placement]] = []
    failed: Counter[str] = Counter()
    queue: list[PodRequest] = []
    groups_total = sum(1 for a in scenario.arrivals if a[0].group is not None)
    groups_placed = 0
    by_key = {p.key: p for p in pods}

    def flush() -> None:
        nonlocal groups_placed
        if not queue:
            return
        if window > 1:
            snap = Snapshot(scenario.nodes, tuple(placed), tuple(queue))
            result = policy.plan(snap)
            new = list(result.placements)
            for p in new:
                state.apply(by_key[p.pod], p)
        else:
            new, _ = greedy(state, queue, scorer, [p for p, _ in placed])
        got = {p.pod for p in new}
        placed.extend((by_key[p.pod], p) for p in new)
        for pod in queue:
            if pod.key not in got:
                failed[pod.klass] += 1
        groups_placed += len({by_key[k].group.key for k in got if by_key[k].group is not None})  # type: ignore[union-attr]
        queue.clear()

    for i, arrival in enumerate(scenario.arrivals):
        queue.extend(arrival)
        if window <= 1 or len(queue) >= window:
            flush()
        if progress is not None:
            progress(i + 1, len(scenario.arrivals))
    flush()
    errors = validate(Snapshot(scenario.nodes, pending=tuple(pods)), [p for _, p in placed])
    if errors:
        raise AssertionError(f"simulation of {policy_name} produced an invalid state: {errors[:3]}")
    return SimResult(
        policy=policy_name,
        mode="online" if window <= 1 else f"window={window}",
        pods_total=len(pods),
        pods_placed=len(placed),
        groups_total=groups_total,
        groups_placed=groups_placed,
        failed_by_class=dict(sorted(failed.items())),
        summary=summarize(state, shapes),
        placements=tuple(placed),
        state=state,
    )


def compare(
    scenario: Scenario,
    policies: Sequence[str],
    window: int = 1,
    progress: Progress | None = None,
    solver: SolverParams | None = None,
) -> list[SimResult]:
    return [simulate(scenario, p, window, progress, solver) for p in policies]
