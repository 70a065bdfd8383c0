"""What the GPUs of DRA nodes offer a small pod, per node and GPU model, as kube-scheduler's
allocator will hand them out: the webhook's view of ResourceSlices (``docs/dra.md``,
"The webhook on DRA nodes").

The webhook writes the same extended resources on every node: ``nvidia.com/mig-<p>``,
``nvidia.com/gpu.shared``, ``nvidia.com/gpu``. Where a node publishes its GPUs as
ResourceSlices (the NVIDIA DRA driver), kube-scheduler serves such a resource from the
DeviceClass whose ``extendedResourceName`` it is (KEP-5004; gpupack's chart ships them,
:mod:`packing.dra.served`). So what a DRA node offers a pod asking one of them is what
the allocator gives a burst of one-device claims of that class
(:func:`packing.dra.offers.sequential_fits`): that many are *free now*, and the devices of
the class, held or not, are those a pod may *wait for*.

Per node and model (:class:`DraModelOffer`), from the devices' attributes (the NVIDIA
driver's ``productName``, ``uuid`` of a whole GPU, ``parentUUID`` of a MIG device):

* MIG: per profile with a class, free now (first fits) and existing (devices of the
  class: under DynamicMIG every placement, so any profile may be waited for);
* shares: per device of the share's class, (free MiB, milli-GPU, shares left), where
  shares left is how many more the allocator gives that device and free MiB its memory
  capacity less what allocated claims consume of it;
* whole GPUs (``nvidia.com/gpu``, the driver's ``gpu.nvidia.com`` class): free now and
  devices, for the last resort of a small pod on a DRA node.

A node counts as a DRA GPU node when one of its devices belongs to a known GPU. Its
device-plugin GPUs (none: the NVIDIA driver refuses to run beside the device plugin on a
node) are not counted. A class whose selectors the model cannot evaluate, or that fails
on a device, ends what the node offers of it (``DraNode.problems`` says why): the node
is then under-counted, never over-counted.

Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from types import MappingProxyType

from packing.catalog import CATALOG, GpuModel, get_model, match_product
from packing.dra import capacity as cap
from packing.dra.allocator import AllocatedState, Verdict
from packing.dra.cel import Outcome, evaluate
from packing.dra.extended import class_for
from packing.dra.objects import Device, DeviceClass, Node, ResourceSlice, device_id
from packing.dra.offers import SliceIndex, sequential_fits
from packing.dra.pools import Pool, gather_pools
from packing.dra.world import DraWorld
from packing.model import GPU_MILLI, NodeInfo

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
_MIB = 1 << 20
# The most devices one class offers on one node that the view counts (a node has at most
# 64 GPUs; 7 placements of a profile each is well below).
_LIMIT = 512


@dataclass(frozen=True)
class DraModelOffer:
    """What one node's GPUs of one model offer."""

    model: str
    gpus: int
    mig_gpus: int  # GPUs publishing MIG devices
    mig_free: Mapping[str, int]  # profile -> one-device claims the allocator serves now
    mig_existing: Mapping[str, int]  # profile -> devices of its class, held or not
    shared_gpus: int  # devices of the share's class
    # (free MiB, free milli-GPU, shares left) -> devices, those with a share left.
    shared_room: Mapping[tuple[int, int, int], int]
    whole_free: int  # one-device claims of nvidia.com/gpu served now
    whole_gpus: int  # devices of its class


def _resource_of(profile: str) -> str:
    return "nvidia.com/mig-" + profile.replace("+", ".")


def _attr(d: Device, driver: str, name: str) -> object:
    return d.attributes.get(name, d.attributes.get(f"{driver}/{name}"))


def _memory_mib(d: Device) -> int | None:
    c = d.capacity.get("memory")
    return None if c is None else int(c.value) // _MIB


class _Models:
    """The catalog model of a device, by its product name (memo)."""

    def __init__(self) -> None:
        self.memo: dict[tuple[str, int | None], GpuModel | None] = {}

    def of(self, d: Device, driver: str) -> tuple[str, str] | None:
        """(GPU uuid, catalog model) of a whole GPU or a MIG device, None otherwise."""
        kind = _attr(d, driver, "type")
        uuid = _attr(d, driver, "uuid" if kind == "gpu" else "parentUUID")
        product = _attr(d, driver, "productName")
        if kind not in ("gpu", "mig") or not isinstance(uuid, str) \
                or not isinstance(product, str):
            return None
        key = (product, _memory_mib(d) if kind == "gpu" else None)
        if key not in self.memo:
            try:
                self.memo[key] = match_product(product.replace(" ", "-"), key[1])
            except ValueError:
                self.memo[key] = None
        model = self.memo[key]
        if model is None or (model.generic and kind == "mig"):
            return None
        return uuid, model.name


def _members(pools: Iterable[Pool], klass: DeviceClass,
             matches: dict[tuple[str, str], Outcome]) -> list[tuple[str, Device]]:
    """(device id, device) of every device of the node in ``klass``, held or not (a
    device whose selectors fail or cannot be evaluated is not one)."""
    out = []
    for pool in pools:
        if not pool.usable:
            continue
        for s, d in pool.devices():
            did = device_id(s.driver, s.pool, d.name)
            outcome = matches.get((klass.name, did))
            if outcome is None:
                outcome = Outcome.TRUE
                for expr in klass.selectors:
                    v = evaluate(expr, d, s.driver).outcome
                    if v is not Outcome.TRUE:
                        outcome = v
                        break
                if outcome in (Outcome.TRUE, Outcome.FALSE):
                    matches[(klass.name, did)] = outcome
            if outcome is Outcome.TRUE:
                out.append((did, d))
    return out


@dataclass(frozen=True)
class DraNode:
    """One DRA GPU node's offers, as of ``allocated`` (the world's allocated claims plus
    the claims this view took there since: :meth:`DraView.after`)."""

    name: str
    models: Mapping[str, DraModelOffer]
    # Why some class offers less than its devices might (a CEL error or a selector
    # outside the model), one line each.
    problems: tuple[str, ...] = ()
    allocated: AllocatedState = field(default_factory=AllocatedState, compare=False,
                                      repr=False)
    # MiB declared by the shares this view took, per device (the allocator counts only
    # the driver's default, which an extended resource cannot raise).
    declared: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}),
                                        compare=False, repr=False)
    taken: int = field(default=0, compare=False, repr=False)


class Take(StrEnum):
    """Which class a claim taken in the view asks one device of."""

    MIG = "mig"
    SHARED = "shared"
    GPU = "gpu"


@dataclass
class _NodeFacts:
    """What does not change while claims are taken on a node: its pools, which device is
    which GPU of which model, and the devices of each class."""

    node: Node
    pools: list[Pool]
    gpu_model: dict[str, str]  # GPU uuid -> model
    device_gpu: dict[str, str]  # device id -> GPU uuid
    mig_uuids: set[str]
    members: dict[str, list[tuple[str, Device]]]  # class name -> (device id, device)
    classes: list[DeviceClass] = field(default_factory=list)  # those judged here
    # CEL outcomes of those classes on the node's devices (class name, device id).
    matches: dict[tuple[str, str], Outcome] = field(default_factory=dict)


@dataclass
class _Judged:
    """A node as one view judged it, kept for the next (:class:`DraMemo`)."""

    slices: tuple[ResourceSlice, ...]  # compared by identity
    labels: tuple[tuple[str, str], ...]
    classes: tuple[tuple[str, tuple[str, ...]], ...]
    facts: _NodeFacts | None
    device_ids: frozenset[str]  # of the node's pools, other nodes' slices included
    held: tuple[object, ...] = ()
    node: DraNode | None = None


class DraMemo:
    """What the previous view judged per node, reused by the next when the node's
    slices are the same objects (a cache keeps the objects of slices that did not
    change), with the same labels and classes: then its devices are not read nor its
    selectors evaluated again, and when what claims hold of its devices is the same
    too, its offers are reused as they are. Holds only the latest view's nodes. Views
    built at once may share it: :meth:`keep` swaps its dict whole."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Judged] = {}

    def get(self, name: str) -> _Judged | None:
        return self._nodes.get(name)

    def keep(self, judged: dict[str, _Judged]) -> None:
        self._nodes = judged


def _held(ids: frozenset[str], a: AllocatedState) -> tuple[object, ...]:
    """What allocated claims hold of the devices ``ids``, comparable between views."""
    return (ids & a.devices, frozenset(x for x in a.shared if x[0] in ids),
            tuple(sorted((d, tuple(sorted(a.capacity[d].items())))
                         for d in ids if d in a.capacity)))


class DraView:
    """The DRA GPU nodes of a world, by name (:attr:`nodes`), and what one more claim
    does to one of them (:meth:`after`). Build with :func:`dra_view`."""

    def __init__(self, world: DraWorld | None = None,
                 nodes: Mapping[str, NodeInfo] | None = None,
                 shared_resource: str = SHARED_RESOURCE,
                 memo: DraMemo | None = None) -> None:
        self.nodes: Mapping[str, DraNode] = MappingProxyType({})
        self._facts: dict[str, _NodeFacts] = {}
        self._matches: dict[tuple[str, str], Outcome] = {}
        self._mig: dict[str, DeviceClass] = {}
        self._shared: DeviceClass | None = None
        self._whole: DeviceClass | None = None
        if world is None or not world.slices or not nodes:
            return
        self._world = world
        classes = list(world.classes.values())
        for p in sorted({p.name for m in CATALOG.values() if m.mig is not None
                         for p in m.mig.profiles}):
            k = class_for(_resource_of(p), classes)
            if k is not None:
                self._mig[p] = k
        self._shared = class_for(shared_resource, classes)
        self._whole = class_for(GPU_RESOURCE, classes)
        index = SliceIndex(world.slices)
        models = _Models()
        classes_key = tuple((k.name, k.selectors) for k in self._classes())
        out: dict[str, DraNode] = {}
        judged: dict[str, _Judged] = {}
        for name in index.nodes:
            info = nodes.get(name)
            if info is None:
                continue  # slices of a node this view does not list
            node_slices = tuple(index.node_slices(name))
            labels = tuple(sorted(info.labels.items()))
            before = memo.get(name) if memo is not None else None
            if (before is not None and before.labels == labels
                    and before.classes == classes_key
                    and len(before.slices) == len(node_slices)
                    and all(a is b for a, b in zip(before.slices, node_slices, strict=True))):
                j = _Judged(node_slices, labels, classes_key, before.facts, before.device_ids)
                if before.facts is not None:
                    self._matches.update(before.facts.matches)
                    j.held = _held(j.device_ids, world.allocated)
                    if j.held == before.held:
                        j.node = before.node
            else:
                node = Node(name, info.labels)
                pools = gather_pools(node, list(node_slices))
                ids = frozenset(device_id(s.driver, s.pool, d.name) for p in pools
                                for s in (*p.slices, *p.other_slices) for d in s.devices)
                j = _Judged(node_slices, labels, classes_key,
                            self._facts_of(node, pools, models), ids)
                if j.facts is not None:
                    j.held = _held(ids, world.allocated)
            judged[name] = j
            if j.facts is None:
                continue
            self._facts[name] = j.facts
            if j.node is None:
                j.node = self._offers(j.facts, world.allocated, MappingProxyType({}), 0)
            out[name] = j.node
        self.nodes = MappingProxyType(out)
        if memo is not None:
            memo.keep(judged)

    @property
    def empty(self) -> bool:
        return not self.nodes

    def _classes(self) -> list[DeviceClass]:
        return [*self._mig.values(), *(k for k in (self._shared, self._whole)
                                        if k is not None)]

    def _facts_of(self, node: Node, pools: list[Pool], models: _Models
                  ) -> _NodeFacts | None:
        facts = _NodeFacts(node, pools, {}, {}, set(), {})
        for pool in pools:
            if not pool.usable:
                continue
            for s, d in pool.devices():
                got = models.of(d, s.driver)
                if got is None:
                    continue
                uuid, model = got
                facts.gpu_model[uuid] = model
                facts.device_gpu[device_id(s.driver, s.pool, d.name)] = uuid
                if _attr(d, s.driver, "type") == "mig":
                    facts.mig_uuids.add(uuid)
        if not facts.gpu_model:
            return None
        # Only the profiles of the node's models (a class per catalog profile would
        # cost a selector evaluation per device each).
        wanted = {p for m in set(facts.gpu_model.values())
                  if (g := get_model(m).mig) is not None for p in g.profile_names}
        facts.classes = [*(k for p, k in self._mig.items() if p in wanted),
                         *(k for k in (self._shared, self._whole) if k is not None)]
        for klass in facts.classes:
            facts.members[klass.name] = _members(pools, klass, facts.matches)
        self._matches.update(facts.matches)
        return facts

    def _offers(self, f: _NodeFacts, allocated: AllocatedState,
                declared: Mapping[str, int], taken: int) -> DraNode:
        problems: list[str] = []

        def fits(klass: DeviceClass) -> Counter[str]:
            """Per device id, how many of a burst of the class it takes."""
            got = sequential_fits(f.node, f.pools, klass, allocated, limit=_LIMIT,
                                  matches=self._matches)
            if got.stop in (Verdict.ERROR, Verdict.UNKNOWN):
                problems.append(f"{klass.name}: {got.stop.value}: {got.reason}")
            return Counter(did for did, _ in got.devices)

        def model_of(did: str) -> str | None:
            uuid = f.device_gpu.get(did)
            return None if uuid is None else f.gpu_model[uuid]

        names = set(f.gpu_model.values())
        free: dict[str, Counter[str]] = {m: Counter() for m in names}
        existing: dict[str, Counter[str]] = {m: Counter() for m in names}
        wanted = {p for m in names if (g := get_model(m).mig) is not None
                  for p in g.profile_names}
        for profile in sorted(wanted & set(self._mig)):
            klass = self._mig[profile]
            for did, n in fits(klass).items():
                if (m := model_of(did)) is not None:
                    free[m][profile] += n
            for did, _d in f.members[klass.name]:
                if (m := model_of(did)) is not None:
                    existing[m][profile] += 1
        shared_n: Counter[str] = Counter()
        room: dict[str, Counter[tuple[int, int, int]]] = {m: Counter() for m in names}
        if self._shared is not None:
            left = fits(self._shared)
            for did, d in f.members[self._shared.name]:
                if (m := model_of(did)) is None:
                    continue
                shared_n[m] += 1
                if left[did]:
                    used = allocated.capacity.get(did, {}).get("memory", Decimal(0))
                    mem = (_memory_mib(d) or 0) - int(used) // _MIB - declared.get(did, 0)
                    room[m][(mem, GPU_MILLI, left[did])] += 1
        whole_free: Counter[str] = Counter()
        whole_n: Counter[str] = Counter()
        if self._whole is not None:
            for did, n in fits(self._whole).items():
                if (m := model_of(did)) is not None:
                    whole_free[m] += n
            for did, _d in f.members[self._whole.name]:
                if (m := model_of(did)) is not None:
                    whole_n[m] += 1
        gpus = Counter(f.gpu_model.values())
        mig_gpus = Counter(f.gpu_model[u] for u in f.mig_uuids)
        offers = {m: DraModelOffer(
            model=m, gpus=gpus[m], mig_gpus=mig_gpus[m],
            mig_free=MappingProxyType(dict(free[m])),
            mig_existing=MappingProxyType(dict(existing[m])),
            shared_gpus=shared_n[m], shared_room=MappingProxyType(dict(room[m])),
            whole_free=whole_free[m], whole_gpus=whole_n[m]) for m in sorted(names)}
        return DraNode(f.node.name, MappingProxyType(offers), tuple(problems), allocated,
                       declared, taken)

    def after(self, node: DraNode, take: Take, model: str, profile: str | None = None,
              memory_mib: int = 0) -> DraNode | None:
        """``node`` once one more claim of one device of the class is allocated there,
        on a device of ``model``, where the allocator's first fit among that model's
        devices puts it (a share declaring ``memory_mib``); None when none is free."""
        f = self._facts.get(node.name)
        klass = {Take.MIG: self._mig.get(profile or ""), Take.SHARED: self._shared,
                 Take.GPU: self._whole}[take]
        if f is None or klass is None:
            return None
        got = sequential_fits(f.node, f.pools, klass, node.allocated, limit=_LIMIT,
                              matches=self._matches)
        for did, d in got.devices:
            uuid = f.device_gpu.get(did)
            if uuid is None or f.gpu_model[uuid] != model:
                continue
            a = node.allocated
            declared = dict(node.declared)
            if d.allow_multiple_allocations:
                use = dict(a.capacity.get(did, {}))
                for k, v in cap.consumption(None, d.capacity).items():
                    use[k] = use.get(k, Decimal(0)) + v
                allocated = AllocatedState(
                    a.devices, a.shared | {(did, f"gpupack-view-{node.taken}")},
                    {**a.capacity, did: use})
                declared[did] = declared.get(did, 0) + memory_mib
            else:
                allocated = AllocatedState(a.devices | {did}, a.shared, a.capacity)
            return self._offers(f, allocated, MappingProxyType(declared), node.taken + 1)
        return None


def dra_view(world: DraWorld | None, nodes: Mapping[str, NodeInfo],
             shared_resource: str = SHARED_RESOURCE,
             memo: DraMemo | None = None) -> DraView:
    """The DRA GPU nodes among ``nodes`` (by name: their labels select slices)."""
    return DraView(world, nodes, shared_resource, memo)
