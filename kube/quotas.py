"""ResourceQuota objects, read for their GPU limits, and what a pod counts against them.

Pure. :func:`quota_of` reads a v1 ResourceQuota into a frozen :class:`Quota`: its hard
limits on GPU resources (``requests.nvidia.com/gpu``, ``nvidia.com/gpu.shared``,
``nvidia.com/mig-<profile>``, with or without the ``requests.``/``limits.`` prefix: an
extended resource's request and limit are equal) and which pods it covers (its
``scopes`` and ``scopeSelector``). :func:`covers` says whether a pod is covered;
:func:`gpu_resources` what a pod asks of each GPU resource.

Scopes are judged as the API server's quota evaluator does: ``Terminating`` /
``NotTerminating`` (``activeDeadlineSeconds``), ``BestEffort`` / ``NotBestEffort``,
``PriorityClass`` (the class name; ``In``/``NotIn``/``Exists``/``DoesNotExist`` in a
selector, "has one" as a plain scope). A scope gpupack does not judge
(``CrossNamespacePodAffinity``, or one a later release adds) is taken to cover the pod:
a reservation must never exceed a quota that may apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kube import annotations as A
from kube.constraints import PodConstraints
from kube.objects import ObjectError
from packing.model import PodRequest, RequestKind
from packing.quantity import QuantityError, count


@dataclass(frozen=True)
class ScopeRule:
    scope: str
    operator: str = "Exists"  # In | NotIn | Exists | DoesNotExist
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class Quota:
    namespace: str
    name: str
    hard: Mapping[str, int]  # GPU resource name (no prefix) -> most the namespace may ask
    scopes: tuple[ScopeRule, ...] = ()


def counts_against_gpu_quota(name: str) -> bool:
    return name in (A.GPU_RESOURCE, A.SHARED_RESOURCE) or name.startswith(
        A.MIG_RESOURCE_PREFIX)


def gpu_resources(req: PodRequest) -> dict[str, int]:
    """What the pod asks of each GPU resource (what the quota admission counts)."""
    if req.kind is RequestKind.WHOLE:
        return {A.GPU_RESOURCE: req.gpu_count}
    if req.kind is RequestKind.SHARED:
        return {A.SHARED_RESOURCE: 1}
    if req.kind is RequestKind.MIG and req.mig_profile:
        return {A.MIG_RESOURCE_PREFIX + req.mig_profile: 1}
    return {}


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def quota_of(obj: Mapping[str, Any]) -> Quota:
    """The GPU limits of a ResourceQuota; ObjectError naming the field."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not isinstance(
            meta.get("namespace"), str) or not meta["name"] or not meta["namespace"]:
        raise ObjectError("ResourceQuota: metadata.name and metadata.namespace are required")
    who = f"ResourceQuota {meta['namespace']}/{meta['name']}"
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ObjectError(f"{who}: spec: expected an object")
    raw = spec.get("hard") or {}
    if not isinstance(raw, Mapping):
        raise ObjectError(f"{who}: spec.hard: expected an object")
    hard: dict[str, int] = {}
    for key, value in raw.items():
        name = str(key).removeprefix("requests.").removeprefix("limits.")
        if not counts_against_gpu_quota(name):
            continue
        try:
            n = count(value)
        except QuantityError as e:
            raise ObjectError(f"{who}: spec.hard.{key}: {e}") from None
        if n < 0:
            raise ObjectError(f"{who}: spec.hard.{key}: {n} is negative")
        # Two keys for one resource (requests. and limits.): the smaller binds.
        hard[name] = min(n, hard.get(name, n))
    return Quota(meta["namespace"], meta["name"], hard, _scopes(spec, who))


def _scopes(spec: Mapping[str, Any], who: str) -> tuple[ScopeRule, ...]:
    out: list[ScopeRule] = []
    plain = spec.get("scopes") or []
    if not isinstance(plain, list) or not all(isinstance(s, str) for s in plain):
        raise ObjectError(f"{who}: spec.scopes: expected a list of scope names")
    out += [ScopeRule(s) for s in plain]
    selector = spec.get("scopeSelector") or {}
    exprs = selector.get("matchExpressions") if isinstance(selector, Mapping) else None
    if exprs is None:
        exprs = []
    if not isinstance(exprs, list):
        raise ObjectError(f"{who}: spec.scopeSelector.matchExpressions: expected a list")
    for i, e in enumerate(exprs):
        where = f"{who}: spec.scopeSelector.matchExpressions[{i}]"
        if not isinstance(e, Mapping):
            raise ObjectError(f"{where}: expected an object")
        scope, op, values = e.get("scopeName"), e.get("operator"), e.get("values") or []
        if not isinstance(scope, str) or not scope:
            raise ObjectError(f"{where}.scopeName: {_short(scope)} is not a scope")
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ObjectError(f"{where}.operator: {_short(op)} is not In, NotIn, Exists or "
                              "DoesNotExist")
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ObjectError(f"{where}.values: expected a list of strings")
        out.append(ScopeRule(scope, op, tuple(values)))
    return tuple(out)


def _scope_holds(rule: ScopeRule, c: PodConstraints) -> bool:
    facts = {"Terminating": c.terminating, "NotTerminating": not c.terminating,
             "BestEffort": c.best_effort, "NotBestEffort": not c.best_effort}
    if rule.scope in facts:
        fact = facts[rule.scope]
        return not fact if rule.operator == "DoesNotExist" else fact
    if rule.scope == "PriorityClass":
        pc = c.priority_class
        if rule.operator == "In":
            return pc in rule.values
        if rule.operator == "NotIn":
            return pc not in rule.values
        return not pc if rule.operator == "DoesNotExist" else bool(pc)
    return True  # a scope gpupack does not judge: assume it covers the pod (see above)


def covers(q: Quota, namespace: str, c: PodConstraints) -> bool:
    """Whether the quota counts a pod of ``namespace`` with constraints ``c``."""
    return q.namespace == namespace and all(_scope_holds(r, c) for r in q.scopes)
