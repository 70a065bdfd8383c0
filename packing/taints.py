"""A taint, of a node (``spec.taints[]``) or of a DRA device (``spec.devices[].taints[]``,
or a DeviceTaintRule's): the fields and matching rules of both are the same
(``resourceclaim.ToleratesTaint`` is a copy of core/v1's). Its own module so that
:mod:`packing.model` and :mod:`packing.dra` can both read it without importing each
other.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Taint:
    """A taint: only NoSchedule and NoExecute keep pods (and claims) off."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"
