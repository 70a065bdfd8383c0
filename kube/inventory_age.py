"""How old a node agent's inventory may be before the extender stops trusting it.

The agent writes its inventory (``gpupack.io/inventory``) when what it sees changes, and
again every ``--inventory-refresh`` seconds (5 minutes by default) when nothing does, so
a recent write means a working agent. An inventory not rewritten for ``max_age_s`` (15
minutes by default: three refreshes missed) comes from an agent that stopped: its MIG
layouts, device owners and per-pod peaks may be out of date (a GPU re-partitioned by
hand, a pod gone, memory grown). The extender then reads the node as if the annotation
were absent: GPUs inferred from allocatable and GPU Feature Discovery labels, marked
inferred, which the MIG actuator does not re-lay while pods hold them. This is
kube-scheduler's stance on a node whose kubelet stopped reporting: the last word is not
trusted for ever.

Ages are measured on the extender's clock (:func:`steady_clock`: its wall time at start
plus monotonic time since, so a step of the system clock moves no age), so a node's clock
does not matter: a write (a ``ts`` greater than the last one seen for the node) counts
from when the extender saw it. Only an inventory seen for the first time (the extender
starting) is dated by its own ``ts``, the earlier of it and now: a dead agent's inventory
is not trusted afresh by each restart, unless the node's clock ran ahead of the
extender's (its ``ts`` is then taken as now), and a node whose clock runs more than
``max_age_s - refresh`` behind is read as inventory-less until its agent's next write.

No clock of its own: the caller's. :class:`InventoryTrust` keeps, per node, what the cache
needs to know of its inventory's age (and logs when one goes stale or fresh again).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kube import annotations as A

log = logging.getLogger("gpupack.kube.cache")
DEFAULT_MAX_AGE_S = 900.0  # the extender's --inventory-max-age
DEFAULT_REFRESH_S = 300.0  # the agent's --inventory-refresh
MAX_TS = 2**53  # a ts past this (float's exact integers; year 285 million) is not a time


def written_at(text: str | None) -> int | None:
    """The inventory's ``ts`` (unix seconds), or None when there is no readable one (an
    unreadable inventory is refused by node_info anyway, whatever its age). Never raises:
    it runs on every Node the watch delivers, before anything else is read of it."""
    if text is None:
        return None
    try:
        top = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than Python's
        return None
    ts = top.get("ts") if isinstance(top, dict) else None
    ok = isinstance(ts, int) and not isinstance(ts, bool) and 0 <= ts < MAX_TS
    return ts if ok else None


def steady_clock(wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> Callable[[], float]:
    """A wall clock that a step of the system clock does not move: the wall time when it
    was made plus the monotonic time since. Ages are measured on it, so an NTP step back
    does not extend a dead agent's trust, nor a step forward expire every inventory."""
    wall0, mono0 = wall(), monotonic()
    return lambda: wall0 + (monotonic() - mono0)


@dataclass(frozen=True)
class InventoryAge:
    """The age limit on inventories: ``max_age_s`` seconds without a new write."""

    max_age_s: float = DEFAULT_MAX_AGE_S

    def __post_init__(self) -> None:
        if not 0 < self.max_age_s < float("inf"):
            raise ValueError(f"inventory max age: must be positive, got {self.max_age_s!r}")

    def expires(self, ts: int, now: float, known: tuple[int, float] | None) -> float:
        """When an inventory written with ``ts`` and seen ``now`` (the extender's clock)
        stops being trusted; ``known``: the (ts, expiry) kept for the node's last one.

        The same write seen again (a relist, another field of the Node changed) keeps
        its expiry; a newer write counts from now; a first sight, or an older write than
        the last one, from its own ``ts`` when that is earlier than now."""
        if known is not None and ts == known[0]:
            return known[1]
        if known is not None and ts > known[0]:
            return now + self.max_age_s
        return min(float(ts), now) + self.max_age_s

    def reason(self, ts: int, expires: float, now: float) -> str | None:
        """Why an inventory written with ``ts`` and trusted until ``expires`` is no longer
        trusted at ``now``; None while it is."""
        if now < expires:
            return None
        silent = now - (expires - self.max_age_s)
        return (f"metadata.annotations.{A.INVENTORY}: written at ts {ts}, not rewritten for "
                f"{silent:.0f} s, longer than the {self.max_age_s:g} s limit (the node agent "
                "stopped reporting?); GPUs inferred from allocatable and labels instead")


def without_inventory(node: Mapping[str, Any]) -> dict[str, Any]:
    """``node`` with the inventory annotation removed (a shallow copy; ``node`` itself is
    not changed): what node_info reads for a node whose inventory is stale."""
    out = dict(node)
    meta = node.get("metadata")
    if isinstance(meta, Mapping):
        meta = dict(meta)
        ann = meta.get("annotations")
        if isinstance(ann, Mapping):
            meta["annotations"] = {k: v for k, v in ann.items() if k != A.INVENTORY}
        out["metadata"] = meta
    return out


def essentials(node: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a Node that node_info and node_taints read (name, labels,
    annotations, spec, allocatable): kept for a node whose inventory will expire, so it
    can be read again then without keeping the whole object (images, conditions)."""
    meta = node.get("metadata")
    status = node.get("status")
    out: dict[str, Any] = {}
    if isinstance(meta, Mapping):
        out["metadata"] = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
    if "spec" in node:
        out["spec"] = node["spec"]
    if isinstance(status, Mapping) and "allocatable" in status:
        out["status"] = {"allocatable": status["allocatable"]}
    return out


class InventoryTrust:
    """Which nodes' agent inventories are trusted now, under the age limit ``age`` (None:
    no limit): per node, the (ts, expiry) of the last inventory seen, the nodes whose
    inventory is stale, and, for each trusted one, what to read the node again from once
    its inventory expires (no watch event comes when a node agent stops). Kept by
    :class:`kube.cache.ClusterCache` (under its lock)."""

    def __init__(self, age: InventoryAge | None) -> None:
        self.age = age
        self._stale: set[str] = set()
        # node -> (ts, expiry) of the last inventory seen on it, stale ones included.
        self._seen: dict[str, tuple[int, float]] = {}
        # Nodes whose inventory is trusted now: what to re-read each from once it expires.
        self._nodes: dict[str, dict[str, Any]] = {}

    def stale(self, name: str | None, ts: int | None, now: float,
              record: bool = False) -> str | None:
        """Why node ``name``'s inventory, written with ``ts``, is not trusted at ``now``
        (None: it is, or there is no limit, or it has no ``ts``); ``record`` keeps its
        (ts, expiry) for the node."""
        age = self.age
        if age is None or name is None:
            return None
        if ts is None:
            if record:
                self._seen.pop(name, None)
            return None
        end = age.expires(ts, now, self._seen.get(name))
        if record:
            self._seen[name] = (ts, end)
        return age.reason(ts, end, now)

    def note(self, name: str, obj: Mapping[str, Any], why: str | None) -> None:
        """Which nodes' inventories are stale (``why``: the reason, None: trusted), and
        what to re-read each trusted one's node from once it expires."""
        if why is not None:
            if name not in self._stale:
                log.warning("node %s: %s", name, why)
            self._stale.add(name)
            self._nodes.pop(name, None)
            return
        if name in self._stale:
            if name in self._seen:
                log.info("node %s: the node agent's inventory is fresh again", name)
            else:
                log.info("node %s: its stale node agent inventory was removed", name)
            self._stale.discard(name)
        if name in self._seen:
            self._nodes[name] = essentials(obj)
        else:
            self._nodes.pop(name, None)

    def due(self, now: float) -> list[tuple[str, dict[str, Any]]]:
        """The nodes whose trusted inventory has expired by ``now``, with what to read
        each again from (no longer kept: a node that fails to read is not tried again)."""
        names = sorted(n for n in self._nodes if self._seen.get(n, (0, math.inf))[1] <= now)
        return [(n, self._nodes.pop(n)) for n in names]

    def forget(self, name: str) -> None:
        """The node is gone."""
        self._stale.discard(name)
        self._seen.pop(name, None)
        self._nodes.pop(name, None)

    @property
    def stale_count(self) -> int:
        return len(self._stale)
