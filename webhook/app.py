"""The webhook's HTTP app: POST /mutate (AdmissionReview), GET /healthz, GET /metrics.

Built by :func:`create_app` from what the caller passes (no module globals), so the
static CLI, the extender process and the tests each wire their own cluster view.
Handlers translate wire JSON to plain values, call :func:`webhook.admit.admit` and
translate back. Input from the API server never causes an HTTP 500: a review that
cannot be read is a 400 naming the field, a pod that cannot be read is a denial.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from packing.model import Snapshot
from webhook.admit import admit
from webhook.capacity import ClusterView
from webhook.config import WebhookConfig
from webhook.metrics import WebhookMetrics
from webhook.wire import (
    AdmissionResponse,
    AdmissionReview,
    ReviewError,
    decode_review,
    encode_response,
    error_body,
)

log = logging.getLogger("gpupack.webhook")


class ViewCache:
    """The :class:`ClusterView` of the latest snapshot.

    Snapshots are immutable, so the provider's object identity says whether anything
    changed. The first view is built in the request; after that a changed snapshot is
    condensed in a background thread while reviews keep reading the previous view (at
    5,000 nodes a rebuild takes most of a second, and a view a moment old only shifts
    free-slice counts; the scheduler still places the pod against the live cluster).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._view: ClusterView | None = None
        self._building: Snapshot | None = None

    def get(self, snapshot: Snapshot) -> ClusterView:
        with self._lock:
            view = self._view
            if view is not None and (snapshot is self._snapshot or self._building is not None):
                return view
            if view is not None:
                self._building = snapshot
                threading.Thread(target=self._rebuild, args=(snapshot,), daemon=True,
                                 name="gpupack-webhook-view").start()
                return view
        view = ClusterView.of(snapshot)  # first use: nothing older to serve
        with self._lock:
            if self._view is None:
                self._view, self._snapshot = view, snapshot
            return view

    def _rebuild(self, snapshot: Snapshot) -> None:
        try:
            view = ClusterView.of(snapshot)
            with self._lock:
                self._view, self._snapshot = view, snapshot
        except Exception:
            log.exception("rebuilding the cluster view failed; keeping the previous one")
        finally:
            with self._lock:
                self._building = None


def _json(body: Mapping[str, Any], status: int = 200) -> Response:
    return Response(json.dumps(body, separators=(",", ":")), status=status,
                    mimetype="application/json")


def _class_label(klass: str, config: WebhookConfig) -> str:
    """Bounded label values: a user's misspelt class must not make a new series."""
    known = config.known_classes() | {"none", "small", "whole", "invalid"}
    return klass if klass in known else "invalid"


def create_app(
    snapshot_provider: Callable[[], Snapshot],
    registry: CollectorRegistry,
    config: WebhookConfig,
    exposition: Callable[[], bytes] | None = None,
) -> Flask:
    """``exposition``: the body of ``/metrics`` when the registry is shared with a host
    that renders part of it itself (``gpupack serve``); default: the registry alone."""
    app = Flask("gpupack.webhook")
    metrics = WebhookMetrics(registry)
    views = ViewCache()

    def review_pod(review: AdmissionReview) -> tuple[AdmissionResponse, str, str]:
        req = review.request
        pod = req.object
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        namespace = req.namespace or (
            meta.get("namespace") if isinstance(meta, Mapping) else None
        ) or "default"
        view = views.get(snapshot_provider())
        labels = config.namespace_labels(str(namespace))
        adm = admit(pod, view, config, labels)
        d = adm.decision
        klass = _class_label(d.klass, config)
        if d.warnings:
            metrics.warnings.labels(klass).inc(len(d.warnings))
        if not adm.allowed:
            resp = AdmissionResponse(req.uid, False, status_code=d.status_code or 403,
                                     message=d.reason, warnings=d.warnings)
            return resp, adm.outcome, klass
        audit = {"decision": d.annotation()} if d.small else {}
        resp = AdmissionResponse(req.uid, True, patch=adm.patch, warnings=d.warnings,
                                 audit_annotations=audit)
        return resp, adm.outcome, klass

    @app.post("/mutate")
    def mutate() -> Response:
        start = time.perf_counter()
        try:
            review = decode_review(request.get_data())
        except ReviewError as e:
            metrics.reviews.labels("malformed", "none").inc()
            metrics.latency.observe(time.perf_counter() - start)
            return _json(error_body(e), 400)
        req = review.request
        if not req.is_pod_create:
            resp, outcome, klass = AdmissionResponse(req.uid, True), "ignored", "none"
        else:
            try:
                resp, outcome, klass = review_pod(review)
            except RecursionError:
                # Only a pod nested hundreds of levels deep gets here (copying it for the
                # patch overflows the stack); the API server never sends one.
                resp = AdmissionResponse(
                    req.uid, False, status_code=400,
                    message="gpupack webhook: the pod object is nested too deeply to patch",
                )
                outcome, klass = "error", "none"
            except Exception:
                # A bug or an unavailable cluster view, never the pod's fault. Denying
                # matches failurePolicy Fail: a GPU pod admitted unmutated would run
                # without its slice.
                log.exception("review %s failed", req.uid)
                resp = AdmissionResponse(
                    req.uid, False, status_code=500,
                    message="gpupack webhook: internal error, see the webhook's log",
                )
                outcome, klass = "error", "none"
        body = encode_response(review.api_version, resp)
        metrics.reviews.labels(outcome, klass).inc()
        metrics.latency.observe(time.perf_counter() - start)
        return _json(body)

    @app.get("/healthz")
    def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/metrics")
    def prometheus() -> Response:
        body = exposition() if exposition is not None else generate_latest(registry)
        return Response(body, mimetype=CONTENT_TYPE_LATEST)

    return app
