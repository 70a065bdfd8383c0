"""Prometheus metrics of the webhook, registered on the registry the caller passes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

# Reviews take well under a millisecond when the cluster view is cached and a few
# hundred when it is rebuilt for a large snapshot: buckets span both.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.reviews = Counter(
            "gpupack_webhook_reviews",
            "AdmissionReviews answered, by outcome (patched, unchanged, denied, skipped, "
            "ignored, malformed, error, too_large, not_ready, unauthenticated) and pod class",
            ["outcome", "class"],
            registry=registry,
        )
        self.warnings = Counter(
            "gpupack_webhook_warnings",
            "Warnings returned with admitted pods (e.g. self-sizing servers on shared GPUs)",
            ["class"],
            registry=registry,
        )
        self.latency = Histogram(
            "gpupack_webhook_latency_seconds",
            "Time to answer one AdmissionReview, decoding to encoding",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
