"""The separate ``--metrics-port`` listener of ``gpupack serve``.

It serves the same body as the extender's own ``/metrics`` (the cached exposition of
:class:`scheduler.metrics.CachedExposition`), so Prometheus can scrape the pod IP while
the verbs stay on loopback. A :class:`serving.listener.Listener`: an event loop reads each
request whole under deadlines, two threads answer (a scrape only copies the cached
body), connections are capped; it shares no thread with the verbs.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from flask import Flask, Response
from prometheus_client import CONTENT_TYPE_LATEST
from werkzeug.exceptions import HTTPException

from serving.gate import Limits
from serving.listener import Listener

# Scrapes are GETs: no body is worth buffering.
METRICS_LIMITS = Limits(max_body=64 * 1024, max_connections=128)


def _json(obj: object, status: int = 200) -> Response:
    return Response(json.dumps(obj, separators=(",", ":")), status=status,
                    mimetype="application/json")


def create_metrics_app(exposition: Callable[[], bytes],
                       ready: Callable[[], bool] | None = None) -> Flask:
    """``/metrics``, and the health convention of every gpupack server: ``/healthz``
    200 ``{"ok": true}``; ``/readyz`` 200 ``{"ready": true}`` or 503 with why (``ready``:
    whether the extender's cache has synced; default always); errors as JSON."""
    app = Flask("gpupack.metrics")

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(exposition(), mimetype=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz() -> Response:
        return _json({"ok": True})

    @app.get("/readyz")
    def readyz() -> Response:
        if ready is not None and not ready():
            return _json({"ready": False, "why": "cache not synced yet"}, 503)
        return _json({"ready": True})

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        return _json({"error": e.description or e.name}, e.code or 500)

    return app


class MetricsServer:
    """``/metrics`` on ``host:port`` in a daemon thread."""

    def __init__(self, exposition: Callable[[], bytes], host: str, port: int,
                 ready: Callable[[], bool] | None = None, limits: Limits = METRICS_LIMITS,
                 threads: int = 2) -> None:
        self.listener = Listener(create_metrics_app(exposition, ready), host, port,
                                 limits=limits, threads=threads, name="gpupack-metrics")

    @property
    def port(self) -> int:
        return self.listener.port

    def start(self) -> None:
        self.listener.start()

    def stop(self) -> None:
        self.listener.stop()
