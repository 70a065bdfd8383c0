"""Kubernetes resource quantities ("500m", "8Gi", "1.5", "2e3") to numbers."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIX = {
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_RE = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


class QuantityError(ValueError):
    """Not a Kubernetes quantity."""


# The largest quantity accepted, in base units: Kubernetes keeps quantities as int64
# (with a scale), so anything larger cannot come from a real object. Checking the
# magnitude first also keeps a hostile "1e999999" from costing seconds of CPU (an int()
# of a million digits) or overflowing Decimal's exponent range.
MAX_QUANTITY = Decimal(2**63 - 1)
_MAX_EXPONENT = 20  # 10**20 > MAX_QUANTITY; with the largest suffix (2**60) below 10**40


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_quantity(value: object) -> Decimal:
    """The quantity as a Decimal in base units; QuantityError names the bad value."""
    if isinstance(value, bool):
        raise QuantityError(f"{_show(value)} is not a quantity")
    if isinstance(value, int | float):
        try:
            number = Decimal(str(value))
        except InvalidOperation:
            raise QuantityError(f"{_show(value)} is not a quantity") from None
        suffix = Decimal(1)
    elif isinstance(value, str):
        m = _RE.match(value.strip())
        if not m:
            raise QuantityError(
                f"{_show(value)} is not a quantity (expected e.g. 500m, 8Gi, 2)")
        try:
            number = Decimal(m.group(1))
        except InvalidOperation:
            raise QuantityError(f"{_show(value)} is not a quantity") from None
        suffix = _SUFFIX[m.group(2) or ""]
    else:
        raise QuantityError(f"{_show(value)} is not a quantity")
    if not number.is_finite():
        raise QuantityError(f"{_show(value)} is not a finite quantity")
    if number < 0:
        raise QuantityError(f"{_show(value)} is negative")
    if number and number.adjusted() > _MAX_EXPONENT:
        raise QuantityError(f"{_show(value)} is out of range (at most 2^63-1)")
    out = number * suffix
    if out > MAX_QUANTITY:
        raise QuantityError(f"{_show(value)} is out of range (at most 2^63-1)")
    return out


def cpu_milli(value: object) -> int:
    """CPU quantity in millicores, rounded up as the kubelet does."""
    return int((parse_quantity(value) * 1000).to_integral_value(rounding="ROUND_CEILING"))


def memory_mib(value: object) -> int:
    """Memory quantity in MiB, rounded up."""
    q = parse_quantity(value) / Decimal(2**20)
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def count(value: object) -> int:
    """An integer count of an extended resource ("1", 2)."""
    q = parse_quantity(value)
    if q != q.to_integral_value():
        raise QuantityError(f"{value!r} is not a whole number")
    return int(q)
