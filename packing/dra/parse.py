"""The ``resource.k8s.io/v1`` objects as the API server returns them (JSON dicts) to the
values of :mod:`packing.dra.objects`: what the cache will call for every watched object.

Every bad input raises :class:`DraParseError`, whose message names the object, the field
path and the value (``ResourceSlice node-1-gpu: spec.devices[3].capacity.memory.value:
'12X' is not a quantity``); nothing is guessed. Defaults the API server applies on write
(``allocationMode: ExactCount``, ``count: 1``, a toleration's ``operator: Equal``) are
applied here too, so a hand-written object reads as the stored one would.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar

from packing.constraints import OPERATORS, Requirement, Term
from packing.dra.objects import (
    AllocatedDevice,
    Allocation,
    AllocationMode,
    AttributeValue,
    Constraint,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceCapacity,
    DeviceClass,
    DeviceRequest,
    DeviceTaint,
    DeviceTaintRule,
    DeviceToleration,
    Node,
    NodeSelector,
    Request,
    RequestPolicy,
    ResourceClaim,
    ResourceSlice,
    Semver,
    ValidRange,
    frozen_map,
)
from packing.quantity import QuantityError, parse_quantity

T = TypeVar("T")


class DraParseError(ValueError):
    """A DRA object the model cannot read; the message names the field and the value."""


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _At:
    """A position in one object: its kind and name, and the field path so far."""

    def __init__(self, what: str, path: str = "") -> None:
        self.what, self.path = what, path

    def child(self, name: str) -> _At:
        return _At(self.what, f"{self.path}.{name}" if self.path else name)

    def index(self, i: int) -> _At:
        return _At(self.what, f"{self.path}[{i}]")

    def fail(self, value: object, why: str) -> DraParseError:
        return DraParseError(f"{self.what}: {self.path or '(object)'}: {_show(value)} {why}")

    # -- typed reads --------------------------------------------------------------------

    def mapping(self, value: object, *, optional: bool = True) -> Mapping[str, Any]:
        if value is None and optional:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(value, "is not an object")
        return value

    def seq(self, value: object) -> Sequence[Any]:
        if value is None:
            return ()
        if not isinstance(value, list | tuple):
            raise self.fail(value, "is not a list")
        return value

    def string(self, value: object, *, optional: bool = False) -> str:
        if value is None and optional:
            return ""
        if not isinstance(value, str):
            raise self.fail(value, "is not a string")
        return value

    def nonempty(self, value: object) -> str:
        text = self.string(value)
        if not text:
            raise self.fail(value, "is empty")
        return text

    def boolean(self, value: object) -> bool | None:
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.fail(value, "is not a boolean")
        return value

    def integer(self, value: object, *, minimum: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(value, "is not an integer")
        if minimum is not None and value < minimum:
            raise self.fail(value, f"is below {minimum}")
        return value

    def quantity(self, value: object) -> Decimal:
        try:
            return parse_quantity(value)
        except QuantityError as e:
            raise self.fail(value, f"is not a quantity ({e})") from None

    def items(self, obj: Mapping[str, Any], key: str,
              read: Callable[[_At, Any], T]) -> tuple[T, ...]:
        at = self.child(key)
        return tuple(read(at.index(i), v) for i, v in enumerate(at.seq(obj.get(key))))

    def strings(self, obj: Mapping[str, Any], key: str) -> tuple[str, ...]:
        return self.items(obj, key, lambda at, v: at.string(v))


def _meta(obj: object, kind: str) -> tuple[Mapping[str, Any], Mapping[str, Any], str]:
    """(metadata, spec, name) of an object, or DraParseError naming what is missing."""
    root = _At(kind)
    body = root.mapping(obj, optional=False)
    meta = root.child("metadata").mapping(body.get("metadata"))
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise root.child("metadata.name").fail(name, "is not a name")
    return meta, root.child("spec").mapping(body.get("spec")), name


# --- node selection -----------------------------------------------------------------


def _requirement(at: _At, raw: object, *, fields: bool) -> Requirement:
    obj = at.mapping(raw, optional=False)
    op = at.child("operator").string(obj.get("operator"))
    allowed = ("In", "NotIn") if fields else OPERATORS
    if op not in allowed:
        raise at.child("operator").fail(op, f"is not one of {', '.join(allowed)}")
    return Requirement(at.child("key").nonempty(obj.get("key")), op,
                       at.strings(obj, "values"))


def parse_node_selector(at: _At, raw: object) -> NodeSelector | None:
    if raw is None:
        return None
    obj = at.mapping(raw, optional=False)

    def term(t_at: _At, t: object) -> Term:
        t_obj = t_at.mapping(t, optional=False)
        return Term(
            t_at.items(t_obj, "matchExpressions",
                       lambda a, r: _requirement(a, r, fields=False)),
            t_at.items(t_obj, "matchFields", lambda a, r: _requirement(a, r, fields=True)))

    return NodeSelector(at.items(obj, "nodeSelectorTerms", term))


def parse_node(obj: object) -> Node:
    """A Node's name and labels."""
    meta, _spec, name = _meta(obj, "Node")
    labels = _At(f"Node {name}", "metadata.labels").mapping(meta.get("labels"))
    return Node(name, frozen_map({str(k): str(v) for k, v in labels.items()}))


# --- ResourceSlice --------------------------------------------------------------------

_SCALAR_KINDS = ("int", "bool", "string", "version")
_LIST_KINDS = ("ints", "bools", "strings", "versions")


def _attribute(at: _At, raw: object) -> AttributeValue:
    obj = at.mapping(raw, optional=False)
    present = [k for k in (*_SCALAR_KINDS, *_LIST_KINDS) if obj.get(k) is not None]
    if len(present) != 1:
        raise at.fail(raw, "must set exactly one of " + ", ".join(_SCALAR_KINDS + _LIST_KINDS))
    kind = present[0]
    value = obj[kind]
    vat = at.child(kind)
    if kind == "int":
        return vat.integer(value)
    if kind == "bool":
        flag = vat.boolean(value)
        assert flag is not None
        return flag
    if kind == "string":
        return vat.string(value)
    if kind == "version":
        return _semver(vat, value)
    items = vat.seq(value)
    if kind == "ints":
        return tuple(vat.index(i).integer(v) for i, v in enumerate(items))
    if kind == "bools":
        return tuple(bool(vat.index(i).boolean(v)) for i, v in enumerate(items))
    if kind == "strings":
        return tuple(vat.index(i).string(v) for i, v in enumerate(items))
    return tuple(_semver(vat.index(i), v) for i, v in enumerate(items))


def _semver(at: _At, raw: object) -> Semver:
    try:
        return Semver.parse(at.string(raw))
    except ValueError:
        raise at.fail(raw, "is not a semantic version") from None


def _policy(at: _At, raw: object) -> RequestPolicy | None:
    if raw is None:
        return None
    obj = at.mapping(raw, optional=False)
    default = obj.get("default")
    valid_range = None
    if obj.get("validRange") is not None:
        r_at = at.child("validRange")
        r = r_at.mapping(obj["validRange"], optional=False)
        if r.get("min") is None:
            raise r_at.child("min").fail(None, "is required")
        valid_range = ValidRange(
            r_at.child("min").quantity(r["min"]),
            None if r.get("max") is None else r_at.child("max").quantity(r["max"]),
            None if r.get("step") is None else r_at.child("step").quantity(r["step"]))
    return RequestPolicy(
        None if default is None else at.child("default").quantity(default),
        at.items(obj, "validValues", lambda a, v: a.quantity(v)),
        valid_range)


def _counters(at: _At, raw: object) -> Mapping[str, Decimal]:
    out: dict[str, Decimal] = {}
    for name, counter in at.mapping(raw).items():
        c_at = at.child(str(name))
        out[str(name)] = c_at.child("value").quantity(
            c_at.mapping(counter, optional=False).get("value"))
    return frozen_map(out)


def _taint(at: _At, raw: object) -> DeviceTaint:
    obj = at.mapping(raw, optional=False)
    return DeviceTaint(at.child("key").nonempty(obj.get("key")),
                       at.child("value").string(obj.get("value"), optional=True),
                       at.child("effect").nonempty(obj.get("effect")))


def _device(at: _At, raw: object) -> Device:
    obj = at.mapping(raw, optional=False)
    attributes = {str(k): _attribute(at.child("attributes").child(str(k)), v)
                  for k, v in at.child("attributes").mapping(obj.get("attributes")).items()}
    capacity: dict[str, DeviceCapacity] = {}
    for k, v in at.child("capacity").mapping(obj.get("capacity")).items():
        c_at = at.child("capacity").child(str(k))
        c = c_at.mapping(v, optional=False)
        capacity[str(k)] = DeviceCapacity(c_at.child("value").quantity(c.get("value")),
                                          _policy(c_at.child("requestPolicy"),
                                                  c.get("requestPolicy")))

    def consumption(c_at: _At, c: object) -> CounterConsumption:
        c_obj = c_at.mapping(c, optional=False)
        return CounterConsumption(
            c_at.child("counterSet").nonempty(c_obj.get("counterSet")),
            _counters(c_at.child("counters"), c_obj.get("counters")),
            bool(c_at.strings(c_obj, "compatibilityGroups")))

    return Device(
        name=at.child("name").nonempty(obj.get("name")),
        attributes=frozen_map(attributes),
        capacity=frozen_map(capacity),
        consumes_counters=at.items(obj, "consumesCounters", consumption),
        node_name=at.child("nodeName").string(obj.get("nodeName"), optional=True) or None,
        all_nodes=bool(at.child("allNodes").boolean(obj.get("allNodes"))),
        node_selector=parse_node_selector(at.child("nodeSelector"), obj.get("nodeSelector")),
        taints=at.items(obj, "taints", _taint),
        binds_to_node=bool(at.child("bindsToNode").boolean(obj.get("bindsToNode"))),
        binding_conditions=at.strings(obj, "bindingConditions"),
        binding_failure_conditions=at.strings(obj, "bindingFailureConditions"),
        allow_multiple_allocations=at.child("allowMultipleAllocations").boolean(
            obj.get("allowMultipleAllocations")),
    )


def parse_resource_slice(obj: object) -> ResourceSlice:
    """A ResourceSlice from its JSON."""
    _m, spec, name = _meta(obj, "ResourceSlice")
    at = _At(f"ResourceSlice {name}", "spec")
    pool_at = at.child("pool")
    pool = pool_at.mapping(spec.get("pool"), optional=False)

    def counter_set(c_at: _At, c: object) -> CounterSet:
        c_obj = c_at.mapping(c, optional=False)
        return CounterSet(c_at.child("name").nonempty(c_obj.get("name")),
                          _counters(c_at.child("counters"), c_obj.get("counters")))

    return ResourceSlice(
        name=name,
        driver=at.child("driver").nonempty(spec.get("driver")),
        pool=pool_at.child("name").nonempty(pool.get("name")),
        generation=pool_at.child("generation").integer(pool.get("generation", 0), minimum=0),
        resource_slice_count=pool_at.child("resourceSliceCount").integer(
            pool.get("resourceSliceCount"), minimum=1),
        node_name=at.child("nodeName").string(spec.get("nodeName"), optional=True) or None,
        all_nodes=bool(at.child("allNodes").boolean(spec.get("allNodes"))),
        node_selector=parse_node_selector(at.child("nodeSelector"), spec.get("nodeSelector")),
        per_device_node_selection=bool(at.child("perDeviceNodeSelection").boolean(
            spec.get("perDeviceNodeSelection"))),
        devices=at.items(spec, "devices", _device),
        shared_counters=at.items(spec, "sharedCounters", counter_set),
    )


def parse_device_taint_rule(obj: object) -> DeviceTaintRule:
    """A DeviceTaintRule from its JSON."""
    _m, spec, name = _meta(obj, "DeviceTaintRule")
    at = _At(f"DeviceTaintRule {name}", "spec")
    sel_raw = spec.get("deviceSelector")
    sel = at.child("deviceSelector").mapping(sel_raw)

    def opt(key: str) -> str | None:
        v = sel.get(key)
        return None if v is None else at.child(f"deviceSelector.{key}").string(v)

    return DeviceTaintRule(name, _taint(at.child("taint"), spec.get("taint")),
                           opt("driver"), opt("pool"), opt("device"), sel_raw is not None)


# --- DeviceClass and ResourceClaim ----------------------------------------------------


def _selectors(at: _At, obj: Mapping[str, Any]) -> tuple[str, ...]:
    def one(s_at: _At, s: object) -> str:
        s_obj = s_at.mapping(s, optional=False)
        cel = s_at.child("cel").mapping(s_obj.get("cel"))
        if not cel:
            raise s_at.fail(s, "has no cel selector (the only kind the allocator knows)")
        return s_at.child("cel.expression").nonempty(cel.get("expression"))

    return at.items(obj, "selectors", one)


def parse_device_class(obj: object) -> DeviceClass:
    """A DeviceClass from its JSON."""
    meta, spec, name = _meta(obj, "DeviceClass")
    at = _At(f"DeviceClass {name}", "spec")
    ext = spec.get("extendedResourceName")
    return DeviceClass(
        name=name,
        selectors=_selectors(at, spec),
        extended_resource_name=None if ext is None else at.child(
            "extendedResourceName").nonempty(ext),
        creation_timestamp=_At(f"DeviceClass {name}", "metadata.creationTimestamp").string(
            meta.get("creationTimestamp"), optional=True),
        config_count=len(at.child("config").seq(spec.get("config"))),
    )


def _toleration(at: _At, raw: object) -> DeviceToleration:
    obj = at.mapping(raw, optional=False)
    op = at.child("operator").string(obj.get("operator"), optional=True) or "Equal"
    if op not in ("Equal", "Exists"):
        raise at.child("operator").fail(op, "is not Equal or Exists")
    return DeviceToleration(at.child("key").string(obj.get("key"), optional=True), op,
                            at.child("value").string(obj.get("value"), optional=True),
                            at.child("effect").string(obj.get("effect"), optional=True))


def _request(at: _At, name: str, obj: Mapping[str, Any], *, exact: bool) -> Request:
    mode = at.child("allocationMode").string(obj.get("allocationMode"), optional=True)
    mode = mode or AllocationMode.EXACT_COUNT
    if mode not in (AllocationMode.EXACT_COUNT, AllocationMode.ALL):
        raise at.child("allocationMode").fail(mode, "is not ExactCount or All")
    count = obj.get("count")
    if mode == AllocationMode.EXACT_COUNT:
        count = 1 if count is None else at.child("count").integer(count, minimum=1)
    else:
        count = 0
    capacity = None
    if obj.get("capacity") is not None:
        c_at = at.child("capacity")
        reqs = c_at.child("requests").mapping(c_at.mapping(obj["capacity"]).get("requests"))
        capacity = frozen_map({str(k): c_at.child(f"requests.{k}").quantity(v)
                               for k, v in reqs.items()})
    admin = at.child("adminAccess").boolean(obj.get("adminAccess")) if exact else None
    return Request(
        name=name,
        device_class_name=at.child("deviceClassName").nonempty(obj.get("deviceClassName")),
        selectors=_selectors(at, obj),
        allocation_mode=mode,
        count=count,
        tolerations=at.items(obj, "tolerations", _toleration),
        capacity=capacity,
        admin_access=admin,
        has_derived_attributes=bool(at.child("derivedAttributes").seq(
            obj.get("derivedAttributes"))),
    )


def _device_request(at: _At, raw: object) -> DeviceRequest:
    obj = at.mapping(raw, optional=False)
    name = at.child("name").nonempty(obj.get("name"))
    exactly, first = obj.get("exactly"), obj.get("firstAvailable")
    if (exactly is None) == (not first):
        raise at.fail(raw, "must set exactly one of exactly and firstAvailable")
    if exactly is not None:
        e_at = at.child("exactly")
        return DeviceRequest(name, _request(e_at, name, e_at.mapping(exactly), exact=True))

    def sub(s_at: _At, s: object) -> Request:
        s_obj = s_at.mapping(s, optional=False)
        return _request(s_at, s_at.child("name").nonempty(s_obj.get("name")), s_obj,
                        exact=False)

    return DeviceRequest(name, None, at.items(obj, "firstAvailable", sub))


def _constraint(at: _At, raw: object) -> Constraint:
    obj = at.mapping(raw, optional=False)
    match, distinct = obj.get("matchAttribute"), obj.get("distinctAttribute")
    if (match is None) == (distinct is None):
        raise at.fail(raw, "must set exactly one of matchAttribute and distinctAttribute")
    return Constraint(
        at.strings(obj, "requests"),
        None if match is None else at.child("matchAttribute").nonempty(match),
        None if distinct is None else at.child("distinctAttribute").nonempty(distinct))


def _allocation(at: _At, raw: object) -> Allocation | None:
    if raw is None:
        return None
    obj = at.mapping(raw, optional=False)
    devices = at.child("devices").mapping(obj.get("devices"))

    def result(r_at: _At, r: object) -> AllocatedDevice:
        r_obj = r_at.mapping(r, optional=False)
        consumed = r_obj.get("consumedCapacity")
        share = r_obj.get("shareID")
        return AllocatedDevice(
            request=r_at.child("request").nonempty(r_obj.get("request")),
            driver=r_at.child("driver").nonempty(r_obj.get("driver")),
            pool=r_at.child("pool").nonempty(r_obj.get("pool")),
            device=r_at.child("device").nonempty(r_obj.get("device")),
            admin_access=bool(r_at.child("adminAccess").boolean(r_obj.get("adminAccess"))),
            share_id=None if share is None else r_at.child("shareID").string(share),
            consumed_capacity=None if consumed is None else frozen_map({
                str(k): r_at.child(f"consumedCapacity.{k}").quantity(v)
                for k, v in r_at.child("consumedCapacity").mapping(consumed).items()}),
        )

    return Allocation(at.child("devices").items(devices, "results", result),
                      parse_node_selector(at.child("nodeSelector"), obj.get("nodeSelector")))


def parse_claim_spec(at: _At, spec: Mapping[str, Any]) -> tuple[
        tuple[DeviceRequest, ...], tuple[Constraint, ...]]:
    devices = at.child("devices").mapping(spec.get("devices"))
    d_at = at.child("devices")
    return d_at.items(devices, "requests", _device_request), d_at.items(
        devices, "constraints", _constraint)


def parse_resource_claim(obj: object) -> ResourceClaim:
    """A ResourceClaim (spec and status) from its JSON."""
    meta, spec, name = _meta(obj, "ResourceClaim")
    ns = _At(f"ResourceClaim {name}", "metadata.namespace").string(
        meta.get("namespace"), optional=True)
    what = f"ResourceClaim {ns}/{name}"
    requests, constraints = parse_claim_spec(_At(what, "spec"), spec)
    status = _At(what, "status").mapping(_At(what).mapping(obj).get("status"))
    s_at = _At(what, "status")

    def consumer(c_at: _At, c: object) -> str:
        return c_at.child("uid").string(c_at.mapping(c, optional=False).get("uid"))

    annotations = _At(what, "metadata.annotations").mapping(meta.get("annotations"))
    return ResourceClaim(
        namespace=ns,
        name=name,
        uid=_At(what, "metadata.uid").string(meta.get("uid"), optional=True),
        requests=requests,
        constraints=constraints,
        allocation=_allocation(s_at.child("allocation"), status.get("allocation")),
        reserved_for=s_at.items(status, "reservedFor", consumer),
        deleting=meta.get("deletionTimestamp") is not None,
        annotations=frozen_map({str(k): str(v) for k, v in annotations.items()}),
    )


def parse_claim_template(obj: object) -> ResourceClaim:
    """The claim a ResourceClaimTemplate makes (named after the template; the
    resourceclaim controller gives the real claim a generated name)."""
    meta, spec, name = _meta(obj, "ResourceClaimTemplate")
    ns = _At(f"ResourceClaimTemplate {name}", "metadata.namespace").string(
        meta.get("namespace"), optional=True)
    what = f"ResourceClaimTemplate {ns}/{name}"
    inner = _At(what, "spec.spec").mapping(spec.get("spec"))
    requests, constraints = parse_claim_spec(_At(what, "spec.spec"), inner)
    return ResourceClaim(ns, name, requests=requests, constraints=constraints)
