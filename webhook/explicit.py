"""Pods that name their GPU resource themselves: the MIG profile or share a small pod's
user already asked for (:func:`asked_resource`: kept only when it is what gpupack
would pick), the webhook's own earlier decision recognised on re-invocation
(:func:`reuse`: the mutation stays idempotent), and an explicit pod's claim on the
slice it names (:func:`explicit_pod`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

from kube import annotations as A
from packing.catalog import (
    CATALOG,
    models_with_profile,
    profile_from_resource,
)
from packing.model import GPU_MILLI
from webhook.capacity import ClusterView
from webhook.config import Isolation, WebhookConfig
from webhook.decision import AdmissionDecision, Conflict, Kind, PodError
from webhook.pod import CONTAINER, Ask, Container, Pod, node_level, res_path


def asked_resource(p: Pod, target: Container, ask: Ask) -> tuple[str | None, bool]:
    """The MIG profile or share the user already asked for (None, False when none).

    A whole GPU next to small-pod annotations, a GPU resource in another container or a
    count other than 1 cannot be reconciled: PodError naming it.
    """
    for c in p.containers:
        if c.index != target.index and c.gpu:
            res = sorted(c.gpu)[0]
            raise Conflict(
                res_path(c, res),
                f"asks for a GPU in another container than {target.name or target.index}; "
                f"name the GPU container with {CONTAINER}",
            )
    if not target.gpu:
        return None, False
    if len(target.gpu) > 1:
        raise Conflict(res_path(target, sorted(target.gpu)[1]), "more than one GPU resource")
    res, qty = next(iter(target.gpu.items()))
    if res == A.GPU_RESOURCE:
        raise Conflict(
            res_path(target, res),
            f"={qty} asks for whole GPUs, but {ask.label} asks for a slice; remove one of them",
        )
    if qty != 1:
        raise Conflict(res_path(target, res), f"={qty}: a small pod takes exactly one slice")
    profile = profile_from_resource(res)
    if profile is not None:
        return profile, False
    return None, True


def reuse(p: Pod, target: Container, ask: Ask, config: WebhookConfig
           ) -> AdmissionDecision | None:
    """The pod's own gpupack.io/decision, when the pod still matches it (re-invocation).

    Deciding again could pick another slice (the cluster changed in between) and then
    see its own earlier resource as a user conflict; recognising its output keeps the
    mutation idempotent, as ``reinvocationPolicy: IfNeeded`` needs.
    """
    raw = p.annotations.get(A.DECISION)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    kind, models_text, products = doc.get("kind"), doc.get("model"), doc.get("products")
    if not isinstance(models_text, str) or not isinstance(products, list):
        return None
    if not all(isinstance(x, str) for x in products):
        return None
    models = tuple(m for m in models_text.split("|") if m)
    if not models or not all(m in CATALOG for m in models):
        return None
    if kind == Kind.MIG.value and ask.isolation in (Isolation.MIG, Isolation.ANY):
        profile = doc.get("profile")
        if not isinstance(profile, str):
            return None
        for m in models:
            geom = CATALOG[m].mig
            if geom is None or not geom.has_profile(profile):
                return None
            prof = geom.profile(profile)
            if prof.memory_mib < ask.memory_mib or (
                prof.compute_slices * GPU_MILLI < ask.compute_milli * geom.compute_slices
            ):
                return None
        resource = A.MIG_RESOURCE_PREFIX + profile.replace("+", ".")
        out_kind = Kind.MIG
    elif kind == Kind.SHARED.value and ask.isolation in (Isolation.SHARED, Isolation.ANY):
        if doc.get("share") != config.shared_resource:
            return None
        if any(CATALOG[m].memory_mib < ask.memory_mib for m in models):
            return None
        profile, resource, out_kind = None, config.shared_resource, Kind.SHARED
    elif kind == Kind.MPS.value and ask.isolation is not Isolation.MIG:
        if doc.get("share") != config.shared_resource:
            return None
        if any(CATALOG[m].memory_mib < ask.memory_mib for m in models):
            return None
        profile, resource, out_kind = None, config.shared_resource, Kind.MPS
    elif kind == Kind.GPU.value and ask.isolation is Isolation.ANY:
        if doc.get("resource") != A.GPU_RESOURCE:
            return None
        if any(CATALOG[m].memory_mib < ask.memory_mib for m in models):
            return None
        profile, resource, out_kind = None, A.GPU_RESOURCE, Kind.GPU
    else:
        return None
    if dict(target.gpu) != {resource: Decimal(1)}:
        return None
    if any(c.gpu for c in p.containers if c.index != target.index):
        return None
    reason = doc.get("reason")
    admission = doc.get("id")
    return AdmissionDecision(
        out_kind,
        ask.klass,
        reason if isinstance(reason, str) else "",
        profile=profile,
        resource=resource,
        models=models,
        products=tuple(products),
        container=target.index,
        memory_mib=ask.memory_mib,
        compute_milli=ask.compute_milli,
        defaults=ask.defaults,
        reused=True,
        sharing=("In", ("mps",)) if out_kind is Kind.MPS else None,
        admission=admission if isinstance(admission, str) else "",
    )


def _decision_doc(p: Pod) -> dict[str, Any] | None:
    raw = p.annotations.get(A.DECISION)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def explicit_pod(p: Pod, view: ClusterView, config: WebhookConfig,
                  warnings: Sequence[str]) -> AdmissionDecision:
    """An explicit pod: left as it is but for the scheduler name; the MIG slice or share
    it names is recorded as a claim (the extender counts it so: kube.objects.pod_request),
    so a burst mixing explicit and sized pods does not hand the same slice out twice."""
    base = AdmissionDecision(Kind.EXPLICIT, "small",
                             "asks for a MIG or time-sliced resource itself",
                             warnings=tuple(warnings))
    asked = {r for c in p.every_container for r, q in c.gpu.items() if q > 0}
    if len(asked) != 1:
        return base  # none asked (a count of 0), or several: the extender refuses the pod
    (res,) = asked
    profile = profile_from_resource(res)
    if profile is not None:
        models = tuple(sorted(m.name for m in models_with_profile(profile)))
        if not models:
            return base  # no GPU has it: the extender refuses the pod
    elif res in (A.SHARED_RESOURCE, config.shared_resource):
        models = ()
    else:
        return base
    try:
        reach = view.scoped(node_level(p.spec)).reach
    except PodError:
        reach = None  # left to kube-scheduler, as before; the claim counts everywhere
    doc = _decision_doc(p)
    # The webhook's own record from an earlier invocation (webhook.admit judges whether
    # it is this admission's or a copy).
    own = (doc is not None and doc.get("kind") == Kind.EXPLICIT.value
           and doc.get("resource") == res and isinstance(doc.get("id"), str))
    return replace(base, resource=res, profile=profile, models=models, reach=reach,
                   reused=own, admission=str(doc["id"]) if own and doc else "")
