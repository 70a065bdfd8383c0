"""The extender's composition: every part of one extender process's Flask app, built and
wired here, in the command layer, so that no room of :mod:`scheduler` constructs or
starts another's loop.

:func:`create_extender_app` takes the cache, the planner, the binder, the registry and,
from ``gpupack serve``, the reservation book and the recent refusals, and builds the
rest: the verbs' memo and its warmer (started unless ``AppConfig.warm`` is off), the
extender's and the groups' metrics, the pods remembered for their binds, the groups'
participant at the extension points (:class:`scheduler.groups.plugin.GroupVerbs`), the
DRA participant (:class:`scheduler.dra.plugin.DraVerbs`) and the extension points
themselves, then the routes (:mod:`scheduler.extender.app`).
"""

from __future__ import annotations

from flask import Flask
from prometheus_client import CollectorRegistry

from kube.cache import ClusterCache
from kube.source import Binder
from scheduler.dra.metrics import DraCollector
from scheduler.dra.plugin import DraVerbs
from scheduler.engine import LoopMetrics
from scheduler.extender.app import AppConfig, InFlight, add_info_routes, add_verb_routes
from scheduler.extender.metrics import ExtenderMetrics
from scheduler.extender.points import ExtensionPoints
from scheduler.extender.refusals import RecentRefusals
from scheduler.extender.request_pods import RequestPods
from scheduler.extender.view_lag import ViewLag
from scheduler.groups.loop import ReservationBook
from scheduler.groups.metrics import GroupMetrics
from scheduler.groups.plugin import GroupVerbs
from scheduler.memo.decide import Memo
from scheduler.memo.loop import Warmer
from scheduler.planner.loop import Planner


def create_extender_app(
    cache: ClusterCache,
    planner: Planner,
    binder: Binder,
    registry: CollectorRegistry,
    config: AppConfig | None = None,
    groups: ReservationBook | None = None,
    refusals: RecentRefusals | None = None,
    loop_metrics: LoopMetrics | None = None,
) -> Flask:
    """The extender's app over ``cache``. ``groups``: the reservation book (default: one
    with no record source, whose records start empty); its parts are in
    ``app.extensions`` (``gpupack.groups``, ``gpupack.warmer``, ``gpupack.request_pods``,
    ``gpupack.exposition``: what ``/metrics`` serves, for the process's other
    listeners)."""
    cfg = config or AppConfig()
    app = Flask("gpupack.scheduler")
    book = groups or ReservationBook(cache, scorer=lambda: planner.scorer.scorer,
                                     records_listed=True)
    app.extensions["gpupack.groups"] = book
    metrics = ExtenderMetrics(registry, cache, planner, active=book.is_leader)
    memo = Memo(cfg.memo_limit)
    inflight = InFlight(app.wsgi_app)
    app.wsgi_app = inflight  # type: ignore[method-assign]
    app.extensions["gpupack.inflight"] = inflight
    warmer = Warmer(cache, memo, lambda: planner.scorer, busy=inflight.busy,
                    loop_metrics=loop_metrics)
    app.extensions["gpupack.warmer"] = warmer
    # What /metrics serves, for the other listeners of the same process (metrics port,
    # webhook) so that every scrape sees the same families.
    app.extensions["gpupack.exposition"] = metrics.exposition
    if cfg.warm:
        warmer.start()
    # Pods seen only in filter/prioritize requests, for their bind.
    request_pods = RequestPods()
    app.extensions["gpupack.request_pods"] = request_pods
    GroupMetrics(registry, book)
    lag = ViewLag(answered=metrics.view_behind)
    # Group members first (their room is reserved), then pods with DRA claims.
    dra = DraVerbs(cache, warmer.current, memo, lag)
    app.extensions["gpupack.dra"] = dra
    registry.register(DraCollector(cache, dra))
    points = ExtensionPoints(cache, planner, binder, (GroupVerbs(book, lag), dra), memo,
                             warmer, request_pods, metrics.binds, cfg.policy, cfg.filter_top,
                             lag, refusals)
    add_verb_routes(app, points, book, cfg.max_body_bytes, metrics)
    add_info_routes(app, cache, planner, book, memo, warmer, metrics)
    return app
