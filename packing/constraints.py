"""Where a pod may run, judged as kube-scheduler judges it: pure, over plain values.

The node-level filters of kube-scheduler, for a pod's node selector, required node
affinity and tolerations (:class:`NodeLevel`, parsed from Pod objects by
:mod:`kube.constraints`) against a node's name, labels and taints:

* ``NodeSelector`` / ``NodeAffinity`` (required only): every ``nodeSelector`` label
  equal, and at least one ``nodeSelectorTerm`` matching (a term ANDs its
  ``matchExpressions`` and ``matchFields``; an empty term matches nothing; ``In``,
  ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``; ``matchFields`` only knows
  ``metadata.name``);
* ``TaintToleration``: every ``NoSchedule`` and ``NoExecute`` taint tolerated
  (``PreferNoSchedule`` only scores); a toleration with an empty key and ``Exists``
  tolerates every taint, an empty effect every effect, ``Equal`` (the default) needs the
  value too;
* ``NodeUnschedulable``: a cordoned node only for a pod that tolerates
  ``node.kubernetes.io/unschedulable:NoSchedule``.

:func:`exclusion` says why a node is out of reach, naming the pod's field; it is the one
evaluator of these rules: ``kube.constraints.why_not`` (the extender's group rights), the
webhook's capacity scopes, and the node selector checks of the packing state
(:func:`selector_miss`) all use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from packing.taints import Taint

# Taint effects that keep a pod off a node (PreferNoSchedule only lowers its score).
BLOCKING = ("NoSchedule", "NoExecute")
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Term:
    """One ``nodeSelectorTerm``: all of its requirements must hold."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""



def parse_int(text: str) -> int | None:
    """A Kubernetes label integer (Gt/Lt), None when it is not one."""
    t = text.strip()
    body = t[1:] if t[:1] in "+-" else t
    if not body or len(body) > 18 or not (body.isascii() and body.isdigit()):
        return None
    return int(t)



def selector_miss(selector: Iterable[tuple[str, str]], labels: Mapping[str, str]
                  ) -> tuple[str, str] | None:
    """The first ``nodeSelector`` pair the labels do not have (None: all match)."""
    for k, v in selector:
        if labels.get(k) != v:
            return k, v
    return None


def requirement_holds(r: Requirement, labels: Mapping[str, str]) -> bool:
    has = r.key in labels
    if r.operator == "In":
        return has and labels[r.key] in r.values
    if r.operator == "NotIn":
        return not has or labels[r.key] not in r.values
    if r.operator == "Exists":
        return has
    if r.operator == "DoesNotExist":
        return not has
    # Gt / Lt: the label must be an integer too (as kube's labels.Requirement).
    mine = parse_int(labels[r.key]) if has else None
    bound = parse_int(r.values[0]) if r.values else None
    if mine is None or bound is None:
        return False
    return mine > bound if r.operator == "Gt" else mine < bound


def term_matches(t: Term, node: str, labels: Mapping[str, str]) -> bool:
    if not t.expressions and not t.fields:
        return False  # an empty term matches no node
    return all(requirement_holds(r, labels) for r in t.expressions) and all(
        requirement_holds(r, {"metadata.name": node}) for r in t.fields)


def tolerates(tolerations: Sequence[Toleration], taint: Taint) -> bool:
    for t in tolerations:
        if t.effect and t.effect != taint.effect:
            continue
        if t.key and t.key != taint.key:
            continue
        if t.operator == "Exists" or t.value == taint.value:
            return True
    return False


# The taint kube-scheduler's NodeUnschedulable filter checks a cordoned node against.
UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
_AFFINITY = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


class _HasNodeLevel(Protocol):
    """What :func:`exclusion` reads (a NodeLevel, or kube's PodConstraints)."""

    @property
    def node_selector(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def affinity(self) -> tuple[Term, ...] | None: ...
    @property
    def tolerations(self) -> tuple[Toleration, ...]: ...


@dataclass(frozen=True, slots=True)
class NodeLevel:
    """The constraints that decide which nodes a pod can reach (hashable: a signature)."""

    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[Term, ...] | None = None
    tolerations: tuple[Toleration, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.node_selector and self.affinity is None and not self.tolerations


@dataclass(frozen=True, slots=True)
class Exclusion:
    """Why a node is out of a pod's reach: the pod's field (``field``) and kube-scheduler's
    words (``reason``)."""

    field: str
    reason: str


def _req_text(r: Requirement) -> str:
    vals = f" [{', '.join(r.values)}]" if r.values else ""
    return f"{r.key} {r.operator}{vals}"


def _term_miss(t: Term, i: int, node: str, labels: Mapping[str, str]) -> str | None:
    """The field of term ``i`` that does not hold on the node (None: the term matches)."""
    where = f"{_AFFINITY}.nodeSelectorTerms[{i}]"
    if not t.expressions and not t.fields:
        return f"{where} (an empty term matches no node)"
    for j, r in enumerate(t.expressions):
        if not requirement_holds(r, labels):
            return f"{where}.matchExpressions[{j}] ({_req_text(r)})"
    for j, r in enumerate(t.fields):
        if not requirement_holds(r, {"metadata.name": node}):
            return f"{where}.matchFields[{j}] ({_req_text(r)})"
    return None


def exclusion(c: NodeLevel | _HasNodeLevel, node: str, labels: Mapping[str, str],
              taints: Sequence[Taint], unschedulable: bool = False) -> Exclusion | None:
    """Why a pod with constraints ``c`` could not run on the node, naming the pod's field
    (None: it could). With several required terms, the first term's miss is named."""
    miss = selector_miss(c.node_selector, labels)
    if miss is not None:
        k, v = miss
        return Exclusion(f"spec.nodeSelector.{k}={v}", f"node selector {k}={v} does not match")
    if c.affinity is not None:
        misses = [_term_miss(t, i, node, labels) for i, t in enumerate(c.affinity)]
        if all(m is not None for m in misses):
            first = misses[0] if misses else f"{_AFFINITY}.nodeSelectorTerms (no term)"
            return Exclusion(first or _AFFINITY, "required node affinity does not match")
    if unschedulable and not tolerates(c.tolerations, UNSCHEDULABLE_TAINT):
        return Exclusion("spec.unschedulable of the node (cordoned)", "node is cordoned")
    for taint in taints:
        if taint.effect in BLOCKING and not tolerates(c.tolerations, taint):
            shown = f"{taint.key}={taint.value}" if taint.value else taint.key
            field = "spec.tolerations" if c.tolerations else "spec.tolerations (none)"
            return Exclusion(f"{field}: taint {shown}:{taint.effect}",
                             f"taint {shown}:{taint.effect} is not tolerated")
    return None


def reach_text(c: NodeLevel | _HasNodeLevel) -> str:
    """The pod's fields that restrict its nodes, for messages ("" when none does)."""
    parts = [f"spec.nodeSelector.{k}={v}" for k, v in c.node_selector]
    if c.affinity is not None:
        terms = []
        for t in c.affinity:
            reqs = [_req_text(r) for r in t.expressions] + [_req_text(r) for r in t.fields]
            terms.append(" and ".join(reqs) or "(empty)")
        parts.append(f"{_AFFINITY} ({' or '.join(terms)})")
    if c.tolerations:
        parts.append(f"spec.tolerations ({len(c.tolerations)})")
    return ", ".join(parts)
