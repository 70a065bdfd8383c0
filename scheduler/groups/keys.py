"""The reservation book's small helpers: hold keys, the bounded wait reasons of the
``gpupack_groups_waiting`` metric (read from a refusal's check, never its wording), and
the cheap "is this pod a group member at all" test. The placement itself is pure and
lives in :mod:`packing.groups.placement`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube import annotations as A
from packing.groups.members import RESERVE_MARK
from packing.groups.placement import EXCLUSIVE_DOMAIN, GROUP_FIT, TOPOLOGY_LABEL
from packing.status import Status

# Bounded reasons of gpupack_groups_waiting.
WAIT_REASONS = ("no_room", "no_domain", "exclusive_taken", "expired", "displaced", "other",
                "no_rights")


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
