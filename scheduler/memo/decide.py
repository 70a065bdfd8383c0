"""What a pod shape gets on a node state, as pure functions, and the memo that keeps it:
the scoring helpers the extender's verbs, the memo warmer and the planner share.

A node's answer for a pod (fits or why not; the scorer's preference and best option)
depends only on the node's state, not on its name: the cache names each node's state
with a signature id (:func:`kube.signatures.node_signature`), equal for nodes in equal
states, and :class:`Memo` keeps the answers per (shape, signature). A large cluster is a
few node kinds in a few states, so a request costs two dict lookups per node, and a miss
(a state never seen with this shape) evaluates one node for all nodes in that state.

Nothing here does I/O, takes a lock or reads a clock: the callers hold the cache lock
around each use of the live state (the verbs), or work on a copy (the warmer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from packing.catalog import get_model
from packing.cpsat import SolverParams
from packing.mig.layout import free_starts
from packing.model import GpuMode, Placement, PodRequest, RequestKind, Snapshot
from packing.policies import get_policy
from packing.policies.base import Policy
from packing.policies.gpupack import GpupackPolicy, GpupackScorer
from packing.scoring import Score, Scorer
from packing.state import ClusterState, creatable

# A histogram of free sizes as it travels: (bucket counts, GPUs counted).
FreeSizes = tuple[tuple[int, ...], int]


@dataclass(frozen=True)
class ScorerRef:
    """The policy's scorer and a number that changes whenever the scorer does."""

    scorer: Scorer
    gen: int
    name_sensitive: bool = False  # scores depend on the pod's name (the random policy)
    # How to rebuild the same scorer in another process: the policy's name and the
    # workload it was made from (scorers depend on the pods, not on the nodes), and the
    # histogram it holds (holding).
    policy: str = ""
    source: Snapshot | None = None
    # The cluster's histogram of free sizes the scorer holds (bucket counts, GPUs), for
    # gpupack's sum-of-squares price (packing.policies.squares); None: none held.
    free_sizes: FreeSizes | None = None


def holding(scorer: Scorer, free_sizes: FreeSizes | None) -> Scorer:
    """``scorer`` holding the cluster's histogram of free sizes where it is gpupack's
    (:meth:`GpupackScorer.at_free_sizes`); any other scorer as it is."""
    if free_sizes is None or not isinstance(scorer, GpupackScorer):
        return scorer
    counts, gpus = free_sizes
    return scorer.at_free_sizes(np.array(counts, dtype=np.int64), gpus)


def make_policy(name: str, params: SolverParams) -> Policy:
    if name == "gpupack":
        return GpupackPolicy(params)
    return get_policy(name)

def shape_key(pod: PodRequest) -> tuple[Any, ...]:
    """What decides whether and how a pod fits a node: everything but its identity."""
    return (
        pod.kind, pod.cpu_milli, pod.memory_mib, pod.gpu_count, pod.mig_profile,
        pod.gpu_milli, pod.gpu_memory_mib, pod.gpu_models,
        tuple(sorted(pod.node_selector.items())),
    )

def selector_free(pod: PodRequest) -> PodRequest:
    """The pod without its node selector: what the memoized answers are computed for."""
    return replace(pod, node_selector={}) if pod.node_selector else pod

@dataclass
class NodeEval:
    fits: bool
    reason: str = ""
    unresolvable: bool = False
    score_gen: int = -1
    best: Score | None = None  # the scorer's best (lowest) key over the node's options
    pref: Score | None = None  # preference(best)
    # The best option without pod and node (GPUs, MIG profile, start, created): the same
    # for every node in this state, so bind reuses it.
    best_at: tuple[tuple[int, ...], str | None, int | None, bool] | None = None

    # The score for one other scorer generation: the next one while the warmer computes
    # it, or the previous one after a switch (score_gen, best, pref, best_at).
    other: tuple[int, Score | None, Score | None,
                 tuple[tuple[int, ...], str | None, int | None, bool] | None] | None = None
    # Not fitting, and fewer devices of the pod's kind than it asks (capacity_behind):
    # gpupack's view of the node is behind the one kube-scheduler offered it from.
    behind: bool = False

    def knows(self, gen: int) -> bool:
        return self.score_gen == gen or (self.other is not None and self.other[0] == gen)

    def has_score(self, gen: int) -> bool:
        """Whether a score for ``gen`` is here; makes it the current one (call under the
        cache lock)."""
        if self.score_gen == gen:
            return True
        o = self.other
        if o is None or o[0] != gen:
            return False
        self.other = (self.score_gen, self.best, self.pref, self.best_at)
        self.score_gen, self.best, self.pref, self.best_at = o
        return True

    def set_score(self, found: tuple[Score, Placement] | None, gen: int) -> None:
        """Make ``found`` the current score (the displaced one is kept as ``other``)."""
        if self.score_gen not in (-1, gen):
            self.other = (self.score_gen, self.best, self.pref, self.best_at)
        if found is None:
            self.best = self.pref = self.best_at = None
        else:
            key, o = found
            self.best, self.pref = key, preference(key)
            self.best_at = (o.gpus, o.mig_profile, o.mig_start, o.mig_created)
        self.score_gen = gen

class Memo:
    """Answers per (shape, node signature); cleared when it grows past ``limit``."""

    def __init__(self, limit: int = 500_000) -> None:
        self.limit = limit
        self.tables: dict[tuple[Any, ...], dict[int, NodeEval]] = {}
        self.size = 0
        self.lookups = 0
        self.misses = 0

    @property
    def hits(self) -> int:
        return self.lookups - self.misses

    def table(self, shape: tuple[Any, ...]) -> dict[int, NodeEval]:
        """The signature -> answer table of one shape (shapes are hashed once a request)."""
        t = self.tables.get(shape)
        if t is None:
            if self.size >= self.limit:
                self.clear()
            t = self.tables[shape] = {}
        return t

    def fill(self, table: dict[int, NodeEval], state: ClusterState, pod: PodRequest,
             node: str, sig: int) -> NodeEval:
        """Evaluate ``pod`` (selector-free) on ``node`` and remember it for ``sig``."""
        self.misses += 1
        if self.size >= self.limit:
            self.clear()
        ev = evaluate_fit(state, pod, node)
        table[sig] = ev
        self.size += 1
        return ev

    def put(self, shape: tuple[Any, ...], sig: int, ev: NodeEval) -> None:
        """Remember an answer computed elsewhere (the warmer); a fresher score wins."""
        table = self.table(shape)
        old = table.get(sig)
        if old is None:
            if self.size >= self.limit:
                self.clear()
                table = self.table(shape)
            table[sig] = ev
            self.size += 1
        elif old.fits and ev.score_gen != -1 and not old.knows(ev.score_gen):
            item = (ev.score_gen, ev.best, ev.pref, ev.best_at)
            if old.score_gen == -1:
                old.score_gen, old.best, old.pref, old.best_at = item
            else:
                old.other = item  # requests keep the current one until they switch

    def clear(self) -> None:
        for t in self.tables.values():
            t.clear()  # tables handed out for a request in flight stay usable
        self.tables.clear()
        self.size = 0

def preference(key: Score) -> Score:
    """The part of a scorer key that expresses preference: up to the first name.

    Scorers end their keys with node names and GPU indexes only to break ties
    deterministically; those carry no preference and must not spread equal nodes apart.
    """
    for i, part in enumerate(key):
        if isinstance(part, str):
            return key[:i]
    return key

def evaluate_fit(state: ClusterState, pod: PodRequest, node: str) -> NodeEval:
    if state.options(pod, node, dedupe=True):
        return NodeEval(True)
    behind = capacity_behind(state, node, pod)
    never = unresolvable(state, pod, node)
    if never is not None:
        return NodeEval(False, never, True, behind=behind)
    return NodeEval(False, explain(state, pod, node), behind=behind)

def capacity_behind(state: ClusterState, node: str, pod: PodRequest) -> bool:
    """Whether gpupack's view of ``node`` has fewer devices of the kind ``pod`` asks for
    than the pod asks, whatever their use: no instance of its MIG profile, fewer whole
    GPUs than it needs. kube-scheduler only offers a node whose allocatable covers the
    request (its NodeResourcesFit checks the GPU resources too), so such a view is
    behind the node's (new slices the watch has not shown yet)."""
    gpus = state.nodes[node].gpus
    if pod.kind is RequestKind.MIG:
        return not any(p == pod.mig_profile for g in gpus for p, _ in g.instances.values())
    if pod.kind is RequestKind.WHOLE:
        return sum(1 for g in gpus if g.info.mode is GpuMode.WHOLE) < pod.gpu_count
    return False

def unresolvable(state: ClusterState, pod: PodRequest, node: str) -> str | None:
    """Why the pod could not fit even if every pod on the node were evicted, or None.

    Decided on the node emptied of its pods, with the node's own rules (cordon,
    selectors, MIG reconfiguration): preemption can help exactly when that fits.
    Cordoned and selector-mismatched nodes count as unresolvable, as kube-scheduler's
    own NodeUnschedulable and NodeAffinity plugins report them.
    """
    info = state.nodes[node].info
    empty = ClusterState(Snapshot(nodes=(info,)))
    if empty.options(pod, node, dedupe=True):
        return None
    if _fits_node_rules(empty, pod, node) is not None:
        return empty.reason(pod, node)
    return state.unresolvable(pod, node) or explain(state, pod, node)

def _fits_node_rules(empty: ClusterState, pod: PodRequest, node: str) -> str | None:
    """The node-level reason (cordon, selector, size) on an empty node, if any."""
    why = empty.reason(pod, node)
    node_level = ("node is cordoned", "node selector", "insufficient cpu", "insufficient memory")
    return why if why.startswith(node_level) else None

def explain(state: ClusterState, pod: PodRequest, node: str) -> str:
    """Why the pod does not fit now, with what does fit where that helps a person."""
    why = state.reason(pod, node)
    if pod.kind is RequestKind.MIG and why.startswith("no free"):
        largest = largest_placeable(state, pod, node)
        why += f"; largest placeable: {largest or 'none'}"
    return why

def largest_placeable(state: ClusterState, pod: PodRequest, node: str) -> str | None:
    """The largest MIG profile one more pod could get on the node's usable GPUs now."""
    n = state.nodes[node]
    best: tuple[int, int, str] | None = None
    for g in n.gpus:
        if pod.gpu_models and g.info.model not in pod.gpu_models:
            continue
        geom = get_model(g.info.model).mig
        can_create = creatable(n, g)
        if geom is None or (g.mode is not GpuMode.MIG and not can_create):
            continue
        for prof in geom.classic:
            free = any(p == prof.name and o is None for p, o in g.instances.values())
            if not free and can_create:
                free = bool(free_starts(geom, g.mig_slots(), prof.name))
            if free:
                cand = (prof.memory_slices, prof.compute_slices, prof.name)
                if best is None or cand > best:
                    best = cand
    return None if best is None else best[2]

def scored(state: ClusterState, pod: PodRequest, node: str, scorer: Scorer,
           pause: Callable[[], None] | None = None) -> tuple[Score, Placement] | None:
    """The scorer's best (lowest) key over the node's options, and that option.

    Options that are interchangeable are scored once (see :func:`option_class`): the
    first of a class is the one with the lowest GPU index and start, which is what the
    scorers' tie-breaks pick among equal options anyway. ``pause`` is called before each
    option is scored (in-process warming uses it to step aside for requests)."""
    best: tuple[Score, Placement] | None = None
    seen: set[tuple[Any, ...]] = set()
    gpu_sigs: dict[int, tuple[Any, ...]] = {}
    for o in state.options(pod, node, dedupe=True):
        cls = option_class(state, o, gpu_sigs)
        if cls is not None:
            if cls in seen:
                continue
            seen.add(cls)
        if pause is not None:
            pause()
        k = scorer(state, pod, o)
        if best is None or k < best[0]:
            best = (k, o)
    return best

def option_class(state: ClusterState, o: Placement, gpu_sigs: dict[int, tuple[Any, ...]]
                 ) -> tuple[Any, ...] | None:
    """What makes a single-GPU option different from another on the same node: the state
    of its GPU and, for MIG, the profile and whether (and where) an instance is created.

    Two free existing instances of one profile on one GPU leave the same layout behind,
    and two GPUs in the same state are interchangeable, so such options are equal to every
    scorer up to the node/GPU/start tie-breaks. None for multi-GPU options (never merged).
    """
    if len(o.gpus) != 1:
        return None
    i = o.gpus[0]
    sig = gpu_sigs.get(i)
    if sig is None:
        g = state.gpu(o.node, i)
        sig = gpu_sigs[i] = (
            g.info.model, g.info.mode, g.info.memory_mib, g.info.replicas, g.converted,
            g.reconfigurable, g.whole_owner is None,
            tuple(sorted((s, p, w is None) for s, (p, w) in g.instances.items())),
            tuple(sorted(g.shared_owners.values())),
        )
    return (sig, o.mig_profile, o.mig_start if o.mig_created else None, o.mig_created)

def best_key(state: ClusterState, pod: PodRequest, node: str, scorer: Scorer) -> Score | None:
    found = scored(state, pod, node, scorer)
    return None if found is None else found[0]

def best_option_on(
    state: ClusterState, pod: PodRequest, node: str, scorer: Scorer
) -> Placement | None:
    found = scored(state, pod, node, scorer)
    return None if found is None else found[1]
