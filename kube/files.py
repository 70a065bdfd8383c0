"""Read Kubernetes objects from YAML/JSON text: a List, NodeList/PodList, or many documents."""

from __future__ import annotations

from typing import Any

import orjson
import yaml

from kube.objects import ObjectError

# libyaml's loader parses a 5,000-node file about 10x faster than the pure-Python one;
# both are the safe loader (no arbitrary Python objects).
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_objects(text: str, source: str, kind: str) -> list[dict[str, Any]]:
    """Objects of ``kind`` ("Node" or "Pod") in ``text``; ObjectError naming source and item."""
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
    out: list[dict[str, Any]] = []
    for d, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ObjectError(
                f"{source}: document {d}: expected an object, got {type(doc).__name__}"
            )
        items = [doc]
        doc_kind = doc.get("kind")
        if doc_kind in ("List", f"{kind}List") or (doc_kind is None and "items" in doc):
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise ObjectError(f"{source}: document {d}: items: expected a list")
        for i, item in enumerate(items):
            where = f"{source}: document {d}" + (f" item {i}" if item is not doc else "")
            if not isinstance(item, dict):
                raise ObjectError(f"{where}: expected an object")
            if item.get("kind", kind) != kind:
                raise ObjectError(f"{where}: kind: expected {kind}, got {item.get('kind')!r}")
            out.append(item)
    return out
