"""The extender verbs as pure functions: decoded arguments + a cluster view -> results.

Nothing here does I/O or takes locks: the HTTP layer holds the cache lock around each
call (the view is the cache's :class:`~packing.state.ClusterState` and per-node
state signatures) and does the binding itself.

Speed: kube-scheduler calls filter and prioritize for every pod with up to hundreds of
node names, and pods of one Deployment have one shape. A node's answer for a shape (fits
or why not; the scorer's preference) depends only on the node's state, not on its name:
the cache names each node's state with a signature id (see
:func:`kube.signatures.node_signature`), equal for nodes in equal states, and answers are
memoized per (shape, signature). A large cluster is a few node kinds in a few states,
so a request costs two dict lookups per node, and a miss (a state never seen with this
shape) evaluates one node for all nodes in that state. Node selectors are the one
per-node input outside the signature: they are checked per node before the lookup, and
the memoized answer is the selector-free pod's (identical whenever the selector matches).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Any, Protocol

from kube.objects import ObjectError, pod_request
from packing.catalog import get_model
from packing.mig.layout import free_starts
from packing.model import GpuMode, Placement, PodRequest, RequestKind, Snapshot
from packing.scoring import Score, Scorer
from packing.state import ClusterState, creatable
from packing.status import Status
from scheduler.extender.view_lag import ViewLag
from scheduler.extender.wire import (
    MAX_PRIORITY,
    ExtenderArgs,
    FilterResult,
    HostPriority,
    MetaVictims,
    PreemptionArgs,
    PreemptionResult,
)

UNKNOWN_NODE = "node not in gpupack's cache (not seen by its watch yet)"
UNREADABLE_NODE = "node object unreadable by gpupack (see its log); no GPU pod is placed there"
# Unknown names listed in a filter answer (FailedNodes), at most. The watch lags the
# scheduler by a few events, so a real request names a few; a request naming many more
# gets the rest left out (kube-scheduler drops a node missing from NodeNames whether or
# not FailedNodes names it), so an answer stays proportional to the nodes gpupack knows.
UNKNOWN_LISTED = 100
EXHAUSTIVE_VICTIMS = 8  # up to 2^8 victim subsets are tried in order; greedy beyond


class VerbError(ValueError):
    """Arguments the verb cannot work with (a pod it cannot read): HTTP 400."""


class CacheView(Protocol):
    """What the verbs read; :class:`kube.cache.ClusterCache` provides it."""

    state: ClusterState

    def signatures(self) -> Mapping[str, int]: ...

    def has_node(self, name: str) -> bool: ...

    def unreadable_node(self, name: str) -> bool: ...

    def counted(self, key: str) -> tuple[PodRequest, Placement] | None: ...

    def key_of_uid(self, uid: str) -> str | None: ...


class PlanView(Protocol):
    """The planner's latest plan, as the verbs need it."""

    def placement_of(self, pod_key: str) -> Placement | None: ...


class NoPlan:
    def placement_of(self, pod_key: str) -> Placement | None:
        return None


@dataclass(frozen=True)
class ScorerRef:
    """The policy's scorer and a number that changes whenever the scorer does."""

    scorer: Scorer
    gen: int
    name_sensitive: bool = False  # scores depend on the pod's name (the random policy)
    # How to rebuild the same scorer in another process: the policy's name and the
    # workload it was made from (scorers depend on the pods, not on the nodes).
    policy: str = ""
    source: Snapshot | None = None


def read_pod(pod: Mapping[str, Any]) -> PodRequest:
    try:
        return pod_request(pod)
    except ObjectError as e:
        raise VerbError(str(e)) from None


# ---- per-node evaluation, memoized -----------------------------------------------------------


def shape_key(pod: PodRequest) -> tuple[Any, ...]:
    """What decides whether and how a pod fits a node: everything but its identity."""
    return (
        pod.kind, pod.cpu_milli, pod.memory_mib, pod.gpu_count, pod.mig_profile,
        pod.gpu_milli, pod.gpu_memory_mib, pod.gpu_models,
        tuple(sorted(pod.node_selector.items())),
    )


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


def selector_free(pod: PodRequest) -> PodRequest:
    """The pod without its node selector: what the memoized answers are computed for."""
    return replace(pod, node_selector={}) if pod.node_selector else pod


def node_rule_miss(state: ClusterState, node: str, selector: Sequence[tuple[str, str]]
                   ) -> str | None:
    """Cordon or selector mismatch, in the order and words of the packer's own check."""
    info = state.nodes[node].info
    if info.unschedulable:
        return "node is cordoned"
    labels = info.labels
    for k, v in selector:
        if labels.get(k) != v:
            return f"node selector {k}={v} does not match"
    return None


def evaluate_fit(state: ClusterState, pod: PodRequest, node: str) -> NodeEval:
    if state.options(pod, node, dedupe=True):
        return NodeEval(True)
    behind = capacity_behind(state, node, pod)
    never = unresolvable(state, pod, node)
    if never is not None:
        return NodeEval(False, never, True, behind=behind)
    return NodeEval(False, explain(state, pod, node), behind=behind)


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


def best_key(state: ClusterState, pod: PodRequest, node: str, scorer: Scorer) -> Score | None:
    found = scored(state, pod, node, scorer)
    return None if found is None else found[0]


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


def best_option_on(
    state: ClusterState, pod: PodRequest, node: str, scorer: Scorer
) -> Placement | None:
    found = scored(state, pod, node, scorer)
    return None if found is None else found[1]


# ---- filter --------------------------------------------------------------------------------


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


def filter_nodes(args: ExtenderArgs, view: CacheView, memo: Memo,
                 best: BestCandidates | None = None, lag: ViewLag | None = None
                 ) -> FilterResult:
    """Nodes that can take the pod now; the others with a reason, split by whether
    preemption could ever help (FailedNodes) or never (FailedAndUnresolvableNodes).

    With ``best``, at most ``best.top`` of the fitting nodes are handed back: the ones the
    policy prefers (see :class:`BestCandidates`).

    When none fits and gpupack's view of some candidate is behind kube-scheduler's (a
    node its watch has not shown, or one with fewer devices than kube-scheduler's fit
    implies, see :func:`capacity_behind`), the answer is an error, retried after
    kube-scheduler's backoff: a refusal would park the pod until some later cluster
    event, and the event that brought the node (an autoscaler's, a MIG change's new
    allocatable) was the last one. ``lag`` bounds that to a grace per node and version
    of the view (:mod:`scheduler.extender.view_lag`; None: no bound)."""
    pod = read_pod(args.pod)
    base = selector_free(pod)
    selector = tuple(pod.node_selector.items())
    table = memo.table(shape_key(base))
    sigs = view.signatures()
    state = view.state
    keep: list[str] = []
    # Each kept node's memo entry, only when the best candidates are to be chosen.
    choose = best is not None and best.top > 0 and not best.scorer.name_sensitive
    fit_evals: list[NodeEval] = []
    failed: dict[str, str] = {}
    never: dict[str, str] = {}
    names = tuple(dict.fromkeys(args.candidate_names))  # a name twice is answered once
    memo.lookups += len(names)
    unknown = 0
    # Candidates gpupack's view is behind on: (name, version of the view).
    lagging: list[tuple[str, str]] = []
    for name in names:
        sig = sigs.get(name)
        if sig is None and view.unreadable_node(name):
            never[name] = UNREADABLE_NODE
            continue
        if sig is None:
            # The scheduler's node list can be a few events ahead of our watch; failing
            # just this node lets the pod land elsewhere instead of failing the attempt.
            unknown += 1
            if len(lagging) < UNKNOWN_LISTED:
                lagging.append((name, "unseen"))
            if unknown <= UNKNOWN_LISTED:
                failed[name] = UNKNOWN_NODE
            memo.lookups -= 1
            continue
        if selector:
            why = node_rule_miss(state, name, selector)
            if why is not None:
                never[name] = why  # as kube-scheduler's NodeAffinity/NodeUnschedulable
                continue
        ev = table.get(sig)
        if ev is None:
            ev = memo.fill(table, state, base, name, sig)
        if ev.fits:
            keep.append(name)
            if choose:
                fit_evals.append(ev)
        else:
            if ev.unresolvable:
                never[name] = ev.reason
            else:
                failed[name] = ev.reason
            if ev.behind and len(lagging) < UNKNOWN_LISTED:
                lagging.append((name, str(sig)))
    if not keep and lagging:
        fresh = [n for n, v in lagging if lag is None or lag.behind(f"node/{n}/{v}", "node")]
        if fresh:
            return FilterResult(error=(
                f"no candidate node fits in gpupack's view, which is behind on "
                f"{len(fresh)} of them (such as {fresh[0]}: not seen yet, or fewer devices "
                f"than kube-scheduler counts); try again"))
    if choose and best is not None and best.top < len(keep):
        keep = best.select(keep, fit_evals, base, pod.key, state)
    if args.node_cache_capable:
        return FilterResult(node_names=tuple(keep), failed=failed, unresolvable=never)
    kept = set(keep)
    nodes = []
    for n in args.nodes or ():
        if n["metadata"]["name"] in kept:
            kept.discard(n["metadata"]["name"])  # each node once
            nodes.append(n)
    return FilterResult(nodes=tuple(nodes), failed=failed, unresolvable=never)


# ---- prioritize ----------------------------------------------------------------------------


def preference(key: Score) -> Score:
    """The part of a scorer key that expresses preference: up to the first name.

    Scorers end their keys with node names and GPU indexes only to break ties
    deterministically; those carry no preference and must not spread equal nodes apart.
    """
    for i, part in enumerate(key):
        if isinstance(part, str):
            return key[:i]
    return key


def preferences(names: Sequence[str], pod: PodRequest, view: CacheView, memo: Memo,
                scorer: ScorerRef) -> dict[str, Score]:
    """The policy's preference (lower is better) for each known node of ``names`` that
    fits ``pod``, from the memo (filled on a miss)."""
    base = selector_free(pod)
    selector = tuple(pod.node_selector.items())
    table = memo.table(shape_key(base))
    sigs = view.signatures()
    state = view.state
    prefs: dict[str, Score] = {}
    memo.lookups += len(names)
    for name in names:
        sig = sigs.get(name)
        if sig is None:
            memo.lookups -= 1
            continue
        if selector and node_rule_miss(state, name, selector) is not None:
            continue
        ev = table.get(sig)
        if ev is None:
            ev = memo.fill(table, state, base, name, sig)
        if not ev.fits:
            continue
        if scorer.name_sensitive:
            # Scores that depend on the node's name (the random baseline) are per node.
            key = best_key(state, base, name, scorer.scorer)
            if key is not None:
                prefs[name] = preference(key)
            continue
        if not ev.has_score(scorer.gen):
            ev.set_score(scored(state, base, name, scorer.scorer), scorer.gen)
        if ev.pref is not None:
            prefs[name] = ev.pref
    return prefs


@dataclass(frozen=True)
class BestCandidates:
    """Filter hands kube-scheduler at most ``top`` fitting nodes: those the policy prefers
    (ties in kube-scheduler's own order), plus the planner's node for the pod if it fits.

    Why: kube-scheduler then scores, and asks prioritize about, ``top`` nodes instead of
    every fitting one (at 5,000 nodes its score plugins and the 5,000-entry prioritize
    exchange were most of a scheduling cycle). What is dropped is only what the policy
    ranks below ``top`` others, which prioritize would have scored lower anyway; kube-
    scheduler's own soft preferences (preferred affinity, PreferNoSchedule) then choose
    among the ``top``. The dropped nodes are not listed as failed: the pod fits elsewhere,
    and kube-scheduler ignores a node that the answer leaves out."""

    top: int
    scorer: ScorerRef
    plan: PlanView

    def select(self, fitting: list[str], evals: list[NodeEval], base: PodRequest,
               pod_key: str, state: ClusterState) -> list[str]:
        """``fitting[i]`` and its memo entry ``evals[i]``: the candidates, in their
        order."""
        gen = self.scorer.gen
        ranked: list[tuple[Score, int]] = []
        unscored: list[int] = []
        for i, (name, ev) in enumerate(zip(fitting, evals, strict=True)):
            if not ev.has_score(gen):
                ev.set_score(scored(state, base, name, self.scorer.scorer), gen)
            if ev.pref is None:
                unscored.append(i)
            else:
                ranked.append((ev.pref, i))
        chosen = [i for _, i in heapq.nsmallest(self.top, ranked)]
        if len(chosen) < self.top:  # fitting nodes the policy has no score for, last
            chosen += unscored[: self.top - len(chosen)]
        planned = self.plan.placement_of(pod_key)
        if planned is not None and planned.node in fitting:
            chosen.append(fitting.index(planned.node))
        return [fitting[i] for i in sorted(set(chosen))]


def prioritize(
    args: ExtenderArgs, view: CacheView, memo: Memo, scorer: ScorerRef, plan: PlanView,
) -> list[HostPriority]:
    """0..10 per node: the policy's preference for the node's best option, by rank among
    the nodes asked about; the planner's node for this pod gets 10 alone."""
    pod = read_pod(args.pod)
    sigs = view.signatures()
    names = args.candidate_names
    planned = plan.placement_of(pod.key)
    plan_node = None
    if (
        planned is not None and view.has_node(planned.node) and planned.node in names
        and view.state.check(pod, planned) is None
    ):
        plan_node = planned.node
    prefs = preferences(names, pod, view, memo, scorer)
    top = MAX_PRIORITY - 1 if plan_node is not None else MAX_PRIORITY
    distinct = sorted(set(prefs.values()))
    rank = {k: i for i, k in enumerate(distinct)}
    span = max(len(distinct) - 1, 1)
    out = []
    for name in dict.fromkeys(names):  # each name once
        if name not in sigs:
            continue  # unknown: left out (kube-scheduler adds nothing for it either way)
        if name == plan_node:
            out.append(HostPriority(name, MAX_PRIORITY))
        elif name in prefs:
            r = rank[prefs[name]]
            score = round(top * (span - r) / span) if len(distinct) > 1 else top
            out.append(HostPriority(name, score))
        else:
            out.append(HostPriority(name, 0))
    return out


# ---- bind ----------------------------------------------------------------------------------


# Checks of a refused bind (Status.check).
NODE_KNOWN = "NodeKnown"  # the node is not in the cache
NODE_FIT = "NodeFit"  # the pod does not fit the node now


def choose_placement(
    view: CacheView, pod: PodRequest, node: str, scorer: Scorer, plan: PlanView,
    memo: Memo | None = None, scorer_gen: int | None = None,
) -> Placement | Status:
    """Which GPUs on ``node`` the pod gets: the plan's, while still free, else the
    scorer's best option on that node; a Status when none is free (checks NODE_KNOWN,
    NODE_FIT).

    With ``memo`` (and the scorer's generation), the best option memoized for the
    node's state is used when there is one; it is checked against the state first."""
    if not view.has_node(node):
        return Status.unresolvable(NODE_KNOWN, f"node {node} is not in gpupack's cache")
    planned = plan.placement_of(pod.key)
    if planned is not None and planned.node == node and view.state.check(pod, planned) is None:
        return planned
    if memo is not None and scorer_gen is not None:
        base = selector_free(pod)
        table = memo.tables.get(shape_key(base))
        sig = view.signatures().get(node)
        ev = None if table is None or sig is None else table.get(sig)
        if (ev is not None and ev.fits and ev.has_score(scorer_gen)
                and ev.best_at is not None):
            p = Placement(pod.key, node, *ev.best_at)
            if view.state.check(pod, p) is None:
                return p
    best = best_option_on(view.state, pod, node, scorer)
    if best is None:
        return Status.unschedulable(
            NODE_FIT, f"pod {pod.key} does not fit {node} now: {explain(view.state, pod, node)}")
    return best


# ---- preempt -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreemptionVictim:
    uid: str
    req: PodRequest
    placement: Placement


def _fits_without(
    state: ClusterState, pod: PodRequest, node: str, victims: Sequence[PreemptionVictim]
) -> bool:
    """Would the pod fit if ``victims`` were gone? The state is restored exactly: the
    state is the live cache's (preempt only reads it), and a share whose GPU is a guess
    (``NodeState.unsure``) put back as a sure one would let later shares be admitted
    on the guess (packing.state.worst_case_fits)."""
    undone: list[tuple[PreemptionVictim, bool]] = []
    try:
        for v in victims:
            unsure = v.req.key in state.nodes[v.placement.node].unsure
            state.undo(v.req, v.placement)
            undone.append((v, unsure))
        return bool(state.options(pod, node, dedupe=True))
    finally:
        for v, unsure in reversed(undone):
            state.apply(v.req, v.placement, allow_overcommit=True, unsure=unsure)


def minimal_victims(state: ClusterState, pod: PodRequest, node: str,
                    candidates: Sequence[PreemptionVictim]) -> tuple[PreemptionVictim, ...] | None:
    """The fewest, then lowest-priority, victims whose eviction makes the pod fit;
    None when evicting all of them would not."""
    if _fits_without(state, pod, node, ()):
        return ()
    ordered = sorted(candidates, key=lambda v: (v.req.priority, v.req.key))
    if not _fits_without(state, pod, node, ordered):
        return None
    if len(ordered) <= EXHAUSTIVE_VICTIMS:
        subsets = [c for k in range(1, len(ordered) + 1) for c in combinations(ordered, k)]
        subsets.sort(key=lambda s: (len(s), sum(v.req.priority for v in s)))
        for s in subsets:
            if _fits_without(state, pod, node, s):
                return tuple(s)
    # Too many for every subset: evict lowest priority first until it fits, then keep
    # back every victim whose eviction turns out unnecessary.
    chosen: list[PreemptionVictim] = []
    for v in ordered:
        chosen.append(v)
        if _fits_without(state, pod, node, chosen):
            break
    for v in sorted(chosen, key=lambda v: -v.req.priority):
        rest = [c for c in chosen if c is not v]
        if _fits_without(state, pod, node, rest):
            chosen = rest
    return tuple(chosen)


def preempt(args: PreemptionArgs, view: CacheView) -> PreemptionResult:
    """For each node kube-scheduler proposes, the subset of its victims that really frees
    what the pod needs; nodes where evicting them all would not help are dropped.

    No node is answered with no victims. kube-scheduler fails the whole preemption when a
    non-ignorable extender does so (framework/preemption/preemption.go, callExtenders:
    "expected at least one victim pod on node"; an ignorable one has the node dropped),
    and it proposes a node only with victims (DryRunPreemption refuses a candidate
    without any). So where the pod fits without victims as gpupack sees the node,
    kube-scheduler needed its victims for something gpupack does not model (host ports,
    pod count, affinity, other extended resources): they are answered unchanged.
    """
    pod = read_pod(args.pod)
    out: dict[str, MetaVictims] = {}
    for node, proposed in args.victims.items():
        if not view.has_node(node):
            continue
        known: dict[str, PreemptionVictim] = {}  # by pod key: one pod listed twice is one victim
        keys = [None] * len(proposed.uids) if args.meta else [
            _key_of(p) for p in proposed.pods
        ]
        for uid, key in zip(proposed.uids, keys, strict=True):
            k = view.key_of_uid(uid) if uid else None
            k = k or key
            item = view.counted(k) if k else None
            if item is None or item[1].node != node:
                continue  # a pod gpupack does not count there frees nothing it sees
            known.setdefault(item[0].key, PreemptionVictim(uid or item[0].uid, item[0], item[1]))
        chosen = minimal_victims(view.state, pod, node, list(known.values()))
        if chosen is None:
            continue
        if chosen:
            out[node] = MetaVictims(tuple(v.uid for v in chosen), proposed.num_pdb_violations)
        elif proposed.uids:  # none needed for the GPUs: kube-scheduler's own (see above)
            out[node] = MetaVictims(proposed.uids, proposed.num_pdb_violations)
    return PreemptionResult(out)


def _key_of(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
