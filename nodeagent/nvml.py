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

Past 600 lines because it is the one module that touches ``pynvml`` (a test reads it for
mutating calls): every getter the agent needs, each with its error containment, is here.
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol, TypeVar

from packing.inventory import MAX_GPU_MIB
from packing.model import MAX_NODE_GPUS

log = logging.getLogger(__name__)

T = TypeVar("T")

MIB = 1024 * 1024
_GIB = 1024 * MIB

# NVML's "value not available" for 64-bit counters (pynvml maps it to None in newer
# releases; older ones pass it through).
_NOT_AVAILABLE_ULL = 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True)
class NvmlCallError:
    """One failed NVML call: which call, and NVML's error name (e.g. ``GpuIsLost``).

    ``detail`` carries figures that change from read to read (a used-memory figure): it
    is logged, never published, since an error text that differs every interval would
    make every inventory a change worth a Node patch."""

    call: str
    error: str
    detail: str | None = field(default=None, compare=False)

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
    def lost(self) -> bool:
        """NVML said GpuIsLost on some call about this GPU or one of its MIG devices: it
        fell off the bus and will not run anything until reset, whatever was read
        before."""
        errs = list(self.errors) + [e for gi in self.gpu_instances
                                    for ci in gi.compute_instances for e in ci.errors]
        return any(e.error == "GpuIsLost" for e in errs)

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
# The decoder refuses a whole inventory with a GPU above 1 TiB: such a figure is garbage.
MAX_GPU_BYTES = MAX_GPU_MIB * MIB
# Memory slices of a MIG GPU (A30: 4; A100, H100, H200, B200: 8): a placement or a profile
# beyond them is garbage, and a layout the extender would refuse whole.
MAX_MIG_SLICES = 8


def _int_or_none(value: object) -> int | None:
    """``value`` when it is an integer (pynvml hands out Python ints, ctypes fields
    included); None for anything else (None, a string, a float, a bool)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _shown(value: object) -> str:
    """``value`` for an error message, short: errors end up in the Node annotation."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_count(value: object, call: str, maximum: int) -> tuple[int | None, NvmlCallError | None]:
    """A count NVML answered: None when it is not a non-negative integer (nothing can
    be listed from it), capped at ``maximum`` (and said) when above it."""
    n = _int_or_none(value)
    if n is None or n < 0:
        return None, NvmlCallError(call, f"Count({_shown(value)})")
    if n > maximum:
        return maximum, NvmlCallError(call, f"Count({n}>{maximum})")
    return n, None


def check_memory(total: object, used: object, call: str
                 ) -> tuple[int | None, int | None, list[NvmlCallError]]:
    """(total, used) bytes of one memory answer, checked. A total outside (0, 1 TiB] is
    unknown (and so is used: it means nothing without it). A used figure that is not a
    non-negative integer is unknown; one above the total is capped at the total: the
    decoder refuses used > memory, and a full GPU is the safe thing to tell a
    scheduler."""
    t = _int_or_none(total)
    if t is None or not 0 < t <= MAX_GPU_BYTES:
        return None, None, [NvmlCallError(call, f"Total({_shown(total)})")]
    u = _int_or_none(used)
    if u is None:
        return t, None, [NvmlCallError(call, f"Used({_shown(used)})")]
    if u < 0:
        return t, None, [NvmlCallError(call, "Used(<0)", f"used {u}")]
    if u > t:
        return t, t, [NvmlCallError(call, "Used(>Total)", f"used {u} > total {t}")]
    return t, u, []


def check_mig_mode(modes: object, enable: int, disable: int
                   ) -> tuple[bool | None, bool | None, NvmlCallError | None]:
    """(current, pending) MIG modes of a ``nvmlDeviceGetMigMode`` answer; an error when
    it is not a pair of ENABLE/DISABLE values (an unknown value is not "MIG off": the
    GPU would be published as a free whole GPU)."""
    pair = tuple(modes) if isinstance(modes, list | tuple) else ()
    if len(pair) != 2 or any(_int_or_none(m) not in (enable, disable) for m in pair):
        return None, None, NvmlCallError("nvmlDeviceGetMigMode", f"Mode({_shown(modes)})")
    return pair[0] == enable, pair[1] == enable, None


def check_processes(procs: object, limit: int | None, call: str
                    ) -> tuple[tuple[GpuProcess, ...], list[NvmlCallError]]:
    """NVML's process list, checked entry by entry (a bad entry must not lose the
    others): one without a positive pid is skipped, a pid listed again is counted once,
    a memory figure that is negative or above the pool's memory (``limit``) is unknown
    (summed into a pod, it would exceed the GPU and make the inventory undecodable)."""
    if not isinstance(procs, list | tuple):
        return (), [NvmlCallError(call, f"Processes({_shown(procs)})")]
    out: dict[int, GpuProcess] = {}
    errors: list[NvmlCallError] = []
    for p in procs:
        raw_pid = getattr(p, "pid", None)
        pid = _int_or_none(raw_pid)
        if pid is None or pid <= 0:
            errors.append(NvmlCallError(call, f"Pid({_shown(raw_pid)})"))
            continue
        if pid in out:
            errors.append(NvmlCallError(call, f"DuplicatePid({pid})"))
            continue
        raw = getattr(p, "usedGpuMemory", None)
        used = _int_or_none(raw)
        if used == _NOT_AVAILABLE_ULL:
            used = None
        elif raw is not None and used is None:
            errors.append(NvmlCallError(call, f"UsedGpuMemory(pid {pid}: {_shown(raw)})"))
        elif used is not None and (used < 0 or (limit is not None and used > limit)):
            errors.append(NvmlCallError(call, f"UsedGpuMemory(pid {pid}: out of range)",
                                        f"used {used}, pool {limit}"))
            used = None
        out[pid] = GpuProcess(pid=pid, used_bytes=used)
    return tuple(out.values()), errors


def check_profile(index: int, info: object, total_bytes: int) -> _ProfileInfo | NvmlCallError:
    """One ``nvmlDeviceGetGpuInstanceProfileInfo`` answer, checked: the profile name is
    made of its slices and memory, so garbage there names an instance no catalog knows."""
    def checked(name: str, low: int, high: int | None) -> int | NvmlCallError:
        raw = getattr(info, name, None)
        value = _int_or_none(raw)
        if value is None or value < low or (high is not None and value > high):
            return NvmlCallError("nvmlDeviceGetGpuInstanceProfileInfo",
                                 f"{name}(profile {index}: {_shown(raw)})")
        return value

    pid = checked("id", 0, None)
    slices = checked("sliceCount", 1, MAX_MIG_SLICES)
    memory = checked("memorySizeMB", 1, total_bytes // MIB)
    count = checked("instanceCount", 0, None)
    for value in (pid, slices, memory, count):
        if isinstance(value, NvmlCallError):
            return value
    assert isinstance(pid, int) and isinstance(slices, int)  # for mypy: checked above
    assert isinstance(memory, int) and isinstance(count, int)
    return _ProfileInfo(index=index, id=pid, slice_count=slices, memory_mib=memory,
                        instance_count=count)


def layout_problems(instances: list[GpuInstance]) -> list[str]:
    """What makes a read MIG layout impossible: a placement outside the GPU's slices, two
    instances on one slice, one instance id twice. Published, such a layout makes the
    extender refuse the node's whole inventory, or place a pod on a slice in use."""
    problems: list[str] = []
    for gi in instances:
        p = gi.placement
        if p.start < 0 or p.size < 1 or p.start + p.size > MAX_MIG_SLICES:
            problems.append(f"Placement(gi {gi.gi_id}: start {p.start} size {p.size})")
    for k, a in enumerate(instances):
        for b in instances[k + 1:]:
            if a.gi_id == b.gi_id:
                problems.append(f"DuplicateGpuInstance({a.gi_id})")
            elif (max(a.placement.start, b.placement.start)
                  < min(a.placement.start + a.placement.size,
                        b.placement.start + b.placement.size)):
                problems.append(f"Overlap(gi {a.gi_id} and gi {b.gi_id})")
    return problems


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

    def memory(self, get: Callable[[object], object], handle: object
               ) -> tuple[int | None, int | None]:
        """(total, used) bytes of a GPU or MIG device, each None when not known (the
        call failed, or its answer is not memory figures: recorded)."""
        mem = self.call("nvmlDeviceGetMemoryInfo", get, handle)
        if mem is None:
            return None, None
        total, used, bad = check_memory(getattr(mem, "total", None),
                                        getattr(mem, "used", None),
                                        "nvmlDeviceGetMemoryInfo")
        self.errors.extend(bad)
        return total, used

    def processes(self, get: Callable[[object], object], handle: object,
                  limit: int | None) -> tuple[GpuProcess, ...]:
        """The compute processes of a GPU or MIG device, checked against its memory
        (``limit``); none when the call failed (recorded)."""
        call = "nvmlDeviceGetComputeRunningProcesses"
        procs = self.call(call, get, handle)
        if procs is None:
            return ()
        processes, bad = check_processes(procs, limit, call)
        self.errors.extend(bad)
        return processes


class NvmlAdapter:
    """:class:`GpuReader` over a ``pynvml``-compatible module (the real one, or a fake in
    tests)."""

    def __init__(self, nv: ModuleType | Any) -> None:
        self._nv = nv
        self._initialised = False
        self._logged: set[str] = set()  # errors whose detail was logged, while they last

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
        raw_count = top.call("nvmlDeviceGetCount", nv.nvmlDeviceGetCount)
        # A node has at most MAX_NODE_GPUS GPUs (the decoder refuses an index beyond): a
        # larger count is garbage, and only the indices that can be published are read.
        count, bad = (None, None) if raw_count is None else check_count(
            raw_count, "nvmlDeviceGetCount", MAX_NODE_GPUS)
        if bad is not None:
            top.errors.append(bad)
        if count is None:
            # The library may be gone under us (a driver reload): start over with
            # nvmlInit on the next read instead of failing every read from now on.
            self.close()
            return GpuSnapshot(errors=tuple(top.errors),
                               error="nvmlDeviceGetCount failed: GPUs cannot be listed")
        devices = tuple(self._read_device_contained(i) for i in range(count))
        snapshot = GpuSnapshot(devices=devices,
                               driver_version=None if driver is None else _text(driver),
                               errors=tuple(top.errors))
        self._log_details(snapshot)
        return snapshot

    def _log_details(self, snapshot: GpuSnapshot) -> None:
        """Log the figures behind a wrong answer once, when it starts (the published error
        names the field; the figure would repeat every interval)."""
        current = {str(e): e for e in snapshot.all_errors()}
        for text, e in current.items():
            if e.detail is not None and text not in self._logged:
                log.warning("NVML answered %s: %s", text, e.detail)
        self._logged = set(current)

    def _read_device_contained(self, index: int) -> GpuDevice:
        """:meth:`_read_device`, with an answer no check foresaw (an exception of ours)
        failing this GPU, not the read of every GPU."""
        try:
            return self._read_device(index)
        except Exception as e:
            # The message is logged once by _log_details; the trace on every read.
            log.debug("reading GPU %d failed", index, exc_info=True)
            return GpuDevice(index=index, uuid=None, name=None, memory_total_bytes=None,
                             memory_used_bytes=None, mig_current=None, mig_pending=None,
                             errors=(NvmlCallError("read", type(e).__name__, str(e)[:200]),),
                             layout_known=False)

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
        total, used = c.memory(nv.nvmlDeviceGetMemoryInfo, handle)
        # GPUs without MIG answer NotSupported: that is a fact, not a failure.
        before = len(c.errors)
        modes = c.call("nvmlDeviceGetMigMode", nv.nvmlDeviceGetMigMode, handle,
                       quiet=("NotSupported",))
        layout_known = not (modes is None and len(c.errors) > before)
        current: bool | None = None
        pending: bool | None = None
        if modes is not None:
            current, pending, bad_mode = check_mig_mode(
                modes, nv.NVML_DEVICE_MIG_ENABLE, nv.NVML_DEVICE_MIG_DISABLE)
            if bad_mode is not None:
                c.errors.append(bad_mode)
                layout_known = False
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
            processes = c.processes(nv.nvmlDeviceGetComputeRunningProcesses, handle, total)
        return GpuDevice(index=index, uuid=_nonblank(uuid), name=_nonblank(name),
                         memory_total_bytes=total,
                         memory_used_bytes=used, mig_current=current, mig_pending=pending,
                         gpu_instances=instances, processes=processes, errors=tuple(c.errors),
                         layout_known=layout_known)

    def _profiles(self, handle: object, total_bytes: int, c: _Calls) -> list[_ProfileInfo]:
        nv = self._nv
        found: list[_ProfileInfo] = []
        for index in range(int(nv.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            # A profile this GPU lacks answers NotSupported / InvalidArgument: skip it.
            info = c.call("nvmlDeviceGetGpuInstanceProfileInfo",
                          nv.nvmlDeviceGetGpuInstanceProfileInfo, handle, index,
                          quiet=("NotSupported", "InvalidArgument", "NotFound"))
            if info is None:
                continue
            prof = check_profile(index, info, total_bytes)
            if isinstance(prof, NvmlCallError):
                c.errors.append(prof)  # the caller counts the layout unknown
                continue
            found.append(prof)
        return found

    def _read_instances(self, handle: object, total_bytes: int,
                        c: _Calls) -> tuple[tuple[GpuInstance, ...], bool]:
        """The GPU instances, and whether the layout was read in full (instances whose
        owners cannot be found must not be published as free).

        Any failure on the way leaves the layout unknown: a profile, an instance or a MIG
        device that could not be read (or a GPU lost midway, after which every call is
        skipped) would otherwise show its slices free or its instance unowned, and the
        extender would place a pod there."""
        nv = self._nv
        before = len(c.errors)
        found = self._read_mig_devices(handle, c)
        known = found is not None
        cis_by_gi = found or {}
        result: list[GpuInstance] = []
        for prof in self._profiles(handle, total_bytes, c):
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
                placement = getattr(info, "placement", None)
                gi_id = _int_or_none(getattr(info, "id", None))
                start = _int_or_none(getattr(placement, "start", None))
                size = _int_or_none(getattr(placement, "size", None))
                if gi_id is None or start is None or size is None:
                    c.errors.append(NvmlCallError("nvmlGpuInstanceGetInfo", "Info(" + _shown(
                        (getattr(info, "id", None), getattr(placement, "start", None),
                         getattr(placement, "size", None))) + ")"))
                    continue
                result.append(GpuInstance(
                    gi_id=gi_id, profile=name, profile_id=prof.id,
                    slice_count=prof.slice_count, memory_bytes=prof.memory_mib * MIB,
                    placement=MigPlacement(start, size),
                    compute_instances=tuple(cis_by_gi.get(gi_id, ()))))
        result.sort(key=lambda gi: (gi.placement.start, gi.gi_id))
        c.errors.extend(NvmlCallError("mig-layout", p) for p in layout_problems(result))
        if found is not None:
            # A GPU instance without a compute instance (mig-parted stopped midway, or
            # someone created it by hand) is no device the device plugin offers: published
            # as a free slice, a pod would be counted on a device that does not exist.
            for gi in result:
                if not gi.compute_instances:
                    c.errors.append(NvmlCallError(
                        "mig-layout", f"GpuInstanceWithoutComputeInstance(gi {gi.gi_id}, "
                                      f"{gi.profile}@{gi.placement.start})"))
        # A MIG device of no listed instance: its instance is missing from the layout.
        # Its own errors (GpuIsLost ...) would be lost with it: they are the GPU's now.
        for g in sorted(set(cis_by_gi) - {gi.gi_id for gi in result}):
            c.errors.append(NvmlCallError("mig-layout", f"MigDeviceWithoutInstance(gi {g})"))
            c.errors.extend(e for ci in cis_by_gi[g] for e in ci.errors)
        known = known and len(c.errors) == before and not c.lost
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
        n = _int_or_none(max_count)
        if n is None or not 0 <= n <= MAX_MIG_DEVICES:
            c.errors.append(NvmlCallError("nvmlDeviceGetMaxMigDeviceCount",
                                          f"Count({_shown(max_count)})"))
            return None
        for k in range(n):
            # Unused MIG device slots answer NotFound: not an error.
            mig = c.call("nvmlDeviceGetMigDeviceHandleByIndex",
                         nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, k,
                         quiet=("NotFound", "InvalidArgument"))
            if mig is None:
                continue
            ci = _Calls(nv.NVMLError)
            raw_gi = ci.call("nvmlDeviceGetGpuInstanceId", nv.nvmlDeviceGetGpuInstanceId, mig)
            raw_ci = ci.call("nvmlDeviceGetComputeInstanceId", nv.nvmlDeviceGetComputeInstanceId,
                             mig)
            uuid = _nonblank(ci.call("nvmlDeviceGetUUID", nv.nvmlDeviceGetUUID, mig))
            gi_id, ci_id = _int_or_none(raw_gi), _int_or_none(raw_ci)
            if ci.lost:
                c.lost = True  # the whole GPU is gone: stop asking about it
            if gi_id is None or ci_id is None or uuid is None:
                c.errors.extend(ci.errors)  # cannot attach it to an instance
                if not ci.errors:  # answered, but not with ids
                    c.errors.append(NvmlCallError("nvmlDeviceGetGpuInstanceId", "Ids(" + _shown(
                        (raw_gi, raw_ci)) + ")"))
                continue
            attrs = ci.call("nvmlDeviceGetAttributes", nv.nvmlDeviceGetAttributes, mig,
                            quiet=("NotSupported",))
            total, used = ci.memory(nv.nvmlDeviceGetMemoryInfo, mig)
            processes = ci.processes(nv.nvmlDeviceGetComputeRunningProcesses, mig, total)
            slices = None if attrs is None else _int_or_none(
                getattr(attrs, "computeInstanceSliceCount", None))
            if ci.lost:
                c.lost = True
            by_gi.setdefault(gi_id, []).append(ComputeInstance(
                gi_id=gi_id, ci_id=ci_id, uuid=uuid, slice_count=slices,
                memory_total_bytes=total, memory_used_bytes=used, processes=processes,
                errors=tuple(ci.errors), mig_index=k))
        for cis in by_gi.values():
            cis.sort(key=lambda x: x.ci_id)
        return by_gi


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
