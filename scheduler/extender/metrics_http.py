"""The separate ``--metrics-port`` listener of ``gpupack serve``.

It serves the same body as the extender's own ``/metrics`` (the cached exposition of
:class:`scheduler.extender.metrics.Exposition`), so Prometheus can scrape the pod IP while
the verbs stay on loopback. A :class:`serving.listener.Listener`: an event loop reads each
request whole under deadlines, two threads answer (a scrape only copies the cached
body), connections are capped; it shares no thread with the verbs.
"""

from __future__ import annotations

from collections.abc import Callable

from serving.gate import Limits
from serving.listener import Listener
from serving.metrics_app import create_metrics_app
from serving.metrics_auth import Guard

# Scrapes are GETs: no body is worth buffering.
METRICS_LIMITS = Limits(max_body=64 * 1024, max_connections=128)


class MetricsServer:
    """``/metrics`` on ``host:port`` in a daemon thread; with ``guard``, only for a bearer
    token whose identity may get it (:mod:`serving.metrics_auth`)."""

    def __init__(self, exposition: Callable[[], bytes], host: str, port: int,
                 ready: Callable[[], bool] | None = None, limits: Limits = METRICS_LIMITS,
                 threads: int = 2, guard: Guard | None = None) -> None:
        app = create_metrics_app(exposition, ready, not_ready_why="cache not synced yet",
                                 guard=guard)
        self.listener = Listener(app, host, port,
                                 limits=limits, threads=threads, name="gpupack-metrics")

    @property
    def port(self) -> int:
        return self.listener.port

    def start(self) -> None:
        self.listener.start()

    def stop(self) -> None:
        self.listener.stop()
