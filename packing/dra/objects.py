"""What kube-scheduler's DRA allocator reads, as small frozen values.

The ``resource.k8s.io/v1`` objects (ResourceSlice, DeviceClass, ResourceClaim,
DeviceTaintRule) reduced to the fields the structured-parameters allocator of
Kubernetes v1.37.2 looks at; :mod:`packing.dra.parse` builds them from the API's JSON.
Names follow the API (``consumesCounters`` is :attr:`Device.consumes_counters`).
Quantities are exact :class:`~decimal.Decimal` values in base units (bytes, counts),
as Kubernetes compares them exactly.

Attribute names are kept as the driver wrote them: a name without a domain
(``productName``) belongs to the driver's domain (``gpu.nvidia.com/productName``), as
the allocator's ``lookupAttribute`` and CEL's ``device.attributes[domain]`` read it.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from types import MappingProxyType
from typing import Any, TypeVar

from packing.constraints import Term, Toleration, term_matches
from packing.taints import Taint

ALLOCATION_RESULTS_MAX_SIZE = 32  # resourceapi.AllocationResultsMaxSize
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
DEVICE_CLASS_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"
V = TypeVar("V")


def frozen_map(items: Mapping[str, V]) -> Mapping[str, V]:
    """A read-only copy (frozen dataclasses hold mappings, never dicts)."""
    return MappingProxyType(dict(items))


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


# --- attribute values ----------------------------------------------------------------

_SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$")


@dataclass(frozen=True, slots=True)
class Semver:
    """A semantic version (semver 2.0.0), as ``blang/semver`` parses and orders it: the
    type of a ``version`` attribute and of CEL's ``semver()``. Build metadata is kept but
    never ordered (``1.0.0+a`` equals ``1.0.0+b``)."""

    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()
    build: str = ""

    @staticmethod
    def parse(text: str) -> Semver:
        """ValueError when ``text`` is not strict semver (no ``v``, no leading zeros)."""
        m = _SEMVER_RE.match(text)
        if m is None:
            raise ValueError(f"{text!r} is not a semantic version (MAJOR.MINOR.PATCH)")
        pre: tuple[int | str, ...] = ()
        if m.group(4):
            pre = tuple(int(p) if p.isdigit() else p for p in m.group(4).split("."))
        return Semver(int(m.group(1)), int(m.group(2)), int(m.group(3)), pre, m.group(5) or "")

    def compare(self, other: Semver) -> int:
        """-1, 0 or 1, by semver precedence (a pre-release sorts before its release)."""
        a = (self.major, self.minor, self.patch)
        b = (other.major, other.minor, other.patch)
        if a != b:
            return -1 if a < b else 1
        if self.pre == other.pre:
            return 0
        if not self.pre or not other.pre:
            return 1 if not self.pre else -1
        for x, y in zip(self.pre, other.pre, strict=False):
            if x == y:
                continue
            if isinstance(x, int) and isinstance(y, int):
                return -1 if x < y else 1
            if isinstance(x, int) != isinstance(y, int):
                return -1 if isinstance(x, int) else 1  # numeric identifiers sort first
            return -1 if str(x) < str(y) else 1
        return -1 if len(self.pre) < len(other.pre) else 1

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(str(p) for p in self.pre)
        return text + (f"+{self.build}" if self.build else "")


# One attribute value: ``int``, ``bool``, ``string`` or ``version``; the list forms
# (``ints`` ...) of the alpha DRAListTypeAttributes gate are tuples.
AttributeValue = (int | bool | str | Semver | tuple[int, ...] | tuple[bool, ...]
                  | tuple[str, ...] | tuple[Semver, ...])


def same_attribute(a: AttributeValue, b: AttributeValue) -> bool:
    """The allocator's ``matchAttribute`` equality: same kind and same value (``1`` never
    equals ``True``; versions by their exact text, as semver's minimal form makes text
    equality exact). List values never match (unknown type, with the list gate off)."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return False
    if type(a) is not type(b):
        return False
    if isinstance(a, Semver):
        return str(a) == str(b)
    return a == b


# --- devices and slices --------------------------------------------------------------


# A device taint (``spec.devices[].taints[]``, or a DeviceTaintRule's taint) and a
# request's toleration have the fields and the matching rules of node taints and pod
# tolerations (``resourceclaim.ToleratesTaint`` is a copy of core/v1's): empty effect and
# empty key match all, ``Exists`` ignores the value, ``Equal`` needs it. Only
# ``NoSchedule`` and ``NoExecute`` keep a device from a request; ``tolerationSeconds``
# never matters to allocation.
DeviceTaint = Taint
DeviceToleration = Toleration


@dataclass(frozen=True, slots=True)
class ValidRange:
    minimum: Decimal
    maximum: Decimal | None = None
    step: Decimal | None = None


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """``capacity[].requestPolicy`` (KEP-5075): what a claim consumes of a shared
    device's capacity when it asks for none (``default``), and which amounts it may
    consume (``validValues`` sorted ascending, or ``validRange``)."""

    default: Decimal | None = None
    valid_values: tuple[Decimal, ...] = ()
    valid_range: ValidRange | None = None


@dataclass(frozen=True, slots=True)
class DeviceCapacity:
    value: Decimal
    request_policy: RequestPolicy | None = None


@dataclass(frozen=True, slots=True)
class CounterConsumption:
    """``consumesCounters[]``: what the device takes of one counter set of its pool."""

    counter_set: str
    counters: Mapping[str, Decimal]
    uses_compatibility_groups: bool = False


@dataclass(frozen=True, slots=True)
class CounterSet:
    """``sharedCounters[]``: a named set of counters of a pool (KEP-4815)."""

    name: str
    counters: Mapping[str, Decimal]


@dataclass(frozen=True, slots=True)
class NodeSelector:
    """A ``v1.NodeSelector``: terms ORed, an empty term matches nothing."""

    terms: tuple[Term, ...]

    def matches(self, node: Node) -> bool:
        return any(term_matches(t, node.name, node.labels) for t in self.terms)


@dataclass(frozen=True, slots=True)
class Node:
    """What node selection reads of a Node: its name and labels."""

    name: str
    labels: Mapping[str, str] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class Device:
    """One entry of ``spec.devices``."""

    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=_empty)
    capacity: Mapping[str, DeviceCapacity] = field(default_factory=_empty)
    consumes_counters: tuple[CounterConsumption, ...] = ()
    node_name: str | None = None
    all_nodes: bool = False
    node_selector: NodeSelector | None = None
    taints: tuple[DeviceTaint, ...] = ()
    binds_to_node: bool = False
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    allow_multiple_allocations: bool | None = None


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    """A ResourceSlice: some devices (or counter sets) of one pool of one driver."""

    name: str
    driver: str
    pool: str
    generation: int
    resource_slice_count: int
    node_name: str | None = None
    all_nodes: bool = False
    node_selector: NodeSelector | None = None
    per_device_node_selection: bool = False
    devices: tuple[Device, ...] = ()
    shared_counters: tuple[CounterSet, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceTaintRule:
    """A DeviceTaintRule: its taint added to every device the selector names (a missing
    driver, pool or device matches all; no selector matches none)."""

    name: str
    taint: DeviceTaint
    driver: str | None = None
    pool: str | None = None
    device: str | None = None
    has_selector: bool = True

    def selects(self, driver: str, pool: str, device: str) -> bool:
        return self.has_selector and all(
            want is None or want == have
            for want, have in ((self.driver, driver), (self.pool, pool), (self.device, device)))


# --- classes and claims --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceClass:
    """A DeviceClass: CEL selectors every device of the class must pass, and the
    extended resource (KEP-5004) a pod may ask for instead of a claim."""

    name: str
    selectors: tuple[str, ...] = ()
    extended_resource_name: str | None = None
    creation_timestamp: str = ""  # RFC 3339; decides which class owns a resource name
    config_count: int = 0  # opaque configurations (copied into allocations, no effect here)


class AllocationMode(StrEnum):
    EXACT_COUNT = "ExactCount"
    ALL = "All"


@dataclass(frozen=True, slots=True)
class Request:
    """``exactly`` of a request, or one ``firstAvailable`` subrequest: the shape the
    allocator's ``requestAccessor`` reads. ``admin_access`` is None when unset (always
    for subrequests)."""

    name: str
    device_class_name: str
    selectors: tuple[str, ...] = ()
    allocation_mode: str = AllocationMode.EXACT_COUNT
    count: int = 1
    tolerations: tuple[DeviceToleration, ...] = ()
    capacity: Mapping[str, Decimal] | None = None  # capacity.requests; None when unset
    admin_access: bool | None = None
    has_derived_attributes: bool = False


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """``spec.devices.requests[]``: exactly one of ``exactly`` and ``first_available``."""

    name: str
    exactly: Request | None = None
    first_available: tuple[Request, ...] = ()


@dataclass(frozen=True, slots=True)
class Constraint:
    """``spec.devices.constraints[]``: ``matchAttribute`` or ``distinctAttribute`` over
    the named requests (all when empty)."""

    requests: tuple[str, ...] = ()
    match_attribute: str | None = None
    distinct_attribute: str | None = None


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """``status.allocation.devices.results[]``."""

    request: str  # "req" or "req/sub"
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    consumed_capacity: Mapping[str, Decimal] | None = None


@dataclass(frozen=True, slots=True)
class Allocation:
    results: tuple[AllocatedDevice, ...]
    node_selector: NodeSelector | None = None


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    """A ResourceClaim (or the claim of a ResourceClaimTemplate, with no name yet)."""

    namespace: str
    name: str
    uid: str = ""
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    allocation: Allocation | None = None
    reserved_for: tuple[str, ...] = ()  # consumer UIDs
    deleting: bool = False
    annotations: Mapping[str, str] = field(default_factory=_empty)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def device_id(driver: str, pool: str, device: str) -> str:
    """``driver/pool/device``, the allocator's DeviceID as text."""
    return f"{driver}/{pool}/{device}"
