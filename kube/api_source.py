"""The extender's cluster source and binder against the API server, through the
``kubernetes`` client.

- :class:`ApiSource`: list + watch of Nodes and Pods (and, when asked, reservation
  records, ResourceQuotas, and the ``resource.k8s.io/v1`` objects of Dynamic Resource
  Allocation: ResourceSlices, DeviceClasses, ResourceClaims, ResourceClaimTemplates,
  DeviceTaintRules; and kube-scheduler's PodGroups and Workloads,
  ``scheduling.k8s.io/v1beta1``). A cluster that does not serve ``resource.k8s.io/v1``
  (404) has no DRA: the kind counts as listed, empty, and is asked again every
  ``backoff_max_s``; one that does not serve ``scheduling.k8s.io/v1beta1`` (the
  ``GenericWorkload`` gate off, the default) has no PodGroup: the same, asked again
  every ``rediscover_s``.
  A watch resumes from the last resourceVersion it saw (bookmarks included); ``410
  Gone`` means that version is too old, so it lists again; a dropped connection
  (``ProtocolError``, timeouts, 5xx) reconnects with capped exponential backoff.
- :class:`ApiBinder`: ``POST .../pods/{name}/binding`` with the pod's UID as a
  precondition and the placement annotations on the Binding (the API server copies them
  onto the pod in the same write, so no pod patch and no ``patch pods`` right). The
  call passes ``_preload_content=False`` because the server answers with a ``Status``,
  not a ``Binding``, and the client's deserializer raises on it although the bind
  succeeded (kubernetes-client/python #547, #825).

Objects go to the cache as plain dicts (the API's JSON), which is what
:mod:`kube.objects` reads; the client's model classes are never built for them. The
``kubernetes`` package is imported inside the functions that use it.

Past 600 lines as one module: every kind, the optional ones (DRA's, PodGroups and
Workloads) included, goes through the one list and watch loop here, which owns resuming,
410 Gone, back-off and "not served"; the binder beside it shares the client's quirks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import socket
import threading
import time
from collections.abc import (
    Callable,
    Mapping,
)
from typing import Any

import orjson

from kube.annotations import small_int
from kube.dra_store import KINDS as DRA_KINDS
from kube.dra_store import object_key
from kube.groups import workload_api as wa
from kube.objects import pod_key
from kube.responses import finish
from kube.source import (
    BIND_TIMEOUT_S,
    BindError,
    BindUnknown,
    Codec,
    Decoded,
    DraSink,
    ObjectSink,
    RecordSink,
    Sink,
)

# A watch that ends sooner than this without an event counts as a failure (client-go:
# a watch of under a second with no events backs off before it is opened again).
log = logging.getLogger("gpupack.kube.source")
WORKLOAD_KINDS = (wa.PODGROUPS, wa.WORKLOADS)
WORKLOAD_API_OFF = (" (scheduling.k8s.io/v1beta1: feature gate GenericWorkload off, or the "
                    "version not enabled; pods' spec.schedulingGroup names no group gpupack "
                    "can read)")
# A watch that ends sooner than this without an event counts as a failure (client-go:
# a watch of under a second with no events backs off before it is opened again).
QUICK_WATCH_S = 1.0


def load_api_client(kubeconfig: str | None = None, in_cluster: bool = False) -> Any:
    """An ``ApiClient`` from in-cluster config or a kubeconfig file."""
    from kubernetes import client, config

    if in_cluster:
        config.load_incluster_config()
    else:
        config.load_kube_config(config_file=kubeconfig)
    return client.ApiClient()


def api_config_error(kubeconfig: str | None = None, in_cluster: bool = False) -> str | None:
    """Why :func:`load_api_client` would fail (None: it would not), without network.
    Servers check this before forking workers, so a missing service account or kubeconfig
    is one clear line and exit status 2, not a worker that fails to boot."""
    try:
        load_api_client(kubeconfig, in_cluster)
    except Exception as e:  # ConfigException, OSError, YAML errors: all mean "cannot"
        where = "--in-cluster" if in_cluster else f"--kubeconfig {kubeconfig or '(default)'}"
        return f"{where}: {e}"
    return None


def _read_json(resp: Any) -> Any:
    data = resp.data if hasattr(resp, "data") else resp.read()
    return json.loads(data)


class ApiSource:
    """List + watch of Nodes and Pods into a sink, in two daemon threads; with
    ``records_namespace``, also gpupack's reservation records (ConfigMaps labelled
    ``records_selector`` in that namespace) into a record sink, in a third; with
    ``watch_quotas``, every ResourceQuota into a quota sink, in a fourth; with
    ``watch_dra``, each DRA kind into a DRA sink, a thread each; with ``workload_api``,
    every PodGroup and Workload into that sink, a thread each. The sink is marked synced
    once every kind has been listed (or found not served)."""

    def __init__(
        self,
        api_client: Any,
        watch_timeout_s: int = 300,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 30.0,
        sleep: Callable[[float], None] | None = None,
        records_namespace: str | None = None,
        records_selector: str = "",
        watch_quotas: bool = False,
        watch_dra: bool = False,
        list_page: int = 500,
        clock: Callable[[], float] = time.monotonic,
        workload_api: wa.WorkloadSink | None = None,
        rediscover_s: float = 60.0,
    ) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.resource = client.ResourceV1Api(api_client)
        self.clock = clock  # times a watch: how long it stayed open
        self.watch_timeout_s = watch_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._stop = threading.Event()
        # A back-off pause; by default one that stop() ends at once.
        self.sleep: Callable[[float], Any] = sleep if sleep is not None else self._stop.wait
        self._threads: list[threading.Thread] = []
        self.records_namespace = records_namespace
        self.records_selector = records_selector
        kinds = ["nodes", "pods"]
        if records_namespace:
            kinds.append("records")
        if watch_quotas:
            kinds.append("quotas")
        if watch_dra:
            kinds.extend(DRA_KINDS)
        # kube-scheduler's Workload API: optional kinds (the gate is off by default).
        self._workload_api = workload_api
        self.rediscover_s = rediscover_s
        self.custom: Any = None
        if workload_api is not None:
            kinds += [wa.PODGROUPS, wa.WORKLOADS]
            self.custom = client.CustomObjectsApi(api_client)
        self._kinds = tuple(kinds)
        self._listed = {k: threading.Event() for k in self._kinds}
        self.relists = dict.fromkeys(self._kinds, 0)
        self.reconnects = dict.fromkeys(self._kinds, 0)
        self._resume: dict[str, str | None] = dict.fromkeys(self._kinds)
        # events skipped as unreadable (logged)
        self.bad_events = dict.fromkeys(self._kinds, 0)
        self._watches: list[Any] = []  # open watch responses, closed by stop()
        self._records: RecordSink | None = None
        self._quotas: ObjectSink | None = None
        self._dra: DraSink | None = None
        # Optional kinds (DRA, PodGroups, Workloads) the API server does not serve (404).
        self.not_served: set[str] = set()
        self.list_page = list_page

    def start(self, sink: Sink, records: RecordSink | None = None,
              quotas: ObjectSink | None = None, dra: DraSink | None = None) -> None:
        if self.records_namespace and records is None:
            raise ValueError("ApiSource with records_namespace needs a record sink")
        if "quotas" in self._kinds and quotas is None:
            raise ValueError("ApiSource with watch_quotas needs a quota sink")
        if DRA_KINDS[0] in self._kinds and dra is None:
            raise ValueError("ApiSource with watch_dra needs a DRA sink")
        self._records = records
        self._quotas = quotas
        self._dra = dra
        for kind in self._kinds:
            t = threading.Thread(
                target=self._run, args=(kind, sink), daemon=True, name=f"gpupack-watch-{kind}"
            )
            t.start()
            self._threads.append(t)

        def synced() -> None:
            for ev in self._listed.values():
                while not ev.wait(0.5):
                    if self._stop.is_set():
                        return
            sink.mark_synced()

        threading.Thread(target=synced, daemon=True, name="gpupack-synced").start()

    def stop(self) -> None:
        self._stop.set()
        for resp in list(self._watches):
            _abort(resp)

    def join(self, timeout: float) -> bool:
        """Wait for the watch threads to end; whether they all did."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def _list_fn(self, kind: str) -> Callable[..., Any]:
        if kind == "records":
            ns, selector = self.records_namespace or "", self.records_selector

            def records(**kw: Any) -> Any:
                return self.core.list_namespaced_config_map(ns, label_selector=selector, **kw)
            return records
        if kind == "quotas":
            return self.core.list_resource_quota_for_all_namespaces
        dra: dict[str, Callable[..., Any]] = {"resourceslices": self.resource.list_resource_slice,
               "deviceclasses": self.resource.list_device_class,
               "resourceclaims": self.resource.list_resource_claim_for_all_namespaces,
               "resourceclaimtemplates":
                   self.resource.list_resource_claim_template_for_all_namespaces,
               "devicetaintrules": self.resource.list_device_taint_rule}
        if kind in dra:
            return dra[kind]
        if kind in (wa.PODGROUPS, wa.WORKLOADS):
            def scheduling(**kw: Any) -> Any:
                return self.custom.list_cluster_custom_object(wa.GROUP, wa.VERSION, kind, **kw)
            return scheduling
        return self.core.list_node if kind == "nodes" else self.core.list_pod_for_all_namespaces

    def _run(self, kind: str, sink: Sink) -> None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        backoff = self.backoff_initial_s
        gone_again = False  # a 410 with no watch that delivered since the last one
        while not self._stop.is_set():
            rv = self._resume.get(kind)
            try:
                if rv is None:
                    self._resume[kind] = self._list(kind, sink)
                    self._listed[kind].set()
                    if self._stop.is_set():
                        return
                started = self.clock()
                read = self._watch(kind, sink)
                if self._stop.is_set():
                    return
                if read > 0:
                    backoff = self.backoff_initial_s  # it delivered: no backoff
                    gone_again = False
                elif self.clock() - started >= QUICK_WATCH_S:
                    # Open until the server's time-out on a quiet cluster: the connection
                    # works, so the next trouble starts from the first step again, as
                    # client-go's back-off does once things went well for a while. Not
                    # in a run of 410s: a server that holds each watch a second and then
                    # answers 410 would get a full relist every other second.
                    if not gone_again:
                        backoff = self.backoff_initial_s
                else:
                    # Ended at once with nothing (a proxy closing every watch): as
                    # client-go does, a failure; reopened at once, it would loop.
                    log.warning("%s watch ended at once without events; reopening in %.1fs",
                                kind, backoff)
                    backoff = self._backoff(kind, backoff)
            except ApiException as e:
                if e.status == 404 and (kind in DRA_KINDS or kind in WORKLOAD_KINDS):
                    # The API server does not serve resource.k8s.io/v1, or
                    # scheduling.k8s.io/v1beta1 (or this kind of it): no such objects.
                    # Listed, empty; asked again later.
                    if kind not in self.not_served:
                        log.info("%s: not served by the API server (404); treated as none%s",
                                 kind, "" if kind in DRA_KINDS else WORKLOAD_API_OFF)
                    self.not_served.add(kind)
                    if kind in DRA_KINDS:
                        assert self._dra is not None
                        self._dra.replace_dra(kind, [])
                    else:
                        assert self._workload_api is not None
                        self._workload_api.replace_workload_objects(kind, [], served=False)
                    self._listed[kind].set()
                    self._resume[kind] = None
                    self.sleep(self.backoff_max_s if kind in DRA_KINDS else self.rediscover_s)
                    continue
                if kind in WORKLOAD_KINDS and not self._listed[kind].is_set():
                    # The verbs must not wait on an optional kind (403: the chart's RBAC
                    # is missing): listed, as it was; retried the usual way below.
                    log.warning("%s: API error %s %s; groups by spec.schedulingGroup wait "
                                "until it can be listed", kind, e.status, e.reason)
                    assert self._workload_api is not None
                    self._workload_api.workload_listed(kind)
                    self._listed[kind].set()
                if e.status == 410:
                    log.info("%s watch: resourceVersion %s is gone; listing again", kind, rv)
                    self.relists[kind] += 1
                    self._resume[kind] = None
                    if gone_again:
                        # Gone again before any watch delivered (a list slower than its
                        # continue token lives, a proxy): list again, but not at once.
                        backoff = self._backoff(kind, backoff)
                    gone_again = True
                    continue
                log.warning(
                    "%s list/watch: API error %s %s; retrying in %.1fs",
                    kind,
                    e.status,
                    e.reason,
                    backoff,
                )
                backoff = self._backoff(kind, backoff)
            except (HTTPError, OSError, ValueError) as e:
                # ProtocolError (connection dropped mid-stream), timeouts, refused
                # connections, a truncated JSON line: reconnect from the last version.
                if self._stop.is_set():
                    return
                log.warning("%s watch: %s; reconnecting in %.1fs", kind, e, backoff)
                backoff = self._backoff(kind, backoff)
            except Exception:
                if self._stop.is_set():
                    return  # stop() closed the stream under the reader
                # Anything else is a bug on our side (the cache, an odd object): keep
                # watching rather than leave the cache frozen, and list afresh.
                log.exception("%s list/watch failed; listing again in %.1fs", kind, backoff)
                self._resume[kind] = None
                backoff = self._backoff(kind, backoff)

    def _backoff(self, kind: str, current: float) -> float:
        self.reconnects[kind] += 1
        self.sleep(current * (0.5 + random.random() / 2))  # jitter: no thundering herd
        return min(current * 2, self.backoff_max_s)

    def _list(self, kind: str, sink: Sink) -> str:
        if kind in ("nodes", "pods"):
            return self._list_paged(kind, sink)
        resp = self._list_fn(kind)(_preload_content=False, _request_timeout=60)
        body = _read_json(resp)
        items = body.get("items") or []
        if kind == "records":
            assert self._records is not None
            self._records.replace_records(items)
        elif kind == "quotas":
            assert self._quotas is not None
            self._quotas.replace([o for o in items if isinstance(o, Mapping)])
        elif kind in DRA_KINDS:
            assert self._dra is not None
            self.not_served.discard(kind)
            self._dra.replace_dra(kind, [o for o in items if isinstance(o, Mapping)])
        elif kind in WORKLOAD_KINDS:
            assert self._workload_api is not None
            if kind in self.not_served or not self._listed[kind].is_set():
                log.info("%s/%s %s served: watching them", wa.GROUP, wa.VERSION, kind)
            self.not_served.discard(kind)
            self._workload_api.replace_workload_objects(
                kind, [o for o in items if isinstance(o, Mapping)], served=True)
        elif kind == "nodes":
            sink.replace(items, None)
        else:
            sink.replace(None, items)
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _list_paged(self, kind: str, sink: Sink) -> str:
        """List nodes or pods ``list_page`` at a time (``limit``/``continue``, as
        client-go's reflector pages), each page's objects kept encoded (:class:`Codec`),
        then fed to the sink decoded one at a time. A 50,000-pod list was one response
        body and every pod as dicts at once (hundreds of MiB, kept by the allocator after
        it was freed); now it is one page of dicts at a time and ~10% of the JSON. An
        expired continue token answers 410 Gone: the caller lists again."""
        codec = Codec()
        kept: list[bytes | dict[str, Any]] = []
        token: str | None = None
        rv = ""
        while True:
            kw: dict[str, Any] = {"limit": self.list_page}
            if token:
                kw["_continue"] = token
            resp = self._list_fn(kind)(_preload_content=False, _request_timeout=60, **kw)
            data = resp.data if hasattr(resp, "data") else resp.read()
            try:
                body = orjson.loads(data)
            except orjson.JSONDecodeError:  # what orjson refuses (64-bit overflow): json
                body = json.loads(data)
            del data
            if not isinstance(body, Mapping):
                raise ValueError(f"{kind} list: not an object")
            meta = body.get("metadata") or {}
            for item in body.get("items") or []:
                kept.append(codec.encode(item) if isinstance(item, Mapping) else item)
            del body
            rv = str(meta.get("resourceVersion") or rv)
            token = meta.get("continue") or None
            if not token:
                break
        objects = Decoded(kept, codec)
        if kind == "nodes":
            sink.replace(objects, None)
        else:
            sink.replace(None, objects)
        return rv

    def _watch(self, kind: str, sink: Sink) -> int:
        """Stream events from the resume version until the server ends the watch; how
        many events (bookmarks included) it read.

        The resume version moves with every event and bookmark as it is read, so a
        connection dropped mid-stream resumes where it broke, not at the last list.

        The watch request is made directly (``watch=True``, ``_preload_content=False``)
        and its lines parsed here rather than through ``kubernetes.watch.Watch``: that
        helper either builds a model object per event (costly for every pod update) or,
        with ``deserialize=False``, fails with a KeyError on the ERROR event that
        carries 410 Gone (37.0.2), the one event this loop must act on.
        """
        from kubernetes.watch.watch import iter_resp_lines

        if self._stop.is_set():
            return 0
        resp = self._list_fn(kind)(
            watch=True,
            resource_version=self._resume[kind],
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_s,
            _preload_content=False,
            _request_timeout=(10, self.watch_timeout_s + 30),
        )
        self._watches.append(resp)
        read = 0
        try:
            if self._stop.is_set():
                _abort(resp)  # stop() ran before it was listed: it closed the others only
                return read
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    break
                if not line or line.isspace():
                    continue
                self._event(kind, json.loads(line), sink)
                read += 1
        finally:
            self._watches.remove(resp)
            resp.release_conn()
        return read

    def _event(self, kind: str, event: Any, sink: Sink) -> None:
        """One watch event into the sink; ApiException for an ERROR event.

        An event the loop cannot act on (not an object, an object without a usable
        ``metadata.name``, metadata that is not a mapping, an unknown type) is logged,
        counted in ``bad_events`` and skipped: it must neither stop the watch (that
        would list everything again, and meet the same event again) nor reach the
        cache under a made-up key such as ``default/``."""
        from kubernetes.client.exceptions import ApiException

        if not isinstance(event, Mapping):
            self._bad(sink, kind, "event is not an object", event)
            return
        etype = event.get("type")
        obj = event.get("object")
        shown = etype if isinstance(etype, str) and len(etype) <= 20 else _short(etype, 40)
        if etype == "ERROR":
            raise ApiException(status=_error_code(obj), reason=_error_message(obj))
        if not isinstance(obj, Mapping):
            self._bad(sink, kind, f"{shown} event without an object", obj)
            return
        meta = obj.get("metadata")
        if meta is None:
            meta = {}
        if not isinstance(meta, Mapping):
            self._bad(sink, kind, f"{shown} event whose metadata is not an object", meta)
            return
        rv = meta.get("resourceVersion")
        if (isinstance(rv, str) and rv) or (isinstance(rv, int) and not isinstance(rv, bool)):
            self._resume[kind] = str(rv)
        if etype == "BOOKMARK":
            return  # only the version matters: a cheaper resume point
        if etype not in ("ADDED", "MODIFIED", "DELETED"):
            self._bad(sink, kind, f"unknown event type {_short(etype, 40)}", obj)
            return
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            self._bad(sink, kind, f"{shown} event for an object without metadata.name", meta)
            return
        if kind == "records":
            assert self._records is not None
            if etype == "DELETED":
                self._records.delete_record(name)
            else:
                self._records.upsert_record(obj)
            return
        if kind == "quotas":
            assert self._quotas is not None
            if etype == "DELETED":
                self._quotas.delete(obj)
            else:
                self._quotas.upsert(obj)
            return
        if kind in WORKLOAD_KINDS:
            assert self._workload_api is not None
            if etype == "DELETED":
                self._workload_api.delete_workload_object(kind, obj)
            else:
                self._workload_api.upsert_workload_object(kind, obj)
            return
        if kind in DRA_KINDS:
            assert self._dra is not None
            key = object_key(kind, obj)
            if etype == "DELETED":
                if key is not None:
                    self._dra.delete_dra(kind, key)
            else:
                self._dra.upsert_dra(kind, obj)
            return
        if kind == "nodes":
            if etype == "DELETED":
                sink.delete_node(name)
            else:
                sink.upsert_node(obj)
            return
        namespace = meta.get("namespace")
        if namespace is not None and not isinstance(namespace, str):
            self._bad(sink, kind, f"{shown} event for a pod whose metadata.namespace is not a "
                      "string", meta)
            return
        if etype == "DELETED":
            sink.delete_pod(pod_key(obj))
        else:
            sink.upsert_pod(obj)

    def _bad(self, sink: Sink, kind: str, why: str, what: Any) -> None:
        self.bad_events[kind] += 1
        sink.note_bad_object()
        log.warning("%s watch: skipping an event: %s: %s", kind, why, _short(what))


def _short(v: Any, limit: int = 200) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_code(obj: Any) -> int:
    """The HTTP status an ERROR watch event carries (its Status object's ``code``).

    An int, or a string of ASCII digits (some proxies and API server fakes send "410")
    read as that int, so "410" lists again like 410 does; anything else (missing, a
    float, a bool, text, a number that is no HTTP status) is 500."""
    code = obj.get("code") if isinstance(obj, Mapping) else None
    if isinstance(code, str):
        code = small_int(code.strip())
    if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599:
        return code
    return 500


def _error_message(obj: Any) -> str:
    message = obj.get("message") if isinstance(obj, Mapping) else None
    return "" if message is None else str(message)[:500]


class ApiBinder:
    """Creates Bindings and records the placement on the pod; ``timeout_s`` per Binding
    (:data:`kube.source.BIND_TIMEOUT_S`)."""

    def __init__(self, api_client: Any, timeout_s: float = BIND_TIMEOUT_S) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.timeout_s = timeout_s

    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
        pod: Mapping[str, Any] | None = None,
    ) -> None:
        del pod  # the API server has the pod
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        body = client.V1Binding(
            metadata=client.V1ObjectMeta(
                name=name, namespace=namespace, uid=uid or None, annotations=dict(annotations)
            ),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        try:
            resp = self.core.create_namespaced_binding(
                namespace, body, _preload_content=False,
                _request_timeout=(min(self.timeout_s, 10.0), self.timeout_s)
            )
        except ApiException as e:
            raise BindError(_status_message(e)) from None
        except (HTTPError, OSError) as e:
            # Sent, perhaps applied: the API server's answer did not come back in time.
            raise BindUnknown(f"binding {namespace}/{name} to {node}: no answer within "
                              f"{self.timeout_s:g}s ({e})") from None
        status = getattr(resp, "status", 201)
        finish(resp)
        if not 200 <= int(status) < 300:
            raise BindError(f"binding {namespace}/{name} to {node}: HTTP {status}")


def _status_message(e: Any) -> str:
    """The ``message`` of the Status the API server sent, else the HTTP reason."""
    try:
        status = json.loads(e.body)
        if isinstance(status, dict) and status.get("message"):
            return f"{status.get('reason') or e.status}: {status['message']}"
    except (TypeError, ValueError):
        pass
    return f"HTTP {e.status}: {e.reason}"


def _abort(resp: Any) -> None:
    """Unblock the thread reading a watch response, at once.

    ``resp.close()`` from here would wait for the reader's buffer lock, that is until the
    API server sends an event or ends the watch (``timeoutSeconds``: up to 5 minutes on
    a quiet cluster). Shutting the socket down makes the blocked read return now; the
    reading thread then sees the stop flag and closes the response itself."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is None:
        resp.close()  # not connected: nothing can be blocked reading it
        return
    with contextlib.suppress(OSError):  # already closed by the other side
        sock.shutdown(socket.SHUT_RDWR)
