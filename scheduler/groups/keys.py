"""The reservation book's small helpers: hold keys, a waiting group (:class:`Waiting`)
and the bounded wait reasons of the ``gpupack_groups_waiting`` metric (read from a
refusal's check, never its wording), the wait after an expiry (:func:`expiry_wait`),
and the cheap "is this pod a group member at all" test. The placement itself is pure
and lives in :mod:`packing.groups.placement`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kube import annotations as A
from packing.groups.members import RESERVE_MARK
from packing.groups.placement import EXCLUSIVE_DOMAIN, GROUP_FIT, TOPOLOGY_LABEL
from packing.status import Status

# Bounded reasons of gpupack_groups_waiting.
WAIT_REASONS = ("no_room", "no_domain", "exclusive_taken", "expired", "displaced", "other",
                "no_rights")


@dataclass(frozen=True)
class Waiting:
    reason: str  # for people
    category: str  # one of scheduler.groups.keys.WAIT_REASONS
    next_try: float
    # Cache version when the attempt failed: a group that did not fit is tried again only
    # once the cluster changed (-1: the handler sets it after applying; None: time alone).
    seen: int | None = -1
    # After an expiry: how many member pods the group had then (-1: not an expiry). It is
    # due at once when it has more (see grew).
    members: int = -1

    def due(self, now: float, version: int) -> bool:
        return now >= self.next_try and self.seen != version

    def grew(self, members: int) -> bool:
        """Whether a group that expired with ``self.members`` pods now has more."""
        return 0 <= self.members < members


def expiry_wait(group: str, strikes: int, members: int, now: float, ttl: float,
                cooldown_s: float, max_backoff_s: float) -> Waiting:
    """How a group waits after its reservation expired for the ``strikes``-th time in a
    row with ``members`` member pods (at most its size): ``cooldown_s``, doubling with
    each expiry in a row up to ``max_backoff_s``, so other groups get a turn and a group
    whose members never come (a pod labelled as a group of 64) no longer re-reserves
    right after each expiry; due at once when it gains member pods (a LeaderWorkerSet
    creating its workers once the leader is Ready: :meth:`Waiting.grew`)."""
    wait = min(cooldown_s * 2 ** min(strikes - 1, 32), max_backoff_s)
    return Waiting(
        f"group {group} waits whole: its reservation expired after {ttl:.0f}s without all "
        f"members bound ({strikes} in a row); other groups go first for {wait:.0f}s, or "
        f"until it has more than its {members} member pods", "expired", now + wait, None,
        members=members)


def hold_key(group: str, slot: int) -> str:
    return f"{group}{RESERVE_MARK}{slot}"


def split_hold_key(key: str) -> tuple[str, int] | None:
    """(group, slot) of a hold key made by :func:`hold_key`; None for any other key.

    Split at the *last* mark: a group name is not validated and may itself contain
    ``#reserve-`` (``gpupack.io/group: a#reserve-1``), but the slot after the last mark
    is digits only, so the group is exactly what comes before it."""
    group, mark, slot = key.rpartition(RESERVE_MARK)
    if not mark or not group or not slot.isdigit() or str(int(slot)) != slot:
        return None
    return group, int(slot)


# Status.check of a group refusal -> wait reason (anything else: "other").
_WAIT_BY_CHECK = {TOPOLOGY_LABEL: "no_domain", EXCLUSIVE_DOMAIN: "exclusive_taken",
                  GROUP_FIT: "no_room"}


def wait_category(status: Status) -> str:
    """The bounded wait reason of a group refusal (one of WAIT_REASONS)."""
    return _WAIT_BY_CHECK.get(status.check, "other")


def looks_grouped(pod: Mapping[str, Any]) -> bool:
    """Cheap pre-check on a raw pod: could it be a group member at all?"""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    if not isinstance(meta, Mapping):
        return False
    labels = meta.get("labels")
    ann = meta.get("annotations")
    spec = pod.get("spec")
    return (isinstance(labels, Mapping) and A.LWS_NAME in labels) or (
        isinstance(ann, Mapping) and A.GROUP in ann
    ) or (isinstance(spec, Mapping) and spec.get("schedulingGroup") is not None)
