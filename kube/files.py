"""Read Kubernetes objects from YAML/JSON text: a List, NodeList/PodList, or many documents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import yaml

from kube.objects import ObjectError

# libyaml's loader parses a 5,000-node file about 10x faster than the pure-Python one;
# both are the safe loader (no arbitrary Python objects).
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_objects(text: str, source: str, kind: str) -> list[dict[str, Any]]:
    """Objects of ``kind`` ("Node" or "Pod") in ``text``; ObjectError naming source and item."""
    return split_objects(text, source, (kind,))[kind]


def split_objects(text: str, source: str, kinds: Sequence[str]
                  ) -> dict[str, list[dict[str, Any]]]:
    """Objects of each of ``kinds`` in ``text`` (a List of mixed kinds, a <Kind>List, or
    many documents; an item without ``kind`` is of the first kind); ObjectError naming
    the source, document, item and kind for anything else."""
    docs: list[Any] | None = None
    if text.lstrip()[:1] in ("{", "["):
        # JSON (what `kubectl get -o json` writes) is YAML too, but a JSON parser reads a
        # 50,000-pod file in a fraction of a second with a fraction of the memory, where
        # the YAML loader took minutes and peaked at gigabytes. Not valid JSON: YAML decides.
        try:
            docs = [orjson.loads(text)]
        except orjson.JSONDecodeError:
            docs = None
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
            raise ObjectError(
                f"{source}: document {d}: expected an object, got {type(doc).__name__}"
            )
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
