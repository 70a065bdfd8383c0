"""Alert rules and dashboards against the real Prometheus tools: ``promtool check rules``,
``promtool test rules`` (each alert fires on a synthetic series), and a real Prometheus
server scraping the real extender, webhook and (fake-NVML) node agent, in which every
dashboard query and every alert's signal must return data."""

from __future__ import annotations

import copy
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from manifests_helpers import Obj, find, find_all, tool
from stack import AGENT_JOB, EXTENDER_JOB, WEBHOOK_JOB, Stack, start, substitute

SIGNAL_WAIT_S = 45.0


def rule_groups(objs: list[Obj], name: str = "gpupack") -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = find(objs, "PrometheusRule", name)["spec"]["groups"]
    return groups


def dashboard_queries(objs: list[Obj]) -> list[tuple[str, str, str]]:
    out = []
    for cm in find_all(objs, "ConfigMap"):
        if cm["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
            continue
        for text in cm["data"].values():
            dash = json.loads(text)
            for panel in dash["panels"]:
                for t in panel["targets"]:
                    out.append((dash["uid"], panel["title"], t["expr"]))
    return out


def signal_of(rule: dict[str, Any]) -> str:
    """``(<signal>) <op> <threshold>`` -> ``<signal>`` (monitoring.py writes them so)."""
    expr: str = rule["expr"]
    assert expr.startswith("(")
    depth = 0
    for i, ch in enumerate(expr):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return expr[1:i]
    raise AssertionError(f"unbalanced: {expr}")


@pytest.mark.parametrize("which", ["base", "helm_default"])
def test_promtool_check_rules(which: str, request: pytest.FixtureRequest,
                              tmp_path: Path) -> None:
    objs: list[Obj] = request.getfixturevalue(which)
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups(objs)}))
    out = subprocess.run([tool("promtool"), "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    n = sum(len(g["rules"]) for g in rule_groups(objs))
    assert f"SUCCESS: {n} rules found" in out.stdout


# Synthetic series under which each alert must fire (promtool test rules).
UNIT_CASES: list[tuple[str, list[dict[str, str]], str, dict[str, str]]] = [
    ("GpupackPodGpuMemoryExhaustion",
     [{"series": 'gpupack_pod_gpu_memory_exhaustion_seconds{node="n1",namespace="speech",'
                 'pod="tts-b",gpu="1"}', "values": "1800x20"}],
     "10m", {"node": "n1", "namespace": "speech", "pod": "tts-b", "gpu": "1"}),
    ("GpupackSharedGpuMemoryForecastFull",
     [{"series": 'gpupack_gpu_memory_used_bytes{node="n1",gpu="1",model="L40S",mode="shared"}',
       "values": "20000000000+500000000x40"},
      {"series": 'gpupack_gpu_memory_total_bytes{node="n1",gpu="1",model="L40S",'
                 'mode="shared"}', "values": "48000000000x40"}],
     "35m", {"node": "n1", "gpu": "1", "model": "L40S", "mode": "shared"}),
    ("GpupackLLMPodsWaiting",
     [{"series": 'gpupack_pending_pods{class="llm",reason="insufficient_gpu"}',
       "values": "2x30"}], "15m", {}),
    ("GpupackFragmentationHigh",
     [{"series": "gpupack_fragmentation_ratio", "values": "0.7x60"}], "45m", {}),
    ("GpupackDraPredictionsDisagree",
     [{"series": 'gpupack_dra_predictions_checked_total{outcome="disagree"}',
       "values": "0x10 1x20"}], "15m", {}),
    ("GpupackMigReconfigurationFailed",
     [{"series": 'gpupack_mig_reconfigurations_total{result="failed"}',
       "values": "0x10 1x20"}], "15m", {}),
    ("GpupackMigDrainsStopped",
     [{"series": 'gpupack_mig_drains_total{result="refused"}',
       "values": "0+1x30"}], "20m", {}),
    ("GpupackDefragEvictionsRefused",
     [{"series": 'gpupack_defrag_evictions_total{outcome="pdb"}',
       "values": "0+1x30"}], "20m", {}),
    ("GpupackExtenderErrors",
     [{"series": 'gpupack_extender_requests_total{verb="filter",outcome="error"}',
       "values": "0+10x30"},
      {"series": 'gpupack_extender_requests_total{verb="filter",outcome="ok"}',
       "values": "0+10x30"}], "20m", {}),
    ("GpupackExtenderSlow",
     [{"series": f'gpupack_extender_request_seconds_bucket{{verb="filter",le="{le}"}}',
       "values": vals} for le, vals in (("0.5", "0x30"), ("1.0", "0x30"),
                                         ("5.0", "0+10x30"), ("+Inf", "0+10x30"))],
     "20m", {}),
    ("GpupackExtenderDown",
     [{"series": f'up{{job="{EXTENDER_JOB}",namespace="gpupack",instance="a"}}',
       "values": "0x20"}], "10m", {}),
    ("GpupackWebhookErrors",
     [{"series": 'gpupack_webhook_reviews_total{outcome="error",class="asr"}',
       "values": "0+5x30"},
      {"series": 'gpupack_webhook_reviews_total{outcome="patched",class="asr"}',
       "values": "0+5x30"}], "20m", {}),
    ("GpupackRecordWritesFailing",
     [{"series": 'gpupack_record_writes_total{what="group record",outcome="retried_later"}',
       "values": "0+1x40"}], "25m", {"what": "group record"}),
    ("GpupackNodeAgentStale",
     [{"series": 'gpupack_agent_last_success_timestamp_seconds{node="n1"}',
       "values": "0x20"}], "15m", {"node": "n1"}),
    ("GpupackNodeInventoriesStale",
     [{"series": 'gpupack_node_inventories_stale{instance="a"}', "values": "2x20"}], "15m",
     {}),
]


def test_every_alert_is_unit_tested(base: list[Obj]) -> None:
    alerts = {r["alert"] for g in rule_groups(base) for r in g["rules"]}
    assert alerts == {case[0] for case in UNIT_CASES}


@pytest.mark.parametrize("case", UNIT_CASES, ids=[c[0] for c in UNIT_CASES])
def test_alert_fires_with_promtool(case: tuple[str, list[dict[str, str]], str, dict[str, str]],
                                   base: list[Obj], tmp_path: Path) -> None:
    alert, series, at, labels = case
    groups = copy.deepcopy(rule_groups(base))
    severity = ""
    for g in groups:
        for r in g["rules"]:
            # Annotation templates are checked by `promtool check rules`; the unit test
            # compares labels only.
            r.pop("annotations", None)
            if r["alert"] == alert:
                severity = r["labels"]["severity"]
    promtool_test(groups, series, [
        {"eval_time": at, "alertname": alert,
         "exp_alerts": [{"exp_labels": {**labels, "severity": severity}}]},
        # Not at the start: every alert waits its `for` duration.
        {"eval_time": "0m", "alertname": alert, "exp_alerts": []},
    ], tmp_path)


def promtool_test(groups: list[dict[str, Any]], series: list[dict[str, str]],
                  checks: list[dict[str, Any]], tmp_path: Path) -> None:
    """``promtool test rules``: ``checks`` (alert_rule_test entries) over ``series``."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": checks}],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    out = subprocess.run([tool("promtool"), "test", "rules", "test.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_chart_extender_down_watches_its_own_release(
        render_helm: Callable[[dict[str, Any] | None], list[Obj]], tmp_path: Path) -> None:
    """Under another full name, the chart's GpupackExtenderDown is quiet while that
    release's extender is up, and fires when only another release's is."""
    groups = copy.deepcopy(rule_groups(render_helm({"fullnameOverride": "gp-prod"}), "gp-prod"))
    for g in groups:
        for r in g["rules"]:
            r.pop("annotations", None)
    ours = 'up{job="gp-prod-scheduler-metrics",namespace="gpupack",instance="a"}'
    other = 'up{job="gpupack-scheduler-metrics",namespace="other",instance="b"}'
    down = {"alertname": "GpupackExtenderDown", "eval_time": "10m"}
    promtool_test(groups, [{"series": ours, "values": "1x20"},
                           {"series": other, "values": "0x20"}],
                  [{**down, "exp_alerts": []}], tmp_path)
    promtool_test(groups, [{"series": ours, "values": "0x20"},
                           {"series": other, "values": "1x20"}],
                  [{**down, "exp_alerts": [{"exp_labels": {"severity": "critical"}}]}],
                  tmp_path)


@pytest.fixture(scope="module")
def stack(base: list[Obj], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tool("prometheus")
    tool("openssl")
    s = start(tmp_path_factory.mktemp("stack"), rule_groups(base))
    try:
        yield s
    finally:
        s.stop()


def wait_for_data(stack: Stack, exprs: list[str],
                  drive: Callable[[], None]) -> dict[str, list[dict[str, Any]]]:
    """Drive traffic and poll until every expression has a result (or time is up)."""
    end = time.monotonic() + SIGNAL_WAIT_S
    results: dict[str, list[dict[str, Any]]] = {}
    while True:
        drive()
        results = {e: stack.query(substitute(e)) for e in exprs}
        if all(results.values()) or time.monotonic() > end:
            return results
        time.sleep(1.0)


def test_targets_up(stack: Stack) -> None:
    end = time.monotonic() + 20
    while True:
        health = {t["labels"]["job"]: t["health"] for t in stack.targets()}
        if set(health.values()) == {"up"} or time.monotonic() > end:
            break
        time.sleep(0.5)
    assert health == {EXTENDER_JOB: "up", AGENT_JOB: "up", WEBHOOK_JOB: "up"}, stack.log_tail()


def test_every_panel_and_alert_signal_returns_data(stack: Stack, base: list[Obj]) -> None:
    panels = dashboard_queries(base)
    rules = [r for g in rule_groups(base) for r in g["rules"]]
    exprs = sorted({e for _, _, e in panels} | {signal_of(r) for r in rules})

    def drive() -> None:
        stack.drive_extender()
        stack.drive_webhook()

    results = wait_for_data(stack, exprs, drive)
    empty = [f"{uid} / {title}: {expr}" for uid, title, expr in panels if not results[expr]]
    empty += [f"alert {r['alert']}: {signal_of(r)}" for r in rules
              if not results[signal_of(r)]]
    assert not empty, "no data:\n" + "\n".join(empty) + "\n" + stack.log_tail()
    for r in rules:  # the whole expression evaluates (it returns data only when firing)
        stack.query(r["expr"])


def test_rules_evaluate_in_prometheus(stack: Stack, base: list[Obj]) -> None:
    expected = {r["alert"] for g in rule_groups(base) for r in g["rules"]}
    end = time.monotonic() + 15
    while True:
        rules = [r for g in stack.rules() for r in g["rules"]]
        ok = {r["name"] for r in rules if r["health"] == "ok" and r.get("lastEvaluation",
              "").startswith("2")}
        if ok >= expected or time.monotonic() > end:
            break
        time.sleep(0.5)
    bad = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert ok >= expected, bad


def test_extender_answers_within_http_timeout(stack: Stack, base: list[Obj]) -> None:
    cm = find(base, "ConfigMap", "gpupack-scheduler-config")
    ext = yaml.safe_load(cm["data"]["scheduler-config.yaml"])["extenders"][0]
    timeout_s = float(ext["httpTimeout"].rstrip("s"))
    worst = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        stack.drive_extender()
        worst = max(worst, time.perf_counter() - t0)
    # Each round is a filter and a prioritize per pending pod; each call must be far
    # below the timeout kube-scheduler gives it.
    assert worst < timeout_s / 3, f"a round of extender calls took {worst:.2f}s"
