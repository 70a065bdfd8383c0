"""The metrics listener's app, shared by every gpupack server that has one (the
extender's ``--metrics-port``, the node agent): ``/metrics``, and the health convention
of every gpupack server: ``/healthz`` 200 ``{"ok": true}``; ``/readyz`` 200
``{"ready": true}`` or 503 ``{"ready": false, "why": ...}``; every error as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable

from flask import Flask, Response
from prometheus_client import CONTENT_TYPE_LATEST
from werkzeug.exceptions import HTTPException


def json_response(obj: object, status: int = 200) -> Response:
    return Response(json.dumps(obj, separators=(",", ":")), status=status,
                    mimetype="application/json")


def create_metrics_app(exposition: Callable[[], bytes],
                       ready: Callable[[], bool] | None = None,
                       not_ready_why: str = "not ready yet", name: str = "gpupack.metrics"
                       ) -> Flask:
    """``exposition`` renders the scrape body; ``ready`` says whether the component is
    ready (default: always), ``not_ready_why`` what ``/readyz`` says when it is not."""
    app = Flask(name)

    @app.get("/metrics")
    def metrics() -> Response:
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
