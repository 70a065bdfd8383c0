"""The greedy engine every named policy shares: pods in order, best option first.

The engine walks the pending pods (higher priority first, otherwise in arrival order),
scores every feasible option on every node with the policy's scorer
(:mod:`packing.scoring`), applies the best one, and moves on. A group is placed
all-or-nothing by :func:`packing.groups.placement.place_members` (member by member, in
the first topology domain that takes them all); if it does not fit, every member is
reported unschedulable with the refusal's reasons.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from packing.groups.placement import exclusive_domains_in_use, place_members
from packing.model import Placement, PodRequest, Unschedulable
from packing.scoring import Scorer, best_option, explain_unplaceable, order_pods
from packing.state import ClusterState
from packing.status import Status


def greedy(
    state: ClusterState,
    pending: Sequence[PodRequest],
    scorer: Scorer,
    running: Sequence[PodRequest] = (),
) -> tuple[list[Placement], list[Unschedulable]]:
    """Place ``pending`` onto ``state`` (mutated) with ``scorer``."""
    placements: list[Placement] = []
    failed: list[Unschedulable] = []
    groups: dict[str, list[PodRequest]] = defaultdict(list)
    for pod in pending:
        if pod.group is not None:
            groups[pod.group.key].append(pod)
    taken = exclusive_domains_in_use(state, running)
    done_groups: set[str] = set()
    for pod in order_pods(pending):
        if pod.group is not None:
            key = pod.group.key
            if key in done_groups:
                continue
            done_groups.add(key)
            members = groups[key]
            got = place_members(state, members, scorer, taken, exact=False)
            if isinstance(got, Status):
                failed.extend(Unschedulable(m.key, got.message) for m in members)
                continue
            for m, p in zip(members, got.placements, strict=True):
                state.apply(m, p)
            placements.extend(got.placements)
            ref = pod.group
            if ref.exclusive and ref.topology_key is not None and got.domain is not None:
                taken.add((ref.topology_key, got.domain))
            continue
        choice = best_option(state, pod, scorer)
        if choice is None:
            failed.append(Unschedulable(pod.key, explain_unplaceable(state, pod)))
            continue
        state.apply(pod, choice)
        placements.append(choice)
    return placements, failed
