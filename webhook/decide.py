"""What the webhook does with one pod: pure, pod dict + cluster view + config -> AdmissionDecision.

Classes of pods:
- *whole*: a LeaderWorkerSet member, ``gpupack.io/class: whole`` (or ``llm``), or
  ``nvidia.com/gpu`` >= 1 without gpupack annotations. Left as is except the scheduler.
- *explicit*: asks for a MIG or time-sliced resource itself, without gpupack
  annotations. Left as is except the scheduler.
- *small*: ``gpupack.io/gpu-memory`` (optional ``gpu-compute``, ``isolation``) or
  ``gpupack.io/class: asr|tts|small``. Gets the smallest MIG slice of a GPU model the
  cluster has room on, else a time-sliced share, pinned to the GPU product.
- anything else is skipped.

The decision also carries the facts :mod:`webhook.patch` needs (container, resource,
products) and the warnings. Conflicts with values the user set explicitly, and inputs
that cannot be read, are denials naming the field.

This module is the order of the steps (:func:`decide_admission`, :func:`solve`); the
steps are their own modules: :mod:`webhook.decision` (the decision value and the input
errors), :mod:`webhook.pod` (what is read of the pod), :mod:`webhook.explicit` (a
resource the pod names itself, a decision it already carries), :mod:`webhook.choose`
(which slice, or why none) and :mod:`webhook.share_safety` (servers that would outgrow
a time-sliced share).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kube import annotations as A
from kube.constraints import NodeLevel
from packing.model import Snapshot
from webhook.capacity import ClusterView
from webhook.choose import (
    candidates,
    choose_cordoned,
    choose_mig,
    choose_mps,
    choose_shared,
    choose_whole,
    no_fit,
    no_mig_text,
    possible_fits,
)
from webhook.config import Isolation, WebhookConfig
from webhook.decision import AdmissionDecision, Conflict, Kind, PodError, deny
from webhook.explicit import asked_resource, explicit_pod, reuse
from webhook.pod import (
    Ask,
    Container,
    Pod,
    classify,
    gpu_container,
    init_gpu,
    is_strict,
    memory_fraction,
    node_level,
    node_name,
    read_ask,
    read_pod,
    res_path,
    scheduler_warning,
)
from webhook.share_safety import set_fraction, sizing_problems


def decide_admission(
    pod: Any,
    cluster: ClusterView | Snapshot,
    config: WebhookConfig,
    namespace_labels: Mapping[str, str] | None = None,
) -> AdmissionDecision:
    """The webhook's decision for one Pod CREATE. Never raises on bad input."""
    view = cluster if isinstance(cluster, ClusterView) else ClusterView.of(cluster)
    klass = "invalid"
    try:
        p = read_pod(pod, config)
        kind, klass = classify(p, config)
        warnings = scheduler_warning(p.spec, config)
        if kind is Kind.EXPLICIT:
            return explicit_pod(p, view, config, warnings)
        if kind in (Kind.SKIP, Kind.WHOLE):
            why = {
                Kind.SKIP: "no GPU asked for",
                Kind.WHOLE: "whole-GPU pod: resources left as they are",
            }[kind]
            return AdmissionDecision(kind, klass, why,
                                     warnings=tuple(warnings) if kind is not Kind.SKIP else ())
        ask = read_ask(p, klass, config)
        target = gpu_container(p)
        init_gpu(p)
        strict = is_strict(p, namespace_labels or {})
        # Read before a decision the pod carries is kept: a field that cannot be read is
        # a 400 either way, and the kept decision's claim counts the nodes in reach.
        level = node_level(p.spec)
        decision = reuse(p, target, ask, config)
        if decision is None:
            decision = solve(p, target, ask, view, config, level)
            if not decision.allowed:
                return replace(decision, warnings=decision.warnings + tuple(warnings))
        else:
            decision = replace(decision, reach=view.scoped(level).reach)
        decision = replace(decision, container=target.index)
        memory_fraction(p)  # a value other than "set" is a 400 whatever the kind
        if decision.kind is Kind.SHARED:
            decision, body, unset = set_fraction(p, target, decision)
            warnings += unset
            over, unreadable = sizing_problems(target, decision, body)
            if over and strict:
                return deny(klass, 403, "strict mode (gpupack.io/strict): " + "; ".join(over),
                            warnings + unreadable)
            warnings += over + unreadable
        return replace(decision, warnings=tuple(warnings))
    except PodError as e:
        return deny(klass, 400, str(e))
    except Conflict as e:
        return deny(klass, 400, str(e))


def solve(p: Pod, target: Container, ask: Ask, view: ClusterView,
           config: WebhookConfig, level: NodeLevel) -> AdmissionDecision:
    explicit_profile, explicit_shared = asked_resource(p, target, ask)
    # Only the nodes the pod can reach count (its node selector, required node
    # affinity, tolerations against taints, spec.nodeName); the same view when it sets
    # none.
    view = view.scoped(level)
    decision = _solve_in(p, target, ask, view, config, explicit_profile, explicit_shared)
    node = node_name(p.spec)
    if node:
        pinned = f"spec.nodeName={node} holds the pod to that node (metadata.name In [{node}])"
        decision = replace(decision, reason=f"{decision.reason}; {pinned}")
    if not decision.allowed:
        return decision
    if view.scope:
        decision = replace(decision, reason=f"{decision.reason}; counting the "
                           f"{len(view.reach or ())} node(s) in reach of {view.scope}")
    return replace(decision, reach=view.reach)


def _solve_in(p: Pod, target: Container, ask: Ask, view: ClusterView,
              config: WebhookConfig, explicit_profile: str | None, explicit_shared: bool
              ) -> AdmissionDecision:
    mig, shared, mps = candidates(view, ask)
    avoid_mps = any(c.mps_gpus for c in view.models.values())
    if explicit_profile is not None:
        res = res_path(target, next(iter(target.gpu)))
        # The smallest fitting slice that exists or may be created is kept even when
        # none is free now (the pod waits for one, as a sized pod would): replicas of
        # one manifest all name it, whichever is free when each is reviewed.
        have = {f.cap.model.name for f in mig if f.profile.name == explicit_profile}
        waiting = [f for f in possible_fits(view, ask)
                   if f.profile.name == explicit_profile and f.cap.model.name not in have]
        chosen = choose_mig(mig + waiting, ask, explicit_profile, need_free=False)
        natural = choose_mig(mig, ask, None, need_free=False)
        if chosen is None and ask.isolation in (Isolation.MIG, Isolation.ANY):
            # Last, a slice only cordoned nodes hold, when it is the one gpupack would
            # pick there (the smallest that holds the pod).
            chosen = choose_cordoned(view, ask, p.spec)
            if chosen is not None and chosen.profile != explicit_profile:
                chosen = None
        # Kept only when it is what gpupack would pick on some model (free now, the
        # smallest that exists, or that only cordoned nodes hold): a bigger slice than
        # the annotation asks for is a contradiction the user must resolve.
        if chosen is None or ask.isolation is Isolation.SHARED:
            want = ""
            if natural is not None:
                want = f" (it needs {natural.resource} on {'|'.join(natural.models)})"
            raise Conflict(res, f"conflicts with {ask.label}{want}; remove one of them")
        return chosen
    if explicit_shared:
        res = res_path(target, next(iter(target.gpu)))
        if ask.isolation is Isolation.MIG:
            raise Conflict(res, f"is a time-sliced share, but {A.ISOLATION}=mig")
        chosen = (choose_mps(mps, ask, config, need_free=True)
                  or choose_shared(shared, ask, config, need_free=True, avoid_mps=avoid_mps)
                  or choose_mps(mps, ask, config, need_free=False)
                  or choose_shared(shared, ask, config, need_free=False, avoid_mps=avoid_mps))
        if chosen is None:
            raise Conflict(res, f"conflicts with {ask.label}: no time-sliced GPU holds it")
        return chosen
    # Free now before waiting; among kinds, the better isolated first: a MIG slice, an
    # MPS replica (memory capped per client), a time-sliced share; last a whole GPU of a
    # DRA node (the smallest device that holds the pod there).
    for attempt in (
        lambda: choose_mig(mig, ask, None, need_free=True),
        lambda: choose_mps(mps, ask, config, need_free=True),
        lambda: choose_shared(shared, ask, config, need_free=True, avoid_mps=avoid_mps),
        lambda: choose_whole(view, ask, need_free=True),
        lambda: choose_mig(mig, ask, None, need_free=False),
        lambda: choose_mps(mps, ask, config, need_free=False),
        lambda: choose_shared(shared, ask, config, need_free=False, avoid_mps=avoid_mps),
        lambda: choose_whole(view, ask, need_free=False),
    ):
        decision = attempt()
        if decision is not None:
            if decision.kind in (Kind.SHARED, Kind.MPS, Kind.GPU) and not mig \
                    and ask.isolation is Isolation.ANY:
                # Say why MIG, the safer default, was not chosen where MIG GPUs exist.
                off = no_mig_text(view)
                if off:
                    decision = replace(decision, reason=f"{decision.reason}; no MIG slice "
                                       f"holds it ({off})")
            return decision
    # Last: a slice that only cordoned nodes hold (maintenance). Kubernetes keeps such a
    # pod Pending until a node is uncordoned; refusing it would fail every create of its
    # ReplicaSet meanwhile.
    if ask.isolation in (Isolation.MIG, Isolation.ANY):
        cordoned = choose_cordoned(view, ask, p.spec)
        if cordoned is not None:
            return cordoned
    return no_fit(view, ask)
