"""Builders for the LLM group tests: LWS pods, a recording writer, a book on a cache."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from sched_builders import FakeClock, whole_pod

from kube.cache import ClusterCache
from kube.groups.inputs import GroupInputs
from kube.groups.reservations import ReservationTap, record_name
from scheduler.groups.loop import ReservationBook, hold_key

LWS = "leaderworkerset.sigs.k8s.io/"


def lws_pod(lws: str, worker: int, size: int, gpus: int, group: int = 0,
            exclusive: str | None = None, **kw: Any) -> dict[str, Any]:
    """A LeaderWorkerSet pod: leader ``<lws>-<group>``, workers ``<lws>-<group>-<i>``."""
    name = f"{lws}-{group}" if worker == 0 else f"{lws}-{group}-{worker}"
    ann = {LWS + "size": str(size), **kw.pop("annotations", {})}
    if exclusive:
        ann[LWS + "exclusive-topology"] = exclusive
    p = whole_pod(name, gpus, namespace=kw.pop("namespace", "llm"), annotations=ann, **kw)
    p["metadata"]["labels"] = {LWS + "name": lws, LWS + "group-index": str(group),
                               LWS + "worker-index": str(worker)}
    return p


def lws_object(name: str, size: int, replicas: int = 1, namespace: str = "llm",
               exclusive: str | None = None, **tmpl: Any) -> dict[str, Any]:
    """A LeaderWorkerSet object (``exclusive``: its exclusive-topology annotation)."""
    meta: dict[str, Any] = {"namespace": namespace, "name": name}
    if exclusive:
        meta["annotations"] = {LWS + "exclusive-topology": exclusive}
    return {"metadata": meta,
            "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": size, **tmpl}}}


def lws_inputs(*objs: dict[str, Any]) -> GroupInputs:
    """Group inputs with these LeaderWorkerSets listed (no quotas)."""
    i = GroupInputs()
    i.replace([])
    i.replace_lws(list(objs), installed=True)
    i.lws_listed()
    return i


def bound(pod: dict[str, Any], node: str, annotations: dict[str, str]) -> dict[str, Any]:
    """The pod as the watch shows it after a bind with these annotations."""
    out = copy.deepcopy(pod)
    out["spec"]["nodeName"] = node
    out["metadata"].setdefault("annotations", {}).update(annotations)
    out["status"] = {"phase": "Running"}
    return out


@dataclass
class RecordingWriter:
    """What the book asked to write: (record name, ConfigMap or None to delete)."""

    writes: list[tuple[str, Any]] = field(default_factory=list)

    def submit(self, name: str, obj: Any) -> None:
        self.writes.append((name, obj))

    def last(self, group: str) -> Any:
        """The last ConfigMap written for ``group`` (None: deleted, or never written)."""
        name = record_name(group)
        return next((o for n, o in reversed(self.writes) if n == name), None)


@dataclass
class Rig:
    cache: ClusterCache
    book: ReservationBook
    tap: ReservationTap
    clock: FakeClock
    writer: Any
    requeue: Any = None  # the status patches that wake refused members (a RecordingWriter)

    def sync(self) -> None:
        """What the background keeper does after a change: one step of the book."""
        self.book.step()

    def held(self, group: str) -> list[int]:
        """Slots of ``group`` whose room is held now."""
        size = 16
        return [s for s in range(size) if self.cache.counted(hold_key(group, s)) is not None]


def rig(nodes: list[dict[str, Any]], pods: list[dict[str, Any]] | None = None,
        ttl: float = 100.0, clock: FakeClock | None = None, writer: Any = None,
        sync: bool = True, records: list[dict[str, Any]] | None = None,
        leader: Any = None, inputs: Any = None, max_group_gpus: int = 64,
        view_settle_s: float = 0.0, namespace_cap: Any = None) -> Rig:
    """A book on a cache, fed like the API source feeds them: ``records`` listed (the
    reservation ConfigMaps), then nodes and pods, then the end of the first lists.
    ``view_settle_s``: 0 here, since every node was just made."""
    clock = clock or FakeClock()
    cache = ClusterCache("gpupack")
    book = ReservationBook(cache, ttl=ttl, clock=clock, writer=writer or RecordingWriter(),
                           retry_s=0.0, cooldown_s=10.0,
                           is_leader=leader if leader is not None else (lambda: True),
                           inputs=inputs, max_group_gpus=max_group_gpus,
                           requeue=RecordingWriter(), view_settle_s=view_settle_s,
                           namespace_cap=namespace_cap)
    tap = ReservationTap(cache, book)
    if records is not None:
        tap.replace_records(records)
    tap.replace(nodes, pods or [])
    tap.mark_synced()
    r = Rig(cache, book, tap, clock, book.writer, book.requeue)
    if sync:
        r.sync()
    return r
