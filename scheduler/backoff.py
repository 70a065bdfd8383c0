"""The one back-off rule of the control loops: a wait that doubles per failure in a row,
up to a cap (the planner's solves, the memo warmer, the MIG actuator's nodes,
defragmentation's evictions).

The exponent is capped too: ``2.0 ** 1024`` raises OverflowError, and a lasting fault
counted past a thousand failures would otherwise end the thread that computes the wait
(the planner's did, after 17 hours at 60 s each). 2^64 exceeds any cap in use, so the
waits are the same."""

from __future__ import annotations

MAX_DOUBLINGS = 64


def doubling(base_s: float, failures: int, cap_s: float) -> float:
    """``base_s`` after the first failure (or none), doubled per further failure, at most
    ``cap_s``."""
    return min(cap_s, base_s * 2.0 ** min(max(failures - 1, 0), MAX_DOUBLINGS))


__all__ = ["MAX_DOUBLINGS", "doubling"]
