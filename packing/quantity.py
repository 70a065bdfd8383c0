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


def parse_quantity(value: object) -> Decimal:
    """The quantity as a Decimal in base units; QuantityError names the bad value."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity")
    m = _RE.match(value.strip())
    if not m:
        raise QuantityError(f"{value!r} is not a quantity (expected e.g. 500m, 8Gi, 2)")
    try:
        number = Decimal(m.group(1))
    except InvalidOperation:
        raise QuantityError(f"{value!r} is not a quantity") from None
    if number < 0:
        raise QuantityError(f"{value!r} is negative")
    return number * _SUFFIX[m.group(2) or ""]


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
