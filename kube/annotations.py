"""Names of the labels and annotations gpupack reads and writes, and their codecs."""

from __future__ import annotations

from packing.groups.members import CLIQUE_LABEL, KEEP_WHOLE_NODES_LABEL
from packing.model import Placement

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
