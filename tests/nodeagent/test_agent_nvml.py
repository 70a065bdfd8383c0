"""The NVML adapter against the recorded fake: MIG layout, time-slicing, a lost GPU,
no driver, and the read-only guarantee."""

from __future__ import annotations

import re
from pathlib import Path

import pynvml
import pytest
from fake_nvml import (
    GIB,
    H100_TOTAL,
    H100_UUID,
    L40S_UUID,
    MIG_1G_A,
    MIG_3G,
    FakeGpu,
    FakeNvml,
    h100_mig,
    l40s_shared,
    mixed_node,
    no_driver,
)

import nodeagent.nvml as nvml_mod
from nodeagent.nvml import MIB, MigPlacement, NvmlAdapter, mig_memory_gb, profile_name


def test_h100_mig_layout_profiles_and_placements() -> None:
    snap = NvmlAdapter(FakeNvml([h100_mig()])).read()
    assert snap.error is None and snap.driver_version == "550.90.07"
    (dev,) = snap.devices
    assert (dev.uuid, dev.name, dev.mig_current, dev.mig_pending) == (
        H100_UUID, "NVIDIA H100 80GB HBM3", True, True)
    assert dev.errors == ()
    layout = [(gi.profile, gi.placement) for gi in dev.gpu_instances]
    assert layout == [
        ("2g.20gb", MigPlacement(0, 2)),
        ("1g.10gb", MigPlacement(2, 1)),
        ("1g.10gb", MigPlacement(3, 1)),
        ("3g.40gb", MigPlacement(4, 4)),
    ]
    three_g = dev.gpu_instances[3]
    (ci,) = three_g.compute_instances
    assert ci.uuid == MIG_3G and ci.slice_count == 3
    assert [(p.pid, p.used_bytes) for p in ci.processes] == [(4101, 30 * GIB)]
    one_g = dev.gpu_instances[1]
    assert one_g.uuids == (MIG_1G_A,)
    assert [p.pid for p in one_g.compute_instances[0].processes] == [4202]
    assert dev.processes == ()  # on MIG, processes live in the instances


def test_profile_name_comes_from_slices_and_memory_not_nvml_name() -> None:
    # The fake's info.name is garbage ("MIG 1g.?gb"); the names above still came out right.
    assert profile_name(1, 9984, H100_TOTAL) == "1g.10gb"
    assert profile_name(1, 20096, H100_TOTAL) == "1g.20gb"
    assert profile_name(7, 81152, H100_TOTAL) == "7g.80gb"


@pytest.mark.parametrize(
    ("mig_mib", "device_mib", "gb"),
    [
        (4864, 40536, 5),  # A100-40GB 1g.5gb
        (9984, 81559, 10),  # H100-80GB 1g.10gb
        (40448, 81559, 40),  # H100-80GB 3g.40gb
        (16384, 143771, 18),  # H200 1g.18gb
        (33024, 143771, 35),  # H200 1g.35gb
        (71168, 143771, 71),  # H200 3g.71gb: x.5 rounds up, as in NVIDIA's Go code
        (143104, 143771, 141),  # H200 7g.141gb
        (5952, 24258, 6),  # A30 1g.6gb
    ],
)
def test_mig_memory_gb_matches_nvidia_names(mig_mib: int, device_mib: int, gb: int) -> None:
    assert mig_memory_gb(mig_mib, device_mib * MIB) == gb


def test_media_extension_profile_gets_suffix() -> None:
    gpu = h100_mig()
    gpu.gis = [gpu.gis[0]]
    from fake_nvml import FakeComputeInstance, FakeGpuInstance

    gpu.gis.append(FakeGpuInstance(7, 20, 0, 1, [FakeComputeInstance(
        0, "MIG-aaaaaaaa-bbbb-5ccc-8ddd-eeeeeeeeeeee", 1, 9984 * MIB, 0)]))
    (dev,) = NvmlAdapter(FakeNvml([gpu])).read().devices
    assert [gi.profile for gi in dev.gpu_instances] == ["1g.10gb+me", "3g.40gb"]


def test_l40s_time_sliced_processes() -> None:
    (dev,) = NvmlAdapter(FakeNvml([l40s_shared()])).read().devices
    assert dev.uuid == L40S_UUID and dev.mig_current is None and dev.gpu_instances == ()
    assert [(p.pid, p.used_bytes // GIB) for p in dev.processes] == [
        (5101, 8), (5102, 12), (5103, 4)]
    assert dev.errors == ()  # MIG NotSupported is a fact, not an error


def test_lost_gpu_is_reported_and_others_still_read() -> None:
    fake = mixed_node()
    snap = NvmlAdapter(fake).read()
    assert [d.uuid for d in snap.devices] == [H100_UUID, L40S_UUID, None]
    lost = snap.devices[2]
    assert lost.error == "nvmlDeviceGetUUID: GpuIsLost"
    # After GpuIsLost the adapter stops asking that device (each call would time out).
    assert len(lost.errors) == 1
    assert snap.devices[0].errors == () and snap.devices[1].errors == ()


def test_partial_failure_keeps_the_device() -> None:
    gpu = l40s_shared()
    gpu.failing["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NO_PERMISSION
    (dev,) = NvmlAdapter(FakeNvml([gpu])).read().devices
    assert dev.uuid == L40S_UUID and dev.memory_total_bytes is not None
    assert [str(e) for e in dev.errors] == ["nvmlDeviceGetComputeRunningProcesses: NoPermission"]


def test_no_driver_gives_empty_snapshot_and_retries() -> None:
    fake = no_driver()
    adapter = NvmlAdapter(fake)
    snap = adapter.read()
    assert snap.devices == () and snap.error is not None and "DriverNotLoaded" in snap.error
    fake.init_error = None  # the driver container finished loading
    fake.gpus = [l40s_shared()]
    assert [d.uuid for d in adapter.read().devices] == [L40S_UUID]
    adapter.close()
    assert fake.calls[-1] == "nvmlShutdown"


def test_unused_mig_slots_and_missing_processes_field() -> None:
    gpu = FakeGpu(name="NVIDIA A100-SXM4-40GB", uuid="GPU-x", total_bytes=40536 * MIB,
                  used_bytes=0, mig_supported=True, mig_current=1, mig_pending=1)
    (dev,) = NvmlAdapter(FakeNvml([gpu])).read().devices
    assert dev.mig_enabled and dev.gpu_instances == () and dev.errors == ()


MUTATING = re.compile(
    r"nvml(DeviceSetMigMode|DeviceCreateGpuInstance\w*|GpuInstanceCreateComputeInstance\w*|"
    r"GpuInstanceDestroy|ComputeInstanceDestroy|DeviceResetGpuLockedClocks|DeviceReset\w*|"
    r"DeviceSet\w+|DeviceClear\w+)")


def test_adapter_source_never_names_a_mutating_call() -> None:
    source = Path(nvml_mod.__file__).read_text()
    assert MUTATING.search(source) is None


def test_adapter_calls_only_getters() -> None:
    fake = mixed_node()
    NvmlAdapter(fake).read()
    assert fake.calls and all(
        c in ("nvmlInit", "nvmlShutdown") or "Get" in c for c in fake.calls)


# ---- answers NVML should not give, found by a fault-injection review --------------------


class Overridden:
    """The fake with some calls replaced: everything else passes through."""

    def __init__(self, fake: FakeNvml, **calls: object) -> None:
        self._fake = fake
        self._calls = calls

    def __getattr__(self, name: str) -> object:
        return self._calls.get(name) or getattr(self._fake, name)


def _raise(exc: BaseException) -> object:
    def call(*args: object) -> object:
        raise exc
    return call


def _inventory_gpus(snap: object) -> list[str]:
    from nodeagent.podresources import PodResourcesView
    from nodeagent.report import build_inventory
    from packing.inventory import decode_inventory, encode_inventory

    inv = build_inventory("n", 1, snap, PodResourcesView(), [], {})  # type: ignore[arg-type]
    assert decode_inventory(encode_inventory(inv)) == inv  # always publishable
    return [g.uuid for g in inv.gpus]


def _mig_fake(**failing: int) -> FakeNvml:
    gpu = h100_mig()
    gpu.failing.update(failing)
    return FakeNvml([gpu, l40s_shared()])


@pytest.mark.parametrize(
    ("fake", "error"),
    [
        # MIG mode unreadable: not "MIG off", so not a free whole GPU.
        (_mig_fake(nvmlDeviceGetMigMode=pynvml.NVML_ERROR_UNKNOWN),
         "nvmlDeviceGetMigMode: Unknown"),
        # MIG devices not listable: instances would look unowned.
        (_mig_fake(nvmlDeviceGetMaxMigDeviceCount=pynvml.NVML_ERROR_UNKNOWN),
         "nvmlDeviceGetMaxMigDeviceCount: Unknown"),
    ],
)
def test_a_gpu_whose_mig_state_is_unknown_is_left_out_and_said(fake: FakeNvml,
                                                               error: str) -> None:
    snap = NvmlAdapter(fake).read()
    assert error in [str(e) for e in snap.devices[0].errors]
    assert not snap.devices[0].layout_known
    assert _inventory_gpus(snap) == [L40S_UUID]


def test_garbage_mig_device_count_is_bounded() -> None:
    fake = _mig_fake()
    adapter = NvmlAdapter(Overridden(fake, nvmlDeviceGetMaxMigDeviceCount=lambda h: 0xFFFFFFFF))
    snap = adapter.read()
    assert "nvmlDeviceGetMaxMigDeviceCount: Count(4294967295)" in [
        str(e) for e in snap.devices[0].errors]
    assert fake.calls.count("nvmlDeviceGetMigDeviceHandleByIndex") == 0
    assert _inventory_gpus(snap) == [L40S_UUID]


def test_a_mig_gpu_with_zero_memory_is_left_out_not_a_crash() -> None:
    gpu = h100_mig()
    gpu.total_bytes = 0
    snap = NvmlAdapter(FakeNvml([gpu, l40s_shared()])).read()
    assert "mig-layout: DeviceMemoryUnknown" in [str(e) for e in snap.devices[0].errors]
    assert _inventory_gpus(snap) == [L40S_UUID]


@pytest.mark.parametrize(
    ("exc", "name"),
    [
        (getattr(pynvml, "NVMLLibraryMismatchError", RuntimeError)("no _v3 symbol"),
         getattr(pynvml, "NVMLLibraryMismatchError", RuntimeError).__name__),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), "UnicodeDecodeError"),
        (pynvml.NVMLError(1234), "NVMLError(1234)"),
    ],
)
def test_an_unexpected_exception_fails_one_call_not_the_read(exc: BaseException,
                                                             name: str) -> None:
    fake = FakeNvml([l40s_shared()])
    snap = NvmlAdapter(Overridden(fake, nvmlDeviceGetComputeRunningProcesses=_raise(exc))).read()
    (dev,) = snap.devices
    assert [str(e) for e in dev.errors] == [f"nvmlDeviceGetComputeRunningProcesses: {name}"]
    assert _inventory_gpus(snap) == [L40S_UUID]


def test_blank_uuid_and_name_never_make_an_undecodable_inventory() -> None:
    blank_uuid, blank_name = l40s_shared(), l40s_shared()
    blank_uuid.uuid = ""
    blank_name.name = "   "
    blank_name.uuid = "GPU-00000000-0000-0000-0000-00000000abcd"
    snap = NvmlAdapter(FakeNvml([blank_uuid, blank_name])).read()
    assert snap.devices[0].uuid is None and snap.devices[1].name is None
    assert _inventory_gpus(snap) == [blank_name.uuid]


def test_after_a_global_failure_the_next_read_initialises_nvml_again() -> None:
    fake = FakeNvml([l40s_shared()])
    failing = {"on": True}

    def count() -> int:
        if failing["on"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return int(fake.nvmlDeviceGetCount())

    adapter = NvmlAdapter(Overridden(fake, nvmlDeviceGetCount=count))
    assert adapter.read().error is not None
    failing["on"] = False
    assert [d.uuid for d in adapter.read().devices] == [L40S_UUID]
    assert fake.calls.count("nvmlInit") == 2 and "nvmlShutdown" in fake.calls


def test_metrics_count_a_listing_failure_once_and_no_success_without_a_gpu() -> None:
    from nodeagent.metrics import AgentMetrics
    from nodeagent.podresources import PodResourcesView

    fake = FakeNvml([l40s_shared()])
    bad_count = Overridden(fake, nvmlDeviceGetCount=_raise(
        pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)))
    metrics = AgentMetrics()
    metrics.update(10.0, NvmlAdapter(bad_count).read(), PodResourcesView(), [], {})
    value = metrics.registry.get_sample_value
    assert value("gpupack_agent_nvml_errors_total", {"call": "nvmlDeviceGetCount"}) == 1.0
    assert value("gpupack_agent_nvml_errors_total", {"call": "nvmlInit"}) is None
    lost = l40s_shared()
    lost.lost = True
    metrics.update(20.0, NvmlAdapter(FakeNvml([lost])).read(), PodResourcesView(), [], {})
    assert value("gpupack_agent_last_success_timestamp_seconds") in (None, 0.0)
    metrics.update(30.0, NvmlAdapter(FakeNvml([l40s_shared()])).read(), PodResourcesView(),
                   [], {})
    assert value("gpupack_agent_last_success_timestamp_seconds") == 30.0


# ---- a second fault-injection review: failures midway, garbage values ------------------


def _fails_from(fake: FakeNvml, call: str, n: int, code: int) -> object:
    """``call`` of ``fake`` answering its first ``n`` calls and raising ``code`` from the
    (n+1)-th on: NVML failing midway through a loop."""
    real = getattr(fake, call)
    seen = [0]

    def fn(*args: object) -> object:
        seen[0] += 1
        if seen[0] > n:
            raise pynvml.NVMLError(code)
        return real(*args)
    return fn


def _with(fake: FakeNvml, **calls: object) -> Overridden:
    return Overridden(fake, **calls)


def _midway(call: str, n: int, code: int) -> Overridden:
    fake = FakeNvml([h100_mig(), l40s_shared()])
    return _with(fake, **{call: _fails_from(fake, call, n, code)})


def _gpu_info(**fields: object) -> Overridden:
    """nvmlGpuInstanceGetInfo answering the real info with ``fields`` replaced."""
    from types import SimpleNamespace

    fake = FakeNvml([h100_mig(), l40s_shared()])

    def info(gi: object) -> object:
        real = fake.nvmlGpuInstanceGetInfo(gi)
        placement = SimpleNamespace(start=real.placement.start, size=real.placement.size)
        out = SimpleNamespace(id=real.id, placement=placement)
        for k, v in fields.items():
            setattr(placement if k in ("start", "size") else out, k, v)
        return out
    return _with(fake, nvmlGpuInstanceGetInfo=info)


def _h100(change: object) -> FakeNvml:
    gpu = h100_mig()
    change(gpu)  # type: ignore[operator]
    return FakeNvml([gpu, l40s_shared()])


def _memory(total: object, used: object, gpu: FakeGpu | None = None) -> Overridden:
    from types import SimpleNamespace

    fake = FakeNvml([gpu or l40s_shared(), h100_mig()])
    real = fake.nvmlDeviceGetMemoryInfo

    def mem(handle: object) -> object:
        if handle is fake.gpus[0]:
            return SimpleNamespace(total=total, used=used, free=0)
        return real(handle)
    return _with(fake, nvmlDeviceGetMemoryInfo=mem)


LOST, UNKNOWN, NO_PERM = (pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN,
                          pynvml.NVML_ERROR_NO_PERMISSION)


@pytest.mark.parametrize(
    ("nv", "error", "published"),
    [
        # Failing midway through the MIG loops: the slices or owners not read would be
        # published free (the extender places a pod on a slice in use).
        (_midway("nvmlDeviceGetGpuInstances", 1, LOST),
         "gpu 0: nvmlDeviceGetGpuInstances: GpuIsLost", [L40S_UUID]),
        (_midway("nvmlDeviceGetGpuInstances", 0, NO_PERM),
         "gpu 0: nvmlDeviceGetGpuInstances: NoPermission", [L40S_UUID]),
        (_midway("nvmlGpuInstanceGetInfo", 1, UNKNOWN),
         "gpu 0: nvmlGpuInstanceGetInfo: Unknown", [L40S_UUID]),
        (_midway("nvmlDeviceGetGpuInstanceProfileInfo", 2, UNKNOWN),
         "gpu 0: nvmlDeviceGetGpuInstanceProfileInfo: Unknown", [L40S_UUID]),
        (_midway("nvmlDeviceGetMigDeviceHandleByIndex", 0, UNKNOWN),
         "gpu 0: nvmlDeviceGetMigDeviceHandleByIndex: Unknown", [L40S_UUID]),
        (_midway("nvmlDeviceGetMigDeviceHandleByIndex", 1, LOST),
         "gpu 0: nvmlDeviceGetMigDeviceHandleByIndex: GpuIsLost", [L40S_UUID]),
        # Lost on a MIG device's own call: the GPU is gone, not one instance.
        (_midway("nvmlDeviceGetAttributes", 0, LOST),
         "gpu 0: nvmlDeviceGetAttributes: GpuIsLost", [L40S_UUID]),
        # Lost after its identity was read: not published as a healthy whole GPU.
        (_midway("nvmlDeviceGetComputeRunningProcesses", 4, LOST),
         "gpu 1: nvmlDeviceGetComputeRunningProcesses: GpuIsLost", [H100_UUID]),
        # Values no GPU has.
        (_h100(lambda g: setattr(g.gis[1], "start", 4)),
         "gpu 0: mig-layout: Overlap(gi 1 and gi 5)", [L40S_UUID]),
        (_h100(lambda g: setattr(g.gis[1], "start", 7)),
         "gpu 0: mig-layout: Placement(gi 5: start 7 size 2)", [L40S_UUID]),
        (_h100(lambda g: setattr(g.profiles[3], "memory_mib", 200_000)),
         "gpu 0: nvmlDeviceGetGpuInstanceProfileInfo: memorySizeMB(profile 1: 200000)",
         [L40S_UUID]),
        (_h100(lambda g: setattr(g.profiles[3], "slices", 0)),
         "gpu 0: nvmlDeviceGetGpuInstanceProfileInfo: sliceCount(profile 1: 0)", [L40S_UUID]),
        (_h100(lambda g: setattr(g, "mig_current", 7)),
         "gpu 0: nvmlDeviceGetMigMode: Mode([7, 1])", [L40S_UUID]),
        (_gpu_info(start=None), "gpu 0: nvmlGpuInstanceGetInfo: Info(", [L40S_UUID]),
        (_gpu_info(id="1"), "gpu 0: nvmlGpuInstanceGetInfo: Info(", [L40S_UUID]),
        (_memory(None, None), "gpu 0: nvmlDeviceGetMemoryInfo: Total(None)", [H100_UUID]),
        (_memory(2 << 40, 0), "gpu 0: nvmlDeviceGetMemoryInfo: Total(2199023255552)",
         [H100_UUID]),
        (_memory(46068 * MIB, "a lot"), "gpu 0: nvmlDeviceGetMemoryInfo: Used('a lot')",
         [H100_UUID]),
        # Above the total: capped (a full GPU), the inventory still decodes.
        (_memory(46068 * MIB, 50_000 * MIB), "gpu 0: nvmlDeviceGetMemoryInfo: Used(>Total)",
         [L40S_UUID, H100_UUID]),
        (_memory(46068 * MIB, -1), "gpu 0: nvmlDeviceGetMemoryInfo: Used(<0)", [H100_UUID]),
    ],
)
def test_a_gpu_read_wrong_is_left_out_named_and_the_others_published(
        nv: object, error: str, published: list[str]) -> None:
    snap = NvmlAdapter(nv).read()
    from nodeagent.podresources import PodResourcesView
    from nodeagent.report import build_inventory

    errors = build_inventory("n", 1, snap, PodResourcesView(), [], {}).errors
    assert any(e.startswith(error) for e in errors), errors
    assert _inventory_gpus(snap) == published


@pytest.mark.parametrize(
    ("count", "error", "handles"),
    [
        ("2", "nvmlDeviceGetCount: Count('2')", 0),  # crashed the read
        (-1, "nvmlDeviceGetCount: Count(-1)", 0),  # listed nothing, said nothing
        (100, "nvmlDeviceGetCount: Count(100>64)", 64),  # indices the decoder refuses
    ],
)
def test_a_garbage_gpu_count_is_named_and_bounded(count: object, error: str,
                                                 handles: int) -> None:
    fake = FakeNvml([l40s_shared()])
    snap = NvmlAdapter(_with(fake, nvmlDeviceGetCount=lambda: count)).read()
    assert error in [str(e) for e in snap.errors]
    assert fake.calls.count("nvmlDeviceGetHandleByIndex") == handles
    assert (snap.error is None) == (handles > 0)
    _inventory_gpus(snap)


@pytest.mark.parametrize(
    ("processes", "expected", "error"),
    [
        # A pid that is no pid: skipped, the others kept (it crashed the whole read).
        ([(None, GIB), (5101, 8 * GIB)], [(5101, 8 * GIB)], "Pid(None)"),
        ([(-4, GIB), (5101, 8 * GIB)], [(5101, 8 * GIB)], "Pid(-4)"),
        # Memory above the GPU's: unknown (summed into a pod it broke the inventory).
        ([(5101, 60 * GIB)], [(5101, None)], "UsedGpuMemory(pid 5101: out of range)"),
        ([(5101, -GIB)], [(5101, None)], "UsedGpuMemory(pid 5101: out of range)"),
        ([(5101, "8G")], [(5101, None)], "UsedGpuMemory(pid 5101: '8G')"),
        # A pid listed twice is counted once.
        ([(5101, 8 * GIB), (5101, 8 * GIB)], [(5101, 8 * GIB)], "DuplicatePid(5101)"),
    ],
)
def test_process_lists_are_checked_entry_by_entry(processes: list[tuple[object, object]],
                                                  expected: list[tuple[int, int | None]],
                                                  error: str) -> None:
    from types import SimpleNamespace

    fake = FakeNvml([l40s_shared()])
    procs = [SimpleNamespace(pid=p, usedGpuMemory=u) for p, u in processes]
    snap = NvmlAdapter(_with(fake, nvmlDeviceGetComputeRunningProcesses=lambda h: procs)).read()
    (dev,) = snap.devices
    assert [(p.pid, p.used_bytes) for p in dev.processes] == expected
    assert [str(e) for e in dev.errors] == [f"nvmlDeviceGetComputeRunningProcesses: {error}"]
    assert _inventory_gpus(snap) == [L40S_UUID]


def test_a_wrong_figure_is_published_stable_and_logged_once_while_it_lasts(
        caplog: pytest.LogCaptureFixture) -> None:
    # The figure changes every read: in the inventory's errors it made every interval a
    # change worth a Node patch. It is logged when the error starts, and again only
    # after the error went away and came back.
    gpu = l40s_shared()
    adapter = NvmlAdapter(FakeNvml([gpu]))
    texts = []
    for used in (50_000, 50_100, 20_000, 50_200):
        gpu.used_bytes = used * MIB
        texts.append([str(e) for e in adapter.read().all_errors()])
    assert texts == [["nvmlDeviceGetMemoryInfo: Used(>Total)"]] * 2 + [[]] + [
        ["nvmlDeviceGetMemoryInfo: Used(>Total)"]]
    logged = [r.getMessage() for r in caplog.records if "Used(>Total)" in r.getMessage()]
    assert logged == [
        f"NVML answered nvmlDeviceGetMemoryInfo: Used(>Total): used {n * MIB} > total "
        f"{46068 * MIB}" for n in (50_000, 50_200)]
