"""``gpupack serve``: the scheduler extender under gunicorn (composition only; its command
line and the checks of it are :mod:`gpupack.serve_args`).

gunicorn runs in this process through its ``BaseApplication`` with one worker process
and the threaded worker class: one worker, because the cluster cache and its assumed
binds must be single (two workers would each hand out the same GPU); threads, because
kube-scheduler calls the verbs concurrently and they spend little time each.

The app is built inside the worker (``load``), after gunicorn forks, since the watch
and planner threads would not survive a fork. When the worker stops (SIGTERM to
gunicorn, a pod deleted or rolled), gunicorn's ``worker_exit`` hook runs in it once the
requests in flight are answered: :meth:`Components.shutdown` stops the loops that queue
API writes, then lets each writer flush what it still holds (records, pod conditions,
the compaction memory) while this replica leads, all within ``SHUTDOWN_S`` seconds (well
inside gunicorn's ``graceful_timeout``, after which the worker is killed). Without it a
write queued or waiting for a retry would be lost with the process: the last change of
a record has no later one behind it.

Cluster source: the API server (``--kubeconfig`` or ``--in-cluster``), else static
files (``--nodes``/``--pods``), else the bundled example cluster.

With ``--webhook-port`` the same worker also serves the mutating admission webhook over
HTTPS (:class:`serving.https.HttpsListener`), its cluster view fed by the extender's
cache (:mod:`gpupack.webhook_host`). The background planner's solves run in a solver
child process (:mod:`scheduler.planner.solve`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication

from gpupack.inventory_expiry import inventory_age, start_expiry
from gpupack.metrics_auth import metrics_guard
from gpupack.serve_args import add_arguments as add_arguments
from gpupack.serve_args import check_args
from gpupack.startup import announce_when_synced, source_words, startup_line

EXAMPLES = Path(__file__).parent / "examples"
log = logging.getLogger("gpupack.serve")
SHUTDOWN_S = 5.0  # the whole shutdown: loops' last steps, then the writers' flush
GRACEFUL_TIMEOUT_S = 10  # gunicorn's: requests in flight, then worker_exit, then SIGKILL


class Components:
    """Everything one extender process runs, built from the parsed arguments."""

    def __init__(self, args: argparse.Namespace) -> None:
        from prometheus_client import CollectorRegistry

        from gpupack.extender_app import create_extender_app
        from kube.api_source import ApiBinder, ApiSource, load_api_client
        from kube.cache import ClusterCache
        from kube.groups.inputs import GroupInputs
        from kube.groups.lws import LwsPoller
        from kube.groups.reservations import RECORD_SELECTOR, ReservationTap
        from kube.leader import AlwaysLeader, Leadership, LeaseWatcher
        from kube.pod_conditions import ApiPodStatusStore
        from kube.record_writer import ApiRecordStore, RecordStore, RecordWriter, StaticRecordStore
        from kube.source import Binder, Source, StaticSource
        from packing.cpsat import SolverParams
        from scheduler.engine import LoopMetrics
        from scheduler.extender.app import AppConfig
        from scheduler.groups.loop import ReservationBook
        from scheduler.groups.namespace_cap import parse_reserved_cap
        from scheduler.planner.loop import Planner
        from serving.metrics_auth import Guard

        self.cache = ClusterCache(
            args.scheduler_name, mig_actuator=args.mig_actuator,
            inventory_age=inventory_age(args, bool(args.kubeconfig or args.in_cluster)))
        self._expiry_stop = threading.Event()
        self.registry = CollectorRegistry()
        params = SolverParams(max_time_s=args.time_limit, max_wall_s=args.time_limit,
                              workers=args.solver_workers,
                              seed=args.seed)
        # Every background loop's steps, by outcome (scheduler.engine).
        self.loop_metrics = LoopMetrics(self.registry)
        self.planner = Planner(self.cache, args.policy, params, debounce_s=args.debounce,
                               max_batch=args.plan_batch, per_class=args.plan_per_class,
                               loop_metrics=self.loop_metrics)
        # Typed wiring: mypy checks that each part takes what the next one calls (the tap
        # must be a full kube.source.Sink for the source that feeds it).
        self.source: Source
        self.binder: Binder
        store: RecordStore
        self.static_records: StaticRecordStore | None = None
        self.leader: Leadership = AlwaysLeader()
        self.lease: LeaseWatcher | None = None
        self.lws: LwsPoller | None = None
        self.metrics_guard: Guard | None = None
        api: Any = None
        if args.kubeconfig or args.in_cluster:
            api = load_api_client(args.kubeconfig, args.in_cluster)
            # Reviews on a client of their own: a scrape never waits on the watches' pool.
            self.metrics_guard = metrics_guard(
                args.metrics_auth, load_api_client(args.kubeconfig, args.in_cluster))
            # Group rights: ResourceQuotas watched with the cluster, LeaderWorkerSets
            # polled (the CRD may be absent), kube-scheduler's PodGroups and Workloads
            # watched while served (the GenericWorkload gate is off by default); all
            # listed (or found not served) before the verbs answer.
            self.inputs = GroupInputs(workload_api_listed=False)
            self.source = ApiSource(api, records_namespace=args.namespace,
                                    records_selector=RECORD_SELECTOR, watch_quotas=True,
                                    watch_dra=args.dra != "off", workload_api=self.inputs)
            self.lws = LwsPoller(api, self.inputs)
            self.inputs.on_unknown_lws = self.lws.nudge
            self.binder = ApiBinder(api, timeout_s=args.bind_timeout)
            store = ApiRecordStore(api, args.namespace)
            requeue_store: RecordStore | None = ApiPodStatusStore(api)
            if args.leader_lease:
                ns, _, name = args.leader_lease.partition("/")
                self.lease = LeaseWatcher(api, ns, name, args.leader_identity)
                self.leader = self.lease
        else:
            nodes = args.nodes or EXAMPLES / "nodes.yaml"
            pods = args.pods or EXAMPLES / "pods.yaml"
            self.inputs = GroupInputs(quotas_listed=True, lws_listed=True)
            static = StaticSource.from_files(nodes, pods)
            self.source = static
            self.binder = static.binder()
            self.static_records = StaticRecordStore()
            store = self.static_records
            requeue_store = None  # no kube-scheduler parks pods here
        self.group_writer = RecordWriter(store, is_leader=self.leader.is_leader,
                                         what="group record")
        # A Warning Event on each bound pod counted at its worst (kube.worst_case).
        self.unreadable: Any = None
        if api is not None:
            from kube.evictions import ApiEvents, PodRef
            from kube.worst_case import UnreadableEvents

            self.unreadable = UnreadableEvents(
                self.cache.worst_case_pods, ApiEvents(api, args.leader_identity),
                lambda key, uid: PodRef(key, uid), self.leader.is_leader)
        self.compaction_writer: RecordWriter | None = None  # set below with compaction
        # Status patches that requeue refused members once their room is reserved.
        self.requeue_writer = (None if requeue_store is None else RecordWriter(
            requeue_store, is_leader=self.leader.is_leader, what="pod condition"))
        from kube.writer_metrics import register_writers

        register_writers(self.registry, lambda: (self.group_writer, self.requeue_writer,
                                                 self.compaction_writer))
        self.groups = ReservationBook(self.cache, ttl=args.group_ttl, writer=self.group_writer,
                                      scorer=lambda: self.planner.scorer.scorer,
                                      is_leader=self.leader.is_leader, namespace=args.namespace,
                                      inputs=self.inputs, max_group_gpus=args.max_group_gpus,
                                      namespace_cap=parse_reserved_cap(
                                          args.max_namespace_reserved_gpus),
                                      requeue=self.requeue_writer,
                                      loop_metrics=self.loop_metrics)
        self.tap = ReservationTap(self.cache, self.groups)
        # Who recreates each pod (kube.owners): what defragmentation and MIG compaction
        # may evict. Fed by the source in front of the cache.
        from kube.defrag.inputs import PodOwners

        self.owners: PodOwners | None = None
        if args.defrag != "off" or (args.mig_compact and api is not None):
            self.owners = PodOwners(self.cache)
            self.tap = ReservationTap(self.owners, self.groups)
        # The MIG actuator (docs/mig.md): on the leader only, against a cluster only. Its
        # metrics exist on every extender (zero when it is off).
        from scheduler.mig.loop import MigActuator
        from scheduler.mig.metrics import MigMetrics, SliceFigures

        self.mig: MigActuator | None = None
        mig_metrics = MigMetrics(self.registry, SliceFigures(self.cache, lambda: self.mig))
        from scheduler.mig.compact.loop import CompactMetrics, Compactor

        compact_metrics = CompactMetrics(self.registry)
        if args.mig_actuator and (args.kubeconfig or args.in_cluster):
            from kube.mig.api import MigApi
            from scheduler.mig.decide import MigSettings

            cm_ns, _, cm_name = args.mig_config_map.rpartition("/")
            mig_api = MigApi(api, cm_ns or args.namespace, cm_name)
            compactor = None
            if args.mig_compact and self.owners is not None:
                from gpupack.compact_flags import compact_settings
                from kube.evictions import ApiEvents, ApiEvictor
                from kube.mig.compaction_memory import ApiMemoryReader
                from kube.mig.fences import ApiFences

                # The budget and cool-downs outlive a leader (kube.mig.compaction_memory).
                self.compaction_writer = RecordWriter(
                    ApiRecordStore(api, args.namespace), is_leader=self.leader.is_leader,
                    what="compaction memory")
                compactor = Compactor(
                    self.cache, self.owners, ApiEvictor(api),
                    ApiEvents(api, args.leader_identity, component="gpupack-mig-actuator"), mig_api,
                    settings=compact_settings(args, "--mig-compact-"),
                    metrics=compact_metrics,
                    memory=(ApiMemoryReader(api, args.namespace), self.compaction_writer,
                            args.namespace),
                    is_leader=self.leader.is_leader,  # asked before each eviction
                    fences=ApiFences(api))  # DynamicMIG GPUs being drained (DRA nodes)
            self.mig = MigActuator(
                self.cache, mig_api, compactor=compactor,
                is_leader=self.leader.is_leader, reserved=self.groups.held_members,
                ready=self.groups.check_ready,
                settings=MigSettings(timeout_s=args.mig_timeout, backoff_s=args.mig_backoff,
                                     min_idle_s=args.mig_min_idle,
                                     config_propagation_s=args.mig_config_propagation),
                metrics=mig_metrics, requeue=self.requeue_writer,
                loop_metrics=self.loop_metrics)
        # Defragmentation (docs/defrag.md): its metrics exist on every extender (zero
        # when it is off), so the dashboards and alerts always have their series.
        from scheduler.defrag.metrics import DefragMetrics

        self.defrag_metrics = DefragMetrics(self.registry)
        self.defrag: Any = None
        if args.defrag != "off":
            self.defrag = defragmenter(args, self, api)
        # Pods refused just before a node changed in the cache are woken (scheduler/
        # refusals.py): kube-scheduler retried them on that change before we saw it.
        from scheduler.extender.refusals import RecentRefusals

        self.refusals = RecentRefusals()
        if self.requeue_writer is not None:
            self.cache.on_node_changed(self.refusals.waker(self.requeue_writer))
        self.app = create_extender_app(self.cache, self.planner, self.binder, self.registry,
                                       AppConfig(max_body_bytes=args.max_body,
                                                 policy=args.policy, warm=not args.no_warm,
                                                 filter_top=args.filter_top),
                                       groups=self.groups, refusals=self.refusals,
                                       loop_metrics=self.loop_metrics)
        from gpupack.gc_keeper import GcKeeper

        self.gc_keeper = GcKeeper(args.gc_freeze_every, args.gc_full_every,
                                  busy=self.app.extensions["gpupack.inflight"].busy,
                                  loop_metrics=self.loop_metrics)
        self.no_planner = bool(args.no_planner)
        self.metrics_port = int(args.metrics_port)
        self.host = str(args.host)
        self.metrics_host = str(args.metrics_host or args.host)
        self.listening = [f"http://{args.host}:{args.port}"]
        if args.metrics_port:
            self.listening.append(f"metrics http://{self.metrics_host}:{args.metrics_port}")
        if args.webhook_port:
            self.listening.append(f"webhook https://{args.webhook_host}:{args.webhook_port}")
        self.source_words = source_words(args, f"bundled example cluster {EXAMPLES}")
        self.policy = str(args.policy)
        self.webhook: Any = None
        if args.webhook_port:
            from gpupack.webhook_cmd import client_auth_from_args, config_from_args
            from gpupack.webhook_host import SnapshotFeed
            from serving.https import HttpsListener
            from webhook.app import REVIEW_LIMITS, create_webhook_app

            client_auth, _ = client_auth_from_args(args.webhook_client_ca,
                                                   args.webhook_client_name, "webhook-")
            # Same registry: one scrape of /metrics has the extender and the webhook.
            hook = create_webhook_app(SnapshotFeed(self.cache), self.registry,
                                      config_from_args(args),
                                      exposition=self.app.extensions["gpupack.exposition"],
                                      metrics_guard=self.metrics_guard,
                                      client_auth=client_auth)
            self.webhook = HttpsListener(hook, str(args.webhook_host), int(args.webhook_port),
                                         args.tls_cert, args.tls_key, limits=REVIEW_LIMITS,
                                         name="gpupack-webhook", what="admission webhook",
                                         client_auth=client_auth,
                                         path="/mutate")

    def start(self) -> None:
        self.group_writer.start()
        if self.requeue_writer is not None:
            self.requeue_writer.start()
        if self.compaction_writer is not None:
            self.compaction_writer.start()
        if self.lease is not None:
            self.lease.poll()  # know who leads before the first answer
            self.lease.start()
        if self.static_records is not None:
            self.static_records.start(self.tap)  # records listed before the nodes and pods
        self.groups.start()
        if self.unreadable is not None:
            self.unreadable.start()
        if self.defrag is not None:
            self.defrag.start()
        if self.mig is not None:
            self.mig.start()
        if self.lws is not None:
            self.lws.start()
        self.source.start(self.tap, self.tap, self.inputs, self.cache)
        start_expiry(self.cache, self._expiry_stop)
        threading.Thread(target=self._freeze_when_synced, name="gpupack-gc-sync",
                         daemon=True).start()
        if self.webhook is not None:
            self.webhook.start()
        if not self.no_planner:
            self.planner.start()
        if self.metrics_port:
            from scheduler.extender.metrics_http import MetricsServer

            # The kubelet probes the extender here: ready exactly when its /readyz is.
            MetricsServer(self.app.extensions["gpupack.exposition"], self.metrics_host,
                          self.metrics_port, ready=self.groups.check_ready,
                          guard=self.metrics_guard).start()
        announce_when_synced(self.groups.check_ready, lambda: startup_line(
            "serve", self.source_words, self.cache.counts(), self.listening,
            [f"policy {self.policy}"]))

    def shutdown(self, budget_s: float = SHUTDOWN_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Stop what queues API writes (the reservation book, the MIG actuator, the
        defragmenter), give a step in progress up to half of ``budget_s`` to end, then
        stop each writer, which writes what it still holds while this replica leads
        (the lease keeps being polled meanwhile), until the budget is spent. Bounded:
        what is not written by then is logged by its writer and lost."""
        deadline = clock() + budget_s
        loops: list[Any] = [x for x in (self.groups, self.mig, self.defrag) if x is not None]
        if self.unreadable is not None:
            self.unreadable.stop()
        self._expiry_stop.set()
        self.gc_keeper.stop()
        for loop in loops:
            loop.stop()
        half = clock() + budget_s / 2
        for loop in loops:
            if not loop.join(half - clock()):
                log.warning("%s still in a step at shutdown; its last writes may be lost",
                            type(loop).__name__)
        writers = [w for w in (self.group_writer, self.requeue_writer,
                               self.compaction_writer) if w is not None]
        for w in writers:
            w.stop(drain_s=max(0.0, deadline - clock()))
        for w in writers:
            if not w.join(deadline - clock()):
                log.warning("%s writer: still writing at the end of the shutdown", w.what)
        if self.lease is not None:
            self.lease.stop()
        log.info("shut down: loops stopped and writers flushed in %.1f s",
                 budget_s - max(0.0, deadline - clock()))

    def _freeze_when_synced(self) -> None:
        """Once the first list is in, move everything allocated so far out of the garbage
        collector's reach: a full collection over a 5,000-node cache holds the GIL for
        ~0.1 s (a latency spike for every request in flight); frozen objects are skipped.
        Then the keeper freezes again every ``--gc-freeze-every`` seconds what was made
        since (gpupack/gc_keeper.py)."""
        while not self.cache.synced:
            time.sleep(0.1)
        self.gc_keeper.freeze_now()
        self.gc_keeper.start()


def defragmenter(args: argparse.Namespace, c: Components, api: Any) -> Any:
    """The defragmenter (``--defrag`` not off), fed pod owners by ``c.owners``."""
    from kube.evictions import ApiEvents, ApiEvictor, EventSink, LogEvents
    from scheduler.defrag.decide import DefragSettings, parse_window
    from scheduler.defrag.loop import Defragmenter

    owners = c.owners
    assert owners is not None
    events: EventSink = LogEvents() if api is None else ApiEvents(api, args.leader_identity)
    d = Defragmenter(
        c.cache, c.groups, owners, args.defrag,
        ApiEvictor(api) if api is not None and args.defrag == "act" else None, events,
        settings=DefragSettings(evictions_per_minute=args.defrag_evictions_per_minute,
                          plan_every_s=args.defrag_interval),
        metrics=c.defrag_metrics, is_leader=c.leader.is_leader,
        consolidate_window=parse_window(args.defrag_consolidate)
        if args.defrag_consolidate else None, loop_metrics=c.loop_metrics)
    return d


def run(args: argparse.Namespace, server: type[ExtenderServer] | None = None) -> int:
    """Check the arguments, then serve until stopped. ``server``: the gunicorn application
    class (default :class:`ExtenderServer`; the benchmarks pass a subclass that adds their
    own baseline route to the same process)."""
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    problem = check_args(args)
    if problem:
        print(f"gpupack serve: {problem}", file=sys.stderr)
        return 2
    if args.assume_ttl is not None:
        log.warning("--assume-ttl is deprecated and ignored: assumed binds no longer expire "
                    "(they end when the bind fails, the pod is seen bound, or it is deleted)")
    if args.kubeconfig or args.in_cluster:
        from kube.api_source import api_config_error

        why = api_config_error(args.kubeconfig, args.in_cluster)
        if why is not None:
            print(f"gpupack serve: {why}", file=sys.stderr)
            return 2
    # Static files are read once, in the worker (ExtenderServer.load): a bad file is
    # reported there and the server exits with status 2 (see below). Parsing them here
    # as well would keep a second copy of the cluster in the gunicorn master.
    from serving.listener import bind_error
    from serving.tls import check_tls

    if args.webhook_port:
        why = check_tls(args.tls_cert, args.tls_key)
        if why is not None:
            print(f"gpupack serve: --tls-cert/--tls-key: {why}", file=sys.stderr)
            return 2
        why = bind_error(args.webhook_host, args.webhook_port)
        if why is not None:
            print(f"gpupack serve: --webhook-port {args.webhook_port}: {why}", file=sys.stderr)
            return 2
    if args.metrics_port:
        why = bind_error(args.metrics_host or args.host, args.metrics_port)
        if why is not None:
            print(f"gpupack serve: --metrics-port {args.metrics_port}: {why}", file=sys.stderr)
            return 2
    # Background work in this process (memo warming, snapshot packing for the solver
    # process, the webhook's view rebuilds) is CPU-bound Python; a shorter GIL switch
    # interval (default 5 ms) keeps request threads from waiting behind it for long.
    sys.setswitchinterval(0.0005)
    from gunicorn.arbiter import Arbiter

    master = os.getpid()
    try:
        (server or ExtenderServer)(args).run()
    except SystemExit as e:
        # The worker is a fork of this very call: its own exit passes through here too.
        if e.code == Arbiter.APP_LOAD_ERROR and os.getpid() == master:
            return 2  # the worker printed why (a static file it could not read)
        raise
    return 0


class ExtenderServer(BaseApplication):
    """gunicorn in-process: one threaded worker running the app built in ``load``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.parts: Components | None = None  # built in the worker (load)
        super().__init__()

    def load_config(self) -> None:
        from gpupack.sticky_worker import StickyThreadWorker
        from serving.gate import Limits
        from serving.gunicorn_worker import GatedThreadWorker

        a = self.args
        # Both workers read each request whole in the main loop before a thread sees it
        # (serving.gunicorn_worker); a body over --max-body is handed on unread, so the
        # app answers it (400) without reading it.
        worker = StickyThreadWorker if a.http_worker == "sticky" else GatedThreadWorker
        limits = Limits(max_body=max(a.max_body, 1), idle_s=75.0)
        settings = {
            "bind": f"{a.host}:{a.port}",
            "workers": 1,
            "worker_class": worker.configured(limits, oversize="dispatch"),
            "threads": a.threads,
            "preload_app": False,
            "timeout": 60,
            "graceful_timeout": GRACEFUL_TIMEOUT_S,
            "keepalive": 75,  # kube-scheduler keeps extender connections alive
            "accesslog": None,
            "loglevel": str(a.log_level).lower(),
            "proc_name": "gpupack-serve",
            # Several extenders (tests, benchmarks) may run side by side; gunicorn's
            # runtime control socket has one default path and is not needed here.
            "control_socket_disable": True,
            "worker_exit": self.worker_exit,
        }
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        from gunicorn.errors import AppImportError

        from kube.objects import ObjectError

        sys.setswitchinterval(0.0005)
        try:
            parts = Components(self.args)
        except (ObjectError, OSError) as e:
            # A static file that cannot be read: gunicorn prints this line and halts
            # (run() then exits with status 2).
            raise AppImportError(f"gpupack serve: {e}") from None
        parts.start()
        self.parts = parts
        return parts.app

    def worker_exit(self, server: Any, worker: Any) -> None:
        """gunicorn's hook, in the worker, after it stopped serving: flush the writes
        still queued (:meth:`Components.shutdown`). Nothing when the app never loaded."""
        del server, worker
        if self.parts is not None:
            self.parts.shutdown()
