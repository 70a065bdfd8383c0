"""The extender's Flask app: HTTP in, verbs, HTTP out. Built by a factory, no globals.

Each handler reads the body (bounded), decodes it with :mod:`scheduler.wire`, runs the
pure verb under the cache lock and encodes the answer. Anything wrong with the input is
a 400 with a JSON body naming the field; a 500 means a bug, never bad input.

Bind: choose the GPUs on the node and reserve them in the cache (under the lock, so two
racing binds cannot take the same GPU), then create the Binding outside the lock; if the
API refuses it, the reservation is dropped at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from werkzeug.exceptions import HTTPException

from kube.annotations import placement_annotations
from kube.objects import pod_key
from kube.source import Binder, BindError
from scheduler.cache import AssumeError, ClusterCache
from scheduler.groups import ReservationBook
from scheduler.metrics import ExtenderMetrics, GroupMetrics
from scheduler.planner import Planner
from scheduler.request_pods import RequestPod, RequestPods
from scheduler.verbs import (
    BestCandidates,
    Memo,
    VerbError,
    choose_placement,
    filter_nodes,
    preempt,
    prioritize,
    read_pod,
)
from scheduler.warm import Warmer
from scheduler.wire import (
    BindingArgs,
    BindingResult,
    ExtenderArgs,
    PreemptionArgs,
    WireError,
    encode_priorities,
)

log = logging.getLogger("gpupack.scheduler.app")

DEFAULT_MAX_BODY = 8 * 1024 * 1024


@dataclass(frozen=True)
class AppConfig:
    max_body_bytes: int = DEFAULT_MAX_BODY
    policy: str = "gpupack"
    memo_limit: int = 500_000
    warm: bool = True  # fill the memo in the background for pending shapes (scheduler.warm)
    # Filter hands back at most this many fitting nodes, the policy's best (0: all of
    # them); see scheduler.verbs.BestCandidates.
    filter_top: int = 0


class InFlight:
    """WSGI wrapper counting requests in flight, so background work can step aside."""

    def __init__(self, wsgi: Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
                 ) -> None:
        self.wsgi = wsgi
        self.count = 0
        self._lock = threading.Lock()

    def busy(self) -> bool:
        return self.count > 0

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        with self._lock:
            self.count += 1
        try:
            return self.wsgi(environ, start_response)
        finally:
            with self._lock:
                self.count -= 1


class BadRequest(ValueError):
    """Input the extender cannot use: answered with HTTP 400 and this message."""


class NotReady(RuntimeError):
    """Not answering yet (first lists or the reservation rebuild not done, or not the
    leader): HTTP 503, an error kube-scheduler retries the pod after."""


def _json(obj: Any, status: int = 200) -> Response:
    # orjson: ~6x faster than json.dumps on the ~40 kB of FailedNodes reasons a 5,000-node
    # filter answers, ~1.5x on decoding the request (see bench/README.md, Extender).
    return Response(orjson.dumps(obj), status=status,
                    mimetype="application/json")


def create_app(
    cache: ClusterCache,
    planner: Planner,
    binder: Binder,
    registry: CollectorRegistry,
    config: AppConfig | None = None,
    groups: ReservationBook | None = None,
) -> Flask:
    cfg = config or AppConfig()
    app = Flask("gpupack.scheduler")
    # LLM groups (scheduler/groups.py): members are answered by the reservation book. A
    # book made here has no record source: its records start empty.
    book = groups or ReservationBook(cache, scorer=lambda: planner.scorer.scorer,
                                     records_listed=True)
    app.extensions["gpupack.groups"] = book
    metrics = ExtenderMetrics(registry, cache, planner, active=book.is_leader)
    memo = Memo(cfg.memo_limit)
    inflight = InFlight(app.wsgi_app)
    app.wsgi_app = inflight  # type: ignore[method-assign]
    warmer = Warmer(cache, memo, lambda: planner.scorer, busy=inflight.busy)
    app.extensions["gpupack.warmer"] = warmer
    # What /metrics serves, for the other listeners of the same process (metrics port,
    # webhook) so that every scrape sees the same families.
    app.extensions["gpupack.exposition"] = metrics.exposition
    if cfg.warm:
        warmer.start()
    # Pods seen only in filter/prioritize requests, for their bind (scheduler/request_pods).
    request_pods = RequestPods()
    app.extensions["gpupack.request_pods"] = request_pods
    GroupMetrics(registry, book)

    def body() -> bytes:
        length = request.content_length
        if length is not None and length > cfg.max_body_bytes:
            raise BadRequest(f"body of {length} bytes is over the limit of {cfg.max_body_bytes}")
        data = request.stream.read(cfg.max_body_bytes + 1)
        if len(data) > cfg.max_body_bytes:
            raise BadRequest(f"body is over the limit of {cfg.max_body_bytes} bytes")
        return data

    def decoded() -> Any:
        data = body()
        if not data:
            raise BadRequest("empty body: expected a JSON object")
        try:
            return orjson.loads(data)
        except (ValueError, RecursionError) as e:
            raise BadRequest(f"body is not valid JSON: {e}") from None

    def gate() -> None:
        """No answer from a cache that has not finished its first lists of nodes, pods and
        reservation records and rebuilt the reservations, nor from a standby."""
        if not book.check_ready():
            raise NotReady("gpupack is not synced yet: its first lists of nodes, pods and "
                           "reservation records, and the rebuild of the reservations, are "
                           "not done")
        if not book.is_leader():
            raise NotReady("this gpupack replica is not the leader (its kube-scheduler does "
                           "not hold the lease it follows)")

    def handle(verb: str, fn: Callable[[], Response]) -> Response:
        started = time.perf_counter()
        outcome = "ok"
        try:
            gate()
            return fn()
        except NotReady as e:
            outcome = "error"
            return _json({"error": str(e), "verb": verb}, 503)
        except (BadRequest, WireError, VerbError) as e:
            outcome = "bad_request"
            return _json({"error": str(e), "verb": verb}, 400)
        except RecursionError:
            # Only a body nested thousands deep gets here (some orjson releases parse any
            # depth; reading the result then overflows Python's stack).
            outcome = "bad_request"
            return _json({"error": "body is not valid JSON: nested too deeply",
                          "verb": verb}, 400)
        except Exception as e:
            if isinstance(e, orjson.JSONEncodeError) and "recursion" in str(e).lower():
                # Node objects are echoed back when nodeCacheCapable is false; one nested
                # deeper than orjson writes (254 levels) is the request's fault.
                outcome = "bad_request"
                return _json({"error": "the request's objects are nested too deeply to "
                              "answer with (over 254 levels)", "verb": verb}, 400)
            outcome = "error"
            log.exception("%s failed", verb)
            return _json({"error": f"internal error in {verb}; see the extender's log",
                          "verb": verb}, 500)
        finally:
            metrics.requests.labels(verb, outcome).inc()
            metrics.latency.labels(verb).observe(time.perf_counter() - started)

    @app.post("/filter")
    def filter_() -> Response:
        def run() -> Response:
            args = ExtenderArgs.decode(decoded())
            remember(args)
            with cache.view() as view:
                best = (BestCandidates(cfg.filter_top, warmer.current(), planner.plan)
                        if cfg.filter_top > 0 else None)
                result = book.filter(args) or filter_nodes(args, view, memo, best)
            return _json(result.encode())
        return handle("filter", run)

    @app.post("/prioritize")
    def prioritize_() -> Response:
        def run() -> Response:
            args = ExtenderArgs.decode(decoded())
            remember(args)
            plan = planner.plan
            with cache.view() as view:
                result = book.prioritize(args) or prioritize(
                    args, view, memo, warmer.current(), plan)
            return _json(encode_priorities(result))
        return handle("prioritize", run)

    def remember(args: ExtenderArgs) -> None:
        """A pod no list has shown: kept for its bind (the bind request names it only)."""
        key = pod_key(args.pod)
        if cache.pod_entry(key) is None:
            request_pods.remember(args.pod, read_pod(args.pod))

    @app.post("/bind")
    def bind_() -> Response:
        def run() -> Response:
            args = BindingArgs.decode(decoded())
            return _json(do_bind(args).encode())
        return handle("bind", run)

    def do_bind(args: BindingArgs) -> BindingResult:
        plan = planner.plan
        seen: RequestPod | None = None

        def refuse(why: str) -> BindingResult:
            if seen is not None:
                request_pods.put_back(seen)  # kube-scheduler retries the pod
            metrics.binds.labels("conflict").inc()
            return BindingResult(why)

        with cache.view() as view:
            if not view.has_node(args.node):
                raise BadRequest(f"ExtenderBindingArgs.Node: unknown node {args.node!r}")
            pod = view.pending_pod(args.pod_key)
            entry = view.pod_entry(args.pod_key)
            if pod is None and entry is None:
                if view.is_assumed(args.pod_key):
                    return refuse(f"pod {args.pod_key} is not pending (being bound already)")
                # Only a filter or prioritize request has shown this pod so far.
                seen = request_pods.take(args.pod_key, args.pod_uid)
                if seen is None:
                    return refuse(f"pod {args.pod_key} is not in gpupack's cache and no "
                                  "filter request showed it")
                pod = seen.req
            if pod is None:
                return refuse(f"pod {args.pod_key} is not pending (bound to "
                              f"{entry.node if entry else None})")
            if args.pod_uid and pod.uid and args.pod_uid != pod.uid:
                return refuse(f"pod {args.pod_key} has UID {pod.uid}, not {args.pod_uid}")
            # A group member gets its reserved room, already assumed (or why not).
            member = book.bind_member(pod, args.pod_uid or pod.uid, args.node)
            ref = warmer.current()
            choice = member if member is not None else choose_placement(
                view, pod, args.node, ref.scorer, plan, memo, ref.gen)
            if isinstance(choice, str):
                return refuse(choice)
            try:
                if member is None:
                    cache.assume(pod, args.pod_uid or pod.uid, choice)
            except AssumeError as e:
                return refuse(str(e))
        try:
            binder.bind(args.pod_namespace, args.pod_name, args.pod_uid or pod.uid, args.node,
                        placement_annotations(choice, cfg.policy),
                        pod=None if seen is None else seen.obj)
        except BindError as e:
            book.forget(pod.key)  # a group member's room is held again at once
            if seen is not None:
                request_pods.put_back(seen)
            metrics.binds.labels("api_error").inc()
            return BindingResult(str(e))
        except Exception as e:  # the reservation must not outlive a failed bind
            book.forget(pod.key)
            if seen is not None:
                request_pods.put_back(seen)
            metrics.binds.labels("api_error").inc()
            log.exception("bind of %s failed", pod.key)
            return BindingResult(f"bind of {pod.key} failed: {e}")
        metrics.binds.labels("ok").inc()
        return BindingResult()

    @app.post("/preempt")
    def preempt_() -> Response:
        def run() -> Response:
            args = PreemptionArgs.decode(decoded())
            read_pod(args.pod)
            with cache.view() as view:
                result = book.preempt(args) or preempt(args, view)
            return _json(result.encode())
        return handle("preempt", run)

    @app.get("/healthz")
    def healthz() -> Response:
        return _json({"ok": True})

    @app.get("/readyz")
    def readyz() -> Response:
        if not book.check_ready():
            why = ("cache not synced yet" if not cache.synced else
                   "reservation records not listed and rebuilt yet")
            return _json({"ready": False, "why": why}, 503)
        return _json({"ready": True, "nodes": cache.counts()["nodes"],
                      "leader": book.is_leader()})

    @app.get("/status")
    def status() -> Response:
        plan = planner.plan
        with cache.lock:
            counts = cache.counts()
        return _json({
            "synced": cache.synced, "ready": book.ready, "leader": book.is_leader(),
            "cache": counts,
            "plan": {"status": plan.status, "age_seconds": planner.age(),
                     "solve_seconds": plan.solve_seconds, "placements": len(plan.placements),
                     "unschedulable": len(plan.unschedulable), "error": plan.error},
            "memo": {"entries": memo.size, "shapes": len(memo.tables), "hits": memo.hits,
                     "misses": memo.misses, "node_signatures": cache.signature_count(),
                     "warmed": warmer.warmed},
        })

    @app.get("/metrics")
    def metrics_() -> Response:
        return Response(metrics.exposition(), mimetype=CONTENT_TYPE_LATEST)

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        code = e.code or 500
        # Flask's own 4xx (unknown path, wrong method) keep their codes, in JSON.
        return _json({"error": e.description or e.name}, code)

    return app
