"""The Grafana dashboards and Prometheus alert rules of gpupack, as data.

``manifests/generate.py`` writes them into the kustomize base and the Helm chart; the
tests read the *rendered* manifests, so what is checked is what ships.

Metric sources (see the code for their definitions):

* scheduler extender, ``scheduler/extender/metrics.py``: ``gpupack_gpu_allocated{node,gpu}``,
  ``gpupack_gpu_memory_{booked,observed,total}_mib{node,gpu}``,
  ``gpupack_device_plugin_disagreements_total{kind}``,
  ``gpupack_whole_gpus_free``, ``gpupack_whole_nodes_free``,
  ``gpupack_fragmentation_ratio``, ``gpupack_pending_pods{class,reason}``,
  ``gpupack_extender_requests_total{verb,outcome}``,
  ``gpupack_extender_request_seconds{verb}`` (histogram), ``gpupack_binds_total{result}``,
  ``gpupack_plan_solve_seconds``, ``gpupack_plan_age_seconds``,
  ``gpupack_plan_status{status}``, ``gpupack_scorer_replacements{reason}``,
  ``gpupack_dra_devices{model,profile,state}``,
  ``gpupack_dra_shared_memory_mib{model,state}``,
  ``gpupack_dra_node_answers_total{verdict}`` (``scheduler/dra/metrics.py``),
  ``gpupack_dra_predictions_checked_total{outcome}``, ``gpupack_dra_nodes``
  (``kube/cache_metrics.py``); MIG actuator, ``scheduler/mig/loop.py``:
  ``gpupack_mig_slices{profile,state}``, ``gpupack_mig_reconfigurations_total{result}``,
  ``gpupack_mig_reconfigurations_in_flight``, ``gpupack_mig_gpus_converted_total{to}``,
  ``gpupack_mig_gpus_held``, ``gpupack_mig_nodes_backed_off``; MIG compaction,
  ``scheduler/mig/compact/loop.py``: ``gpupack_mig_drains_total{result}``,
  ``gpupack_mig_compaction_evictions_total{outcome}``, ``gpupack_mig_drains_in_flight``,
  ``gpupack_mig_steered``, ``gpupack_mig_steer_changes_total{change}``;
  defragmentation,
  ``scheduler/defrag/loop.py``: ``gpupack_defrag_moves_planned_total``,
  ``gpupack_defrag_evictions_total{outcome}``, ``gpupack_defrag_gpus_freed_total``,
  ``gpupack_defrag_campaigns_stopped_total{reason}``, ``gpupack_defrag_active``,
  ``gpupack_defrag_group_wait_seconds`` (histogram); every background loop (reservation
  book, planner, warmer, MIG actuator, defragmentation), ``scheduler/engine.py``:
  ``gpupack_loop_steps_total{loop,outcome}``, ``gpupack_loop_step_seconds{loop}``.
* webhook, ``webhook/metrics.py``: ``gpupack_webhook_reviews_total{outcome,class}``,
  ``gpupack_webhook_warnings_total{class}``, ``gpupack_webhook_latency_seconds``; against
  a cluster, its own cache's figures too (``kube/cache_metrics.py``, the same names as
  the extender's: ``gpupack_cache_*``, ``gpupack_node_inventories_stale``,
  ``gpupack_device_plugin_disagreements_total``).
* node agent, ``nodeagent/metrics.py``: ``gpupack_gpu_memory_{total,used}_bytes{gpu,
  model,mode}``, ``gpupack_pod_gpu_memory_bytes{namespace,pod,gpu}``, ``..._peak_bytes``,
  ``..._growth_bytes_per_second``, ``..._exhaustion_seconds``,
  ``gpupack_agent_last_success_timestamp_seconds``, ``gpupack_agent_nvml_errors_total``.
  The ServiceMonitor adds the ``node`` label from the pod's node name.

Query conventions: ``$__rate_interval`` in range selectors (Grafana fills it in; the tests
substitute ``1m``); no dashboard variable other than the data source, so every query
can be evaluated as written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# Alert thresholds, shared with docs/install.md.
EXHAUSTION_HORIZON_S = 3600
LLM_WAIT_MINUTES = 10
FRAGMENTATION_THRESHOLD = 0.5
DEFRAG_REFUSALS_30M = 10  # refused evictions in 30 minutes before the alert fires
MIG_DRAINS_STOPPED_1H = 5  # MIG drains that did not empty their GPU in an hour
EXTENDER_P99_SECONDS = 1.0  # a third of the scheduler's httpTimeout (3s)
EXTENDER_ERROR_RATIO = 0.05

EXTENDER_JOB = "gpupack-scheduler-metrics"
# The base installs into this namespace; the Prometheus Operator labels every target
# with its namespace, so the rule names both (the Helm chart writes its release's).
EXTENDER_NAMESPACE = "gpupack"
AGENT_JOB = "gpupack-node-agent"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # timeseries | stat | bargauge | table
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8
    stacked: bool = False
    max: float | None = None


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    tags: tuple[str, ...] = field(default=("gpupack",))


Q = Query

CLUSTER = Dashboard(
    uid="gpupack-cluster",
    title="gpupack / Cluster GPU packing",
    description="Allocation, free whole GPUs and nodes, fragmentation, per-GPU occupancy "
                "and pending pods, as seen by the gpupack scheduler extender.",
    panels=(
        Panel("GPU allocation (cluster)", (
            Q("sum(gpupack_gpu_allocated) / count(gpupack_gpu_allocated)", "allocated"),),
            kind="stat", unit="percentunit", width=6, height=5, max=1,
            description="Allocated share of all GPUs the extender knows (MIG slices and "
                        "time-sliced shares count as fractions of their GPU)."),
        Panel("Whole GPUs free", (Q("gpupack_whole_gpus_free", "GPUs"),),
              kind="stat", width=6, height=5,
              description="GPUs a whole-GPU (LLM) pod could take right now."),
        Panel("Whole nodes free", (Q("gpupack_whole_nodes_free", "nodes"),),
              kind="stat", width=6, height=5,
              description="GPU nodes with every GPU free: room for a tensor-parallel LLM pod."),
        Panel("Fragmentation", (Q("gpupack_fragmentation_ratio", "fragmentation"),),
              kind="stat", unit="percentunit", width=6, height=5, max=1,
              description="Share of idle GPU capacity the typical pods cannot use (FGD "
                          "measure, at the latest plan). Alert above "
                          f"{FRAGMENTATION_THRESHOLD:.0%}."),
        Panel("Allocation and free capacity over time", (
            Q("sum(gpupack_gpu_allocated)", "GPUs allocated"),
            Q("count(gpupack_gpu_allocated)", "GPUs total"),
            Q("gpupack_whole_gpus_free", "whole GPUs free"),
            Q("gpupack_whole_nodes_free", "whole nodes free"),
        ), width=12),
        Panel("Fragmentation over time", (
            Q("gpupack_fragmentation_ratio", "fragmentation"),),
            unit="percentunit", width=12, max=1),
        Panel("Occupancy per node and GPU", (
            Q("gpupack_gpu_allocated", "{{node}} / GPU {{gpu}}", instant=True),),
            kind="bargauge", unit="percentunit", width=12, height=10, max=1,
            description="Allocated share of each GPU: packed GPUs are full, the rest are "
                        "empty (kept whole for LLM pods)."),
        Panel("GPU memory per GPU: booked and observed", (
            Q("gpupack_gpu_memory_booked_mib * 1048576", "{{node}} / GPU {{gpu}} booked",
              instant=True),
            Q("max by (node, gpu) (gpupack_gpu_memory_used_bytes)",
              "{{node}} / GPU {{gpu}} observed", instant=True),),
            kind="bargauge", unit="bytes", width=12, height=10,
            description="Per GPU, the memory gpupack counts as taken (time-sliced shares at "
                        "their declared need or observed peak plus 10%, MIG slices at their "
                        "size, whole GPUs in full) beside the memory in use as the node agent "
                        "measures it. Observed above booked: a pod outgrew what it declared."),
        Panel("Occupancy per node", (
            Q("sum by (node) (gpupack_gpu_allocated)", "{{node}}"),),
            stacked=True, width=12, height=10),
        Panel("Pending pods by class and reason", (
            Q("sum by (class, reason) (gpupack_pending_pods) > 0", "{{class}}: {{reason}}"),
        ), stacked=True, width=12,
            description="Pods of the gpupack profile not bound yet; reason 'planned' means "
                        "the planner has a place for them."),
        Panel("LLM / whole-GPU pods pending", (
            Q('sum by (reason) (gpupack_pending_pods{class=~"llm|whole"})', "{{reason}}"),),
            stacked=True, width=12,
            description=f"Alert when some wait over {LLM_WAIT_MINUTES} minutes."),
        Panel("Pods waiting for their group", (
            Q('sum by (class) (gpupack_pending_pods{reason="group"})', "{{class}}"),),
            stacked=True, width=12,
            description="Pending pods held back because their LLM group (LeaderWorkerSet "
                        "or gpupack.io/group) cannot be placed all at once."),
        Panel("MIG slice use per profile", (
            Q("sum by (model, profile, state) (gpupack_mig_instances)",
              "{{model}} {{profile}} {{state}}"),), stacked=True, width=12,
            description="MIG instances by GPU model and profile: used by a pod, or created "
                        "and free. Many free instances of one profile while pods of another "
                        "wait is a layout to rebalance."),
        Panel("MIG slices per profile: free vs waiting", (
            Q("sum by (profile, state) (gpupack_mig_slices)", "{{profile}} {{state}}"),),
            width=12,
            description="Free: slices that exist and no pod holds. Waiting: pending pods "
                        "that no free slice and no slice being created serves (the MIG "
                        "actuator's demand; docs/mig.md)."),
        Panel("MIG reconfigurations", (
            Q("sum by (result) (increase(gpupack_mig_reconfigurations_total"
              "[$__rate_interval]))", "{{result}}"),
            Q("gpupack_mig_reconfigurations_in_flight", "in flight"),
            Q("gpupack_mig_nodes_backed_off", "nodes backed off"),), width=12,
            description="Layout changes the MIG actuator handed to the GPU Operator's MIG "
                        "manager, by result; in flight; nodes left alone after a failure. "
                        "Alert GpupackMigReconfigurationFailed on failed or timed-out ones."),
        Panel("GPUs converted by the MIG actuator", (
            Q("sum by (to) (gpupack_mig_gpus_converted_total)", "to {{to}}"),
            Q("gpupack_mig_gpus_held", "GPUs held for changes in flight"),), width=12,
            description="GPUs whose layout a successful change set (to MIG, back to "
                        "whole), and GPUs held while a change runs."),
        Panel("MIG compaction: GPUs drained and pods moved", (
            Q("sum by (result) (increase(gpupack_mig_drains_total[$__rate_interval]))",
              "drain {{result}}"),
            Q("sum by (outcome) (increase(gpupack_mig_compaction_evictions_total"
              "[$__rate_interval]))", "eviction {{outcome}}"),
            Q("gpupack_mig_drains_in_flight", "draining"),
            Q("gpupack_mig_steered", "steered (GPU, profile)"),), width=12,
            description="MIG compaction (--mig-compact): GPUs drained (started; emptied, or "
                        "stopped: refilled, refused, timeout, gone) and the evictions it "
                        "asked of the Eviction API by outcome; on DynamicMIG nodes, the "
                        "(idle GPU, MIG profile) pairs whose MIG devices it fences so the "
                        "DRA allocator fills a GPU in MIG mode first. Alert "
                        "GpupackMigDrainsStopped when drains keep stopping."),
        Panel("Defragmentation: evictions for waiting groups", (
            Q("sum by (outcome) (increase(gpupack_defrag_evictions_total"
              "[$__rate_interval]))", "{{outcome}}"),
            Q("increase(gpupack_defrag_gpus_freed_total[$__rate_interval])", "GPUs freed"),
            Q("gpupack_defrag_active", "campaign running"),), width=12,
            description="Evictions the defragmenter asked of the Eviction API for a "
                        "waiting LLM group (--defrag=act), by outcome: evicted, refused "
                        "(pdb: a PodDisruptionBudget answered 429; forbidden; error), gone; "
                        "GPUs freed; whether a campaign runs. docs/defrag.md."),
        Panel("Defragmentation: time from group waiting to room reserved (p90)", (
            Q("histogram_quantile(0.9, sum by (le) "
              "(rate(gpupack_defrag_group_wait_seconds_bucket[$__rate_interval])))", "p90"),
            Q("sum by (reason) (increase(gpupack_defrag_campaigns_stopped_total"
              "[$__rate_interval]))", "stopped: {{reason}}"),), unit="s", width=12,
            description="For groups the defragmenter freed room for: seconds from first "
                        "waiting to the room being reserved; campaigns ended, by reason."),
        Panel("Group reservations", (
            Q("gpupack_group_reservations", "reservations"),
            Q("gpupack_group_reserved_gpus", "GPUs held"),), width=12,
            description="LLM groups holding room for members not bound yet, and the GPUs "
                        "held for them (no other pod gets those)."),
        Panel("Groups waiting by reason", (
            Q("sum by (reason) (gpupack_groups_waiting)", "{{reason}}"),), stacked=True,
            width=12,
            description="Groups that do not fit whole and hold nothing, by reason."),
        Panel("Time from first member seen to group complete (p90)", (
            Q("histogram_quantile(0.9, sum by (le) "
              "(rate(gpupack_group_complete_seconds_bucket[$__rate_interval])))", "p90"),),
            unit="s", width=12),
        Panel("DRA: devices by profile and state", (
            Q("sum by (profile, state) (gpupack_dra_devices)", "{{profile}} {{state}}"),),
            stacked=True, width=12,
            description="Devices the DRA driver publishes in ResourceSlices (gpu: a whole "
                        "GPU; share: a whole GPU claims share by memory; else a MIG "
                        "profile), by state: used (a claim holds it, or a share of it), "
                        "free, unavailable (what is held of its GPU overlaps it, or the "
                        "GPU is tainted). docs/dra.md."),
        Panel("DRA: memory of shared GPUs", (
            Q("sum by (model, state) (gpupack_dra_shared_memory_mib) * 1048576",
              "{{model}} {{state}}"),), unit="bytes", stacked=True, width=12,
            description="MiB of the GPUs that DRA claims share (consumable capacity): used "
                        "(the memory the shares consumed), free, unavailable (the GPU is "
                        "tainted or a MIG device of it is held). docs/dra.md."),
        Panel("DRA: allocations predicted vs allocated", (
            Q("sum by (outcome) (increase(gpupack_dra_predictions_checked_total"
              "[$__rate_interval]))", "{{outcome}}"),
            Q("sum by (verdict) (increase(gpupack_dra_node_answers_total"
              "[$__rate_interval]))", "nodes judged: {{verdict}}"),
            Q("gpupack_dra_nodes", "DRA nodes"),), width=12,
            description="Each allocation the extender assumed at bind compared with the one "
                        "kube-scheduler's allocator wrote (disagree: the extender's model of "
                        "the allocator was wrong; each one is logged with both device lists); "
                        "the nodes judged for pods with claims, by the predicted verdict."),
        Panel("kube-scheduler's queue: pods woken, answers on a view behind", (
            Q("sum(increase(gpupack_group_members_requeued_total[$__rate_interval]))",
              "group members woken"),
            Q("sum(increase(gpupack_mig_pods_requeued_total[$__rate_interval]))",
              "pods woken by a MIG change"),
            Q("sum by (what) (increase(gpupack_extender_view_behind_total"
              "[$__rate_interval]))", "view behind: {{what}}"),), width=12,
            description="Pods gpupack woke with a status condition (RoomReserved, "
                        "MigSlicesCreated) after deciding something kube-scheduler saw no "
                        "event for; filter answers that were an error because gpupack's "
                        "watch was behind kube-scheduler's (a node or group member not "
                        "seen yet). A lasting stream of the latter means a slow or stalled "
                        "watch. docs/groups.md, docs/install.md."),
    ),
)

MEMORY = Dashboard(
    uid="gpupack-gpu-memory",
    title="gpupack / GPU memory per pod",
    description="Per-pod GPU memory, peaks and growth from the node agent (NVML + kubelet "
                "PodResources); exhaustion forecasts for time-sliced GPUs.",
    panels=(
        Panel("GPU memory used per pod", (
            Q("sum by (node, namespace, pod) (gpupack_pod_gpu_memory_bytes)",
              "{{namespace}}/{{pod}} on {{node}}"),), unit="bytes", width=12),
        Panel("Peak GPU memory per pod", (
            Q("max by (node, namespace, pod) (gpupack_pod_gpu_memory_peak_bytes)",
              "{{namespace}}/{{pod}}", instant=True),), kind="bargauge", unit="bytes",
            width=12),
        Panel("Memory growth per pod", (
            Q("sum by (node, namespace, pod) "
              "(gpupack_pod_gpu_memory_growth_bytes_per_second)", "{{namespace}}/{{pod}}"),),
            unit="Bps", width=12,
            description="Robust growth rate the agent measures (0 unless significant)."),
        Panel("Time to exhaustion of the pod's GPU", (
            Q("min by (node, namespace, pod) (gpupack_pod_gpu_memory_exhaustion_seconds)",
              "{{namespace}}/{{pod}}"),), unit="s", width=12,
            description="Only growing pods have a value; alert under "
                        f"{EXHAUSTION_HORIZON_S // 60} minutes."),
        Panel("GPU memory used per GPU", (
            Q("gpupack_gpu_memory_used_bytes / gpupack_gpu_memory_total_bytes",
              "{{node}} GPU {{gpu}} ({{model}}, {{mode}})"),), unit="percentunit",
            width=12, max=1),
        Panel("Forecast in one hour (time-sliced GPUs)", (
            Q('predict_linear(gpupack_gpu_memory_used_bytes{mode="shared"}[30m], 3600) '
              '/ gpupack_gpu_memory_total_bytes{mode="shared"}',
              "{{node}} GPU {{gpu}}"),), unit="percentunit", width=12,
            description="Linear forecast of each shared GPU's memory in an hour: over "
                        "100% means a neighbour will OOM."),
    ),
)

EXTENDER = Dashboard(
    uid="gpupack-extender",
    title="gpupack / Extender, webhook and solver",
    description="Latency and outcome of the kube-scheduler extender verbs, binds, the "
                "background CP-SAT planner and the sizing webhook.",
    panels=(
        Panel("Extender latency p99 by verb", (
            Q("histogram_quantile(0.99, sum by (le, verb) "
              "(rate(gpupack_extender_request_seconds_bucket[$__rate_interval])))",
              "{{verb}}"),), unit="s", width=12,
            description="kube-scheduler gives up after httpTimeout (3s); alert at "
                        f"{EXTENDER_P99_SECONDS:g}s."),
        Panel("Extender requests by verb and outcome", (
            Q("sum by (verb, outcome) "
              "(rate(gpupack_extender_requests_total[$__rate_interval]))",
              "{{verb}} {{outcome}}"),), unit="reqps", stacked=True, width=12),
        Panel("Binds by result", (
            Q("sum by (result) (rate(gpupack_binds_total[$__rate_interval]))", "{{result}}"),),
            unit="ops", stacked=True, width=12),
        Panel("Planner solve time", (
            Q("gpupack_plan_solve_seconds", "solve"),), unit="s", width=12),
        Panel("Plan age", (Q("gpupack_plan_age_seconds", "age"),), unit="s", width=12),
        Panel("Planner status", (
            Q("gpupack_plan_status == 1", "{{status}}", instant=True),), kind="table",
            width=12),
        Panel("Webhook reviews by outcome and class", (
            Q("sum by (outcome, class) "
              "(rate(gpupack_webhook_reviews_total[$__rate_interval]))",
              "{{outcome}} {{class}}"),), unit="reqps", stacked=True, width=12),
        Panel("Webhook latency p99", (
            Q("histogram_quantile(0.99, sum by (le) "
              "(rate(gpupack_webhook_latency_seconds_bucket[$__rate_interval])))", "p99"),),
            unit="s", width=12,
            description="The API server waits at most timeoutSeconds (5s), then admits the "
                        "pod unchanged (failurePolicy Ignore)."),
    ),
)

DASHBOARDS: dict[str, Dashboard] = {
    "gpupack-cluster": CLUSTER,
    "gpupack-gpu-memory": MEMORY,
    "gpupack-extender": EXTENDER,
}


def _panel_json(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    ds = {"type": "prometheus", "uid": "${datasource}"}
    defaults: dict[str, Any] = {"unit": p.unit}
    if p.max is not None:
        defaults["min"] = 0
        defaults["max"] = p.max
    if p.kind == "timeseries":
        defaults["custom"] = {"stacking": {"mode": "normal" if p.stacked else "none"},
                              "fillOpacity": 30 if p.stacked else 10, "lineWidth": 1}
    out: dict[str, Any] = {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": ds,
        "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": ds, "expr": q.expr,
             "legendFormat": q.legend, "instant": q.instant, "range": not q.instant}
            for i, q in enumerate(p.queries)
        ],
    }
    if p.kind == "bargauge":
        out["options"] = {"displayMode": "gradient", "orientation": "horizontal",
                          "reduceOptions": {"calcs": ["lastNotNull"], "values": False}}
    elif p.kind == "stat":
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "values": False},
                          "colorMode": "value", "graphMode": "area"}
    return out


def dashboard_dict(d: Dashboard) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    x = y = 0
    row_h = 0
    for i, p in enumerate(d.panels, start=1):
        if x + p.width > 24:
            x, y, row_h = 0, y + row_h, 0
        panels.append(_panel_json(p, i, x, y))
        x += p.width
        row_h = max(row_h, p.height)
    return {
        "uid": d.uid,
        "title": d.title,
        "description": d.description,
        "tags": list(d.tags),
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "timezone": "browser",
        "templating": {"list": [{
            "name": "datasource", "label": "Data source", "type": "datasource",
            "query": "prometheus", "current": {}, "hide": 0,
        }]},
        "annotations": {"list": []},
        "panels": panels,
    }


def dashboard_json(d: Dashboard) -> str:
    return json.dumps(dashboard_dict(d), indent=2, sort_keys=False) + "\n"


# Where each alert's runbook lives (docs/runbooks.md, one section per alert); the Helm
# chart re-bases it on monitoring.prometheusRule.runbookBaseURL.
RUNBOOK_BASE_URL = "https://github.com/gpupack/gpupack/blob/main/docs/runbooks.md"


def _alert(name: str, signal: str, op: str, threshold: str, duration: str, severity: str,
           summary: str, description: str) -> dict[str, Any]:
    """One alert whose expression is ``(<signal>) <op> <threshold>``.

    The tests evaluate ``signal`` alone against a real Prometheus (it must return data)
    and the whole expression (it must evaluate without error).
    """
    return {
        "alert": name,
        "expr": f"({signal}) {op} {threshold}",
        "for": duration,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description,
                        "runbook_url": f"{RUNBOOK_BASE_URL}#{name.lower()}"},
    }


RULE_GROUPS: list[dict[str, Any]] = [
    {
        "name": "gpupack.memory",
        "rules": [
            _alert("GpupackPodGpuMemoryExhaustion",
                   "min by (node, namespace, pod, gpu) "
                   "(gpupack_pod_gpu_memory_exhaustion_seconds)",
                   "<", str(EXHAUSTION_HORIZON_S), "5m", "warning",
                   "Pod {{ $labels.namespace }}/{{ $labels.pod }} will fill its GPU within "
                   "an hour",
                   "At its current growth the GPU memory of {{ $labels.namespace }}/"
                   "{{ $labels.pod }} (node {{ $labels.node }}, GPU {{ $labels.gpu }}) is "
                   "exhausted in {{ $value | humanizeDuration }}; on a time-sliced GPU its "
                   "neighbours OOM first."),
            _alert("GpupackSharedGpuMemoryForecastFull",
                   'predict_linear(gpupack_gpu_memory_used_bytes{mode="shared"}[30m], 3600) '
                   '/ gpupack_gpu_memory_total_bytes{mode="shared"}',
                   ">", "1", "10m", "warning",
                   "Time-sliced GPU {{ $labels.gpu }} on {{ $labels.node }} is forecast "
                   "full within an hour",
                   "A linear fit of the last 30 minutes predicts {{ $value | humanizePercentage }} "
                   "of the GPU's memory in use in one hour."),
        ],
    },
    {
        "name": "gpupack.scheduling",
        "rules": [
            _alert("GpupackLLMPodsWaiting",
                   'sum(gpupack_pending_pods{class=~"llm|whole"})',
                   ">", "0", f"{LLM_WAIT_MINUTES}m", "warning",
                   "LLM (whole-GPU) pods have been pending over "
                   f"{LLM_WAIT_MINUTES} minutes",
                   "{{ $value }} LLM / whole-GPU pods of the gpupack scheduler are pending "
                   f"and have been for {LLM_WAIT_MINUTES} minutes or more; see the "
                   "'Pending pods by class and reason' panel."),
            _alert("GpupackMigReconfigurationFailed",
                   "sum(increase(gpupack_mig_reconfigurations_total"
                   '{result=~"failed|timeout|error"}[30m]))',
                   ">", "0", "0m", "warning",
                   "MIG layout changes failed",
                   "{{ $value }} MIG layout change(s) failed, timed out or could not be "
                   "handed to the MIG manager in the last 30 minutes; the GPUs were given "
                   "back and the nodes backed off. See the node's Events "
                   "(MigReconfigureFailed) and nvidia.com/mig.config.state."),
            _alert("GpupackMigDrainsStopped",
                   "sum(increase(gpupack_mig_drains_total"
                   '{result=~"refilled|refused|timeout"}[1h]))',
                   ">", str(MIG_DRAINS_STOPPED_1H), "0m", "info",
                   "MIG compaction keeps stopping before a GPU is empty",
                   "{{ $value }} MIG drains stopped in the last hour without emptying "
                   "their GPU (PodDisruptionBudgets refusing evictions, pods landing on "
                   "the drained GPU, or pods not going); each GPU cools down 30 minutes. "
                   "See the nodes' MigDrainStopped Events."),
            _alert("GpupackDefragEvictionsRefused",
                   "sum(increase(gpupack_defrag_evictions_total"
                   '{outcome=~"pdb|forbidden|error"}[30m]))',
                   ">", str(DEFRAG_REFUSALS_30M), "0m", "info",
                   "Defragmentation keeps being refused evictions",
                   "{{ $value }} evictions for waiting LLM groups were refused in the last "
                   "30 minutes (PodDisruptionBudgets answering 429, or RBAC/API errors); "
                   "the groups keep waiting. See the DefragEvictionRefused Events."),
            _alert("GpupackDraPredictionsDisagree",
                   "sum(increase(gpupack_dra_predictions_checked_total"
                   '{outcome="disagree"}[1h]))',
                   ">", "0", "0m", "warning",
                   "kube-scheduler allocated DRA devices gpupack did not predict",
                   "{{ $value }} claim(s) in the last hour were allocated other devices "
                   "than gpupack's model of kube-scheduler's allocator predicted: the room "
                   "gpupack books on DRA nodes is wrong there. The extender logs each one "
                   "with both device lists."),
            _alert("GpupackFragmentationHigh",
                   "max(gpupack_fragmentation_ratio)",
                   ">", str(FRAGMENTATION_THRESHOLD), "30m", "info",
                   "GPU fragmentation above "
                   f"{FRAGMENTATION_THRESHOLD:.0%}",
                   "{{ $value | humanizePercentage }} of the idle GPU capacity cannot be "
                   "used by the typical pods; MIG layouts or placements need rebalancing."),
        ],
    },
    {
        "name": "gpupack.extender",
        "rules": [
            _alert("GpupackExtenderErrors",
                   'sum(rate(gpupack_extender_requests_total{outcome!="ok"}[5m])) '
                   "/ sum(rate(gpupack_extender_requests_total[5m]))",
                   ">", str(EXTENDER_ERROR_RATIO), "10m", "warning",
                   "gpupack extender answers errors",
                   "{{ $value | humanizePercentage }} of extender requests failed in the "
                   "last 5 minutes; kube-scheduler requeues those pods."),
            _alert("GpupackExtenderSlow",
                   "histogram_quantile(0.99, sum by (le) "
                   '(rate(gpupack_extender_request_seconds_bucket{verb=~"filter|prioritize|bind|preempt"}[5m])))',
                   ">", f"{EXTENDER_P99_SECONDS:g}", "10m", "warning",
                   "gpupack extender p99 latency high",
                   "p99 of the extender verbs is {{ $value | humanizeDuration }}; the "
                   "scheduler's httpTimeout is 3s, a filter timeout fails the attempt."),
            _alert("GpupackExtenderDown",
                   f'max(up{{job="{EXTENDER_JOB}",namespace="{EXTENDER_NAMESPACE}"}}) or vector(0)',
                   "<", "1", "5m", "critical",
                   "no gpupack extender is scraped up",
                   "Pods of the gpupack scheduler cannot be filtered or bound."),
            _alert("GpupackWebhookErrors",
                   '(sum(rate(gpupack_webhook_reviews_total{outcome=~"error|malformed"}[5m])) '
                   "or vector(0)) / sum(rate(gpupack_webhook_reviews_total[5m]))",
                   ">", str(EXTENDER_ERROR_RATIO), "10m", "warning",
                   "gpupack webhook fails reviews",
                   "{{ $value | humanizePercentage }} of AdmissionReviews failed in the last "
                   "5 minutes; with failurePolicy Ignore those pods were admitted unsized."),
            _alert("GpupackRecordWritesFailing",
                   "sum by (what) (increase(gpupack_record_writes_total"
                   '{outcome=~"retried_later|given_up"}[15m]))',
                   ">", "0", "10m", "warning",
                   "gpupack cannot write its {{ $labels.what }}s",
                   "{{ $value }} write(s) of gpupack's {{ $labels.what }}s failed in the "
                   "last 15 minutes and keep failing; the leader tries each again, the "
                   "delay doubling to a minute. Until they pass, a failover loses them "
                   "(group reservations, the compaction budget) or parked pods wait for "
                   "kube-scheduler's next event (pod conditions)."),
            _alert("GpupackNodeAgentStale",
                   "time() - max by (node) (gpupack_agent_last_success_timestamp_seconds)",
                   ">", "300", "5m", "warning",
                   "gpupack node agent on {{ $labels.node }} has not read NVML for 5 minutes",
                   "The per-pod GPU memory and MIG inventory of {{ $labels.node }} are stale."),
            _alert("GpupackNodeInventoriesStale",
                   "max(gpupack_node_inventories_stale)",
                   ">", "0", "10m", "warning",
                   "gpupack ignores the node agent inventory of {{ $value }} node(s)",
                   "Their inventories were not rewritten for --inventory-max-age: their GPUs are "
                   "inferred from allocatable and labels, pods' GPU memory peaks are not "
                   "used, and the MIG actuator leaves their GPUs that hold pods alone. "
                   "GpupackNodeAgentStale names the nodes."),
        ],
    },
]


def all_queries() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, expr) of every dashboard query."""
    return [(d.uid, p.title, q.expr) for d in DASHBOARDS.values() for p in d.panels
            for q in p.queries]
