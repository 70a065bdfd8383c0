"""RFC 6902 JSON Patch for a decision. Pure.

Every change is an *ensure*: nothing is emitted when the pod already has the value, so
running the webhook on its own output gives an empty patch. A missing parent
(``metadata.annotations``, ``resources.limits``, ``spec.affinity`` ...) is added whole,
since ``add`` needs the parent to exist. A different value already there is never
replaced silently; it is reported as a conflict naming the field (the decision has
already turned the expected ones into denials, so this is the last guard).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kube import annotations as A
from packing.quantity import QuantityError, parse_quantity
from webhook.config import WebhookConfig
from webhook.decision import AdmissionDecision, Kind
from webhook.pod import DEFAULT_SCHEDULER, PRODUCT_KEY, SHARING_KEY

Path = Sequence[str | int]
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def escape(segment: str | int) -> str:
    """RFC 6901: ``~`` -> ``~0`` then ``/`` -> ``~1`` (in that order)."""
    return str(segment).replace("~", "~0").replace("/", "~1")


def pointer(path: Path) -> str:
    return "".join("/" + escape(p) for p in path)


def _dotted(path: Path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + p
    return out


@dataclass(frozen=True)
class PatchResult:
    ops: tuple[dict[str, Any], ...]
    conflicts: tuple[str, ...]  # fields holding a different value set by the user
    result: Mapping[str, Any]  # the pod after the patch


def _nest(path: Path, value: Any) -> Any:
    for p in reversed(path):
        value = [value] if isinstance(p, int) else {p: value}
    return value


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        return parse_quantity(a) == parse_quantity(b)
    except QuantityError:
        return False


class _Builder:
    """Ops applied to a working copy as they are made, so later ones see new parents."""

    def __init__(self, pod: Mapping[str, Any]) -> None:
        self.doc: dict[str, Any] = copy.deepcopy(dict(pod))
        self.ops: list[dict[str, Any]] = []
        self.conflicts: list[str] = []

    def _add(self, path: Path, value: Any) -> None:
        op = "add"
        parent = self.get(path[:-1])
        last = path[-1]
        if isinstance(parent, dict):
            if last in parent:
                op = "replace"  # a null member: RFC 6902 add would do too, replace is plainer
            parent[str(last)] = copy.deepcopy(value)
        elif isinstance(parent, list):
            parent.append(copy.deepcopy(value))
        self.ops.append({"op": op, "path": pointer(path), "value": value})

    def get(self, path: Path) -> Any:
        cur: Any = self.doc
        for p in path:
            if isinstance(cur, dict) and isinstance(p, str):
                cur = cur.get(p)
            elif isinstance(cur, list) and isinstance(p, int) and 0 <= p < len(cur):
                cur = cur[p]
            else:
                return None
        return cur

    def ensure(
        self,
        path: Path,
        value: Any,
        *,
        overwrite: bool = False,
        same: Callable[[Any, Any], bool] = lambda a, b: a == b,
    ) -> None:
        """Make ``path`` hold ``value``, creating missing parents whole."""
        cur: Any = self.doc
        for i, p in enumerate(path[:-1]):
            if isinstance(cur, dict) and isinstance(p, str):
                nxt = cur.get(p)
            elif isinstance(cur, list) and isinstance(p, int) and 0 <= p < len(cur):
                nxt = cur[p]
            else:
                self.conflicts.append(f"{_dotted(path[: i + 1])}: not found")
                return
            if nxt is None:
                self._add(path[: i + 1], _nest(path[i + 1 :], value))
                return
            ok = isinstance(nxt, list) if isinstance(path[i + 1], int) else isinstance(nxt, dict)
            if not ok:
                self.conflicts.append(f"{_dotted(path[: i + 1])}: unexpected {type(nxt).__name__}")
                return
            cur = nxt
        last = path[-1]
        if not isinstance(cur, dict) or not isinstance(last, str):
            self.conflicts.append(f"{_dotted(path)}: not found")
            return
        existing = cur.get(last)
        if existing is None:
            self._add(path, value)
        elif same(existing, value):
            return
        elif overwrite:
            cur[last] = copy.deepcopy(value)
            self.ops.append({"op": "replace", "path": pointer(path), "value": value})
        else:
            self.conflicts.append(f"{_dotted(path)} is {existing!r}, gpupack would set {value!r}")

    def remove(self, path: Path) -> None:
        """Remove the member at ``path`` of an object, if it is there."""
        parent = self.get(path[:-1])
        last = path[-1]
        if isinstance(parent, dict) and isinstance(last, str) and last in parent:
            del parent[last]
            self.ops.append({"op": "remove", "path": pointer(path)})

    def set_item(self, path: Path, value: Any) -> None:
        """Replace the list element at ``path`` (which must exist)."""
        target = self.get(path[:-1])
        index = path[-1]
        assert isinstance(target, list) and isinstance(index, int)
        target[index] = copy.deepcopy(value)
        self.ops.append({"op": "replace", "path": pointer(path), "value": value})

    def append(self, path: Path, value: Any) -> None:
        """Append to the list at ``path`` (which must exist)."""
        target = self.get(path)
        assert isinstance(target, list)
        target.append(copy.deepcopy(value))
        self.ops.append({"op": "add", "path": pointer(path) + "/-", "value": value})


def _keep(existing: Any, wanted: Any) -> bool:
    del existing, wanted
    return True


def _scheduler(b: _Builder, config: WebhookConfig) -> None:
    current = b.get(["spec", "schedulerName"])
    if current in (None, "", DEFAULT_SCHEDULER):
        b.ensure(["spec", "schedulerName"], config.scheduler_name, overwrite=True)


def _resources(b: _Builder, d: AdmissionDecision) -> None:
    assert d.container is not None and d.resource is not None
    base: list[str | int] = ["spec", "containers", d.container, "resources"]
    if b.get(base) is None:  # one op for the whole map reads better than two
        b.ensure(base, {"limits": {d.resource: "1"}, "requests": {d.resource: "1"}})
        return
    for section in ("limits", "requests"):
        b.ensure([*base, section, d.resource], "1", same=_same_quantity)


def _pins(term: Any, products: Sequence[str]) -> bool:
    """The term already restricts gpu.product to a subset of ``products``."""
    if not isinstance(term, dict):
        return False
    for e in term.get("matchExpressions") or []:
        if (
            isinstance(e, dict)
            and e.get("key") == PRODUCT_KEY
            and e.get("operator") == "In"
            and e.get("values")
            and set(e["values"]) <= set(products)
        ):
            return True
    return False


def _empty_term(term: Any) -> bool:
    """A nodeSelectorTerm with no requirement: it matches no node, and adding the pin to
    it would make it match every node of the pinned product (widen the pod's reach)."""
    return isinstance(term, dict) and not term.get("matchExpressions") \
        and not term.get("matchFields")


def _require(b: _Builder, expr: Mapping[str, Any], satisfied: Callable[[Any], bool]) -> None:
    """Add the required node-affinity expression ``expr`` to every nodeSelectorTerm that
    does not already satisfy it (``satisfied(term)``), or make it the only term. Terms are
    ORed: every one must carry it, except an empty term, left empty (it matches no
    node). Adding a requirement to a term (ANDed with the user's) narrows it without
    changing what the user wrote."""
    terms_path: list[str | int] = ["spec", "affinity", "nodeAffinity", _REQUIRED,
                                   "nodeSelectorTerms"]
    terms = b.get(terms_path)
    if not isinstance(terms, list) or not terms:
        if isinstance(terms, list):
            b.append(terms_path, {"matchExpressions": [expr]})
        else:
            b.ensure(terms_path, [{"matchExpressions": [expr]}])
        return
    for i, term in enumerate(terms):
        if satisfied(term) or _empty_term(term):
            continue
        exprs_path = [*terms_path, i, "matchExpressions"]
        if isinstance(b.get(exprs_path), list):
            b.append(exprs_path, expr)
        else:
            b.ensure(exprs_path, [expr])


def _affinity(b: _Builder, d: AdmissionDecision) -> None:
    if not d.products:
        return  # nodes of these models carry no product label: nothing to pin on
    selector = b.get(["spec", "nodeSelector", PRODUCT_KEY])
    if isinstance(selector, str) and selector in d.products:
        return  # the user pinned a product of this model already
    expr = {"key": PRODUCT_KEY, "operator": "In", "values": list(d.products)}
    _require(b, expr, lambda term: _pins(term, d.products))


def _same_expr(e: Any, expr: Mapping[str, Any]) -> bool:
    return (isinstance(e, dict) and e.get("key") == expr["key"]
            and e.get("operator") == expr["operator"]
            and sorted(e.get("values") or []) == sorted(expr["values"]))


def _sharing(b: _Builder, d: AdmissionDecision) -> None:
    """Pin the share's kind (MPS or time-sliced) on ``nvidia.com/gpu.sharing-strategy``
    in every required term: both kinds advertise the same resource."""
    if d.sharing is None:
        return
    op, values = d.sharing
    expr = {"key": SHARING_KEY, "operator": op, "values": list(values)}
    _require(b, expr, lambda term: isinstance(term, dict) and any(
        _same_expr(e, expr) for e in term.get("matchExpressions") or []))


def _arg_edits(b: _Builder, d: AdmissionDecision) -> None:
    """The server flags ``gpupack.io/memory-fraction: "set"`` writes (see
    :func:`webhook.sizing.fraction_edits`)."""
    if d.container is None:
        return
    base: list[str | int] = ["spec", "containers", d.container]
    for e in d.arg_edits:
        path = [*base, e.field]
        if e.index is None:
            if isinstance(b.get(path), list):
                b.append(path, e.value)
            else:
                b.ensure(path, [e.value])
        elif b.get([*path, e.index]) != e.value:
            b.set_item([*path, e.index], e.value)


def _annotations(b: _Builder, d: AdmissionDecision) -> None:
    ann: list[str | int] = ["metadata", "annotations"]
    if b.get(ann) is None:
        whole = {A.DECISION: d.annotation(), A.CLASS: d.klass, **dict(sorted(d.defaults.items()))}
        b.ensure(ann, whole)
        return
    if not d.reused:
        # The decision annotation is gpupack's own: a stale copy is replaced.
        b.ensure([*ann, A.DECISION], d.annotation(), overwrite=True)
    # A value the user wrote wins: the decision was made from it.
    b.ensure([*ann, A.CLASS], d.klass, same=_keep)
    for key, value in sorted(d.defaults.items()):
        b.ensure([*ann, key], value, same=_keep)


def _explicit_annotation(b: _Builder, d: AdmissionDecision) -> None:
    """An explicit pod carries only its claim's id (``{"kind":"explicit",...,"id":...}``),
    so the webhook's claim on its slice ends once the view shows the pod."""
    ann: list[str | int] = ["metadata", "annotations"]
    if b.get(ann) is None:
        b.ensure(ann, {A.DECISION: d.annotation()})
    else:
        b.ensure([*ann, A.DECISION], d.annotation(), overwrite=True)


def stale_records(pod: Any) -> tuple[str, ...]:
    """The bind records (``kube.annotations.BIND_RECORDS``) a pod being created carries.

    gpupack writes them only on the pod's Binding, after the pod exists, and the cache
    reads them as which GPUs a bound pod holds. On a new pod they are a copy of another
    pod's (a manifest saved from a running pod) or a forgery, and either would make
    gpupack book GPUs the pod does not hold: the patch removes them."""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(ann, Mapping):
        return ()
    return tuple(k for k in A.BIND_RECORDS if k in ann)


def records_warning(keys: Sequence[str]) -> str:
    return (f"metadata.annotations: {', '.join(keys)} removed: gpupack's scheduler writes "
            "these placement records when it binds the pod, not the pod's author")


def build_patch(pod: Mapping[str, Any], decision: AdmissionDecision, config: WebhookConfig
                ) -> PatchResult:
    """The JSON Patch that carries out ``decision`` on ``pod``."""
    b = _Builder(pod)
    for key in decision.strip:
        b.remove(["metadata", "annotations", key])
    if decision.small or decision.kind in (Kind.WHOLE, Kind.EXPLICIT):
        _scheduler(b, config)
    if decision.kind is Kind.EXPLICIT and decision.admission and not decision.reused:
        _explicit_annotation(b, decision)
    if decision.small:
        _resources(b, decision)
        _affinity(b, decision)
        _sharing(b, decision)
        _arg_edits(b, decision)
        _annotations(b, decision)
    return PatchResult(tuple(b.ops), tuple(b.conflicts), b.doc)
