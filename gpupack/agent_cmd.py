"""``gpupack agent``: wiring of the node agent (composition only; the logic lives in
``nodeagent``). Also runnable as ``python -m gpupack.agent_cmd``."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType

from gpupack.metrics_auth import add_metrics_auth_argument, metrics_auth_error, metrics_guard
from kube.inventory_age import DEFAULT_MAX_AGE_S, DEFAULT_REFRESH_S

log = logging.getLogger("gpupack.agent")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nodeagent.podresources import DEFAULT_SOCKET

    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                        help="Node to report (default: $NODE_NAME)")
    parser.add_argument("--interval", type=float, default=15.0,
                        help="seconds between inventories (default 15)")
    parser.add_argument("--once", action="store_true",
                        help="take one inventory, print it as JSON and exit")
    parser.add_argument("--podresources-socket", default=DEFAULT_SOCKET,
                        help="kubelet PodResources socket (default %(default)s)")
    parser.add_argument("--proc-root", default="/proc",
                        help="host /proc as mounted in the agent (default /proc)")
    parser.add_argument("--metrics-port", type=int, default=9402,
                        help="Prometheus port; 0 disables (default 9402)")
    add_metrics_auth_argument(parser)
    parser.add_argument("--min-patch-interval", type=float, default=30.0,
                        help="seconds between Node annotation patches at most (default 30)")
    parser.add_argument("--inventory-refresh", type=float, default=DEFAULT_REFRESH_S,
                        metavar="S",
                        help="write an unchanged inventory again S seconds after the last "
                             "write, so the extender knows this agent works (it ignores "
                             "inventories older than its --inventory-max-age, default 900); "
                             "0: write only on change (default 300)")
    parser.add_argument("--mem-tolerance-mib", type=int, default=512,
                        help="memory drift that does not justify a patch (default 512)")
    parser.add_argument("--no-patch", action="store_true",
                        help="print changed inventories instead of patching the Node")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")


def _print_annotations(annotations: Mapping[str, str | None]) -> None:
    print(json.dumps(dict(annotations), separators=(",", ":")), flush=True)


def run(args: argparse.Namespace) -> int:
    from nodeagent.agent import Agent, AgentConfig
    from nodeagent.cgroups import pod_of_pid
    from nodeagent.metrics import AgentMetrics
    from nodeagent.nvml import load_default
    from nodeagent.podresources import PodResourcesClient
    from packing.inventory import to_wire

    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if not 0 <= args.inventory_refresh < float("inf"):
        print(f"gpupack agent: --inventory-refresh {args.inventory_refresh!r}: must be 0 "
              "(write only on change) or a positive number of seconds", file=sys.stderr)
        return 2
    if args.inventory_refresh == 0 and not args.once:
        log.warning("--inventory-refresh 0: an unchanged inventory is not written again, "
                    "and the extender and webhook stop trusting an inventory not rewritten "
                    "for their --inventory-max-age (900 s by default): give them "
                    "--inventory-max-age 0 too")
    elif args.inventory_refresh >= DEFAULT_MAX_AGE_S and not args.once:
        log.warning("--inventory-refresh %g: at or above the extender's default "
                    "--inventory-max-age (%g s), an idle node's inventory goes stale between "
                    "writes; keep it well below the max age the extender and webhook use",
                    args.inventory_refresh, DEFAULT_MAX_AGE_S)
    node = args.node_name or os.uname().nodename
    if not args.node_name:
        log.warning("no --node-name and no $NODE_NAME: reporting as %s", node)

    api = None
    needs_api = not (args.once or args.no_patch)
    try:
        from kube.nodes import load_core_api

        api = load_core_api(args.kubeconfig)
    except Exception as e:
        if needs_api:
            log.error("no Kubernetes API access (%s); cannot patch the Node", e)
            return 2
        # --once / --no-patch on a bare GPU box: pods are then named only via PodResources.
        log.info("no Kubernetes API access (%s); pod names from PodResources only", e)

    why = metrics_auth_error(args.metrics_auth, api is not None)
    if why is not None and args.metrics_port and not args.once:
        print(f"gpupack agent: {why}", file=sys.stderr)
        return 2

    patch: Callable[[Mapping[str, str | None]], None] | None = None
    pod_names: Callable[[], Mapping[str, str]] | None = None
    if api is not None:
        from kube.nodes import list_node_pod_keys, patch_node_annotations

        pod_names = functools.partial(list_node_pod_keys, api, node)
        if not args.no_patch:
            patch = functools.partial(patch_node_annotations, api, node)
    if args.no_patch and not args.once:
        patch = _print_annotations

    gpus = load_default()
    podres = PodResourcesClient(args.podresources_socket)
    metrics = AgentMetrics()
    agent = Agent(
        AgentConfig(node=node, min_patch_interval_s=args.min_patch_interval,
                    mem_tolerance_mib=args.mem_tolerance_mib,
                    refresh_s=args.inventory_refresh),
        gpus=gpus, podresources=podres,
        pod_of_pid=functools.partial(pod_of_pid, proc_root=args.proc_root),
        clock=time.time, metrics=metrics, patch=patch, pod_names=pod_names,
        monotonic=time.monotonic)
    try:
        if args.once:
            report = agent.observe()
            print(json.dumps(to_wire(report.inventory), indent=2), flush=True)
            return 0
        if args.metrics_port:
            from nodeagent.metrics import serve_metrics

            try:
                serve_metrics(metrics.registry, args.metrics_port,
                              ready=lambda: agent.inventories > 0,
                              guard=metrics_guard(args.metrics_auth,
                                                  api.api_client if api is not None else None))
            except OSError as e:
                print(f"gpupack agent: --metrics-port {args.metrics_port}: cannot listen: "
                      f"{e.strerror or e}", file=sys.stderr)
                return 2
        stop = threading.Event()

        def _stop(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: stopping", signum)
            stop.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        log.info("agent for node %s: every %.0fs, %s", node, args.interval,
                 "printing" if args.no_patch else "patching the Node")
        agent.run(args.interval, stop)
        return 0
    finally:
        gpus.close()
        podres.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupack agent",
                                     description="gpupack node agent (read-only GPU inventory)")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
