"""A FAKE of the few kube-apiserver endpoints gpupack's cluster layer uses. Not an API
server: just enough to drive the real ``kubernetes`` client over real HTTP.

Endpoints:
- ``GET /api/v1/nodes`` and ``GET /api/v1/pods``: a List with ``metadata.resourceVersion``
  (``limit`` pages it, ``continue`` naming the next page);
  with ``watch=true``, a chunked stream of JSON watch events after ``resourceVersion``
  (``BOOKMARK`` events when asked for and triggered), ended by ``timeoutSeconds``.
  A version older than the compaction point gets an ``ERROR`` event carrying a 410
  ``Status`` (what the real server sends once its watch cache moved on).
- ``POST /api/v1/namespaces/{ns}/pods/{name}/binding`` and ``POST
  /api/v1/namespaces/{ns}/bindings``: bind like the real server:
  404 for an unknown pod, 409 when ``metadata.uid`` does not match or the pod is bound
  already, else 201 with a ``Status`` body (not a Binding), merging the Binding's
  annotations into the pod.
- ``PATCH /api/v1/namespaces/{ns}/pods/{name}``: JSON merge patch of annotations.
- ConfigMaps: ``GET /api/v1/namespaces/{ns}/configmaps`` (list and watch, with an
  equality ``labelSelector``), ``POST`` (create; 409 when it exists), ``PUT .../{name}``
  (replace; 404 when missing), ``DELETE .../{name}``.
- ``GET /apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}`` (put leases with
  :meth:`FakeApiServer.put` kind ``leases``).
- ``GET /api/v1/resourcequotas`` (list and watch; kind ``resourcequotas``).
- ``GET /apis/resource.k8s.io/v1/{resourceslices,deviceclasses,devicetaintrules,
  resourceclaims,resourceclaimtemplates}`` (list and watch, kinds of those names): 404
  while :attr:`FakeApiServer.dra_served` is False, as on a cluster without DRA.
- ``GET /apis/leaderworkerset.x-k8s.io/v1/leaderworkersets`` (list; kind
  ``leaderworkersets``): 404 while :attr:`FakeApiServer.lws_installed` is False, as when
  the CRD is absent.
- ``GET /apis/scheduling.k8s.io/v1beta1/podgroups`` and ``.../workloads`` (list and
  watch; kinds ``podgroups``, ``workloads``): 404 while
  :attr:`FakeApiServer.workload_api_served` is False, as with the ``GenericWorkload``
  gate off.

Test controls: :meth:`FakeApiServer.drop_watches` cuts every open watch mid-stream (the
client sees a broken chunked response), :meth:`compact` makes older versions 410,
:meth:`bookmark` sends a bookmark on open watches.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

DRA_KINDS = ("resourceslices", "deviceclasses", "devicetaintrules", "resourceclaims",
             "resourceclaimtemplates")


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # open watches end by themselves; do not wait for them
    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hanging up on watches are normal here; no tracebacks on stderr."""


class FakeApiServer:
    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.rv = 100
        self.compacted = 0
        self.objects: dict[str, dict[str, dict[str, Any]]] = {
            "nodes": {}, "pods": {}, "configmaps": {}, "leases": {}, "resourcequotas": {},
            "leaderworkersets": {}, "podgroups": {}, "workloads": {},
            **{k: {} for k in DRA_KINDS}}
        self.lws_installed = False
        self.workload_api_served = False
        self.dra_served = True
        self.writes: list[tuple[str, str]] = []  # (method, path) of configmap writes
        self.events: list[tuple[int, str, str, dict[str, Any]]] = []  # rv, kind, type, obj
        self.bindings: list[dict[str, Any]] = []
        # Seconds a Binding waits before it is applied and answered (a slow API server:
        # the client may give up first, the bind is applied anyway).
        self.bind_delay_s = 0.0
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.watch_requests: list[tuple[str, str]] = []  # (kind, resourceVersion asked)
        self.list_requests: list[str] = []
        self._drop_gen = 0
        self._bookmark_gen = 0
        self.httpd = _QuietServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> FakeApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.drop_watches()
        self.httpd.shutdown()
        self.httpd.server_close()

    # ---- state changes (as a controller or kubelet would make them) -----------------------

    @staticmethod
    def key(kind: str, obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        if kind == "nodes":
            return str(meta["name"])
        if kind in ("resourceslices", "deviceclasses", "devicetaintrules"):
            return str(meta["name"])
        if kind in ("configmaps", "leases", "resourcequotas", "leaderworkersets", "podgroups",
                    "workloads"):
            return f"{meta['namespace']}/{meta['name']}"
        return f"{meta.get('namespace', 'default')}/{meta['name']}"

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            k = self.key(kind, obj)
            etype = "MODIFIED" if k in self.objects[kind] else "ADDED"
            self.objects[kind][k] = obj
            self.events.append((self.rv, kind, etype, obj))
            self.lock.notify_all()

    def delete(self, kind: str, key: str) -> None:
        with self.lock:
            obj = self.objects[kind].pop(key)
            self.rv += 1
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.rv)}}
            self.events.append((self.rv, kind, "DELETED", obj))
            self.lock.notify_all()

    def compact(self) -> None:
        """Versions up to now are gone from the watch cache: resuming from them is 410."""
        with self.lock:
            self.compacted = self.rv

    def drop_watches(self) -> None:
        with self.lock:
            self._drop_gen += 1
            self.lock.notify_all()

    def bookmark(self) -> None:
        with self.lock:
            self._bookmark_gen += 1
            self.lock.notify_all()


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure" if code >= 400 else "Success",
            "message": message, "reason": reason, "code": code}


def _selected(obj: dict[str, Any], q: dict[str, str]) -> bool:
    """Whether ``obj`` is in the namespace and matches the equality label selector asked."""
    if not q.get("namespace") and not q.get("labelSelector"):
        return True  # nothing asked: every event goes out, however odd its object
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return True  # an ERROR Status, a malformed object: the client must see it
    if q.get("namespace") and meta.get("namespace") != q["namespace"]:
        return False
    labels = meta.get("labels") or {}
    for term in filter(None, (q.get("labelSelector") or "").split(",")):
        k, _, v = term.partition("=")
        if labels.get(k) != v:
            return False
    return True


def _handler(fake: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}")

        def do_GET(self) -> None:
            url = urlparse(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            kind = {"/api/v1/nodes": "nodes", "/api/v1/pods": "pods",
                    "/api/v1/resourcequotas": "resourcequotas"}.get(url.path)
            dra = re.fullmatch(r"/apis/resource.k8s.io/v1/([a-z]+)", url.path)
            if dra is not None and dra.group(1) in DRA_KINDS:
                if not fake.dra_served:
                    self._send(404, _status(404, "NotFound", "the server could not find the "
                                            "requested resource"))
                    return
                kind = dra.group(1)
            if url.path == "/apis/leaderworkerset.x-k8s.io/v1/leaderworkersets":
                if not fake.lws_installed:
                    self._send(404, _status(404, "NotFound", "the server could not find the "
                                            "requested resource"))
                    return
                kind = "leaderworkersets"
            scheduling = re.fullmatch(r"/apis/scheduling.k8s.io/v1beta1/(podgroups|workloads)",
                                      url.path)
            if scheduling is not None:
                with fake.lock:
                    fake.list_requests.append(f"try:{scheduling.group(1)}")
                if not fake.workload_api_served:
                    self._send(404, _status(404, "NotFound", "the server could not find the "
                                            "requested resource"))
                    return
                kind = scheduling.group(1)
            lease = re.fullmatch(r"/apis/coordination.k8s.io/v1/namespaces/([^/]+)/leases/"
                                 r"([^/]+)", url.path)
            if lease is not None:
                with fake.lock:
                    obj = fake.objects["leases"].get("/".join(lease.groups()))
                if obj is None:
                    self._send(404, _status(404, "NotFound", "lease not found"))
                else:
                    self._send(200, obj)
                return
            cms = re.fullmatch(r"/api/v1/namespaces/([^/]+)/configmaps", url.path)
            if cms is not None:
                kind = "configmaps"
                q["namespace"] = cms.group(1)
            if kind is None:
                self._send(404, _status(404, "NotFound", f"no route {url.path}"))
                return
            if q.get("watch") in ("true", "1", "True"):
                self._watch(kind, q)
                return
            with fake.lock:
                fake.list_requests.append(kind)
                items = [copy.deepcopy(o) for o in fake.objects[kind].values()
                         if _selected(o, q)]
                rv = fake.rv
            meta: dict[str, Any] = {"resourceVersion": str(rv)}
            limit, start = int(q.get("limit") or 0), int(q.get("continue") or 0)
            if limit:  # pages: the continue token is the offset of the next one
                if start + limit < len(items):
                    meta["continue"] = str(start + limit)
                items = items[start:start + limit]
            self._send(200, {"kind": "NodeList" if kind == "nodes" else "PodList",
                             "apiVersion": "v1", "metadata": meta, "items": items})

        def _chunk(self, obj: Any) -> None:
            data = (json.dumps(obj) + "\n").encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _watch(self, kind: str, q: dict[str, str]) -> None:
            since = int(q.get("resourceVersion") or 0)
            timeout = float(q.get("timeoutSeconds") or 30)
            bookmarks = q.get("allowWatchBookmarks") in ("true", "1", "True")
            with fake.lock:
                fake.watch_requests.append((kind, q.get("resourceVersion", "")))
                drop_gen = fake._drop_gen
                bm_gen = fake._bookmark_gen
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if since <= fake.compacted:
                self._chunk({"type": "ERROR", "object": _status(
                    410, "Expired", f"too old resource version: {since} ({fake.compacted})")})
                self.wfile.write(b"0\r\n\r\n")
                return
            end = time.monotonic() + timeout
            sent = since
            while True:
                with fake.lock:
                    while True:
                        new = [e for e in fake.events if e[0] > sent and e[1] == kind
                               and _selected(e[3], q)]
                        dropped = fake._drop_gen != drop_gen
                        bm = bookmarks and fake._bookmark_gen != bm_gen
                        if new or dropped or bm or time.monotonic() >= end:
                            break
                        fake.lock.wait(min(0.05, max(0.0, end - time.monotonic())))
                    bm_gen = fake._bookmark_gen
                    current = fake.rv
                try:
                    if dropped:
                        # Cut mid-stream: half a chunk, then close. The client sees a
                        # broken chunked response (urllib3 ProtocolError).
                        self.wfile.write(b"40\r\n{\"type\": \"ADD")
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    for rv, _, etype, obj in new:
                        self._chunk({"type": etype, "object": obj})
                        sent = rv
                    if bm:
                        self._chunk({"type": "BOOKMARK", "object": {
                            "kind": "Node" if kind == "nodes" else "Pod", "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(current)}}})
                        sent = max(sent, current)
                    if time.monotonic() >= end:
                        self.wfile.write(b"0\r\n\r\n")
                        return
                except (BrokenPipeError, ConnectionResetError):
                    return

        def do_POST(self) -> None:
            # Both routes the real server has: the pods/binding subresource, and the
            # namespaced bindings collection (what create_namespaced_binding posts to),
            # which takes the pod name from the Binding's metadata.
            if self._configmap_write("POST"):
                return
            path = urlparse(self.path).path
            binding = self._body()
            m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/binding", path)
            m2 = re.fullmatch(r"/api/v1/namespaces/([^/]+)/bindings", path)
            if m is not None:
                ns, name = m.groups()
            elif m2 is not None:
                ns, name = m2.group(1), (binding.get("metadata") or {}).get("name", "")
            else:
                self._send(404, _status(404, "NotFound", "no route"))
                return
            if fake.bind_delay_s:
                time.sleep(fake.bind_delay_s)
            with fake.lock:
                fake.bindings.append(binding)
                pod = fake.objects["pods"].get(f"{ns}/{name}")
                if pod is None:
                    self._send(404, _status(404, "NotFound", f'pods "{name}" not found'))
                    return
                uid = (binding.get("metadata") or {}).get("uid")
                if uid and uid != pod["metadata"].get("uid"):
                    self._send(409, _status(409, "Conflict", (
                        f"Operation cannot be fulfilled on pods/binding \"{name}\": "
                        f"Precondition failed: UID in precondition: {uid}, "
                        f"UID in object meta: {pod['metadata'].get('uid')}")))
                    return
                if pod["spec"].get("nodeName"):
                    self._send(409, _status(409, "Conflict", (
                        f"Operation cannot be fulfilled on pods/binding \"{name}\": pod "
                        f"{name} is already assigned to node \"{pod['spec']['nodeName']}\"")))
                    return
                updated = copy.deepcopy(pod)
                updated["spec"]["nodeName"] = binding["target"]["name"]
                ann = (binding.get("metadata") or {}).get("annotations") or {}
                if ann:
                    updated["metadata"].setdefault("annotations", {}).update(ann)
            fake.put("pods", updated)
            self._send(201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                             "status": "Success", "code": 201})

        def _configmap_write(self, method: str) -> bool:
            """POST/PUT/DELETE of a ConfigMap; False when the path is not one."""
            path = urlparse(self.path).path
            m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/configmaps(?:/([^/]+))?", path)
            if m is None:
                return False
            ns, name = m.groups()
            body = self._body() if method in ("POST", "PUT") else {}
            if method == "POST":
                name = (body.get("metadata") or {}).get("name")
            key = f"{ns}/{name}"
            with fake.lock:
                fake.writes.append((method, key))
                exists = key in fake.objects["configmaps"]
            if method == "POST" and exists:
                self._send(409, _status(409, "AlreadyExists", f'configmaps "{name}" exists'))
            elif method in ("PUT", "DELETE") and not exists:
                self._send(404, _status(404, "NotFound", f'configmaps "{name}" not found'))
            elif method == "DELETE":
                fake.delete("configmaps", key)
                self._send(200, _status(200, "Success", "deleted"))
            else:
                body.setdefault("metadata", {})["namespace"] = ns
                fake.put("configmaps", body)
                self._send(201 if method == "POST" else 200,
                           fake.objects["configmaps"][key])
            return True

        def do_PUT(self) -> None:
            if not self._configmap_write("PUT"):
                self._send(404, _status(404, "NotFound", "no route"))

        def do_DELETE(self) -> None:
            if not self._configmap_write("DELETE"):
                self._send(404, _status(404, "NotFound", "no route"))

        def do_PATCH(self) -> None:
            m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", urlparse(self.path).path)
            if m is None:
                self._send(404, _status(404, "NotFound", "no route"))
                return
            ns, name = m.groups()
            patch = self._body()
            with fake.lock:
                fake.patches.append((self.headers.get("Content-Type", ""), patch))
                pod = fake.objects["pods"].get(f"{ns}/{name}")
                if pod is None:
                    self._send(404, _status(404, "NotFound", f'pods "{name}" not found'))
                    return
                updated = copy.deepcopy(pod)
                ann = (patch.get("metadata") or {}).get("annotations") or {}
                updated["metadata"].setdefault("annotations", {}).update(ann)
            fake.put("pods", updated)
            self._send(200, fake.objects["pods"][f"{ns}/{name}"])

    return Handler
