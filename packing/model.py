"""The packing model: small frozen value types shared by every solver.

A :class:`Snapshot` is what the scheduler knows at one instant: nodes with their GPUs,
what is already allocated and to whom, which pods are pending, and which groups those
pods belong to. A :class:`Placement` says where one pending pod goes. Nothing here does
I/O; builders from Kubernetes objects live in ``kube/`` and from traces in
``sim.traces``.

Units: CPU in millicores, memory in MiB, GPU compute in milli-GPUs (1000 = one GPU).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, TypeGuard

from packing.device_plugin import AllocationPolicy
from packing.taints import Taint as Taint  # re-exported (packing.dra reads it too)

if TYPE_CHECKING:  # the type only: a snapshot built without DRA never imports packing.dra
    from packing.dra.world import DraWorld

GPU_MILLI = 1000

# GPUs on one node. Real nodes have up to 8 (16 on a few); counts (from labels,
# allocatable or the node agent) past this are corrupt, and each GPU would become
# objects and search work.
MAX_NODE_GPUS = 64


def is_pod_key(value: object) -> TypeGuard[str]:
    """A pod key as every wire format of ours writes it: ``namespace/name``, one ``/``,
    neither side empty."""
    return isinstance(value, str) and value.count("/") == 1 and "" not in value.split("/")


class GpuMode(StrEnum):
    """How a GPU is exposed to pods."""

    WHOLE = "whole"  # advertised as nvidia.com/gpu: one pod owns the GPU
    MIG = "mig"  # partitioned into MIG instances (nvidia.com/mig-<profile>)
    SHARED = "shared"  # time-sliced replicas (nvidia.com/gpu.shared): no memory isolation
    # GPU-sharing schedulers of the openb trace: a GPU is either taken whole or split by
    # milli-GPU among fractional pods. Kubernetes' device plugin has no such mode; the
    # published trace experiment is replayed through it, and a DRA device with consumable
    # capacity (KEP-5075) is one (packing.dra.inventory: a share's milli is its memory's).
    FRACTIONAL = "fractional"


class MigReconfigure(StrEnum):
    """Whether a node's MIG layouts may change, and, when they may not, why.

    Only a node that opts in (label ``gpupack.io/mig-reconfigure: "true"``) while the MIG
    actuator is on (a setting of the process, off by default) may have its idle GPUs
    re-partitioned; everywhere else the layout is what the node reports, and no solver
    may count a slice that does not exist as free.
    """

    NOT_OPTED_IN = "not-opted-in"  # no label: the layout is what the node reports
    FROZEN = "frozen"  # label "false": the layout is what the node reports
    ACTUATOR_OFF = "actuator-off"  # label "true", but nothing would create the slices
    ON = "on"  # label "true" and the actuator is on: idle GPUs may be re-partitioned

    @classmethod
    def of(cls, opt_in: bool | None, actuator: bool) -> MigReconfigure:
        """From the node's opt-in (True "true", False "false", None absent) and whether
        the MIG actuator is on."""
        if opt_in is None:
            return cls.NOT_OPTED_IN
        if not opt_in:
            return cls.FROZEN
        return cls.ON if actuator else cls.ACTUATOR_OFF

    @property
    def why_fixed(self) -> str:
        """Why the layout cannot change, for reasons people read ("" when it can)."""
        return {
            MigReconfigure.NOT_OPTED_IN: "the node does not opt in to MIG reconfiguration "
                                         '(gpupack.io/mig-reconfigure: "true")',
            MigReconfigure.FROZEN: "the node freezes its MIG layout "
                                   '(gpupack.io/mig-reconfigure: "false")',
            MigReconfigure.ACTUATOR_OFF: "the node opts in to MIG reconfiguration but the "
                                         "MIG actuator is off",
            MigReconfigure.ON: "",
        }[self]


class RequestKind(StrEnum):
    """What kind of GPU resource a pod asks for."""

    NONE = "none"  # CPU/memory only
    WHOLE = "whole"  # gpu_count whole GPUs on one node
    MIG = "mig"  # one MIG instance of mig_profile
    SHARED = "shared"  # one share of one GPU: gpu_milli compute, gpu_memory_mib memory


# The kinds of GPU pod a GPU takes in each mode (packing.state admits by it; a whole-mode
# GPU that the MIG actuator may switch takes MIG pods too, which the state checks apart).
MODE_SERVES: dict[GpuMode, frozenset[RequestKind]] = {
    GpuMode.WHOLE: frozenset({RequestKind.WHOLE}),
    GpuMode.SHARED: frozenset({RequestKind.SHARED}),
    GpuMode.MIG: frozenset({RequestKind.MIG}),
    GpuMode.FRACTIONAL: frozenset({RequestKind.WHOLE, RequestKind.SHARED}),
}


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One GPU instance of a MIG layout; ``owner`` is the pod key using it, if any."""

    profile: str
    start: int
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU of a node."""

    index: int
    model: str  # catalog model name, e.g. "H100-80GB"
    memory_mib: int
    mode: GpuMode = GpuMode.WHOLE
    mig: tuple[MigInstance, ...] = ()  # current MIG layout (MIG mode only)
    replicas: int = 1  # time-slice replicas (SHARED mode); 0 means unlimited
    # SHARED mode only: the device plugin shares this GPU with MPS (``sharing.mps``), which
    # caps each client at memory_mib // replicas, instead of time-slicing it.
    mps: bool = False
    # True when this per-GPU detail was inferred from node-level labels and allocatable
    # rather than reported by the node agent.
    inferred: bool = False
    # Where memory_mib comes from: "nvml" (the node agent), "gfd" (the
    # nvidia.com/gpu.memory label) or "catalog" (the model's nominal size, the fallback).
    memory_source: str = "catalog"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node as the packer sees it."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuInfo, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    # Whether MIG layouts may be changed on this node's idle GPUs (see MigReconfigure):
    # only then may a pod get a new instance created at a free, valid start.
    mig_reconfigure: MigReconfigure = MigReconfigure.NOT_OPTED_IN
    # The device plugin's allocation policy for replicated (time-sliced/MPS) GPUs: which
    # GPU a share lands on (packing.device_plugin).
    share_policy: AllocationPolicy = AllocationPolicy.DISTRIBUTED
    # spec.taints: which pods may land here (kube.constraints judges tolerations).
    taints: tuple[Taint, ...] = ()

    @property
    def mig_reconfigurable(self) -> bool:
        return self.mig_reconfigure is MigReconfigure.ON

    @property
    def gpu_models(self) -> frozenset[str]:
        return frozenset(g.model for g in self.gpus)

    def topology(self, key: str) -> str | None:
        return self.labels.get(key)


def with_mig_actuator(nodes: Iterable[NodeInfo], on: bool) -> tuple[NodeInfo, ...]:
    """``nodes`` as a process whose MIG actuator is ``on`` (or off) sees them: a node that
    opts in may be re-partitioned exactly while the actuator is on."""
    out = []
    for n in nodes:
        if n.mig_reconfigure in (MigReconfigure.ACTUATOR_OFF, MigReconfigure.ON):
            n = replace(n, mig_reconfigure=MigReconfigure.of(True, on))
        out.append(n)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class GroupRef:
    """Membership of a pod in an all-or-nothing group."""

    key: str  # e.g. "ns/lws-name/0"
    size: int  # pods in the group, leader included
    index: int = 0  # worker index; 0 is the leader
    topology_key: str | None = None  # all members inside one domain of this label
    exclusive: bool = False  # one group per topology domain (of its namespace)
    # The fewest members that make the group whole (a PodGroup's gang ``minCount``); 0:
    # every one of ``size``. Its room is held for at least this many at once.
    minimum: int = 0
    # The PodGroup (``scheduling.k8s.io``) the pod's ``spec.schedulingGroup`` names, in
    # the pod's namespace: its size, minimum and topology come from that object.
    pod_group: str | None = None

    @property
    def min_count(self) -> int:
        """Members that make the group whole: ``minimum`` when set, else ``size``."""
        return min(self.minimum, self.size) if self.minimum > 0 else self.size

    @property
    def exclusive_key(self) -> str:
        """What an exclusive domain of this group is taken under: see
        :func:`exclusive_key`."""
        return exclusive_key(self.key, self.topology_key)


def exclusive_key(group: str, topology_key: str | None) -> str:
    """The key a group's exclusive domain is taken under, ``(key, domain value)``: its
    topology key *within the group's namespace*. An exclusive group keeps out the other
    groups of its own namespace only, as kube-scheduler does for LeaderWorkerSet's
    exclusive placement (a pod anti-affinity term with no namespaces applies to the
    pod's own namespace): a tenant's group, forged or real, never takes a domain away
    from another namespace's groups."""
    return f"{group.split('/', 1)[0]}/{topology_key or ''}"


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What one pod needs."""

    key: str  # "namespace/name"
    cpu_milli: int = 0
    memory_mib: int = 0
    kind: RequestKind = RequestKind.NONE
    gpu_count: int = 0  # WHOLE
    mig_profile: str | None = None  # MIG, e.g. "1g.10gb"
    gpu_milli: int = 0  # SHARED: compute share (0..1000; 0 = bounded by replicas and memory)
    gpu_memory_mib: int = 0  # SHARED: GPU memory declared or observed (peak)
    gpu_models: frozenset[str] = frozenset()  # allowed catalog models; empty = any
    node_selector: Mapping[str, str] = field(default_factory=dict)
    priority: int = 0
    group: GroupRef | None = None
    uid: str = ""
    klass: str = ""  # gpupack.io/class or derived: asr, tts, small, whole, llm, cpu
    # The admission that chose this pod's slice or share (the "id" of its
    # gpupack.io/decision): lets the webhook stop counting its own in-flight claim once
    # the pod is in the snapshot. "" for pods the webhook did not size.
    admission: str = ""

    @property
    def gpu_demand_milli(self) -> int:
        """GPU capacity the pod takes, in milli-GPUs (a MIG slice counts by memory)."""
        if self.kind is RequestKind.WHOLE:
            return self.gpu_count * GPU_MILLI
        if self.kind is RequestKind.SHARED:
            return self.gpu_milli
        return 0


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pod goes (or already is): a node and the GPU resources it takes there."""

    pod: str
    node: str
    gpus: tuple[int, ...] = ()  # whole GPUs, or the one shared/MIG GPU
    mig_profile: str | None = None
    mig_start: int | None = None
    mig_created: bool = False  # the MIG instance does not exist yet and must be created

    def to_json(self) -> dict[str, object]:
        mig: dict[str, object] | None = None
        if self.mig_profile is not None:
            # A placement read from a pod's annotations may name no GPU; it is still
            # rendered (to say why it was ignored), never indexed past its end.
            gpu = self.gpus[0] if self.gpus else None
            mig = {"gpu": gpu, "profile": self.mig_profile, "start": self.mig_start}
        return {"pod": self.pod, "node": self.node, "gpus": list(self.gpus), "mig": mig}


@dataclass(frozen=True, slots=True)
class Unschedulable:
    pod: str
    reason: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Nodes, the pods already on them (with their placements) and the pending pods.

    ``dra``: the cluster's Dynamic Resource Allocation objects (ResourceSlices,
    DeviceClasses, ResourceClaims with their allocations, DeviceTaintRules, and the
    allocations the extender assumed for pods it just approved), ready for
    :meth:`~packing.dra.world.DraWorld.predict`; None when the cluster has none. The GPUs
    of DRA nodes are already in ``nodes`` and what allocated claims hold in ``running``
    (as ``dra:`` entries, :mod:`packing.dra.inventory`): ``dra`` is for predicting where
    a claim not yet allocated will land.
    """

    nodes: tuple[NodeInfo, ...]
    running: tuple[tuple[PodRequest, Placement], ...] = ()
    pending: tuple[PodRequest, ...] = ()
    dra: DraWorld | None = None

    def node(self, name: str) -> NodeInfo:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)


@dataclass(frozen=True, slots=True)
class PlanResult:
    """A solver's answer for the pending pods of a snapshot."""

    placements: tuple[Placement, ...]
    unschedulable: tuple[Unschedulable, ...]
    policy: str
    # greedy | OPTIMAL | FEASIBLE, then /fallback-greedy or /tie-greedy
    solver_status: str = "greedy"
