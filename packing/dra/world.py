"""The DRA objects of a cluster, read once, ready for predictions: what a cache hands the
allocator model.

:func:`world_from_api` takes the API's JSON lists (ResourceSlices, DeviceClasses,
ResourceClaims, DeviceTaintRules) and returns a :class:`DraWorld` plus the objects it
could not read, each as a :class:`~packing.dra.parse.DraParseError` naming the field: a
bad object is left out and reported, the rest still serves (a pool missing a slice then
reads as incomplete, and offers nothing: the conservative answer). ``in_flight`` are
allocations the scheduler holds but has not written yet (its Reserve), counted as used.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packing.dra.allocator import (
    DEFAULT_MAX_STEPS,
    AllocatedState,
    Prediction,
    allocated_state,
    predict,
)
from packing.dra.objects import DeviceClass, Node, ResourceClaim, ResourceSlice
from packing.dra.parse import (
    DraParseError,
    parse_device_class,
    parse_device_taint_rule,
    parse_resource_claim,
    parse_resource_slice,
)
from packing.dra.pools import apply_taint_rules


@dataclass(frozen=True, slots=True)
class DraWorld:
    """Slices (DeviceTaintRules applied), classes by name, and what allocated claims
    hold."""

    slices: tuple[ResourceSlice, ...]
    classes: Mapping[str, DeviceClass]
    allocated: AllocatedState
    claims: Mapping[str, ResourceClaim]  # by namespace/name

    def predict(self, node: Node, claims: Sequence[ResourceClaim], *,
                max_steps: int = DEFAULT_MAX_STEPS) -> Prediction:
        """What kube-scheduler allocates to ``claims`` (a pod's unallocated claims, in its
        order, the extended-resource claim last) on ``node``."""
        return predict(node, self.slices, self.classes, self.allocated, claims,
                       max_steps=max_steps)

    def node_slices(self, node: str) -> tuple[ResourceSlice, ...]:
        """The slices published for ``node`` by name (``nodeName``)."""
        return tuple(s for s in self.slices if s.node_name == node)


def world_from_api(slices: Iterable[Mapping[str, Any]], classes: Iterable[Mapping[str, Any]],
                   claims: Iterable[Mapping[str, Any]],
                   rules: Iterable[Mapping[str, Any]] = (),
                   in_flight: Iterable[ResourceClaim] = ()
                   ) -> tuple[DraWorld, list[DraParseError]]:
    """The world the API's objects describe, and the errors of those it could not read."""
    errors: list[DraParseError] = []

    def read(items: Iterable[Mapping[str, Any]], parse: Any) -> list[Any]:
        out = []
        for obj in items:
            try:
                out.append(parse(obj))
            except DraParseError as e:
                errors.append(e)
        return out

    parsed_rules = read(rules, parse_device_taint_rule)
    parsed_slices = apply_taint_rules(read(slices, parse_resource_slice), parsed_rules)
    parsed_classes = read(classes, parse_device_class)
    parsed_claims = read(claims, parse_resource_claim)
    world = DraWorld(
        slices=tuple(parsed_slices),
        classes={c.name: c for c in parsed_classes},
        allocated=allocated_state([*parsed_claims, *in_flight]),
        claims={c.key: c for c in parsed_claims})
    return world, errors
