"""Device identity: the device plugin's index ids (deviceIDStrategy: index) are mapped to
the UUIDs NVML gives the same devices, and GPUs reporting one UUID twice are left out."""

from __future__ import annotations

import dataclasses

from fake_nvml import (
    H100_UUID,
    L40S_UUID,
    MIG_1G_A,
    MIG_3G,
    FakeNvml,
    FakeProcess,
    h100_mig,
    l40s_shared,
)
from test_agent_loop import FakeClock, RecordingPatch, assign

from nodeagent.agent import Agent, AgentConfig
from nodeagent.cgroups import CgroupOwner
from nodeagent.nvml import NvmlAdapter
from nodeagent.podresources import PodResourcesView, unrecognised_ids
from nodeagent.report import ambiguous_devices, index_ids
from packing.model import GpuMode, MigInstance


class _View:
    def __init__(self, view: PodResourcesView) -> None:
        self.view = view

    def read(self) -> PodResourcesView:
        return self.view


def _agent(fake: FakeNvml, view: PodResourcesView) -> Agent:
    return Agent(AgentConfig(node="n", min_patch_interval_s=30, mem_tolerance_mib=512),
                 gpus=NvmlAdapter(fake), podresources=_View(view),
                 pod_of_pid={5101: CgroupOwner("uid-a", "c")}.get, clock=FakeClock(),
                 patch=RecordingPatch(), pod_names=lambda: {"uid-a": "tts/tts-a"})


def test_index_ids_name_the_devices_nvml_enumerates() -> None:
    snapshot = NvmlAdapter(FakeNvml([h100_mig(), l40s_shared()])).read()
    ids = index_ids(snapshot)
    # MIG devices in the order nvmlDeviceGetMigDeviceHandleByIndex hands them out.
    assert ids["0"] == H100_UUID and ids["1"] == L40S_UUID
    assert ids["0:0"] == MIG_3G and ids["0:2"] == MIG_1G_A
    assert "1:0" not in ids  # the L40S has no MIG devices


def test_an_index_strategy_node_is_attributed_like_a_uuid_one() -> None:
    view = PodResourcesView(
        assignments=(
            assign("llm", "vllm-0", "nvidia.com/mig-3g.40gb", "0:0"),
            assign("asr", "whisper-1", "nvidia.com/mig-1g.10gb", "0:2"),
            assign("tts", "tts-a", "nvidia.com/gpu.shared", "1::0"),
            assign("x", "ghost", "nvidia.com/gpu", "7"),  # no GPU 7: still unrecognised
        ),
        shared_uuids=frozenset({"1"}),
        allocatable_known=True,
    )
    view = dataclasses.replace(view, error=unrecognised_ids(view.assignments))
    assert view.error is not None and "4 device id(s)" in view.error
    inv = _agent(FakeNvml([h100_mig(), l40s_shared()]), view).observe().inventory
    h100, l40s = inv.gpus
    assert h100.mig[1] == MigInstance("1g.10gb", 2, "asr/whisper-1")
    assert h100.mig[3] == MigInstance("3g.40gb", 4, "llm/vllm-0")
    assert l40s.mode is GpuMode.SHARED
    assert [p.pod for p in l40s.pods] == ["tts/tts-a"]
    errors = [e for e in inv.errors if "device id" in e]
    assert len(errors) == 1 and "1 device id(s)" in errors[0] and "'7'" in errors[0]


def test_a_view_without_index_ids_is_unchanged() -> None:
    view = PodResourcesView(assignments=(assign("a", "b", "nvidia.com/gpu", H100_UUID),))
    assert view.with_ids({"0": H100_UUID}) is view


def test_gpus_reporting_one_uuid_are_left_out_and_named() -> None:
    twin = dataclasses.replace(l40s_shared(), uuid=H100_UUID,
                               processes=[FakeProcess(5101, 1024)])
    fake = FakeNvml([h100_mig(), twin, l40s_shared()])
    snapshot = NvmlAdapter(fake).read()
    assert sorted(ambiguous_devices(snapshot)) == [0, 1]
    view = PodResourcesView(
        assignments=(assign("llm", "vllm-0", "nvidia.com/mig-3g.40gb", MIG_3G),
                     assign("tts", "tts-a", "nvidia.com/gpu", H100_UUID)))
    inv = _agent(fake, view).observe().inventory
    assert [g.uuid for g in inv.gpus] == [L40S_UUID]
    named = [e for e in inv.errors if "reported 2 times" in e]
    assert [e.split(":")[0] for e in named] == ["gpu 0", "gpu 1"]
