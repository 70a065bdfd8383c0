"""The webhook's admission in a replay (webhook/replay.py): the pod as the webhook would
store it, read back as the scheduler reads it, on the replayed cluster of the moment."""

from __future__ import annotations

from packing.day import DayPod
from packing.day_scenario import Service
from packing.model import (
    GpuInfo,
    GpuMode,
    MigInstance,
    NodeInfo,
    Placement,
    PodRequest,
    RequestKind,
    Snapshot,
)
from packing.state import ClusterState
from webhook.replay import webhook_admission

BALANCED = (MigInstance("1g.10gb", 0), MigInstance("1g.10gb", 1),
            MigInstance("2g.20gb", 2), MigInstance("3g.40gb", 4))
MIG = NodeInfo("mig-0", 64_000, 512 * 1024,
               (GpuInfo(0, "H100-80GB", 81_559, GpuMode.MIG, BALANCED),),
               {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "kubernetes.io/hostname": "mig-0"})
L40S = NodeInfo("l40s-0", 64_000, 512 * 1024,
                (GpuInfo(0, "L40S", 46_068, GpuMode.SHARED, replicas=4),),
                {"nvidia.com/gpu.product": "NVIDIA-L40S", "kubernetes.io/hostname": "l40s-0"})
ASR = Service("speech", "asr", 4000, 16 * 1024, 0, 8 * 1024, "asr",
              "nvidia.com/mig-1g.10gb", 0)


def asr(n: int) -> DayPod:
    return ASR.make(f"asr-{n}", 0, 0, 0)


def holder(key: str, profile: str, start: int) -> tuple[PodRequest, Placement]:
    req = PodRequest(key, 1000, 1024, RequestKind.MIG, mig_profile=profile)
    return req, Placement(key, "mig-0", (0,), profile, start)


def test_smallest_free_slice_first_then_a_larger_one_then_a_share() -> None:
    admit = webhook_admission()
    state = ClusterState(Snapshot((MIG, L40S)))
    first = admit(asr(0), state, [])
    assert isinstance(first, PodRequest)
    assert (first.kind, first.mig_profile) == (RequestKind.MIG, "1g.10gb")
    assert first.key == "speech/asr-0" and first.gpu_memory_mib == 8 * 1024
    # Both 1g.10gb slices held: the next smallest that holds 8 GiB and is free.
    full = ClusterState(Snapshot((MIG, L40S), (holder("a/x", "1g.10gb", 0),
                                               holder("a/y", "1g.10gb", 1))))
    second = admit(asr(1), full, [])
    assert isinstance(second, PodRequest) and second.mig_profile == "2g.20gb"
    # The pods waiting for the scheduler hold their slices already (claims).
    waiting = [PodRequest("a/z", kind=RequestKind.MIG, mig_profile="2g.20gb"),
               PodRequest("a/w", kind=RequestKind.MIG, mig_profile="3g.40gb")]
    third = admit(asr(2), full, waiting)
    assert isinstance(third, PodRequest) and third.kind is RequestKind.SHARED


def test_a_pod_no_gpu_can_hold_is_denied_with_the_webhooks_reason() -> None:
    huge = Service("speech", "huge", 1000, 1024, 0, 500 * 1024, "small",
                   "nvidia.com/gpu.shared", 0).make("huge-0", 0, 0, 0)
    got = webhook_admission()(huge, ClusterState(Snapshot((MIG, L40S))), [])
    assert isinstance(got, str) and got.startswith("denied by the webhook: ")


def test_a_pod_without_a_manifest_is_admitted_as_written() -> None:
    pod = DayPod("ns/p", "", PodRequest("ns/p", 1000, 1024, RequestKind.WHOLE, gpu_count=1))
    assert webhook_admission()(pod, ClusterState(Snapshot((MIG,))), []) is pod.request


def test_whole_gpu_and_group_pods_keep_what_they_ask() -> None:
    llm = Service("llm", "big", 8000, 64 * 1024, 8, 0, "whole", "", 2).make("big-0-1", 0, 1, 0)
    got = webhook_admission()(llm, ClusterState(Snapshot((MIG,))), [])
    assert isinstance(got, PodRequest)
    assert (got.kind, got.gpu_count) == (RequestKind.WHOLE, 8)
    assert got.group is not None and got.group.key == "llm/big/0" and got.group.index == 1
    assert got.group == llm.request.group
