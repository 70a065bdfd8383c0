"""How many GPUs one namespace may hold in group reservations, and the charge of each.

A reservation holds GPUs for members of a group that are not bound yet, members not
even created included, and anyone who may create a pod can ask for one: in a namespace
without a GPU ResourceQuota, two pending 1-GPU pods labelled as groups of 64 held all
128 GPUs of a 16-node cluster, re-reserving after each expiry. ResourceQuotas bound what
the namespace's pods may *use*; this bounds what its reservations may *hold* meanwhile.

``--max-namespace-reserved-gpus`` (:class:`ReservedCap`): a count of GPUs, or a share of
the cluster's GPUs (default ``50%``: no namespace can hold more than half the cluster in
rooms for pods that may never come). GPUs are counted as
:func:`scheduler.groups.rights.devices` counts them (a whole GPU, or one per MIG slice or
share) over every GPU of every node.

Pure: :func:`namespace_claims` turns each judged group's :class:`~scheduler.groups.rights.
GroupRights` and the rooms held now into a quota-like claim (key :func:`cap_key`) that
:func:`scheduler.groups.decide.reconcile` checks and charges like a ResourceQuota's:
a group whose reservation alone is over the cap is refused for good (``never``); one
that does not fit beside the namespace's other reservations waits, holding nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace

from packing.model import PodRequest
from scheduler.groups.rights import (
    DEFAULT_RESERVED_CAP,
    GroupRights,
    QuotaKey,
    ReservedCap,
    devices,
    parse_reserved_cap,
)

__all__ = ["DEFAULT_RESERVED_CAP", "ReservedCap", "cap_key", "held_by_namespace",
           "is_cap_key", "namespace_claims", "parse_reserved_cap", "short_message"]

# The resource name of the cap in quota keys and messages.
CAP_RESOURCE = "GPUs in reservations"
CAP_PREFIX = "namespace "


def cap_key(namespace: str) -> QuotaKey:
    return (f"{CAP_PREFIX}{namespace}", CAP_RESOURCE)


def is_cap_key(quota: str) -> bool:
    return quota.startswith(CAP_PREFIX)


def short_message(quota: str, resource: str, left: int, need: int) -> str:
    """Why a group's claim of ``need`` does not fit in the ``left`` of ``quota``: a
    ResourceQuota's, or its namespace's cap on GPUs held in reservations."""
    if is_cap_key(quota):
        return (f"{quota} may hold {max(left, 0)} more {resource} "
                f"(--max-namespace-reserved-gpus); the group's reservation would hold {need}")
    return (f"ResourceQuota {quota} has {max(left, 0)} {resource} left; the group needs "
            f"{need} more for its members not created yet")


def held_by_namespace(holds: Iterable[tuple[str, PodRequest]]) -> Counter[str]:
    """GPUs each namespace's reservations hold now: (group key, held request) of every
    room a record holds for a member not bound."""
    out: Counter[str] = Counter()
    for group, req in holds:
        out[group.split("/", 1)[0]] += devices(req)
    return out


def namespace_claims(rights: Mapping[str, GroupRights], held: Mapping[str, int],
                     cap: ReservedCap, cluster_gpus: int
                     ) -> tuple[dict[str, GroupRights], dict[QuotaKey, int]]:
    """Each group's rights with its claim on its namespace's cap added (or refused for
    good when its reservation alone is over the cap), and what each namespace has left.

    ``held``: GPUs each namespace's reservations hold now (a group that holds a record
    is not judged against the cap again: only a new reservation is)."""
    limit = cap.of(cluster_gpus)
    out: dict[str, GroupRights] = {}
    left: dict[QuotaKey, int] = {}
    for g, r in rights.items():
        ns = g.split("/", 1)[0]
        key = cap_key(ns)
        left[key] = limit - held.get(ns, 0)
        if r.refused is not None and r.never:
            out[g] = r
            continue
        if r.reserves > limit:
            out[g] = replace(r, never=True, refused=(
                f"its reservation would hold {r.reserves} GPUs, more than namespace {ns} may "
                f"hold in reservations (--max-namespace-reserved-gpus "
                f"{cap.text(cluster_gpus)} = {limit})"))
            continue
        out[g] = replace(r, claims={**r.claims, key: (r.reserves, 0)})
    return out, left
