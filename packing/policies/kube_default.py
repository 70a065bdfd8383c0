"""Plain kube-scheduler: its default score plugins and the kubelet's device choice.

A model of where a cluster without gpupack puts a pod, written from kube-scheduler
v1.37's default profile (``pkg/scheduler/apis/config/v1/default_plugins.go`` and the
plugins under ``framework/plugins``) and the NVIDIA device plugin
(:mod:`packing.device_plugin`). The day replay (:mod:`packing.day`) places plain
kube-scheduler's pods with it, and gpupack's pods with the same plugins plus the
extender's priority (gpupack's profile keeps the default plugins and adds the extender
at weight 5: ``manifests/base/scheduler-config.yaml``).

**Filter** (NodeResourcesFit, NodeAffinity, NodeUnschedulable): the node is not
cordoned, its labels match the pod's node selector and its GPU model is one the pod is
pinned to (if any), the pod's CPU and memory fit, and
the node has the pod's device resource free *by count*: ``n`` idle whole GPUs
(``nvidia.com/gpu``), a free instance of the pod's MIG profile
(``nvidia.com/mig-<profile>``; kube-scheduler cannot create one), or a free replica of a
time-sliced GPU (``nvidia.com/gpu.shared``). Neither kube-scheduler nor the device plugin
knows a share's GPU memory: a share goes to a node with a free replica whatever is left
of the memory of the GPU the plugin will pick (:func:`device_choice` may over-commit it,
which the replay counts with :func:`packing.validate.validate`).

**Score**, per feasible node, the weighted sum of the default score plugins that tell
nodes apart here (integer arithmetic as in Go):

* NodeResourcesFit, ``LeastAllocated`` over CPU and memory (weight 1 each; extended
  resources are not scored by default): for each resource
  ``(allocatable - requested) * 100 // allocatable`` with ``requested`` the node's pods
  plus this one, averaged;
* NodeResourcesBalancedAllocation (weight 1), v1.37's form, which scores the change of
  balance: with ``f_cpu``, ``f_mem`` the requested fractions (capped at 1),
  ``bal = int((1 - |f_cpu - f_mem| / 2) * 100)`` and score
  ``50 + (50 + bal_with_pod - bal_without_pod) // 2``;
* PodTopologySpread (weight 2) with the system default constraints, which apply to a
  pod that a ReplicaSet, StatefulSet or Service selects (every workload pod here): on
  ``kubernetes.io/hostname`` (maxSkew 3) the raw score is
  ``round(cnt * ln(N + 2) + 2)`` with ``cnt`` the pods of the same workload on the
  node and ``N`` the feasible nodes, normalised to ``100 * (max + min - s) // max``
  (100 everywhere when max is 0); the zone constraint (maxSkew 5) scores nothing on
  nodes without a zone label, and is constant where every node has the same zone.

TaintToleration, NodeAffinity and InterPodAffinity score every node alike (no
PreferNoSchedule taints, preferred affinities or pod affinities here), and so does
ImageLocality when the images are on every node (the replay assumes them pre-pulled);
they are left out. Among the nodes with the highest total, ``selectHost`` picks one
uniformly at random (seeded here, so a replay repeats).

**Device choice** (the kubelet's device manager with the NVIDIA device plugin): whole
GPUs: the lowest-indexed idle ones (the plugin's NVLink-aligned choice; every set ties
on an NVSwitch node); a MIG instance: any free instance of the resource on the node,
uniformly at random (the plugin does not prefer among MIG devices, and the kubelet takes
them in Go map order); a share: the replica the plugin's ``distributed`` policy hands out
(:func:`packing.state.plugin_pick`; on a tie, which Go map order breaks arbitrarily, its
lowest index, the prediction gpupack's accounting makes too).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence

from packing.model import GpuMode, Placement, PodRequest, RequestKind
from packing.scoring import Score, rank_priorities, winner
from packing.state import ClusterState, NodeState, fits_node, plugin_pick

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
# Default profile weights (default_plugins.go).
WEIGHT_FIT = 1
WEIGHT_BALANCED = 1
WEIGHT_SPREAD = 2
SPREAD_MAX_SKEW = 3  # system default constraint on kubernetes.io/hostname

WorkloadOf = Callable[[str], str]  # pod key -> its workload ("" for none)


def free_replicas(node: NodeState) -> int:
    """Time-sliced replicas the device plugin advertises free on the node (by count)."""
    total = 0
    for g in node.gpus:
        if g.mode is not GpuMode.SHARED or g.whole_owner is not None:
            continue
        if g.info.replicas == 0:
            return 1 << 30
        total += max(0, g.info.replicas - len(g.shared_owners))
    return total


def kube_fits(state: ClusterState, pod: PodRequest, name: str) -> bool:
    """kube-scheduler's filter: node-level fit and the device resource free by count."""
    node = state.nodes[name]
    if fits_node(pod, node) is not None:
        return False
    if pod.gpu_models and not node.info.gpu_models & pod.gpu_models:
        return False  # NodeAffinity: the pod is pinned to other GPU products
    if pod.kind is RequestKind.SHARED:
        return free_replicas(node) > 0
    if pod.kind is RequestKind.MIG:
        return any(p == pod.mig_profile and o is None
                   for g in node.gpus if g.mode is GpuMode.MIG
                   for p, o in g.instances.values())
    if pod.kind is RequestKind.WHOLE:
        return sum(1 for g in node.gpus if g.whole_free) >= pod.gpu_count
    return True


def least_requested(requested: int, capacity: int) -> int:
    """leastRequestedScore of one resource: ``(capacity - requested) * 100 // capacity``,
    0 when over."""
    if capacity <= 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


def least_allocated(node: NodeState, pod: PodRequest) -> int:
    cpu_req = node.info.cpu_milli - node.cpu_free + pod.cpu_milli
    mem_req = node.info.memory_mib - node.mem_free + pod.memory_mib
    parts = [least_requested(r, c) for r, c in ((cpu_req, node.info.cpu_milli),
                                                   (mem_req, node.info.memory_mib)) if c > 0]
    return sum(parts) // len(parts) if parts else 0


def _balance(cpu_req: int, mem_req: int, node: NodeState) -> int:
    fractions = [min(r / c, 1.0) for r, c in ((cpu_req, node.info.cpu_milli),
                                               (mem_req, node.info.memory_mib)) if c > 0]
    std = abs(fractions[0] - fractions[1]) / 2 if len(fractions) == 2 else 0.0
    return int((1 - std) * MAX_NODE_SCORE)


def balanced_allocation(node: NodeState, pod: PodRequest) -> int:
    cpu_used = node.info.cpu_milli - node.cpu_free
    mem_used = node.info.memory_mib - node.mem_free
    with_pod = _balance(cpu_used + pod.cpu_milli, mem_used + pod.memory_mib, node)
    without = _balance(cpu_used, mem_used, node)
    return MAX_NODE_SCORE // 2 + (MAX_NODE_SCORE // 2 + with_pod - without) // 2


def spread_scores(state: ClusterState, workload: str, names: Sequence[str],
                  workload_of: WorkloadOf) -> dict[str, int]:
    """PodTopologySpread's normalised hostname scores over the feasible ``names``."""
    if not workload:
        return dict.fromkeys(names, 0)
    weight = math.log(len(names) + 2)
    raw = {}
    for n in names:
        cnt = sum(1 for k in state.nodes[n].pods if workload_of(k) == workload)
        # Go's math.Round: halves away from zero (Python's round would go to even).
        raw[n] = math.floor(cnt * weight + (SPREAD_MAX_SKEW - 1) + 0.5)
    top, low = max(raw.values()), min(raw.values())
    if top == 0:
        return dict.fromkeys(names, MAX_NODE_SCORE)
    return {n: MAX_NODE_SCORE * (top + low - s) // top for n, s in raw.items()}


def default_scores(state: ClusterState, pod: PodRequest, names: Sequence[str],
                   workload: str, workload_of: WorkloadOf) -> dict[str, int]:
    """The default profile's total score of each feasible node (see the docstring)."""
    spread = spread_scores(state, workload, names, workload_of)
    out = {}
    for n in names:
        node = state.nodes[n]
        out[n] = (WEIGHT_FIT * least_allocated(node, pod)
                  + WEIGHT_BALANCED * balanced_allocation(node, pod)
                  + WEIGHT_SPREAD * spread[n])
    return out


def select_host(scores: Mapping[str, int], rng: random.Random) -> str:
    """selectHost: uniformly at random among the highest-scored nodes."""
    top = max(scores.values())
    return rng.choice(sorted(n for n, s in scores.items() if s == top))


def device_choice(state: ClusterState, pod: PodRequest, name: str,
                  rng: random.Random) -> Placement | None:
    """The devices the kubelet gives ``pod`` on node ``name`` (see the docstring)."""
    node = state.nodes[name]
    if pod.kind is RequestKind.NONE:
        return Placement(pod.key, name)
    if pod.kind is RequestKind.WHOLE:
        idle = [g.info.index for g in node.gpus if g.whole_free]
        if len(idle) < pod.gpu_count:
            return None
        return Placement(pod.key, name, tuple(idle[: pod.gpu_count]))
    if pod.kind is RequestKind.MIG:
        free = [(g.info.index, start) for g in node.gpus if g.mode is GpuMode.MIG
                for start, (p, o) in sorted(g.instances.items())
                if p == pod.mig_profile and o is None]
        if not free:
            return None
        gpu, start = rng.choice(free)
        return Placement(pod.key, name, (gpu,), pod.mig_profile, start)
    pick = plugin_pick(node)
    if pick is None:
        return None
    # On a tie the plugin's choice is arbitrary (Go map order); the model's prediction,
    # the lowest index, is the one gpupack's accounting and the validator expect.
    return Placement(pod.key, name, (pick.first,))


def place_default(state: ClusterState, pod: PodRequest, workload: str,
                  workload_of: WorkloadOf, rng: random.Random) -> Placement | None:
    """Where plain kube-scheduler and the kubelet put ``pod`` now, or None (it waits)."""
    names = [n for n in state.nodes if kube_fits(state, pod, n)]
    if not names:
        return None
    host = select_host(default_scores(state, pod, names, workload, workload_of), rng)
    return device_choice(state, pod, host, rng)


def preference(key: Score) -> Score:
    """The part of a gpupack scorer key that expresses preference: up to the first
    name (what the extender ranks by; the names only break ties deterministically)."""
    for i, part in enumerate(key):
        if isinstance(part, str):
            return key[:i]
    return key


def extender_priorities(prefs: Mapping[str, Score], names: Sequence[str],
                        state: ClusterState, top: int = MAX_EXTENDER_PRIORITY
                        ) -> dict[str, int]:
    """The extender's prioritize answer (0..10) over ``names`` from gpupack's
    preference per node (lower is better; absent: the node does not fit), as
    ``scheduler/extender/verbs.py``'s prioritize answers without a planner node: both map
    by :func:`~packing.scoring.rank_priorities`, ``top`` for the policy's
    :func:`~packing.scoring.winner` (tests/scheduler/test_day_priorities.py checks the
    two agree)."""
    return rank_priorities(prefs, names, winner(prefs, state), top)
