"""MIG compaction's memory across leaders: one ConfigMap in gpupack's namespace.

What a new leader must not forget, or it would break a promise the last one kept:

* the accepted evictions of the last hour: ``--mig-compact-evictions-per-hour`` is a
  budget per hour of the *cluster*, not of a leader's term (forgotten, a failover would
  allow twice the budget in that hour);
* the GPUs cooling down after a drain that did not end ``emptied`` (refused, refilled,
  timed out): forgotten, the new leader would drain the same GPU again at once.

Drains in flight are not kept (a new leader starts with none: evictions already accepted
stand, and the replacements are placed like any pod); neither are pod ages (a new leader
starts the clocks again and moves nothing younger than the minimum age).

Written by the leader only (through :class:`kube.reservations.RecordWriter`, latest
wins), read once when it starts leading. Times are wall-clock seconds. The ConfigMap's
``data["memory.json"]``::

    {"v": 1, "evictions": [1700000000.0, ...],
     "cooldown": [{"node": "gpu-1", "gpu": 3, "until": 1700001800.0}, ...]}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NAME = "gpupack-mig-compaction"
KEY = "memory.json"
VERSION = 1


class CompactionMemoryError(ValueError):
    """The stored memory is not one this module wrote (the message names the field)."""


@dataclass(frozen=True)
class CompactionMemory:
    evictions: tuple[float, ...] = ()  # when accepted evictions happened
    cooldown: Mapping[tuple[str, int], float] = field(default_factory=dict)  # GPU -> until

    def within(self, now: float, hour: float = 3600.0) -> CompactionMemory:
        """Only what still matters at ``now``: evictions of the last hour, cool-downs not
        over."""
        return CompactionMemory(tuple(t for t in self.evictions if now - t < hour),
                                {k: t for k, t in self.cooldown.items() if t > now})


def encode(mem: CompactionMemory) -> str:
    return json.dumps({
        "v": VERSION, "evictions": sorted(mem.evictions),
        "cooldown": [{"node": n, "gpu": g, "until": t}
                     for (n, g), t in sorted(mem.cooldown.items())]}, sort_keys=True)


def _time(v: object, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise CompactionMemoryError(f"{where}: {v!r} is not a time in seconds")
    return float(v)


def decode(text: object) -> CompactionMemory:
    """The memory in ``text``; CompactionMemoryError naming the field when it is not readable."""
    if not isinstance(text, str):
        raise CompactionMemoryError(f"data.{KEY}: {type(text).__name__}, not text")
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise CompactionMemoryError(f"data.{KEY}: not JSON ({e})") from None
    if not isinstance(raw, Mapping):
        raise CompactionMemoryError(f"data.{KEY}: {type(raw).__name__}, not an object")
    if raw.get("v") != VERSION:
        raise CompactionMemoryError(f"data.{KEY}.v: {raw.get('v')!r}, not {VERSION}")
    evictions = raw.get("evictions", [])
    if not isinstance(evictions, list):
        raise CompactionMemoryError(f"data.{KEY}.evictions: not a list")
    cool = raw.get("cooldown", [])
    if not isinstance(cool, list):
        raise CompactionMemoryError(f"data.{KEY}.cooldown: not a list")
    cooldown: dict[tuple[str, int], float] = {}
    for i, c in enumerate(cool):
        where = f"data.{KEY}.cooldown[{i}]"
        if not isinstance(c, Mapping):
            raise CompactionMemoryError(f"{where}: not an object")
        node, gpu = c.get("node"), c.get("gpu")
        if not isinstance(node, str) or not node:
            raise CompactionMemoryError(f"{where}.node: {node!r} is not a node name")
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
            raise CompactionMemoryError(f"{where}.gpu: {gpu!r} is not a GPU index")
        cooldown[node, gpu] = _time(c.get("until"), f"{where}.until")
    return CompactionMemory(
        tuple(_time(t, f"data.{KEY}.evictions[{i}]") for i, t in enumerate(evictions)),
        cooldown)


def memory_object(mem: CompactionMemory, namespace: str) -> dict[str, Any]:
    """The ConfigMap that keeps ``mem``."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": NAME, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "gpupack",
                                    "app.kubernetes.io/component": "mig-compaction"}},
            "data": {KEY: encode(mem)}}


class ApiMemoryReader:
    """Reads the ConfigMap (a missing one is an empty memory)."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace

    def read(self) -> CompactionMemory:
        from kubernetes.client.exceptions import ApiException

        try:
            cm = self.core.read_namespaced_config_map(NAME, self.namespace,
                                                      _request_timeout=10)
        except ApiException as e:
            if e.status == 404:
                return CompactionMemory()
            raise
        return decode((cm.data or {}).get(KEY))
