"""``--metrics-auth``: who may scrape ``/metrics`` (composition only; the decision is
``serving.metrics_auth``, the reviews ``kube.delegated_auth``).

``delegated`` (the default against an API server): a scrape needs a bearer token whose
identity may ``get`` the non-resource URL ``/metrics``, as kube-scheduler and the
kubelet require. ``none`` (the default in static mode, where there is no API server to
ask): anyone may scrape. See docs/install.md, "Who may scrape the metrics".
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from serving.metrics_auth import Guard

MODES = ("delegated", "none")
log = logging.getLogger("gpupack.metrics")


def add_metrics_auth_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-auth", choices=MODES, default=None,
                   help="who may scrape /metrics: delegated (a bearer token the API server "
                        "authenticates, whose identity may get /metrics: TokenReview and "
                        "SubjectAccessReview, cached) or none (anyone). Default: delegated "
                        "against an API server, none in static mode. /healthz and /readyz "
                        "stay open")


def metrics_auth_error(mode: str | None, has_api: bool) -> str | None:
    """Why ``--metrics-auth`` cannot be honoured (None: it can)."""
    if mode == "delegated" and not has_api:
        return ("--metrics-auth delegated needs an API server to review tokens "
                "(--kubeconfig or --in-cluster); static mode serves metrics to anyone")
    return None


def effective_mode(mode: str | None, has_api: bool) -> str:
    return mode or ("delegated" if has_api else "none")


def metrics_guard(mode: str | None, api_client: Any | None) -> Guard | None:
    """The guard of every ``/metrics`` of this process: None (anyone may scrape) with
    ``none`` or without an API server, else delegated reviews through ``api_client``."""
    if api_client is None or effective_mode(mode, True) == "none":
        log.info("metrics: anyone may scrape /metrics (--metrics-auth none or no API server)")
        return None
    from kube.delegated_auth import DelegatedAuth
    from serving.metrics_auth import ScrapeGuard

    reviews = DelegatedAuth(api_client)
    log.info("metrics: /metrics needs a bearer token allowed to get it (TokenReview + "
             "SubjectAccessReview)")
    return ScrapeGuard(reviews.authenticate, reviews.authorize)
