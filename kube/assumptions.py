"""Assumed binds: pods the extender has bound that the watch has not shown bound yet.

An assumption is counted on its node at once, so the next filter cannot hand the same GPU
to another pod. It ends only when the watch shows the pod bound (confirmed), the bind
fails, the pod is deleted, or the watch shows it bound elsewhere or recreated under
another UID. It never expires, as in kube-scheduler (which dropped its 30 s assume
expiry for the same reason): a watch stalled past any deadline would free GPUs the bound
pod really holds, and the next bind would hand them out a second time. So this book has
no clock. Not thread-safe on its own: the cluster cache uses it under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from packing.model import Placement, PodRequest


@dataclass(slots=True)
class Assumption:
    req: PodRequest
    uid: str
    placement: Placement


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
