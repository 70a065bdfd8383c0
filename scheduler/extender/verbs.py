"""The extender verbs as pure functions: decoded arguments + a cluster view -> results.

Nothing here does I/O or takes locks: the extension points (:mod:`scheduler.extender.
points`) hold the cache lock around each call (the view is the cache's
:class:`~packing.state.ClusterState` and per-node state signatures) and do the binding
themselves.

Speed: kube-scheduler calls filter and prioritize for every pod with up to hundreds of
node names, and pods of one Deployment have one shape. Each node's answer comes from the
memo (:mod:`scheduler.memo.decide`, per shape and node state signature), filled on a
miss. Node selectors are the one per-node input outside the signature: they are checked
per node before the lookup, and the memoized answer is the selector-free pod's
(identical whenever the selector matches).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Protocol

from packing.model import Placement, PodRequest
from packing.scoring import Score, Scorer, in_use_first, rank_priorities, winner
from packing.state import ClusterState
from packing.status import Status
from scheduler.extender.cycle import read_pod
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
from scheduler.memo.decide import (
    Memo,
    NodeEval,
    ScorerRef,
    best_key,
    best_option_on,
    explain,
    preference,
    scored,
    selector_free,
    shape_key,
)

UNKNOWN_NODE = "node not in gpupack's cache (not seen by its watch yet)"
UNREADABLE_NODE = "node object unreadable by gpupack (see its log); no GPU pod is placed there"
# Unknown names listed in a filter answer (FailedNodes), at most. The watch lags the
# scheduler by a few events, so a real request names a few; a request naming many more
# gets the rest left out (kube-scheduler drops a node missing from NodeNames whether or
# not FailedNodes names it), so an answer stays proportional to the nodes gpupack knows.
UNKNOWN_LISTED = 100
EXHAUSTIVE_VICTIMS = 8  # up to 2^8 victim subsets are tried in order; greedy beyond


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


# ---- per-node evaluation, memoized -----------------------------------------------------------


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


# ---- filter --------------------------------------------------------------------------------


def filter_nodes(args: ExtenderArgs, view: CacheView, memo: Memo,
                 best: BestCandidates | None = None, lag: ViewLag | None = None,
                 pod: PodRequest | None = None) -> FilterResult:
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
    of the view (:mod:`scheduler.extender.view_lag`; None: no bound). ``pod``: the
    request's pod, already read (else it is read here)."""
    pod = read_pod(args.pod) if pod is None else pod
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
    if (choose and best is not None and best.top < len(keep)
            and not soft_preferences(args.pod)):
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


def soft_preferences(pod: Mapping[str, Any]) -> bool:
    """Whether the pod object declares preferences kube-scheduler's score plugins weigh:
    preferred node affinity, preferred pod affinity or anti-affinity (NodeAffinity,
    InterPodAffinity), a ``ScheduleAnyway`` topology spread constraint (PodTopologySpread).
    Filter then hands back every fitting node, so that they still choose among the nodes
    (:class:`BestCandidates` would leave kube-scheduler nothing to choose from). Malformed
    fields count as none: the pod's reader reports them."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return False
    affinity = spec.get("affinity")
    if isinstance(affinity, Mapping):
        for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
            part = affinity.get(kind)
            if isinstance(part, Mapping) and part.get(
                    "preferredDuringSchedulingIgnoredDuringExecution"):
                return True
    spread = spec.get("topologySpreadConstraints")
    return isinstance(spread, list) and any(
        isinstance(c, Mapping) and c.get("whenUnsatisfiable") == "ScheduleAnyway"
        for c in spread)


@dataclass(frozen=True)
class BestCandidates:
    """Filter hands kube-scheduler at most ``top`` fitting nodes: those the policy prefers
    (ties by :func:`~packing.scoring.in_use_first`, so prioritize's
    :func:`~packing.scoring.winner` is among them), plus the planner's node for the pod
    if it fits. With ``top`` 1 and no planner's node, kube-scheduler takes the one node
    without scoring (schedule_one.go: "When only one node after predicate, just use
    it"): no prioritize call at all.

    Why: kube-scheduler then scores, and asks prioritize about, ``top`` nodes instead of
    every fitting one (at 5,000 nodes its score plugins and the 5,000-entry prioritize
    exchange were most of a scheduling cycle). What is dropped is only what the policy
    ranks below ``top`` others, which prioritize would have scored lower anyway; kube-
    scheduler's own score plugins then choose among the ``top`` (with ``top`` 1: none,
    which is why a pod that declares soft preferences of its own gets every fitting node,
    see :func:`soft_preferences`; what stays unweighed then is node-side:
    PreferNoSchedule taints, image locality, cluster-default spreading). The dropped
    nodes are not listed as failed: the pod fits elsewhere, and kube-scheduler ignores a
    node that the answer leaves out."""

    top: int
    scorer: ScorerRef
    plan: PlanView

    def select(self, fitting: list[str], evals: list[NodeEval], base: PodRequest,
               pod_key: str, state: ClusterState) -> list[str]:
        """``fitting[i]`` and its memo entry ``evals[i]``: the candidates, in their
        order."""
        gen = self.scorer.gen
        prefs: list[tuple[Score, int]] = []
        unscored: list[int] = []
        for i, (name, ev) in enumerate(zip(fitting, evals, strict=True)):
            if not ev.has_score(gen):
                ev.set_score(scored(state, base, name, self.scorer.scorer), gen)
            if ev.pref is None:
                unscored.append(i)
            else:
                prefs.append((ev.pref, i))
        # Ties as prioritize's winner breaks them (see winner()): it is always kept. Only
        # nodes whose preference is at most the top-th best can be among the top, so the
        # tie-break is read for those alone (~12 of ~220 fitting nodes at 5,000 nodes).
        if len(prefs) > self.top:
            cut = heapq.nsmallest(self.top, [p for p, _ in prefs])[-1]
            prefs = [(p, i) for p, i in prefs if p <= cut]
        ranked = [(p, in_use_first(state, fitting[i]), i) for p, i in prefs]
        chosen = [i for _, _, i in heapq.nsmallest(self.top, ranked)]
        if len(chosen) < self.top:  # fitting nodes the policy has no score for, last
            chosen += unscored[: self.top - len(chosen)]
        planned = self.plan.placement_of(pod_key)
        if planned is not None and planned.node in fitting:
            chosen.append(fitting.index(planned.node))
        return [fitting[i] for i in sorted(set(chosen))]


def prioritize(
    args: ExtenderArgs, view: CacheView, memo: Memo, scorer: ScorerRef, plan: PlanView,
    pod: PodRequest | None = None,
) -> list[HostPriority]:
    """0..10 per node: 10 for one node alone, the policy's
    :func:`~packing.scoring.winner`, or the planner's node for this pod where the
    winner's preference differs from it; the others 0..9 by the rank of their preference
    among the nodes asked about (a node tied with the winner gets 9). ``pod``: the
    request's pod, already read (else it is read here).

    Score math: kube-scheduler adds score x weight x 10 (chart: weight 5) to its own
    plugins' sums, so the winner leads a node of equal preference by 50 points, more
    than the pull of its default score plugins between an empty and a used node for pods
    that are small against the node (NodeResourcesFit LeastAllocated, 0..100 at weight
    1, moves by 100 x request / allocatable), while larger soft preferences (preferred
    affinity, PreferNoSchedule taints, 100-300 points) still win. With filter's best
    candidates (``gpupack serve --filter-top``, default 1) kube-scheduler mostly sees one
    node and asks nothing more."""
    pod = read_pod(args.pod) if pod is None else pod
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
    best = winner(prefs, view.state)
    # The plan's node, unless the winner is as good to the policy (a node in an equal
    # state, as far as the preference tells): the plan chose a kind of node, and among
    # equal ones in_use_first keeps every pod of the burst on the same one (the plan was
    # solved on an older snapshot, in the cache's node order).
    if plan_node is not None and (best is None or prefs.get(plan_node) != prefs[best]):
        best = plan_node
    known = [n for n in dict.fromkeys(names) if n in sigs]  # each name once
    # (an unknown node is left out: kube-scheduler adds nothing for it either way)
    scores = rank_priorities(prefs, known, best, MAX_PRIORITY)
    return [HostPriority(n, scores[n]) for n in known]


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


def preempt(args: PreemptionArgs, view: CacheView, pod: PodRequest | None = None
            ) -> PreemptionResult:
    """For each node kube-scheduler proposes, the subset of its victims that really frees
    what the pod needs; nodes where evicting them all would not help are dropped.

    No node is answered with no victims. kube-scheduler fails the whole preemption when a
    non-ignorable extender does so (framework/preemption/preemption.go, callExtenders:
    "expected at least one victim pod on node"; an ignorable one has the node dropped),
    and it proposes a node only with victims (DryRunPreemption refuses a candidate
    without any). So where the pod fits without victims as gpupack sees the node,
    kube-scheduler needed its victims for something gpupack does not model (host ports,
    pod count, affinity, other extended resources): they are answered unchanged.
    ``pod``: the request's pod, already read (else it is read here).
    """
    pod = read_pod(args.pod) if pod is None else pod
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
