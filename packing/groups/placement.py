"""Pure placement of LLM groups: which domain and which node/GPUs each member gets, and
which lower-priority pods to evict so a whole group fits. Nothing here keeps state or
does I/O: each function leaves the ``ClusterState`` it is given as it was.

Used by the policies' greedy engine (:func:`packing.policies.engine.greedy`, member by
member in the first domain that takes them all), the extender's reservation book
(``scheduler/groups/decide.py``) and its preemption answer. Refusals are
:class:`~packing.status.Status` values whose check says which rule refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from packing.groups.members import CLIQUE_LABEL, is_reservation
from packing.groups.solver import GroupSolverParams, applicable, solve_group
from packing.model import GroupRef, Placement, PodRequest
from packing.scoring import Scorer, best_option, topology_domains
from packing.state import ClusterState
from packing.status import Status

# Checks that refuse a group (Status.check).
TOPOLOGY_LABEL = "TopologyLabel"  # no node carries the group's topology key
EXCLUSIVE_DOMAIN = "ExclusiveDomain"  # every domain is taken by another exclusive group
GROUP_FIT = "GroupFit"  # no domain holds all the members still to place


class GroupFit(NamedTuple):
    placements: list[Placement]  # in the order of the members asked for
    domain: str | None  # the topology domain they are in (None: no topology key)


def exclusive_domains_in_use(
    state: ClusterState, running: Sequence[PodRequest]
) -> set[tuple[str, str]]:
    """(:attr:`GroupRef.exclusive_key`, domain) of every exclusive group with a running
    member."""
    taken: set[tuple[str, str]] = set()
    for pod in running:
        ref = pod.group
        if ref is None or not ref.exclusive or ref.topology_key is None:
            continue
        for node in state.nodes.values():
            if pod.key in node.pods:
                value = node.info.labels.get(ref.topology_key)
                if value is not None:
                    taken.add((ref.exclusive_key, value))
    return taken


def effective_ref(state: ClusterState, ref: GroupRef) -> GroupRef:
    """The group's topology: its own key, else the NVLink clique label when nodes carry it."""
    if ref.topology_key is not None:
        return ref
    if any(CLIQUE_LABEL in n.info.labels for n in state.nodes.values()):
        return replace(ref, topology_key=CLIQUE_LABEL)
    return ref


def domain_of(state: ClusterState, ref: GroupRef, node: str) -> str | None:
    if ref.topology_key is None or node not in state.nodes:
        return None
    return state.nodes[node].info.labels.get(ref.topology_key)


def place_members(
    state: ClusterState,
    members: Sequence[PodRequest],
    scorer: Scorer,
    taken: set[tuple[str, str]],
    domain: str | None = None,
    solver_params: GroupSolverParams | None = None,
    exact: bool = True,
) -> GroupFit | Status:
    """Place every member inside one topology domain, or none; ``state`` is left as it
    was. Returns the placements (in the order of ``members``) and the domain, or the
    :class:`~packing.status.Status` saying why not (checks ``TOPOLOGY_LABEL``,
    ``EXCLUSIVE_DOMAIN``, ``GROUP_FIT``).

    ``domain``: only that domain (a group some of whose members are already bound).
    Whole-GPU groups are solved with CP-SAT (:func:`packing.groups.solver.solve_group`:
    the domain and nodes best for the whole group); others, or when the solver has no
    answer in time, member by member in the first domain that takes them all.
    ``exact=False``: greedy only (whether a group fits, asked many times over by the
    preemption search, where the best layout does not matter).
    """
    ref = members[0].group
    assert ref is not None
    ordered = sorted(members, key=lambda p: (-p.gpu_demand_milli, p.group.index if p.group else 0))
    domains = topology_domains(state, ref)
    if not domains or not any(domains):
        return Status.unresolvable(TOPOLOGY_LABEL,
                                   f"no node carries the topology label {ref.topology_key}")
    skipped = 0
    eligible: list[tuple[list[str], str | None]] = []
    for nodes in domains:
        value = domain_of(state, ref, nodes[0])
        if domain is not None and value != domain:
            continue
        if ref.exclusive and ref.topology_key is not None and (ref.exclusive_key, value) in taken:
            skipped += 1
            continue
        eligible.append((nodes, value))
    if exact and applicable(members) and eligible:
        # Whole-GPU groups: CP-SAT picks the domain and every member's node together
        # (packing/groups/solver.py); greedy below when it has no answer in time.
        solved = solve_group(state, members, [nodes for nodes, _ in eligible], solver_params)
        if solved.placements is not None and solved.domain is not None:
            return GroupFit(list(solved.placements), eligible[solved.domain][1])
        # INFEASIBLE: the greedy pass below fails too and says how close it came.
    found = _greedy_in(state, ordered, scorer, eligible)
    if not isinstance(found, int):
        placements, value = found
        by_key = {p.pod: p for p in placements}
        return GroupFit([by_key[m.key] for m in members], value)
    return _no_fit(ref, members, domain, skipped, len(domains), found)


def _greedy_in(
    state: ClusterState, ordered: Sequence[PodRequest], scorer: Scorer,
    eligible: Sequence[tuple[list[str], str | None]],
) -> tuple[list[Placement], str | None] | int:
    """Member by member, largest first, in the first domain that takes them all (as
    :func:`packing.policies.engine.greedy`); else the most members any domain
    took. ``state`` is left as it was."""
    best_fit = 0
    for nodes, value in eligible:
        done: list[tuple[PodRequest, Placement]] = []
        for pod in ordered:
            choice = best_option(state, pod, scorer, nodes)
            if choice is None:
                break
            state.apply(pod, choice)
            done.append((pod, choice))
        for pod, p in reversed(done):
            state.undo(pod, p)
        if len(done) == len(ordered):
            return [p for _, p in done], value
        best_fit = max(best_fit, len(done))
    return best_fit


def _no_fit(ref: GroupRef, members: Sequence[PodRequest], domain: str | None, skipped: int,
            n_domains: int, best_fit: int) -> Status:
    if skipped and skipped == n_domains:
        return Status.unschedulable(
            EXCLUSIVE_DOMAIN,
            f"every {ref.topology_key} domain is taken by another exclusive group")
    where = f"any {ref.topology_key} domain" if ref.topology_key else "the cluster"
    if domain is not None:
        where = f"{ref.topology_key}={domain}, where its bound members are"
    return Status.unschedulable(
        GROUP_FIT, f"the whole group of {ref.size} does not fit in {where} "
        f"(at most {best_fit} of the {len(members)} members still to place fit)")


@dataclass(frozen=True)
class EvictionCandidate:
    """A pod that could be evicted: its request and where it is counted."""

    uid: str
    req: PodRequest
    placement: Placement


def group_victims(
    state: ClusterState,
    members: Sequence[PodRequest],
    scorer: Scorer,
    candidates: Iterable[EvictionCandidate],
    taken: set[tuple[str, str]],
) -> list[EvictionCandidate] | None:
    """The fewest lower-priority pods whose eviction lets the whole group fit in one
    domain (then the lowest total priority); None when no domain works. ``state`` is
    left exactly as it was."""
    ref = members[0].group
    assert ref is not None
    prio = max(m.priority for m in members)
    usable = [c for c in candidates if c.req.priority < prio and not is_reservation(c.req.key)]
    best: list[EvictionCandidate] | None = None
    for nodes in topology_domains(state, ref):
        value = domain_of(state, ref, nodes[0])
        if ref.exclusive and ref.topology_key is not None and (ref.exclusive_key, value) in taken:
            continue
        names = set(nodes)
        inside = [c for c in usable if c.placement.node in names]
        per_node = Counter(c.placement.node for c in inside)
        # Lowest priority first; then nodes with the fewest pods to evict (an emptied
        # node is what a whole-GPU member needs), a node's pods together.
        local = sorted(inside, key=lambda c: (
            c.req.priority, per_node[c.placement.node], c.placement.node, c.req.key))
        chosen = _victims_in(state, members, scorer, taken, value, local)
        if chosen is None:
            continue
        rank = (len(chosen), sum(c.req.priority for c in chosen))
        if best is None or rank < (len(best), sum(c.req.priority for c in best)):
            best = chosen
    return best


def _victims_in(
    state: ClusterState, members: Sequence[PodRequest], scorer: Scorer,
    taken: set[tuple[str, str]], domain: str | None, ordered: Sequence[EvictionCandidate],
) -> list[EvictionCandidate] | None:
    removed: list[EvictionCandidate] = []
    try:
        fits = not isinstance(place_members(state, members, scorer, taken, domain,
                                                exact=False), Status)
        for c in ordered:
            if fits:
                break
            state.undo(c.req, c.placement)
            removed.append(c)
            fits = not isinstance(place_members(state, members, scorer, taken, domain,
                                                exact=False), Status)
        if not fits:
            return None
        # Keep back every victim the group turns out not to need (highest priority first).
        for c in sorted(removed, key=lambda c: -c.req.priority):
            state.apply(c.req, c.placement, allow_overcommit=True)
            if isinstance(place_members(state, members, scorer, taken, domain,
                                        exact=False), Status):
                state.undo(c.req, c.placement)
            else:
                removed.remove(c)
        return list(removed)
    finally:
        for c in removed:
            state.apply(c.req, c.placement, allow_overcommit=True)
