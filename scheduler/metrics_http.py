"""The separate ``--metrics-port`` listener of ``gpupack serve``.

It serves the same body as the extender's own ``/metrics`` (the cached exposition of
:class:`scheduler.metrics.CachedExposition`), so Prometheus can scrape the pod IP while
the verbs stay on loopback. A :class:`serving.listener.Listener`: an event loop reads each
request whole under deadlines, two threads answer (a scrape only copies the cached
body), connections are capped; it shares no thread with the verbs.
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Flask, Response
from prometheus_client import CONTENT_TYPE_LATEST

from serving.gate import Limits
from serving.listener import Listener

# Scrapes are GETs: no body is worth buffering.
METRICS_LIMITS = Limits(max_body=64 * 1024, max_connections=128)


def create_metrics_app(exposition: Callable[[], bytes]) -> Flask:
    app = Flask("gpupack.metrics")

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(exposition(), mimetype=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz() -> Response:
        return Response(b"ok\n", mimetype="text/plain")

    return app


class MetricsServer:
    """``/metrics`` on ``host:port`` in a daemon thread."""

    def __init__(self, exposition: Callable[[], bytes], host: str, port: int,
                 limits: Limits = METRICS_LIMITS, threads: int = 2) -> None:
        self.listener = Listener(create_metrics_app(exposition), host, port, limits=limits,
                                 threads=threads, name="gpupack-metrics")

    @property
    def port(self) -> int:
        return self.listener.port

    def start(self) -> None:
        self.listener.start()

    def stop(self) -> None:
        self.listener.stop()
