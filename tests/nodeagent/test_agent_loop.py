"""The agent loop with a fake clock: inventory content, when it patches, metrics."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from fake_nvml import (
    GIB,
    H100_UUID,
    L40S_UUID,
    MIG_1G_A,
    MIG_3G,
    FakeNvml,
    FakeProcess,
    mixed_node,
    no_driver,
)
from prometheus_client import generate_latest

import kube.nodes
import nodeagent.nvml
from gpupack import agent_cmd
from nodeagent.agent import Agent, AgentConfig, PodNameCache
from nodeagent.cgroups import CgroupOwner
from nodeagent.nvml import NvmlAdapter
from nodeagent.podresources import DeviceAssignment, PodResourcesView, parse_device_id
from packing.inventory import INVENTORY_ANNOTATION, decode_inventory
from packing.model import GpuMode, MigInstance


class FakeClock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class FakePodResources:
    view: PodResourcesView

    def read(self) -> PodResourcesView:
        return self.view


@dataclass
class RecordingPatch:
    calls: list[dict[str, str | None]] = field(default_factory=list)
    fail: bool = False

    def __call__(self, annotations: Mapping[str, str | None]) -> None:
        if self.fail:
            raise RuntimeError("API server unavailable")
        self.calls.append(dict(annotations))


def assign(ns: str, pod: str, resource: str, device: str) -> DeviceAssignment:
    return DeviceAssignment(ns, pod, "main", resource, parse_device_id(device))


VIEW = PodResourcesView(
    assignments=(
        assign("llm", "vllm-0", "nvidia.com/mig-3g.40gb", MIG_3G),
        assign("asr", "whisper-1", "nvidia.com/mig-1g.10gb", MIG_1G_A),
        assign("tts", "tts-a", "nvidia.com/gpu.shared", f"{L40S_UUID}::0"),
        assign("tts", "tts-b", "nvidia.com/gpu.shared", f"{L40S_UUID}::1"),
        assign("tts", "tts-c", "nvidia.com/gpu.shared", f"{L40S_UUID}::2"),
    ),
    shared_uuids=frozenset({L40S_UUID}),
    allocatable_known=True,
)
CGROUPS = {5101: CgroupOwner("uid-a", "c1"), 5102: CgroupOwner("uid-b", "c2"),
           5103: CgroupOwner("uid-c", "c3")}
NAMES = {"uid-a": "tts/tts-a", "uid-b": "tts/tts-b", "uid-c": "tts/tts-c"}


def make_agent(fake: FakeNvml | None = None, patch: RecordingPatch | None = None,
               clock: FakeClock | None = None, config: AgentConfig | None = None,
               ) -> tuple[Agent, FakeNvml, RecordingPatch, FakeClock]:
    fake = fake or mixed_node()
    patch = patch or RecordingPatch()
    clock = clock or FakeClock()
    agent = Agent(config or AgentConfig(node="gpu-node-1", min_patch_interval_s=30,
                                        mem_tolerance_mib=512),
                  gpus=NvmlAdapter(fake), podresources=FakePodResources(VIEW),
                  pod_of_pid=CGROUPS.get, clock=clock, patch=patch,
                  pod_names=lambda: NAMES)
    return agent, fake, patch, clock


def test_inventory_content() -> None:
    agent, _, patch, _ = make_agent()
    result = agent.tick()
    assert result.patched and len(patch.calls) == 1
    inv = decode_inventory(patch.calls[0][INVENTORY_ANNOTATION] or "")
    assert inv == result.report.inventory
    assert inv.node == "gpu-node-1" and inv.ts == 1_700_000_000
    h100, l40s = inv.gpus  # the lost GPU is left out ...
    assert any(e == "gpu 2: nvmlDeviceGetUUID: GpuIsLost" for e in inv.errors)  # ... and said
    assert (h100.uuid, h100.model, h100.mode) == (H100_UUID, "NVIDIA-H100-80GB-HBM3",
                                                  GpuMode.MIG)
    assert h100.mig == (MigInstance("2g.20gb", 0, None), MigInstance("1g.10gb", 2, "asr/whisper-1"),
                        MigInstance("1g.10gb", 3, None), MigInstance("3g.40gb", 4, "llm/vllm-0"))
    # No cgroup for 4101/4202: each MIG device has one holder, so the memory is theirs.
    assert [(p.pod, p.used_mib) for p in h100.pods] == [("asr/whisper-1", 6144),
                                                         ("llm/vllm-0", 30720)]
    assert (l40s.mode, l40s.memory_mib, l40s.used_mib) == (GpuMode.SHARED, 46068, 25 * 1024)
    assert [(p.pod, p.used_mib, p.peak_mib) for p in l40s.pods] == [
        ("tts/tts-a", 8192, 8192), ("tts/tts-b", 12288, 12288), ("tts/tts-c", 4096, 4096)]


def test_patch_only_when_changed_and_rate_limited() -> None:
    agent, fake, patch, clock = make_agent()
    assert agent.tick().patched
    clock.t += 15
    r = agent.tick()
    assert (r.patched, r.reason) == (False, "unchanged")
    fake.gpus[1].processes[1] = FakeProcess(5102, 14 * GIB)  # tts-b grows by 2 GiB
    clock.t += 10  # 25 s after the last patch
    r = agent.tick()
    assert (r.patched, r.reason) == (False, "rate-limited")
    clock.t += 5  # 30 s
    assert agent.tick().patched
    inv = decode_inventory(patch.calls[-1][INVENTORY_ANNOTATION] or "")
    assert [p.peak_mib for p in inv.gpus[1].pods] == [8192, 14336, 4096]
    # Jitter below the tolerance does not write.
    fake.gpus[1].processes[0] = FakeProcess(5101, 8 * GIB + 100 * 1024 * 1024)
    clock.t += 60
    assert not agent.tick().patched
    assert len(patch.calls) == 2


def test_an_unchanged_inventory_is_written_again_after_the_refresh() -> None:
    # Its new ts is how the extender tells a quiet node from a stopped agent.
    agent, _, patch, clock = make_agent()
    assert agent.tick().patched
    clock.t += 299
    assert (agent.tick().reason, len(patch.calls)) == ("unchanged", 1)
    clock.t += 1
    r = agent.tick()
    assert (r.patched, r.reason) == (True, "refresh")
    first, again = (decode_inventory(c[INVENTORY_ANNOTATION] or "") for c in patch.calls)
    assert again.ts == first.ts + 300 and again.gpus == first.gpus
    clock.t += 299  # counted from the refresh, not from the first write
    assert not agent.tick().patched
    clock.t += 1
    assert agent.tick().reason == "refresh"


def test_refresh_zero_writes_only_on_change() -> None:
    agent, _, patch, clock = make_agent(config=AgentConfig(node="gpu-node-1", refresh_s=0))
    assert agent.tick().patched
    clock.t += 86_400
    assert agent.tick().reason == "unchanged" and len(patch.calls) == 1


def test_a_refresh_shorter_than_the_rate_limit_waits_for_it() -> None:
    agent, _, _, clock = make_agent(config=AgentConfig(node="gpu-node-1", refresh_s=10,
                                                           min_patch_interval_s=30))
    assert agent.tick().patched
    clock.t += 20
    assert agent.tick().reason == "rate-limited"  # due for a refresh, but 20 s < 30 s
    clock.t += 10
    assert agent.tick().reason == "refresh"


def test_failed_patch_is_retried_after_the_interval() -> None:
    agent, _, patch, clock = make_agent(patch=RecordingPatch(fail=True))
    r = agent.tick()
    assert not r.patched and r.reason.startswith("patch failed")
    patch.fail = False
    clock.t += 10
    assert agent.tick().reason == "rate-limited"
    clock.t += 25
    assert agent.tick().patched
    text = generate_latest(agent.metrics.registry).decode()
    assert 'gpupack_agent_node_patches_total{result="error"} 1.0' in text
    assert 'gpupack_agent_node_patches_total{result="ok"} 1.0' in text


def test_metrics() -> None:
    agent, fake, _, clock = make_agent()
    agent.tick()
    value = agent.metrics.registry.get_sample_value
    tts_b = {"namespace": "tts", "pod": "tts-b", "gpu": "1"}
    assert value("gpupack_pod_gpu_memory_bytes", tts_b) == 12 * GIB
    assert value("gpupack_pod_gpu_memory_peak_bytes", tts_b) == 12 * GIB
    assert value("gpupack_pod_gpu_memory_growth_bytes_per_second", tts_b) == 0.0
    assert value("gpupack_pod_gpu_memory_bytes",
                 {"namespace": "llm", "pod": "vllm-0", "gpu": "0"}) == 30 * GIB
    assert value("gpupack_gpu_memory_total_bytes",
                 {"gpu": "1", "model": "NVIDIA-L40S", "mode": "shared"}) == 46068 * 1024 * 1024
    assert value("gpupack_gpu_memory_used_bytes",
                 {"gpu": "0", "model": "NVIDIA-H100-80GB-HBM3", "mode": "mig"}) == 38 * GIB
    assert value("gpupack_agent_nvml_errors_total", {"call": "nvmlDeviceGetUUID"}) == 1.0
    assert value("gpupack_agent_last_success_timestamp_seconds") == clock.t
    text = generate_latest(agent.metrics.registry).decode()
    assert "gpupack_pod_gpu_memory_exhaustion_seconds{" not in text  # nothing grows yet
    # tts-c exits: its series disappears instead of freezing.
    del fake.gpus[1].processes[2]
    agent.podresources = FakePodResources(PodResourcesView(
        assignments=VIEW.assignments[:4], shared_uuids=VIEW.shared_uuids))
    clock.t += 15
    agent.tick()
    text = generate_latest(agent.metrics.registry).decode()
    assert 'pod="tts-c"' not in text
    assert value("gpupack_agent_nvml_errors_total", {"call": "nvmlDeviceGetUUID"}) == 2.0


def test_growing_pod_gets_exhaustion_metric() -> None:
    agent, fake, _, clock = make_agent()
    for k in range(30):
        fake.gpus[1].processes[2] = FakeProcess(5103, 4 * GIB + k * 40 * 1024 * 1024)
        agent.tick()
        clock.t += 15
    report = agent.observe()
    growth = report.growth[("tts/tts-c", L40S_UUID)]
    assert growth.rate_bytes_per_s == pytest.approx(40 * 1024 * 1024 / 15, rel=0.05)
    assert growth.exhaustion_s is not None and growth.exhaustion_s > 0
    value = agent.metrics.registry.get_sample_value
    exhaustion = value("gpupack_pod_gpu_memory_exhaustion_seconds",
                       {"namespace": "tts", "pod": "tts-c", "gpu": "1"})
    assert exhaustion == pytest.approx(growth.exhaustion_s)
    # Flat neighbours: zero growth and no exhaustion series.
    tts_a = {"namespace": "tts", "pod": "tts-a", "gpu": "1"}
    assert value("gpupack_pod_gpu_memory_growth_bytes_per_second", tts_a) == 0.0
    assert value("gpupack_pod_gpu_memory_exhaustion_seconds", tts_a) is None


def test_no_driver_keeps_running_with_empty_inventory() -> None:
    agent, fake, _, clock = make_agent(fake=no_driver())
    r = agent.tick()
    assert r.patched and r.report.inventory.gpus == ()
    assert r.report.inventory.errors[0].startswith("nvml: nvmlInit: DriverNotLoaded")
    value = agent.metrics.registry.get_sample_value
    assert value("gpupack_agent_last_success_timestamp_seconds") == 0.0
    assert value("gpupack_agent_nvml_errors_total", {"call": "nvmlInit"}) == 1.0
    fake.init_error = None
    fake.gpus = mixed_node().gpus
    clock.t += 60
    assert len(agent.tick().report.inventory.gpus) == 2


def test_pod_name_cache_refreshes_only_for_unknown_uids() -> None:
    clock = FakeClock()
    fetches: list[float] = []

    def fetch() -> Mapping[str, str]:
        fetches.append(clock.t)
        return {"u1": "ns/a"}

    cache = PodNameCache(fetch, clock, refresh_s=30)
    assert not cache.refresh_if_missing(set())
    assert cache.refresh_if_missing({"u1"}) and cache.names == {"u1": "ns/a"}
    clock.t += 10
    assert not cache.refresh_if_missing({"u2"})  # too soon
    clock.t += 25
    assert cache.refresh_if_missing({"u2"})
    assert len(fetches) == 2


def test_unknown_uid_triggers_one_name_fetch_per_window() -> None:
    fetched: list[int] = []

    def names() -> Mapping[str, str]:
        fetched.append(1)
        return NAMES

    agent, _, _, clock = make_agent()
    agent.names = PodNameCache(names, clock, 30)
    agent.tick()
    clock.t += 15
    agent.tick()
    assert len(fetched) == 1  # names known after the first fetch


def test_patch_node_annotations_sends_a_merge_patch() -> None:
    calls: list[tuple[str, object, dict[str, object]]] = []

    class Api:
        def patch_node(self, name: str, body: object, **kw: object) -> None:
            calls.append((name, body, kw))

    kube.nodes.patch_node_annotations(Api(), "n1", {INVENTORY_ANNOTATION: "{}", "old": None})
    assert calls == [("n1", {"metadata": {"annotations": {INVENTORY_ANNOTATION: "{}",
                                                          "old": None}}},
                      {"_content_type": "application/merge-patch+json",
                       "_request_timeout": kube.nodes.PATCH_TIMEOUT_S})]


def test_cli_once_prints_inventory(monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    def no_api(kubeconfig: str | None = None) -> object:
        raise RuntimeError("no cluster here")

    monkeypatch.setattr(kube.nodes, "load_core_api", no_api)
    monkeypatch.setattr(nodeagent.nvml, "load_default", lambda: NvmlAdapter(mixed_node()))
    parser = argparse.ArgumentParser()
    agent_cmd.add_arguments(parser)
    args = parser.parse_args(["--once", "--no-patch", "--node-name", "n1",
                              "--podresources-socket", "/nonexistent/kubelet.sock"])
    assert agent_cmd.run(args) == 0
    wire = json.loads(capsys.readouterr().out)
    assert wire["node"] == "n1" and [g["uuid"] for g in wire["gpus"]] == [H100_UUID, L40S_UUID]
    assert any(e.startswith("PodResources List:") for e in wire["err"])


def test_cli_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-env")
    parser = argparse.ArgumentParser()
    agent_cmd.add_arguments(parser)
    args = parser.parse_args([])
    assert args.node_name == "from-env"
    assert args.podresources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert (args.proc_root, args.once, args.no_patch) == ("/proc", False, False)


def test_cli_metrics_port_in_use_exits_2_with_the_reason(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    monkeypatch.setattr(nodeagent.nvml, "load_default", lambda: NvmlAdapter(mixed_node()))
    parser = argparse.ArgumentParser()
    agent_cmd.add_arguments(parser)
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = parser.parse_args(["--no-patch", "--node-name", "n1", "--metrics-port", str(port),
                                  "--podresources-socket", "/nonexistent/kubelet.sock"])
        assert agent_cmd.run(args) == 2
    assert f"--metrics-port {port}: cannot listen" in capsys.readouterr().err


def test_pacing_and_the_rate_limit_use_the_monotonic_clock() -> None:
    # The wall clock steps back an hour (NTP): patches are not rate-limited for an hour.
    agent, fake, patch, wall = make_agent()
    mono = FakeClock(500.0)
    agent.monotonic = mono
    assert agent.tick().patched
    wall.t -= 3600
    mono.t += 31
    fake.gpus[1].processes[1] = FakeProcess(5102, 16 * GIB)
    assert agent.tick().patched
    assert len(patch.calls) == 2


def test_a_spike_is_kept_for_the_window_even_when_the_series_is_full() -> None:
    from nodeagent.report import PoolUsage, UsageHistory

    history = UsageHistory(max_samples=4)  # interval 1 s: the window holds 900 samples
    def at(t: float, used: int) -> int:
        u = PoolUsage("ns/p", 0, "GPU-x", "GPU-x", used, 48 * GIB, used)
        return history.update(t, [u])[("ns/p", "GPU-x")].peak_bytes
    at(0, 10 * GIB)
    peaks = [at(t, 1 * GIB) for t in range(1, 10)]
    assert peaks[-1] == 10 * GIB  # the spike fell out of the series, not out of the peak


def test_one_missed_tick_keeps_a_pods_peak_and_a_long_absence_drops_it() -> None:
    from nodeagent.report import PoolUsage, UsageHistory

    history = UsageHistory(grace_ticks=2)
    def tick(t: float, used: int | None) -> int | None:
        us = [] if used is None else [PoolUsage("ns/p", 0, "G", "G", used, 48 * GIB, used)]
        g = history.update(t, us).get(("ns/p", "G"))
        return None if g is None else g.peak_bytes
    tick(0, 20 * GIB)
    tick(1000, 2 * GIB)  # the 20 GiB sample leaves the 900 s window: folded into the peak
    assert tick(1001, None) is None  # one failed read
    assert tick(1002, 2 * GIB) == 20 * GIB
    for t in (1003, 1004, 1005):
        tick(t, None)
    assert tick(1006, 2 * GIB) == 2 * GIB  # gone for longer than the grace: afresh


def test_pod_names_map_a_static_pods_config_hash_too() -> None:
    from types import SimpleNamespace as NS

    def meta(ns: str, name: str, uid: str, ann: dict[str, str] | None) -> NS:
        return NS(metadata=NS(namespace=ns, name=name, uid=uid, annotations=ann))

    class Api:
        def list_pod_for_all_namespaces(self, **kw: object) -> NS:
            assert kw["field_selector"] == "spec.nodeName=n1"
            return NS(items=[
                meta("kube-system", "etcd-n1", "mirror-uid",
                     {"kubernetes.io/config.mirror": "c0ffee", "other": "x"}),
                meta("tts", "tts-a", "uid-a", None)])

    assert kube.nodes.list_node_pod_keys(Api(), "n1") == {
        "mirror-uid": "kube-system/etcd-n1", "c0ffee": "kube-system/etcd-n1",
        "uid-a": "tts/tts-a"}
