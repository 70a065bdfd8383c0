"""Prometheus metrics of one agent, on its own CollectorRegistry.

A per-agent registry (never the global one) keeps tests independent and lets one
process host several agents. Per-pod series are rebuilt every interval so a pod that
left stops being exported instead of freezing at its last value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from nodeagent.growth import Growth
from nodeagent.nvml import GpuSnapshot, NvmlCallError
from nodeagent.podresources import PodResourcesView
from nodeagent.report import PoolUsage, gpu_mode, product_label, usable
from serving.gate import Limits
from serving.listener import Listener
from serving.metrics_app import create_metrics_app
from serving.metrics_auth import Guard

_POD = ("namespace", "pod", "gpu")

# Scrapes are GETs: no body worth buffering; a node agent needs few connections.
METRICS_LIMITS = Limits(max_body=64 * 1024, max_connections=64,
                        buffer_budget=4 * 1024 * 1024)


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "0.0.0.0",
                  ready: Callable[[], bool] | None = None, guard: Guard | None = None
                  ) -> Listener:
    """The agent's ``/metrics`` with the health convention of every gpupack server
    (``/healthz``; ``/readyz``, ready once ``ready()`` says so, e.g. after the first
    inventory; JSON errors), started; with ``guard``, ``/metrics`` only for a bearer token
    whose identity may get it (:mod:`serving.metrics_auth`).

    A :class:`serving.listener.Listener` rather than ``prometheus_client.start_http_server``:
    that one starts a thread per connection with no read timeout, so half-open
    connections pile up threads; here they hold a capped number of sockets and are cut
    at a deadline. OSError when the port cannot be listened on."""
    app = create_metrics_app(lambda: generate_latest(registry), ready,
                             not_ready_why="no inventory taken yet", name="gpupack.agent",
                             guard=guard)
    listener = Listener(app, host, port, limits=METRICS_LIMITS, threads=2,
                        name="gpupack-agent-metrics")
    listener.start()
    return listener


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.pod_memory = Gauge("gpupack_pod_gpu_memory_bytes",
                                "GPU memory used by the pod's processes on this GPU", _POD,
                                registry=r)
        self.pod_peak = Gauge("gpupack_pod_gpu_memory_peak_bytes",
                              "Highest GPU memory the pod used on this GPU since the agent "
                              "first saw it", _POD, registry=r)
        self.pod_growth = Gauge("gpupack_pod_gpu_memory_growth_bytes_per_second",
                                "Robust growth rate of the pod's GPU memory (0 unless "
                                "significant)", _POD, registry=r)
        self.pod_exhaustion = Gauge("gpupack_pod_gpu_memory_exhaustion_seconds",
                                    "Seconds until the pod's memory pool (GPU or MIG "
                                    "instance) is full at the current growth; only for "
                                    "growing pods", _POD, registry=r)
        self.gpu_total = Gauge("gpupack_gpu_memory_total_bytes", "GPU memory",
                               ("gpu", "model", "mode"), registry=r)
        self.gpu_used = Gauge("gpupack_gpu_memory_used_bytes", "GPU memory in use",
                              ("gpu", "model", "mode"), registry=r)
        self.nvml_errors = Counter("gpupack_agent_nvml_errors_total",
                                   "NVML calls that failed, by call", ("call",), registry=r)
        self.last_success = Gauge("gpupack_agent_last_success_timestamp_seconds",
                                  "Unix time of the last interval that read NVML without "
                                  "a global failure", registry=r)
        self.patches = Counter("gpupack_agent_node_patches_total",
                               "Node annotation patches, by result", ("result",), registry=r)

    def record_errors(self, errors: Iterable[NvmlCallError]) -> None:
        for e in errors:
            self.nvml_errors.labels(call=e.call).inc()

    def update(self, now: float, snapshot: GpuSnapshot, view: PodResourcesView,
               usages: Iterable[PoolUsage],
               growth: Mapping[tuple[str, str], Growth]) -> None:
        self.record_errors(snapshot.all_errors())
        if snapshot.error is not None and not snapshot.errors:
            # No call error explains it (those are counted above): NVML did not start.
            self.nvml_errors.labels(call="nvmlInit").inc()
        for g in (self.gpu_total, self.gpu_used, self.pod_memory, self.pod_peak,
                  self.pod_growth, self.pod_exhaustion):
            g.clear()
        for dev in snapshot.devices:
            if not usable(dev):
                continue
            labels = {"gpu": str(dev.index),
                      "model": product_label(dev.name or "unknown") or "unknown",
                      "mode": gpu_mode(dev, view.shared_uuids).value}
            self.gpu_total.labels(**labels).set(dev.memory_total_bytes or 0)
            self.gpu_used.labels(**labels).set(dev.memory_used_bytes or 0)
        # A pod on two MIG devices of one GPU gets one series per GPU: sum its pools.
        per_pod: dict[tuple[str, str, str], list[tuple[PoolUsage, Growth | None]]] = {}
        for u in usages:
            namespace, _, name = u.pod.partition("/")
            per_pod.setdefault((namespace, name, str(u.gpu_index)), []).append(
                (u, growth.get((u.pod, u.pool_uuid))))
        for (namespace, name, gpu), items in per_pod.items():
            labels = {"namespace": namespace, "pod": name, "gpu": gpu}
            self.pod_memory.labels(**labels).set(sum(u.used_bytes for u, _ in items))
            self.pod_peak.labels(**labels).set(
                sum(g.peak_bytes if g else u.used_bytes for u, g in items))
            self.pod_growth.labels(**labels).set(
                sum(g.rate_bytes_per_s for _, g in items if g is not None))
            exhaustion = [g.exhaustion_s for _, g in items
                          if g is not None and g.exhaustion_s is not None]
            if exhaustion:
                self.pod_exhaustion.labels(**labels).set(min(exhaustion))
        if snapshot.error is None and (not snapshot.devices
                                       or any(usable(d) for d in snapshot.devices)):
            # A read in which every GPU failed is not a success.
            self.last_success.set(now)
