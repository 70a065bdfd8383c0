"""PodResources v1 through a real gRPC server on a Unix socket."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_kubelet import KubeletState
from fake_nvml import H100_UUID, L40S_UUID, MIG_1G_A, MIG_3G

from nodeagent.podresources import PodResourcesClient, parse_device_id


def test_device_id_shapes() -> None:
    assert parse_device_id(H100_UUID).replica is None
    shared = parse_device_id(f"{L40S_UUID}::2")
    assert (shared.uuid, shared.replica, shared.is_mig) == (L40S_UUID, 2, False)
    mig = parse_device_id(f"{MIG_3G}::0")
    assert (mig.uuid, mig.replica, mig.is_mig) == (MIG_3G, 0, True)
    odd = parse_device_id(f"{L40S_UUID}::x")
    assert (odd.uuid, odd.replica) == (L40S_UUID, None)


def test_list_maps_devices_to_pods(kubelet: tuple[str, KubeletState]) -> None:
    socket, state = kubelet
    state.pods = [
        ("llm", "vllm-0", [("server", [("nvidia.com/mig-3g.40gb", [MIG_3G])])]),
        ("asr", "whisper-1", [("asr", [("nvidia.com/mig-1g.10gb", [MIG_1G_A])]),
                              ("sidecar", [])]),
        ("tts", "tts-a", [("tts", [("nvidia.com/gpu.shared", [f"{L40S_UUID}::0"])])]),
        ("tts", "tts-b", [("tts", [("nvidia.com/gpu.shared", [f"{L40S_UUID}::3"])])]),
        ("net", "sriov", [("app", [("intel.com/sriov", ["0000:3b:02.1"])])]),
        # No pod key to publish under (the inventory would not decode): left out.
        ("", "nameless-ns", [("c", [("nvidia.com/gpu", [H100_UUID])])]),
    ]
    state.allocatable = [
        ("nvidia.com/gpu.shared", [f"{L40S_UUID}::{k}" for k in range(4)]),
        ("nvidia.com/mig-3g.40gb", [MIG_3G]),
    ]
    client = PodResourcesClient(socket)
    try:
        view = client.read()
    finally:
        client.close()
    assert view.error is None and view.allocatable_known
    assert view.pods_by_uuid() == {
        MIG_3G: ("llm/vllm-0",),
        MIG_1G_A: ("asr/whisper-1",),
        L40S_UUID: ("tts/tts-a", "tts/tts-b"),
    }
    assert view.shared_uuids == frozenset({L40S_UUID})
    assert {a.resource for a in view.assignments} == {
        "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared"}


def test_idle_shared_gpu_known_from_allocatable(kubelet: tuple[str, KubeletState]) -> None:
    socket, state = kubelet
    state.allocatable = [("nvidia.com/gpu.shared", [f"{L40S_UUID}::0", f"{L40S_UUID}::1"]),
                         ("nvidia.com/gpu", [H100_UUID])]
    view = PodResourcesClient(socket).read()
    assert view.assignments == () and view.shared_uuids == frozenset({L40S_UUID})


def test_old_kubelet_without_allocatable(kubelet: tuple[str, KubeletState]) -> None:
    socket, state = kubelet
    state.allocatable_implemented = False
    state.pods = [("tts", "tts-a", [("tts", [("nvidia.com/gpu", [f"{L40S_UUID}::1"])])])]
    view = PodResourcesClient(socket).read()
    assert view.error is None and not view.allocatable_known
    assert view.shared_uuids == frozenset({L40S_UUID})


def test_missing_socket_is_an_error_not_an_exception(tmp_path: Path) -> None:
    view = PodResourcesClient(str(tmp_path / "absent.sock"), timeout_s=1.0).read()
    assert view.assignments == () and view.error is not None
    assert view.error == "PodResources List: UNAVAILABLE"


def test_a_transient_allocatable_failure_keeps_the_last_shared_gpus(
        kubelet: tuple[str, KubeletState]) -> None:
    # An idle time-sliced GPU is known shared only from GetAllocatableResources: one
    # failed call must not publish it as a whole GPU.
    socket, state = kubelet
    state.allocatable = [("nvidia.com/gpu.shared", [f"{L40S_UUID}::0", f"{L40S_UUID}::1"])]
    client = PodResourcesClient(socket)
    try:
        assert client.read().shared_uuids == frozenset({L40S_UUID})
        state.allocatable_unavailable = True
        view = client.read()
        assert view.shared_uuids == frozenset({L40S_UUID})
        assert view.error == "PodResources GetAllocatableResources: UNAVAILABLE"
    finally:
        client.close()


@pytest.mark.parametrize("implemented", [True, False])
def test_index_device_ids_are_reported_not_silently_dropped(
        kubelet: tuple[str, KubeletState], implemented: bool) -> None:
    socket, state = kubelet
    state.allocatable_implemented = implemented
    state.pods = [("tts", "tts-a", [("tts", [("nvidia.com/gpu", ["0"])])]),
                  ("llm", "vllm-0", [("s", [("nvidia.com/gpu", [H100_UUID])])])]
    client = PodResourcesClient(socket)
    try:
        view = client.read()
    finally:
        client.close()
    assert view.error is not None and "1 device id(s) are not GPU/MIG UUIDs" in view.error
    assert "deviceIDStrategy must be uuid" in view.error
