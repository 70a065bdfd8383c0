"""Why something was refused, as a value: a code, the check that refused, and reasons.

Modelled on kube-scheduler's framework ``Status`` (a code such as ``Unschedulable`` or
``UnschedulableAndUnresolvable``, reasons, and the plugin that failed): callers branch on
the code and the check, never on the wording of a reason, and print the reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Code(StrEnum):
    # No room now; may fit once other pods leave or move.
    UNSCHEDULABLE = "Unschedulable"
    # Cannot fit whatever other pods do (no node of the kind, no domain at all).
    UNRESOLVABLE = "UnschedulableAndUnresolvable"
    # Not judged: the answer depends on something gpupack has not seen yet (its watch is
    # behind kube-scheduler's informer). Not a verdict on the pod: kube-scheduler retries
    # it after its backoff, as it does for any scheduling error.
    ERROR = "Error"


@dataclass(frozen=True)
class Status:
    code: Code
    check: str  # the check that refused, a name from the module that made the Status
    reasons: tuple[str, ...]

    @staticmethod
    def unschedulable(check: str, *reasons: str) -> Status:
        return Status(Code.UNSCHEDULABLE, check, reasons)

    @staticmethod
    def unresolvable(check: str, *reasons: str) -> Status:
        return Status(Code.UNRESOLVABLE, check, reasons)

    @staticmethod
    def error(check: str, *reasons: str) -> Status:
        return Status(Code.ERROR, check, reasons)

    @property
    def message(self) -> str:
        return "; ".join(self.reasons)

    def __str__(self) -> str:
        return self.message
