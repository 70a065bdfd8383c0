"""The inputs of :func:`scheduler.groups.rights.group_rights`, read from the cache and the
quota and LeaderWorkerSet objects (:class:`kube.groups.inputs.GroupInputs`), for the
reservation book's next :func:`~scheduler.groups.decide.reconcile`.

Called by the book's handler under the cache lock. Only the groups that matter now are
judged (those with a record, and those the next reconcile will try to place), and the
node facts are read once per pass and only when some group needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from kube.cache import ClusterCache
from kube.constraints import PodConstraints
from kube.groups.inputs import GroupInputs
from kube.groups.reservations import ReservationRecord
from kube.groups.workload_api import PODGROUPS
from packing.model import PodRequest
from scheduler.groups.keys import split_hold_key
from scheduler.groups.namespace_cap import held_by_namespace, namespace_claims
from scheduler.groups.pod_groups import resolve
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

    def not_exclusive(self) -> frozenset[str]:
        return frozenset(g for g, r in self.rights.items() if not r.exclusive_backed)


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
        pod_group = next((m.req.group.pod_group for m in members
                          if m.req.group is not None and m.req.group.pod_group), None)
        if pod_group is not None:
            # kube-scheduler's own gang: sized by its PodGroup, never by a LeaderWorkerSet.
            got = _pod_group_members(inputs, ns, pod_group, members)
            if isinstance(got, GroupRights):
                rights[g] = got
                continue
            members, templates = got
            lws, names = None, set()
        else:
            names = {m.constraints.lws for m in members
                     if isinstance(m.constraints, PodConstraints) and m.constraints.lws}
            lws = inputs.lws(ns, next(iter(names))) if len(names) == 1 else None
            templates = ()
        if len(names) > 1:
            rights[g] = GroupRights(max(m.req.group.size for m in members if m.req.group),
                                    refused="its members name different LeaderWorkerSets "
                                            f"({', '.join(sorted(names))})", never=True)
            continue
        if nodes is None:
            nodes = [NodeFacts(n, cache.node_labels(n), cache.taints(n))
                     for n in sorted(cache.node_names())]
        quotas = inputs.quotas(ns)
        rights[g] = group_rights(g, members, nodes, quotas, lws, settings, templates)
        if quotas:
            namespaces.add(ns)
    left: dict[QuotaKey, int] = {}
    if settings.namespace_cap is not None and rights:
        # What each namespace's reservations may hold (scheduler.groups.namespace_cap).
        held = held_by_namespace(
            (parts[0], req) for hk, (req, _) in cache.holds().items()
            if (parts := split_hold_key(hk)) is not None)
        gpus = sum(len(cache.state.nodes[n].info.gpus) for n in cache.node_names()
                   if n in cache.state.nodes)
        rights, cap_left = namespace_claims(rights, held, settings.namespace_cap, gpus)
        left.update(cap_left)
    for ns in sorted(namespaces):
        pods = [(e.req, e.constraints) for e in cache.gpu_pods(ns) if not e.finished]
        left.update(quota_left(inputs.quotas(ns), ns, pods, _future(cache, ns, records)))
    return RightsPass(rights, left)


def _pod_group_members(inputs: GroupInputs, ns: str, name: str, members: list[MemberFacts]
                       ) -> tuple[list[MemberFacts], tuple[PodConstraints, ...]] | GroupRights:
    """The members of PodGroup ``ns/name``'s group as it says (scheduler.groups.pod_groups),
    and the templates that bound its members not created yet: the worker template of the
    LeaderWorkerSet its Workload names as controller (LWS creates a group's leader first,
    so the pods still to come are workers); or the rights that refuse the group."""
    shape = inputs.pod_group(ns, name)
    ref = next(m.req.group for m in members
               if m.req.group is not None and m.req.group.pod_group)
    if shape is None:
        served = inputs.served.get(PODGROUPS)
        why = ("the API server does not serve scheduling.k8s.io/v1beta1 PodGroups"
               if served is False else "gpupack has not seen it (yet)")
        # never: a record is released (a PodGroup deleted: kube-scheduler no longer
        # schedules its pods); the group is judged again when the PodGroups change.
        return GroupRights(ref.size, never=True, refused=(
            f"its pods name PodGroup {ns}/{name} in spec.schedulingGroup, and {why}"))
    new = resolve(ref, len(members), shape)
    if new is None:
        return GroupRights(ref.size, never=True, refused=(
            f"PodGroup {ns}/{name} is basic: its members are placed one by one"))
    out = [replace(m, req=replace(m.req, group=replace(new, index=m.req.group.index)))
           if m.req.group is not None and m.req.group.pod_group else m for m in members]
    templates: tuple[PodConstraints, ...] = ()
    workload = inputs.workload(ns, shape.workload) if shape.workload else None
    lws = inputs.lws(ns, workload.lws) if workload is not None and workload.lws else None
    if lws is not None:
        templates = lws.templates[-1:]  # workerTemplate is required: it comes last
    return out, templates


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
