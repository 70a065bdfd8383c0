"""``gpupack webhook``: the mutating admission webhook over HTTPS (composition only).

Standalone, the cluster view is static, read once from Node (and Pod) files; in a
cluster the extender process passes its cache's snapshot function to
:func:`webhook.app.create_app` instead.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Mapping
from pathlib import Path

from flask import Flask
from prometheus_client import CollectorRegistry

from kube.files import load_objects
from kube.objects import ObjectError
from kube.snapshot import build_snapshot
from packing.model import Snapshot
from webhook.app import create_app
from webhook.config import Isolation, WebhookConfig
from webhook.decide import STRICT
from webhook.server import ReloadingTLS, serve


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared with ``gpupack explain``: the cluster files and the config."""
    p.add_argument("--nodes", required=True, type=Path, help="Node objects (YAML/JSON)")
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
    """The static snapshot from --nodes/--pods; ObjectError or OSError when unreadable."""
    nodes = load_objects(Path(args.nodes).read_text(encoding="utf-8"), str(args.nodes), "Node")
    pods = []
    if args.pods is not None:
        pods = load_objects(Path(args.pods).read_text(encoding="utf-8"), str(args.pods), "Pod")
    built = build_snapshot(nodes, pods)
    return built.snapshot, built.notes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=int, default=8443)
    p.add_argument("--tls-cert", required=True, type=Path, help="serving certificate (PEM); "
                   "reloaded when the file changes")
    p.add_argument("--tls-key", required=True, type=Path, help="its private key (PEM)")
    p.add_argument("--threads", type=int, default=8, help="worker threads")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    add_config_arguments(p)


def run(args: argparse.Namespace) -> int:
    try:
        snapshot, notes = load_snapshot(args)
    except (ObjectError, OSError) as e:
        print(f"gpupack webhook: {e}", file=sys.stderr)
        return 2
    try:
        ReloadingTLS(args.tls_cert, args.tls_key).context()  # fail now, not per connection
    except OSError as e:  # ssl.SSLError included
        print(f"gpupack webhook: --tls-cert/--tls-key: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    config = config_from_args(args)
    # The static snapshot lives as long as the process: keeping its many objects out of
    # the collector's scans keeps full collections from adding milliseconds to reviews.
    gc.collect()
    gc.freeze()

    def app_factory() -> Flask:
        return create_app(lambda: snapshot, CollectorRegistry(), config)

    serve(app_factory, host=args.host, port=args.port, cert=args.tls_cert, key=args.tls_key,
          threads=args.threads, log_level=args.log_level)
    return 0
