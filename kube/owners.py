"""Who recreates a pod: its controller owner, from ``metadata.ownerReferences``.

Evicting a pod is only gentle when something makes a new one: the pod's controller owner
(the reference with ``controller: true``) of a kind that recreates the pods it loses.
A bare pod would be gone for good; a DaemonSet's pod comes back on the same node (it
frees nothing there); a static pod (owned by its Node) cannot be evicted at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kube.objects import ObjectError, pod_key

# Controllers that create a replacement, scheduled anew, for a pod evicted from them.
RECREATING_KINDS = frozenset({
    "ReplicaSet", "ReplicationController", "StatefulSet", "Job", "LeaderWorkerSet",
})


def controller_owner(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the pod's controller owner, or None; ObjectError naming the field."""
    meta = pod.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    if refs is None:
        return None
    where = f"Pod {pod_key(pod)}: metadata.ownerReferences"
    if not isinstance(refs, list):
        raise ObjectError(f"{where}: expected a list")
    found: tuple[str, str] | None = None
    for i, ref in enumerate(refs):
        if not isinstance(ref, Mapping):
            raise ObjectError(f"{where}[{i}]: expected an object")
        for field in ("kind", "name"):
            if not isinstance(ref.get(field), str) or not ref[field]:
                raise ObjectError(f"{where}[{i}].{field}: {ref.get(field)!r} is not a name")
        ctl = ref.get("controller", False)
        if not isinstance(ctl, bool):
            raise ObjectError(f"{where}[{i}].controller: {ctl!r} is not true or false")
        if ctl:
            if found is not None:
                raise ObjectError(f"{where}[{i}]: a second controller owner (at most one)")
            found = (ref["kind"], ref["name"])
    return found


def recreator(pod: Mapping[str, Any], kinds: Iterable[str] = RECREATING_KINDS
              ) -> tuple[str | None, str]:
    """("Kind/name", "") of the controller that recreates the pod, or (None, why not)."""
    owner = controller_owner(pod)
    if owner is None:
        return None, "without a controller that recreates them"
    kind, name = owner
    if kind == "DaemonSet":
        return None, "of a DaemonSet (they come back on the same node)"
    if kind == "Node":
        return None, "static (mirror pods of their node)"
    if kind not in set(kinds):
        return None, f"owned by a {kind} (not known to recreate its pods)"
    return f"{kind}/{name}", ""
