"""The inputs of :func:`scheduler.groups.rights.group_rights`, read from the cache and the
quota and LeaderWorkerSet objects (:class:`kube.groups.inputs.GroupInputs`), for the
reservation book's next :func:`~scheduler.groups.decide.reconcile`.

Called by the book's handler under the cache lock. Only the groups that matter now are
judged (those with a record, and those the next reconcile will try to place), and the
node facts are read once per pass and only when some group needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kube.cache import ClusterCache
from kube.constraints import PodConstraints
from kube.groups.inputs import GroupInputs
from kube.groups.reservations import ReservationRecord
from packing.model import PodRequest
from scheduler.groups.keys import split_hold_key
from scheduler.groups.rights import (
    GroupRights,
    MemberFacts,
    NodeFacts,
    QuotaKey,
    RightsSettings,
    group_rights,
    quota_left,
)


@dataclass(frozen=True)
class RightsPass:
    """Every judged group's rights, in the shape :class:`~scheduler.groups.decide.
    BookState` takes them."""

    rights: Mapping[str, GroupRights] = field(default_factory=dict)
    quota_left: Mapping[QuotaKey, int] = field(default_factory=dict)

    def allowed(self) -> Callable[[str, str], bool] | None:
        limited = {g: r.allowed for g, r in self.rights.items() if r.allowed is not None}
        if not limited:
            return None
        return lambda group, node: group not in limited or node in limited[group]

    def refused(self) -> dict[str, str]:
        return {g: r.refused for g, r in self.rights.items() if r.refused is not None}

    def never(self) -> frozenset[str]:
        return frozenset(g for g, r in self.rights.items() if r.never)

    def sizes(self) -> dict[str, int]:
        return {g: r.size for g, r in self.rights.items()}

    def claims(self) -> dict[str, Mapping[QuotaKey, tuple[int, int]]]:
        return {g: r.claims for g, r in self.rights.items() if r.claims}


def _members(cache: ClusterCache, group: str) -> list[MemberFacts]:
    return [MemberFacts(e.req, e.constraints, e.node is not None, e.scheduler)
            for e in cache.group_pods(group) if not e.finished]


def judge(cache: ClusterCache, inputs: GroupInputs, settings: RightsSettings,
          groups: Iterable[str], records: Mapping[str, ReservationRecord]) -> RightsPass:
    """The rights of ``groups`` and what the quotas of their namespaces have left."""
    nodes: list[NodeFacts] | None = None
    rights: dict[str, GroupRights] = {}
    namespaces: set[str] = set()
    for g in sorted(set(groups)):
        members = _members(cache, g)
        if not members:
            continue
        ns = g.split("/", 1)[0]
        names = {m.constraints.lws for m in members
                 if isinstance(m.constraints, PodConstraints) and m.constraints.lws}
        lws = inputs.lws(ns, next(iter(names))) if len(names) == 1 else None
        if len(names) > 1:
            rights[g] = GroupRights(max(m.req.group.size for m in members if m.req.group),
                                    refused="its members name different LeaderWorkerSets "
                                            f"({', '.join(sorted(names))})", never=True)
            continue
        if nodes is None:
            nodes = [NodeFacts(n, cache.node_labels(n), cache.taints(n))
                     for n in sorted(cache.node_names())]
        quotas = inputs.quotas(ns)
        rights[g] = group_rights(g, members, nodes, quotas, lws, settings)
        if quotas:
            namespaces.add(ns)
    left: dict[QuotaKey, int] = {}
    for ns in sorted(namespaces):
        pods = [(e.req, e.constraints) for e in cache.gpu_pods(ns) if not e.finished]
        left.update(quota_left(inputs.quotas(ns), ns, pods, _future(cache, ns, records)))
    return RightsPass(rights, left)


def _future(cache: ClusterCache, ns: str, records: Mapping[str, ReservationRecord]
            ) -> list[tuple[PodRequest, PodConstraints | str | None]]:
    """Rooms held in ``ns`` for members not created yet: they will count once created."""
    out: list[tuple[PodRequest, PodConstraints | str | None]] = []
    for hk, (req, _) in sorted(cache.holds().items()):
        parts = split_hold_key(hk)
        if parts is None:
            continue  # not a group's room (the MIG actuator's holds: scheduler/mig/loop.py)
        group, slot = parts  # split at the last mark: a group name may contain one
        if group.split("/", 1)[0] != ns:
            continue
        rec = records.get(group)
        pod = rec.pods.get(slot) if rec is not None else None
        entry = cache.pod_entry(pod) if pod is not None else None
        if entry is not None and not entry.finished:
            continue  # the member exists: counted with the namespace's pods
        known = cache.group_pods(group)
        out.append((req, known[0].constraints if known else None))
    return out
