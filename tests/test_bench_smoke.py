"""The benchmark scripts still run (tiny sizes; the real runs are not part of CI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def test_group_placement_bench_runs_and_both_methods_place_the_group() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "group_placement.py"), "--nodes", "40",
         "--clique-size", "8", "--members", "2"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.splitlines()
    rows = [line.split() for line in out[1:]]
    assert [(r[0], r[1]) for r in rows] == [
        ("nvidia.com/gpu.clique", "cp-sat"), ("nvidia.com/gpu.clique", "greedy"),
        ("none", "cp-sat"), ("none", "greedy")]
    for r in rows:  # placed: time, domain ("-" without topology), idle left, broken
        assert len(r) == 6 and float(r[2]) >= 0 and int(r[4]) >= 0 and int(r[5]) >= 0, r
    assert all(r[3].startswith("c") for r in rows[:2])  # a clique was chosen


def test_extender_bench_pin_splits_client_from_server_cpus() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_extender", ROOT / "bench" / "extender.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.split_cpus({0, 1}) == ({0}, {1})
    assert mod.split_cpus({2, 5, 7}) == ({2}, {5, 7})
    assert mod.split_cpus({3}) is None


def test_webhook_claims_bench_runs_both_ways() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "webhook_claims.py"), "--nodes", "40",
         "--claims", "0", "20", "--reviews", "5"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.splitlines()
    rows = [line.split() for line in out[2:]]
    assert [r[0] for r in rows] == ["0", "20"]
    for r in rows:  # claims, full median / p99, incremental median / p99
        assert len(r) == 7 and all(float(x) >= 0 for x in (r[1], r[3], r[4], r[6])), r


def test_child_exchange_bench_runs_both_sizes_both_ways() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "child_exchange.py"), "--n", "40",
         "--large", "100000"],
        capture_output=True, text=True, timeout=120, check=True, cwd="/",
    ).stdout.splitlines()
    assert out[0].startswith("direct send limit: ")
    assert [line.split()[0] for line in out[1:]] == ["small", "large"]
    for line in out[1:]:
        assert "shipped" in line and "ratio" in line, line


def _load_mig_bench() -> ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_mig", ROOT / "bench" / "mig.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_mig"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def test_mig_bench_runs_and_its_figures_are_consistent() -> None:
    import json

    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "mig.py"), "--nodes", "2", "--hours", "1",
         "--rate", "60", "--warmup-h", "0.25", "--seed", "3", "--format", "json",
         "--compact-min-age", "0", "--compact-min-excess", "1"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    pols = out["policies"]
    assert list(pols) == ["static", "static-default", "first-fit", "gpupack",
                          "gpupack-compact"]
    arrivals = out["params"]["arrivals"]
    assert arrivals > 20
    for name, r in pols.items():
        for key in ("gpus_used", "lower_bound", "pods_waiting", "wait_p99_s",
                    "reconfigs_per_h"):
            assert isinstance(r[key], (int, float)), (name, key)
        assert r["invalid"] == 0, (name, r.get("invalid_examples"))
        # A moved pod's replacement is placed too (gpupack-compact).
        assert r["arrived"] == arrivals, name
        assert 0 < r["placed"] <= arrivals + r.get("evictions", 0), name
        assert r["validated"] == r["placed"], name  # every placement went through validate
        # Every used GPU holds at most 7 compute and 8 memory slices: never under the bound.
        assert r["gpus_used"] >= r["lower_bound"] > 0, name
        assert r["lower_bound"] <= r["demand_bound"], name
        assert 0 <= r["wait_p50_s"] <= r["wait_p99_s"] <= r["wait_max_s"], name
        assert r["pods_waiting"] >= 0 and 0 <= r["pods_waiting_end"] <= arrivals, name
        assert r["reconfigs_per_h"] >= 0, name
    for name in ("static", "static-default"):
        assert pols[name]["reconfigs_per_h"] == 0  # static layouts never change
    # The same layouts serve the same pods: the placement rule changes only where they go.
    assert pols["static-default"]["demand_bound"] == pols["static"]["demand_bound"]
    for name in ("static", "static-default", "first-fit"):  # a used GPU holds a pod
        assert pols[name]["naive_gpus"] >= pols[name]["gpus_used"], name
    # First-fit creates an instance for every MIG pod and waits for it.
    assert pols["first-fit"]["reconfigs_per_h"] > 0
    assert pols["first-fit"]["wait_max_s"] >= out["params"]["create_delay_s"]
    assert pols["gpupack"]["plan_calls"] > 0
    compact = pols["gpupack-compact"]
    assert compact["evictions"] > 0 and compact["evictions_per_h"] > 0
    assert sum(compact["drains_ended"].values()) > 0
    assert 0 <= compact["move_gap_p50_s"] <= compact["move_gap_p99_s"]
    for name in ("gpupack", "gpupack-compact"):
        assert set(out["goals"][name]) >= {
            "gpupack_vs_bound", "fewer_gpus_than_static", "fewer_gpus_than_static_default",
            "fewer_waiting_than_first_fit", "naive_ratio"}


def test_mig_bench_dra_dynamic_protocol_runs_and_its_figures_are_consistent() -> None:
    import json

    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "mig.py"), "--protocol", "dra-dynamic",
         "--nodes", "4", "--hours", "1.5", "--rate", "60", "--warmup-h", "0.25", "--seed", "3",
         "--format", "json", "--compact-min-age", "0", "--compact-min-excess", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["params"]["protocol"] == "dra-dynamic"
    # Compaction's DynamicMIG settings are reported (the product's defaults here).
    assert {k: out["params"]["compact"][k] for k in (
        "dynamic_min_excess", "dynamic_evictions_per_hour", "kept_mode_max_pods",
        "kept_mode_min_age_s", "keep_room", "steer_margin")} == {
        "dynamic_min_excess": 1, "dynamic_evictions_per_hour": 240, "kept_mode_max_pods": 7,
        "kept_mode_min_age_s": 0.0, "keep_room": True, "steer_margin": 1}
    pols = out["policies"]
    assert list(pols) == ["static-default", "dra-first-fit", "gpupack", "gpupack-compact",
                          "layout-bound"]
    arrivals = out["params"]["arrivals"]
    bound = pols["layout-bound"]
    for name, r in pols.items():
        for key in ("gpus_used", "lower_bound", "pods_waiting", "wait_p99_s",
                    "reconfigs_per_h"):
            assert isinstance(r[key], (int, float)), (name, key)
        assert r["invalid"] == 0, (name, r.get("invalid_examples"))
    for name in ("dra-first-fit", "gpupack", "gpupack-compact"):
        r = pols[name]
        assert r["arrived"] == arrivals and r["validated"] == r["placed"] > 0, name
        # No policy packs below the layout bound of what it runs.
        assert r["gpus_used"] >= r["layout_bound"] >= r["lower_bound"] > 0, name
        # DynamicMIG makes and destroys an instance per MIG pod, and the pod waits for it.
        assert r["reconfigs_per_h"] > 0 and r["wait_max_s"] >= out["params"]["create_delay_s"]
    # The bound's own row: every pod from its arrival, no wait, the least reconfiguring.
    assert bound["pods_waiting"] == 0 and bound["gpus_used"] == bound["layout_bound"]
    assert bound["reconfigs_per_h"] <= pols["dra-first-fit"]["reconfigs_per_h"]
    compact = pols["gpupack-compact"]
    assert compact["evictions"] > 0 and sum(compact["drains_ended"].values()) > 0
    # Drains and steering put DeviceTaintRules up and take them down: the churn is counted.
    assert compact["taint_rules_peak"] > 0 and compact["taint_rule_writes_per_h"] > 0
    for name in ("gpupack", "gpupack-compact"):
        assert set(out["goals"][name]) == {
            "vs_layout_bound", "within_1_05_of_layout_bound", "fewer_gpus_than_dra_first_fit",
            "at_least_20pct_fewer_than_dra_first_fit", "waiting_no_more_than_dra_first_fit",
            "reconfigs_per_h"}


def test_mig_bench_check_catches_an_overlapping_instance() -> None:
    mod = _load_mig_bench()
    from packing.model import GpuMode, Placement, PodRequest, RequestKind

    nodes = mod.make_nodes(1, 1)
    args = mod.Args(hours=1, warmup_h=0, reconfig_delay=60, create_delay=5, tick=2,
                    scorer_refresh=300, params=mod.DEFAULT_PARAMS)
    sim = mod.FirstFit(nodes, [], args)
    name = nodes[0].name
    g = sim.state.gpu(name, 0)
    from packing.mig.layout import MigSlot

    # A 3g at start 0 and a 2g at start 2 overlap on memory slices 2-3.
    sim.set_layout(name, g, GpuMode.MIG, [MigSlot("3g.40gb", 0), MigSlot("2g.20gb", 2)])
    assert any("overlaps" in e for e in sim.invalid)
    sim.invalid.clear()
    sim.set_layout(name, g, GpuMode.MIG, [MigSlot("3g.40gb", 4)])
    assert sim.invalid == []
    req = PodRequest("speech/x", kind=RequestKind.MIG, mig_profile="2g.20gb",
                     gpu_models=frozenset({"H100-80GB"}))
    pod = mod.Pod(req, "H100-80GB", "tts", 0.0, 60.0)
    sim.by_key[req.key] = pod
    sim.check_placement(pod, Placement(req.key, name, (0,), "2g.20gb", 2))  # no such slice
    assert sim.invalid


def test_device_plugin_bench_runs_and_the_plugin_booker_never_overfills() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "device_plugin.py"), "--runs", "20",
         "--arrivals", "30"], capture_output=True, text=True, timeout=120, check=True,
    ).stdout.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in out[2:]}
    assert set(rows) == {"memory-first", "plugin"}
    assert rows["plugin"][2] == "0"  # no GPU ever held more than its memory
    assert int(rows["memory-first"][2]) > 0  # the old booking did overfill


def test_mig_bench_static_default_spreads_like_kube_scheduler() -> None:
    """static-default: the node with the least CPU and memory asked (LeastAllocated), any
    free device of the pod's profile there; no device of the profile anywhere: it waits."""
    mod = _load_mig_bench()
    from packing.model import Placement, PodRequest, RequestKind

    nodes = mod.make_nodes(3, 2)[::2]  # two H100 nodes (models alternate), two GPUs each
    args = mod.Args(hours=1, warmup_h=0, reconfig_delay=60, create_delay=5, tick=2,
                    scorer_refresh=300, params=mod.DEFAULT_PARAMS)
    sim = mod.StaticDefault(nodes, [], args, {"H100-80GB": 0})  # all-balanced everywhere
    sim.setup()
    a, b = (n.name for n in nodes)

    def pod(i: int, profile: str) -> Any:
        req = PodRequest(f"speech/p{i}", kind=RequestKind.MIG, mig_profile=profile,
                         gpu_models=frozenset({"H100-80GB"}))
        p = mod.Pod(req, "H100-80GB", "asr", 0.0, 600.0)
        sim.by_key[req.key] = p
        sim.pending[req.key] = p
        return p

    big = pod(0, "3g.40gb")
    sim.bind(big, Placement(big.req.key, a, (0,), "3g.40gb", 4), 0.0)
    # Node a asks 3 compute slices' worth: 1g pods go to b while b asks less (0, 1, 2).
    for i in range(1, 4):
        p = pod(i, "1g.10gb")
        where = sim.place(p)
        assert where is not None and (where.node, where.mig_profile) == (b, "1g.10gb")
        sim.bind(p, where, 0.0)
    # Eight 1g instances in all (two per all-balanced GPU): every one is used, then a pod
    # waits.
    i = 4
    while (where := sim.place(p := pod(i, "1g.10gb"))) is not None:
        sim.bind(p, where, 0.0)
        i += 1
    assert i == 9 and sum(1 for k in sim.running if k != big.req.key) == 8
    assert sim.invalid == []


def test_cli_start_bench_runs() -> None:
    import json

    out = subprocess.run([sys.executable, str(ROOT / "bench" / "cli_start.py"), "--runs", "1",
                          "--format", "json"], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    figures = json.loads(out)
    assert set(figures) == {"python -c pass", "gpupack --version", "gpupack --help"}
    assert all(f["median_s"] > 0 for f in figures.values())


def test_day_bench_runs_one_seed() -> None:
    import json

    out = subprocess.run([sys.executable, str(ROOT / "bench" / "day.py"), "--seeds", "1",
                          "--format", "json"], capture_output=True, text=True, timeout=600,
                         check=True).stdout
    (row,) = json.loads(out)
    assert row["seed"] == 1
    for name in ("kube-scheduler", "gpupack"):
        assert row[name]["gpus_needed"] > 0 and row[name]["nodes_needed"] > 0
    assert row["gpupack"]["overcommitted"] == 0
    assert row["gpupack_over_kube_gpus"] == round(
        row["gpupack"]["gpus_needed"] / row["kube-scheduler"]["gpus_needed"], 3)


def test_dra_bench_sizes_and_its_json_keys_are_the_issues() -> None:
    # bench/dra.py needs the real control plane (minutes); its pool, its workload and
    # the keys of its JSON (issue 33's interface) are checked here without it.
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_dra", ROOT / "bench" / "dra.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    nodes = mod.pool_for(60)
    assert len(nodes) == 60
    assert sum(1 for n in nodes if "dyn" in n.name) == 15
    assert sum(1 for n in nodes if "l40s" in n.name) == 6
    w = mod.workload_for(120, "gpupack")
    names = [p["metadata"]["name"] for p in w.pods]
    assert len(names) == 120
    assert {k: sum(1 for n in names if n.startswith(k + "-")) for k in
            ("asr", "tts", "embed", "rerank", "llm")} == {
        "asr": 48, "tts": 18, "embed": 18, "rerank": 12, "llm": 24}
    # --groups 3: issue 33's mixed workload, three 2 x 8 groups among the same small pods.
    three = [p["metadata"]["name"] for p in mod.workload_for(120, "gpupack", 3).pods]
    assert len(three) == 96 + 6 and sum(1 for n in three if n.startswith("llm-")) == 6
    assert set(mod.W.Outcome().as_json(1.0)) == {
        "pods_bound", "groups_complete", "gpus_touched", "whole_nodes_free", "pods_per_s"}
    # The extender it starts runs with the product's defaults for groups.
    import argparse

    from gpupack.serve_args import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = parser.parse_args([])
    given = parser.parse_args(list(mod.EXTENDER_ARGS))
    assert (given.group_ttl, given.max_namespace_reserved_gpus) == (
        defaults.group_ttl, defaults.max_namespace_reserved_gpus)


def test_mig_dra_bench_check_catches_a_device_allocated_twice() -> None:
    import importlib.util

    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_mig_dra",
                                                  ROOT / "bench" / "mig_dra.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_mig_dra"] = mod
    spec.loader.exec_module(mod)
    from packing.dra.objects import AllocatedDevice

    base = mod.base
    nodes = base.make_nodes(1, 2)
    args = base.Args(hours=1, warmup_h=0, reconfig_delay=60, create_delay=5, tick=2,
                     scorer_refresh=300, params=base.DEFAULT_PARAMS)
    pods = [p for p in base.make_stream(nodes, 1, 200, 0, 1, 1) if p.profile == "1g.10gb"][:2]
    sim = mod.DraFirstFit(nodes, pods, args, mod.DraArgs())
    sim.setup()
    name = nodes[0].name
    dev = (AllocatedDevice("r", "gpu.nvidia.com", name, "gpu-0-mig-1g10gb-19-0"),)
    for p in pods:
        sim.pending[p.req.key] = p
        sim.allocate(p, name, dev)
    assert sim.invalid and "allocated already" in sim.invalid[0]
