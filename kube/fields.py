"""The error every reader of Kubernetes objects raises, :class:`ObjectError`, whose
message names the object and the field, and the field readers that raise it. Their own
module so that the readers (``objects``, ``node_objects``, ``constraints``, ...) can use
one another without an import circle."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ObjectError(ValueError):
    """A Kubernetes object that cannot be understood; the message names object and field."""


def obj_name(obj: Mapping[str, Any], kind: str) -> str:
    meta = (obj.get("metadata") if isinstance(obj, Mapping) else None) or {}
    name = meta.get("name", "<unnamed>") if isinstance(meta, Mapping) else "<unnamed>"
    if kind == "Pod":
        ns = meta.get("namespace") or "default" if isinstance(meta, Mapping) else "default"
        return f"Pod {ns}/{name}"
    return f"{kind} {name}"


def field_map(obj: Mapping[str, Any], path: str, who: str) -> Mapping[str, Any]:
    cur: Any = obj
    for part in path.split("."):
        if cur is None:
            return {}
        if not isinstance(cur, Mapping):
            raise ObjectError(f"{who}: {path}: expected an object, got {type(cur).__name__}")
        cur = cur.get(part)
    if cur is None:
        return {}
    if not isinstance(cur, Mapping):
        raise ObjectError(f"{who}: {path}: expected an object, got {cur!r}")
    return cur


def str_map(obj: Mapping[str, Any], path: str, who: str) -> dict[str, str]:
    raw = field_map(obj, path, who)
    out = {}
    for k, v in raw.items():
        if not isinstance(v, str):
            raise ObjectError(f"{who}: {path}.{k}: expected a string, got {v!r}")
        out[str(k)] = v
    return out
