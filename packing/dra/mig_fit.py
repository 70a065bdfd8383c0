"""How good the DRA allocator's fit on a node is for MIG density, where the NVIDIA driver
runs DynamicMIG: the key that ranks the nodes gpupack may hand kube-scheduler.

On a DRA node the extender chooses the node and the allocator the device: its first fit,
the first GPU in the driver's order with room, at the profile's lowest free start
(``docs/dra.md``). So the extender's only lever on where an instance lands is which
node's first fit it accepts, and the key below ranks those fits. For a fit whose last
device is a MIG instance on a partitionable GPU (lower first):

1. **breaks a whole node**: every GPU of the node was idle and usable whole (kept for
   LLM groups, as the scorer keeps them);
2. **opens a GPU**: 0 on a GPU that holds an instance already, 1 on an idle GPU, 2 on an
   idle GPU whose MIG mode the instance turns on for good (an Ampere part: its MIG mode
   changes only with a reset, so under DynamicMIG it never goes back to a whole GPU);
3. **compute lost**, 4. **free compute after**, 5.-6. **largest run kept**: the
   placement's own key (:func:`packing.mig.dynamic.placement_key`): what it takes out
   of the GPU's reach, then best fit by GPU (the fullest GPUs fill first, the emptiest
   empty as their pods end), then the largest profile and the free starts left.

Why not the scorer's MIG preference alone: it ranks created instances by the largest
profile still placeable after them, which under DynamicMIG (every instance is created)
prefers the emptiest GPU in use, the reverse of best fit; and it has no notion of the
compute a placement strands. ``bench/mig.py --protocol dra-dynamic`` measures both.

Any other fit (a whole GPU, a share, a static MIG instance, no use at all) gets the
neutral key (zeros), and the scorer's preference decides among those.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from packing.catalog import get_model
from packing.dra.inventory import DraInventory
from packing.dra.nvidia import MIG_MODE_NEEDS_RESET
from packing.mig.dynamic import placement_key
from packing.mig.layout import MigSlot
from packing.model import GpuMode, Placement, PodRequest, RequestKind
from packing.state import ClusterState

FitKey = tuple[int, int, int, int, int, int]
NEUTRAL: FitKey = (0, 0, 0, 0, 0, 0)


def dynamic_mig_key(state: ClusterState, inventory: DraInventory | None,
                    uses: Sequence[tuple[PodRequest, Placement]]) -> FitKey:
    """The key of a predicted fit (its uses as :func:`packing.dra.inventory.claim_uses`
    gives them, the pod's own not applied to ``state``), see the module docstring; the
    uses before the last are counted on the GPU as if applied."""
    if inventory is None or not uses:
        return NEUTRAL
    req, p = uses[-1]
    if (req.kind is not RequestKind.MIG or p.mig_profile is None or p.mig_start is None
            or not p.gpus or p.gpus[0] not in inventory.partitionable):
        return NEUTRAL
    node = state.nodes.get(p.node)
    if node is None:
        return NEUTRAL
    g = next((x for x in node.gpus if x.info.index == p.gpus[0]), None)
    geom = get_model(g.info.model).mig if g is not None else None
    if g is None or geom is None:
        return NEUTRAL
    held = {s: prof for s, (prof, owner) in g.instances.items() if owner is not None}
    for r, q in uses[:-1]:  # the pod's other instances on the same GPU
        if (r.kind is RequestKind.MIG and q.gpus == p.gpus and q.mig_profile is not None
                and q.mig_start is not None):
            held[q.mig_start] = q.mig_profile
    slots = [MigSlot(prof, s) for s, prof in held.items()]
    if held or g.whole_owner is not None or g.shared_owners:
        opens = 0
    elif g.mode is GpuMode.WHOLE and g.info.model in MIG_MODE_NEEDS_RESET:
        opens = 2
    else:
        opens = 1
    lost, free_after, largest, starts = placement_key(geom, slots, p.mig_profile, p.mig_start)
    return (1 if node.whole_free else 0, opens, lost, free_after, largest, starts)


__all__ = ["NEUTRAL", "FitKey", "dynamic_mig_key"]
