"""What ``gpupack defrag`` reads besides the cluster snapshot: the pods file's
PodDisruptionBudgets (it may be a List of mixed kinds) and, for every pod, whether a
controller recreates it once evicted (:class:`packing.defrag.Evictability`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
import yaml

from kube.objects import ObjectError, pod_key
from kube.owners import RECREATING_KINDS, recreator
from kube.pdb import read_budget, terminating
from packing.defrag import Evictability

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
PDB = "PodDisruptionBudget"


def split_objects(text: str, source: str, kinds: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Objects of each of ``kinds`` in ``text`` (a List of mixed kinds, a <Kind>List, or
    many documents; an item without ``kind`` is of the first kind); ObjectError naming
    the source, document, item and kind for anything else."""
    docs: list[Any] | None = None
    if text.lstrip()[:1] in ("{", "["):
        try:
            docs = [orjson.loads(text)]
        except orjson.JSONDecodeError:
            docs = None  # not JSON: YAML decides
    if docs is None:
        try:
            docs = list(yaml.load_all(text, Loader=_LOADER))
        except yaml.YAMLError as e:
            raise ObjectError(f"{source}: not valid YAML: {e}") from None
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    lists = {"List", *(f"{k}List" for k in kinds)}
    for d, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ObjectError(f"{source}: document {d}: expected an object, "
                              f"got {type(doc).__name__}")
        items = [doc]
        if doc.get("kind") in lists or (doc.get("kind") is None and "items" in doc):
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise ObjectError(f"{source}: document {d}: items: expected a list")
        for i, item in enumerate(items):
            where = f"{source}: document {d}" + (f" item {i}" if item is not doc else "")
            if not isinstance(item, dict):
                raise ObjectError(f"{where}: expected an object")
            kind = item.get("kind", kinds[0])
            if kind not in out:
                raise ObjectError(f"{where}: kind: expected {' or '.join(kinds)}, got {kind!r}")
            out[kind].append(item)
    return out


def evictability(pods: Sequence[Mapping[str, Any]], budgets: Iterable[Mapping[str, Any]],
                 kinds: Iterable[str] = RECREATING_KINDS) -> Evictability:
    """Which pods a controller recreates, and the budgets; ObjectError naming the field."""
    kinds = frozenset(kinds)
    recreated: dict[str, str] = {}
    blocked: dict[str, str] = {}
    for pod in pods:
        key = pod_key(pod)
        who, why = recreator(pod, kinds)
        if who is not None:
            recreated[key] = who
        else:
            blocked[key] = why
        if terminating(pod):
            blocked[key] = "already terminating"
    return Evictability(recreated, tuple(read_budget(b, pods) for b in budgets), blocked)
