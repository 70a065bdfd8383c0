"""What a node's DRA devices offer a burst of identical one-device pods: the devices
kube-scheduler v1.37.2's allocator would give them, one pod after the other.

The claim kube-scheduler makes for a DRA-backed extended resource (KEP-5004,
:mod:`packing.dra.extended`) asks one class for ``count`` devices, with no selectors,
capacity requests or tolerations of its own. For a pod asking ``1`` of such a resource,
:func:`sequential_fits` answers: which device would the allocator pick on this node, then
which for the next such pod once the first holds its device, and so on. That is the
first fit of :func:`packing.dra.allocator.predict` repeated, each allocation counted as
used before the next, and it is computed in one pass:

* devices are tried in the allocator's order (pools by driver and name, slices by name,
  devices as listed; :func:`packing.dra.pools.gather_pools`), with the allocator's checks
  in its order: in use (a device without ``allowMultipleAllocations`` taken by a claim or
  by an earlier pod of the burst), the class's CEL selectors, capacity (KEP-5075: the
  request policy's default, else the whole value, must still fit), counters (KEP-4815:
  charged by a shared device's first allocation only), and ``NoSchedule``/``NoExecute``
  taints (the claim tolerates none);
* everything a check reads only ever gets used up as the burst proceeds (devices,
  counters, capacity) or never changes (selectors, taints), so a device the scan passed
  for one pod would be passed again for the next: the next pod's first fit is found by
  continuing from the last device taken (the same device again when it may be shared).
  ``tests/packing/dra/test_offers.py`` checks this against repeated ``predict``;
* a CEL runtime error on a device the scan reaches makes that pod's (and every later
  pod's) scheduling attempt fail (:attr:`Fits.stop` ``error``), a selector outside the
  modelled CEL subset stops with ``unknown``: no more is offered in either case.

:func:`node_slices` picks, out of a cluster's slices, those :func:`gather_pools` needs for
one node (its own, those of the same pools elsewhere, and those for any node), so that
judging every node costs the size of the cluster once, not once per node.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from packing.constraints import BLOCKING
from packing.dra import capacity as cap
from packing.dra.allocator import AllocatedState, Verdict
from packing.dra.cel import Outcome, evaluate
from packing.dra.objects import Device, DeviceClass, Node, ResourceSlice, device_id
from packing.dra.pools import Pool, available_counters, gather_pools, node_matches

# A device shared without limit (a request policy whose default consumes nothing) takes
# every later pod of the burst: the scan stops there after this many.
MAX_PER_DEVICE = 64


@dataclass(frozen=True, slots=True)
class Fits:
    """The devices successive one-device claims of a class get, in order (a shared
    device once per claim it takes), and why the list ends: ``stop`` is
    :attr:`Verdict.UNSCHEDULABLE` when the node has nothing more, ``ERROR`` or
    ``UNKNOWN`` when the next claim would fail or cannot be predicted (``reason`` says
    why), ``ALLOCATED`` when ``limit`` was reached or a shared device took
    :data:`MAX_PER_DEVICE` (it would take every later one)."""

    devices: tuple[tuple[str, Device], ...]  # (driver/pool/device, the device)
    stop: Verdict = Verdict.UNSCHEDULABLE
    reason: str = ""

    @property
    def count(self) -> int:
        return len(self.devices)


class SliceIndex:
    """A cluster's slices by node and by pool, to hand :func:`gather_pools` only what
    one node's pools need."""

    def __init__(self, slices: Sequence[ResourceSlice]) -> None:
        self.by_node: dict[str, list[ResourceSlice]] = {}
        self.by_pool: dict[tuple[str, str], list[ResourceSlice]] = {}
        self.global_slices: list[ResourceSlice] = []
        for s in slices:
            self.by_pool.setdefault((s.driver, s.pool), []).append(s)
            if s.node_name:
                self.by_node.setdefault(s.node_name, []).append(s)
            else:
                self.global_slices.append(s)

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes that have slices of their own (``nodeName``)."""
        return tuple(self.by_node)

    def node_slices(self, node: str) -> list[ResourceSlice]:
        """The node's slices, the other slices of their pools (a pool's completeness is
        judged across nodes), and every slice not bound to one node."""
        pools = {(s.driver, s.pool) for s in self.by_node.get(node, ())}
        pools |= {(s.driver, s.pool) for s in self.global_slices}
        out: list[ResourceSlice] = []
        for key in pools:
            out.extend(self.by_pool[key])
        return out


def sequential_fits(node: Node, pools: Sequence[Pool], klass: DeviceClass,
                    allocated: AllocatedState, *, limit: int = 1024,
                    matches: dict[tuple[str, str], Outcome] | None = None) -> Fits:
    """The devices successive claims of one device of ``klass`` get on ``node``
    (``pools``: :func:`gather_pools` of the node), at most ``limit``.

    ``matches``: a cache of CEL outcomes by (class name, device id), shared between calls
    on the same slices (the selectors of a class are evaluated once per device)."""
    memo = matches if matches is not None else {}
    taken: list[tuple[str, Device]] = []
    in_use = set(allocated.devices)  # taken whole, by claims and by the burst
    # Capacity consumed per shared device, by claims and by the burst so far.
    consumed: dict[str, dict[str, Decimal]] = {}
    shared = {did for did, _share in allocated.shared} | set(allocated.capacity)
    for pool in pools:
        if not pool.usable:
            continue
        left = available_counters(pool, allocated.in_use)
        # A counter already below zero (over-allocated claims) fails every device that
        # consumes counters, as the allocator checks all of the pool's; the burst's own
        # charges never take one below zero.
        broken = any(v < 0 for counters in left.values() for v in counters.values())
        for s, d in pool.devices():
            did = device_id(s.driver, s.pool, d.name)
            per_device = 0
            while len(taken) < limit and per_device < MAX_PER_DEVICE:
                if did in in_use:
                    break
                outcome = memo.get((klass.name, did))
                if outcome is None:
                    outcome, detail = _class_matches(klass, d, s.driver)
                    if outcome in (Outcome.ERROR, Outcome.UNKNOWN):
                        verdict = (Verdict.ERROR if outcome is Outcome.ERROR
                                   else Verdict.UNKNOWN)
                        return Fits(tuple(taken), verdict,
                                    f"class {klass.name} on device {did}: {detail}")
                    memo[(klass.name, did)] = outcome
                if outcome is not Outcome.TRUE:
                    break
                if s.per_device_node_selection and not node_matches(node, d):
                    break
                multi = bool(d.allow_multiple_allocations)
                already = allocated.capacity.get(did, {})
                mine = consumed.get(did, {})
                if not cap.fits(None, d.capacity, already, mine):
                    break
                # Counters: a shared device pays them with its first allocation only.
                pays = bool(d.consumes_counters) and not (multi and did in shared)
                if pays and (broken or not _counters_fit(left, d)):
                    break
                if any(t.effect in BLOCKING for t in d.taints):
                    break
                if pays:
                    _charge(left, d)
                if multi:
                    use = consumed.setdefault(did, {})
                    for k, v in cap.consumption(None, d.capacity).items():
                        use[k] = use.get(k, Decimal(0)) + v
                    shared.add(did)
                else:
                    in_use.add(did)
                taken.append((did, d))
                per_device += 1
            if len(taken) >= limit:
                return Fits(tuple(taken), Verdict.ALLOCATED, f"limit of {limit} reached")
            if per_device >= MAX_PER_DEVICE:
                return Fits(tuple(taken), Verdict.ALLOCATED,
                            f"device {did} takes {MAX_PER_DEVICE} and more")
    return Fits(tuple(taken))


def node_fits(node: Node, slices: Sequence[ResourceSlice], klass: DeviceClass,
              allocated: AllocatedState, *, limit: int = 1024) -> Fits:
    """:func:`sequential_fits` from the cluster's slices (DeviceTaintRules applied)."""
    return sequential_fits(node, gather_pools(node, slices), klass, allocated, limit=limit)


def _class_matches(klass: DeviceClass, d: Device, driver: str) -> tuple[Outcome, str]:
    for expr in klass.selectors:
        v = evaluate(expr, d, driver)
        if v.outcome is not Outcome.TRUE:
            return v.outcome, v.detail
    return Outcome.TRUE, ""


def _counters_fit(left: Mapping[str, Mapping[str, Decimal]], d: Device) -> bool:
    """Whether what ``d`` consumes is left (with no counter of the pool below zero, the
    allocator's ``take_counters`` fails only on one of these)."""
    wants: dict[tuple[str, str], Decimal] = {}
    for use in d.consumes_counters:
        for c, v in use.counters.items():
            wants[(use.counter_set, c)] = wants.get((use.counter_set, c), Decimal(0)) + v
    return all(left.get(s, {}).get(c, Decimal(0)) >= v for (s, c), v in wants.items())


def _charge(left: dict[str, dict[str, Decimal]], d: Device) -> None:
    for use in d.consumes_counters:
        have = left.setdefault(use.counter_set, {})
        for c, v in use.counters.items():
            have[c] = have.get(c, Decimal(0)) - v
