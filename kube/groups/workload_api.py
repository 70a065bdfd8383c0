"""kube-scheduler's Workload API (``scheduling.k8s.io``, KEP-4671): the PodGroup a pod
names, and the Workload a PodGroup was made from. Read here (pure); watched by
:class:`kube.api_source.ApiSource` when the API server serves them; kept parsed in
:class:`kube.groups.inputs.GroupInputs`.

What Kubernetes v1.37.2 has (checked against its code, not its proposals):

* A pod joins a group with ``spec.schedulingGroup.podGroupName``: a standalone
  ``PodGroup`` in the pod's own namespace (the field has no namespace). The pod field
  ``spec.workloadRef`` of earlier releases is gone. With the ``GenericWorkload`` gate
  off the API server drops ``spec.schedulingGroup`` from new pods.
* ``PodGroup.spec.schedulingPolicy`` is ``basic: {}`` (members scheduled one by one) or
  ``gang: {minCount: N}`` (kube-scheduler admits the group once ``minCount`` members can
  be placed together; ``minCount`` may change). ``spec.schedulingConstraints.topology
  [0].key`` (gate ``TopologyAwareWorkloadScheduling``, alpha) keeps the members in one
  domain of a node label. ``spec.workloadRef`` = ``{workloadName, templateName}``.
* ``Workload.spec.podGroupTemplates[]`` are templates a controller copies into PodGroups
  (``spec.controllerRef``: the controller, e.g. a LeaderWorkerSet). kube-scheduler
  never reads Workloads: the PodGroup is the gang.
* Served at ``scheduling.k8s.io/v1beta1`` (``workloads``, ``podgroups``; also
  ``v1alpha3``), but only with the gate on *and* the version enabled by
  ``--runtime-config`` (beta and alpha APIs are off by default). kube-scheduler's
  informers use ``v1beta1``: so does gpupack.

Every object comes from outside: a field gpupack cannot use is an :class:`ObjectError`
naming the object and the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kube.annotations import MAX_GROUP_SIZE
from kube.fields import ObjectError

GROUP = "scheduling.k8s.io"
VERSION = "v1beta1"
PODGROUPS = "podgroups"
WORKLOADS = "workloads"
# A Workload's controller that is a LeaderWorkerSet (kubernetes-sigs/lws#982).
LWS_API_GROUP = "leaderworkerset.x-k8s.io"
LWS_KIND = "LeaderWorkerSet"

# RFC 1123 subdomain, as the API server validates object names.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_object_name(v: object) -> bool:
    return isinstance(v, str) and len(v) <= 253 and _SUBDOMAIN.fullmatch(v) is not None


def _show(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class PodGroupShape:
    """What gpupack uses of a PodGroup."""

    namespace: str
    name: str
    gang: bool  # False: basic, its members are placed one by one
    min_count: int  # gang minCount (1 when basic)
    topology_key: str | None = None  # spec.schedulingConstraints.topology[0].key
    workload: str | None = None  # spec.workloadRef.workloadName (same namespace)


@dataclass(frozen=True)
class WorkloadShape:
    """What gpupack uses of a Workload: its controller, (apiGroup, kind, name) in the
    Workload's namespace, when it names one."""

    namespace: str
    name: str
    controller: tuple[str, str, str] | None = None

    @property
    def lws(self) -> str | None:
        """The LeaderWorkerSet that controls it, if one does."""
        c = self.controller
        return c[2] if c is not None and c[0] == LWS_API_GROUP and c[1] == LWS_KIND else None


def _meta(obj: Any, kind: str) -> tuple[str, str]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping) or not is_object_name(meta.get("name")) \
            or not isinstance(meta.get("namespace"), str) or not meta["namespace"]:
        raise ObjectError(f"{kind}: metadata.name and metadata.namespace are required")
    return meta["namespace"], meta["name"]


def _map(v: Any, where: str) -> Mapping[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ObjectError(f"{where}: expected an object, got {_show(v)}")
    return v


def pod_group_of(obj: Mapping[str, Any]) -> PodGroupShape:
    """The shape of a PodGroup; ObjectError naming the field."""
    ns, name = _meta(obj, "PodGroup")
    who = f"PodGroup {ns}/{name}"
    spec = _map(obj.get("spec"), f"{who}: spec")
    policy = _map(spec.get("schedulingPolicy"), f"{who}: spec.schedulingPolicy")
    gang = policy.get("gang")
    if gang is None:
        if policy.get("basic") is None:
            raise ObjectError(f"{who}: spec.schedulingPolicy: neither basic nor gang is set")
        gang_on, min_count = False, 1
    else:
        where = f"{who}: spec.schedulingPolicy.gang.minCount"
        n = _map(gang, f"{who}: spec.schedulingPolicy.gang").get("minCount")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ObjectError(f"{where}: {_show(n)} is not an integer of at least 1")
        if n > MAX_GROUP_SIZE:
            raise ObjectError(f"{where}: {n} pods is more than gpupack places as one group "
                              f"(at most {MAX_GROUP_SIZE})")
        gang_on, min_count = True, n
    topology = None
    constraints = _map(spec.get("schedulingConstraints"), f"{who}: spec.schedulingConstraints")
    terms = constraints.get("topology")
    if terms:
        where = f"{who}: spec.schedulingConstraints.topology"
        if not isinstance(terms, list) or not isinstance(terms[0], Mapping) \
                or not isinstance(terms[0].get("key"), str) or not terms[0]["key"]:
            raise ObjectError(f"{where}: expected a list of {{key: <node label>}}, got "
                              f"{_show(terms)}")
        topology = terms[0]["key"]
    ref = _map(spec.get("workloadRef"), f"{who}: spec.workloadRef")
    workload = ref.get("workloadName")
    if workload is not None and not is_object_name(workload):
        raise ObjectError(f"{who}: spec.workloadRef.workloadName: {_show(workload)} is not "
                          "an object name")
    return PodGroupShape(ns, name, gang_on, min_count, topology, workload)


def workload_of(obj: Mapping[str, Any]) -> WorkloadShape:
    """The shape of a Workload; ObjectError naming the field."""
    ns, name = _meta(obj, "Workload")
    who = f"Workload {ns}/{name}"
    spec = _map(obj.get("spec"), f"{who}: spec")
    ref = spec.get("controllerRef")
    if ref is None:
        return WorkloadShape(ns, name)
    ref = _map(ref, f"{who}: spec.controllerRef")
    group, kind, target = ref.get("apiGroup", ""), ref.get("kind"), ref.get("name")
    if not isinstance(group, str) or not isinstance(kind, str) or not kind \
            or not is_object_name(target):
        raise ObjectError(f"{who}: spec.controllerRef: expected {{apiGroup, kind, name}}, "
                          f"got {_show(dict(ref))}")
    return WorkloadShape(ns, name, (group, kind, str(target)))


def scheduling_group(spec: Mapping[str, Any], who: str) -> str | None:
    """The PodGroup a pod's ``spec.schedulingGroup.podGroupName`` names (None: no
    ``schedulingGroup``); ObjectError naming the field."""
    sg = spec.get("schedulingGroup")
    if sg is None:
        return None
    if not isinstance(sg, Mapping):
        raise ObjectError(f"{who}: spec.schedulingGroup: expected an object, got {_show(sg)}")
    name = sg.get("podGroupName")
    if not is_object_name(name):
        raise ObjectError(f"{who}: spec.schedulingGroup.podGroupName: {_show(name)} is not "
                          "the name of a PodGroup")
    return str(name)


class WorkloadSink(Protocol):
    """Where :class:`kube.api_source.ApiSource` puts PodGroups and Workloads (``kind``
    is PODGROUPS or WORKLOADS)."""

    def replace_workload_objects(self, kind: str, objs: list[Mapping[str, Any]],
                                 served: bool) -> None:
        """A full list (``served`` False: the API server does not serve the kind; empty)."""
        ...

    def workload_listed(self, kind: str) -> None:
        """The first list of ``kind`` failed (not with 404): count it as listed."""
        ...

    def upsert_workload_object(self, kind: str, obj: Mapping[str, Any]) -> None: ...

    def delete_workload_object(self, kind: str, obj: Mapping[str, Any]) -> None: ...
