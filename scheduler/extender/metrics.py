"""Prometheus metrics of the extender, all named ``gpupack_*``, on an injected registry.

Request metrics are ordinary counters and histograms updated by the HTTP layer, read
fresh at each scrape. Cluster figures (GPUs and nodes free, MIG slices, pending pods by
reason, the plan's figures, the per-GPU family) are computed from the cache, off the
request path, by one background thread (:class:`Refreshed`) at most every 5 s while
someone scrapes; a scrape copies the latest (so they are up to ~5 s old). Scrapers in a
loop therefore cost the verbs one computation per 5 s, not one per scrape. The
fragmentation figure is the planner's (computing it means a pass over every node and
every typical shape, too slow for a scrape under the lock).

The per-GPU family ``gpupack_gpu_allocated`` has one series per GPU: 40,000 at 5,000
eight-GPU nodes. Formatting that many samples through ``prometheus_client`` takes ~0.8 s
of the GIL per scrape, which every request in flight would wait behind. So
:class:`GpuRows` keeps each node's lines (and its whole-GPU and MIG figures) rendered,
keyed by the cache's per-node generation, and re-renders only the nodes that changed;
:class:`Exposition` appends that text to the registry's. A computation costs one
dictionary lookup per node under the lock.

Label sets are bounded: verbs and outcomes are fixed lists, per-GPU series are labelled
by node and GPU index only (never by pod), pending-pod classes and reasons are mapped to
fixed categories.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kube.cache import ClusterCache
from kube.cache_metrics import CacheCollector, gauge
from packing.catalog import get_model
from packing.model import GpuMode
from packing.state import GpuState, NodeState
from scheduler.planner.loop import Planner

log = logging.getLogger("gpupack.scheduler.metrics")
T = TypeVar("T")

VERBS = ("filter", "prioritize", "bind", "preempt")
OUTCOMES = ("ok", "bad_request", "error")
CLASSES = ("asr", "tts", "small", "whole", "llm", "cpu")
REASONS = (
    "planned", "no_usable_gpu", "insufficient_gpu", "insufficient_cpu", "insufficient_memory",
    "group", "selector", "cordoned", "not_planned_yet", "other",
)
# Request latency buckets: the interesting range is 100 us .. 50 ms (the scheduler's
# default extender timeout is 5 s, so a few coarse buckets above).
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05,
           0.1, 0.25, 0.5, 1.0, 5.0)


def reason_category(reason: str) -> str:
    r = reason.lower()
    for needle, cat in (
        ("group", "group"), ("no gpu of a usable kind", "no_usable_gpu"),
        ("cordoned", "cordoned"), ("selector", "selector"),
        ("insufficient cpu", "insufficient_cpu"), ("insufficient memory", "insufficient_memory"),
        ("whole gpu", "insufficient_gpu"), ("slice", "insufficient_gpu"),
        ("share", "insufficient_gpu"), ("usable gpu", "no_usable_gpu"),
        ("too small", "insufficient_cpu"),
    ):
        if needle in r:
            return cat
    return "other"


def class_category(klass: str) -> str:
    return klass if klass in CLASSES else "other"


def _always() -> bool:
    return True


class ExtenderMetrics:
    """``active``: whether this replica is the one acting (the leader). A standby exports
    its own process figures (requests, cache size, ``gpupack_leader 0``) but none of the
    cluster figures (GPUs free, per-GPU allocation, MIG slices, pending pods, plan,
    groups), so dashboards that sum or max them count the active replica once without
    any change to their queries."""

    def __init__(self, registry: CollectorRegistry, cache: ClusterCache, planner: Planner,
                 active: Callable[[], bool] = _always, figures_max_age_s: float = 5.0,
                 scrape_pace_s: float = 0.2, body_max_age_s: float = 1.0) -> None:
        """``figures_max_age_s``: how old the cluster figures of a scrape may be;
        ``scrape_pace_s``, ``body_max_age_s``: see :class:`Exposition` (all 0: every
        scrape renders everything at once)."""
        self.requests = Counter(
            "gpupack_extender_requests_total", "Extender requests by verb and outcome",
            ["verb", "outcome"], registry=registry,
        )
        self.latency = Histogram(
            "gpupack_extender_request_seconds", "Extender request handling time by verb",
            ["verb"], buckets=BUCKETS, registry=registry,
        )
        self.binds = Counter(
            "gpupack_binds_total", "Bind attempts by result (ok, conflict, api_error, unknown: "
            "no answer in time, the GPUs held until the watch tells)",
            ["result"], registry=registry,
        )
        self.view_behind = Counter(
            "gpupack_extender_view_behind_total",
            "Filter answers that were an error because gpupack's view was behind "
            "kube-scheduler's (a node or group member not seen yet), by what",
            ["what"], registry=registry,
        )
        for what in ("node", "pod"):
            self.view_behind.labels(what)
        self.annotate_failures = Counter(
            "gpupack_annotate_failures_total",
            "Pods bound whose placement annotations could not be written", registry=registry,
        )
        for verb in VERBS:
            for outcome in OUTCOMES:
                self.requests.labels(verb, outcome)
            self.latency.labels(verb)
        for result in ("ok", "conflict", "api_error", "unknown"):
            self.binds.labels(result)
        self.gpu_rows = GpuRows(cache)
        self.cluster = ClusterCollector(cache, planner, self.gpu_rows, active,
                                        max_age_s=figures_max_age_s)
        registry.register(self.cluster)
        self.exposition = Exposition(registry, self.gpu_rows, active, pace_s=scrape_pace_s,
                                     body_max_age_s=body_max_age_s)


# ---- per-GPU rows, rendered per node ---------------------------------------------------------

ALLOC_NAME = "gpupack_gpu_allocated"
ALLOC_HELP = ("Allocated share of each GPU (0..1): whole, MIG slices by memory, and "
              "time-sliced shares by compute or memory booked, whichever is larger")
# GPU memory per GPU, booked by gpupack (time-sliced shares at their declared need or
# observed peak plus headroom, MIG slices at their size, whole GPUs in full) and in use
# as the node agent observed it (only GPUs an agent reports), with the GPU's size.
BOOKED_NAME = "gpupack_gpu_memory_booked_mib"
BOOKED_HELP = "GPU memory gpupack counts as taken on each GPU (MiB)"
OBSERVED_NAME = "gpupack_gpu_memory_observed_mib"
OBSERVED_HELP = "GPU memory in use on each GPU as the node agent observed it (MiB)"
TOTAL_NAME = "gpupack_gpu_memory_total_mib"
TOTAL_HELP = "GPU memory of each GPU (MiB; from the node agent, GFD, else the catalog)"


def _label_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


@dataclass(frozen=True)
class NodeRows:
    """One node's contribution to a scrape."""

    gen: int
    text: str  # its gpupack_gpu_allocated sample lines
    booked: str  # its gpupack_gpu_memory_booked_mib lines
    observed: str  # its gpupack_gpu_memory_observed_mib lines
    total: str  # its gpupack_gpu_memory_total_mib lines
    whole_gpus: int  # GPUs a whole-GPU pod could take now
    whole_node: bool  # every GPU of it could (a GPU node with room for an LLM)
    mig: tuple[tuple[tuple[str, str, str], int], ...]  # ((model, profile, state), count)


def booked_mib(g: GpuState) -> int:
    """GPU memory counted as taken on ``g``: all of it under a whole-GPU pod, the owned
    MIG slices' sizes, the time-sliced shares' booked memory."""
    if g.whole_owner is not None:
        return g.info.memory_mib
    if g.instances:
        geom = get_model(g.info.model).mig
        if geom is not None:
            return sum(geom.profile(p).memory_mib for p, owner in g.instances.values()
                       if owner is not None and geom.has_profile(p))
    return g.shared_memory_used


def allocated_fraction(g: GpuState) -> float:
    """The share of ``g`` taken (0..1): a time-sliced GPU whose shares book all its
    memory is full even when they ask for no compute."""
    used = g.used_milli / 1000
    if g.mode in (GpuMode.SHARED, GpuMode.FRACTIONAL) and g.info.memory_mib > 0:
        used = max(used, g.shared_memory_used / g.info.memory_mib)
    return used


def node_rows(name: str, n: NodeState, gen: int,
              observed: Mapping[int, int] | None = None) -> NodeRows:
    """``observed``: GPU index -> MiB in use, as the node agent reported it."""
    label = _label_value(name)
    lines = []
    booked = []
    seen = []
    total = []
    mig: Tally[tuple[str, str, str]] = Tally()
    for g in n.gpus:
        labels = f'{{node="{label}",gpu="{g.info.index}"}} '
        lines.append(f"{ALLOC_NAME}{labels}{floatToGoString(allocated_fraction(g))}\n")
        booked.append(f"{BOOKED_NAME}{labels}{booked_mib(g)}\n")
        total.append(f"{TOTAL_NAME}{labels}{g.info.memory_mib}\n")
        if observed is not None and g.info.index in observed:
            seen.append(f"{OBSERVED_NAME}{labels}{observed[g.info.index]}\n")
        for profile, owner in g.instances.values():
            # MIG instances per (model, profile, used|free): bounded by the catalog.
            mig[g.info.model, profile, "free" if owner is None else "used"] += 1
    return NodeRows(gen, "".join(lines), "".join(booked), "".join(seen), "".join(total),
                    sum(1 for g in n.gpus if g.whole_free), n.whole_free,
                    tuple(sorted(mig.items())))


@dataclass(frozen=True)
class GpuFigures:
    text: str  # the whole gpupack_gpu_allocated family, HELP and TYPE included
    memory_text: str  # the per-GPU memory families (booked, observed, total), likewise
    whole_gpus: int
    whole_nodes: int
    mig: dict[tuple[str, str, str], int]


class GpuRows:
    """Per-node rows kept rendered between scrapes (see the module docstring)."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self._rows: dict[str, NodeRows] = {}
        self._mutex = threading.Lock()  # two scrapes at once must not interleave updates
        self.rendered = 0  # nodes rendered since start (a scrape with no change adds 0)
        self.latest: GpuFigures | None = None  # of the last call of current()

    def current(self) -> GpuFigures:
        with self._mutex:
            cache = self.cache
            old = self._rows
            rows: dict[str, NodeRows] = {}
            with cache.lock:
                for name, n in cache.state.nodes.items():
                    gen = cache.gen(name)
                    r = old.get(name)
                    if r is None or r.gen != gen or gen < 0:
                        r = node_rows(name, n, gen, cache.observation(name).used)
                        self.rendered += 1
                    rows[name] = r
            self._rows = rows
        mig: Tally[tuple[str, str, str]] = Tally()
        whole_gpus = whole_nodes = 0
        parts = [f"# HELP {ALLOC_NAME} {ALLOC_HELP}\n# TYPE {ALLOC_NAME} gauge\n"]
        for r in rows.values():
            parts.append(r.text)
            whole_gpus += r.whole_gpus
            whole_nodes += r.whole_node
            for k, c in r.mig:
                mig[k] += c
        memory: list[str] = []
        for name, doc, field in ((BOOKED_NAME, BOOKED_HELP, "booked"),
                                 (OBSERVED_NAME, OBSERVED_HELP, "observed"),
                                 (TOTAL_NAME, TOTAL_HELP, "total")):
            memory.append(f"# HELP {name} {doc}\n# TYPE {name} gauge\n")
            memory.extend(getattr(r, field) for r in rows.values())
        self.latest = GpuFigures("".join(parts), "".join(memory), whole_gpus, whole_nodes,
                                 dict(mig))
        return self.latest


class Exposition:
    """The body of ``/metrics``: the registry in the Prometheus text format (0.0.4) and
    the per-GPU family after it.

    Scrapes in a loop must not slow the verbs (issue 17), so a scrape is paced and the
    body is reused: scrapes are served at least ``pace_s`` apart in this process (a
    sooner one sleeps, holding no lock and not the GIL, in its listener's scrape
    thread), and a body at most ``body_max_age_s`` old is served again as it is. Any
    number of scrapers then cost at most one rendering (~2 ms at 5,000 nodes) per
    ``body_max_age_s`` and one HTTP answer per ``pace_s``. Prometheus scrapes every 15 s
    or more and never notices either."""

    def __init__(self, registry: CollectorRegistry, rows: GpuRows,
                 active: Callable[[], bool] = _always, pace_s: float = 0.2,
                 body_max_age_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.registry = registry
        self.rows = rows
        self.active = active
        self.pace_s = pace_s
        self.body_max_age_s = body_max_age_s
        self.clock = clock
        self.sleep = sleep
        self.rendered = 0  # bodies rendered (for tests)
        self._lock = threading.Lock()
        self._next = 0.0  # when the next scrape may be served
        self._body: bytes | None = None
        self._at = 0.0

    def __call__(self) -> bytes:
        with self._lock:
            now = self.clock()
            turn = max(now, self._next)
            self._next = turn + self.pace_s
        if turn > now:
            self.sleep(turn - now)
        with self._lock:
            body, at = self._body, self._at
        if body is not None and self.clock() - at < self.body_max_age_s:
            return body
        body = self.render()
        with self._lock:
            self._body, self._at = body, self.clock()
        return body

    def render(self) -> bytes:
        self.rendered += 1
        body = generate_latest(self.registry)  # ClusterCollector refreshes the rows
        if not self.active():
            return body  # a standby: no per-GPU family (see ExtenderMetrics)
        rows = self.rows.latest or self.rows.current()
        return body + rows.text.encode() + rows.memory_text.encode()


class Refreshed(Generic[T]):
    """A value computed off the request path: :meth:`get` returns the latest at once,
    and one background thread recomputes it once it is ``max_age_s`` old, only while
    :meth:`get` was called in the last ``keep_s`` (nobody scraping: no work). The very
    first :meth:`get` computes in the caller (there is nothing older to give).

    So any number of scrapers, in a loop or not, cost at most one computation every
    ``max_age_s`` on one thread, and a scrape itself only copies the latest figures
    (at most ``max_age_s`` plus one computation old)."""

    def __init__(self, compute: Callable[[], T], max_age_s: float = 5.0, keep_s: float = 120.0,
                 clock: Callable[[], float] = time.monotonic, name: str = "gpupack-metrics"
                 ) -> None:
        self.compute = compute
        self.max_age_s = max_age_s
        self.keep_s = keep_s
        self.clock = clock
        self.name = name
        self.computed = 0  # computations so far (for tests)
        self._lock = threading.Lock()
        self._first = threading.Lock()
        self._value: T | None = None
        self._at = 0.0
        self._asked = 0.0
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def get(self) -> T:
        if self.max_age_s <= 0:  # no caching: every call computes (tests, debugging)
            fresh = self.compute()
            self._store(fresh)
            return fresh
        with self._lock:
            now = self.clock()
            self._asked = now
            value = self._value
            stale = value is not None and now - self._at >= self.max_age_s
            if stale:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self.name,
                                                    daemon=True)
                    self._thread.start()
                self._wake.set()
        if value is not None:
            return value
        with self._first:  # concurrent first scrapes compute once
            if self._value is None:
                self._store(self.compute())
            assert self._value is not None
            return self._value

    def _store(self, value: T) -> None:
        with self._lock:
            self._value, self._at = value, self.clock()
            self.computed += 1

    def _run(self) -> None:
        while True:
            self._wake.wait(self.max_age_s)
            self._wake.clear()
            with self._lock:
                now = self.clock()
                due = now - self._at >= self.max_age_s and now - self._asked <= self.keep_s
            if not due:
                continue
            try:
                self._store(self.compute())
            except Exception:
                log.exception("%s: computing the figures failed; serving the previous ones",
                              self.name)


class ClusterCollector(Collector):
    """Process figures at each scrape; the cluster figures (a pass over every node and
    pending pod) from :class:`Refreshed`, off the request path."""

    def __init__(self, cache: ClusterCache, planner: Planner, rows: GpuRows,
                 active: Callable[[], bool] = _always, max_age_s: float = 5.0) -> None:
        self.cache = cache
        self.planner = planner
        self.rows = rows
        self.active = active
        self._cache_figures = CacheCollector(cache)
        self.cluster = Refreshed(lambda: list(self._cluster_figures()), max_age_s=max_age_s,
                                 name="gpupack-cluster-figures")

    def collect(self) -> Iterator[Metric]:
        leader = self.active()
        yield gauge("gpupack_leader",
                    "1 on the replica that acts (its kube-scheduler leads), else 0",
                    1.0 if leader else 0.0)
        yield from self._cache_figures.collect()
        if leader:
            yield from self.cluster.get()

    def _cluster_figures(self) -> Iterator[GaugeMetricFamily]:
        cache = self.cache
        figures = self.rows.current()
        mig = figures.mig
        whole_gpus, whole_nodes = figures.whole_gpus, figures.whole_nodes
        with cache.lock:
            pending = cache.pending()
        plan = self.planner.plan

        slices = GaugeMetricFamily(
            "gpupack_mig_instances",
            "MIG instances by GPU model, profile and state (used by a pod, or created and free)",
            labels=["model", "profile", "state"],
        )
        for (model, profile, state), count in sorted(mig.items()):
            slices.add_metric([model, profile, state], count)
        yield slices
        yield gauge("gpupack_whole_gpus_free", "GPUs a whole-GPU pod could take now", whole_gpus)
        yield gauge("gpupack_whole_nodes_free", "GPU nodes with every GPU free for whole-GPU pods",
                    whole_nodes)
        yield gauge("gpupack_fragmentation_ratio",
                    "Share of idle GPU capacity the typical pods cannot use (at the last plan)",
                    plan.fragmentation)
        age = self.planner.age()
        yield gauge("gpupack_plan_age_seconds", "Seconds since the latest plan was solved",
                    -1.0 if age is None else age)
        yield gauge("gpupack_plan_solve_seconds", "Wall time of the latest solve",
                    plan.solve_seconds)
        status = GaugeMetricFamily("gpupack_plan_status", "1 for the latest solve's status",
                                   labels=["status"])
        status.add_metric([_status_category(plan.status)], 1.0)
        yield status
        yield gauge("gpupack_plan_solves", "Solves since start", self.planner.solves)
        replaced = GaugeMetricFamily(
            "gpupack_scorer_replacements",
            "Scorer replacements since start, by reason (shapes: the workload's shapes moved; "
            "rare_shapes: the shapes only a few nodes can host changed; free_sizes: the "
            "cluster's histogram of GPU free sizes drifted); each makes the verbs score "
            "every node state again", labels=["reason"])
        for reason, count in sorted(self.planner.replacements.items()):
            replaced.add_metric([reason], count)
        yield replaced
        tally: Tally[tuple[str, str]] = Tally()
        for pod in pending:
            if pod.key in plan.placements:
                reason = "planned"
            elif pod.key in plan.unschedulable:
                reason = reason_category(plan.unschedulable[pod.key])
            elif pod.group is not None:
                reason = "group"  # a group member: placed (or refused) by its reservation
            else:
                reason = "not_planned_yet"
            tally[class_category(pod.klass), reason] += 1
        fam = GaugeMetricFamily("gpupack_pending_pods", "Pending pods of our scheduler",
                                labels=["class", "reason"])
        for klass in (*CLASSES, "other"):
            for reason in REASONS:
                fam.add_metric([klass, reason], tally.get((klass, reason), 0))
        yield fam


def _status_category(status: str) -> str:
    """Solver statuses like ``OPTIMAL/fallback-greedy`` reduced to a fixed set."""
    head = status.split("/")[0].split("-")[0]
    known = {"none", "idle", "greedy", "OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN",
             "MODEL_INVALID", "TOO_LARGE", "error"}
    return head if head in known else "other"
