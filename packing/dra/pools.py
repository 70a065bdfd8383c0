"""Which pools and devices a node can reach, in the order the allocator tries them: a model
of ``GatherPools`` of kube-scheduler v1.37.2's allocator (``incubating`` variant) and of
the DeviceTaintRules its ResourceSlice tracker applies.

* The slices considered are those with ``nodeName`` equal to the node's, and those with no
  ``nodeName`` (``allNodes``, ``nodeSelector``, ``perDeviceNodeSelection``). A slice with
  ``nodeName``/``allNodes``/``nodeSelector`` counts when that selection matches the node;
  a ``perDeviceNodeSelection`` slice when any of its devices' selection does; a slice with
  none of them is ignored (a future extension). A slice whose devices use counter
  compatibility groups is ignored (the gate is alpha and off), which leaves its pool
  incomplete.
* Within a pool only the newest generation counts. A pool is complete when it has
  ``resourceSliceCount`` slices of that generation (counting, when the node sees fewer,
  the pool's slices for other nodes); an incomplete pool offers no device (and makes a
  request for ``All`` devices an error); a newer generation seen only on other nodes makes
  the pool obsolete: it is skipped.
* A pool is invalid (no device offered) when two of the slices the node sees name the
  same device, two counter sets share a name, or a device consumes a counter set or
  counter that does not exist.
* Order: pools by driver name, then pool name; pools with a device that has binding
  conditions after all others; within a pool, slices by name (the counter-only slices
  aside); within a slice, devices in the order the slice lists them. First fit follows
  this order.
* A DeviceTaintRule adds its taint to every device its selector names (driver, pool,
  device; unset parts match all). The rules are applied before allocation, as the
  scheduler's slice tracker does with DRADeviceTaintRules on (GA in 1.37).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal

from packing.dra.objects import (
    CounterSet,
    Device,
    DeviceTaintRule,
    Node,
    ResourceSlice,
    frozen_map,
)


@dataclass(frozen=True, slots=True)
class Pool:
    """One pool as the allocator sees it from a node.

    ``slices``: the pool's device slices that target the node, sorted by name;
    ``other_slices``: its device slices for other nodes (their allocated devices still
    consume the pool's counters); ``counter_sets`` by name.
    """

    driver: str
    name: str
    incomplete: bool = False
    invalid: str = ""
    slices: tuple[ResourceSlice, ...] = ()
    other_slices: tuple[ResourceSlice, ...] = ()
    counter_sets: Mapping[str, CounterSet] = field(default_factory=lambda: frozen_map({}))

    @property
    def usable(self) -> bool:
        return not self.incomplete and not self.invalid

    def devices(self) -> Iterable[tuple[ResourceSlice, Device]]:
        """The devices of the slices targeting the node, in allocation order."""
        for s in self.slices:
            for d in s.devices:
                yield s, d


def apply_taint_rules(slices: Sequence[ResourceSlice], rules: Sequence[DeviceTaintRule]
                      ) -> list[ResourceSlice]:
    """The slices with every DeviceTaintRule's taint added to the devices it selects."""
    if not rules:
        return list(slices)
    out = []
    for s in slices:
        devices = []
        changed = False
        for d in s.devices:
            extra = tuple(r.taint for r in rules if r.selects(s.driver, s.pool, d.name))
            if extra:
                changed = True
                d = replace(d, taints=d.taints + extra)
            devices.append(d)
        out.append(replace(s, devices=tuple(devices)) if changed else s)
    return out


def node_matches(node: Node, s: ResourceSlice | Device) -> bool:
    """``NodeMatches``: ``nodeName`` equal, ``allNodes``, or the node selector matching."""
    if s.node_name:
        return s.node_name == node.name
    if s.all_nodes:
        return True
    if s.node_selector is not None:
        return s.node_selector.matches(node)
    return False


def _uses_compatibility_groups(s: ResourceSlice) -> bool:
    return any(c.uses_compatibility_groups for d in s.devices for c in d.consumes_counters)


def _relevant(node: Node, s: ResourceSlice) -> bool:
    if s.node_name or s.all_nodes or s.node_selector is not None:
        return node_matches(node, s)
    if s.per_device_node_selection:
        return any(node_matches(node, d) for d in s.devices)
    return False


def gather_pools(node: Node, slices: Sequence[ResourceSlice]) -> list[Pool]:
    """The pools ``node`` can allocate from, in the allocator's order.

    ``slices``: every ResourceSlice of the cluster (DeviceTaintRules already applied):
    completeness is judged across all nodes' slices of a pool.
    """
    by_pool: dict[tuple[str, str], list[ResourceSlice]] = {}
    for s in slices:
        if s.node_name and s.node_name != node.name:
            continue
        if _uses_compatibility_groups(s) or not _relevant(node, s):
            continue
        key = (s.driver, s.pool)
        have = by_pool.get(key)
        if have is None or s.generation > have[0].generation:
            by_pool[key] = [s]
        elif s.generation == have[0].generation:
            have.append(s)
    plain: list[Pool] = []
    binding: list[Pool] = []
    for (driver, pool_name), mine in by_pool.items():
        generation, count = mine[0].generation, mine[0].resource_slice_count
        everyone: list[ResourceSlice] | None = None
        if len(mine) != count:
            same = [s for s in slices if (s.driver, s.pool) == (driver, pool_name)]
            if any(s.generation > generation for s in same):
                continue  # obsolete: the driver is publishing a newer generation
            everyone = [s for s in same if s.generation == generation
                        and not _uses_compatibility_groups(s)]
            if len(everyone) != count:
                plain.append(Pool(driver, pool_name, incomplete=True))
                continue
        pool = _build_pool(driver, pool_name, mine, everyone)
        has_binding = any(d.binding_conditions for _s, d in pool.devices())
        (binding if has_binding else plain).append(pool)
    plain.sort(key=lambda p: (p.driver, p.name))
    binding.sort(key=lambda p: (p.driver, p.name))
    return plain + binding


def _build_pool(driver: str, name: str, mine: list[ResourceSlice],
                everyone: list[ResourceSlice] | None) -> Pool:
    mine = sorted(mine, key=lambda s: s.name)
    device_slices = [s for s in mine if not s.shared_counters]
    counter_slices = [s for s in mine if s.shared_counters]
    others: list[ResourceSlice] = []
    if everyone is not None and len(mine) < len(everyone):
        seen = {s.name for s in mine}
        for s in everyone:
            if s.name in seen:
                continue
            (counter_slices if s.shared_counters else others).append(s)
    names: set[str] = set()
    for s in device_slices:
        for d in s.devices:
            if d.name in names:
                return Pool(driver, name, invalid=f"duplicate device name {d.name}")
            names.add(d.name)
    sets: dict[str, CounterSet] = {}
    for s in counter_slices:
        for c in s.shared_counters:
            if c.name in sets:
                return Pool(driver, name, invalid=f"duplicate counter set name {c.name}")
            sets[c.name] = c
    for group in (device_slices, others):
        for s in group:
            for d in s.devices:
                for use in d.consumes_counters:
                    cs = sets.get(use.counter_set)
                    if cs is None:
                        return Pool(driver, name,
                                    invalid=f"counter set {use.counter_set} not found")
                    for counter in use.counters:
                        if counter not in cs.counters:
                            return Pool(driver, name, invalid=f"counter {counter} not found "
                                                              f"in counter set {cs.name}")
    return Pool(driver, name, slices=tuple(device_slices), other_slices=tuple(others),
                counter_sets=frozen_map(sets))


def available_counters(pool: Pool, allocated: set[str] | frozenset[str]
                       ) -> dict[str, dict[str, Decimal]]:
    """The pool's counters less what its allocated devices (ids ``driver/pool/device``)
    consume, across every slice of the pool (a value may go negative: then nothing that
    consumes counters fits in the pool)."""
    left = {n: dict(cs.counters) for n, cs in pool.counter_sets.items()}
    for s in (*pool.slices, *pool.other_slices):
        for d in s.devices:
            if f"{s.driver}/{s.pool}/{d.name}" not in allocated:
                continue
            for use in d.consumes_counters:
                counters = left.get(use.counter_set, {})
                for c, v in use.counters.items():
                    if c in counters:
                        counters[c] -= v
    return left
