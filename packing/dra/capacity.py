"""Consumable capacity (KEP-5075) as kube-scheduler v1.37.2's allocator computes it: what
one allocation takes of a device's capacity, and whether it still fits.

For every capacity of the device, the amount consumed is:

* the request's amount, rounded up by the capacity's ``requestPolicy``: below
  ``validRange.min`` it becomes ``min``; with a ``step``, it is rounded up to
  ``min + k * step``; with ``validValues`` to the first value not below it (a request
  above the largest stays as asked, and then violates the policy);
* with no request for that capacity, the policy's ``default``, else the whole value.

The allocation fits when no amount violates the policy (above ``validRange.max``, off
the step grid, not one of ``validValues``; the ``default`` itself always passes) and,
for every capacity, what allocated claims consume plus what this attempt already took
plus the new amount stays within the value. A request naming a capacity the device does
not have never fits that device.

Integer arithmetic (DRAFractionalCapacityRange off, its default at v1.37.2: the gate
defaults on only with ``--min-compatibility-version`` 1.37, and the binaries default to
1.36): ``min``, ``step`` and the request are rounded up to whole units before rounding
to the step, as ``Quantity.Value()`` does.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal

from packing.dra.objects import DeviceCapacity, RequestPolicy, ValidRange


def _whole(q: Decimal) -> int:
    """``Quantity.Value()``: rounded up to an integer."""
    return int(q.to_integral_value(rounding=ROUND_CEILING))


def _go_rem(a: int, b: int) -> int:
    """Go's ``%``: the sign of the dividend."""
    r = abs(a) % abs(b)
    return r if a >= 0 else -r


def _round_range(requested: Decimal, r: ValidRange) -> Decimal:
    if requested < r.minimum:
        return r.minimum
    if r.step is None:
        return requested
    step, low = _whole(r.step), _whole(r.minimum)
    added = _whole(requested) - low
    n = added // step if added >= 0 else -(-added // step)
    if _go_rem(added, step) != 0:
        n += 1
    return Decimal(low + step * n)


def consumed_amount(requested: Decimal | None, cap: DeviceCapacity) -> Decimal:
    """What one allocation takes of a capacity (``calculateConsumedCapacity``)."""
    policy = cap.request_policy
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return cap.value
    if policy is None:
        return requested
    if policy.valid_range is not None:
        return _round_range(requested, policy.valid_range)
    if policy.valid_values:
        for v in policy.valid_values:
            if requested <= v:
                return v
    return requested


def violates_policy(amount: Decimal, policy: RequestPolicy | None) -> bool:
    if policy is None:
        return False
    if policy.default is not None and amount == policy.default:
        return False
    r = policy.valid_range
    if r is not None:
        if r.maximum is not None and amount > r.maximum:
            return True
        if r.step is not None:
            return _go_rem(_whole(amount) - _whole(r.minimum), _whole(r.step)) != 0
        return False
    if policy.valid_values:
        return all(amount != v for v in policy.valid_values)
    return False


def consumption(requests: Mapping[str, Decimal] | None,
                capacity: Mapping[str, DeviceCapacity]) -> dict[str, Decimal]:
    """What one allocation of a device takes of each of its capacities
    (``GetConsumedCapacityFromRequest``): every capacity, asked or not."""
    asked = requests or {}
    return {name: consumed_amount(asked.get(name), cap) for name, cap in capacity.items()}


def fits(requests: Mapping[str, Decimal] | None, capacity: Mapping[str, DeviceCapacity],
         allocated: Mapping[str, Decimal], allocating: Mapping[str, Decimal]) -> bool:
    """``CmpRequestOverCapacity``: whether one more allocation fits on top of
    ``allocated`` (claims in the API) and ``allocating`` (this attempt)."""
    if requests and any(name not in capacity for name in requests):
        return False
    for name, amount in consumption(requests, capacity).items():
        cap = capacity[name]
        if violates_policy(amount, cap.request_policy):
            return False
        total = allocated.get(name, Decimal(0)) + amount + allocating.get(name, Decimal(0))
        if total > cap.value:
            return False
    return True
