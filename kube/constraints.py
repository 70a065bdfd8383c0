"""Where a pod may run, as kube-scheduler decides it, read from Pod and Node objects.

Pure: the parsers turn a pod spec (a Pod's, or a LeaderWorkerSet template's) into a
frozen :class:`PodConstraints`, and a Node into its :class:`Taint` tuple. The judging
(node selector, required node affinity, taints against tolerations, cordon) is
:mod:`packing.constraints`, re-exported here: :func:`exclusion` names the pod's field
that keeps a node out of reach, :func:`why_not` says it in kube-scheduler's words (the
extender's group rights), :func:`node_level` is the part of the constraints that decides
which nodes a pod can reach (a hashable signature, the webhook's capacity scopes) and
:func:`reach_text` names it.

Also read here, for ResourceQuota scopes: the pod's ``priorityClassName``, whether it
is terminating (``activeDeadlineSeconds``) and whether it is BestEffort (no CPU or
memory request or limit in any container).

Errors name the object and field, as :mod:`kube.objects` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kube import annotations as A
from kube.fields import ObjectError
from packing.constraints import (
    BLOCKING,
    OPERATORS,
    UNSCHEDULABLE_TAINT,
    Exclusion,
    NodeLevel,
    Requirement,
    Taint,
    Term,
    Toleration,
    exclusion,
    parse_int,
    reach_text,
    requirement_holds,
    term_matches,
    tolerates,
)

__all__ = [
    "BLOCKING",
    "OPERATORS",
    "UNSCHEDULABLE_TAINT",
    "Exclusion",
    "NodeLevel",
    "PodConstraints",
    "Requirement",
    "Taint",
    "Term",
    "Toleration",
    "exclusion",
    "node_level",
    "node_taints",
    "pod_constraints",
    "reach_text",
    "requirement_holds",
    "spec_constraints",
    "spec_node_level",
    "term_matches",
    "tolerates",
    "why_not",
]

# Bounds: real specs have a handful of each; more is corrupt or hostile, and every one is
# checked against every node.
MAX_ITEMS = 64


@dataclass(frozen=True, slots=True)
class PodConstraints:
    scheduler_name: str = "default-scheduler"
    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[Term, ...] | None = None  # required terms, ORed; None: no affinity
    tolerations: tuple[Toleration, ...] = ()
    priority_class: str = ""
    terminating: bool = False
    best_effort: bool = False
    # The LeaderWorkerSet the pod's labels name (a pod's only; templates leave it empty):
    # whose object gives the group's true size.
    lws: str = ""


# ---- reading ---------------------------------------------------------------------------------


def _who(obj: Mapping[str, Any], kind: str) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return f"{kind} <unnamed>"
    name = meta.get("name") or "<unnamed>"
    ns = meta.get("namespace")
    return f"{kind} {ns}/{name}" if ns else f"{kind} {name}"


def _list(v: Any, where: str) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise ObjectError(f"{where}: expected a list, got {_short(v)}")
    if len(v) > MAX_ITEMS:
        raise ObjectError(f"{where}: {len(v)} items, more than gpupack reads (at most "
                          f"{MAX_ITEMS})")
    return v


def _obj(v: Any, where: str) -> Mapping[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ObjectError(f"{where}: expected an object, got {_short(v)}")
    return v


def _str(v: Any, where: str, default: str = "") -> str:
    if v is None:
        return default
    if not isinstance(v, str):
        raise ObjectError(f"{where}: expected a string, got {_short(v)}")
    return v


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _requirement(raw: Any, where: str, fields: bool) -> Requirement:
    r = _obj(raw, where)
    key = _str(r.get("key"), f"{where}.key")
    op = _str(r.get("operator"), f"{where}.operator")
    if not key:
        raise ObjectError(f"{where}.key: missing")
    allowed = ("In", "NotIn") if fields else OPERATORS
    if op not in allowed:
        raise ObjectError(f"{where}.operator: {_short(op)} is not one of {', '.join(allowed)}")
    if fields and key != "metadata.name":
        raise ObjectError(f"{where}.key: {_short(key)}: matchFields only knows metadata.name")
    values = tuple(_str(v, f"{where}.values[{i}]")
                   for i, v in enumerate(_list(r.get("values"), f"{where}.values")))
    if op in ("In", "NotIn") and not values:
        raise ObjectError(f"{where}.values: {op} needs at least one value")
    if op in ("Exists", "DoesNotExist") and values:
        raise ObjectError(f"{where}.values: {op} takes no values")
    if op in ("Gt", "Lt") and (len(values) != 1 or parse_int(values[0]) is None):
        raise ObjectError(f"{where}.values: {op} needs exactly one integer value")
    return Requirement(key, op, values)


def _terms(spec: Mapping[str, Any], where: str) -> tuple[Term, ...] | None:
    affinity = _obj(spec.get("affinity"), f"{where}.affinity")
    node_aff = _obj(affinity.get("nodeAffinity"), f"{where}.affinity.nodeAffinity")
    path = f"{where}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = node_aff.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    req = _obj(required, path)
    out = []
    for i, t in enumerate(_list(req.get("nodeSelectorTerms"), f"{path}.nodeSelectorTerms")):
        tw = f"{path}.nodeSelectorTerms[{i}]"
        term = _obj(t, tw)
        exprs = tuple(_requirement(e, f"{tw}.matchExpressions[{j}]", False)
                      for j, e in enumerate(_list(term.get("matchExpressions"),
                                                  f"{tw}.matchExpressions")))
        flds = tuple(_requirement(e, f"{tw}.matchFields[{j}]", True)
                     for j, e in enumerate(_list(term.get("matchFields"), f"{tw}.matchFields")))
        out.append(Term(exprs, flds))
    return tuple(out)


def _tolerations(spec: Mapping[str, Any], where: str) -> tuple[Toleration, ...]:
    out = []
    for i, raw in enumerate(_list(spec.get("tolerations"), f"{where}.tolerations")):
        tw = f"{where}.tolerations[{i}]"
        t = _obj(raw, tw)
        op = _str(t.get("operator"), f"{tw}.operator", "Equal") or "Equal"
        if op not in ("Equal", "Exists"):
            raise ObjectError(f"{tw}.operator: {_short(op)} is not Equal or Exists")
        key = _str(t.get("key"), f"{tw}.key")
        value = _str(t.get("value"), f"{tw}.value")
        if not key and op != "Exists":
            raise ObjectError(f"{tw}: an empty key needs operator Exists")
        if op == "Exists" and value:
            raise ObjectError(f"{tw}.value: operator Exists takes no value")
        out.append(Toleration(key, op, value, _str(t.get("effect"), f"{tw}.effect")))
    return tuple(out)


def _best_effort(spec: Mapping[str, Any], where: str) -> bool:
    """No CPU or memory request or limit in any container (kube's QoS class BestEffort)."""
    for field in ("containers", "initContainers"):
        for i, c in enumerate(_list(spec.get(field), f"{where}.{field}")):
            res = _obj(_obj(c, f"{where}.{field}[{i}]").get("resources"),
                       f"{where}.{field}[{i}].resources")
            for section in ("requests", "limits"):
                values = _obj(res.get(section), f"{where}.{field}[{i}].resources.{section}")
                if any(k in ("cpu", "memory") for k in values):
                    return False
    return True


def _selector(s: Mapping[str, Any], where: str) -> tuple[tuple[str, str], ...]:
    selector = _obj(s.get("nodeSelector"), f"{where}.nodeSelector")
    pairs = tuple(sorted((str(k), _str(v, f"{where}.nodeSelector.{k}"))
                         for k, v in selector.items()))
    if len(pairs) > MAX_ITEMS:
        raise ObjectError(f"{where}.nodeSelector: {len(pairs)} labels, more than gpupack reads")
    return pairs


def spec_node_level(spec: Any, where: str) -> NodeLevel:
    """Only the node-level constraints of a pod spec (what :func:`spec_constraints`
    reads for them, without the rest): the webhook's per-review read."""
    s = _obj(spec, where)
    return NodeLevel(_selector(s, where), _terms(s, where), _tolerations(s, where))


def spec_constraints(spec: Any, where: str) -> PodConstraints:
    """Constraints of a pod spec; ``where`` names it in errors (``Pod ns/x: spec``)."""
    s = _obj(spec, where)
    deadline = s.get("activeDeadlineSeconds")
    return PodConstraints(
        scheduler_name=_str(s.get("schedulerName"), f"{where}.schedulerName",
                            "default-scheduler") or "default-scheduler",
        node_selector=_selector(s, where),
        affinity=_terms(s, where),
        tolerations=_tolerations(s, where),
        priority_class=_str(s.get("priorityClassName"), f"{where}.priorityClassName"),
        terminating=deadline is not None,
        best_effort=_best_effort(s, where),
    )


def pod_constraints(pod: Mapping[str, Any]) -> PodConstraints:
    """A Pod's constraints; ObjectError naming the field."""
    who = _who(pod, "Pod")
    c = spec_constraints(pod.get("spec") if isinstance(pod, Mapping) else None, f"{who}: spec")
    meta = _obj(pod.get("metadata") if isinstance(pod, Mapping) else None, f"{who}: metadata")
    labels = _obj(meta.get("labels"), f"{who}: metadata.labels")
    lws = _str(labels.get(A.LWS_NAME), f"{who}: metadata.labels.{A.LWS_NAME}")
    return replace(c, lws=lws) if lws else c


def node_taints(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    """A Node's taints; ObjectError naming the field."""
    who = _who(node, "Node")
    spec = _obj(node.get("spec") if isinstance(node, Mapping) else None, f"{who}: spec")
    out = []
    for i, raw in enumerate(_list(spec.get("taints"), f"{who}: spec.taints")):
        tw = f"{who}: spec.taints[{i}]"
        t = _obj(raw, tw)
        key = _str(t.get("key"), f"{tw}.key")
        effect = _str(t.get("effect"), f"{tw}.effect")
        if not key or not effect:
            raise ObjectError(f"{tw}: key and effect are required")
        out.append(Taint(key, _str(t.get("value"), f"{tw}.value"), effect))
    return tuple(out)


# ---- judging: packing.constraints; the pod-level wrappers ----------------------------


def node_level(c: PodConstraints) -> NodeLevel:
    return NodeLevel(c.node_selector, c.affinity, c.tolerations)


def why_not(c: PodConstraints, node: str, labels: Mapping[str, str],
            taints: Sequence[Taint]) -> str | None:
    """Why a pod with constraints ``c`` could not run on the node (None: it could)."""
    e = exclusion(c, node, labels, taints)
    return None if e is None else e.reason
