"""LeaderWorkerSet objects (``leaderworkerset.x-k8s.io/v1``): a group's true size.

A pod's ``leaderworkerset.sigs.k8s.io/size`` annotation is whatever the pod's author
wrote; the LeaderWorkerSet object says how many pods each group really has
(``spec.leaderWorkerTemplate.size``), how many groups there are (``spec.replicas``) and
what its pods will ask (the leader and worker templates, whose node selector, affinity
and tolerations bind the members not created yet).

:func:`lws_of` reads one (pure). :class:`LwsPoller` lists them all every ``interval_s``
seconds in a daemon thread (``list`` is the only verb it uses: LeaderWorkerSets change
rarely, and a periodic list needs no watch right). The CRD may not be installed: a 404
on the list means "not installed" (logged once, asked again at the next interval), never
an error loop; any other failure keeps the last list. The first attempt, whatever its
outcome, counts as listed, so a cluster without the CRD is answered at once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kube.annotations import LWS_EXCLUSIVE, MAX_GROUP_SIZE
from kube.constraints import PodConstraints, spec_constraints
from kube.objects import ObjectError

log = logging.getLogger("gpupack.kube.lws")

GROUP = "leaderworkerset.x-k8s.io"
VERSION = "v1"
PLURAL = "leaderworkersets"


@dataclass(frozen=True)
class LwsShape:
    namespace: str
    name: str
    size: int  # pods per group, leader included
    replicas: int  # groups
    templates: tuple[PodConstraints, ...] = ()  # leader (if its own) and worker templates
    # metadata.annotations[leaderworkerset.sigs.k8s.io/exclusive-topology]: the topology
    # key its groups hold exclusively (None: no exclusive placement).
    exclusive_topology: str | None = None


def _count(v: Any, where: str, default: int, low: int) -> int:
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ObjectError(f"{where}: {v!r} is not an integer of at least {low}")
    return v


def lws_of(obj: Mapping[str, Any]) -> LwsShape:
    """The shape of a LeaderWorkerSet; ObjectError naming the field."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not isinstance(
            meta.get("namespace"), str) or not meta["name"] or not meta["namespace"]:
        raise ObjectError("LeaderWorkerSet: metadata.name and metadata.namespace are required")
    who = f"LeaderWorkerSet {meta['namespace']}/{meta['name']}"
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ObjectError(f"{who}: spec: expected an object")
    tmpl = spec.get("leaderWorkerTemplate") or {}
    if not isinstance(tmpl, Mapping):
        raise ObjectError(f"{who}: spec.leaderWorkerTemplate: expected an object")
    size = _count(tmpl.get("size"), f"{who}: spec.leaderWorkerTemplate.size", 1, 1)
    if size > MAX_GROUP_SIZE:
        raise ObjectError(f"{who}: spec.leaderWorkerTemplate.size: {size} pods is more than "
                          f"gpupack places as one group (at most {MAX_GROUP_SIZE})")
    replicas = _count(spec.get("replicas"), f"{who}: spec.replicas", 1, 0)
    templates = []
    for field in ("leaderTemplate", "workerTemplate"):
        t = tmpl.get(field)
        if t is None:
            continue
        if not isinstance(t, Mapping):
            raise ObjectError(f"{who}: spec.leaderWorkerTemplate.{field}: expected an object")
        templates.append(spec_constraints(
            t.get("spec"), f"{who}: spec.leaderWorkerTemplate.{field}.spec"))
    annotations = meta.get("annotations")
    exclusive = annotations.get(LWS_EXCLUSIVE) if isinstance(annotations, Mapping) else None
    return LwsShape(meta["namespace"], meta["name"], size, replicas, tuple(templates),
                    exclusive if isinstance(exclusive, str) and exclusive else None)


class LwsSink(Protocol):
    def replace_lws(self, objs: list[Mapping[str, Any]], installed: bool) -> None:
        """A full list (``installed`` False: the CRD is absent, the list is empty)."""
        ...

    def lws_listed(self) -> None:
        """The first attempt to list is over (whatever came of it)."""
        ...


class LwsPoller:
    """Lists every LeaderWorkerSet every ``interval_s`` seconds (see the module
    docstring); :meth:`nudge` asks for a list sooner (at most every ``min_gap_s``)."""

    def __init__(self, api_client: Any, sink: LwsSink, interval_s: float = 30.0,
                 min_gap_s: float = 2.0) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.sink = sink
        self.interval_s = interval_s
        self.min_gap_s = min_gap_s
        self.installed: bool | None = None  # None: not known yet
        self.lists = 0
        self.errors = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> None:
        """List once and hand the result to the sink."""
        from kubernetes.client.exceptions import ApiException

        self.lists += 1
        try:
            resp: Any = self.custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, _preload_content=False, _request_timeout=30)
            body = json.loads(resp.data if hasattr(resp, "data") else resp.read())
        except ApiException as e:
            if e.status == 404:
                if self.installed is not False:
                    log.info("LeaderWorkerSet CRD (%s/%s) not installed: group sizes come "
                             "from pod labels, capped by --max-group-gpus", GROUP, VERSION)
                self.installed = False
                self.sink.replace_lws([], installed=False)
            else:
                self.errors += 1
                log.warning("listing LeaderWorkerSets: API error %s %s; keeping the last "
                            "list", e.status, e.reason)
            return
        except Exception as e:  # network trouble, a body that is not JSON: keep the last
            self.errors += 1
            log.warning("listing LeaderWorkerSets: %s; keeping the last list", e)
            return
        items = body.get("items") if isinstance(body, Mapping) else None
        if self.installed is not True:
            log.info("LeaderWorkerSet CRD installed: group sizes come from the objects")
        self.installed = True
        self.sink.replace_lws([o for o in items or () if isinstance(o, Mapping)],
                              installed=True)

    def nudge(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True, name="gpupack-lws")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _loop(self) -> None:
        first = True
        while not self._stop.is_set():
            self.poll()
            if first:
                self.sink.lws_listed()
                first = False
            if self._stop.wait(self.min_gap_s):
                return
            self._wake.wait(max(0.0, self.interval_s - self.min_gap_s))
            self._wake.clear()


def shapes_of(objs: list[Mapping[str, Any]], on_bad: Callable[[str], None]
              ) -> dict[tuple[str, str], LwsShape]:
    """(namespace, name) -> shape of each readable object; ``on_bad(why)`` for the rest."""
    out: dict[tuple[str, str], LwsShape] = {}
    for o in objs:
        try:
            s = lws_of(o)
        except ObjectError as e:
            on_bad(str(e))
            continue
        out[(s.namespace, s.name)] = s
    return out
