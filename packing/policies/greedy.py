"""The greedy engine every named policy shares: pods in order, best option first.

A policy is a *scorer*: for a pod and one concrete option (node, GPU, MIG start) it gives
a sort key, lower is better. The engine walks the pending pods (higher priority first,
otherwise in arrival order), scores every feasible option on every node, applies the
best one, and moves on. A group is placed all-or-nothing: its members are placed one by
one inside one topology domain at a time; if any member finds no room, everything placed
for the group is undone and the whole group is reported unschedulable.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from packing.model import GroupRef, Placement, PodRequest, Unschedulable
from packing.state import ClusterState

Score = tuple[Any, ...]
Scorer = Callable[[ClusterState, PodRequest, Placement], Score]


def order_pods(pending: Sequence[PodRequest]) -> list[PodRequest]:
    """Higher priority first; among equals, arrival order (the input order)."""
    return sorted(pending, key=lambda p: -p.priority)


def best_option(
    state: ClusterState, pod: PodRequest, scorer: Scorer, nodes: Sequence[str] | None = None
) -> Placement | None:
    best: tuple[Score, Placement] | None = None
    for name in nodes if nodes is not None else state.nodes:
        for option in state.options(pod, name, dedupe=True):
            key = scorer(state, pod, option)
            if best is None or key < best[0]:
                best = (key, option)
    return None if best is None else best[1]


def explain_unplaceable(state: ClusterState, pod: PodRequest) -> str:
    """A person-readable reason: the most common per-node reasons, with counts.

    A node that could never take the pod says why (too few GPUs of a usable kind); a
    node that could, once emptied, says what is missing now.
    """
    reasons: dict[str, int] = defaultdict(int)
    for name in state.nodes:
        reasons[state.unresolvable(pod, name) or state.reason(pod, name)] += 1
    if not reasons:
        return "no nodes"
    top = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:2]
    return "; ".join(f"{n} node(s): {r}" for r, n in top)


def topology_domains(state: ClusterState, ref: GroupRef) -> list[list[str]]:
    """Node lists of the group's topology domains, or one domain of every node."""
    if ref.topology_key is None:
        return [list(state.nodes)]
    by_domain: dict[str, list[str]] = defaultdict(list)
    for name, node in state.nodes.items():
        value = node.info.labels.get(ref.topology_key)
        if value is not None:
            by_domain[value].append(name)
    return [by_domain[d] for d in sorted(by_domain)]


def place_group(
    state: ClusterState,
    members: Sequence[PodRequest],
    scorer: Scorer,
    taken_domains: set[tuple[str, str]],
) -> list[Placement] | str:
    """Place every member or none. Returns the placements or the reason it failed."""
    ref = members[0].group
    assert ref is not None
    # Largest members first: they are the hard ones and decide the domain.
    ordered = sorted(members, key=lambda p: (-p.gpu_demand_milli, p.group.index if p.group else 0))
    domains = topology_domains(state, ref)
    if not domains or not any(domains):
        return f"no node carries the topology label {ref.topology_key}"
    best_fit = 0
    for nodes in domains:
        if ref.exclusive and ref.topology_key is not None:
            value = state.nodes[nodes[0]].info.labels[ref.topology_key]
            if (ref.topology_key, value) in taken_domains:
                continue
        done: list[tuple[PodRequest, Placement]] = []
        for pod in ordered:
            choice = best_option(state, pod, scorer, nodes)
            if choice is None:
                break
            state.apply(pod, choice)
            done.append((pod, choice))
        if len(done) == len(ordered):
            if ref.exclusive and ref.topology_key is not None:
                value = state.nodes[nodes[0]].info.labels[ref.topology_key]
                taken_domains.add((ref.topology_key, value))
            return [p for _, p in done]
        best_fit = max(best_fit, len(done))
        for pod, p in reversed(done):
            state.undo(pod, p)
    where = f"any {ref.topology_key} domain" if ref.topology_key else "the cluster"
    return (
        f"group {ref.key} needs all {len(members)} pending pods placed together; "
        f"at most {best_fit} fit in {where}"
    )


def exclusive_domains_in_use(
    state: ClusterState, running: Sequence[PodRequest]
) -> set[tuple[str, str]]:
    taken: set[tuple[str, str]] = set()
    for pod in running:
        ref = pod.group
        if ref is None or not ref.exclusive or ref.topology_key is None:
            continue
        for node in state.nodes.values():
            if pod.key in node.pods:
                value = node.info.labels.get(ref.topology_key)
                if value is not None:
                    taken.add((ref.topology_key, value))
    return taken


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
            result = place_group(state, groups[key], scorer, taken)
            if isinstance(result, str):
                failed.extend(Unschedulable(m.key, result) for m in groups[key])
            else:
                placements.extend(result)
            continue
        choice = best_option(state, pod, scorer)
        if choice is None:
            failed.append(Unschedulable(pod.key, explain_unplaceable(state, pod)))
            continue
        state.apply(pod, choice)
        placements.append(choice)
    return placements, failed
