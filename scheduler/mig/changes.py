"""The MIG actuator's changes in flight and its node back-offs, as values and as the JSON
kept beside the mig-parted entries in the ConfigMap (:mod:`kube.mig.api`), so that a new
leader reads them back: :class:`Change`, :class:`Backoff`, :func:`changes_json`,
:func:`changes_from_json`, :func:`backoff_from_json`. Reading back never raises: an
entry that cannot be read is one line of the problems returned.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from packing.mig.plan import WHOLE

CONFIG_PREFIX = "gpupack-"  # names of the mig-parted entries gpupack writes
Target = tuple[tuple[str, int], ...] | str  # instance counts per profile, or WHOLE


@dataclass(frozen=True)
class Change:
    """A layout change handed to the MIG manager (kept in the ConfigMap, see kube.mig.api)."""

    node: str
    config: str  # the mig-parted entry, and the value of nvidia.com/mig.config
    targets: tuple[tuple[int, Target], ...]  # GPU index -> its new layout
    models: tuple[str, ...]
    started: float
    # Every GPU's layout after the change, sorted (a multiset): how the change is
    # recognised on a node whose per-GPU detail is inferred from allocatable counts (no
    # node agent), where the indices the extender guesses need not be the MIG manager's.
    expected: tuple[Target, ...] = ()
    # When the node's config label was set; None: the entry is written and the label
    # waits for it to reach the MIG manager (MigSettings.config_propagation_s).
    labelled_at: float | None = None
    # The change switches a GPU's MIG mode: mig-parted then clears every MIG GPU of the
    # node and may reset them all, so every GPU of the node is held until it is done.
    node_wide: bool = False

    def target(self, index: int) -> Target | None:
        return next((t for i, t in self.targets if i == index), None)

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "config": self.config, "started": self.started,
                "labelled_at": self.labelled_at, "node_wide": self.node_wide,
                "models": list(self.models),
                "targets": [{"gpu": i, "layout": _layout_json(t)} for i, t in self.targets],
                "expected": [_layout_json(t) for t in self.expected]}

    @classmethod
    def from_json(cls, raw: object) -> Change:
        """ValueError naming the field when ``raw`` is not a change this module wrote."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"change: expected an object, got {type(raw).__name__}")
        if "started" not in raw:
            raise ValueError("change: missing field 'started'")
        started = _time(raw["started"], "started")
        # Written before labels waited for the entry: labelled as it started.
        raw_at = raw.get("labelled_at", started)
        labelled_at = None if raw_at is None else _time(raw_at, "labelled_at")
        try:
            node, config = str(raw["node"]), str(raw["config"])
            models = tuple(str(m) for m in raw["models"])
            targets = [(int(t["gpu"]), _layout_of(t["layout"], "targets[].layout"))
                       for t in raw["targets"]]
            expected = tuple(_layout_of(t, "expected[]") for t in raw.get("expected", ()))
        except (KeyError, TypeError) as e:
            raise ValueError(f"change: missing or malformed field {e}") from None
        if not node or not config.startswith(CONFIG_PREFIX):
            raise ValueError(f"change: node {node!r} / config {config!r} not gpupack's")
        node_wide = raw.get("node_wide", False)
        if not isinstance(node_wide, bool):
            raise ValueError(f"change: node_wide {node_wide!r} is not true or false")
        return cls(node, config, tuple(targets), models, started, expected, labelled_at,
                   node_wide)


def _time(raw: object, name: str) -> float:
    """A time field of a change read back: a finite number, else ValueError naming it."""
    try:
        t = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        t = math.nan
    if not math.isfinite(t):
        raise ValueError(f"change: {name} {raw!r} is not a time")
    return t


def _layout_json(t: Target) -> object:
    return t if isinstance(t, str) else dict(t)


def _layout_of(layout: object, where: str) -> Target:
    if layout == WHOLE:
        return WHOLE
    if isinstance(layout, Mapping):
        return tuple(sorted((str(p), int(n)) for p, n in layout.items() if int(n) > 0))
    raise ValueError(f"{where}: {layout!r} is not {WHOLE!r} or an object of counts")


@dataclass(frozen=True)
class Backoff:
    until: float
    failures: int


def changes_json(changes: Mapping[str, Change],
                 backoff: Mapping[str, Backoff] | None = None) -> str:
    """The changes in flight, and the nodes backed off, as one JSON list: a backoff is an
    item ``{"backoff": {"node", "until", "failures"}}`` beside the changes (a version
    that does not know it skips it as one unreadable item and reads the changes)."""
    items: list[object] = [c.to_json() for _, c in sorted(changes.items())]
    items += [{"backoff": {"node": n, "until": b.until, "failures": b.failures}}
              for n, b in sorted((backoff or {}).items())]
    return json.dumps(items, sort_keys=True)


def _items(text: str) -> tuple[list[object], list[str]]:
    try:
        raw = json.loads(text) if text.strip() else []
    except (json.JSONDecodeError, RecursionError) as e:
        return [], [f"in-flight changes: not JSON ({e})"]
    if not isinstance(raw, list):
        return [], [f"in-flight changes: expected a list, got {type(raw).__name__}"]
    return raw, []


def changes_from_json(text: str) -> tuple[dict[str, Change], list[str]]:
    """Changes read back (e.g. by a new leader), and one line per unreadable entry."""
    out: dict[str, Change] = {}
    raw, problems = _items(text)
    for i, item in enumerate(raw):
        if isinstance(item, Mapping) and "backoff" in item:
            continue  # backoff_from_json's
        try:
            c = Change.from_json(item)
        except ValueError as e:
            problems.append(f"in-flight changes[{i}]: {e}")
            continue
        out[c.node] = c
    return out, problems


def backoff_from_json(text: str) -> tuple[dict[str, Backoff], list[str]]:
    """The nodes backed off, read back with the changes (so a new leader does not retry
    at once a node whose change just failed), and one line per unreadable entry."""
    out: dict[str, Backoff] = {}
    problems: list[str] = []
    raw, _ = _items(text)
    for i, item in enumerate(raw):
        b = item.get("backoff") if isinstance(item, Mapping) else None
        if b is None:
            continue
        where = f"in-flight changes[{i}].backoff"
        node = b.get("node") if isinstance(b, Mapping) else None
        until = b.get("until") if isinstance(b, Mapping) else None
        failures = b.get("failures") if isinstance(b, Mapping) else None
        if not isinstance(node, str) or not node:
            problems.append(f"{where}.node: {node!r} is not a node name")
        elif (isinstance(until, bool) or not isinstance(until, (int, float))
              or not math.isfinite(until)):
            problems.append(f"{where}.until: {until!r} is not a time")
        elif isinstance(failures, bool) or not isinstance(failures, int) or failures < 1:
            problems.append(f"{where}.failures: {failures!r} is not a count")
        else:
            out[node] = Backoff(float(until), min(failures, 64))
    return out, problems
