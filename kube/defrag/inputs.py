"""What ``gpupack defrag`` reads besides the cluster snapshot: the pods file's
PodDisruptionBudgets (it may be a List of mixed kinds) and, for every pod, whether a
controller recreates it once evicted (:class:`packing.defrag.plan.Evictability`)."""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from kube.defrag.pdb import read_budget, terminating
from kube.objects import ObjectError, pod_key
from kube.owners import RECREATING_KINDS, recreator
from kube.source import Sink
from packing.defrag.plan import Evictability

PDB = "PodDisruptionBudget"


def evictability(pods: Sequence[Mapping[str, Any]], budgets: Iterable[Mapping[str, Any]],
                 kinds: Iterable[str] = RECREATING_KINDS) -> Evictability:
    """Which pods a controller recreates, and the budgets; ObjectError naming the field."""
    kinds = frozenset(kinds)
    recreated: dict[str, str] = {}
    blocked: dict[str, str] = {}
    for pod in pods:
        key = pod_key(pod)
        who, why = recreator(pod, kinds)
        if who is not None:
            recreated[key] = who
        else:
            blocked[key] = why
        if terminating(pod):
            blocked[key] = "already terminating"
    return Evictability(recreated, tuple(read_budget(b, pods) for b in budgets), blocked)


class PodOwners:
    """A source sink in front of another (the cache): remembers, per pod, who recreates
    it once evicted and whether it is terminating (the extender's cache keeps neither),
    and forwards every event unchanged. :meth:`evictability` answers what the planner
    needs; PodDisruptionBudgets are not watched: the API server enforces them on every
    eviction (a 429), and the pods it refused are passed as ``refused``."""

    def __init__(self, sink: Sink, kinds: Iterable[str] = RECREATING_KINDS) -> None:
        self.sink = sink
        self.kinds = frozenset(kinds)
        self._lock = threading.Lock()
        self._recreated: dict[str, str] = {}
        self._blocked: dict[str, str] = {}

    def _read(self, obj: Mapping[str, Any]) -> None:
        key = pod_key(obj)
        try:
            who, why = recreator(obj, self.kinds)
        except ObjectError as e:
            who, why = None, f"with unreadable owners ({e})"
        with self._lock:
            self._recreated.pop(key, None)
            self._blocked.pop(key, None)
            if who is not None:
                self._recreated[key] = who
            else:
                self._blocked[key] = why
            if terminating(obj):
                self._blocked[key] = "already terminating"

    def _forget(self, key: str) -> None:
        with self._lock:
            self._recreated.pop(key, None)
            self._blocked.pop(key, None)

    def movable(self, keys: Collection[str], kinds: Collection[str] | None = None
                ) -> set[str]:
        """Those of ``keys`` a controller recreates once evicted (of one of ``kinds``, when
        given) and not terminating."""
        with self._lock:
            return {k for k in keys if k in self._recreated and k not in self._blocked
                    and (kinds is None or self._recreated[k].partition("/")[0] in kinds)}

    def evictability(self, refused: Mapping[str, str] | None = None) -> Evictability:
        with self._lock:
            blocked = dict(self._blocked)
            recreated = dict(self._recreated)
        blocked.update(refused or {})
        return Evictability(recreated, (), blocked)

    # ---- kube.source.Sink ------------------------------------------------------------------

    def upsert_node(self, obj: Mapping[str, Any]) -> bool:
        return self.sink.upsert_node(obj)

    def delete_node(self, name: str) -> None:
        self.sink.delete_node(name)

    def upsert_pod(self, obj: Mapping[str, Any]) -> bool:
        if isinstance(obj, Mapping):
            self._read(obj)
        return self.sink.upsert_pod(obj)

    def delete_pod(self, key: str) -> None:
        self._forget(key)
        self.sink.delete_pod(key)

    def replace(self, nodes: Any, pods: Any) -> None:
        if pods is not None:
            if not isinstance(pods, Collection):  # read twice (kube.source.Decoded)
                pods = list(pods)
            keys = {pod_key(p) for p in pods if isinstance(p, Mapping)}
            with self._lock:
                for k in [k for k in (*self._recreated, *self._blocked) if k not in keys]:
                    self._recreated.pop(k, None)
                    self._blocked.pop(k, None)
            for p in pods:
                if isinstance(p, Mapping):
                    self._read(p)
        self.sink.replace(nodes, pods)

    def mark_synced(self) -> None:
        self.sink.mark_synced()

    def note_bad_object(self) -> None:
        self.sink.note_bad_object()
