"""MIG compaction's settings as command-line flags, declared once for every command that
takes them: ``gpupack serve``'s ``--mig-compact-*`` and ``bench/mig.py``'s ``--compact-*``
(the same flags under another prefix, so the bench runs the shipped settings).

:func:`add_compact_flags` declares them, :func:`compact_flag_error` checks them (the
message names the flag and the value), :func:`compact_settings` builds
:class:`scheduler.mig.compact.decide.CompactSettings` from them. The parsed attributes
are the flag's name with dashes as underscores (``--mig-compact-min-age`` ->
``mig_compact_min_age``), as argparse names them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from scheduler.mig.compact.decide import DEFAULT_COMPACT, CompactSettings


@dataclass(frozen=True)
class CompactFlag:
    name: str  # after the prefix
    field: str  # of CompactSettings
    kind: type  # int, float or bool (a --[no-] switch)
    least: float  # smallest accepted value (bool: unused)
    help: str  # "{default}" is replaced by the default


FLAGS: tuple[CompactFlag, ...] = (
    CompactFlag("evictions-per-hour", "evictions_per_hour", int, 1,
                "accepted evictions in any hour (default {default})"),
    CompactFlag("min-age", "min_pod_age_s", float, 0,
                "seconds a pod must have run on its slice before it is moved (default "
                "{default})"),
    CompactFlag("max-pods", "max_pods", int, 1,
                "most pods evicted to empty one GPU (default {default})"),
    CompactFlag("min-excess", "min_excess", int, 1,
                "act on a GPU model only while its MIG GPUs in use exceed the slice bound "
                "of their pods by this many (default {default})"),
    CompactFlag("dynamic-min-excess", "dynamic_min_excess", int, 1,
                "DynamicMIG GPUs (DRA nodes): the excess of GPUs in use over the slice "
                "bound that pays for a drain (default {default})"),
    CompactFlag("dynamic-evictions-per-hour", "dynamic_evictions_per_hour", int, 1,
                "a drain of a DynamicMIG GPU starts while accepted evictions in any hour "
                "stay under this (default {default})"),
    CompactFlag("kept-mode-max-pods", "kept_mode_max_pods", int, 1,
                "most pods evicted to empty a DynamicMIG GPU that stays in MIG mode once "
                "empty (A100, A30; default {default})"),
    CompactFlag("kept-mode-min-age", "kept_mode_min_pod_age_s", float, 0,
                "seconds a pod must have run on such a GPU before it is moved (default "
                "{default})"),
    CompactFlag("keep-room", "keep_room", bool, 0,
                "empty a DynamicMIG GPU that leaves MIG mode once empty (Hopper) only while "
                "the model's other GPUs in use keep room for a pod of every profile in use "
                "(default {default})"),
    CompactFlag("steer-margin", "dynamic_steer_margin", int, 0,
                "DynamicMIG nodes: keep the DRA allocator off the MIG devices of idle GPUs "
                "(DeviceTaintRules) for a profile while the node's GPUs in MIG mode have "
                "room for at least this many more of it; 0: never (default {default})"),
    CompactFlag("steer-keep", "dynamic_steer_keep", int, 0,
                "once up, such fences stay while the room is at least this many (1 up to "
                "the margin: fewer DeviceTaintRule writes; 0: the margin; default "
                "{default})"),
)


def _dest(prefix: str, flag: CompactFlag) -> str:
    return (prefix + flag.name).lstrip("-").replace("-", "_")


def _default_text(flag: CompactFlag) -> str:
    value = getattr(DEFAULT_COMPACT, flag.field)
    if flag.kind is bool:
        return "on" if value else "off"
    return f"{value:g}" if flag.kind is float else str(value)


def add_compact_flags(p: argparse.ArgumentParser, prefix: str, help_prefix: str) -> None:
    """Declare every flag as ``<prefix><name>`` (``prefix``: ``--mig-compact-`` or
    ``--compact-``), its help led by ``help_prefix``, its default the shipped one."""
    for f in FLAGS:
        default = getattr(DEFAULT_COMPACT, f.field)
        text = help_prefix + f.help.format(default=_default_text(f))
        if f.kind is bool:
            p.add_argument(prefix + f.name, action=argparse.BooleanOptionalAction,
                           default=default, help=text)
        else:
            p.add_argument(prefix + f.name, type=f.kind, default=default, help=text)


def compact_flag_error(ns: Any, prefix: str) -> str | None:
    """The first flag out of range, as a message naming it and its value; None if all
    are in range."""
    for f in FLAGS:
        if f.kind is bool:
            continue
        value = getattr(ns, _dest(prefix, f))
        if value < f.least:
            return (f"{prefix}{f.name} {value}: must be "
                    + (f"at least {f.least:g}" if f.least else "0 or positive"))
    keep, margin = (getattr(ns, prefix.lstrip("-").replace("-", "_") + name)
                    for name in ("steer_keep", "steer_margin"))
    if keep > margin > 0:
        return (f"{prefix}steer-keep {keep}: must be at most {prefix}steer-margin "
                f"({margin}): fences stay up down to the keep, and go up at the margin")
    return None


def compact_settings(ns: Any, prefix: str) -> CompactSettings:
    """The parsed flags as compaction's settings."""
    return CompactSettings(**{f.field: getattr(ns, _dest(prefix, f)) for f in FLAGS})


__all__ = ["FLAGS", "CompactFlag", "add_compact_flags", "compact_flag_error",
           "compact_settings"]
