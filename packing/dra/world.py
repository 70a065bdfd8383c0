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
from dataclasses import dataclass, field
from typing import Any

from packing.dra.allocator import (
    DEFAULT_MAX_STEPS,
    AllocatedState,
    Prediction,
    allocated_state,
    predict,
)
from packing.dra.objects import (
    DeviceClass,
    DeviceTaintRule,
    Node,
    ResourceClaim,
    ResourceSlice,
)
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
    hold.

    ``by_node``: for each node some slice names (``nodeName``), every slice of the pools
    those slices belong to; ``unbound``: every slice of the pools that have a slice not
    bound to one node (``allNodes``, ``nodeSelector``, per-device selection). The
    allocator only looks at a node's own slices, node-independent ones, and, to judge a
    pool complete, the other slices of those pools: so predicting from ``by_node[n] +
    unbound`` is predicting from every slice, at the cost of one node's slices (a
    2,000-node cluster has ~20,000).
    """

    slices: tuple[ResourceSlice, ...]
    classes: Mapping[str, DeviceClass]
    allocated: AllocatedState
    claims: Mapping[str, ResourceClaim]  # by namespace/name
    by_node: Mapping[str, tuple[ResourceSlice, ...]] = field(default_factory=dict)
    unbound: tuple[ResourceSlice, ...] = ()
    indexed: bool = False  # by_node and unbound were built (else every slice is used)

    def predict(self, node: Node, claims: Sequence[ResourceClaim], *,
                max_steps: int = DEFAULT_MAX_STEPS,
                allocated: AllocatedState | None = None) -> Prediction:
        """What kube-scheduler allocates to ``claims`` (a pod's unallocated claims, in its
        order, the extended-resource claim last) on ``node``. ``allocated``: another
        allocated state than the world's (the world's plus a trial's)."""
        return predict(node, self.relevant_slices(node.name), self.classes,
                       self.allocated if allocated is None else allocated, claims,
                       max_steps=max_steps)

    def relevant_slices(self, node: str) -> tuple[ResourceSlice, ...]:
        """Every slice the allocator may read for ``node`` (see the class docstring)."""
        if not self.indexed:
            return self.slices
        mine = self.by_node.get(node, ())
        if not self.unbound:
            return mine
        seen = {id(s) for s in mine}
        return (*mine, *(s for s in self.unbound if id(s) not in seen))

    def node_slices(self, node: str) -> tuple[ResourceSlice, ...]:
        """The slices published for ``node`` by name (``nodeName``)."""
        if self.indexed:
            return tuple(s for s in self.by_node.get(node, ()) if s.node_name == node)
        return tuple(s for s in self.slices if s.node_name == node)

    @property
    def nodes(self) -> frozenset[str]:
        """The nodes some slice names."""
        if self.indexed:
            return frozenset(self.by_node)
        return frozenset(s.node_name for s in self.slices if s.node_name)


def world_from_objects(slices: Iterable[ResourceSlice], classes: Iterable[DeviceClass],
                       claims: Iterable[ResourceClaim],
                       rules: Sequence[DeviceTaintRule] = (),
                       in_flight: Iterable[ResourceClaim] = ()) -> DraWorld:
    """The world of objects already read: slices (DeviceTaintRules ``rules`` applied
    here), classes, claims, and allocations in flight (counted as used)."""
    tainted = tuple(apply_taint_rules(list(slices), rules))
    claim_list = list(claims)
    pools: dict[tuple[str, str], list[ResourceSlice]] = {}
    for s in tainted:
        pools.setdefault((s.driver, s.pool), []).append(s)
    by_node: dict[str, list[ResourceSlice]] = {}
    unbound: list[ResourceSlice] = []
    for members in pools.values():
        names = {s.node_name for s in members}
        if None in names or any(not s.node_name for s in members):
            unbound.extend(members)
            names.discard(None)
        for n in names:
            if n:
                by_node.setdefault(n, []).extend(members)
    return DraWorld(
        slices=tainted,
        classes={c.name: c for c in classes},
        allocated=allocated_state([*claim_list, *in_flight]),
        claims={c.key: c for c in claim_list},
        by_node={n: tuple(v) for n, v in by_node.items()},
        unbound=tuple(unbound),
        indexed=True)


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
    parsed_slices = read(slices, parse_resource_slice)
    parsed_classes = read(classes, parse_device_class)
    parsed_claims = read(claims, parse_resource_claim)
    world = world_from_objects(parsed_slices, parsed_classes, parsed_claims, parsed_rules,
                               in_flight)
    return world, errors
