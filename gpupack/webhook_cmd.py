"""``gpupack webhook``: the mutating admission webhook over HTTPS (composition only).

The cluster view comes from Node (and Pod) files (static), or, with ``--in-cluster`` or
``--kubeconfig``, from a list+watch of the API server into the same cache the extender
uses; the extender process can also serve the webhook itself (``gpupack serve
--webhook-port``).
"""

from __future__ import annotations

import argparse
import gc
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from flask import Flask
from prometheus_client import CollectorRegistry

from gpupack.inputs import add_mig_actuator_argument, load_cluster
from gpupack.inventory_expiry import (
    add_inventory_age_argument,
    inventory_age,
    inventory_age_error,
    start_expiry,
)
from gpupack.metrics_auth import add_metrics_auth_argument, metrics_auth_error, metrics_guard
from gpupack.startup import announce, announce_when_synced, source_words, startup_line
from gpupack.webhook_host import SnapshotFeed
from kube.objects import ObjectError
from packing.model import Snapshot
from serving.client_auth import ClientAuth, check_client_ca
from serving.https import HttpsServer
from serving.tls import check_tls
from webhook.app import REVIEW_LIMITS, create_webhook_app
from webhook.config import Isolation, WebhookConfig
from webhook.pod import STRICT


def add_config_arguments(p: argparse.ArgumentParser, nodes_help: str = (
        "Node objects (YAML/JSON); required unless reading the API server")) -> None:
    """Options shared with ``gpupack explain``: the cluster files and the config."""
    p.add_argument("--nodes", type=Path, default=None, help=nodes_help)
    p.add_argument("--pods", type=Path, default=None,
                   help="running Pod objects (YAML/JSON): what is already taken")
    p.add_argument("--scheduler-name", default="gpupack",
                   help="schedulerName set on GPU pods (default: gpupack)")
    p.add_argument("--shared-resource", default=WebhookConfig.shared_resource,
                   help="time-sliced resource name (default: nvidia.com/gpu.shared)")
    p.add_argument("--default-isolation", default="any", choices=[i.value for i in Isolation],
                   help="isolation of pods without gpupack.io/isolation (default: any)")
    p.add_argument("--strict-namespace", action="append", default=[], metavar="NS",
                   help=f"treat namespace NS as labelled {STRICT}=true (repeatable)")
    add_mig_actuator_argument(p)


def config_from_args(args: argparse.Namespace) -> WebhookConfig:
    strict = frozenset(args.strict_namespace)

    def namespace_labels(namespace: str) -> Mapping[str, str]:
        return {STRICT: "true"} if namespace in strict else {}

    return WebhookConfig(
        scheduler_name=args.scheduler_name,
        shared_resource=args.shared_resource,
        default_isolation=Isolation(args.default_isolation),
        namespace_labels=namespace_labels,
    )


def load_snapshot(args: argparse.Namespace) -> tuple[Snapshot, tuple[str, ...]]:
    """The static snapshot from --nodes/--pods; ObjectError (naming the file) when
    unreadable."""
    built = load_cluster(args.nodes, args.pods, mig_actuator=args.mig_actuator)
    return built.snapshot, built.notes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--in-cluster", action="store_true",
                   help="watch Nodes and Pods through the in-cluster service account")
    p.add_argument("--kubeconfig", default=None, help="watch Nodes and Pods with this kubeconfig")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=int, default=8443)
    p.add_argument("--tls-cert", required=True, type=Path, help="serving certificate (PEM); "
                   "reloaded when the file changes")
    p.add_argument("--tls-key", required=True, type=Path, help="its private key (PEM)")
    p.add_argument("--threads", type=int, default=8, help="worker threads")
    add_client_auth_arguments(p)
    add_metrics_auth_argument(p)
    add_inventory_age_argument(p)
    p.add_argument("--dra", default="auto", choices=["auto", "off"],
                   help="Dynamic Resource Allocation (docs/dra.md): auto watches the "
                        "resource.k8s.io/v1 objects (none where the API server does not "
                        "serve them) and counts what DRA nodes offer a sized pod; off "
                        "ignores them (default auto)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    add_config_arguments(p)


def add_client_auth_arguments(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """``--client-ca`` and ``--client-name`` (with ``prefix``: ``--webhook-client-ca``...)."""
    p.add_argument(f"--{prefix}client-ca", type=Path, default=None, metavar="FILE",
                   help="act only on AdmissionReviews sent with a client certificate signed "
                        "by this CA (PEM; reloaded when it changes): the API server's, "
                        "configured by its --admission-control-config-file "
                        "(docs/install.md); others get 401/403. Default: any caller")
    p.add_argument(f"--{prefix}client-name", action="append", default=[], metavar="NAME",
                   help="with --client-ca: the client certificate's CN or a DNS/URI SAN must "
                        "be one of these (repeatable; default: any name that CA signed)")


def client_auth_from_args(ca: Path | None, names: list[str], prefix: str = ""
                          ) -> tuple[ClientAuth | None, str | None]:
    """(the client authentication, or None) and why the options are wrong (or None)."""
    if ca is None:
        return None, (f"--{prefix}client-name needs --{prefix}client-ca" if names else None)
    why = check_client_ca(ca)
    if why is not None:
        return None, f"--{prefix}client-ca: {why}"
    return ClientAuth(ca, frozenset(names)), None


class LiveSnapshots:
    """The standalone webhook's cluster view: a cache of its own, fed by a watch of the
    API server, and the one snapshot feed over it (:class:`gpupack.webhook_host.
    SnapshotFeed`, with no minimum interval: the same Snapshot object until the cache
    changes, so the webhook's per-snapshot view is rebuilt only on change; None until the
    first list of nodes and pods is complete, and the webhook then decides nothing, see
    :mod:`webhook.app`)."""

    def __init__(self, args: argparse.Namespace) -> None:
        from kube.api_source import ApiSource, load_api_client
        from kube.cache import ClusterCache

        self.cache = ClusterCache(args.scheduler_name, mig_actuator=args.mig_actuator,
                                  inventory_age=inventory_age(args, live=True))
        # DRA objects (docs/dra.md): what DRA nodes offer a sized pod.
        dra = args.dra != "off"
        self.source = ApiSource(load_api_client(args.kubeconfig, args.in_cluster),
                                watch_dra=dra)
        self.source.start(self.cache, dra=self.cache if dra else None)
        self._expiry_stop = threading.Event()
        start_expiry(self.cache, self._expiry_stop)
        self.feed = SnapshotFeed(self.cache, min_interval_s=0.0)

    def ready(self) -> bool:
        return self.feed.ready()

    def __call__(self) -> Snapshot | None:
        return self.feed()

    def stop(self) -> None:
        self._expiry_stop.set()
        self.source.stop()


def live_snapshots(args: argparse.Namespace) -> LiveSnapshots:
    return LiveSnapshots(args)


def run(args: argparse.Namespace) -> int:
    live = args.in_cluster or args.kubeconfig is not None
    if args.nodes is None and not live:
        print("gpupack webhook: give --nodes (static) or --in-cluster/--kubeconfig",
              file=sys.stderr)
        return 2
    why = metrics_auth_error(args.metrics_auth, live)
    if why is not None:
        print(f"gpupack webhook: {why}", file=sys.stderr)
        return 2
    why = inventory_age_error(args)
    if why is not None:
        print(f"gpupack webhook: {why}", file=sys.stderr)
        return 2
    if live:
        from kube.api_source import api_config_error

        why = api_config_error(args.kubeconfig, args.in_cluster)
        if why is not None:
            print(f"gpupack webhook: {why}", file=sys.stderr)
            return 2
    try:
        snapshot, notes = load_snapshot(args) if not live else (Snapshot(()), ())
    except (ObjectError, OSError) as e:
        print(f"gpupack webhook: {e}", file=sys.stderr)
        return 2
    why = check_tls(args.tls_cert, args.tls_key)  # fail now, not per connection
    if why is not None:
        print(f"gpupack webhook: --tls-cert/--tls-key: {why}", file=sys.stderr)
        return 2
    client_auth, why = client_auth_from_args(args.client_ca, args.client_name)
    if why is not None:
        print(f"gpupack webhook: {why}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    config = config_from_args(args)
    if not live:
        # The static snapshot lives as long as the process: keeping its many objects out
        # of the collector's scans keeps full collections from adding milliseconds.
        gc.collect()
        gc.freeze()

    source, where = source_words(args), [f"https://{args.host}:{args.port}"]

    def app_factory() -> Flask:
        # Built inside the serving process (gunicorn may fork): the watch threads too.
        if not live:
            announce(startup_line("webhook", source, {
                "nodes": len(snapshot.nodes), "pods": len(snapshot.running)
                + len(snapshot.pending), "pending": len(snapshot.pending)}, where))
            return create_webhook_app(lambda: snapshot, CollectorRegistry(), config,
                                      client_auth=client_auth)
        from kube.api_source import load_api_client
        from kube.cache_metrics import CacheCollector

        feed = live_snapshots(args)
        # The webhook's own cache: its figures (synced, stale agent inventories, ...) are
        # this process's, so alerts see a webhook whose view has gone stale too.
        registry = CollectorRegistry()
        registry.register(CacheCollector(feed.cache))
        announce_when_synced(feed.ready, lambda: startup_line(
            "webhook", source, feed.cache.counts(), where))
        guard = metrics_guard(args.metrics_auth,
                              load_api_client(args.kubeconfig, args.in_cluster))
        return create_webhook_app(feed, registry, config, ready=feed.ready,
                                  metrics_guard=guard, client_auth=client_auth)

    HttpsServer(app_factory, host=args.host, port=args.port, cert=args.tls_cert,
                key=args.tls_key, limits=REVIEW_LIMITS, name="gpupack-webhook",
                threads=args.threads, log_level=args.log_level, client_auth=client_auth).run()
    return 0
