"""Groups kube-scheduler gangs itself: a pod whose ``spec.schedulingGroup`` names a
PodGroup (:mod:`kube.groups.workload_api`) is a member of that PodGroup's group, whose
size, minimum and topology the PodGroup says (pure).

A pod is read without its PodGroup (:func:`kube.objects.group_ref` gives such a member
size 1): the PodGroup may come later, and changes (``minCount`` is mutable). So the book
resolves each group when it reads its members, with the PodGroup as last seen:

* **gang** ``minCount`` N: the group's size is ``max(N, pods naming it)`` (a PodGroup
  says no size; its pods that exist are members, and a room is held for each of the N
  not created yet), its minimum N (:attr:`packing.model.GroupRef.min_count`), its
  topology the PodGroup's ``schedulingConstraints.topology[0].key`` if any (else the
  NVLink clique, as for every group);
* **basic**: no all-or-nothing group at all: kube-scheduler places its members one by
  one, and so does gpupack (:func:`is_gang` is False, and the book leaves them out);
* **unknown** (not created yet, or not served): the members stay as read; the group's
  rights refuse it (it waits, holding nothing), as kube-scheduler's PreEnqueue holds a
  pod whose PodGroup it has not seen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from kube.groups.workload_api import PodGroupShape
from packing.model import GroupRef, PodRequest
from scheduler.groups.decide import Member

Lookup = Callable[[str, str], PodGroupShape | None]  # (namespace, name) -> PodGroup


def namespace_of(ref: GroupRef) -> str:
    return ref.key.split("/", 1)[0]


def resolve(ref: GroupRef, count: int, shape: PodGroupShape | None) -> GroupRef | None:
    """``ref`` as its PodGroup says, with ``count`` pods naming it (see the module
    docstring); ``ref`` itself when it names no PodGroup or an unknown one; None when
    the PodGroup is basic."""
    if ref.pod_group is None or shape is None:
        return ref
    if not shape.gang:
        return None
    return replace(ref, size=max(shape.min_count, count), minimum=shape.min_count,
                   topology_key=shape.topology_key, exclusive=False)


def is_gang(ref: GroupRef, lookup: Lookup) -> bool:
    """Whether a member of ``ref`` belongs to an all-or-nothing group: every group
    gpupack reads from labels or annotations does, and a PodGroup's unless it is basic
    (an unknown one counts: its members wait for it)."""
    if ref.pod_group is None:
        return True
    shape = lookup(namespace_of(ref), ref.pod_group)
    return shape is None or shape.gang


def resolve_members(members: Mapping[str, Sequence[Member]], lookup: Lookup
                    ) -> dict[str, list[Member]]:
    """Every group's members with their PodGroup's size, minimum and topology; the
    members of basic PodGroups left out. A member that reached a PodGroup's key by
    another source (a ``gpupack.io/group`` annotation of the same name) keeps its own
    reference: the group's rights refuse the mix."""
    out: dict[str, list[Member]] = {}
    for g, ms in members.items():
        named = [m for m in ms if m.req.group is not None and m.req.group.pod_group]
        if not named:
            out[g] = list(ms)
            continue
        first = named[0].req.group
        assert first is not None and first.pod_group is not None
        new = resolve(first, len(ms), lookup(namespace_of(first), first.pod_group))
        if new is None:
            continue
        out[g] = [replace(m, req=replace(m.req, group=replace(new, index=m.req.group.index)))
                  if m.req.group is not None and m.req.group.pod_group else m for m in ms]
    return out


def resolve_requests(pods: Sequence[PodRequest], lookup: Lookup) -> tuple[PodRequest, ...]:
    """Pending pods as :func:`resolve_members` reads their groups (for the other rooms
    that plan for groups, defragmentation): a basic PodGroup's pods as lone pods."""
    count: dict[str, int] = {}
    for p in pods:
        if p.group is not None and p.group.pod_group:
            count[p.group.key] = count.get(p.group.key, 0) + 1
    if not count:
        return tuple(pods)
    out = []
    for p in pods:
        ref = p.group
        if ref is not None and ref.pod_group:
            new = resolve(ref, count[ref.key], lookup(namespace_of(ref), ref.pod_group))
            p = replace(p, group=None if new is None else replace(new, index=ref.index))
        out.append(p)
    return tuple(out)
