"""The webhook's HTTP app: POST /mutate (AdmissionReview), GET /healthz, /readyz, /metrics.

Built by :func:`create_webhook_app` from what the caller passes (no module globals), so the
static CLI, the extender process and the tests each wire their own cluster view.
Handlers translate wire JSON to plain values, call :func:`webhook.admit.admit` and
translate back. Input from the API server never causes an HTTP 500: a review that
cannot be read is a 400 naming the field, a pod that cannot be read is a denial.

Before the first complete list of nodes and pods (``ready()`` false, or the provider
returning None) the webhook decides nothing: ``/readyz`` is 503 and ``/mutate`` answers
HTTP 503 without an AdmissionReview. The API server counts that as a failed call, so
the webhook configuration's ``failurePolicy`` applies: ``Ignore`` admits the pod as it
is (unsized), ``Fail`` refuses it with "failed calling webhook" and the client retries.
A pod is never denied for GPUs the webhook has not seen yet. ``/healthz`` (liveness)
stays 200.

A body over :data:`MAX_REVIEW_BYTES` (the API server's own request limit, so no real
review is larger) is answered 413 from its Content-Length, before it is read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from werkzeug.exceptions import HTTPException

from packing.model import Snapshot
from serving.client_auth import PEER_CERT, ClientAuth
from serving.gate import Limits
from serving.metrics_app import guarded
from serving.metrics_auth import Guard
from webhook.admit import admit
from webhook.capacity import ClusterView
from webhook.claim_scope import ScopedViews, pod_names, pod_of
from webhook.claims import ClaimBook
from webhook.config import WebhookConfig
from webhook.dra_view import SHARED_RESOURCE, DraMemo
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

# kube-apiserver refuses request bodies over 3 MiB (its MaxRequestBodyBytes), so no
# object it sends a webhook makes a larger AdmissionReview worth reading.
MAX_REVIEW_BYTES = 3 * 1024 * 1024
# How a server reads reviews (serving.gate): no body over the API server's own limit, and
# connections kept alive as long as the API server keeps them.
REVIEW_LIMITS = Limits(max_body=MAX_REVIEW_BYTES, idle_s=75.0)


class ViewCache:
    """The :class:`ClusterView` of the latest snapshot.

    Snapshots are immutable, so the provider's object identity says whether anything
    changed. The first view is built in the request; after that a changed snapshot is
    condensed in a background thread while reviews keep reading the previous view (at
    5,000 nodes a rebuild takes most of a second, and a view a moment old only shifts
    free-slice counts; the scheduler still places the pod against the live cluster).
    The rebuild also condenses the scoped views (``ClusterView.scoped``: the nodes in
    reach of a pod's selector, affinity and tolerations) that the previous view served.
    """

    def __init__(self, shared_resource: str = SHARED_RESOURCE) -> None:
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._view: ClusterView | None = None
        self._names: frozenset[str] = frozenset()  # the pods of _view's snapshot
        self._building: Snapshot | None = None
        self._shared_resource = shared_resource
        # What the last view judged of each DRA node, for the next (one is built at a
        # time, in the background; the first in the request).
        self._dra_memo = DraMemo()

    def _of(self, snapshot: Snapshot) -> ClusterView:
        return ClusterView.of(snapshot, shared_resource=self._shared_resource,
                              memo=self._dra_memo)

    def names_of(self, view: ClusterView) -> frozenset[str]:
        """The "namespace/name" of the pods ``view`` counts (empty once a newer view has
        replaced it: a claim is then only not ended early)."""
        with self._lock:
            return self._names if view is self._view else frozenset()

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
        view = self._of(snapshot)  # first use: nothing older to serve
        names = pod_names(snapshot)
        with self._lock:
            if self._view is None:
                self._view, self._snapshot, self._names = view, snapshot, names
            return view

    def _rebuild(self, snapshot: Snapshot) -> None:
        try:
            view = self._of(snapshot)
            with self._lock:
                previous = self._view
            if previous is not None:
                # The scopes (node pools, tolerations) the previous view served are
                # condensed here, not in the next review of each.
                view.warm(previous.levels())
            names = pod_names(snapshot)
            with self._lock:
                self._view, self._snapshot, self._names = view, snapshot, names
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


def _fingerprint(pod: Any, namespace: object) -> str:
    """What a retried review repeats: the pod and its namespace (a digest, so the claim
    book keeps no copy of the pod)."""
    text = json.dumps([pod, str(namespace)], sort_keys=True, separators=(",", ":"),
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _not_ready() -> Response:
    resp = _json({"error": "gpupack webhook: no complete list of nodes and pods yet; "
                           "the webhook configuration's failurePolicy applies"}, 503)
    resp.headers["Retry-After"] = "1"
    return resp


def create_webhook_app(
    snapshot_provider: Callable[[], Snapshot | None],
    registry: CollectorRegistry,
    config: WebhookConfig,
    exposition: Callable[[], bytes] | None = None,
    ready: Callable[[], bool] | None = None,
    metrics_guard: Guard | None = None,
    claim_book: ClaimBook | None = None,
    client_auth: ClientAuth | None = None,
) -> Flask:
    """``snapshot_provider``: the cluster now, or None until the first complete list.
    ``ready``: a cheap "has the first list completed" (default: the provider's own
    ``ready()`` method if it has one, else always: a static view).
    ``exposition``: the body of ``/metrics`` when the registry is shared with a host
    that renders part of it itself (``gpupack serve``); default: the registry alone.
    ``metrics_guard``: who may scrape ``/metrics`` (:mod:`serving.metrics_auth`; default:
    anyone); ``/healthz`` and ``/readyz`` stay open for the kubelet's probes.
    ``claim_book``: the slices and shares handed out that the view does not show yet
    (:mod:`webhook.claims`; default: a book with its default expiry); a decision counts
    those of its pod's namespace only (:mod:`webhook.claim_scope`).
    ``client_auth``: who may post reviews (:mod:`serving.client_auth`: the API
    server's client certificate); default: anyone who reaches the port."""
    app = Flask("gpupack.webhook")
    metrics = WebhookMetrics(registry)
    views = ViewCache(config.shared_resource)
    claims = claim_book if claim_book is not None else ClaimBook()
    deciding = threading.Lock()
    scoped = ScopedViews()
    is_ready: Callable[[], bool] = ready or getattr(snapshot_provider, "ready", None) \
        or (lambda: True)

    class NotReady(Exception):
        """The provider has no complete cluster view yet."""

    def review_pod(review: AdmissionReview) -> tuple[AdmissionResponse, str, str]:
        req = review.request
        pod = req.object
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        namespace = str(req.namespace or (
            meta.get("namespace") if isinstance(meta, Mapping) else None
        ) or "default")
        labels = config.namespace_labels(namespace)
        # One decision at a time from snapshot to claim (each takes well under a
        # millisecond): two reviews deciding at once would both see the same free slice,
        # and one deciding from an older snapshot than the one that ended a claim (taken
        # before, decided after) would count that pod nowhere.
        with deciding:
            snapshot = snapshot_provider()
            if snapshot is None:
                raise NotReady()
            base = views.get(snapshot)
            # Only this namespace's claims count (webhook.claim_scope): what reviews
            # naming other namespaces claimed, forged or not, changes nothing here.
            live = claims.live_items(base.seen, namespace, views.names_of(base))
            earlier = claims.answer(req.uid, namespace) if req.uid else None
            # The pod's digest, taken at most once a review (a claim keeps it).
            fingerprint = None if earlier is None else _fingerprint(pod, namespace)
            if earlier is not None and earlier[0] == fingerprint:
                # The API server retrying this very call (same review uid, same pod):
                # the same answer, not a new decision against its own claim.
                answer: tuple[AdmissionResponse, str, str] = earlier[1]
                return answer
            view = scoped.get(namespace, base, live)
            adm = admit(pod, view, config, labels, admission_id=req.uid,
                        live={k for k, _ in live})
            d = adm.decision
            klass = _class_label(d.klass, config)
            if not adm.allowed:
                resp = AdmissionResponse(req.uid, False, status_code=d.status_code or 403,
                                         message=d.reason, warnings=d.warnings)
            else:
                audit = {"decision": d.annotation()} if d.small else {}
                resp = AdmissionResponse(req.uid, True, patch=adm.patch, warnings=d.warnings,
                                         audit_annotations=audit)
                claim = d.claim() if not d.reused and not req.dry_run else None
                if claim is not None:
                    claims.add(req.uid, claim, (fingerprint or _fingerprint(pod, namespace),
                                                (resp, adm.outcome, klass)),
                               namespace=namespace, pod=pod_of(meta, namespace))
        if d.warnings:
            metrics.warnings.labels(klass).inc(len(d.warnings))
        return resp, adm.outcome, klass

    @app.post("/mutate")
    def mutate() -> Response:
        start = time.perf_counter()
        length = request.content_length
        if length is not None and length > MAX_REVIEW_BYTES:
            metrics.reviews.labels("too_large", "none").inc()
            refusal = _json({"error": f"AdmissionReview of {length} bytes is over the API "
                                      f"server's limit of {MAX_REVIEW_BYTES} bytes"}, 413)
            refusal.headers["Connection"] = "close"  # the body stays unread
            return refusal
        if client_auth is not None:
            refused = client_auth.refusal(request.environ.get(PEER_CERT))
            if refused is not None:
                metrics.reviews.labels("unauthenticated", "none").inc()
                answer = _json({"error": refused[1]}, refused[0])
                answer.headers["Connection"] = "close"  # the body stays unread
                return answer
        if not is_ready():
            metrics.reviews.labels("not_ready", "none").inc()
            return _not_ready()
        data = request.stream.read(MAX_REVIEW_BYTES + 1)
        if len(data) > MAX_REVIEW_BYTES:  # a chunked body without a length
            metrics.reviews.labels("too_large", "none").inc()
            return _json({"error": f"AdmissionReview over {MAX_REVIEW_BYTES} bytes"}, 413)
        try:
            review = decode_review(data)
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
            except NotReady:
                metrics.reviews.labels("not_ready", "none").inc()
                return _not_ready()
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
        return _json({"ok": True})

    @app.get("/readyz")
    def readyz() -> Response:
        if not is_ready():
            return _json({"ready": False, "why": "no complete list of nodes and pods yet"},
                         503)
        return _json({"ready": True})

    @app.get("/metrics")
    def prometheus() -> Response:
        refused = guarded(metrics_guard)
        if refused is not None:
            return refused
        body = exposition() if exposition is not None else generate_latest(registry)
        return Response(body, mimetype=CONTENT_TYPE_LATEST)

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        # Flask's own 4xx (unknown path, wrong method) keep their codes, in JSON.
        return _json({"error": e.description or e.name}, e.code or 500)

    return app
