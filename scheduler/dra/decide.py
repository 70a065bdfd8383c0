"""Where a pod's ResourceClaims go, as pure functions: on each candidate node, the devices
kube-scheduler's allocator will pick (:meth:`packing.dra.world.DraWorld.predict`, its
first fit), seen as the packer's model sees GPUs (:func:`packing.dra.inventory.claim_uses`)
and judged by gpupack's own placement score.

The allocator does not score devices and the extender cannot choose them: it chooses the
node, and on a node the device is the allocator's first fit. So a node's worth for the
pod is the score of *that* fit, not of the best device gpupack would have picked there;
a node whose first fit lands on an idle GPU (or a whole idle node) while another node's
fills a GPU already in use scores worse, exactly as the device-plugin path scores its
options (MIG partitions packed so GPUs and whole nodes stay free; whole GPUs kept for
groups by the scorer's whole-node term).

Verdicts of the prediction, per node:

* ``allocated``: the node fits unless the predicted devices take a GPU a group's
  reservation keeps (:func:`kept_conflict`): such a node is never offered, since the
  allocator would break the room gpupack keeps there.
* ``unschedulable`` or ``error``: the node is not offered (the allocator would refuse
  the pod there, or fail its scheduling attempt).
* ``unknown`` (CEL outside the model's subset, a search past its step bound): the node is
  **offered, scored lowest**. Conservative for the pod: the allocator stays the authority
  on fit (kube-scheduler's own Filter already ran it), and refusing on a prediction the
  model cannot make would strand pods whose selectors use CEL the model does not read;
  scoring such nodes last keeps every node gpupack can judge ahead of them.

The score: where the fit creates a DynamicMIG instance, its density key first
(:func:`packing.dra.mig_fit.dynamic_mig_key`: best fit by GPU and no compute stranded,
which the scorer's MIG preference does not see, since under DynamicMIG every instance is
created); then the scorer's key of the fit's last device with the others applied first
(one claim is one device in the common case: a MIG partition, a share, or k whole GPUs
counted as one request), cut to its preference (:func:`scheduler.memo.decide.preference`).

Nothing here does I/O or takes locks: the participant (:mod:`scheduler.dra.plugin`) holds
the cache lock around each call and restores the state it tries on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packing.dra.allocator import Prediction, Verdict
from packing.dra.inventory import DraInventory, claim_uses
from packing.dra.mig_fit import dynamic_mig_key
from packing.dra.objects import Node, ResourceClaim, frozen_map
from packing.dra.world import DraWorld
from packing.groups.members import is_reservation
from packing.model import Placement, PodRequest
from packing.scoring import Score, Scorer
from packing.state import ClusterState
from scheduler.memo.decide import preference

Uses = list[tuple[PodRequest, Placement]]


@dataclass(frozen=True)
class NodeAnswer:
    """One node's answer for a pod's claims: whether it is offered (``fits``), why not
    (``reason``; ``unresolvable`` when no eviction could help), the preference of the
    predicted fit (lower is better; None: nothing of the model's GPUs is allocated, or
    ``unknown``), and the prediction with the claim keys it is for."""

    fits: bool
    reason: str = ""
    unresolvable: bool = False
    pref: Score | None = None
    unknown: bool = False
    prediction: Prediction | None = None
    keys: tuple[str, ...] = ()


def uses_of(inventory: DraInventory | None, keys: Sequence[str], prediction: Prediction,
            pod: PodRequest) -> Uses:
    """The predicted devices as the model's (request, placement) pairs, the pod's CPU
    and memory on the first."""
    if inventory is None or prediction.verdict is not Verdict.ALLOCATED:
        return []
    out: Uses = []
    for key, results in zip(keys, prediction.results, strict=True):
        out.extend(claim_uses(inventory, key, results))
    if out:
        req, p = out[0]
        out[0] = (PodRequest(req.key, cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib,
                             kind=req.kind, gpu_count=req.gpu_count,
                             mig_profile=req.mig_profile, gpu_milli=req.gpu_milli,
                             gpu_memory_mib=req.gpu_memory_mib), p)
    return out


def kept_conflict(state: ClusterState, uses: Uses) -> str | None:
    """Why the fit breaks room gpupack keeps (a GPU a group's reservation holds), or
    None."""
    for _req, p in uses:
        node = state.nodes.get(p.node)
        if node is None:
            continue
        for g in node.gpus:
            if g.info.index not in p.gpus:
                continue
            owners = {g.whole_owner, *(o for _, o in g.instances.values()),
                      *g.shared_owners}
            kept = sorted(o for o in owners if o is not None and is_reservation(o))
            if kept:
                return (f"the allocator's first fit takes GPU {g.info.index}, which "
                        f"gpupack keeps for {kept[0].split('#')[0]}")
    return None


def score_uses(state: ClusterState, uses: Uses, scorer: Scorer) -> Score | None:
    """The scorer's preference for the fit: its last pair scored with the others applied
    (undone after, so the state is as it was)."""
    if not uses:
        return None
    applied: Uses = []
    try:
        for req, p in uses[:-1]:
            state.apply(req, p, allow_overcommit=True)
            applied.append((req, p))
        req, p = uses[-1]
        return preference(scorer(state, req, p))
    finally:
        for req, p in reversed(applied):
            state.undo(req, p)


def evaluate(state: ClusterState, world: DraWorld, node: str, labels: Mapping[str, str],
             inventory: DraInventory | None, claims: Sequence[tuple[str, ResourceClaim]],
             misfit: str, pod: PodRequest, scorer: Scorer) -> NodeAnswer:
    """The node's answer for the pod whose claims to allocate there are ``claims``
    (``misfit``: an extended resource the node neither serves by DRA nor has)."""
    if misfit:
        return NodeAnswer(False, f"node neither serves {misfit} through DRA nor advertises "
                                 "it", unresolvable=True)
    if not claims:
        return NodeAnswer(True)
    keys = tuple(k for k, _ in claims)
    pred = world.predict(Node(node, frozen_map(labels)), [c for _, c in claims])
    if pred.verdict is Verdict.UNKNOWN:
        return NodeAnswer(True, f"allocation not predicted: {pred.reason}", unknown=True,
                          prediction=pred, keys=keys)
    if pred.verdict is Verdict.UNSCHEDULABLE:
        return NodeAnswer(False, f"the allocator finds no devices here: {pred.reason}",
                          prediction=pred, keys=keys)
    if pred.verdict is Verdict.ERROR:
        return NodeAnswer(False, f"the allocator would fail the pod here: {pred.reason}",
                          unresolvable=True, prediction=pred, keys=keys)
    uses = uses_of(inventory, keys, pred, pod)
    why = kept_conflict(state, uses)
    if why is not None:
        return NodeAnswer(False, why, prediction=pred, keys=keys)
    return NodeAnswer(True, pref=fit_preference(state, inventory, uses, scorer),
                      prediction=pred, keys=keys)


def fit_preference(state: ClusterState, inventory: DraInventory | None, uses: Uses,
                   scorer: Scorer) -> Score | None:
    """The fit's preference: under DynamicMIG its instance's density key first
    (:func:`packing.dra.mig_fit.dynamic_mig_key`: whole node, opening a GPU, compute
    stranded, best fit by GPU, largest run kept; neutral for any other fit), then the
    scorer's (:func:`score_uses`)."""
    pref = score_uses(state, uses, scorer)
    if pref is None:
        return None
    return (*dynamic_mig_key(state, inventory, uses), *pref)

