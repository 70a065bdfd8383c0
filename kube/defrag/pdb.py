"""PodDisruptionBudgets (policy/v1) read into the budgets the defragmentation planner
respects (:class:`packing.defrag.plan.DisruptionBudget`).

How many disruptions a budget allows: ``status.disruptionsAllowed`` when the object has
it (the disruption controller's own figure); otherwise computed as that controller does,
from the pods of the budget's namespace its selector picks:
  healthy  = those bound, not finished, not terminating, and Ready (a pod whose status
             has no Ready condition, as hand-written files have, counts when bound);
  expected = the number of those pods (the controller reads a percentage against its
             pods' controller's scale; files do not carry it, so the pods stand in);
  desired  = minAvailable (an int; a percentage of expected, rounded up), or expected -
             maxUnavailable (the same rounding); neither set: 0 with expected 0;
  allowed  = healthy - desired, and 0 when that is negative or expected is 0.
A null selector picks no pods; an empty one ({}) picks every pod of the namespace.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from kube.objects import ObjectError, bound_node, is_finished, pod_key
from packing.defrag.plan import DisruptionBudget

_PERCENT = re.compile(r"^(\d{1,3})%$")
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def _who(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    return f"PodDisruptionBudget {meta.get('namespace') or 'default'}/{meta.get('name', '')}"


def _mapping(v: Any, where: str) -> Mapping[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ObjectError(f"{where}: expected an object, got {type(v).__name__}")
    return v


def int_or_percent(v: Any, where: str) -> tuple[int, bool]:
    """(value, is a percentage) of an IntOrString field."""
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ObjectError(f"{where}: {v!r} is not an integer or a percentage")
    if isinstance(v, int):
        if v < 0:
            raise ObjectError(f"{where}: {v} is negative")
        return v, False
    m = _PERCENT.match(v.strip())
    if m is None or int(m.group(1)) > 100:
        raise ObjectError(f"{where}: {v[:40]!r} is not an integer or a percentage (0%..100%)")
    return int(m.group(1)), True


def scaled(value: int, percent: bool, total: int) -> int:
    """GetScaledValueFromIntOrPercent with rounding up."""
    return math.ceil(value * total / 100) if percent else value


Selector = tuple[Mapping[str, str], tuple[tuple[str, str, frozenset[str]], ...]]


def read_selector(raw: Any, where: str) -> Selector | None:
    """matchLabels and matchExpressions; None for a null selector (it picks nothing)."""
    if raw is None:
        return None
    sel = _mapping(raw, where)
    labels = _mapping(sel.get("matchLabels"), f"{where}.matchLabels")
    for k, v in labels.items():
        if not isinstance(v, str):
            raise ObjectError(f"{where}.matchLabels.{k}: {v!r} is not a string")
    exprs = sel.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise ObjectError(f"{where}.matchExpressions: expected a list")
    out = []
    for i, e in enumerate(exprs):
        ew = f"{where}.matchExpressions[{i}]"
        e = _mapping(e, ew)
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if not isinstance(key, str) or not key:
            raise ObjectError(f"{ew}.key: {key!r} is not a label key")
        if op not in _OPERATORS:
            raise ObjectError(f"{ew}.operator: {op!r} is not one of {', '.join(_OPERATORS)}")
        if not isinstance(values, list) or not all(isinstance(x, str) for x in values):
            raise ObjectError(f"{ew}.values: expected a list of strings")
        if op in ("In", "NotIn") and not values:
            raise ObjectError(f"{ew}.values: operator {op} needs values")
        if op in ("Exists", "DoesNotExist") and values:
            raise ObjectError(f"{ew}.values: operator {op} takes no values")
        out.append((key, str(op), frozenset(values)))
    return dict(labels), tuple(out)


def selects(sel: Selector | None, labels: Mapping[str, str]) -> bool:
    if sel is None:
        return False
    match, exprs = sel
    if any(labels.get(k) != v for k, v in match.items()):
        return False
    for key, op, values in exprs:
        has = key in labels
        if op == "In" and not (has and labels[key] in values):
            return False
        if op == "NotIn" and has and labels[key] in values:
            return False
        if op == "Exists" and not has:
            return False
        if op == "DoesNotExist" and has:
            return False
    return True


def _labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    meta = pod.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def _namespace(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, Mapping) else None
    return ns if isinstance(ns, str) and ns else "default"


def terminating(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata")
    return isinstance(meta, Mapping) and meta.get("deletionTimestamp") is not None


def healthy(pod: Mapping[str, Any]) -> bool:
    """Counted healthy by a budget (see the module docstring)."""
    if bound_node(pod) is None or is_finished(pod) or terminating(pod):
        return False
    status = pod.get("status")
    conds = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(conds, list):
        return True
    for c in conds:
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return True


def read_budget(obj: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> DisruptionBudget:
    """The budget of one PodDisruptionBudget; ObjectError naming the field."""
    who = _who(obj)
    meta = _mapping(obj.get("metadata"), f"{who}: metadata")
    if not isinstance(meta.get("name"), str) or not meta["name"]:
        raise ObjectError(f"{who}: metadata.name: missing")
    spec = _mapping(obj.get("spec"), f"{who}: spec")
    sel = read_selector(spec.get("selector"), f"{who}: spec.selector")
    min_av, max_un = spec.get("minAvailable"), spec.get("maxUnavailable")
    if min_av is not None and max_un is not None:
        raise ObjectError(f"{who}: spec: minAvailable and maxUnavailable are both set "
                          f"(at most one may be)")
    ns = _namespace(obj)
    chosen = [p for p in pods if _namespace(p) == ns and selects(sel, _labels(p))
              and not is_finished(p)]
    keys = frozenset(pod_key(p) for p in chosen)
    status = _mapping(obj.get("status"), f"{who}: status")
    if "disruptionsAllowed" in status:
        allowed = status["disruptionsAllowed"]
        if isinstance(allowed, bool) or not isinstance(allowed, int) or allowed < 0:
            raise ObjectError(f"{who}: status.disruptionsAllowed: {allowed!r} is not a "
                              f"non-negative integer")
        return DisruptionBudget(f"{ns}/{meta['name']}", allowed, keys)
    n_healthy = sum(1 for p in chosen if healthy(p))
    expected = len(chosen)
    if max_un is not None:
        v, pct = int_or_percent(max_un, f"{who}: spec.maxUnavailable")
        desired = max(0, expected - scaled(v, pct, expected))
    elif min_av is not None:
        v, pct = int_or_percent(min_av, f"{who}: spec.minAvailable")
        desired = scaled(v, pct, expected)
    else:
        desired, expected = 0, 0
    allowed = n_healthy - desired if expected > 0 else 0
    return DisruptionBudget(f"{ns}/{meta['name']}", max(0, allowed), keys)
