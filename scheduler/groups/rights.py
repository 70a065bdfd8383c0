"""What a group may reserve: its size, the nodes every member could run on, its quota.

Pure: a function of the group's pods (requests and :class:`kube.constraints.
PodConstraints`), the nodes (labels and taints), the namespace's ResourceQuotas and the
LeaderWorkerSet object -> :class:`GroupRights`. Nothing here reads the cache or a clock.

* **Size**: the LeaderWorkerSet's ``spec.leaderWorkerTemplate.size`` when the object is
  known (a group whose index is not below its ``spec.replicas`` is being scaled away and
  is refused); otherwise the size the members' labels/annotations say, which must agree.
  Either way the whole group may ask for at most ``max_group_gpus`` GPUs: a label costs
  nothing to write, and neither does a LeaderWorkerSet object in a namespace its author
  may create one in (what a namespace may hold in reservations altogether is
  :mod:`scheduler.groups.namespace_cap`). A PodGroup's group (``spec.schedulingGroup``,
  :mod:`scheduler.groups.pod_groups`) is sized by its PodGroup and is a group sized by
  its pods here: the PodGroup costs its author no more than a label does. A group whose
  pods name it in different ways (a PodGroup and an annotation of the same name) is
  refused.
* **Exclusive topology**: a group whose pods ask for LeaderWorkerSet's exclusive
  placement keeps that domain from other groups (of its own namespace, see
  :func:`packing.model.exclusive_key`) only when its LeaderWorkerSet object says so too
  (the ``leaderworkerset.sigs.k8s.io/exclusive-topology`` annotation, the same key);
  pods with forged labels and no such object are placed without exclusivity.
* **Scheduler**: every member not bound yet must have gpupack's ``schedulerName``; a
  member another scheduler places would never take its room.
* **Nodes**: a node is allowed when every member, and every template of the
  LeaderWorkerSet (the members not created yet; for a PodGroup's group, the worker
  template of the LeaderWorkerSet its Workload names), could run on it
  (:func:`kube.constraints.why_not`: node selector, required node affinity, NoSchedule
  and NoExecute taints against tolerations).
* **Quota**: per ResourceQuota of the namespace that covers the members, and per GPU
  resource it limits, the whole group's demand (members not created yet shaped like the
  largest known member) must not exceed ``hard``: else the group can never be whole and
  is refused for good (``never``). Whether it fits in what is *left* now depends on the
  other groups reserved in the same pass, so that part is a claim
  (``claims``) that :func:`scheduler.groups.decide.reconcile` checks and charges.

Members are size slots: a member fills the slot of its worker index; the slots left are
the members not created yet.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kube.annotations import MAX_GROUP_SIZE, small_int
from kube.constraints import PodConstraints, Taint, why_not
from kube.groups.lws import LwsShape
from kube.quotas import Quota, covers, gpu_resources
from packing.model import PodRequest, RequestKind
from packing.status import Status

QuotaKey = tuple[str, str]  # ("namespace/quota-name", GPU resource)


@dataclass(frozen=True)
class MemberFacts:
    """A pod of the group as the watch shows it."""

    req: PodRequest
    constraints: PodConstraints | str | None  # a string: why they could not be read
    bound: bool
    scheduler: str


@dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...] = ()


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


DEFAULT_RESERVED_CAP = parse_reserved_cap("50%")


@dataclass(frozen=True)
class RightsSettings:
    max_group_gpus: int = 64
    scheduler_name: str = "gpupack"
    # What one namespace's reservations may hold (None: no cap).
    namespace_cap: ReservedCap | None = None


@dataclass(frozen=True)
class GroupRights:
    size: int
    allowed: frozenset[str] | None = None  # None: every node
    refused: str | None = None  # why it cannot be reserved now
    never: bool = False  # refused for what it is (not for what is free): holds nothing
    # (quota, resource) -> (the whole group's demand, what its existing pods count already)
    claims: Mapping[QuotaKey, tuple[int, int]] = field(default_factory=dict)
    # GPUs its reservation would hold (members not bound and not created yet), as
    # devices() counts them: what a namespace's reservation cap is charged.
    reserves: int = 0
    # False: its pods ask for exclusive topology, but no LeaderWorkerSet object says so.
    exclusive_backed: bool = True


def devices(req: PodRequest) -> int:
    """GPUs a member takes, for ``max_group_gpus``: its whole GPUs, or one for a MIG
    slice or a share (the device it sits on)."""
    if req.kind is RequestKind.WHOLE:
        return req.gpu_count
    return 0 if req.kind is RequestKind.NONE else 1


def largest(reqs: Iterable[PodRequest]) -> PodRequest:
    """The shape held for members not created yet (as the reservation book holds it)."""
    return max(reqs, key=lambda p: (p.gpu_demand_milli, p.cpu_milli, p.memory_mib, p.key))


def _node_part(c: PodConstraints) -> PodConstraints:
    """Only what decides the nodes (so equal node constraints are judged once)."""
    return PodConstraints(node_selector=c.node_selector, affinity=c.affinity,
                          tolerations=c.tolerations)


def group_size(key: str, members: Sequence[MemberFacts], lws: LwsShape | None
               ) -> tuple[int, bool, str | None]:
    """(size, whether the LeaderWorkerSet object gave it, why refused)."""
    if lws is not None:
        index = small_int(key.rsplit("/", 1)[-1])
        if index is not None and index >= lws.replicas:
            return lws.size, True, (
                f"LeaderWorkerSet {lws.namespace}/{lws.name} has {lws.replicas} groups; "
                f"group {index} is being scaled away")
        return lws.size, True, None
    sizes = sorted({m.req.group.size for m in members if m.req.group is not None})
    if len(sizes) > 1:
        return max(sizes), False, (
            f"its members disagree on the group size ({', '.join(map(str, sizes))})")
    return (sizes[0] if sizes else 1), False, None


# Status.check of no node being one every member may run on (selectors, affinity, taints).
NODE_RULES = "NodeRules"


def allowed_nodes(constraints: Iterable[PodConstraints], nodes: Iterable[NodeFacts]
                  ) -> frozenset[str] | Status:
    """The nodes every constraint set allows, or why none is (check NODE_RULES, the first
    node's reason)."""
    sets = sorted({_node_part(c) for c in constraints}, key=repr)
    if not sets:
        return frozenset(n.name for n in nodes)
    ok: set[str] = set()
    first: str | None = None
    for n in nodes:
        why = next((w for c in sets if (w := why_not(c, n.name, n.labels, n.taints))), None)
        if why is None:
            ok.add(n.name)
        elif first is None:
            first = f"{n.name}: {why}"
    if not ok:
        return Status.unschedulable(NODE_RULES, first or "the cluster has no nodes")
    return frozenset(ok)


def group_rights(key: str, members: Sequence[MemberFacts], nodes: Sequence[NodeFacts],
                 quotas: Sequence[Quota], lws: LwsShape | None, settings: RightsSettings,
                 templates: Sequence[PodConstraints] = ()) -> GroupRights:
    """The rights of group ``key`` (see the module docstring). ``templates``: pod
    templates that also bound the nodes of the members not created yet (a PodGroup's,
    through its Workload's controller)."""
    namespace = key.split("/", 1)[0]
    size, from_lws, why = group_size(key, members, lws)
    if why is None and len({m.req.group.pod_group is not None for m in members
                            if m.req.group is not None}) > 1:
        why = ("its pods name it in different ways (some by spec.schedulingGroup, some by "
               "labels or annotations)")
    if why is None and size > MAX_GROUP_SIZE:
        why = f"{size} pods is more than gpupack places as one group (at most {MAX_GROUP_SIZE})"
    if why is not None:
        return GroupRights(size, refused=why, never=True)
    for m in members:
        if isinstance(m.constraints, str):
            return GroupRights(size, refused=f"member {m.req.key}: {m.constraints}", never=True)
        if not m.bound and m.scheduler != settings.scheduler_name:
            return GroupRights(size, never=True, refused=(
                f"member {m.req.key} is scheduled by {m.scheduler!r}, not "
                f"{settings.scheduler_name!r}: gpupack could not keep its room"))
    if not members:
        return GroupRights(size, refused="no member pod is known", never=True)
    # Slots: members by worker index; the rest are members not created yet.
    by_slot: dict[int, MemberFacts] = {}
    for m in sorted(members, key=lambda m: (not m.bound, m.req.key)):
        idx = m.req.group.index if m.req.group is not None else 0
        if idx >= size or idx in by_slot:
            idx = next((s for s in range(size) if s not in by_slot), -1)
        if idx >= 0:
            by_slot[idx] = m
    shape = largest(m.req for m in members)
    shape_c = next(m.constraints for m in members if m.req is shape)
    missing = size - len(by_slot)
    total = sum(devices(m.req) for m in by_slot.values()) + missing * devices(shape)
    reserves = sum(devices(m.req) for m in by_slot.values() if not m.bound) \
        + missing * devices(shape)
    if total > settings.max_group_gpus:
        sized = f"LeaderWorkerSet {lws.namespace}/{lws.name}" if from_lws and lws else \
            "its pods' labels"
        return GroupRights(size, never=True, refused=(
            f"the group asks for {total} GPUs ({size} pods, sized by {sized}), more than "
            f"--max-group-gpus {settings.max_group_gpus} allows a group"))
    backed = exclusive_backed(members, lws)
    claims: dict[QuotaKey, tuple[int, int]] = {}
    for q in quotas:
        demand: dict[str, int] = {}
        existing: dict[str, int] = {}
        slots = [(m.req, m.constraints, True) for m in by_slot.values()]
        slots += [(shape, shape_c, False)] * missing
        for req, c, exists in slots:
            if isinstance(c, PodConstraints) and not covers(q, namespace, c):
                continue
            for res, n in gpu_resources(req).items():
                if res in q.hard:
                    demand[res] = demand.get(res, 0) + n
                    if exists:
                        existing[res] = existing.get(res, 0) + n
        for res, n in sorted(demand.items()):
            if n > q.hard[res]:
                return GroupRights(size, never=True, refused=(
                    f"the whole group needs {n} {res}, more than ResourceQuota "
                    f"{q.namespace}/{q.name} allows ({q.hard[res]})"))
            claims[(f"{q.namespace}/{q.name}", res)] = (n, existing.get(res, 0))
    sets = [m.constraints for m in members if isinstance(m.constraints, PodConstraints)]
    if lws is not None:
        sets += list(lws.templates)
    if missing > 0:
        sets += list(templates)
    allowed = allowed_nodes(sets, nodes)
    if isinstance(allowed, Status):
        return GroupRights(size, refused=(
            f"no node is one every member could run on ({allowed})"), claims=claims,
            reserves=reserves, exclusive_backed=backed)
    everything = len(allowed) == len(nodes)
    return GroupRights(size, allowed=None if everything else allowed, claims=claims,
                       reserves=reserves, exclusive_backed=backed)


def exclusive_backed(members: Sequence[MemberFacts], lws: LwsShape | None) -> bool:
    """Whether the exclusivity the members' pods ask for (if any) is the LeaderWorkerSet
    object's own: its exclusive-topology annotation names the same topology key."""
    asked = {m.req.group.topology_key for m in members
             if m.req.group is not None and m.req.group.exclusive}
    if not asked:
        return True
    return lws is not None and asked == {lws.exclusive_topology}


def quota_left(quotas: Sequence[Quota], namespace: str,
               pods: Iterable[tuple[PodRequest, PodConstraints | str | None]],
               future: Iterable[tuple[PodRequest, PodConstraints | str | None]] = (),
               ) -> dict[QuotaKey, int]:
    """What each quota of ``namespace`` has left per GPU resource, after the pods that
    exist (not finished) and the rooms reserved for members not created yet (``future``:
    they will count once created). Unreadable constraints count as covered."""
    out: dict[QuotaKey, int] = {}
    items = list(pods) + list(future)
    for q in quotas:
        for res, hard in q.hard.items():
            used = 0
            for req, c in items:
                if isinstance(c, PodConstraints) and not covers(q, namespace, c):
                    continue
                used += gpu_resources(req).get(res, 0)
            out[(f"{q.namespace}/{q.name}", res)] = hard - used
    return out

