"""The separate ``--metrics-port`` listener of ``gpupack serve``.

It serves the same body as the extender's own ``/metrics`` (the registry plus the per-GPU
family kept rendered by :class:`scheduler.metrics.GpuRows`), so Prometheus can scrape the
pod IP while the verbs stay on loopback. A threaded werkzeug server: scrapes are rare and
small in number, and it must not share gunicorn's worker threads with the verbs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from flask import Flask, Response
from prometheus_client import CONTENT_TYPE_LATEST
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # one line per scrape is noise; errors are still logged by werkzeug


def create_metrics_app(exposition: Callable[[], bytes]) -> Flask:
    app = Flask("gpupack.metrics")

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(exposition(), mimetype=CONTENT_TYPE_LATEST)

    return app


class MetricsServer:
    """``/metrics`` on ``host:port`` in a daemon thread."""

    def __init__(self, exposition: Callable[[], bytes], host: str, port: int) -> None:
        self.server: BaseWSGIServer = make_server(
            host, port, create_metrics_app(exposition), threaded=True,
            request_handler=_QuietHandler)
        self._thread = threading.Thread(target=self.server.serve_forever,
                                        name="gpupack-metrics", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
