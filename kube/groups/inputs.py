"""What bounds a group's reservation besides the nodes and pods: the namespaces'
ResourceQuotas (watched by :class:`kube.api_source.ApiSource`), the LeaderWorkerSet
objects (polled by :class:`kube.groups.lws.LwsPoller`) and kube-scheduler's PodGroups and
Workloads (watched when served, :mod:`kube.groups.workload_api`), kept parsed for the
reservation book.

Copy-on-write: every change builds new mappings and swaps them in under a small lock,
so the book reads a consistent set without holding anything. ``version`` moves on
every change that could change a group's rights (a group refused for its quota is tried
again when a quota changes, not only when the pods do).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kube.groups.lws import LwsShape, shapes_of
from kube.groups.workload_api import (
    PODGROUPS,
    WORKLOADS,
    PodGroupShape,
    WorkloadShape,
    pod_group_of,
    workload_of,
)
from kube.objects import ObjectError
from kube.quotas import Quota, quota_of

log = logging.getLogger("gpupack.kube.group_inputs")


def _qkey(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return None
    ns, name = meta.get("namespace"), meta.get("name")
    if not isinstance(ns, str) or not isinstance(name, str) or not ns or not name:
        return None
    return f"{ns}/{name}"


class GroupInputs:
    """Quotas, LeaderWorkerSets, PodGroups and Workloads as last seen (see the module
    docstring)."""

    def __init__(self, quotas_listed: bool = False, lws_listed: bool = False,
                 workload_api_listed: bool = True) -> None:
        """``*_listed``: no source will report that kind (static mode, unit tests); a
        source that watches PodGroups and Workloads passes ``workload_api_listed=False``."""
        self._lock = threading.Lock()
        self._quotas: dict[str, Quota] = {}
        self._by_ns: dict[str, tuple[Quota, ...]] = {}
        self._lws: dict[tuple[str, str], LwsShape] = {}
        self.lws_installed = False
        self._quotas_listed = quotas_listed
        self._lws_listed = lws_listed
        self.version = 0
        self.bad_objects = 0
        self.on_unknown_lws: Callable[[], None] | None = None
        # PodGroups and Workloads by (namespace, name); per kind whether the API server
        # serves it (None: not asked yet) and whether its first list is in.
        self._pod_groups: dict[tuple[str, str], PodGroupShape] = {}
        self._workloads: dict[tuple[str, str], WorkloadShape] = {}
        self.served: dict[str, bool | None] = {PODGROUPS: None, WORKLOADS: None}
        self._workload_api_listed = {PODGROUPS: workload_api_listed,
                                     WORKLOADS: workload_api_listed}

    # ---- reads -----------------------------------------------------------------------------

    def listed(self) -> bool:
        return (self._quotas_listed and self._lws_listed
                and all(self._workload_api_listed.values()))

    def quotas(self, namespace: str) -> tuple[Quota, ...]:
        return self._by_ns.get(namespace, ())

    def lws(self, namespace: str, name: str) -> LwsShape | None:
        found = self._lws.get((namespace, name))
        if found is None and self.lws_installed and self.on_unknown_lws is not None:
            self.on_unknown_lws()  # perhaps created since the last list: list again soon
        return found

    def pod_group(self, namespace: str, name: str) -> PodGroupShape | None:
        """The PodGroup ``namespace/name`` (a pod's group is looked up in the pod's own
        namespace only)."""
        return self._pod_groups.get((namespace, name))

    def workload(self, namespace: str, name: str) -> WorkloadShape | None:
        return self._workloads.get((namespace, name))

    # ---- quotas (kube.source.ObjectSink) ---------------------------------------------------

    def _bad(self, why: str) -> None:
        self.bad_objects += 1
        log.warning("ignoring %s", why)

    def _set_quotas(self, quotas: dict[str, Quota]) -> None:
        by_ns: dict[str, list[Quota]] = {}
        for q in quotas.values():
            if q.hard:  # a quota without GPU limits cannot refuse a group
                by_ns.setdefault(q.namespace, []).append(q)
        self._quotas = quotas
        self._by_ns = {ns: tuple(sorted(qs, key=lambda q: q.name)) for ns, qs in by_ns.items()}
        self.version += 1

    def upsert(self, obj: Mapping[str, Any]) -> None:
        key = _qkey(obj)
        if key is None:
            self._bad("a ResourceQuota without metadata.namespace/name")
            return
        try:
            q = quota_of(obj)
        except ObjectError as e:
            self._bad(str(e))
            # Unreadable now: what it said before no longer holds either.
            q = None
        with self._lock:
            quotas = dict(self._quotas)
            if q is None:
                quotas.pop(key, None)
            else:
                quotas[key] = q
            self._set_quotas(quotas)

    def delete(self, obj: Mapping[str, Any]) -> None:
        key = _qkey(obj)
        if key is None:
            return
        with self._lock:
            if key in self._quotas:
                quotas = dict(self._quotas)
                del quotas[key]
                self._set_quotas(quotas)

    def replace(self, objs: list[Mapping[str, Any]]) -> None:
        quotas: dict[str, Quota] = {}
        for o in objs:
            key = _qkey(o)
            if key is None:
                self._bad("a ResourceQuota without metadata.namespace/name")
                continue
            try:
                quotas[key] = quota_of(o)
            except ObjectError as e:
                self._bad(str(e))
        with self._lock:
            self._set_quotas(quotas)
            self._quotas_listed = True

    # ---- LeaderWorkerSets (kube.groups.lws.LwsSink) ----------------------------------------------

    def replace_lws(self, objs: list[Mapping[str, Any]], installed: bool) -> None:
        shapes = shapes_of(objs, self._bad)
        with self._lock:
            if shapes != self._lws or installed != self.lws_installed:
                self._lws = shapes
                self.lws_installed = installed
                self.version += 1

    def lws_listed(self) -> None:
        with self._lock:
            self._lws_listed = True
            self.version += 1

    # ---- PodGroups and Workloads (kube.groups.workload_api.WorkloadSink) ------------------

    def _shape(self, kind: str, obj: Mapping[str, Any]) -> PodGroupShape | WorkloadShape | None:
        try:
            return pod_group_of(obj) if kind == PODGROUPS else workload_of(obj)
        except ObjectError as e:
            self._bad(str(e))
            return None

    def _book(self, kind: str) -> dict[tuple[str, str], Any]:
        return self._pod_groups if kind == PODGROUPS else self._workloads

    def _set(self, kind: str, book: dict[tuple[str, str], Any]) -> None:
        if kind == PODGROUPS:
            self._pod_groups = book
        else:
            self._workloads = book
        self.version += 1

    def replace_workload_objects(self, kind: str, objs: list[Mapping[str, Any]],
                                 served: bool) -> None:
        book: dict[tuple[str, str], Any] = {}
        for o in objs:
            shape = self._shape(kind, o)
            if shape is not None:
                book[(shape.namespace, shape.name)] = shape
        with self._lock:
            if book != self._book(kind) or served != self.served[kind]:
                self.served[kind] = served
                self._set(kind, book)
            self._workload_api_listed[kind] = True

    def workload_listed(self, kind: str) -> None:
        """The first attempt to list ``kind`` failed (not a 404): the verbs need not
        wait for it; what it holds stays as it was."""
        with self._lock:
            self._workload_api_listed[kind] = True
            self.version += 1

    def upsert_workload_object(self, kind: str, obj: Mapping[str, Any]) -> None:
        shape = self._shape(kind, obj)
        key = _qkey(obj)
        with self._lock:
            book = dict(self._book(kind))
            if shape is not None:
                if book.get((shape.namespace, shape.name)) == shape:
                    return
                book[(shape.namespace, shape.name)] = shape
            elif key is not None:
                # Unreadable now: what it said before no longer holds either.
                ns, name = key.split("/", 1)
                if book.pop((ns, name), None) is None:
                    return
            else:
                return
            self._set(kind, book)

    def delete_workload_object(self, kind: str, obj: Mapping[str, Any]) -> None:
        key = _qkey(obj)
        if key is None:
            return
        ns, name = key.split("/", 1)
        with self._lock:
            if (ns, name) in self._book(kind):
                book = dict(self._book(kind))
                del book[(ns, name)]
                self._set(kind, book)
