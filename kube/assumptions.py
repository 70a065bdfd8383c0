"""Assumed binds: pods the extender has bound that the watch has not shown bound yet.

An assumption is counted on its node at once, so the next filter cannot hand the same GPU
to another pod. It belongs to one incarnation of the pod, its UID (kube-scheduler keys
assumed pods by UID): a pod deleted and recreated under the same name is another pod.
It ends only when

- the bind of that UID fails (:meth:`kube.cache.ClusterCache.forget` with the UID);
- the watch shows that UID bound (confirmed), bound elsewhere, or finished;
- the watch shows that UID deleted (a DELETED, or a list that shows another UID in its
  place: the old pod is gone).

Events of another incarnation leave it alone (a lagging watch may still show the old pod
while the new one's Binding is in flight), and so do node events: a node deleted, or
updated so that the GPU is gone, keeps the assumption until the bind is confirmed or
forgotten, as kube-scheduler keeps a removed node's assumed pods. An unknown UID (empty)
could be any incarnation and matches every one.

It never expires, as in kube-scheduler (which dropped its 30 s assume expiry for the
same reason): a watch stalled past any deadline would free GPUs the bound pod really
holds, and the next bind would hand them out a second time. So this book has no clock.
Not thread-safe on its own: the cluster cache uses it under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from packing.model import Placement, PodRequest


@dataclass(slots=True)
class Assumption:
    req: PodRequest
    uid: str
    placement: Placement


def same_uid(a: str, b: str) -> bool:
    """Whether UIDs ``a`` and ``b`` may name the same pod (an empty one is unknown)."""
    return not a or not b or a == b


class AssumeError(RuntimeError):
    """A reservation that cannot be made (already bound, not pending, no longer fits)."""


class AssumedBinds:
    """The assumptions in force, by pod key."""

    def __init__(self) -> None:
        self._by_key: dict[str, Assumption] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)

    def keys(self) -> list[str]:
        return list(self._by_key)

    def get(self, key: str) -> Assumption | None:
        return self._by_key.get(key)

    def on_node(self, node: str) -> list[Assumption]:
        """The assumptions placed on ``node`` (few: the binds in flight)."""
        return [a for a in self._by_key.values() if a.placement.node == node]

    def add(self, a: Assumption) -> None:
        if a.req.key in self._by_key:
            raise AssumeError(f"pod {a.req.key} is already being bound to "
                              f"{self._by_key[a.req.key].placement.node}")
        self._by_key[a.req.key] = a

    def drop(self, key: str) -> Assumption | None:
        """End the assumption of ``key`` (confirmed, failed or superseded)."""
        return self._by_key.pop(key, None)

    def move(self, key: str, placement: Placement) -> None:
        """The same assumption, counted at ``placement`` (a node rebuild re-placed it)."""
        self._by_key[key] = replace(self._by_key[key], placement=placement)
