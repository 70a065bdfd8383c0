"""The extender's four extension points as typed calls: decoded arguments in, a wire
result out, no HTTP (kube-scheduler's framework style: one entry per extension point).

Each request gets one :class:`~scheduler.extender.cycle.Cycle`: its pod read at most once
and shared by everyone the point asks. Each point asks its participants first, in order
(the LLM groups' plugin answers a group member from its reserved room, see
:mod:`scheduler.groups.plugin`), and otherwise runs the pure verb of
:mod:`scheduler.extender.verbs` on the cache's view, under the cache lock. Input a verb
cannot use raises :class:`~scheduler.extender.cycle.VerbError` (the HTTP layer answers
400).

Bind has two steps: :meth:`ExtensionPoints.claim` chooses the GPUs on the node and
reserves them in the cache (under the lock, so two racing binds cannot take the same
GPU), then the Binding is created outside the lock; if the API refuses it, the
reservation is dropped at once. If no answer comes in time (``--bind-timeout``, below
kube-scheduler's extender timeout, so both see the same outcome), the Binding may still
be applied: the reservation stays until the watch shows the pod, or until
:data:`kube.source.UNKNOWN_BIND_HOLD_S` passed without it (then no Binding sent before
can still be applied), so a late bind never finds its GPUs handed to another pod.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from prometheus_client import Counter

from kube.annotations import placement_annotations
from kube.assumptions import AssumeError
from kube.cache import ClusterCache
from kube.source import UNKNOWN_BIND_HOLD_S, Binder, BindError, BindUnknown
from packing.model import Placement, PodRequest
from packing.status import Status
from scheduler.extender.cycle import Cycle, Participant, VerbError
from scheduler.extender.refusals import RecentRefusals, remembered
from scheduler.extender.request_pods import RequestPod, RequestPods
from scheduler.extender.verbs import (
    BestCandidates,
    choose_placement,
    filter_nodes,
    preempt,
    prioritize,
)
from scheduler.extender.view_lag import ViewLag
from scheduler.extender.wire import (
    BindingArgs,
    BindingResult,
    ExtenderArgs,
    FilterResult,
    HostPriority,
    PreemptionArgs,
    PreemptionResult,
)
from scheduler.memo.decide import Memo
from scheduler.memo.loop import Warmer
from scheduler.planner.loop import Planner

log = logging.getLogger("gpupack.scheduler.app")


@dataclass(frozen=True)
class BindClaim:
    """A bind's GPUs, reserved in the cache (or the group member's room): what the
    Binding is then written for. ``seen``: the pod as a filter request showed it, when
    no list has."""

    pod: PodRequest
    uid: str
    choice: Placement
    seen: RequestPod | None


@dataclass(frozen=True)
class ExtensionPoints:
    """filter, prioritize, bind and preempt over one cache. ``participants``: the plugins
    asked first at each point (:class:`~scheduler.extender.cycle.Participant`);
    ``binds``: the bind outcome counter (labels ok, conflict, api_error); ``filter_top``:
    see :class:`scheduler.extender.verbs.BestCandidates` (0: every fitting node)."""

    cache: ClusterCache
    planner: Planner
    binder: Binder
    participants: tuple[Participant, ...]
    memo: Memo
    warmer: Warmer
    request_pods: RequestPods
    binds: Counter
    policy: str
    filter_top: int = 0
    lag: ViewLag | None = None  # how long "the view is behind" is an error (view_lag)
    refusals: RecentRefusals | None = None  # full refusals (extender/refusals.py)
    # How long the GPUs of a bind whose outcome is unknown stay assumed (see the module
    # docstring); the timer is injectable for tests.
    unknown_hold_s: float = UNKNOWN_BIND_HOLD_S

    def remember(self, cycle: Cycle) -> None:
        """A pod no list has shown: kept for its bind (the bind request names it only)."""
        if self.cache.pod_entry(cycle.key) is None:
            self.request_pods.remember(cycle.pod, cycle.req)

    def filter(self, args: ExtenderArgs) -> FilterResult:
        cycle = Cycle.of(args.pod)
        self.remember(cycle)
        with self.cache.view() as view:
            best = (BestCandidates(self.filter_top, self.warmer.current(), self.planner.plan)
                    if self.filter_top > 0 else None)
            got = next((a for p in self.participants
                        if (a := p.filter(args, cycle)) is not None), None)
            if got is None:
                got = filter_nodes(args, view, self.memo, best, self.lag, cycle.req)
        if (self.refusals is not None and not got.error and not got.node_names
                and not got.nodes and args.candidate_names):
            with self.cache.view() as view:
                names = remembered(args.candidate_names, view.has_node)
            self.refusals.refused(cycle.key, names)
        return got

    def prioritize(self, args: ExtenderArgs) -> list[HostPriority]:
        cycle = Cycle.of(args.pod)
        self.remember(cycle)
        plan = self.planner.plan
        with self.cache.view() as view:
            got = next((a for p in self.participants
                        if (a := p.prioritize(args, cycle)) is not None), None)
            if got is not None:
                return got
            return prioritize(args, view, self.memo, self.warmer.current(), plan, cycle.req)

    def preempt(self, args: PreemptionArgs) -> PreemptionResult:
        cycle = Cycle.of(args.pod)
        pod = cycle.req  # a pod it cannot read is a 400 before anyone is asked
        with self.cache.view() as view:
            got = next((a for p in self.participants
                        if (a := p.preempt(args, cycle)) is not None), None)
            return got if got is not None else preempt(args, view, pod)

    def bind(self, args: BindingArgs) -> BindingResult:
        claim = self.claim(args)
        if isinstance(claim, BindingResult):
            return claim
        return self.write(args, claim)

    def refuse(self, why: str, seen: RequestPod | None) -> BindingResult:
        """A bind not done: kube-scheduler retries the pod (a request pod is kept)."""
        if seen is not None:
            self.request_pods.put_back(seen)
        self.binds.labels("conflict").inc()
        return BindingResult(why)

    def claim(self, args: BindingArgs) -> BindClaim | BindingResult:
        """The pod's GPUs on ``args.node``, reserved (under the cache lock), or why not."""
        plan = self.planner.plan
        seen: RequestPod | None = None
        with self.cache.view() as view:
            if not view.has_node(args.node):
                raise VerbError(f"ExtenderBindingArgs.Node: unknown node {args.node!r}")
            pod = view.pending_pod(args.pod_key)
            entry = view.pod_entry(args.pod_key)
            if pod is None and entry is None:
                if view.is_assumed(args.pod_key):
                    return self.refuse(f"pod {args.pod_key} is not pending (being bound "
                                       "already)", seen)
                # Only a filter or prioritize request has shown this pod so far.
                seen = self.request_pods.take(args.pod_key, args.pod_uid)
                if seen is None:
                    return self.refuse(f"pod {args.pod_key} is not in gpupack's cache and "
                                       "no filter request showed it", seen)
                pod = seen.req
            if pod is None:
                return self.refuse(f"pod {args.pod_key} is not pending (bound to "
                                   f"{entry.node if entry else None})", seen)
            if args.pod_uid and pod.uid and args.pod_uid != pod.uid:
                return self.refuse(f"pod {args.pod_key} has UID {pod.uid}, not "
                                   f"{args.pod_uid}", seen)
            uid = args.pod_uid or pod.uid
            # A participant's pod (a group member) gets the room it reserved, already
            # assumed (or why not).
            member = next((a for p in self.participants
                           if (a := p.reserve(pod, uid, args.node)) is not None), None)
            ref = self.warmer.current()
            choice = member if member is not None else choose_placement(
                view, pod, args.node, ref.scorer, plan, self.memo, ref.gen)
            if isinstance(choice, Status):
                return self.refuse(choice.message, seen)
            try:
                if member is None:
                    self.cache.assume(pod, uid, choice)
            except AssumeError as e:
                return self.refuse(str(e), seen)
        return BindClaim(pod, uid, choice, seen)

    def forget(self, claim: BindClaim) -> None:
        """A failed Binding frees its claim's assumption, and only that: the pod may have
        been deleted and recreated under its name meanwhile (the API refused the Binding
        on the UID precondition), and the new pod's bind assumed since must keep its
        GPUs (kube-scheduler keys assumed pods by UID). Checked under the cache lock
        that the book takes too, so the assumption cannot change in between."""
        with self.cache.lock:
            if self.cache.is_assumed(claim.pod.key, claim.uid):
                self.cache.forget(claim.pod.key)
                for p in self.participants:
                    p.unreserve(claim.pod.key)  # a group member's room is held again

    def end_unknown(self, claim: BindClaim) -> None:
        """A bind whose outcome was unknown, ``unknown_hold_s`` later: if the watch never
        showed the pod bound (its assumption is still there), no Binding sent then can
        still be applied: its GPUs are free again."""
        with self.cache.lock:
            if self.cache.is_assumed(claim.pod.key, claim.uid):
                log.info("bind of %s: no sign of it after %.0f s; its GPUs are free again",
                         claim.pod.key, self.unknown_hold_s)
                self.forget(claim)

    def write(self, args: BindingArgs, claim: BindClaim) -> BindingResult:
        """The Binding for a claim (outside the lock); a failed one frees the claim."""
        pod, seen = claim.pod, claim.seen
        try:
            self.binder.bind(args.pod_namespace, args.pod_name, claim.uid, args.node,
                             placement_annotations(claim.choice, self.policy),
                             pod=None if seen is None else seen.obj)
        except BindUnknown as e:
            # Sent, perhaps applied: the GPUs stay assumed (kube-scheduler is told the
            # bind failed and retries the pod; the watch says what happened).
            self.binds.labels("unknown").inc()
            log.warning("%s; its GPUs stay assumed until the watch shows the pod, or for "
                        "%.0f s", e, self.unknown_hold_s)
            timer = threading.Timer(self.unknown_hold_s, self.end_unknown, (claim,))
            timer.daemon = True
            timer.start()
            return BindingResult(str(e))
        except BindError as e:
            self.forget(claim)
            if seen is not None:
                self.request_pods.put_back(seen)
            self.binds.labels("api_error").inc()
            return BindingResult(str(e))
        except Exception as e:  # the reservation must not outlive a failed bind
            self.forget(claim)
            if seen is not None:
                self.request_pods.put_back(seen)
            self.binds.labels("api_error").inc()
            log.exception("bind of %s failed", pod.key)
            return BindingResult(f"bind of {pod.key} failed: {e}")
        self.binds.labels("ok").inc()
        c = claim.choice
        # One line per bind, as kube-scheduler's own "Successfully bound pod to node":
        # which GPUs (or slice) the pod got, and whether the plan had chosen that node.
        planned = self.planner.plan.placement_of(pod.key)
        log.info("bound %s to %s: GPU(s) %s%s%s", pod.key, args.node,
                 ",".join(map(str, c.gpus)),
                 f" {c.mig_profile}@{c.mig_start}" if c.mig_profile is not None else "",
                 "" if planned is None else
                 " (as planned)" if planned.node == args.node else
                 f" (the plan had {planned.node})")
        return BindingResult()
