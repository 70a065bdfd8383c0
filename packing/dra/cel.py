"""The CEL that DeviceClasses and claims use in practice, evaluated as kube-scheduler
v1.37.2 evaluates a selector on one device (``k8s.io/dynamic-resource-allocation/cel``).

A selector sees one variable, ``device``, with ``driver`` (string),
``allowMultipleAllocations`` (bool), ``attributes`` and ``capacity``: maps from a domain
to a map from an attribute (capacity) name to its value. A name without a domain belongs
to the driver's domain. A domain the device does not have yields an empty map (so
``device.attributes["other.com"].x`` is a "no such key" runtime error, never a match);
``device.attributes["d"].x`` and ``device.attributes["d"]["x"]`` read one attribute; a
missing one is a runtime error.

The subset evaluated here, with CEL's semantics:

* literals: int (decimal, ``0x`` hex), double, string (single, double and triple quotes,
  ``r`` raw strings, the usual escapes), ``true``/``false``/``null``, lists ``[a, b]``;
* ``device.driver``, ``device.allowMultipleAllocations``, ``device.attributes[...]``,
  ``device.capacity[...]``, field selection and indexing of maps and lists;
* ``!``, unary ``-``, ``* / % + -`` on ints (int64 overflow, division by zero: errors) and
  doubles, ``+`` on strings and lists; ``== !=`` with CEL's heterogeneous equality
  (values of different types are unequal, ints and doubles compare numerically);
  ``< <= > >=`` on numbers, strings and bools (other types: a runtime error, as a dyn
  attribute of the wrong type is); ``in`` on lists (equality) and maps (key present);
  ``&&`` and ``||`` absorbing errors as CEL does (``false && error`` is false), ``? :``;
* ``has(m.f)`` on a map (key present; on ``device.attributes`` itself, always true, as the
  defaulting map answers every key); ``size()``; strings' ``startsWith``, ``endsWith``,
  ``contains``, ``lowerAscii``, ``upperAscii``; ``int()``, ``double()``, ``string()``;
* Kubernetes' quantity library: ``quantity(s)``, ``isQuantity(s)``, and on quantities
  ``compareTo``, ``isGreaterThan``, ``isLessThan``, ``sign``, ``isInteger``,
  ``asInteger``, ``asApproximateFloat``, ``add``, ``sub`` (capacity values are
  quantities; quantities have no ``<``: compare with ``compareTo``);
* Kubernetes' semver library: ``semver(s[, normalize])``, ``isSemver(s[, normalize])``,
  ``compareTo``, ``isGreaterThan``, ``isLessThan``, ``major``, ``minor``, ``patch``
  (``version`` attributes are semvers; NVIDIA publishes ``driverVersion``,
  ``cudaDriverVersion`` and ``cudaComputeCapability`` as such).

Everything else (comprehension macros ``all``/``exists``/``map``/``filter``, ``matches``
and other regex or string functions, maps literals, bytes, uints, timestamps, durations,
IP/CIDR/URL libraries, optionals, a negative quantity) is UNKNOWN. An unknown
subexpression is never a match: ``false && unknown`` is false, as CEL would answer
whatever the unknown part is, but ``true && unknown`` is :data:`Outcome.UNKNOWN`, and the
allocator model then answers "unknown" instead of predicting (the caller treats the node
conservatively). A syntax this parser does not know is UNKNOWN too, never an error: the
API server accepted the expression, so it is valid CEL.

The parser is :mod:`packing.dra.cel_syntax`. Static type checking is not repeated: an
expression that would not compile could not have been stored. A non-bool result is a
runtime error, as in the allocator.

Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any

from packing.dra.cel_syntax import Node, compile_expression
from packing.dra.objects import AttributeValue, Device, Semver
from packing.quantity import QuantityError, parse_quantity

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Outcome(StrEnum):
    TRUE = "true"
    FALSE = "false"
    ERROR = "error"  # a CEL runtime error: the allocator aborts with it
    UNKNOWN = "unknown"  # outside the subset: no prediction


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    detail: str = ""


# --- values --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Quantity:
    """A Kubernetes quantity in CEL (exact value)."""

    value: Decimal


@dataclass(frozen=True, slots=True)
class _Err:
    message: str


@dataclass(frozen=True, slots=True)
class _Unknown:
    reason: str


class _DefaultMap:
    """``device.attributes``/``device.capacity``: a missing domain yields an empty map."""

    def __init__(self, inner: Mapping[str, Mapping[str, Any]]) -> None:
        self.inner = inner

    def get(self, key: str) -> Mapping[str, Any]:
        return self.inner.get(key, {})


def _is_special(v: object) -> bool:
    return isinstance(v, _Err | _Unknown)


def _type_name(v: object) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "double"
    if isinstance(v, str):
        return "string"
    if v is None:
        return "null_type"
    if isinstance(v, Quantity):
        return "kubernetes.Quantity"
    if isinstance(v, Semver):
        return "kubernetes.Semver"
    if isinstance(v, tuple | list):
        return "list"
    return "map"


# --- evaluation ----------------------------------------------------------------------


def device_variables(device: Device, driver: str) -> dict[str, Any]:
    """The ``device`` variable of a selector, as the allocator builds it."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device.attributes.items():
        domain, ident = name.split("/", 1) if "/" in name else (driver, name)
        attributes.setdefault(domain, {})[ident] = _attr(value)
    capacity: dict[str, dict[str, Any]] = {}
    for name, cap in device.capacity.items():
        domain, ident = name.split("/", 1) if "/" in name else (driver, name)
        capacity.setdefault(domain, {})[ident] = Quantity(cap.value)
    return {"driver": driver,
            "allowMultipleAllocations": bool(device.allow_multiple_allocations),
            "attributes": _DefaultMap(attributes), "capacity": _DefaultMap(capacity)}


def _attr(value: AttributeValue) -> Any:
    return list(value) if isinstance(value, tuple) else value


# Verdicts by (selector, driver, device object): a device is a frozen value and a
# selector's verdict on it never changes, while the allocator asks the same ones for every
# pod on every node of the same kind. Each entry keeps its device, so its id is not reused.
_VERDICTS: dict[tuple[str, str, int], tuple[Device, Verdict]] = {}
VERDICTS_KEPT = 200_000  # past this many the table starts over


def evaluate(src: str, device: Device, driver: str) -> Verdict:
    """Whether selector ``src`` matches ``device`` of ``driver`` (memoized)."""
    key = (src, driver, id(device))
    found = _VERDICTS.get(key)
    if found is not None and found[0] is device:
        return found[1]
    verdict = _evaluate(src, device, driver)
    if len(_VERDICTS) >= VERDICTS_KEPT:
        _VERDICTS.clear()
    _VERDICTS[key] = (device, verdict)
    return verdict


def _evaluate(src: str, device: Device, driver: str) -> Verdict:
    result = _Eval({"device": device_variables(device, driver)}).eval(compile_expression(src))
    if isinstance(result, _Unknown):
        return Verdict(Outcome.UNKNOWN, result.reason)
    if isinstance(result, _Err):
        return Verdict(Outcome.ERROR, result.message)
    if not isinstance(result, bool):
        return Verdict(Outcome.ERROR, f"CEL result of type {_type_name(result)} could not be "
                                      "converted to bool")
    return Verdict(Outcome.TRUE if result else Outcome.FALSE)


def _strict(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A strict function: any error argument makes an error, else any unknown one makes
    unknown (an unknown value could only be a value or an error: the error stands)."""

    def wrapped(*args: Any) -> Any:
        errs = [a for a in args if isinstance(a, _Err)]
        if errs:
            return errs[0]
        unks = [a for a in args if isinstance(a, _Unknown)]
        if unks:
            return unks[0]
        return fn(*args)

    return wrapped


def _no_overload(name: str, *args: Any) -> _Err:
    return _Err(f"no such overload: {name}({', '.join(_type_name(a) for a in args)})")


def _int_result(v: int) -> Any:
    return v if INT64_MIN <= v <= INT64_MAX else _Err("integer overflow")


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.compare(b) == 0
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _order(op: str, a: Any, b: Any) -> Any:
    comparable = ((isinstance(a, int | float) and isinstance(b, int | float)
                   and not isinstance(a, bool) and not isinstance(b, bool))
                  or (isinstance(a, str) and isinstance(b, str))
                  or (isinstance(a, bool) and isinstance(b, bool)))
    if not comparable:
        return _no_overload(op, a, b)
    if any(isinstance(x, float) and math.isnan(x) for x in (a, b)):
        return False
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def _arith(op: str, a: Any, b: Any) -> Any:
    ints = (isinstance(a, int) and isinstance(b, int)
            and not isinstance(a, bool) and not isinstance(b, bool))
    floats = isinstance(a, float) and isinstance(b, float)
    if ints:
        if op in "/%" and b == 0:
            return _Err("division by zero" if op == "/" else "modulus by zero")
        if op == "/":
            q = abs(a) // abs(b)
            return _int_result(q if (a >= 0) == (b >= 0) else -q)  # truncates toward zero
        if op == "%":
            r = abs(a) % abs(b)
            return r if a >= 0 else -r  # the sign of the dividend, as Go's %
        return _int_result({"+": a + b, "-": a - b, "*": a * b}[op])
    if floats:
        if op == "%":
            return _no_overload(op, a, b)
        if op == "/":
            return a / b if b else (math.copysign(math.inf, a) if a else math.nan)
        return {"+": a + b, "-": a - b, "*": a * b}[op]
    if op == "+" and isinstance(a, str) and isinstance(b, str):
        return a + b
    if op == "+" and isinstance(a, list) and isinstance(b, list):
        return a + b
    return _no_overload(op, a, b)


def _parse_cel_quantity(text: str) -> Any:
    if text.strip().startswith("-"):
        return _Unknown("negative quantity")
    try:
        return Quantity(parse_quantity(text))
    except QuantityError as e:
        return _Err(f"quantities must match the regular expression ({e})")


_NORMALIZE_RE = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(.*)$")


def _parse_semver(text: str, normalize: bool) -> Semver | None:
    if normalize:
        m = _NORMALIZE_RE.match(text)
        if m is None:
            return None
        parts = [str(int(p)) if p else "0" for p in m.group(1, 2, 3)]
        text = ".".join(parts) + m.group(4)
    try:
        return Semver.parse(text)
    except ValueError:
        return None


def _sign(v: Decimal) -> int:
    return (v > 0) - (v < 0)


class _Eval:
    def __init__(self, variables: Mapping[str, Any]) -> None:
        self.variables = variables

    def eval(self, node: Node) -> Any:
        kind = node[0]
        if kind == "lit":
            return node[1]
        if kind == "unk":
            return _Unknown(node[1])
        if kind == "id":
            if node[1] in self.variables:
                return self.variables[node[1]]
            return _Unknown(f"identifier {node[1]}")
        if kind == "list":
            items = [self.eval(x) for x in node[1]]
            return _strict(lambda *xs: list(xs))(*items)
        if kind == "sel":
            return _strict(lambda x: self.select(x, node[2]))(self.eval(node[1]))
        if kind == "idx":
            return _strict(self.index)(self.eval(node[1]), self.eval(node[2]))
        if kind == "has":
            return _strict(lambda x: self.has(x, node[2]))(self.eval(node[1]))
        if kind == "un":
            return _strict(lambda x: self.unary(node[1], x))(self.eval(node[2]))
        if kind == "cond":
            c = self.eval(node[1])
            if _is_special(c):
                return c
            if not isinstance(c, bool):
                return _no_overload("_?_:_", c)
            return self.eval(node[2] if c else node[3])
        if kind == "bin":
            op = node[1]
            if op in ("&&", "||"):
                return self.logical(op, self.eval(node[2]), self.eval(node[3]))
            return _strict(lambda a, b: self.binary(op, a, b))(self.eval(node[2]),
                                                               self.eval(node[3]))
        if kind == "call":
            target = None if node[2] is None else self.eval(node[2])
            args = [self.eval(a) for a in node[3]]
            if target is None:
                return _strict(lambda *xs: self.function(node[1], list(xs)))(*args)
            return _strict(lambda t, *xs: self.method(node[1], t, list(xs)))(target, *args)
        return _Unknown(f"node {kind}")

    @staticmethod
    def logical(op: str, a: Any, b: Any) -> Any:
        absorbing = op == "||"  # true absorbs ||, false absorbs &&
        for v in (a, b):
            if isinstance(v, bool) and v == absorbing:
                return absorbing
        for v in (a, b):
            if isinstance(v, _Err):
                return v
        for v in (a, b):
            if isinstance(v, _Unknown):
                return v
        if not isinstance(a, bool) or not isinstance(b, bool):
            return _no_overload(op, a, b)
        return not absorbing

    @staticmethod
    def select(x: Any, name: str) -> Any:
        if isinstance(x, _DefaultMap):
            return x.get(name)
        if isinstance(x, dict):
            return x[name] if name in x else _Err(f"no such key: {name}")
        return _Err(f"type {_type_name(x)} does not support field selection")

    @staticmethod
    def index(x: Any, key: Any) -> Any:
        if isinstance(x, _DefaultMap):
            return x.get(key) if isinstance(key, str) else _Err(f"no such key: {key}")
        if isinstance(x, dict):
            return x[key] if isinstance(key, str) and key in x else _Err(f"no such key: {key}")
        if isinstance(x, list):
            if isinstance(key, bool) or not isinstance(key, int | float):
                return _no_overload("_[_]", x, key)
            if isinstance(key, float) and not key.is_integer():
                return _Err(f"unsupported index value {key}")
            k = int(key)
            return x[k] if 0 <= k < len(x) else _Err(f"index out of bounds: {k}")
        return _no_overload("_[_]", x, key)

    @staticmethod
    def has(x: Any, name: str) -> Any:
        if isinstance(x, _DefaultMap):
            return True  # the defaulting map finds every key
        if isinstance(x, dict):
            return name in x
        return _Err(f"invalid type for field selection: {_type_name(x)}")

    @staticmethod
    def unary(op: str, x: Any) -> Any:
        if op == "!":
            return (not x) if isinstance(x, bool) else _no_overload("!_", x)
        if isinstance(x, int) and not isinstance(x, bool):
            return _int_result(-x)
        if isinstance(x, float):
            return -x
        return _no_overload("-_", x)

    @staticmethod
    def binary(op: str, a: Any, b: Any) -> Any:
        if op == "==":
            return _equal(a, b)
        if op == "!=":
            return not _equal(a, b)
        if op in ("<", "<=", ">", ">="):
            return _order(op, a, b)
        if op == "in":
            if isinstance(b, list):
                return any(_equal(a, x) for x in b)
            if isinstance(b, _DefaultMap):
                return isinstance(a, str) and a in b.inner
            if isinstance(b, dict):
                return any(_equal(a, k) for k in b)
            return _no_overload("@in", a, b)
        return _arith(op, a, b)

    @staticmethod
    def function(name: str, args: Sequence[Any]) -> Any:
        one = len(args) == 1
        if name in ("quantity", "isQuantity") and one and isinstance(args[0], str):
            q = _parse_cel_quantity(args[0])
            if name == "quantity" or isinstance(q, _Unknown):
                return q
            return isinstance(q, Quantity)
        if name in ("semver", "isSemver") and args and isinstance(args[0], str) and (
                one or (len(args) == 2 and isinstance(args[1], bool))):
            v = _parse_semver(args[0], len(args) == 2 and bool(args[1]))
            if name == "isSemver":
                return v is not None
            return v if v is not None else _Err(f"could not parse {args[0]!r} as semver")
        if name == "size" and one:
            return _size(args[0])
        if name == "int" and one:
            return _to_int(args[0])
        if name == "double" and one:
            return _to_double(args[0])
        if name == "string" and one and isinstance(args[0], str | int | bool):
            x = args[0]
            return ("true" if x else "false") if isinstance(x, bool) else str(x)
        return _Unknown(f"function {name}()")

    @staticmethod
    def method(name: str, target: Any, args: Sequence[Any]) -> Any:
        if isinstance(target, Quantity):
            return _quantity_method(name, target, args)
        if isinstance(target, Semver):
            return _semver_method(name, target, args)
        if isinstance(target, str):
            if name in ("startsWith", "endsWith", "contains") and len(args) == 1:
                if not isinstance(args[0], str):
                    return _no_overload(name, target, *args)
                test = {"startsWith": target.startswith, "endsWith": target.endswith,
                        "contains": target.__contains__}[name]
                return test(args[0])
            if name in ("lowerAscii", "upperAscii") and not args:
                return "".join((c.lower() if name == "lowerAscii" else c.upper())
                               if c.isascii() else c for c in target)
        if name == "size" and not args:
            return _size(target)
        return _Unknown(f"method {name}() on {_type_name(target)}")


def _size(x: Any) -> Any:
    if isinstance(x, str | list | dict):
        return len(x)
    return _no_overload("size", x)


def _to_int(x: Any) -> Any:
    if isinstance(x, bool):
        return _no_overload("int", x)
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x) or not INT64_MIN <= x <= INT64_MAX:
            return _Err("double is out of range for int")
        return int(x)
    if isinstance(x, str) and re.fullmatch(r"[+-]?\d+", x):
        return _int_result(int(x))
    if isinstance(x, str):
        return _Err(f"cannot convert {x!r} to int")
    return _no_overload("int", x)


def _to_double(x: Any) -> Any:
    if isinstance(x, int | float) and not isinstance(x, bool):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return _Err(f"cannot convert {x!r} to double")
    return _no_overload("double", x)


def _quantity_method(name: str, q: Quantity, args: Sequence[Any]) -> Any:
    if not args:
        if name == "sign":
            return _sign(q.value)
        if name == "isInteger":
            return q.value == q.value.to_integral_value() and abs(q.value) <= INT64_MAX
        if name == "asInteger":
            if q.value != q.value.to_integral_value() or abs(q.value) > INT64_MAX:
                return _Err("cannot convert value to integer")
            return int(q.value)
        if name == "asApproximateFloat":
            return float(q.value)
        return _Unknown(f"method {name}() on a quantity")
    if len(args) != 1:
        return _Unknown(f"method {name}() on a quantity")
    other = args[0]
    if name in ("add", "sub"):
        if isinstance(other, int) and not isinstance(other, bool):
            other = Quantity(Decimal(other))
        if not isinstance(other, Quantity):
            return _no_overload(name, q, other)
        out = q.value + other.value if name == "add" else q.value - other.value
        return Quantity(out) if out >= 0 else _Unknown("negative quantity")
    if not isinstance(other, Quantity):
        return _no_overload(name, q, other)
    c = _sign(q.value - other.value)
    return {"compareTo": c, "isGreaterThan": c > 0, "isLessThan": c < 0}.get(
        name, _Unknown(f"method {name}() on a quantity"))


def _semver_method(name: str, v: Semver, args: Sequence[Any]) -> Any:
    if not args and name in ("major", "minor", "patch"):
        return {"major": v.major, "minor": v.minor, "patch": v.patch}[name]
    if len(args) == 1 and name in ("compareTo", "isGreaterThan", "isLessThan"):
        if not isinstance(args[0], Semver):
            return _no_overload(name, v, args[0])
        c = v.compare(args[0])
        return {"compareTo": c, "isGreaterThan": c > 0, "isLessThan": c < 0}[name]
    return _Unknown(f"method {name}() on a semver")
