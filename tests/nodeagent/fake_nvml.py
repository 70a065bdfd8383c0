"""A recorded fake of the ``pynvml`` functions the NVML adapter uses.

Built from the documented NVML API and the real ``pynvml`` bindings: it returns the
same ctypes structs (``c_nvmlMemory_t``, ``c_nvmlGpuInstanceProfileInfo_v2_t``,
``c_nvmlGpuInstanceInfo_t``, ``c_nvmlDeviceAttributes``), fills the same ctypes
out-parameters for ``nvmlDeviceGetGpuInstances``, and raises the real ``NVMLError``
subclasses (``NVMLError_GpuIsLost``, ``NVMLError_NotSupported`` ...), so the adapter code
path is the one that runs against a driver. Mutating functions (set MIG mode,
create/destroy instances, reset) are deliberately absent: calling one is an
AttributeError, and every call is recorded in ``calls`` for the tests to inspect.

Profile ids, slice counts and memory sizes of the H100 are those ``nvidia-smi mig -lgip``
prints on an H100 80GB HBM3.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as _real

MIB = 1024 * 1024
GIB = 1024 * MIB


def _profile_constants() -> dict[str, int]:
    return {k: int(v) for k, v in vars(_real).items()
            if k.startswith("NVML_GPU_INSTANCE_PROFILE_")}


@dataclass
class FakeProfile:
    index: int  # NVML_GPU_INSTANCE_PROFILE_* enum value
    id: int
    slices: int
    memory_mib: int
    instances: int


@dataclass
class FakeProcess:
    pid: int
    used_bytes: int | None


@dataclass
class FakeComputeInstance:
    ci_id: int
    uuid: str
    slices: int
    memory_total_bytes: int
    memory_used_bytes: int
    processes: list[FakeProcess] = field(default_factory=list)


@dataclass
class FakeGpuInstance:
    gi_id: int
    profile_id: int
    start: int
    size: int
    cis: list[FakeComputeInstance] = field(default_factory=list)


@dataclass
class FakeGpu:
    name: str
    uuid: str
    total_bytes: int
    used_bytes: int
    mig_supported: bool = False
    mig_current: int = 0
    mig_pending: int = 0
    profiles: list[FakeProfile] = field(default_factory=list)
    gis: list[FakeGpuInstance] = field(default_factory=list)
    processes: list[FakeProcess] = field(default_factory=list)
    lost: bool = False  # every call on the device raises GpuIsLost
    failing: dict[str, int] = field(default_factory=dict)  # call name -> NVML error code


@dataclass(frozen=True)
class _MigHandle:
    gpu: FakeGpu
    gi: FakeGpuInstance
    ci: FakeComputeInstance


class FakeNvml:
    """Module-like object: attribute access mirrors ``pynvml``'s functions; the error
    classes, constants and handle types are pynvml's own."""

    NVMLError = _real.NVMLError
    NVML_DEVICE_MIG_DISABLE = _real.NVML_DEVICE_MIG_DISABLE
    NVML_DEVICE_MIG_ENABLE = _real.NVML_DEVICE_MIG_ENABLE
    NVML_GPU_INSTANCE_PROFILE_COUNT = _real.NVML_GPU_INSTANCE_PROFILE_COUNT
    c_nvmlGpuInstance_t = _real.c_nvmlGpuInstance_t

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None,
                 driver: str = "550.90.07") -> None:
        for k, v in _profile_constants().items():
            setattr(self, k, v)
        self.gpus = gpus
        self.init_error = init_error
        self.driver = driver
        self.initialised = False
        self.calls: list[str] = []
        # GPU instance handles are opaque pointers in NVML; the fake hands out distinct
        # fake addresses and remembers what each one stands for.
        self._gi_handles: dict[int, tuple[FakeGpu, FakeGpuInstance]] = {}

    # -- helpers --------------------------------------------------------------------------

    def _record(self, name: str) -> None:
        self.calls.append(name)
        if not self.initialised and name not in ("nvmlInit",):
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any, call: str) -> FakeGpu:
        gpu = handle.gpu if isinstance(handle, _MigHandle) else handle
        assert isinstance(gpu, FakeGpu), f"{call}: not a device handle: {handle!r}"
        if gpu.lost:
            raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)
        if call in gpu.failing:
            raise _real.NVMLError(gpu.failing[call])
        return gpu

    # -- lifecycle ------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._record("nvmlInit")
        if self.init_error is not None:
            raise _real.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._record("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._record("nvmlSystemGetDriverVersion")
        return self.driver

    # -- devices --------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._record("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._record("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._record("nvmlDeviceGetUUID")
        gpu = self._gpu(handle, "nvmlDeviceGetUUID")
        return handle.ci.uuid if isinstance(handle, _MigHandle) else gpu.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._record("nvmlDeviceGetName")
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        self._record("nvmlDeviceGetMemoryInfo")
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        if isinstance(handle, _MigHandle):
            total, used = handle.ci.memory_total_bytes, handle.ci.memory_used_bytes
        else:
            total, used = gpu.total_bytes, gpu.used_bytes
        return _real.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        self._record("nvmlDeviceGetMigMode")
        gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
        if not gpu.mig_supported:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_current, gpu.mig_pending]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        self._record("nvmlDeviceGetComputeRunningProcesses")
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        if isinstance(handle, _MigHandle):
            procs, gi_id, ci_id = handle.ci.processes, handle.gi.gi_id, handle.ci.ci_id
        else:
            procs, gi_id, ci_id = gpu.processes, 0xFFFFFFFF, 0xFFFFFFFF
        # pynvml returns "friendly objects" with the nvmlProcessInfo_v3_t field names.
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_bytes, gpuInstanceId=gi_id,
                                computeInstanceId=ci_id) for p in procs]

    # -- MIG ------------------------------------------------------------------------------

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int,
                                            version: int = 2) -> Any:
        self._record("nvmlDeviceGetGpuInstanceProfileInfo")
        gpu = self._gpu(handle, "nvmlDeviceGetGpuInstanceProfileInfo")
        for p in gpu.profiles:
            if p.index == profile:
                info = _real.c_nvmlGpuInstanceProfileInfo_v2_t()
                info.id = p.id
                info.sliceCount = p.slices
                info.instanceCount = p.instances
                info.memorySizeMB = p.memory_mib
                info.name = f"MIG {p.slices}g.?gb".encode()  # adapter must not rely on it
                return info
        raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetGpuInstances(self, handle: Any, profile_id: int, instances_ref: Any,
                                  count_ref: Any) -> int:
        self._record("nvmlDeviceGetGpuInstances")
        gpu = self._gpu(handle, "nvmlDeviceGetGpuInstances")
        if not gpu.mig_current:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        found = [gi for gi in gpu.gis if gi.profile_id == profile_id]
        if len(found) > len(instances_ref):
            raise _real.NVMLError(_real.NVML_ERROR_INSUFFICIENT_SIZE)
        for k, gi in enumerate(found):
            address = 0x1000 * (len(self._gi_handles) + 1)
            self._gi_handles[address] = (gpu, gi)
            instances_ref[k] = ctypes.cast(ctypes.c_void_p(address), _real.c_nvmlGpuInstance_t)
        count_ref._obj.value = len(found)
        return _real.NVML_SUCCESS

    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any) -> Any:
        self._record("nvmlGpuInstanceGetInfo")
        address = ctypes.cast(gpu_instance, ctypes.c_void_p).value
        if address not in self._gi_handles:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        gpu, gi = self._gi_handles[address]
        self._gpu(gpu, "nvmlGpuInstanceGetInfo")
        info = _real.c_nvmlGpuInstanceInfo_t()
        info.id = gi.gi_id
        info.profileId = gi.profile_id
        info.placement.start = gi.start
        info.placement.size = gi.size
        return info

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        self._record("nvmlDeviceGetMaxMigDeviceCount")
        gpu = self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return 7 if gpu.mig_supported else 0

    def _mig_handles(self, gpu: FakeGpu) -> list[_MigHandle]:
        return [_MigHandle(gpu, gi, ci) for gi in gpu.gis for ci in gi.cis]

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> _MigHandle:
        self._record("nvmlDeviceGetMigDeviceHandleByIndex")
        gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        handles = self._mig_handles(gpu) if gpu.mig_current else []
        if index >= len(handles):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        return handles[index]

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        self._record("nvmlDeviceGetGpuInstanceId")
        self._gpu(handle, "nvmlDeviceGetGpuInstanceId")
        if not isinstance(handle, _MigHandle):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return handle.gi.gi_id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        self._record("nvmlDeviceGetComputeInstanceId")
        self._gpu(handle, "nvmlDeviceGetComputeInstanceId")
        if not isinstance(handle, _MigHandle):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return handle.ci.ci_id

    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        self._record("nvmlDeviceGetAttributes")
        self._gpu(handle, "nvmlDeviceGetAttributes")
        attrs = _real.c_nvmlDeviceAttributes()
        if isinstance(handle, _MigHandle):
            attrs.computeInstanceSliceCount = handle.ci.slices
            attrs.gpuInstanceSliceCount = handle.ci.slices
            attrs.memorySizeMB = handle.ci.memory_total_bytes // MIB
        return attrs


# ---------------------------------------------------------------------------- scenarios

H100_UUID = "GPU-5b8d0e1c-4a6f-2b7e-9c31-0f6a8d2e4b17"
L40S_UUID = "GPU-0c7e2a91-3d5b-4f88-a1e6-7b9c2d4f6a30"
LOST_UUID = "GPU-9e1f4c72-8b3a-45d6-b0c8-2a7d9f1e3c55"
MIG_3G = "MIG-1f2e3d4c-5b6a-5978-8a9b-0c1d2e3f4a5b"
MIG_2G = "MIG-2a3b4c5d-6e7f-5a8b-9c0d-1e2f3a4b5c6d"
MIG_1G_A = "MIG-3c4d5e6f-7a8b-5c9d-0e1f-2a3b4c5d6e7f"
MIG_1G_B = "MIG-4d5e6f7a-8b9c-5d0e-1f2a-3b4c5d6e7f8a"

H100_TOTAL = 81559 * MIB  # NVIDIA H100 80GB HBM3 as nvidia-smi reports it
L40S_TOTAL = 46068 * MIB


def h100_profiles() -> list[FakeProfile]:
    r = _real
    return [
        FakeProfile(r.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 9984, 7),
        FakeProfile(r.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 9984, 1),
        FakeProfile(r.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 20096, 4),
        FakeProfile(r.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 20096, 3),
        FakeProfile(r.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 40448, 2),
        FakeProfile(r.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 40448, 1),
        FakeProfile(r.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 81152, 1),
    ]


def h100_mig() -> FakeGpu:
    """3g.40gb@4, 2g.20gb@0, 1g.10gb@2, 1g.10gb@3; a vLLM in the 3g, a small model in
    the first 1g."""
    return FakeGpu(
        name="NVIDIA H100 80GB HBM3", uuid=H100_UUID, total_bytes=H100_TOTAL,
        used_bytes=38 * GIB, mig_supported=True, mig_current=1, mig_pending=1,
        profiles=h100_profiles(),
        gis=[
            FakeGpuInstance(1, 9, 4, 4, [FakeComputeInstance(
                0, MIG_3G, 3, 40448 * MIB, 30 * GIB + 64 * MIB,
                [FakeProcess(4101, 30 * GIB)])]),
            FakeGpuInstance(5, 14, 0, 2, [FakeComputeInstance(
                0, MIG_2G, 2, 20096 * MIB, 13 * MIB)]),
            FakeGpuInstance(13, 19, 2, 1, [FakeComputeInstance(
                0, MIG_1G_A, 1, 9984 * MIB, 6 * GIB + 12 * MIB,
                [FakeProcess(4202, 6 * GIB)])]),
            FakeGpuInstance(14, 19, 3, 1, [FakeComputeInstance(
                0, MIG_1G_B, 1, 9984 * MIB, 13 * MIB)]),
        ],
    )


def l40s_shared() -> FakeGpu:
    """Time-sliced L40S: three processes (three pods) sharing memory without isolation."""
    return FakeGpu(
        name="NVIDIA L40S", uuid=L40S_UUID, total_bytes=L40S_TOTAL, used_bytes=25 * GIB,
        processes=[FakeProcess(5101, 8 * GIB), FakeProcess(5102, 12 * GIB),
                   FakeProcess(5103, 4 * GIB)],
    )


def lost_gpu() -> FakeGpu:
    return FakeGpu(name="NVIDIA H100 80GB HBM3", uuid=LOST_UUID, total_bytes=H100_TOTAL,
                   used_bytes=0, lost=True)


def mixed_node() -> FakeNvml:
    """GPU 0 H100 with MIG, GPU 1 time-sliced L40S, GPU 2 fallen off the bus."""
    return FakeNvml([h100_mig(), l40s_shared(), lost_gpu()])


def no_driver() -> FakeNvml:
    return FakeNvml([], init_error=_real.NVML_ERROR_DRIVER_NOT_LOADED)
