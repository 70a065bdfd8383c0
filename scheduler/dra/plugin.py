"""Pods with ResourceClaims (or extended resources a DeviceClass serves, KEP-5004) as one
participant at the extender's extension points.

* **filter**: each candidate node's answer from the allocator's predicted fit
  (:func:`scheduler.dra.decide.evaluate`); a node whose fit breaks a group's kept room,
  or where the allocator finds nothing or fails, is not offered. Device-plugin nodes of
  a pod that asks an extended resource (the device plugin serves it there, KEP-5004) get
  the default verb's answer, so mixed clusters rank both kinds with one scorer.
* **prioritize**: 0..10 by rank of the fit's preference among the nodes asked about;
  nodes whose fit is unknown, or holds none of the model's GPUs, get 0.
* **reserve** (the bind): the allocation predicted on the chosen node is assumed in the
  cache (:meth:`kube.cache.ClusterCache.assume_dra`) until the claim watch shows the
  allocation kube-scheduler's PreBind wrote just before, and compared with it then
  (:attr:`kube.dra_store.DraObjects.disagreements`); the pod itself is assumed with its
  CPU and memory. A claim the watch shows allocated already is compared with the fit
  predicted for that node at the last filter or prioritize.
* **unreserve**: a refused Binding forgets the assumed allocation.
* **preempt**: not answered (the default verb proposes victims by the model's GPUs).

The pod's claims are read once per request (:class:`~scheduler.extender.cycle.Cycle`)
and remembered for its bind (the bind request names the pod only).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import replace

from kube.assumptions import AssumeError
from kube.cache import ClusterCache
from kube.dra_pods import PodClaims, read_pod_claims
from packing.constraints import selector_miss
from packing.dra.allocator import Verdict
from packing.dra.objects import AllocatedDevice, Node, ResourceClaim, frozen_map
from packing.groups.members import is_reservation
from packing.model import Placement, PodRequest, RequestKind
from packing.state import fits_node
from packing.status import Status
from scheduler.dra.decide import NodeAnswer, evaluate
from scheduler.extender.cycle import Cycle, VerbError
from scheduler.extender.verbs import (
    UNKNOWN_NODE,
    UNREADABLE_NODE,
    filter_nodes,
    preferences,
)
from scheduler.extender.view_lag import ViewLag
from scheduler.extender.wire import (
    MAX_PRIORITY,
    ExtenderArgs,
    FilterResult,
    HostPriority,
    PreemptionArgs,
    PreemptionResult,
)
from scheduler.memo.decide import Memo, ScorerRef

log = logging.getLogger("gpupack.scheduler.dra")
# Per request: the claims to allocate and their shape's text, by whether the device plugin
# serves the pod's extended resources on the node.
Shapes = dict[bool, tuple[list[tuple[str, ResourceClaim]], str, str]]
REMEMBERED = 10_000  # pods (and their last answers) kept for their binds
MEMO_LIMIT = 50_000  # memoized node answers; past it the table starts over
# A filter-time assumption with no bind after this long is forgotten: kube-scheduler binds
# within a second or two of its filter, or the pod failed a later step.
TENTATIVE_S = 30.0
CYCLE_KEY = "dra"

# Checks of a refused DRA bind (Status.check).
NOT_SEEN = "DraPodNotSeen"  # no filter request showed the pod's claims to this process
NO_FIT = "DraNoFit"  # the allocator's predicted fit on the node is gone


def cpu_only(pod: PodRequest) -> PodRequest:
    """The pod as it is counted on a DRA node: CPU and memory (its GPUs are claims')."""
    if pod.kind is RequestKind.NONE:
        return pod
    return replace(pod, kind=RequestKind.NONE, gpu_count=0, mig_profile=None, gpu_milli=0,
                   gpu_memory_mib=0)


class DraVerbs:
    """The DRA participant (a :class:`scheduler.extender.cycle.Participant`)."""

    def __init__(self, cache: ClusterCache, scorer: Callable[[], ScorerRef],
                 memo: Memo | None = None, lag: ViewLag | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cache = cache
        self.scorer = scorer
        self.memo = memo or Memo()
        self.lag = lag
        self._pods: OrderedDict[str, PodClaims] = OrderedDict()
        self._answers: OrderedDict[tuple[str, str], NodeAnswer] = OrderedDict()
        # Outcomes of the nodes answered, by verdict (allocated, unschedulable, error,
        # unknown, kept): the gpupack_dra_predictions_total metric.
        self.verdicts: dict[str, int] = {}
        self.clock = clock
        # Pods whose filter-time fit is assumed (until its bind): pod key -> deadline.
        self._tentative: dict[str, float] = {}
        # Answers by node state (see answer): key -> (the node judged, its answer).
        self._memo: dict[tuple[object, ...], tuple[str, NodeAnswer, str]] = {}
        self.memo_hits = 0
        # GPUs of each node a group's reservation holds, for the node's generation.
        self._kept: dict[str, tuple[int, tuple[int, ...]]] = {}

    # ---- the pod ---------------------------------------------------------------------

    def claims_of(self, cycle: Cycle) -> PodClaims | None:
        """The request's pod's DRA needs (read once per request); None when the cluster
        has no DRA objects or the pod asks nothing of DRA."""
        if self.cache.dra.empty:
            return None
        pc = cycle.read(CYCLE_KEY, lambda: read_pod_claims(cycle.pod, self.cache.dra))
        if not pc.uses_dra:
            return None
        self._pods[pc.key] = pc
        self._pods.move_to_end(pc.key)
        while len(self._pods) > REMEMBERED:
            self._pods.popitem(last=False)
        return pc

    def _remember(self, pod: str, node: str, ans: NodeAnswer) -> None:
        self._answers[(pod, node)] = ans
        self._answers.move_to_end((pod, node))
        while len(self._answers) > REMEMBERED:
            self._answers.popitem(last=False)

    def _dra_here(self, pc: PodClaims, node: str) -> bool:
        """Whether DRA serves the pod on ``node`` (else the device plugin does: the pod
        asks only extended resources and the node advertises GPUs, or has no slices)."""
        return bool(pc.own) or self.cache.is_dra_node(node)

    def answer(self, pc: PodClaims, pod: PodRequest, node: str) -> NodeAnswer:
        """The node's answer for the pod (the cache lock held), its predicted devices on
        the node itself (see :meth:`_judge`)."""
        shapes: Shapes = {}
        ans, source = self._judge(pc, pod, node, shapes, None)
        return self._for_node(pc, ans, source, node, shapes)

    def _for_node(self, pc: PodClaims, ans: NodeAnswer, source: str, node: str,
                  shapes: Shapes) -> NodeAnswer:
        """``ans`` (judged for ``source``, a node in the same state) as ``node``'s, with
        the pod's claim keys; remembered for the pod's bind."""
        if source != node:
            claims = shapes.get(not self.cache.is_dra_node(node), ([], "", ""))[0]
            ans = replace(relabel(ans, source, node), keys=tuple(k for k, _ in claims))
        self._remember(pc.key, node, ans)
        return ans

    def _judge(self, pc: PodClaims, pod: PodRequest, node: str, shapes: Shapes,
               sigs: Mapping[str, int] | None) -> tuple[NodeAnswer, str]:
        """The node's answer for the pod, and the node it was judged for. ``shapes`` and
        ``sigs``: what the caller keeps for all the nodes of one request (the claims to
        allocate, by whether the device plugin serves the pod's extended resources; the
        cache's node signatures).

        Memoized: nodes whose slices read the same (:meth:`DraObjects.fingerprint`),
        with the same devices held, the same state (its signature) and the same GPUs
        kept for groups get the same fit up to the pool's name (and the asking pod's
        claim keys), so a node equal to one already judged costs a lookup: a 2,000-node
        cluster is a few such states. The answer returned may be another node's (the
        second value); :meth:`_for_node` makes it this one's when it is needed."""
        state = self.cache.state
        ns = state.nodes[node]
        info = ns.info
        if info.unschedulable:
            return NodeAnswer(False, "node is cordoned", unresolvable=True), node
        miss = selector_miss(pod.node_selector.items(), info.labels)
        if miss is not None:
            return NodeAnswer(False, f"node selector {miss[0]}={miss[1]} does not match",
                              unresolvable=True), node
        why = fits_node(cpu_only(pod), ns)
        if why is not None:
            return NodeAnswer(False, why), node
        plugin = not self.cache.is_dra_node(node)
        if plugin not in shapes:
            classes = list(self.cache.dra.classes.values())
            claims, misfit = pc.to_allocate(classes, device_plugin=plugin)
            shapes[plugin] = (claims, misfit, repr((misfit, [(c.requests, c.constraints)
                                                              for _, c in claims])))
        claims, misfit, shape = shapes[plugin]
        ref = self.scorer()
        key = self._memo_key(node, shape, pod, ref.gen, sigs)
        if key is not None:
            found = self._memo.get(key)
            if found is not None:
                self.memo_hits += 1
                self.verdicts[found[2]] = self.verdicts.get(found[2], 0) + 1
                return found[1], found[0]
        ans = evaluate(state, self.cache.dra.world(), node, info.labels,
                       self.cache.dra_inventory(node), claims, misfit, pod, ref.scorer)
        verdict = self._count(ans)
        if key is not None:
            self._memo[key] = (node, ans, verdict)
            if len(self._memo) > MEMO_LIMIT:
                self._memo.clear()
        return ans, node

    def _memo_key(self, node: str, shape: str, pod: PodRequest, scorer_gen: int,
                  sigs: Mapping[str, int] | None) -> tuple[object, ...] | None:
        dra = self.cache.dra
        fp = dra.fingerprint(node)
        if fp is None:
            return None
        sig = (sigs if sigs is not None else self.cache.signatures()).get(node)
        if sig is None:
            return None
        gen = self.cache.gen(node)
        known = self._kept.get(node)
        if known is None or known[0] != gen:
            known = self._kept[node] = (gen, tuple(
                g.info.index for g in self.cache.state.nodes[node].gpus
                if any(o is not None and is_reservation(o) for o in (
                    g.whole_owner, *(w for _, w in g.instances.values()),
                    *g.shared_owners))))
        kept = known[1]
        return (fp, dra.held_on(node), kept, sig, dra.classes_version, shape,
                pod.cpu_milli, pod.memory_mib, scorer_gen)

    def _count(self, ans: NodeAnswer) -> str:
        verdict = ("kept" if not ans.fits and ans.prediction is not None
                   and ans.prediction.verdict is Verdict.ALLOCATED
                   else ans.prediction.verdict.value if ans.prediction is not None else "none")
        self.verdicts[verdict] = self.verdicts.get(verdict, 0) + 1
        return verdict

    # ---- filter and prioritize -------------------------------------------------------

    def filter(self, args: ExtenderArgs, cycle: Cycle | None = None) -> FilterResult | None:
        cycle = cycle or Cycle.of(args.pod)
        pc = self.claims_of(cycle)
        if pc is None:
            return None
        if pc.error:
            raise VerbError(f"pod {pc.key}: {pc.error}")
        if pc.behind:
            return FilterResult(error=f"gpupack's view is behind kube-scheduler's: "
                                      f"{pc.behind}; try again")
        pod = cycle.req
        self._expire()
        if self._tentative.pop(pc.key, None) is not None:
            self.cache.forget_dra(pc.key)  # its own earlier fit is no one else's room
        keep: list[str] = []
        failed: dict[str, str] = {}
        never: dict[str, str] = {}
        plugin_nodes: list[str] = []
        answers: dict[str, tuple[NodeAnswer, str]] = {}
        shapes: Shapes = {}
        sigs = self.cache.signatures()
        for name in dict.fromkeys(args.candidate_names):
            if not self.cache.has_node(name):
                if self.cache.unreadable_node(name):
                    never[name] = UNREADABLE_NODE
                else:
                    failed[name] = UNKNOWN_NODE
                continue
            if not self._dra_here(pc, name):
                plugin_nodes.append(name)
                continue
            ans, source = self._judge(pc, pod, name, shapes, sigs)
            if ans.fits:
                keep.append(name)
                answers[name] = (ans, source)
            elif ans.unresolvable:
                never[name] = ans.reason
            else:
                failed[name] = ans.reason
        if plugin_nodes:
            sub = filter_nodes(ExtenderArgs(args.pod, None, tuple(plugin_nodes)), self.cache,
                               self.memo, None, self.lag, pod)
            if sub.error and not keep:
                return sub
            keep.extend(sub.node_names or ())
            failed.update(sub.failed)
            never.update(sub.unresolvable)
        keep = self._choose(pc, pod, keep, answers, shapes)
        if args.node_cache_capable:
            return FilterResult(node_names=tuple(keep), failed=failed, unresolvable=never)
        kept = set(keep)
        nodes = tuple(n for n in args.nodes or () if n["metadata"]["name"] in kept)
        return FilterResult(nodes=nodes, failed=failed, unresolvable=never)

    def _choose(self, pc: PodClaims, pod: PodRequest, keep: list[str],
                answers: Mapping[str, tuple[NodeAnswer, str]], shapes: Shapes) -> list[str]:
        """The node the pod goes to, alone, with its predicted allocation assumed at once
        (tentatively, until its bind or ``TENTATIVE_S``); or every fitting node when
        none can be judged (fits nowhere, or no fit is scored).

        Why one node: kube-scheduler allocates the devices of this pod in memory at its
        Reserve and writes them at PreBind, which may come after the next pod's filter.
        Answering with the node gpupack prefers makes that node the scheduler's choice,
        so the allocation the allocator will make is known now and counted for the pods
        that come next (without it, their predictions miss it: the first e2e run
        disagreed on 8 of 30 claims). The node is the one gpupack would rank first
        anyway; the allocator's fit on it is what gpupack predicts."""
        ranked = [(answers[n][0].pref, i, n) for i, n in enumerate(keep)
                  if n in answers and answers[n][0].pref is not None]
        plugin = [n for n in keep if n not in answers]
        if plugin:
            prefs = preferences(plugin, pod, self.cache, self.memo, self.scorer())
            ranked += [(prefs[n], keep.index(n), n) for n in plugin if n in prefs]
        if not ranked:
            return keep
        best = min(ranked, key=lambda t: (t[0], t[1]))[2]
        judged = answers.get(best)
        ans = None if judged is None else self._for_node(pc, judged[0], judged[1], best,
                                                         shapes)
        if ans is not None and ans.prediction is not None and (
                ans.prediction.verdict is Verdict.ALLOCATED):
            self.cache.assume_dra(pc.key, dict(zip(ans.keys, ans.prediction.results,
                                                   strict=True)))
            self._tentative[pc.key] = self.clock() + TENTATIVE_S
        return [best]

    def _expire(self) -> None:
        """Tentative assumptions of pods kube-scheduler did not bind in time: forgotten
        (their pod failed a later step, or went to a node gpupack did not offer)."""
        now = self.clock()
        for key in [k for k, t in self._tentative.items() if t <= now]:
            del self._tentative[key]
            self.cache.forget_dra(key)

    def prioritize(self, args: ExtenderArgs, cycle: Cycle | None = None
                   ) -> list[HostPriority] | None:
        cycle = cycle or Cycle.of(args.pod)
        pc = self.claims_of(cycle)
        if pc is None or pc.error or pc.behind:
            return None if pc is None else [HostPriority(n, 0) for n in
                                            dict.fromkeys(args.candidate_names)]
        pod = cycle.req
        names = [n for n in dict.fromkeys(args.candidate_names) if self.cache.has_node(n)]
        prefs = {}
        plugin_nodes = [n for n in names if not self._dra_here(pc, n)]
        shapes: Shapes = {}
        sigs = self.cache.signatures()
        for name in names:
            if name in plugin_nodes:
                continue
            ans, _source = self._judge(pc, pod, name, shapes, sigs)
            if ans.fits and ans.pref is not None:
                prefs[name] = ans.pref
        if plugin_nodes:
            prefs.update(preferences(plugin_nodes, pod, self.cache, self.memo, self.scorer()))
        distinct = sorted(set(prefs.values()))
        rank = {k: i for i, k in enumerate(distinct)}
        span = max(len(distinct) - 1, 1)
        out = []
        for name in names:
            if name in prefs:
                # The best fit gets the top score; the worst still 1, above the nodes
                # whose fit is unknown or outside the model (0).
                r = rank[prefs[name]]
                score = 1 + round((MAX_PRIORITY - 1) * (span - r) / span) if len(
                    distinct) > 1 else MAX_PRIORITY
                out.append(HostPriority(name, score))
            else:
                out.append(HostPriority(name, 0))
        return out

    def preempt(self, args: PreemptionArgs, cycle: Cycle | None = None
                ) -> PreemptionResult | None:
        return None

    # ---- bind ------------------------------------------------------------------------

    def reserve(self, pod: PodRequest, uid: str, node: str) -> Placement | Status | None:
        pc = self._pods.get(pod.key)
        if pc is None or (uid and pc.uid and pc.uid != uid):
            if self.cache.is_dra_node(node):
                return Status.unschedulable(NOT_SEEN, f"pod {pod.key}: no filter request "
                                            "showed its claims to this extender; try again")
            return None
        if not self._dra_here(pc, node):
            return None
        # Its filter-time assumption gives way to the allocation predicted now.
        self._tentative.pop(pod.key, None)
        self.cache.forget_dra(pod.key)
        # The claims as the watch shows them now (PreBind has written allocations).
        fresh = read_pod_claims_now(self.cache, pc)
        world = self.cache.dra.world()
        claims, misfit = fresh.to_allocate(list(world.classes.values()),
                                           device_plugin=not self.cache.is_dra_node(node))
        assumed: dict[str, tuple[AllocatedDevice, ...]] = {}
        if misfit:
            return Status.unschedulable(NO_FIT, f"node {node} neither serves {misfit} through "
                                        "DRA nor advertises it")
        if claims:
            labels = self.cache.state.nodes[node].info.labels
            pred = world.predict(Node(node, frozen_map(labels)), [c for _, c in claims])
            if pred.verdict is Verdict.ALLOCATED:
                assumed = {k: r for (k, _), r in zip(claims, pred.results, strict=True)}
            else:
                log.info("pod %s on %s: allocation not predicted (%s: %s); nothing assumed",
                         pod.key, node, pred.verdict.value, pred.reason)
        # Claims the watch shows allocated already: compare with the fit predicted there.
        before = self._answers.get((pod.key, node))
        if before is not None and before.prediction is not None and (
                before.prediction.verdict is Verdict.ALLOCATED):
            for key, results in zip(before.keys, before.prediction.results, strict=True):
                if key in assumed:
                    continue
                actual = self.cache.dra.claim(key) if key != pc.extended_key else fresh.made
                if actual is not None and actual.allocation is not None:
                    self.cache.dra.compare(actual.key, results, actual.allocation.results)
        placement = Placement(pod.key, node)
        try:
            self.cache.assume(cpu_only(pod), uid, placement)
        except AssumeError as e:
            return Status.unschedulable(NO_FIT, str(e))
        if assumed:
            self.cache.assume_dra(pod.key, assumed)
        return placement

    def unreserve(self, key: str) -> None:
        self.cache.forget_dra(key)


def relabel(ans: NodeAnswer, source: str, node: str) -> NodeAnswer:
    """``ans``, judged for ``source``, as the answer of ``node`` (a node in the same
    state): the predicted devices' pools named after ``node`` as they were after
    ``source`` (the NVIDIA driver names a node's pool after the node)."""
    if source == node or ans.prediction is None or not ans.prediction.results:
        return ans
    results = tuple(tuple(replace(d, pool=d.pool.replace(source, node)) for d in c)
                    for c in ans.prediction.results)
    return replace(ans, prediction=replace(ans.prediction, results=results))


def read_pod_claims_now(cache: ClusterCache, pc: PodClaims) -> PodClaims:
    """``pc`` with its claims as the cache holds them now."""
    own = []
    for key, claim in pc.own:
        now = cache.dra.claim(key)
        own.append((key, now if now is not None else claim))
    made = pc.made
    if pc.extended:
        made = cache.dra.extended_claim_of(pc.key) or made
    return replace(pc, own=tuple(own), made=made)
