"""Scorers and the option search every greedy placement shares.

A policy is a *scorer*: for a pod and one concrete option (node, GPU, MIG start) it gives
a sort key, lower is better. :func:`best_option` is the best option of a pod over some
nodes; :func:`topology_domains` the node lists of a group's domains. The engine that
walks the pending pods is :mod:`packing.policies.engine`; group placement is
:mod:`packing.groups.placement`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from packing.model import GroupRef, Placement, PodRequest
from packing.state import ClusterState

Score = tuple[Any, ...]
Scorer = Callable[[ClusterState, PodRequest, Placement], Score]


def order_pods(pending: Sequence[PodRequest]) -> list[PodRequest]:
    """Higher priority first; among equals, arrival order (the input order)."""
    return sorted(pending, key=lambda p: -p.priority)


def in_use_first(state: ClusterState, name: str) -> tuple[int, int, str]:
    """The order among nodes the policy rates equal: least free CPU, then memory (a node
    already in use first), then the name, as the replay's scorers end their keys (the
    part the extender's preference drops).

    Why in use first: kube-scheduler's sampling (percentageOfNodesToScore) shows each
    pod another window of the nodes; a node in use is preferred in every window that
    holds it, where a name order alone picks a fresh node in each window. The policy
    itself can rate a used node and an empty one equal (a time-sliced share that names no
    GPU memory counts as almost nothing)."""
    node = state.nodes[name]
    return (node.cpu_free, node.mem_free, name)


def winner(prefs: Mapping[str, Score], state: ClusterState) -> str | None:
    """The node the policy places the pod on among ``prefs`` (its preference per fitting
    node): the best preference, ties by :func:`in_use_first`.

    Why one node and a fixed tie-break: kube-scheduler breaks equal total scores at
    random (schedule_one.go, prioritizeNodes: a random ``Randomizer`` per node whenever
    an extender scores), and in a burst the next pod's prioritize comes before the
    previous pod's bind has reached gpupack (kube-scheduler binds asynchronously). With
    every empty node tied, two pods in a row then open two nodes; with a fixed order
    both see the same first node, whatever gpupack knows of the other's bind yet, and
    kube-scheduler's own Filter (which counts its assumed pods) moves on once it is
    full."""
    if not prefs:
        return None
    return min(prefs, key=lambda n: (prefs[n], in_use_first(state, n)))


def rank_priorities(prefs: Mapping[str, Score], names: Sequence[str], best: str | None,
                    top: int) -> dict[str, int]:
    """The extender's prioritize answer (0..``top``) over ``names`` from the policy's
    preference per node (lower is better; absent: no preference, 0): ``top`` for
    ``best`` alone; the others by the rank of their preference among the distinct ones,
    the best ``top`` - 1, the worst 0, linear between (all ``top`` - 1 when they are
    equal). The one mapping of ``scheduler/extender/verbs.py``'s prioritize and the day
    replay's model of it (``packing.policies.kube_default.extender_priorities``)."""
    rest = top - 1
    distinct = sorted(set(prefs.values()))
    rank = {k: i for i, k in enumerate(distinct)}
    span = max(len(distinct) - 1, 1)
    out = {}
    for n in names:
        if n == best:
            out[n] = top
        elif n not in prefs:
            out[n] = 0
        elif len(distinct) > 1:
            out[n] = round(rest * (span - rank[prefs[n]]) / span)
        else:
            out[n] = rest
    return out


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
