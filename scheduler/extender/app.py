"""The extender's Flask app: HTTP in, extension point, HTTP out. No globals: the command
layer (:mod:`gpupack.extender_app`) builds the parts and hands them to
:func:`add_verb_routes` and :func:`add_info_routes`.

Each verb's route is a thin adapter (:func:`verb_route`): it refuses while not ready or
not the leader (503), reads the body (bounded), decodes it with :mod:`scheduler.extender.wire`,
calls the verb's extension point (:class:`scheduler.extender.points.ExtensionPoints`: typed
arguments in, typed result out) and encodes the answer, counting the outcome and the
latency. Anything wrong with the input is a 400 with a JSON body naming the field; a 500
means a bug, never bad input.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson
from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST
from werkzeug.exceptions import HTTPException

from kube.cache import ClusterCache
from scheduler.extender.cycle import VerbError
from scheduler.extender.metrics import ExtenderMetrics
from scheduler.extender.points import ExtensionPoints
from scheduler.extender.wire import (
    BindingArgs,
    BindingResult,
    ExtenderArgs,
    FilterResult,
    PreemptionArgs,
    PreemptionResult,
    WireError,
    encode_priorities,
)
from scheduler.memo.decide import Memo
from scheduler.memo.loop import Warmer
from scheduler.planner.loop import Planner

log = logging.getLogger("gpupack.scheduler.app")

DEFAULT_MAX_BODY = 8 * 1024 * 1024


@dataclass(frozen=True)
class AppConfig:
    max_body_bytes: int = DEFAULT_MAX_BODY
    policy: str = "gpupack"
    memo_limit: int = 500_000
    warm: bool = True  # fill the memo in the background for pending shapes (scheduler.memo.loop)
    # Filter hands back at most this many fitting nodes, the policy's best (0: all of
    # them); see scheduler.extender.verbs.BestCandidates.
    filter_top: int = 0


class Readiness(Protocol):
    """Whether the extender answers: its first lists are in and the reservations rebuilt
    (``check_ready``; ``ready`` as last found), and this replica leads (``is_leader``).
    The reservation book (:class:`scheduler.groups.loop.ReservationBook`) is it."""

    ready: bool

    def check_ready(self) -> bool: ...

    @property
    def is_leader(self) -> Callable[[], bool]: ...


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


A = TypeVar("A")
R = TypeVar("R")


def read_json(max_body: int) -> Any:
    """The request's body as JSON, at most ``max_body`` bytes (BadRequest else)."""
    length = request.content_length
    if length is not None and length > max_body:
        raise BadRequest(f"body of {length} bytes is over the limit of {max_body}")
    data = request.stream.read(max_body + 1)
    if len(data) > max_body:
        raise BadRequest(f"body is over the limit of {max_body} bytes")
    if not data:
        raise BadRequest("empty body: expected a JSON object")
    try:
        return orjson.loads(data)
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"body is not valid JSON: {e}") from None


def check_serving(book: Readiness) -> None:
    """No answer from a cache that has not finished its first lists of nodes, pods and
    reservation records and rebuilt the reservations, nor from a standby."""
    if not book.check_ready():
        raise NotReady("gpupack is not synced yet: its first lists of nodes, pods and "
                       "reservation records, and the rebuild of the reservations, are "
                       "not done")
    if not book.is_leader():
        raise NotReady("this gpupack replica is not the leader (its kube-scheduler does "
                       "not hold the lease it follows)")


def answer(verb: str, gate: Callable[[], None], fn: Callable[[], Response],
           metrics: ExtenderMetrics) -> Response:
    """``fn``'s response once ``gate`` passes; errors as JSON (503 not ready, 400 bad
    input, 500 a bug); the outcome and latency counted per verb."""
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


def verb_route(verb: str, decode: Callable[[Any], A], call: Callable[[A], R],
               encode: Callable[[R], Any], *, gate: Callable[[], None], max_body: int,
               metrics: ExtenderMetrics) -> Callable[[], Response]:
    """The Flask view of one verb: gate, read, decode, call, encode (see :func:`answer`)."""

    def view() -> Response:
        return answer(verb, gate,
                      lambda: _json(encode(call(decode(read_json(max_body))))), metrics)

    return view


def add_verb_routes(app: Flask, points: ExtensionPoints, readiness: Readiness,
                    max_body: int, metrics: ExtenderMetrics) -> None:
    """``POST /filter``, ``/prioritize``, ``/bind`` and ``/preempt``, each a
    :func:`verb_route` to its extension point, answering only while ``readiness`` says
    so (:func:`check_serving`)."""
    common: dict[str, Any] = {"gate": lambda: check_serving(readiness),
                              "max_body": max_body, "metrics": metrics}
    routes: tuple[tuple[str, Callable[[], Response]], ...] = (
        ("filter", verb_route("filter", ExtenderArgs.decode, points.filter,
                              FilterResult.encode, **common)),
        ("prioritize", verb_route("prioritize", ExtenderArgs.decode, points.prioritize,
                                  encode_priorities, **common)),
        ("bind", verb_route("bind", BindingArgs.decode, points.bind, BindingResult.encode,
                            **common)),
        ("preempt", verb_route("preempt", PreemptionArgs.decode, points.preempt,
                               PreemptionResult.encode, **common)),
    )
    for verb, view in routes:
        app.add_url_rule(f"/{verb}", f"{verb}_", view, methods=["POST"])


def add_info_routes(app: Flask, cache: ClusterCache, planner: Planner, book: Readiness,
                    memo: Memo, warmer: Warmer, metrics: ExtenderMetrics) -> None:
    """Health, readiness, status and metrics, and JSON for Flask's own 4xx."""

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
