"""MIG compaction's memory across leaders: one ConfigMap in gpupack's namespace.

What a new leader must not forget, or it would break a promise the last one kept:

* the accepted evictions of the last hour: ``--mig-compact-evictions-per-hour`` is a
  budget per hour of the *cluster*, not of a leader's term (forgotten, a failover would
  allow twice the budget in that hour);
* the GPUs cooling down after a drain that did not end ``emptied`` (refused, refilled,
  timed out): forgotten, the new leader would drain the same GPU again at once.

* the drains in flight: which GPU, which pods must leave it, which evictions the API
  accepted. Forgotten, the GPU's free slices would no longer be held, so replacements
  could land back on the GPU being emptied, its remaining pods would stay, and the
  evictions already made would have been restarts for nothing. A new leader takes the
  drains up where the last one left them (holds, the pods not yet evicted, the end).

Pod ages need no memory: they count from the pods' ``status.startTime``.

Written by the leader only (through :class:`kube.record_writer.RecordWriter`, latest
wins), read once when it starts leading. Times are wall-clock seconds. The ConfigMap's
``data["memory.json"]``::

    {"v": 1, "evictions": [1700000000.0, ...],
     "cooldown": [{"node": "gpu-1", "gpu": 3, "until": 1700001800.0}, ...],
     "drains": [{"node": "gpu-2", "gpu": 0, "model": "H100-80GB", "pods": ["ns/a", "ns/b"],
                 "started": 1700000100.0, "evicted": ["ns/a"], "refused": null}, ...]}

``drains`` was added without a new version: a reader that does not know it ignores it
(so a rollback reads the memory, without the drains, rather than stopping compaction).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

NAME = "gpupack-mig-compaction"
KEY = "memory.json"
VERSION = 1
# How long a GPU cools down after a failed drain (scheduler.mig.compact.decide.CompactSettings'
# default), and the bound ``within`` puts on a stored one.
DEFAULT_COOLDOWN_S = 1800.0


class CompactionMemoryError(ValueError):
    """The stored memory is not one this module wrote (the message names the field)."""


@dataclass(frozen=True)
class DrainRecord:
    """A drain in flight, as kept (``scheduler.mig.compact.decide.Drain``'s fields)."""

    node: str
    gpu: int
    model: str
    pods: tuple[str, ...]  # what must leave the GPU
    started: float
    evicted: frozenset[str] = frozenset()  # evictions the API accepted
    refused: str | None = None  # why the API refused an eviction


@dataclass(frozen=True)
class CompactionMemory:
    evictions: tuple[float, ...] = ()  # when accepted evictions happened
    cooldown: Mapping[tuple[str, int], float] = field(default_factory=dict)  # GPU -> until
    drains: tuple[DrainRecord, ...] = ()  # in flight, by (node, GPU)

    def within(self, now: float, hour: float = 3600.0,
               cooldown_s: float = DEFAULT_COOLDOWN_S) -> CompactionMemory:
        """Only what still matters at ``now``: evictions of the last hour, cool-downs not
        over, the drains (each ends by its own rules).

        No time is taken past what this leader could have written itself: the memory is
        a ConfigMap anyone with edit rights in the namespace can change, and one time in
        the far future would keep the hourly budget spent, a GPU cooling down, or a drain
        from timing out, for ever. Evictions and drain starts later than ``now`` count as
        ``now``; a cool-down ends at most ``cooldown_s`` (CompactSettings.cooldown_s)
        after ``now``."""
        return CompactionMemory(
            tuple(min(t, now) for t in self.evictions if now - min(t, now) < hour),
            {k: min(t, now + cooldown_s) for k, t in self.cooldown.items() if t > now},
            tuple(sorted((replace(d, started=now) if d.started > now else d
                          for d in self.drains), key=lambda d: (d.node, d.gpu))))


def encode(mem: CompactionMemory) -> str:
    return json.dumps({
        "v": VERSION, "evictions": sorted(mem.evictions),
        "cooldown": [{"node": n, "gpu": g, "until": t}
                     for (n, g), t in sorted(mem.cooldown.items())],
        "drains": [{"node": d.node, "gpu": d.gpu, "model": d.model, "pods": list(d.pods),
                    "started": d.started, "evicted": sorted(d.evicted), "refused": d.refused}
                   for d in sorted(mem.drains, key=lambda d: (d.node, d.gpu))]},
        sort_keys=True)


def _node_gpu(c: Mapping[str, Any], where: str) -> tuple[str, int]:
    node, gpu = c.get("node"), c.get("gpu")
    if not isinstance(node, str) or not node:
        raise CompactionMemoryError(f"{where}.node: {node!r} is not a node name")
    if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
        raise CompactionMemoryError(f"{where}.gpu: {gpu!r} is not a GPU index")
    return node, gpu


def _keys(v: object, where: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(k, str) and "/" in k for k in v):
        raise CompactionMemoryError(f"{where}: {v!r} is not a list of namespace/name keys")
    return tuple(v)


def _drain(c: object, where: str) -> DrainRecord:
    if not isinstance(c, Mapping):
        raise CompactionMemoryError(f"{where}: not an object")
    node, gpu = _node_gpu(c, where)
    model = c.get("model")
    if not isinstance(model, str) or not model:
        raise CompactionMemoryError(f"{where}.model: {model!r} is not a GPU model")
    pods = _keys(c.get("pods"), f"{where}.pods")
    if not pods:
        raise CompactionMemoryError(f"{where}.pods: empty (a drain moves at least one pod)")
    evicted = frozenset(_keys(c.get("evicted", []), f"{where}.evicted"))
    if not evicted <= set(pods):
        raise CompactionMemoryError(f"{where}.evicted: {sorted(evicted - set(pods))} not "
                                    "among the drain's pods")
    refused = c.get("refused")
    if refused is not None and not isinstance(refused, str):
        raise CompactionMemoryError(f"{where}.refused: {refused!r} is not text")
    return DrainRecord(node, gpu, model, pods, _time(c.get("started"), f"{where}.started"),
                       evicted, refused)


def _time(v: object, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CompactionMemoryError(f"{where}: {v!r} is not a time in seconds")
    try:
        t = float(v)  # an integer of hundreds of digits overflows here
    except OverflowError:
        # (not printed: str() of an integer refuses past 4,300 digits)
        raise CompactionMemoryError(f"{where}: an integer too large to be a time in "
                                    "seconds") from None
    if not math.isfinite(t):
        raise CompactionMemoryError(f"{where}: {v!r} is not a time in seconds")
    return t


def decode(text: object) -> CompactionMemory:
    """The memory in ``text``; CompactionMemoryError naming the field when it is not readable."""
    if not isinstance(text, str):
        raise CompactionMemoryError(f"data.{KEY}: {type(text).__name__}, not text")
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise CompactionMemoryError(f"data.{KEY}: not JSON ({e})") from None
    except RecursionError:
        raise CompactionMemoryError(f"data.{KEY}: nested too deeply") from None
    if not isinstance(raw, Mapping):
        raise CompactionMemoryError(f"data.{KEY}: {type(raw).__name__}, not an object")
    v = raw.get("v")
    # The integer 1 only: true and 1.0 compare equal to it, but this module never writes
    # them, so the memory is not one it wrote.
    if type(v) is not int or v != VERSION:
        raise CompactionMemoryError(f"data.{KEY}.v: {v!r}, not {VERSION}")
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
        cooldown[_node_gpu(c, where)] = _time(c.get("until"), f"{where}.until")
    raw_drains = raw.get("drains", [])
    if not isinstance(raw_drains, list):
        raise CompactionMemoryError(f"data.{KEY}.drains: not a list")
    drains: dict[tuple[str, int], DrainRecord] = {}
    for i, c in enumerate(raw_drains):
        d = _drain(c, f"data.{KEY}.drains[{i}]")
        if (d.node, d.gpu) in drains:
            raise CompactionMemoryError(f"data.{KEY}.drains[{i}]: a second drain of GPU "
                                        f"{d.gpu} of {d.node}")
        drains[d.node, d.gpu] = d
    return CompactionMemory(
        tuple(_time(t, f"data.{KEY}.evictions[{i}]") for i, t in enumerate(evictions)),
        cooldown, tuple(drains.values()))


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
