"""Which devices kube-scheduler v1.37.2 allocates to a pod's claims on one node: a model of
its DRA allocator, checked against the real scheduler (tests/e2e/test_e2e_dra_allocator.py).

Which allocator runs. ``structured.NewAllocator`` picks the first of ``stable``,
``incubating``, ``experimental`` whose features cover the enabled ones. At v1.37.2's
default gates the scheduler enables AdminAccess, PrioritizedList, PartitionableDevices,
DeviceTaints, ConsumableCapacity and DeviceBindingAndStatus (BindingConditions and
ResourceClaimDeviceStatus); ``stable`` lacks the last two, so **``incubating`` runs**
(FractionalCapacityRange, ListTypeAttributes, DerivedAttributes, CompatibilityGroups and
OptionalNodeOperations are off). This module models ``incubating`` at those defaults.

How it decides (``Allocate``), as modelled here:

1. The pod's claims without an allocation are allocated together, in the order of
   ``spec.resourceClaims`` (a claim the scheduler makes for DRA-backed extended
   resources last). A class that does not exist makes the pod unschedulable.
2. Up front, for each request (each ``firstAvailable`` subrequest): derived attributes are
   an error; ``ExactCount`` needs ``count`` devices; ``All`` takes every device of every
   pool the node sees that passes the class's and the request's selectors and whose
   static capacity admits the request, and is an error when a pool is incomplete or
   invalid. A claim needing more than 32 devices (counting a subrequest list by its
   smallest) is an error.
3. Then a depth-first search, claim after claim, request after request, device after
   device: the first complete solution wins, there is no scoring. For a
   ``firstAvailable`` request, subrequests are tried in order and the first one with
   which the rest of the pod's claims also succeed is kept. For the next device of the
   same request the search continues after the previous device (combinations, not
   permutations); a new request starts from the first device again. A candidate is
   skipped when it is in use (allocated in the API, or taken earlier in this attempt),
   fails a selector, does not admit the capacity request, lacks counters, carries a
   ``NoSchedule``/``NoExecute`` taint no toleration of the request tolerates, or breaks a
   ``matchAttribute``/``distinctAttribute`` constraint of its claim. ``All`` requests
   take their list in order and fail as soon as one device is unusable. Backtracking
   undoes a choice and tries the next device.
4. A device with ``allowMultipleAllocations`` is never "in use": each allocation gets a
   share id and consumes capacity (:mod:`packing.dra.capacity`); its counters are charged
   only by the first allocation. Counters: a pool's counter sets less what its allocated
   devices consume (once per device, across all the pool's slices), less what this attempt
   takes, must stay non-negative in every counter of the pool.
5. Errors (a CEL runtime error on a device reached before a solution, more than 32
   devices, ``All`` on an incomplete pool, a constraint broken by an ``All`` device) abort
   scheduling of the pod: the scheduler reports an error, not "unschedulable".

Admin-access results are neither "in use" nor counted. The search does the same work
as the Go code, so a request that the real allocator would search for seconds (the
scheduler gives up after 10 s) costs here too: ``max_steps`` bounds it and the answer is
then "unknown".

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from functools import partial

from packing.constraints import BLOCKING, tolerates
from packing.dra import capacity as cap
from packing.dra.cel import Outcome, evaluate
from packing.dra.objects import (
    ALLOCATION_RESULTS_MAX_SIZE,
    AllocatedDevice,
    AllocationMode,
    AttributeValue,
    Device,
    DeviceClass,
    Node,
    Request,
    ResourceClaim,
    ResourceSlice,
    same_attribute,
)
from packing.dra.pools import Pool, available_counters, gather_pools, node_matches

DEFAULT_MAX_STEPS = 200_000

# The scheduler's DRA feature gates this model assumes: v1.37.2's defaults (the e2e test
# reads them from kube-scheduler's kubernetes_feature_enabled metric).
ASSUMED_GATES = {
    "DynamicResourceAllocation": True, "DRAAdminAccess": True, "DRAPrioritizedList": True,
    "DRAPartitionableDevices": True, "DRADeviceTaints": True, "DRADeviceTaintRules": True,
    "DRADeviceBindingConditions": True, "DRAResourceClaimDeviceStatus": True,
    "DRAConsumableCapacity": True, "DRAExtendedResource": True,
    "DRAFractionalCapacityRange": False, "DRAListTypeAttributes": False,
    "DRADerivedAttributes": False, "DRADeviceCompatibilityGroups": False,
    "DRAOptionalNodeOperations": False, "DRANodeAllocatableResources": False,
}


class Verdict(StrEnum):
    ALLOCATED = "allocated"
    UNSCHEDULABLE = "unschedulable"  # does not fit on this node
    ERROR = "error"  # the scheduler aborts the pod's scheduling attempt with an error
    UNKNOWN = "unknown"  # outside the model (CEL outside the subset, search too long)


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the allocator does with a pod's claims on one node.

    ``results``: for ALLOCATED, one tuple per claim allocated (in the order given), the
    devices as they will appear in ``status.allocation.devices.results`` (share ids are
    random in the real allocator: here ``share-<n>``). ``reason`` says why otherwise.
    """

    verdict: Verdict
    results: tuple[tuple[AllocatedDevice, ...], ...] = ()
    reason: str = ""
    steps: int = 0

    @property
    def devices(self) -> tuple[tuple[str, ...], ...]:
        """Per claim, the ``driver/pool/device`` ids allocated, in result order."""
        return tuple(tuple(f"{d.driver}/{d.pool}/{d.device}" for d in c) for c in self.results)


@dataclass(frozen=True, slots=True)
class AllocatedState:
    """What allocated claims hold (the scheduler's ``AllocatedState``): device ids taken
    whole, shared device ids (device id, share id), and capacity consumed per device."""

    devices: frozenset[str] = frozenset()
    shared: frozenset[tuple[str, str]] = frozenset()
    capacity: Mapping[str, Mapping[str, Decimal]] = field(default_factory=dict)

    @property
    def in_use(self) -> frozenset[str]:
        """Every device id that holds an allocation (``IsDeviceAllocated``)."""
        return self.devices | {d for d, _ in self.shared} | frozenset(self.capacity)


def allocated_state(claims: Sequence[ResourceClaim]) -> AllocatedState:
    """The state the scheduler gathers from every claim with an allocation (admin-access
    results excluded)."""
    devices: set[str] = set()
    shared: set[tuple[str, str]] = set()
    consumed: dict[str, dict[str, Decimal]] = {}
    for c in claims:
        if c.allocation is None:
            continue
        for r in c.allocation.results:
            if r.admin_access:
                continue
            did = f"{r.driver}/{r.pool}/{r.device}"
            if r.share_id is None:
                devices.add(did)
                continue
            shared.add((did, r.share_id))
            if r.consumed_capacity is not None:
                total = consumed.setdefault(did, {})
                for k, v in r.consumed_capacity.items():
                    total[k] = total.get(k, Decimal(0)) + v
    return AllocatedState(frozenset(devices), frozenset(shared), consumed)


class _Stop(Exception):
    """The search ends without a solution: ``verdict`` says how."""

    def __init__(self, verdict: Verdict, reason: str) -> None:
        super().__init__(reason)
        self.verdict, self.reason = verdict, reason


class _MaxSize(Exception):
    """``errAllocationResultMaxSizeExceeded``: backtrack to a shorter subrequest."""


@dataclass
class _ReqData:
    request: Request
    parent: str | None  # the request's name when this is a subrequest
    klass: DeviceClass
    num_devices: int
    all_devices: list[tuple[Pool, ResourceSlice, Device]] = field(default_factory=list)
    selected: int = 0

    @property
    def full_name(self) -> str:
        return f"{self.parent}/{self.request.name}" if self.parent else self.request.name


@dataclass
class _Constraint:
    requests: frozenset[str]
    attribute: str
    match: bool  # matchAttribute; else distinctAttribute
    values: list[AttributeValue] = field(default_factory=list)
    count: int = 0

    def applies(self, request: str, sub: str | None) -> bool:
        if not self.requests:
            return True
        return request in self.requests or (sub is not None
                                            and f"{request}/{sub}" in self.requests)

    def add(self, request: str, sub: str | None, driver: str, device: Device) -> bool:
        if not self.applies(request, sub):
            return True
        value = _lookup_attribute(device, driver, self.attribute)
        if value is None:
            return False
        if self.match:
            if self.count and not same_attribute(value, self.values[0]):
                return False
            if not self.count:
                self.values = [value]
            self.count += 1
            return True
        # A list value is of a type the comparison does not know: it clashes with any
        # value already in the set (the first device of the set always goes in).
        if self.values and (isinstance(value, tuple)
                            or any(_distinct_clash(value, v) for v in self.values)):
            return False
        self.values.append(value)
        return True

    def remove(self, request: str, sub: str | None) -> None:
        if not self.applies(request, sub):
            return
        if self.match:
            self.count -= 1
        else:
            self.values.pop()


def _drop_last(items: list[AllocatedDevice]) -> None:
    items.pop()


def _distinct_clash(a: AttributeValue, b: AttributeValue) -> bool:
    return same_attribute(a, b)


def _lookup_attribute(device: Device, driver: str, name: str) -> AttributeValue | None:
    """``lookupAttribute``: the fully qualified name, or the bare id when the domain is
    the driver's."""
    if name in device.attributes:
        return device.attributes[name]
    domain, sep, ident = name.partition("/")
    if not sep or domain != driver:
        return None
    return device.attributes.get(ident)


class _Search:
    def __init__(self, node: Node, pools: list[Pool], classes: Mapping[str, DeviceClass],
                 state: AllocatedState, claims: Sequence[ResourceClaim], max_steps: int
                 ) -> None:
        self.node, self.pools, self.classes, self.state = node, pools, classes, state
        self.claims = claims
        self.max_steps, self.steps = max_steps, 0
        self.req: dict[tuple[int, int, int], _ReqData] = {}
        self.constraints: list[list[_Constraint]] = []
        self.matches: dict[tuple[str, tuple[int, int, int]], bool] = {}
        self.allocating: dict[str, set[int]] = {}
        self.allocating_capacity: dict[str, dict[str, Decimal]] = {}
        self.consumed_counters: dict[tuple[str, str], dict[str, dict[str, Decimal]]] = {}
        self.available: dict[tuple[str, str], dict[str, dict[str, Decimal]]] = {}
        self.results: list[list[AllocatedDevice]] = [[] for _ in claims]
        self.in_use = state.in_use
        self.shares = 0

    # -- set-up ------------------------------------------------------------------------

    def validate(self) -> None:
        # PreFilter first: a class that does not exist makes the pod unschedulable.
        for claim in self.claims:
            for request in claim.requests:
                for r in (request.first_available or (request.exactly,)):
                    if r is not None and r.device_class_name not in self.classes:
                        name = (f"{request.name}/{r.name}" if request.first_available
                                else request.name)
                        raise _Stop(Verdict.UNSCHEDULABLE, f"request {name}: device class "
                                    f"{r.device_class_name} does not exist")
        for ci, claim in enumerate(self.claims):
            need = 0
            for ri, request in enumerate(claim.requests):
                if request.first_available:
                    fewest = None
                    for si, sub in enumerate(request.first_available):
                        data = self.request_data(ci, (ci, ri, si), sub, request.name)
                        self.req[(ci, ri, si)] = data
                        fewest = data.num_devices if fewest is None else min(fewest,
                                                                             data.num_devices)
                    per_request = fewest or 0
                else:
                    assert request.exactly is not None
                    data = self.request_data(ci, (ci, ri, 0), request.exactly, None)
                    self.req[(ci, ri, 0)] = data
                    per_request = data.num_devices
                if per_request > ALLOCATION_RESULTS_MAX_SIZE - need:
                    raise _Stop(Verdict.ERROR, f"claim {claim.key}, request {request.name}: "
                                f"adding {per_request} devices exceeds the claim limit of "
                                f"{ALLOCATION_RESULTS_MAX_SIZE}")
                need += per_request
            self.constraints.append([
                _Constraint(frozenset(c.requests),
                            c.match_attribute or c.distinct_attribute or "",
                            c.match_attribute is not None)
                for c in claim.constraints])

    def request_data(self, ci: int, key: tuple[int, int, int], request: Request,
                     parent: str | None) -> _ReqData:
        claim = self.claims[ci]
        name = f"{parent}/{request.name}" if parent else request.name
        if request.has_derived_attributes:
            raise _Stop(Verdict.ERROR, f"claim {claim.key}, request {name}: cannot handle "
                                       "request with derived attributes, the feature is disabled")
        klass = self.classes[request.device_class_name]
        data = _ReqData(request, parent, klass, request.count)
        if request.allocation_mode == AllocationMode.ALL:
            for pool in self.pools:
                if pool.incomplete or pool.invalid:
                    state = "being updated" if pool.incomplete else "invalid"
                    raise _Stop(Verdict.ERROR, f"claim {claim.key}, request {name}: asks for "
                                f"all devices, but resource pool {pool.driver}/{pool.name} "
                                f"is currently {state}")
                for s, d in pool.devices():
                    if not self.selectable(key, data, s, d):
                        continue
                    if not cap.fits(request.capacity, d.capacity, {}, {}):
                        continue
                    data.all_devices.append((pool, s, d))
            data.num_devices = len(data.all_devices)
        return data

    # -- selection ---------------------------------------------------------------------

    def selectable(self, key: tuple[int, int, int], data: _ReqData, s: ResourceSlice,
                   d: Device) -> bool:
        did = f"{s.driver}/{s.pool}/{d.name}"
        cached = self.matches.get((did, key))
        if cached is not None:
            return cached
        ok = (self.selectors_match(data.klass.selectors, d, s.driver, f"class "
                                   f"{data.klass.name}")
              and self.selectors_match(data.request.selectors, d, s.driver,
                                       f"claim {self.claims[key[0]].key}"))
        if ok and s.per_device_node_selection:
            ok = node_matches(self.node, d)
        self.matches[(did, key)] = ok
        return ok

    @staticmethod
    def selectors_match(selectors: Sequence[str], d: Device, driver: str, who: str) -> bool:
        for i, expr in enumerate(selectors):
            v = evaluate(expr, d, driver)
            if v.outcome is Outcome.ERROR:
                raise _Stop(Verdict.ERROR, f"{who}: selector #{i} on device {driver}/"
                                           f"{d.name}: CEL runtime error: {v.detail}")
            if v.outcome is Outcome.UNKNOWN:
                raise _Stop(Verdict.UNKNOWN, f"{who}: selector #{i} ({expr!r}) on device "
                                             f"{d.name}: {v.detail}")
            if v.outcome is Outcome.FALSE:
                return False
        return True

    # -- the search --------------------------------------------------------------------

    def allocate_one(self, ci: int, ri: int, si: int, di: int, sub_mode: bool,
                     start: tuple[int, int, int]) -> bool:
        self.steps += 1
        if self.steps > self.max_steps:
            raise _Stop(Verdict.UNKNOWN, f"search longer than {self.max_steps} steps")
        if ci >= len(self.claims):
            return True
        claim = self.claims[ci]
        if ri >= len(claim.requests):
            try:
                return self.allocate_one(ci + 1, 0, 0, 0, False, (0, 0, 0))
            except _MaxSize:
                return False
        data = self.req[(ci, ri, si)]
        if not sub_mode and data.parent is not None:
            all_exceeded = True
            sub = 0
            while (ci, ri, sub) in self.req:
                try:
                    ok = self.allocate_one(ci, ri, sub, 0, True, (0, 0, 0))
                except _MaxSize:
                    sub += 1
                    continue
                all_exceeded = False
                if ok:
                    self.req[(ci, ri, 0)].selected = sub
                    return True
                sub += 1
            if all_exceeded:
                raise _MaxSize()
            return False
        request = data.request
        do_all = request.allocation_mode == AllocationMode.ALL
        if do_all and not data.all_devices:
            return False
        if di >= data.num_devices:
            return self.allocate_one(ci, ri + 1, 0, 0, False, (0, 0, 0))
        if data.num_devices - di > ALLOCATION_RESULTS_MAX_SIZE - len(self.results[ci]):
            raise _MaxSize()
        admin = bool(request.admin_access)
        if do_all:
            pool, s, d = data.all_devices[di]
            undo = self.allocate_device(ci, data, pool, s, d, must=True)
            if undo is None:
                return False
            try:
                done = self.allocate_one(ci, ri, si, di + 1, sub_mode, (0, 0, 0))
            except BaseException:
                undo()
                raise
            if not done:
                undo()
            return done
        for pi in range(start[0], len(self.pools)):
            pool = self.pools[pi]
            if not pool.usable:
                continue
            first_slice = start[1] if pi == start[0] else 0
            for sli in range(first_slice, len(pool.slices)):
                s = pool.slices[sli]
                first_dev = start[2] if (pi, sli) == start[:2] else 0
                for dvi in range(first_dev, len(s.devices)):
                    d = s.devices[dvi]
                    did = f"{s.driver}/{s.pool}/{d.name}"
                    if admin and ci in self.allocating.get(did, ()):
                        continue
                    if not admin and self.device_in_use(did):
                        continue
                    if not self.selectable((ci, ri, si), data, s, d):
                        continue
                    if not cap.fits(request.capacity, d.capacity, self.state.capacity.get(did, {}),
                                    self.allocating_capacity.get(did, {})):
                        continue
                    undo = self.allocate_device(ci, data, pool, s, d, must=False)
                    if undo is None:
                        continue
                    try:
                        done = self.allocate_one(ci, ri, si, di + 1, sub_mode,
                                                 (pi, sli, dvi + 1))
                    except BaseException:
                        undo()
                        raise
                    if done:
                        return True
                    undo()
        return False

    def device_in_use(self, did: str) -> bool:
        return did in self.state.devices or bool(self.allocating.get(did))

    def capacity_in_use(self, did: str) -> bool:
        return (did in self.state.capacity or any(d == did for d, _ in self.state.shared)
                or did in self.allocating_capacity)

    def allocate_device(self, ci: int, data: _ReqData, pool: Pool, s: ResourceSlice,
                        d: Device, *, must: bool) -> Callable[[], None] | None:
        """Take ``d`` for the next device of ``data``; the undo function, or None when
        the device cannot be taken."""
        request = data.request
        did = f"{s.driver}/{s.pool}/{d.name}"
        multi = bool(d.allow_multiple_allocations)
        admin = bool(request.admin_access)
        if not multi and admin and ci in self.allocating.get(did, ()):
            return None
        if not admin and self.device_in_use(did):
            return None
        undo_steps: list[Callable[[], None]] = []

        def undo() -> None:
            for step in reversed(undo_steps):
                step()

        if d.consumes_counters and not (multi and self.capacity_in_use(did)):
            if not self.take_counters(pool, d):
                return None
            undo_steps.append(lambda: self.give_counters(pool, d))
        if any(t.effect in BLOCKING and not tolerates(request.tolerations, t) for t in d.taints):
            undo()
            return None
        base, sub = (data.parent, request.name) if data.parent else (request.name, None)
        for c in self.constraints[ci]:
            if not c.add(base, sub, s.driver, d):
                undo()
                if must:
                    raise _Stop(Verdict.ERROR, f"claim {self.claims[ci].key}, request "
                                f"{request.name}: cannot add device {did} because a claim "
                                "constraint would not be satisfied")
                return None
            undo_steps.append(partial(c.remove, base, sub))
        if not multi:
            self.allocating.setdefault(did, set()).add(ci)
            undo_steps.append(lambda: self.allocating[did].discard(ci))
        consumed: dict[str, Decimal] | None = None
        share = None
        if not cap.fits(request.capacity, d.capacity, self.state.capacity.get(did, {}),
                        self.allocating_capacity.get(did, {})):
            undo()
            return None
        if multi:
            consumed = cap.consumption(request.capacity, d.capacity)
            self.shares += 1
            share = f"share-{self.shares}"
            existed = did in self.allocating_capacity
            total = self.allocating_capacity.setdefault(did, {})
            for k, v in consumed.items():
                total[k] = total.get(k, Decimal(0)) + v

            def release(consumed: dict[str, Decimal] = consumed) -> None:
                mine = self.allocating_capacity.get(did)
                if mine is None:
                    return
                for k, v in consumed.items():
                    mine[k] = mine.get(k, Decimal(0)) - v
                if all(v == 0 for v in mine.values()) and not existed:
                    del self.allocating_capacity[did]

            undo_steps.append(release)
        result = AllocatedDevice(data.full_name, s.driver, s.pool, d.name,
                                 admin_access=admin, share_id=share,
                                 consumed_capacity=consumed or None)
        self.results[ci].append(result)
        undo_steps.append(partial(_drop_last, self.results[ci]))
        return undo

    def take_counters(self, pool: Pool, d: Device) -> bool:
        key = (pool.driver, pool.name)
        if key not in self.available:
            self.available[key] = available_counters(pool, self.in_use)
        taken = self.consumed_counters.setdefault(key, {})
        for use in d.consumes_counters:
            mine = taken.setdefault(use.counter_set, {})
            for c, v in use.counters.items():
                mine[c] = mine.get(c, Decimal(0)) + v
        for set_name, counters in self.available[key].items():
            used = taken.get(set_name, {})
            for c, left in counters.items():
                if left < used.get(c, Decimal(0)):
                    self.give_counters(pool, d)
                    return False
        return True

    def give_counters(self, pool: Pool, d: Device) -> None:
        taken = self.consumed_counters[(pool.driver, pool.name)]
        for use in d.consumes_counters:
            for c, v in use.counters.items():
                taken[use.counter_set][c] -= v


def predict(node: Node, slices: Sequence[ResourceSlice], classes: Mapping[str, DeviceClass],
            allocated: AllocatedState, claims: Sequence[ResourceClaim], *,
            max_steps: int = DEFAULT_MAX_STEPS) -> Prediction:
    """What kube-scheduler v1.37.2 allocates to ``claims`` (the pod's claims that have no
    allocation yet, in the pod's order) on ``node``.

    ``slices``: every ResourceSlice of the cluster, DeviceTaintRules applied
    (:func:`packing.dra.pools.apply_taint_rules`); ``classes`` by name; ``allocated``:
    :func:`allocated_state` of every allocated claim (including allocations the
    scheduler holds in flight).
    """
    pools = gather_pools(node, slices)
    search = _Search(node, pools, classes, allocated, claims, max_steps)
    try:
        search.validate()
        done = search.allocate_one(0, 0, 0, 0, False, (0, 0, 0))
    except _Stop as stop:
        return Prediction(stop.verdict, reason=stop.reason, steps=search.steps)
    except _MaxSize:
        # Every subrequest of the first request exceeds the limit: Allocate returns
        # errAllocationResultMaxSizeExceeded itself, which the scheduler reports as an error.
        return Prediction(Verdict.ERROR, reason="allocation max size exceeded",
                          steps=search.steps)
    if not done:
        if any(p.invalid for p in pools):
            return Prediction(Verdict.UNSCHEDULABLE, reason="invalid resource pools were "
                              "encountered", steps=search.steps)
        return Prediction(Verdict.UNSCHEDULABLE, reason="cannot allocate all claims",
                          steps=search.steps)
    return Prediction(Verdict.ALLOCATED, tuple(tuple(r) for r in search.results),
                      steps=search.steps)
