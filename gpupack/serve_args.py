"""``gpupack serve``'s command line: the options (:func:`add_arguments`) and their checks
(:func:`check_args`: every combination that cannot work is refused before anything
starts, with a message naming the option). The process itself is
:mod:`gpupack.serve_cmd`.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

from gpupack.compact_flags import add_compact_flags, compact_flag_error
from gpupack.inputs import add_mig_actuator_argument
from gpupack.inventory_expiry import (
    add_inventory_age_argument,
    inventory_age_error,
)
from gpupack.metrics_auth import add_metrics_auth_argument, metrics_auth_error


def add_arguments(p: argparse.ArgumentParser) -> None:
    from packing.policies import policy_names

    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: kube-scheduler calls the "
                        "extender over loopback as a sidecar)")
    p.add_argument("--port", type=int, default=8888, help="extender port (default 8888)")
    p.add_argument("--nodes", type=Path, default=None,
                   help="static mode: Node objects (YAML/JSON, as for `gpupack plan`)")
    p.add_argument("--pods", type=Path, default=None,
                   help="static mode: Pod objects (YAML/JSON, as for `gpupack plan`)")
    p.add_argument("--kubeconfig", default=None, help="watch the cluster of this kubeconfig")
    p.add_argument("--in-cluster", action="store_true",
                   help="watch the cluster with the pod's service account")
    p.add_argument("--scheduler-name", default="gpupack",
                   help="pending pods with this schedulerName are planned (default gpupack)")
    add_inventory_age_argument(p)
    p.add_argument("--policy", default="gpupack", choices=policy_names(),
                   help="placement policy for scores, binds and plans (default gpupack)")
    p.add_argument("--time-limit", type=float, default=2.0,
                   help="CP-SAT seconds per background plan (default 2)")
    p.add_argument("--solver-workers", type=int, default=2, help="CP-SAT workers (default 2)")
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed (default 0)")
    p.add_argument("--debounce", type=float, default=0.5,
                   help="seconds of quiet before re-planning after cluster events (default 0.5)")
    p.add_argument("--plan-batch", type=int, default=64,
                   help="most pending pods per background plan (default 64)")
    p.add_argument("--plan-per-class", type=int, default=16,
                   help="plan over candidate nodes: at most this many of each class of nodes "
                        "in equal states (default 16; 0 plans over every node)")
    p.add_argument("--no-warm", action="store_true",
                   help="do not warm the verbs' memo in the background (requests fill it)")
    p.add_argument("--gc-freeze-every", type=float, default=30.0, metavar="S",
                   help="freeze what the heap gained (a young collection, then gc.freeze) "
                        "1 s after the first lists, then at doubling intervals up to every S "
                        "seconds, so the interpreter's own full collections scan only newer "
                        "objects (default 30; 0: freeze once, when the first lists are in; "
                        "gpupack/gc_keeper.py)")
    p.add_argument("--gc-full-every", type=float, default=3600.0, metavar="S",
                   help="every S seconds the freeze step first unfreezes everything, so "
                        "garbage cycles among frozen objects are reclaimed: one scan of "
                        "the whole heap (~0.1 s at 5,000 nodes) that often (default 3600; "
                        "0: never)")
    p.add_argument("--filter-top", type=int, default=1, metavar="N",
                   help="filter hands kube-scheduler at most N fitting nodes, those the "
                        "policy prefers, plus the plan's node (default 1: kube-scheduler "
                        "takes gpupack's node without scoring, unless the pod declares "
                        "preferred affinity or ScheduleAnyway spreading; 0: every fitting "
                        "node, for kube-scheduler's score plugins to weigh; docs/install.md)")
    p.add_argument("--no-planner", action="store_true",
                   help="do not run the background planner (verbs answer greedily)")
    # Deprecated: assumed binds no longer expire (kube-scheduler dropped its assume expiry
    # too: a stalled watch made expired assumptions hand out GPUs twice). Still accepted
    # so existing command lines keep working; ignored with a warning.
    p.add_argument("--assume-ttl", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--group-ttl", type=float, default=600.0,
                   help="seconds an LLM group's reservation waits for all its members to be "
                        "bound before it is released (default 600)")
    p.add_argument("--bind-timeout", type=float, default=2.0, metavar="S",
                   help="seconds a Binding gets before the bind verb answers kube-scheduler "
                        "(default 2; keep it below the extender's httpTimeout, 3s in the "
                        "chart); a Binding not answered by then may still be applied, so "
                        "its GPUs stay held until the watch shows the pod (at most 60 s)")
    p.add_argument("--max-group-gpus", type=int, default=64,
                   help="the most GPUs one LLM group may reserve, whether its size comes "
                        "from its pods' labels or its LeaderWorkerSet object (default 64)")
    p.add_argument("--max-namespace-reserved-gpus", default="50%", metavar="N|P%",
                   help="the most GPUs one namespace's group reservations may hold at "
                        "once (rooms for members not bound yet): a number, or a share of "
                        "the cluster's GPUs (default 50%%)")
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE") or "gpupack",
                   help="gpupack's namespace: where the group reservation records "
                        "(ConfigMaps) live (default: $POD_NAMESPACE, else gpupack)")
    p.add_argument("--leader-lease", default=None, metavar="NAMESPACE/NAME",
                   help="act (reserve, write records, answer the verbs) only while the "
                        "kube-scheduler beside this extender holds this Lease (its "
                        "leaderElection resourceNamespace/resourceName); default: off, this "
                        "replica always acts (one replica, or static mode)")
    p.add_argument("--leader-identity", default=socket.gethostname(),
                   help="this replica's identity in the Lease: kube-scheduler's "
                        "holderIdentity up to its last '_' (default: the hostname, which "
                        "both containers of the pod share)")
    p.add_argument("--max-body", type=int, default=8 * 1024 * 1024,
                   help="largest request body in bytes (default 8 MiB); larger ones get 400")
    p.add_argument("--threads", type=int, default=8, help="threads of the worker (default 8)")
    p.add_argument("--http-worker", default="sticky", choices=["sticky", "gthread"],
                   help="gunicorn worker class: sticky (default: serves a busy keep-alive "
                        "connection's next request on the same thread) or gthread (the stock "
                        "hand-offs); both read each request whole before a thread sees it")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="also serve /metrics on this port (default 0: only on --port)")
    p.add_argument("--metrics-host", default=None,
                   help="address of --metrics-port (default: --host); the verbs can stay on "
                        "loopback while Prometheus scrapes 0.0.0.0:<metrics-port>")
    add_metrics_auth_argument(p)  # --metrics-port's and the webhook's /metrics
    p.add_argument("--webhook-port", type=int, default=0,
                   help="also serve the mutating admission webhook (POST /mutate) over HTTPS "
                        "on this port, on the extender's live cache (default 0: off)")
    p.add_argument("--webhook-host", default="0.0.0.0",
                   help="address of the webhook (default 0.0.0.0: the API server calls it "
                        "through a Service)")
    p.add_argument("--tls-cert", type=Path, default=None,
                   help="webhook serving certificate (PEM); reloaded when the file changes")
    p.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM)")
    from gpupack.webhook_cmd import add_client_auth_arguments

    add_client_auth_arguments(p, prefix="webhook-")
    p.add_argument("--shared-resource", default="nvidia.com/gpu.shared",
                   help="webhook: time-sliced resource name (default nvidia.com/gpu.shared)")
    p.add_argument("--default-isolation", default="any", choices=["mig", "mps", "shared", "any"],
                   help="webhook: isolation of pods without gpupack.io/isolation (default any)")
    p.add_argument("--strict-namespace", action="append", default=[], metavar="NS",
                   help="webhook: treat namespace NS as opted in to strict mode (repeatable)")
    add_mig_actuator_argument(p)
    p.add_argument("--mig-config-map", default="gpupack-mig-parted-config",
                   metavar="[NAMESPACE/]NAME",
                   help="MIG actuator: the mig-parted ConfigMap gpupack writes and the GPU "
                        "Operator's MIG manager reads, in NAMESPACE (default --namespace; "
                        "the MIG manager reads its own namespace's) (default "
                        "gpupack-mig-parted-config; docs/mig.md)")
    p.add_argument("--mig-timeout", type=float, default=900.0,
                   help="MIG actuator: seconds after which a layout change not applied "
                        "counts as failed (default 900)")
    p.add_argument("--mig-backoff", type=float, default=60.0,
                   help="MIG actuator: seconds a node is left alone after its first failed "
                        "change, doubling per failure up to an hour (default 60)")
    p.add_argument("--mig-config-propagation", type=float, default=90.0,
                   help="MIG actuator: seconds between writing a change's mig-parted entry "
                        "and setting the node's nvidia.com/mig.config label: the MIG "
                        "manager reads the kubelet's copy of the ConfigMap, refreshed at "
                        "the kubelet's sync (1 min by default); 0 labels at once (default "
                        "90)")
    p.add_argument("--mig-min-idle", type=float, default=60.0,
                   help="MIG actuator: seconds a MIG GPU must have been idle before its "
                        "layout changes (no flapping while pods come and go; default 60)")
    p.add_argument("--mig-compact", action="store_true",
                   help="MIG actuator: also empty MIG GPUs whose few pods fit in free slices "
                        "of GPUs in use, by evicting them (PodDisruptionBudgets honoured; "
                        "pods a controller recreates only; docs/mig.md)")
    add_compact_flags(p, "--mig-compact-", "MIG compaction: ")
    p.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    p.add_argument("--dra", default="auto", choices=["auto", "off"],
                   help="Dynamic Resource Allocation (docs/dra.md): auto watches the "
                        "resource.k8s.io/v1 objects (none where the API server does not "
                        "serve them) and places pods with ResourceClaims on the allocator's "
                        "predicted devices; off ignores them (default auto)")
    # Defragmentation (docs/defrag.md): on the active extender only.
    p.add_argument("--defrag", default="off", choices=["off", "plan", "act"],
                   help="free a domain for a waiting LLM group: plan (Events, metrics, log; "
                        "evicts nothing) or act (evicts through the Eviction API); default off")
    p.add_argument("--defrag-evictions-per-minute", type=int, default=2, metavar="K",
                   help="--defrag=act: at most K evictions in any minute (default 2)")
    p.add_argument("--defrag-consolidate", default="", metavar="HH:MM-HH:MM",
                   help="--defrag=act: in this daily UTC window, also evict the few pods "
                        "of nearly empty nodes to keep whole nodes free for the largest "
                        "LLM group seen (default: never)")
    p.add_argument("--defrag-interval", type=float, default=30.0, metavar="S",
                   help="plan for waiting groups at most every S seconds (sooner when the "
                        "cluster changed, at most every 5 s; default 30)")


def check_args(args: argparse.Namespace) -> str | None:
    why = inventory_age_error(args)
    if why is not None:
        return why
    if args.group_ttl <= 0:
        return "--group-ttl must be positive"
    if args.max_group_gpus < 1:
        return "--max-group-gpus must be at least 1"
    from scheduler.groups.namespace_cap import parse_reserved_cap

    try:
        parse_reserved_cap(args.max_namespace_reserved_gpus)
    except ValueError as e:
        return f"--max-namespace-reserved-gpus: {e}"
    if not 0 < args.bind_timeout <= 30:
        return "--bind-timeout must be above 0 and at most 30 seconds"
    if args.leader_lease is not None:
        ns, sep, name = args.leader_lease.partition("/")
        if not sep or not ns or not name or "/" in name:
            return (f"--leader-lease {args.leader_lease!r}: expected NAMESPACE/NAME (the "
                    "kube-scheduler's leaderElection resourceNamespace/resourceName)")
        if not (args.kubeconfig or args.in_cluster):
            return "--leader-lease needs a cluster (--kubeconfig or --in-cluster)"
    if not args.leader_identity or "_" in args.leader_identity:
        return (f"--leader-identity {args.leader_identity!r}: must be non-empty and without "
                "'_' (kube-scheduler's holderIdentity is <identity>_<uuid>)")
    why = metrics_auth_error(args.metrics_auth, bool(args.kubeconfig or args.in_cluster))
    if why is not None:
        return why
    if args.mig_timeout <= 0 or args.mig_backoff <= 0:
        return "--mig-timeout and --mig-backoff must be positive"
    if args.mig_min_idle < 0:
        return "--mig-min-idle must be 0 or positive"
    if not 0 <= args.mig_config_propagation < args.mig_timeout:
        return (f"--mig-config-propagation {args.mig_config_propagation:g}: must be 0 or "
                f"positive and below --mig-timeout ({args.mig_timeout:g})")
    if args.mig_compact and not args.mig_actuator:
        return "--mig-compact needs --mig-actuator (compaction runs in the actuator's step)"
    if args.mig_compact and not (args.kubeconfig or args.in_cluster):
        return "--mig-compact needs a cluster (--kubeconfig or --in-cluster) to evict through"
    compact_error = compact_flag_error(args, "--mig-compact-")
    if compact_error is not None:
        return compact_error
    ns, _, name = str(args.mig_config_map).rpartition("/")
    if not name or "/" in ns or (str(args.mig_config_map).startswith("/")):
        return (f"--mig-config-map {args.mig_config_map!r}: expected NAME or "
                "NAMESPACE/NAME")
    if args.filter_top < 0:
        return "--filter-top must be 0 (every fitting node) or positive"
    for flag in ("gc_freeze_every", "gc_full_every"):
        value = getattr(args, flag)
        if not (value >= 0 and value != float("inf")):  # NaN fails both
            return (f"--{flag.replace('_', '-')} {value:g}: must be 0 or a positive "
                    "number of seconds")
    if args.plan_per_class < 0:
        return "--plan-per-class must be 0 (every node) or positive"
    if args.plan_batch < 1:  # 0 planned nothing at all; a negative one dropped pods
        return f"--plan-batch {args.plan_batch}: must be at least 1"
    if args.webhook_port:
        if not (0 < args.webhook_port < 65536):
            return "--webhook-port must be a TCP port (1-65535)"
        if args.webhook_port == args.port:
            return "--webhook-port must differ from --port"
        if args.tls_cert is None or args.tls_key is None:
            return "--webhook-port needs --tls-cert and --tls-key (the API server calls HTTPS)"
        from gpupack.webhook_cmd import client_auth_from_args

        _, why = client_auth_from_args(args.webhook_client_ca, args.webhook_client_name,
                                       "webhook-")
        if why is not None:
            return why
    elif args.tls_cert is not None or args.tls_key is not None:
        return "--tls-cert/--tls-key are for the webhook: give --webhook-port too"
    elif args.webhook_client_ca is not None or args.webhook_client_name:
        return ("--webhook-client-ca/--webhook-client-name are for the webhook: give "
                "--webhook-port too")
    if args.defrag == "act" and not (args.kubeconfig or args.in_cluster):
        return "--defrag=act needs a cluster (--kubeconfig or --in-cluster) to evict through"
    if args.defrag_evictions_per_minute < 1:
        return "--defrag-evictions-per-minute must be at least 1"
    if args.defrag_interval <= 0:
        return "--defrag-interval must be positive"
    if args.defrag_consolidate:
        from scheduler.defrag.decide import parse_window

        if args.defrag != "act":
            return "--defrag-consolidate needs --defrag=act"
        try:
            parse_window(args.defrag_consolidate)
        except ValueError as e:
            return f"--defrag-consolidate {e}"
    if (args.nodes is None) != (args.pods is None):
        return "--nodes and --pods go together"
    if args.nodes is not None and (args.kubeconfig or args.in_cluster):
        return "give static files (--nodes/--pods) or a cluster (--kubeconfig/--in-cluster)"
    for path in (args.nodes, args.pods):
        if path is not None and not Path(path).is_file():
            return f"{path}: no such file"
    return None
