"""Names of the labels and annotations gpupack reads and writes, and their codecs.

One reader per annotation: every component that reads ``gpupack.io/gpu-memory`` or
``gpupack.io/gpu-compute`` (the webhook sizing a pod, the extender reading a pod to place
or one already bound) reads it through :func:`gpu_memory_mib` and
:func:`gpu_compute_milli`, so a value means one thing everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping

from packing.groups.members import CLIQUE_LABEL, KEEP_WHOLE_NODES_LABEL
from packing.model import GPU_MILLI, Placement
from packing.quantity import QuantityError, memory_mib, parse_quantity

# The most pods one group may have: larger sizes come from a typo or a hostile object,
# and a reservation holds one request per member (LeaderWorkerSet sizes are small).
MAX_GROUP_SIZE = 1024

PREFIX = "gpupack.io/"
# Written by users.
GPU_MEMORY = PREFIX + "gpu-memory"  # e.g. "8Gi"
GPU_COMPUTE = PREFIX + "gpu-compute"  # fraction of a GPU, e.g. "0.25"
ISOLATION = PREFIX + "isolation"  # mig | shared | any
CLASS = PREFIX + "class"  # asr | tts | small | whole
GROUP = PREFIX + "group"  # non-LWS all-or-nothing group name
GROUP_SIZE = PREFIX + "group-size"
GROUP_TOPOLOGY = PREFIX + "group-topology"  # topology key for a plain group
# Written by gpupack on bind.
NODE = PREFIX + "node"
GPUS = PREFIX + "gpus"  # "0,1"
MIG = PREFIX + "mig"  # "1g.10gb@4" (profile@start)
POLICY = PREFIX + "policy"
DECISION = PREFIX + "decision"
# The placement records of a bound pod, the cache's truth about which GPUs it holds when
# the node agent has not seen it. They reach a pod only through its Binding (the API
# server copies the Binding's annotations onto the pod): the webhook strips them from a
# new pod and the chart's ValidatingAdmissionPolicy (placement-records) refuses any
# create or update that adds, changes or removes them, so no pod author can make gpupack
# book a GPU the pod does not hold.
BIND_RECORDS = (NODE, GPUS, MIG, POLICY)
INVENTORY = PREFIX + "inventory"  # node annotation written by the node agent
# Node label/annotation: "true" opts in to MIG re-partitioning (effective only while the
# MIG actuator is on); "false" or absent: the layout is what the node reports.
MIG_RECONFIGURE = PREFIX + "mig-reconfigure"
# Node label: the NVIDIA device plugin's --shared-devices-allocation-policy on this node
# (distributed, the plugin's default, | packed | spread): which GPU a share lands on.
SHARE_ALLOCATION_POLICY = PREFIX + "shared-allocation-policy"

# LeaderWorkerSet (kubernetes-sigs/lws).
LWS = "leaderworkerset.sigs.k8s.io/"
LWS_NAME = LWS + "name"
LWS_GROUP_INDEX = LWS + "group-index"
LWS_WORKER_INDEX = LWS + "worker-index"
LWS_GROUP_KEY = LWS + "group-key"
LWS_SIZE = LWS + "size"
LWS_EXCLUSIVE = LWS + "exclusive-topology"
LWS_SUBGROUP_SIZE = LWS + "subgroup-size"

# NVIDIA GPU Feature Discovery / device plugin.
NV = "nvidia.com/"
GPU_RESOURCE = NV + "gpu"
SHARED_RESOURCE = NV + "gpu.shared"
MIG_RESOURCE_PREFIX = NV + "mig-"
PRODUCT = NV + "gpu.product"
GPU_MEMORY_LABEL = NV + "gpu.memory"
GPU_COUNT = NV + "gpu.count"
GPU_REPLICAS = NV + "gpu.replicas"
SHARING_STRATEGY = NV + "gpu.sharing-strategy"
CLIQUE = CLIQUE_LABEL  # packing.groups.placement keeps groups inside one clique
KEEP_WHOLE_NODES = KEEP_WHOLE_NODES_LABEL  # whole nodes kept for groups to come
ZONE = "topology.kubernetes.io/zone"


class AnnotationError(ValueError):
    """An annotation gpupack cannot use; ``key`` names it, the message says why (with the
    value as written)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def gpu_memory_mib(ann: Mapping[str, str]) -> int | None:
    """``gpupack.io/gpu-memory`` in MiB, None when absent. The one rule: a quantity of
    more than zero ("8Gi", "8192Mi", "1e9"); anything else (not a quantity, zero or
    negative, out of range) raises :class:`AnnotationError`. Zero is refused: a pod that
    declares no GPU memory would be sized (and booked) as taking none, and a negative
    figure would free memory other pods hold."""
    raw = ann.get(GPU_MEMORY)
    if raw is None:
        return None
    try:
        mib = memory_mib(raw)
    except QuantityError as e:
        raise AnnotationError(GPU_MEMORY, str(e)) from None
    if mib <= 0:
        raise AnnotationError(GPU_MEMORY, f"{raw!r} must be more than zero")
    return mib


def gpu_compute_milli(ann: Mapping[str, str]) -> int | None:
    """``gpupack.io/gpu-compute`` in thousandths of a GPU (rounded up), None when absent.
    The one rule: a fraction in (0, 1]; anything else raises :class:`AnnotationError`."""
    raw = ann.get(GPU_COMPUTE)
    if raw is None:
        return None
    try:
        frac = parse_quantity(raw)
    except QuantityError as e:
        raise AnnotationError(GPU_COMPUTE, str(e)) from None
    if not 0 < frac <= 1:
        raise AnnotationError(GPU_COMPUTE, f"{raw!r} must be a fraction in (0, 1]")
    return int((frac * GPU_MILLI).to_integral_value(rounding="ROUND_CEILING"))


def placement_annotations(p: Placement, policy: str) -> dict[str, str]:
    """What bind records on the pod, so a restart can rebuild exact GPU ownership."""
    out = {NODE: p.node, POLICY: policy, GPUS: ",".join(str(i) for i in p.gpus)}
    if p.mig_profile is not None:
        out[MIG] = f"{p.mig_profile}@{p.mig_start}"
    return out


def parse_gpus(text: str) -> tuple[int, ...]:
    """ "0,1" -> (0, 1); ValueError naming the text."""
    text = text.strip()
    if not text:
        return ()
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{GPUS}={text!r}: expected GPU indices like '0,1'") from None
    if any(i < 0 for i in out):
        raise ValueError(f"{GPUS}={text!r}: negative GPU index")
    return out


def small_int(text: object) -> int | None:
    """A non-negative integer written as 1-9 ASCII digits, else None.

    ``str.isdigit`` alone is not enough: it accepts "²" and other Unicode digits that
    ``int`` refuses, and ``int`` refuses more than 4,300 digits."""
    if not isinstance(text, str) or not 0 < len(text) <= 9:
        return None
    if not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def parse_mig(text: str) -> tuple[str, int]:
    """ "1g.10gb@4" -> ("1g.10gb", 4); ValueError naming the text."""
    profile, sep, start = text.strip().partition("@")
    index = small_int(start)
    if not sep or not profile or index is None:
        raise ValueError(f"{MIG}={text[:60]!r}: expected profile@start like '1g.10gb@4'")
    return profile, index
