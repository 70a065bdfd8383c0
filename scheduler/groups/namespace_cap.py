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

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from packing.model import PodRequest
from scheduler.groups.rights import GroupRights, QuotaKey, devices

# The resource name of the cap in quota keys and messages.
CAP_RESOURCE = "GPUs in reservations"
CAP_PREFIX = "namespace "
DEFAULT_CAP = "50%"


@dataclass(frozen=True)
class ReservedCap:
    """``gpus`` GPUs, or ``percent`` of the cluster's (exactly one of them is set)."""

    gpus: int | None = None
    percent: float | None = None

    def of(self, cluster_gpus: int) -> int:
        """The cap for a cluster of ``cluster_gpus`` GPUs (a share rounds down; at least
        one GPU of a cluster that has any)."""
        if self.gpus is not None:
            return self.gpus
        assert self.percent is not None
        return max(1 if cluster_gpus else 0, math.floor(cluster_gpus * self.percent / 100))

    def text(self, cluster_gpus: int) -> str:
        if self.gpus is not None:
            return str(self.gpus)
        return f"{self.percent:g}% of the cluster's {cluster_gpus} GPUs"


def parse_reserved_cap(text: str) -> ReservedCap:
    """``"32"`` or ``"50%"``; ValueError naming the value otherwise."""
    raw = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)%", raw)
    if m:
        pct = float(m.group(1))
        if not 0 < pct <= 100:
            raise ValueError(f"{text!r}: a share must be above 0% and at most 100%")
        return ReservedCap(percent=pct)
    if raw.isdigit():
        return ReservedCap(gpus=int(raw))
    raise ValueError(f"{text!r} is not a number of GPUs (32) or a share of the cluster (50%)")


DEFAULT_RESERVED_CAP = parse_reserved_cap(DEFAULT_CAP)


def cap_key(namespace: str) -> QuotaKey:
    return (f"{CAP_PREFIX}{namespace}", CAP_RESOURCE)


def is_cap_key(quota: str) -> bool:
    return quota.startswith(CAP_PREFIX)


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
