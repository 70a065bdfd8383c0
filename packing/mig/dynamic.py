"""MIG placements one instance at a time (the NVIDIA DRA driver's DynamicMIG): which
placement of a profile keeps the GPU able to use all its compute, and how good a
placement is for density.

Under DynamicMIG an instance is created at its placement when a claim is prepared and
destroyed when released, beside the GPU's other instances; any layout is reachable one
instance at a time. So the question is no longer which layout a GPU gets, but where the
next instance goes, and that choice can cost the GPU compute for as long as the
instance lives:

* **Reachable compute** (:func:`reachable_compute`): the most compute slices a GPU's
  instances can add up to once more instances are created in its free memory slices
  (any profiles at their allowed starts, the layout rules kept). A full-compute GPU
  (7 of 7) is what the slice bound counts, so a placement that lowers it wastes compute
  while it lives. On the 7-compute / 8-memory-slice parts (A100, H100, H200, B200) a
  ``3g`` at memory slice 0 leaves slices 4-7 for at most 3 compute (a ``3g`` at 4, or
  ``1g`` at 4, 5 and 6: slice 7 serves only a ``3g`` or ``1g.2xgb`` starting at 4 or 6),
  so the GPU reaches 6; a ``3g`` at 4 leaves 0-3 for 4 compute and reaches 7.
* **Dominated placements** (:func:`dominated_starts`): a start of a profile at which an
  otherwise empty GPU reaches less compute than at another start of the same profile.
  On the 7/8-slice parts: ``3g`` at 0, and the double-memory ``1g`` (``1g.20gb`` on an
  H100-80GB) at 0, 2 and 4, which takes two memory slices for one compute slice where
  only at 6 does the second one cover slice 7, that nothing smaller can use; the A30's
  4-slice geometry has none. Keeping the allocator off them (a device taint) loses
  nothing a pod needs: another start of the same profile exists.
* **The placement key** (:func:`placement_key`): how a created instance at a given start
  on a given GPU ranks for density, lower first: the compute it takes out of reach, then
  the GPU's free compute after it (best fit by GPU: the fullest GPUs fill first, so the
  emptiest ones empty as their pods end), then the largest profile still placeable and
  the number of free starts after it (the largest free run kept, as users ask of the
  driver).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from packing.catalog import MigGeometry
from packing.mig.layout import MigSlot, SlotLike, free_starts, layout_errors, used_slices

PlacementKey = tuple[int, int, int, int]


def _slots(slots: Iterable[SlotLike]) -> tuple[MigSlot, ...]:
    return tuple(sorted(MigSlot(s.profile, s.start) for s in slots))


def reachable_compute(geometry: MigGeometry, slots: Iterable[SlotLike]) -> int:
    """The most compute slices the GPU's instances ``slots`` can add up to once more
    instances are created in its free memory slices (0 for an invalid layout)."""
    return _reachable(geometry, _slots(slots))


@lru_cache(maxsize=65_536)
def _reachable(geometry: MigGeometry, slots: tuple[MigSlot, ...]) -> int:
    """Depth first over the instances that may be added, the answer cached per layout
    (sorted, so every order of adding the same instances meets the same entry): a GPU
    has at most 8 memory slices, so a geometry has a few hundred layouts in all."""
    placed = list(slots)
    if layout_errors(geometry, placed):
        return 0
    compute, _ = used_slices(geometry, placed)
    best = compute
    for p in geometry.profiles:
        if best == geometry.compute_slices:
            break
        if p.media_extensions:
            continue  # the same slices as its plain profile, and one per GPU
        for start in free_starts(geometry, placed, p.name):
            best = max(best, _reachable(geometry, _slots([*placed, MigSlot(p.name, start)])))
    return best


def dominated_starts(geometry: MigGeometry, profile: str) -> tuple[int, ...]:
    """Starts of ``profile`` at which an empty GPU reaches less compute than at another
    start of the same profile (see the module docstring)."""
    return _dominated(geometry, profile)


@lru_cache(maxsize=256)
def _dominated(geometry: MigGeometry, profile: str) -> tuple[int, ...]:
    p = geometry.profile(profile)
    reach = {s: reachable_compute(geometry, [MigSlot(profile, s)]) for s in p.starts}
    top = max(reach.values(), default=0)
    return tuple(s for s in p.starts if reach[s] < top)


def largest_run(geometry: MigGeometry, slots: Iterable[SlotLike]) -> tuple[int, int]:
    """(memory slices of the largest profile still placeable, free starts over all
    profiles) of a layout: how much room stays in one piece."""
    placed = list(slots)
    largest = starts = 0
    for p in geometry.profiles:
        if p.media_extensions:
            continue
        n = len(free_starts(geometry, placed, p.name))
        starts += n
        if n:
            largest = max(largest, p.memory_slices)
    return largest, starts


def placement_key(geometry: MigGeometry, slots: Iterable[SlotLike], profile: str,
                  start: int) -> PlacementKey:
    """How a new ``profile`` instance at ``start`` beside the instances ``slots`` ranks
    for density, lower first: (compute taken out of reach, free compute slices after,
    minus the largest profile still placeable after, minus the free starts after).

    The first term is ``reachable_compute(before) - reachable_compute(after)``: what
    this placement itself costs the GPU (a GPU that lost compute to an earlier one is
    not held against the next). The second is best fit by GPU."""
    before = list(slots)
    after = [*before, MigSlot(profile, start)]
    lost = reachable_compute(geometry, before) - reachable_compute(geometry, after)
    used, _ = used_slices(geometry, after)
    largest, starts = largest_run(geometry, after)
    return (lost, geometry.compute_slices - used, -largest, -starts)


__all__ = ["PlacementKey", "dominated_starts", "largest_run", "placement_key",
           "reachable_compute"]
