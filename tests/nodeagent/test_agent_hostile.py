"""The agent loop given wrong answers from outside: a PodResources or GPU reader that
raises, an API server that times a patch out (applied or not), pod keys that would make
the inventory undecodable, figures that add up past the GPU, the clock stepping back."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pynvml
import pytest
from fake_nvml import GIB, L40S_UUID, MIG_3G, FakeNvml, FakeProcess, h100_mig, l40s_shared
from test_agent_loop import VIEW, FakeClock, FakePodResources, RecordingPatch, assign

from nodeagent.agent import Agent, AgentConfig
from nodeagent.cgroups import CgroupOwner
from nodeagent.nvml import MIB, NvmlAdapter
from nodeagent.podresources import PodResourcesView, assignments_from_list
from nodeagent.report import PoolUsage, UsageHistory
from packing.inventory import INVENTORY_ANNOTATION, decode_inventory


class Raising:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def read(self) -> PodResourcesView:
        raise self.exc

    def close(self) -> None:
        return None


def _agent(fake: FakeNvml | None = None, view: object = None,
           names: Mapping[str, str] | None = None,
           cgroups: Mapping[int, CgroupOwner] | None = None,
           patch: Callable[[Mapping[str, str | None]], None] | None = None,
           clock: FakeClock | None = None, monotonic: FakeClock | None = None) -> Agent:
    known = names if names is not None else {}
    return Agent(AgentConfig(node="n", min_patch_interval_s=30, mem_tolerance_mib=512),
                 gpus=NvmlAdapter(fake or FakeNvml([l40s_shared()])),
                 podresources=view or FakePodResources(VIEW),  # type: ignore[arg-type]
                 pod_of_pid=(cgroups or {}).get, clock=clock or FakeClock(),
                 patch=patch or RecordingPatch(), pod_names=lambda: known,
                 monotonic=monotonic)


@pytest.mark.parametrize(
    ("agent", "error", "gpus"),
    [
        # A PodResources client bug (gRPC's ValueError on a closed channel) lost the
        # NVML side of the report too: the tick raised.
        (lambda: _agent(view=Raising(ValueError("closed channel"))),
         "PodResources: ValueError", [L40S_UUID]),
        # A reader that raises: an empty inventory that says so, not a lost tick.
        (lambda: Agent(AgentConfig(node="n"), gpus=Raising(RuntimeError("bug")),  # type: ignore[arg-type]
                       podresources=FakePodResources(VIEW), pod_of_pid=lambda p: None,
                       clock=FakeClock(), patch=RecordingPatch()),
         "nvml: reading the GPUs failed: RuntimeError", []),
    ],
)
def test_a_raising_source_is_an_error_in_the_report_not_a_lost_tick(
        agent: Callable[[], Agent], error: str, gpus: list[str]) -> None:
    result = agent().tick()
    assert result.patched
    inv = result.report.inventory
    assert error in inv.errors and [g.uuid for g in inv.gpus] == gpus


def test_a_patch_of_unknown_outcome_is_written_again_even_if_unchanged_since() -> None:
    server: dict[str, str | None] = {}
    fail = [False]

    def patch(annotations: Mapping[str, str | None]) -> None:
        server.update(annotations)  # the API server applied it ...
        if fail[0]:
            raise TimeoutError("read timed out")  # ... but the answer never came

    fake = FakeNvml([l40s_shared()])
    clock = FakeClock()
    agent = _agent(fake=fake, patch=patch, clock=clock)
    assert agent.tick().patched
    fake.gpus[0].used_bytes += 10 * GIB
    clock.t += 60
    fail[0] = True
    assert not agent.tick().patched
    fake.gpus[0].used_bytes -= 10 * GIB  # back to what was written first
    clock.t += 60
    fail[0] = False
    result = agent.tick()
    assert result.patched  # was "unchanged": the Node kept the timed-out inventory
    assert decode_inventory(server[INVENTORY_ANNOTATION] or "") == result.report.inventory


def _slash_view() -> FakePodResources:
    from types import SimpleNamespace as NS

    response = NS(pod_resources=[NS(namespace="tts", name="a/b", containers=[NS(
        name="c", devices=[NS(resource_name="nvidia.com/gpu.shared",
                              device_ids=[f"{L40S_UUID}::0"])])])])
    return FakePodResources(PodResourcesView(assignments=assignments_from_list(response)))


@pytest.mark.parametrize(
    ("names", "view", "pods"),
    [
        # Keys the decoder refuses made the whole annotation undecodable.
        ({"uid-a": "/tts-a"}, None, ["tts/tts-a"]),  # PodResources names it instead
        ({"uid-a": "tts/a/b"}, None, ["tts/tts-a"]),
        ({"uid-a": "tts/tts-a"}, _slash_view(), ["tts/tts-a"]),
        ({}, _slash_view(), []),
    ],
)
def test_a_pod_key_that_would_not_decode_is_never_published(
        names: Mapping[str, str], view: FakePodResources | None, pods: list[str]) -> None:
    one = PodResourcesView(assignments=(assign("tts", "tts-a", "nvidia.com/gpu.shared",
                                               f"{L40S_UUID}::0"),))
    fake = FakeNvml([l40s_shared()])
    fake.gpus[0].processes = [FakeProcess(5101, 8 * GIB)]
    patch = RecordingPatch()
    agent = _agent(fake=fake, view=view or FakePodResources(one), names=names,
                   cgroups={5101: CgroupOwner("uid-a", "c")}, patch=patch)
    assert agent.tick().patched
    inv = decode_inventory(patch.calls[0][INVENTORY_ANNOTATION] or "")
    assert [p.pod for p in inv.gpus[0].pods] == pods


def test_pod_figures_past_the_gpu_are_capped_and_said() -> None:
    fake = FakeNvml([l40s_shared()])  # 46068 MiB
    fake.gpus[0].processes = [FakeProcess(5101, 30 * GIB), FakeProcess(5102, 30 * GIB)]
    cgroups = {5101: CgroupOwner("uid-a", "c"), 5102: CgroupOwner("uid-a", "d")}
    patch = RecordingPatch()
    agent = _agent(fake=fake, names={"uid-a": "tts/tts-a"}, cgroups=cgroups, patch=patch,
                   view=FakePodResources(PodResourcesView()))
    assert agent.tick().patched
    inv = decode_inventory(patch.calls[0][INVENTORY_ANNOTATION] or "")  # raised before
    (pod,) = inv.gpus[0].pods
    assert (pod.used_mib, pod.peak_mib) == (46068, 46068)
    assert ("gpu 0: pod tts/tts-a: GPU memory used or peak above the GPU's 46068 MiB; "
            "capped") in inv.errors
    # The figure itself is in the pod's metric, uncapped.
    assert agent.metrics.registry.get_sample_value(
        "gpupack_pod_gpu_memory_bytes", {"namespace": "tts", "pod": "tts-a", "gpu": "0"}
    ) == 60 * GIB


def test_a_wall_clock_step_back_does_not_hide_a_leak() -> None:
    # tts-c leaks 40 MiB a tick; an hour into it NTP steps the wall clock back an hour.
    fake = FakeNvml([l40s_shared()])
    wall, mono = FakeClock(), FakeClock(500.0)
    agent = _agent(fake=fake, clock=wall, monotonic=mono,
                   names={"uid-c": "tts/tts-c"}, cgroups={5103: CgroupOwner("uid-c", "c")})
    rates = []
    for k in range(60):
        fake.gpus[0].processes[2] = FakeProcess(5103, 4 * GIB + k * 40 * MIB)
        rates.append(agent.observe().growth[("tts/tts-c", L40S_UUID)].rate_bytes_per_s)
        wall.t += 15 - (3600 if k == 30 else 0)
        mono.t += 15
    assert rates[-1] == pytest.approx(40 * MIB / 15, rel=0.05)  # was 0.0 for 75 minutes


@pytest.mark.parametrize(
    "back_s",
    [
        # Stepped back at sample 20: the old samples, "in the future", stayed in the
        # window and made the fit's span negative (no growth for over an hour) ...
        3600,
        300,  # ... or paired with the new ones into slopes of the wrong sign
    ],
)
def test_history_restarts_a_series_when_time_goes_back(back_s: float) -> None:
    times = [15.0 * k - (back_s if k >= 20 else 0) for k in range(40)]
    history = UsageHistory()
    growth = None
    for k, t in enumerate(times):
        used = 4 * GIB + k * 40 * MIB
        growth = history.update(t, [PoolUsage("ns/p", 0, "G", "G", used, 48 * GIB, used)])
    assert growth is not None
    g = growth[("ns/p", "G")]
    assert g.rate_bytes_per_s == pytest.approx(40 * MIB / 15, rel=0.05)
    assert g.peak_bytes == 4 * GIB + 39 * 40 * MIB


def test_a_mig_device_of_unknown_size_has_no_time_to_exhaustion() -> None:
    # Its memory call failed: exhaustion was 0 s ("full now"), an alert for nothing.
    from test_agent_nvml import Overridden

    gpu = h100_mig()
    fake = FakeNvml([gpu])

    def mem(handle: object) -> object:
        if handle is not gpu:  # a MIG device
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return fake.nvmlDeviceGetMemoryInfo(handle)

    view = PodResourcesView(assignments=(assign("llm", "vllm-0", "nvidia.com/mig-3g.40gb",
                                                MIG_3G),))
    clock = FakeClock()
    agent = Agent(AgentConfig(node="n"),
                  gpus=NvmlAdapter(Overridden(fake, nvmlDeviceGetMemoryInfo=mem)),
                  podresources=FakePodResources(view), pod_of_pid=lambda p: None, clock=clock)
    growth = None
    for k in range(40):
        gpu.gis[0].cis[0].processes[0] = FakeProcess(4101, 20 * GIB + k * 40 * MIB)
        growth = agent.observe().growth[("llm/vllm-0", MIG_3G)]
        clock.t += 15
    assert growth is not None and growth.rate_bytes_per_s > 0
    assert growth.exhaustion_s is None


def test_a_flood_of_errors_keeps_the_inventory_writable() -> None:
    # A garbled process list (a struct version mismatch: every entry's memory figure is
    # garbage) gave one error per entry: 8 GPUs x 500 entries made a 345 kB annotation,
    # past the 256 KiB a Node's annotations hold, and every GPU's report was lost.
    from nodeagent.report import MAX_ERROR_CHARS, MAX_ERRORS
    from packing.inventory import encode_inventory

    gpus = []
    for i in range(8):
        g = l40s_shared()
        g.uuid = f"GPU-{i:08d}-0000-0000-0000-000000000000"
        g.processes = [FakeProcess(10_000 + i * 1000 + k, 1 << 60) for k in range(500)]
        gpus.append(g)
    inv = _agent(FakeNvml(gpus)).observe().inventory
    assert len(inv.gpus) == 8
    assert len(inv.errors) == MAX_ERRORS + 1
    left_out, rest = inv.errors[-1].split(" ", 1)
    assert rest.startswith("more error(s) not listed") and int(left_out) >= 8 * 500 - MAX_ERRORS
    assert all(len(e) <= MAX_ERROR_CHARS for e in inv.errors)
    assert len(encode_inventory(inv).encode()) < 64 * 1024
    assert decode_inventory(encode_inventory(inv)) == inv


def test_a_gpu_instance_without_a_compute_instance_is_no_free_slice() -> None:
    # mig-parted stopped midway: the GPU instance exists, its compute instance not.
    # No device plugin device exists for it; it was published as a free slice.
    g = h100_mig()
    gi = g.gis[0]
    gi.cis = []
    inv = _agent(FakeNvml([g])).observe().inventory
    assert any("GpuInstanceWithoutComputeInstance" in e for e in inv.errors), inv.errors
    free = [m for gpu in inv.gpus for m in gpu.mig if m.owner is None]
    assert all(m.start != gi.start for m in free), free


def test_a_device_the_kubelet_names_and_nvml_does_not_list_is_reported() -> None:
    # A GPU lost or replaced: its pod's memory is attributed to nothing, silently.
    ghost = "GPU-deadbeef-0000-4000-8000-000000000000"
    view = PodResourcesView(assignments=(assign("ml", "ghost", "nvidia.com/gpu", ghost),
                                         assign("ml", "s", "nvidia.com/gpu.shared",
                                                f"{L40S_UUID}::1")))
    inv = _agent(FakeNvml([l40s_shared()]), view=FakePodResources(view)).observe().inventory
    assert [e for e in inv.errors if "NVML does not list" in e] == [
        f"PodResources: ml/ghost hold(s) device {ghost}, which NVML does not list"]
