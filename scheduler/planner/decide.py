"""The planner's pure choices: which nodes a batch is planned over (:func:`pick_candidates`:
the classes of equal nodes the scorer likes best for each shape of the batch, as many as
its pods need, at most ``max_nodes``), how many pods of a shape a node takes
(:func:`node_capacity`), why a pod fits no class of nodes (:func:`explain_by_class`),
when the typical shapes moved enough to replace the scorer (:func:`close_shapes`), and
the wait after failed solves (:func:`backoff_s`). Nothing here does I/O, takes a lock
or reads a clock; :mod:`scheduler.planner.loop` calls them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any

from packing.constraints import selector_miss
from packing.model import NodeInfo, Placement, PodRequest, Snapshot
from packing.policies.fgd import (
    Shape,
)
from packing.scoring import Score, order_pods
from packing.state import ClusterState
from scheduler.backoff import doubling
from scheduler.memo.decide import shape_key

SHAPE_TOLERANCE = 0.05
PLAN_NODES = 64  # default cap on the nodes one plan is made over (see pick_candidates)


# After a failed solve the next is tried in 1, 2, 4 .. BACKOFF_MAX_S seconds (backoff_s).
BACKOFF_MAX_S = 60.0


CAPACITY_LIMIT = 8  # pods of one shape counted on one node (see node_capacity)


# (pod without its selector, its node's signature, a node of that signature) -> the
# scorer's best key there and how many pods of the shape the node takes (at most
# CAPACITY_LIMIT), or None where the pod does not fit.
Rank = Callable[[PodRequest, int, str], tuple[Score, int] | None]


def node_capacity(info: NodeInfo, running: Sequence[tuple[PodRequest, Placement]],
                  pod: PodRequest, limit: int = CAPACITY_LIMIT) -> int:
    """How many pods like ``pod`` fit on the node one after another (each on the first
    option left), up to ``limit``: on a copy of the node alone."""
    state = ClusterState(Snapshot((info,), tuple(running)))
    for i in range(limit):
        copy = replace(pod, key=f"{pod.key}#{i}")
        options = state.options(copy, info.name, dedupe=True)
        if not options:
            return i
        state.apply(copy, options[0])
    return limit


@dataclass
class ShapeNeed:
    need: int  # pods of the shape in the batch
    classes: list[tuple[list[str], int]]  # (nodes allowed, pods one of them takes), best first
    covered: int = 0  # pods the nodes picked for it could take
    next: int = 0  # the next class to take nodes from


def pick_candidates(labels: Callable[[str], Mapping[str, str]], signatures: Mapping[str, int],
                    batch: Sequence[PodRequest], per_class: int, max_nodes: int,
                    rank: Rank) -> tuple[list[str], set[str]]:
    """The nodes to plan ``batch`` over, best first, and the batch pods that fit no node.

    Nodes with equal signatures (:func:`kube.signatures.node_signature`) are
    interchangeable to the policies but for their labels. For each shape of the batch the
    classes of equal nodes it fits are ranked by ``rank`` (the policy's scorer on one
    node of the class: the classes the greedy answer would pick come first). Then, round
    by round and higher priority first, each shape whose pods the nodes picked so far
    could not all take gets nodes of its next-best class: as many as its pods still need
    (by how many one node takes), at most ``per_class``, that satisfy the shape's node
    selector. Once every shape is covered, more rounds give each shape its next class
    (up to ``per_class`` nodes, at most one per pod of the shape) for the plan to choose
    from, until ``max_nodes`` (0: no cap) are picked. So a plan is made over at most
    ``max_nodes`` nodes however many nodes and classes the cluster has. A node is
    counted for one shape only: a shape whose class another shape took nodes of gets the
    class's other nodes (two shapes of 8 pods that take a whole node each, on a class of
    20 equal nodes, get 16 of them, not the same 8 counted twice); the plan, not this,
    decides who gets which node.
    """
    classes: dict[int, list[str]] = {}
    # Members in name order: of equal nodes the plan gets the ones the extender's
    # prioritize prefers (scheduler.extender.verbs.winner: ties by name), so the pods the
    # plan places and those kube-scheduler places before the plan exists fill the same
    # nodes, not two sets of half-used ones.
    for name, sid in sorted(signatures.items()):
        classes.setdefault(sid, []).append(name)
    by_shape: dict[tuple[Any, ...], list[PodRequest]] = {}
    for pod in order_pods(batch):
        by_shape.setdefault(shape_key(pod), []).append(pod)
    placeable: set[str] = set()
    shapes: list[ShapeNeed] = []
    for pods in by_shape.values():
        pod = pods[0]
        selector = tuple(pod.node_selector.items())
        bare = replace(pod, node_selector={}) if selector else pod
        ranked: list[tuple[Score, int, list[str], int]] = []
        for sid, members in classes.items():
            found = rank(bare, sid, members[0])
            if found is None:
                continue
            allowed = [m for m in members
                       if all(labels(m).get(k) == v for k, v in selector)]
            if allowed:
                ranked.append((found[0], sid, allowed, max(1, found[1])))
        if ranked:
            placeable.update(p.key for p in pods)
            ranked.sort(key=lambda r: (r[0], r[1]))
            shapes.append(ShapeNeed(len(pods), [(r[2], r[3]) for r in ranked]))
    keep: dict[str, None] = {}

    def full() -> bool:
        return bool(max_nodes) and len(keep) >= max_nodes

    def take(shape: ShapeNeed, count: int) -> None:
        members, capacity = shape.classes[shape.next]
        shape.next += 1
        # Only nodes no shape has yet: one another shape took holds its pods, so it covers
        # none of this shape's (counting it again left pods without a node in the job).
        for m in islice((m for m in members if m not in keep), count):
            if full():
                return
            keep[m] = None
            shape.covered += capacity

    # Cover every shape's pods first, then more choice, round by round.
    while not full():
        short = [x for x in shapes if x.covered < x.need and x.next < len(x.classes)]
        if not short:
            break
        for x in short:
            members, capacity = x.classes[x.next]
            take(x, min(per_class, -(-(x.need - x.covered) // capacity)))
    while not full():
        left = [x for x in shapes if x.next < len(x.classes)]
        if not left:
            break
        for x in left:
            take(x, min(per_class, x.need))
    return list(keep), placeable


def backoff_s(failures: int) -> float:
    """Seconds to wait after ``failures`` solves in a row failed: 2^(failures - 1), at
    most BACKOFF_MAX_S (:func:`scheduler.backoff.doubling`)."""
    return doubling(1.0, failures, BACKOFF_MAX_S)


def _selector_reason(selector: Sequence[tuple[str, str]], labels: Mapping[str, str]
                     ) -> str | None:
    """:func:`packing.state.fits_node`'s reason for a node whose labels miss the pod's
    node selector (None: they match)."""
    miss = selector_miss(selector, labels)
    return None if miss is None else f"node selector {miss[0]}={miss[1]} does not match"


def explain_by_class(pod: PodRequest, classes: Mapping[int, Sequence[str]],
                     labels: Callable[[str], Mapping[str, str]],
                     misfit: Mapping[int, tuple[str, bool]]) -> str:
    """:func:`packing.scoring.explain_unplaceable` of ``pod`` over every node of the
    cluster, from one evaluation per class of equal nodes: the text a plan over every
    node gives (a plan over candidate nodes holds none the pod fits, and said "no nodes").

    ``misfit[sid]``: for the pod without its node selector on a node of class ``sid``,
    (the node's reason, whether its labels cannot change it); no entry where it fits.
    A node's reason is ``unresolvable or reason`` (as explain_unplaceable takes it); only
    ``reason`` depends on the labels, through the node selector, which
    :func:`packing.state.fits_node` checks after the cordon and before the rest. So the
    labels count only on a node that could take the pod some day and is not cordoned,
    and where the pod without its selector fits, the selector is the reason."""
    selector = tuple(pod.node_selector.items())
    reasons: Counter[str] = Counter()
    for sid, members in classes.items():
        got = misfit.get(sid)
        if got is not None and (got[1] or not selector):
            reasons[got[0]] += len(members)
            continue
        for m in members:
            why = _selector_reason(selector, labels(m))
            reasons[why or ("fits" if got is None else got[0])] += 1
    if not reasons:
        return "no nodes"
    top = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:2]
    return "; ".join(f"{n} node(s): {r}" for r, n in top)


def bare_shapes(batch: Sequence[PodRequest]) -> dict[tuple[Any, ...], PodRequest]:
    """One pod of each shape of ``batch`` without its node selector (selectors are checked
    per node by :func:`pick_candidates`; a node state's memo entries hold for any), by
    :func:`scheduler.memo.decide.shape_key`."""
    out: dict[tuple[Any, ...], PodRequest] = {}
    for pod in batch:
        bare = replace(pod, node_selector={}) if pod.node_selector else pod
        out.setdefault(shape_key(bare), bare)
    return out


def close_shapes(a: list[tuple[Shape, float]], b: list[tuple[Shape, float]]) -> bool:
    if Counter(s for s, _ in a) != Counter(s for s, _ in b):
        return False
    wb = dict(b)
    return all(abs(w - wb[s]) <= SHAPE_TOLERANCE for s, w in a)
