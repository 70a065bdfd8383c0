"""The cluster's ``resource.k8s.io/v1`` objects as the cache keeps them: ResourceSlices,
DeviceClasses, ResourceClaims, ResourceClaimTemplates and DeviceTaintRules, each read
once per watch event (:mod:`packing.dra.parse`), plus the allocations the extender
assumed for pods it approved (in flight until the claim watch shows them).

What it answers: the :class:`~packing.dra.world.DraWorld` for predictions (rebuilt only
after a change, and then per node only for the nodes whose slices changed), the nodes
whose GPU inventory or held devices an event may have changed (:meth:`DraObjects.take_dirty`),
each node's GPU inventory (:func:`packing.dra.inventory.node_inventory`), and the
devices each node's claims hold (:meth:`DraObjects.uses_on`).

An object that cannot be read is left out and counted (``bad_objects``), its previous
version dropped: a pool missing a slice then reads as incomplete and offers nothing,
the conservative answer. Not thread-safe: the cache calls it under its lock.

Prediction checks: when the watch shows a claim allocated for which the extender had
assumed an allocation, the devices are compared (``agreements``/``disagreements``;
each disagreement logged with both device lists), the measure of
:mod:`packing.dra.allocator` in production.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from packing.dra.allocator import allocated_state
from packing.dra.inventory import (
    DraInventory,
    StaticInventory,
    inventory_from,
    static_inventory,
)
from packing.dra.objects import (
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    AllocatedDevice,
    Allocation,
    DeviceClass,
    DeviceTaintRule,
    ResourceClaim,
    ResourceSlice,
)
from packing.dra.parse import (
    DraParseError,
    parse_claim_template,
    parse_device_class,
    parse_device_taint_rule,
    parse_resource_claim,
    parse_resource_slice,
)
from packing.dra.pools import apply_taint_rules
from packing.dra.world import DraWorld

log = logging.getLogger("gpupack.kube.dra")

# The watched kinds (their plural resource names, as the API and RBAC spell them).
SLICES = "resourceslices"
CLASSES = "deviceclasses"
CLAIMS = "resourceclaims"
TEMPLATES = "resourceclaimtemplates"
RULES = "devicetaintrules"
KINDS = (SLICES, CLASSES, CLAIMS, TEMPLATES, RULES)
# The object kinds of those resources (a file of objects names them so).
KIND_NAMES = {"ResourceSlice": SLICES, "DeviceClass": CLASSES, "ResourceClaim": CLAIMS,
              "ResourceClaimTemplate": TEMPLATES, "DeviceTaintRule": RULES}
# Attributes every GPU has its own value of, that selectors in practice never name: left
# out of a node's fingerprint (DraObjects.fingerprint).
_NODE_OWN = frozenset({"uuid", "parentUUID", "gpu.nvidia.com/uuid",
                       "gpu.nvidia.com/parentUUID"})
_MISSING: Any = object()
CHECKED_KEPT = 100_000  # claims whose prediction was compared, remembered (see compare)
def slice_fingerprint(obj: Mapping[str, Any], node: str) -> bytes:
    """A slice's spec as JSON (sorted keys) with the node's name taken out of it and the
    attributes each GPU has its own value of left out: equal for the slices of two equal
    nodes (see :meth:`DraObjects.fingerprint`)."""
    spec = dict(obj.get("spec") or {})
    spec.pop("nodeName", None)
    pool = spec.get("pool")
    if isinstance(pool, Mapping):
        spec["pool"] = {**pool, "name": str(pool.get("name", "")).replace(node, "\0")}
    devices = spec.get("devices")
    if isinstance(devices, list):
        spec["devices"] = [
            {**d, "attributes": {k: v for k, v in (d.get("attributes") or {}).items()
                                 if k not in _NODE_OWN}} if isinstance(d, Mapping) else d
            for d in devices]
    try:
        return orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return repr(spec).encode()


# The in-flight key of the claim kube-scheduler makes for a pod's DRA-backed extended
# resources (its API name is generated): <namespace>/<pod><EXTENDED_MARK>.
EXTENDED_MARK = "#extended-resources"


@dataclass(frozen=True, slots=True)
class InFlight:
    """Allocations assumed for one pod: claim key -> the devices predicted."""

    pod: str
    claims: Mapping[str, tuple[AllocatedDevice, ...]]


@dataclass
class _Claim:
    claim: ResourceClaim
    owner_pod: str | None  # namespace/name of a Pod in ownerReferences


def object_key(kind: str, obj: Mapping[str, Any]) -> str | None:
    """The store key of an object: its name, ``namespace/name`` for namespaced kinds."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    if kind in (CLAIMS, TEMPLATES):
        ns = meta.get("namespace")
        return f"{ns if isinstance(ns, str) and ns else 'default'}/{name}"
    return name


def _owner_pod(obj: Mapping[str, Any], namespace: str) -> str | None:
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("kind") == "Pod" and ref.get("name"):
            return f"{namespace}/{ref['name']}"
    return None


@dataclass
class DraObjects:
    """The DRA objects of the cluster, and what the extender assumed."""

    slices: dict[str, ResourceSlice] = field(default_factory=dict)
    raw_slices: dict[str, ResourceSlice] = field(default_factory=dict)  # before taint rules
    classes: dict[str, DeviceClass] = field(default_factory=dict)
    claims: dict[str, _Claim] = field(default_factory=dict)
    templates: dict[str, ResourceClaim] = field(default_factory=dict)
    rules: dict[str, DeviceTaintRule] = field(default_factory=dict)
    in_flight: dict[str, InFlight] = field(default_factory=dict)  # by pod key
    bad_objects: int = 0
    agreements: int = 0
    disagreements: int = 0
    listed: set[str] = field(default_factory=set)  # kinds listed at least once
    # Called with (claim key, predicted devices, allocated devices) on a disagreement.
    on_disagreement: list[Callable[[str, tuple[str, ...], tuple[str, ...]], None]] = field(
        default_factory=list)
    _dirty: set[str] = field(default_factory=set)
    _all_dirty: bool = False
    _world: DraWorld | None = None
    _by_node: dict[str, tuple[ResourceSlice, ...]] = field(default_factory=dict)
    _node_slices: dict[str, set[str]] = field(default_factory=dict)  # node -> slice names
    _device_node: dict[str, str] = field(default_factory=dict)  # device id -> node
    _held: dict[str, frozenset[str]] | None = None  # node -> names of its devices held
    _fingerprints: dict[str, int] = field(default_factory=dict)
    _fp_ids: dict[tuple[object, ...], int] = field(default_factory=dict)  # never reused
    _slice_fp: dict[str, bytes] = field(default_factory=dict)  # slice name -> its own
    _unbound_slices: int = 0  # slices of no one node (allNodes, selectors)
    # Each node's inventory whatever is held (None: no GPU), until its slices change.
    _statics: dict[str, StaticInventory | None] = field(default_factory=dict)
    # Allocated claims by the nodes whose devices they hold; those with a device of no
    # node known yet (its slice not seen) apart.
    _node_claims: dict[str, set[str]] = field(default_factory=dict)
    _unplaced: set[str] = field(default_factory=set)
    classes_version: int = 0  # changes whenever a DeviceClass does
    _checked: dict[str, None] = field(default_factory=dict)  # claims compared (in order)

    # ---- state -----------------------------------------------------------------------

    @property
    def empty(self) -> bool:
        """No DRA object at all (and nothing in flight): the cluster does not use DRA."""
        return not (self.slices or self.classes or self.claims or self.in_flight)

    def take_dirty(self) -> set[str] | None:
        """The nodes whose inventory or held devices may have changed since the last call
        (None: every node)."""
        if self._all_dirty:
            self._all_dirty = False
            self._dirty.clear()
            return None
        out, self._dirty = self._dirty, set()
        return out

    def _touch(self, nodes: Iterable[str | None]) -> None:
        self._world = None
        self._held = None
        for n in nodes:
            if n is None:
                self._all_dirty = True
            else:
                self._dirty.add(n)

    def has_slices(self, node: str) -> bool:
        return node in self._node_slices

    def slice_nodes(self) -> set[str]:
        """Every node some slice names."""
        return set(self._node_slices)

    # ---- watch events ----------------------------------------------------------------

    def upsert(self, kind: str, obj: Mapping[str, Any]) -> bool:
        """Read one object (ADDED or MODIFIED); False when it cannot be read (counted,
        logged, its previous version dropped)."""
        key = object_key(kind, obj)
        if key is None:
            self.bad_objects += 1
            log.warning("%s: an object without metadata.name skipped", kind)
            return False
        try:
            if kind == SLICES:
                self._put_slice(key, parse_resource_slice(obj))
                if self.raw_slices[key].node_name:
                    self._slice_fp[key] = slice_fingerprint(obj,
                                                            str(self.raw_slices[key].node_name))
            elif kind == CLASSES:
                self.classes[key] = parse_device_class(obj)
                self.classes_version += 1
                self._touch(())
            elif kind == CLAIMS:
                claim = parse_resource_claim(obj)
                self._put_claim(key, _Claim(claim, _owner_pod(obj, claim.namespace)))
            elif kind == TEMPLATES:
                self.templates[key] = parse_claim_template(obj)
            elif kind == RULES:
                self.rules[key] = parse_device_taint_rule(obj)
                self._retaint()
            else:
                raise ValueError(f"unknown DRA kind {kind}")
        except DraParseError as e:
            self.bad_objects += 1
            log.warning("skipping %s: %s", kind, e)
            self.delete(kind, key)
            return False
        return True

    def delete(self, kind: str, key: str) -> None:
        if kind == SLICES:
            old = self.raw_slices.pop(key, None)
            self.slices.pop(key, None)
            self._slice_fp.pop(key, None)
            if old is not None:
                self._unindex_slice(key, old)
        elif kind == CLASSES:
            if self.classes.pop(key, None) is not None:
                self.classes_version += 1
                self._touch(())
        elif kind == CLAIMS:
            self._put_claim(key, None)
        elif kind == TEMPLATES:
            self.templates.pop(key, None)
        elif kind == RULES and self.rules.pop(key, None) is not None:
            self._retaint()

    def replace(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list of ``kind``: what is not listed is gone."""
        objs = list(objs)
        keys = {object_key(kind, o) for o in objs}
        stores: dict[str, Mapping[str, object]] = {
            SLICES: self.raw_slices, CLASSES: self.classes, CLAIMS: self.claims,
            TEMPLATES: self.templates, RULES: self.rules}
        store = stores[kind]
        for gone in [k for k in store if k not in keys]:
            self.delete(kind, gone)
        for o in objs:
            self.upsert(kind, o)
        self.listed.add(kind)

    # ---- slices ----------------------------------------------------------------------

    def _put_slice(self, key: str, s: ResourceSlice) -> None:
        old = self.raw_slices.get(key)
        if old == s:
            return
        if old is not None:
            self._unindex_slice(key, old)
        self.raw_slices[key] = s
        if not s.node_name:
            self._unbound_slices += 1
        rules = list(self.rules.values())
        self.slices[key] = apply_taint_rules([s], rules)[0] if rules else s
        node = s.node_name
        if node:
            self._node_slices.setdefault(node, set()).add(key)
            self._by_node.pop(node, None)
            self._fingerprints.pop(node, None)
            self._statics.pop(node, None)
            for d in s.devices:
                self._device_node[f"{s.driver}/{s.pool}/{d.name}"] = node
            for key in list(self._unplaced):
                self._unplaced.discard(key)
                c = self.claims.get(key)
                if c is not None:
                    self._index_claim(key, self._nodes_of(c.claim.allocation))
        self._touch((node or None,))

    def _unindex_slice(self, key: str, s: ResourceSlice) -> None:
        node = s.node_name
        if not node:
            self._unbound_slices -= 1
        if node:
            names = self._node_slices.get(node)
            if names is not None:
                names.discard(key)
                if not names:
                    del self._node_slices[node]
            self._by_node.pop(node, None)
            self._fingerprints.pop(node, None)
            self._statics.pop(node, None)
            for d in s.devices:
                did = f"{s.driver}/{s.pool}/{d.name}"
                if self._device_node.get(did) == node:
                    del self._device_node[did]
        self._touch((node or None,))

    def _retaint(self) -> None:
        rules = list(self.rules.values())
        for key, s in self.raw_slices.items():
            self.slices[key] = apply_taint_rules([s], rules)[0] if rules else s
        self._by_node.clear()
        self._fingerprints.clear()
        self._statics.clear()
        self._touch((None,))

    # ---- claims ----------------------------------------------------------------------

    def _nodes_of(self, allocation: Allocation | None) -> set[str | None]:
        if allocation is None:
            return set()
        return {self._device_node.get(f"{r.driver}/{r.pool}/{r.device}")
                for r in allocation.results}

    def _put_claim(self, key: str, new: _Claim | None) -> None:
        old = self.claims.get(key)
        if old is not None and new is not None and old.claim == new.claim:
            old.owner_pod = new.owner_pod
            return
        before = self._nodes_of(old.claim.allocation if old else None)
        self._unindex_claim(key, before)
        touched = set(before)
        if new is None:
            self.claims.pop(key, None)
        else:
            self.claims[key] = new
            after = self._nodes_of(new.claim.allocation)
            self._index_claim(key, after)
            touched |= after
            if new.claim.allocation is not None:
                self._settle(key, new)
        touched.discard(None)  # a device of no known node: nothing of ours to recount
        self._touch(touched)

    def _index_claim(self, key: str, nodes: set[str | None]) -> None:
        """Which nodes' devices the claim holds (a device of no known node yet: the
        claim is looked at for every node until then)."""
        for n in nodes:
            if n is None:
                self._unplaced.add(key)
            else:
                self._node_claims.setdefault(n, set()).add(key)

    def _unindex_claim(self, key: str, nodes: set[str | None]) -> None:
        self._unplaced.discard(key)
        for n in nodes:
            if n is not None and n in self._node_claims:
                self._node_claims[n].discard(key)
                if not self._node_claims[n]:
                    del self._node_claims[n]

    def _settle(self, key: str, c: _Claim) -> None:
        """The claim is allocated: an allocation assumed for it is over; compare."""
        assert c.claim.allocation is not None
        pod, flight_key = None, key
        if c.claim.annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true" and c.owner_pod:
            pod, flight_key = c.owner_pod, f"{c.owner_pod}{EXTENDED_MARK}"
        found = None
        for pk, f in list(self.in_flight.items()):
            if (pod is None or pk == pod) and flight_key in f.claims:
                found = (pk, f)
                break
        if found is None:
            return
        pk, f = found
        self.compare(key, f.claims[flight_key], c.claim.allocation.results)
        rest = {k: v for k, v in f.claims.items() if k != flight_key}
        nodes = {self._device_node.get(f"{d.driver}/{d.pool}/{d.device}")
                 for d in f.claims[flight_key]}
        if rest:
            self.in_flight[pk] = replace(f, claims=rest)
        else:
            del self.in_flight[pk]
        nodes.discard(None)
        self._touch(nodes)

    def compare(self, key: str, predicted: Iterable[AllocatedDevice],
                allocated: Iterable[AllocatedDevice]) -> bool:
        """Count (and log, and tell ``on_disagreement``) whether the devices predicted
        for claim ``key`` are the ones allocated; whether they are. A claim is counted
        once (its first comparison; the latest claims remembered)."""
        want = tuple(sorted(f"{d.driver}/{d.pool}/{d.device}" for d in predicted))
        got = tuple(sorted(f"{d.driver}/{d.pool}/{d.device}" for d in allocated))
        if key in self._checked:
            return want == got
        self._checked[key] = None
        if len(self._checked) > CHECKED_KEPT:
            del self._checked[next(iter(self._checked))]
        if want == got:
            self.agreements += 1
            return True
        self.disagreements += 1
        log.warning("claim %s: predicted %s, allocated %s", key, ", ".join(want) or "nothing",
                    ", ".join(got) or "nothing")
        for fn in self.on_disagreement:
            fn(key, want, got)
        return False

    def assume(self, pod: str, claims: Mapping[str, tuple[AllocatedDevice, ...]]) -> None:
        """Count ``claims`` (claim key -> devices predicted) as allocated until the watch
        shows their allocation (or :meth:`forget`)."""
        self.forget(pod)
        live = {k: v for k, v in claims.items()
                if not (k in self.claims and self.claims[k].claim.allocation is not None)}
        if not live:
            return
        self.in_flight[pod] = InFlight(pod, dict(live))
        self._touch({self._device_node.get(f"{d.driver}/{d.pool}/{d.device}")
                     for ds in live.values() for d in ds} - {None})

    def forget(self, pod: str) -> None:
        f = self.in_flight.pop(pod, None)
        if f is not None:
            self._touch({self._device_node.get(f"{d.driver}/{d.pool}/{d.device}")
                         for ds in f.claims.values() for d in ds} - {None})

    def claim(self, key: str) -> ResourceClaim | None:
        c = self.claims.get(key)
        return None if c is None else c.claim

    def owner_pod(self, key: str) -> str | None:
        """The pod claim ``key`` was made for (``namespace/name`` from its
        ownerReferences: a claim template's claim, or the claim made for a pod's
        extended resources), None for a claim of its own or one not seen."""
        c = self.claims.get(key)
        return None if c is None else c.owner_pod

    def extended_claim_of(self, pod: str) -> ResourceClaim | None:
        """The claim kube-scheduler made for ``pod``'s extended resources, once created."""
        for c in self.claims.values():
            if (c.owner_pod == pod and c.claim.annotations.get(
                    EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true"):
                return c.claim
        return None

    # ---- answers ---------------------------------------------------------------------

    def _in_flight_claims(self) -> list[ResourceClaim]:
        out = []
        for f in self.in_flight.values():
            for key, devices in f.claims.items():
                ns, _, name = key.partition("/")
                out.append(ResourceClaim(ns, name, allocation=Allocation(devices)))
        return out

    def world(self) -> DraWorld:
        """The world the objects describe (rebuilt after a change)."""
        if self._world is not None:
            return self._world
        for node, names in self._node_slices.items():
            if node not in self._by_node:
                self._by_node[node] = tuple(self.slices[n] for n in sorted(names))
        unbound = (tuple(s for s in self.slices.values() if not s.node_name)
                   if self._unbound_slices else ())
        claims = [c.claim for c in self.claims.values()]
        by_node = self._by_node
        if unbound:
            # A pool with node-independent slices: its slices serve every node (rare for
            # GPUs; the allocator reads them all).
            pools = {(s.driver, s.pool) for s in unbound}
            by_node = {n: tuple(s for s in v) for n, v in by_node.items()}
            unbound = tuple(s for s in self.slices.values() if (s.driver, s.pool) in pools)
        self._world = DraWorld(
            slices=tuple(self.slices.values()), classes=dict(self.classes),
            allocated=allocated_state([*claims, *self._in_flight_claims()]),
            claims={c.key: c for c in claims}, by_node=by_node, unbound=unbound,
            indexed=True)
        return self._world

    def held_on(self, node: str) -> frozenset[str]:
        """Names of ``node``'s devices that allocated claims (or allocations in flight)
        hold."""
        if self._held is None:
            held: dict[str, set[str]] = {}
            for did in self.world().allocated.in_use:
                n = self._device_node.get(did)
                if n is not None:
                    held.setdefault(n, set()).add(did.rsplit("/", 1)[1])
            self._held = {n: frozenset(v) for n, v in held.items()}
        return self._held.get(node, frozenset())

    def fingerprint(self, node: str) -> int | None:
        """What the allocator reads of ``node``'s own slices, with the node's name and its
        GPUs' UUIDs taken out: nodes of equal fingerprints (and equal devices held) get
        the same allocation, up to the pool's name. None when node-independent slices
        exist (they would be read too). Made of each slice's fingerprint, taken from its
        JSON when it arrives (:func:`slice_fingerprint`), in name order (the allocator's
        order within a pool; the API server gives each name a random suffix), and the
        taints DeviceTaintRules add."""
        found = self._fingerprints.get(node)
        if found is not None:
            return found
        if self._unbound_slices:
            return None
        names = sorted(self._node_slices.get(node, ()))
        rules: tuple[object, ...] = ()
        if self.rules:
            rules = tuple((d.name, d.taints) for n in names for d in self.slices[n].devices
                          if d.taints)
        text = (tuple(self._slice_fp.get(n, b"") for n in names), rules)
        # Interned as a small number: memo keys compare it for every node of a request,
        # and two equal 50 kB texts compare byte by byte.
        number = self._fp_ids.setdefault(text, len(self._fp_ids))
        self._fingerprints[node] = number
        return number

    def node_views(self, nodes: Iterable[str]
                   ) -> dict[str, tuple[DraInventory | None,
                                        list[tuple[str, tuple[AllocatedDevice, ...]]]]]:
        """For each of ``nodes``: its GPUs as its slices publish them (None: none), the
        held devices deciding the mode of partitionable GPUs, and (claim key, its devices
        on the node) for every allocated claim and allocation in flight holding one of
        the node's devices, in key order. One pass over the claims for all the nodes."""
        wanted = set(nodes)
        world = self.world()
        uses: dict[str, list[tuple[str, tuple[AllocatedDevice, ...]]]] = {n: [] for n in wanted}

        def add(key: str, results: Iterable[AllocatedDevice]) -> None:
            by: dict[str, list[AllocatedDevice]] = {}
            for r in results:
                n = self._device_node.get(f"{r.driver}/{r.pool}/{r.device}")
                if n in wanted:
                    by.setdefault(n, []).append(r)
            for n, held in by.items():
                uses[n].append((key, tuple(held)))

        keys = set(self._unplaced)
        for n in wanted:
            keys |= self._node_claims.get(n, set())
        for key in sorted(keys):
            c = self.claims.get(key)
            alloc = None if c is None else c.claim.allocation
            if alloc is not None:
                add(key, alloc.results)
        for pod in sorted(self.in_flight):
            for key, devices in sorted(self.in_flight[pod].claims.items()):
                add(key, devices)
        out = {}
        for n in wanted:
            held = {f"{r.driver}/{r.pool}/{r.device}" for _, rs in uses[n] for r in rs
                    if not r.admin_access}
            static = self._statics.get(n, _MISSING)
            if static is _MISSING:
                static = self._statics[n] = static_inventory(n, world.node_slices(n))
            out[n] = (None if static is None else inventory_from(static, held), uses[n])
        return out
