"""Read-only NVML adapter: the only module of the project that touches ``pynvml``.

Everything NVML says is turned into small frozen dataclasses behind the
:class:`GpuReader` protocol, so the rest of the agent (and its tests) never see ctypes
handles or NVML exceptions.

Read-only by construction: this module calls only NVML *getters*. It never changes MIG
mode, creates or destroys GPU/compute instances, or resets a GPU; a test greps this file
for the mutating names to keep it that way.

Errors are contained per call: a failing getter (a GPU that fell off the bus raises
``GpuIsLost``, old drivers raise ``NotSupported``) becomes a :class:`NvmlCallError` on the
device it concerns and the read goes on with the next call and the next device. NVML
that cannot be loaded or initialised (no driver, no library) yields an empty
:class:`GpuSnapshot` with an error; the next :meth:`NvmlAdapter.read` tries again,
because a driver container may finish loading after the agent starts.
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

MIB = 1024 * 1024
_GIB = 1024 * MIB

# NVML's "value not available" for 64-bit counters (pynvml maps it to None in newer
# releases; older ones pass it through).
_NOT_AVAILABLE_ULL = 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True)
class NvmlCallError:
    """One failed NVML call: which call, and NVML's error name (e.g. ``GpuIsLost``)."""

    call: str
    error: str

    def __str__(self) -> str:
        return f"{self.call}: {self.error}"


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU or MIG device. ``used_bytes`` is None when NVML
    withholds it (it does for unprivileged callers on MIG devices)."""

    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class MigPlacement:
    """Where a GPU instance sits: ``size`` memory slices from slice ``start``."""

    start: int
    size: int


@dataclass(frozen=True)
class ComputeInstance:
    """A compute instance inside a GPU instance, seen through its MIG device handle
    (the ``MIG-...`` UUID the device plugin hands to pods)."""

    gi_id: int
    ci_id: int
    uuid: str
    slice_count: int | None  # compute slices; None when the attributes call failed
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    processes: tuple[GpuProcess, ...] = ()
    errors: tuple[NvmlCallError, ...] = ()
    # k of nvmlDeviceGetMigDeviceHandleByIndex(gpu, k): the device plugin's index id of
    # this MIG device is "<gpu index>:<k>" (deviceIDStrategy: index).
    mig_index: int | None = None


@dataclass(frozen=True)
class GpuInstance:
    """A MIG GPU instance with its profile (named from slice count and memory) and
    placement."""

    gi_id: int
    profile: str  # e.g. "1g.10gb", "1g.10gb+me"
    profile_id: int  # NVML's profile id (nvmlGpuInstanceProfileInfo_t.id)
    slice_count: int
    memory_bytes: int
    placement: MigPlacement
    compute_instances: tuple[ComputeInstance, ...] = ()

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(ci.uuid for ci in self.compute_instances)


@dataclass(frozen=True)
class GpuDevice:
    """One physical GPU. Fields NVML could not read are None and the failures are in
    ``errors``."""

    index: int
    uuid: str | None
    name: str | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    mig_current: bool | None  # None: MIG not supported or not readable
    mig_pending: bool | None
    gpu_instances: tuple[GpuInstance, ...] = ()
    processes: tuple[GpuProcess, ...] = ()  # whole-GPU processes (MIG disabled)
    errors: tuple[NvmlCallError, ...] = ()
    # False when the MIG mode or the MIG layout could not be read: the GPU must then not
    # be published as a free whole GPU or with its instances unowned.
    layout_known: bool = True

    @property
    def error(self) -> str | None:
        """The first error, for one-line reports; None when every call succeeded."""
        return str(self.errors[0]) if self.errors else None

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig_current)


@dataclass(frozen=True)
class GpuSnapshot:
    """Everything read in one pass. ``error`` is set when NVML itself is unusable."""

    devices: tuple[GpuDevice, ...] = ()
    driver_version: str | None = None
    error: str | None = None
    errors: tuple[NvmlCallError, ...] = ()  # failures not tied to one device

    def all_errors(self) -> tuple[NvmlCallError, ...]:
        found = list(self.errors)
        for d in self.devices:
            found.extend(d.errors)
            for gi in d.gpu_instances:
                for ci in gi.compute_instances:
                    found.extend(ci.errors)
        return tuple(found)


class GpuReader(Protocol):
    """What the agent needs from the GPU side."""

    def read(self) -> GpuSnapshot: ...

    def close(self) -> None: ...


def mig_memory_gb(mig_memory_mib: int, device_memory_bytes: int) -> int:
    """The ``<n>gb`` of a MIG profile name, computed the way NVIDIA's own tooling does
    (go-nvlib ``getMigMemorySizeGB``): the instance's share of device memory rounded up
    to eighths, times the device memory in whole GiB rounded up, rounded half up.

    Deriving the name from numbers rather than trusting NVML's ``name`` string keeps
    profiles stable across drivers that renamed them (GB200 ``1g.24gb`` -> ``1g.23gb``).
    """
    fraction = (mig_memory_mib * MIB) / device_memory_bytes
    fraction = math.ceil(fraction * 8) / 8
    total_gb = (device_memory_bytes + _GIB - 1) // _GIB
    return math.floor(fraction * total_gb + 0.5)


def profile_suffix(nv: Any, profile_index: int) -> str:
    """The attribute suffix of a GPU instance profile enum value (``+me`` etc.).

    Media-extension variants have the same slice count and memory as the plain profile,
    so the enum is the only way to tell them apart.
    """
    by_name = {
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1": "+me",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1": "+me",
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME": "+me.all",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME": "+me.all",
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME": "-me",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME": "-me",
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX": "+gfx",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX": "+gfx",
        "NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX": "+gfx",
        "NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX": "+gfx",
    }
    for const, suffix in by_name.items():
        # Older pynvml releases lack the newer constants; absent means not this profile.
        if getattr(nv, const, None) == profile_index:
            return suffix
    return ""


def profile_name(slice_count: int, memory_mib: int, device_memory_bytes: int,
                 suffix: str = "") -> str:
    return f"{slice_count}g.{mig_memory_gb(memory_mib, device_memory_bytes)}gb{suffix}"


@dataclass(frozen=True)
class _ProfileInfo:
    index: int  # the NVML_GPU_INSTANCE_PROFILE_* enum value
    id: int
    slice_count: int
    memory_mib: int
    instance_count: int


def _error_name(exc: BaseException) -> str:
    """``NVMLError_GpuIsLost`` -> ``GpuIsLost``; NVML error classes are built per code."""
    name = type(exc).__name__
    return name.removeprefix("NVMLError_") if name.startswith("NVMLError_") else name


def _text(value: object) -> str:
    # pynvml returns str on Python 3, but older releases returned bytes.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _nonblank(value: object) -> str | None:
    text = None if value is None else _text(value).strip()
    return text or None


# Bounds on the counts NVML answers: a garbage count (0xFFFFFFFF) must not turn into four
# billion calls or a huge ctypes array. No GPU has more than 7 MIG devices today.
MAX_MIG_DEVICES = 64
MAX_GPU_INSTANCES = 64


class _Calls:
    """Runs NVML getters, turning an NVML error into a recorded :class:`NvmlCallError`."""

    def __init__(self, error_type: type[BaseException]) -> None:
        self._error_type = error_type
        self.errors: list[NvmlCallError] = []
        self.lost = False

    def call(self, name: str, fn: Callable[..., T], *args: object,
             quiet: tuple[str, ...] = ()) -> T | None:
        # Once a GPU is lost every further call fails too, each after a driver timeout:
        # stop asking about that device for this pass.
        if self.lost:
            return None
        try:
            return fn(*args)
        except self._error_type as e:
            err = _error_name(e)
            if err == "NVMLError":  # a code this pynvml has no class for: keep the code
                err = f"NVMLError({getattr(e, 'value', '?')})"
            if err == "GpuIsLost":
                self.lost = True
            if err not in quiet:
                self.errors.append(NvmlCallError(name, err))
            return None
        except Exception as e:
            # Not an NVMLError: pynvml's NVMLLibraryMismatchError (a driver without the
            # _v3 process call), a string it cannot decode, ... One call fails, not the
            # whole read.
            self.errors.append(NvmlCallError(name, type(e).__name__))
            return None


class NvmlAdapter:
    """:class:`GpuReader` over a ``pynvml``-compatible module (the real one, or a fake in
    tests)."""

    def __init__(self, nv: ModuleType | Any) -> None:
        self._nv = nv
        self._initialised = False

    # -- lifecycle ----------------------------------------------------------------------

    def _ensure_init(self) -> str | None:
        if self._initialised:
            return None
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as e:
            return f"nvmlInit: {_error_name(e)} (no NVIDIA driver or NVML library?)"
        except OSError as e:  # dlopen failures surface as OSError on some releases
            return f"nvmlInit: {e}"
        self._initialised = True
        return None

    def close(self) -> None:
        if self._initialised:
            try:
                self._nv.nvmlShutdown()
            except Exception as e:  # NVMLError or worse: either way start afresh
                log.warning("nvmlShutdown failed: %s", _error_name(e))
            self._initialised = False

    # -- reading ------------------------------------------------------------------------

    def read(self) -> GpuSnapshot:
        init_error = self._ensure_init()
        if init_error is not None:
            return GpuSnapshot(error=init_error)
        nv = self._nv
        top = _Calls(nv.NVMLError)
        driver = top.call("nvmlSystemGetDriverVersion", nv.nvmlSystemGetDriverVersion)
        count = top.call("nvmlDeviceGetCount", nv.nvmlDeviceGetCount)
        if count is None:
            # The library may be gone under us (a driver reload): start over with
            # nvmlInit on the next read instead of failing every read from now on.
            self.close()
            return GpuSnapshot(errors=tuple(top.errors),
                               error="nvmlDeviceGetCount failed: GPUs cannot be listed")
        devices = tuple(self._read_device(i) for i in range(count))
        return GpuSnapshot(devices=devices,
                           driver_version=None if driver is None else _text(driver),
                           errors=tuple(top.errors))

    def _read_device(self, index: int) -> GpuDevice:
        nv = self._nv
        c = _Calls(nv.NVMLError)
        handle = c.call("nvmlDeviceGetHandleByIndex", nv.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            return GpuDevice(index=index, uuid=None, name=None, memory_total_bytes=None,
                             memory_used_bytes=None, mig_current=None, mig_pending=None,
                             errors=tuple(c.errors))
        uuid = c.call("nvmlDeviceGetUUID", nv.nvmlDeviceGetUUID, handle)
        name = c.call("nvmlDeviceGetName", nv.nvmlDeviceGetName, handle)
        mem = c.call("nvmlDeviceGetMemoryInfo", nv.nvmlDeviceGetMemoryInfo, handle)
        total = None if mem is None or int(mem.total) <= 0 else int(mem.total)
        used = None if mem is None or total is None else max(0, int(mem.used))
        # GPUs without MIG answer NotSupported: that is a fact, not a failure.
        before = len(c.errors)
        modes = c.call("nvmlDeviceGetMigMode", nv.nvmlDeviceGetMigMode, handle,
                       quiet=("NotSupported",))
        layout_known = not (modes is None and len(c.errors) > before)
        current = None if modes is None else modes[0] == nv.NVML_DEVICE_MIG_ENABLE
        pending = None if modes is None else modes[1] == nv.NVML_DEVICE_MIG_ENABLE
        instances: tuple[GpuInstance, ...] = ()
        processes: tuple[GpuProcess, ...] = ()
        if current:
            if total is not None:
                instances, layout_known = self._read_instances(handle, total, c)
            else:
                # Profile names need the device memory; without it the layout is unknown.
                c.errors.append(NvmlCallError("mig-layout", "DeviceMemoryUnknown"))
                layout_known = False
        else:
            procs = c.call("nvmlDeviceGetComputeRunningProcesses",
                           nv.nvmlDeviceGetComputeRunningProcesses, handle)
            processes = () if procs is None else self._processes(procs)
        return GpuDevice(index=index, uuid=_nonblank(uuid), name=_nonblank(name),
                         memory_total_bytes=total,
                         memory_used_bytes=used, mig_current=current, mig_pending=pending,
                         gpu_instances=instances, processes=processes, errors=tuple(c.errors),
                         layout_known=layout_known)

    def _profiles(self, handle: object, c: _Calls) -> list[_ProfileInfo]:
        nv = self._nv
        found: list[_ProfileInfo] = []
        for index in range(int(nv.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            # A profile this GPU lacks answers NotSupported / InvalidArgument: skip it.
            info = c.call("nvmlDeviceGetGpuInstanceProfileInfo",
                          nv.nvmlDeviceGetGpuInstanceProfileInfo, handle, index,
                          quiet=("NotSupported", "InvalidArgument", "NotFound"))
            if info is None:
                continue
            found.append(_ProfileInfo(index=index, id=int(info.id),
                                      slice_count=int(info.sliceCount),
                                      memory_mib=int(info.memorySizeMB),
                                      instance_count=int(info.instanceCount)))
        return found

    def _read_instances(self, handle: object, total_bytes: int,
                        c: _Calls) -> tuple[tuple[GpuInstance, ...], bool]:
        """The GPU instances, and whether the layout was read in full (instances whose
        owners cannot be found must not be published as free)."""
        nv = self._nv
        found = self._read_mig_devices(handle, c)
        known = found is not None
        cis_by_gi = found or {}
        result: list[GpuInstance] = []
        for prof in self._profiles(handle, c):
            if prof.instance_count <= 0:
                continue
            if prof.instance_count > MAX_GPU_INSTANCES:
                c.errors.append(NvmlCallError("nvmlDeviceGetGpuInstanceProfileInfo",
                                              f"InstanceCount({prof.instance_count})"))
                known = False
                continue
            # ctypes out-parameters, as nvmlDeviceGetGpuInstances is documented to take.
            array = (nv.c_nvmlGpuInstance_t * prof.instance_count)()
            count = ctypes.c_uint(0)
            ok = c.call("nvmlDeviceGetGpuInstances", nv.nvmlDeviceGetGpuInstances,
                        handle, prof.id, array, ctypes.byref(count), quiet=("NotFound",))
            if ok is None:
                continue
            if count.value > prof.instance_count:
                c.errors.append(NvmlCallError("nvmlDeviceGetGpuInstances",
                                              f"Count({count.value}>{prof.instance_count})"))
                known = False
            name = profile_name(prof.slice_count, prof.memory_mib, total_bytes,
                                profile_suffix(nv, prof.index))
            for k in range(min(count.value, prof.instance_count)):
                info = c.call("nvmlGpuInstanceGetInfo", nv.nvmlGpuInstanceGetInfo, array[k])
                if info is None:
                    continue
                gi_id = int(info.id)
                result.append(GpuInstance(
                    gi_id=gi_id, profile=name, profile_id=prof.id,
                    slice_count=prof.slice_count, memory_bytes=prof.memory_mib * MIB,
                    placement=MigPlacement(int(info.placement.start), int(info.placement.size)),
                    compute_instances=tuple(cis_by_gi.get(gi_id, ()))))
        result.sort(key=lambda gi: (gi.placement.start, gi.gi_id))
        return tuple(result), known

    def _read_mig_devices(self, handle: object, c: _Calls
                          ) -> dict[int, list[ComputeInstance]] | None:
        """Compute instances via MIG device handles: they carry the ``MIG-`` UUIDs that
        PodResources reports, and per-instance processes and memory. None when they
        cannot be listed (then no instance's owner is known)."""
        nv = self._nv
        by_gi: dict[int, list[ComputeInstance]] = {}
        max_count = c.call("nvmlDeviceGetMaxMigDeviceCount", nv.nvmlDeviceGetMaxMigDeviceCount,
                           handle)
        if max_count is None:
            return None
        if not 0 <= int(max_count) <= MAX_MIG_DEVICES:
            c.errors.append(NvmlCallError("nvmlDeviceGetMaxMigDeviceCount",
                                          f"Count({int(max_count)})"))
            return None
        for k in range(int(max_count)):
            # Unused MIG device slots answer NotFound: not an error.
            mig = c.call("nvmlDeviceGetMigDeviceHandleByIndex",
                         nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, k,
                         quiet=("NotFound", "InvalidArgument"))
            if mig is None:
                continue
            ci = _Calls(nv.NVMLError)
            gi_id = ci.call("nvmlDeviceGetGpuInstanceId", nv.nvmlDeviceGetGpuInstanceId, mig)
            ci_id = ci.call("nvmlDeviceGetComputeInstanceId", nv.nvmlDeviceGetComputeInstanceId,
                            mig)
            uuid = _nonblank(ci.call("nvmlDeviceGetUUID", nv.nvmlDeviceGetUUID, mig))
            if gi_id is None or ci_id is None or uuid is None:
                c.errors.extend(ci.errors)  # cannot attach it to an instance
                continue
            attrs = ci.call("nvmlDeviceGetAttributes", nv.nvmlDeviceGetAttributes, mig,
                            quiet=("NotSupported",))
            mem = ci.call("nvmlDeviceGetMemoryInfo", nv.nvmlDeviceGetMemoryInfo, mig)
            procs = ci.call("nvmlDeviceGetComputeRunningProcesses",
                            nv.nvmlDeviceGetComputeRunningProcesses, mig)
            by_gi.setdefault(int(gi_id), []).append(ComputeInstance(
                gi_id=int(gi_id), ci_id=int(ci_id), uuid=uuid,
                slice_count=None if attrs is None else int(attrs.computeInstanceSliceCount),
                memory_total_bytes=None if mem is None else int(mem.total),
                memory_used_bytes=None if mem is None else int(mem.used),
                processes=() if procs is None else self._processes(procs),
                errors=tuple(ci.errors), mig_index=k))
        for cis in by_gi.values():
            cis.sort(key=lambda x: x.ci_id)
        return by_gi

    @staticmethod
    def _processes(procs: list[Any]) -> tuple[GpuProcess, ...]:
        out: list[GpuProcess] = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            if used is not None and int(used) == _NOT_AVAILABLE_ULL:
                used = None
            out.append(GpuProcess(pid=int(p.pid), used_bytes=None if used is None else int(used)))
        return tuple(out)


class UnavailableReader:
    """A :class:`GpuReader` for a host where ``pynvml`` itself is missing: every read is an
    empty snapshot that says why, so the agent still runs and reports the problem."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def read(self) -> GpuSnapshot:
        return GpuSnapshot(error=self.reason)

    def close(self) -> None:
        return None


def load_default() -> GpuReader:
    """The adapter over the installed ``pynvml`` (or an :class:`UnavailableReader`)."""
    try:
        import pynvml
    except ImportError as e:  # the image always ships it; a dev box may not
        return UnavailableReader(f"pynvml not importable: {e}")
    return NvmlAdapter(pynvml)
