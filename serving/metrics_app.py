"""The metrics listener's app, shared by every gpupack server that has one (the
extender's ``--metrics-port``, the node agent): ``/metrics``, and the health convention
of every gpupack server: ``/healthz`` 200 ``{"ok": true}``; ``/readyz`` 200
``{"ready": true}`` or 503 ``{"ready": false, "why": ...}``; every error as JSON.

With a ``guard`` (:class:`serving.metrics_auth.ScrapeGuard`), ``/metrics`` answers only a
bearer token whose identity may get it (401, 403, or 503 when the API server cannot be
asked); the health paths stay open, as the kubelet probes them without a token."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST
from werkzeug.exceptions import HTTPException

from serving.metrics_auth import Guard, Verdict

log = logging.getLogger("gpupack.metrics")


def json_response(obj: object, status: int = 200) -> Response:
    return Response(json.dumps(obj, separators=(",", ":")), status=status,
                    mimetype="application/json")


def refusal(verdict: Verdict) -> Response:
    """The answer to a scrape :func:`serving.metrics_auth.check` did not allow: its
    status, ``{"error": reason}``, and the header each status calls for."""
    resp = json_response({"error": verdict.reason}, verdict.status)
    if verdict.status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="gpupack metrics"'
    elif verdict.status == 503:
        resp.headers["Retry-After"] = "5"
    return resp


def guarded(guard: Guard | None) -> Response | None:
    """None when the current request may be served ``/metrics`` (no guard: anyone),
    else the refusal to send. A 503 is logged: the API server could not be asked."""
    if guard is None:
        return None
    verdict = guard(request.headers.get("Authorization"))
    if verdict.allowed:
        return None
    if verdict.status == 503:
        log.warning("/metrics from %s: %s", request.remote_addr, verdict.reason)
    else:
        log.debug("/metrics from %s: %d %s", request.remote_addr, verdict.status,
                  verdict.reason)
    return refusal(verdict)


def create_metrics_app(exposition: Callable[[], bytes],
                       ready: Callable[[], bool] | None = None,
                       not_ready_why: str = "not ready yet", name: str = "gpupack.metrics",
                       guard: Guard | None = None) -> Flask:
    """``exposition`` renders the scrape body; ``ready`` says whether the component is
    ready (default: always), ``not_ready_why`` what ``/readyz`` says when it is not;
    ``guard`` who may scrape (default: anyone)."""
    app = Flask(name)

    @app.get("/metrics")
    def metrics() -> Response:
        refused = guarded(guard)
        if refused is not None:
            return refused
        return Response(exposition(), mimetype=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz() -> Response:
        return json_response({"ok": True})

    @app.get("/readyz")
    def readyz() -> Response:
        if ready is not None and not ready():
            return json_response({"ready": False, "why": not_ready_why}, 503)
        return json_response({"ready": True})

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        return json_response({"error": e.description or e.name}, e.code or 500)

    return app
