"""Build the node inventory from one NVML read and one PodResources read.

Pure apart from the injected ``pod_of_pid`` lookup: the agent passes the
``/proc``-reading one, tests pass a dict.

Attributing GPU memory to pods, per process:

1. the process's cgroup names its pod UID; the UID -> ``namespace/name`` map comes from
   the API server (PodResources does not carry UIDs);
2. otherwise, when the device the process runs on (a whole GPU or a MIG device) is held
   by exactly one pod according to PodResources, the process is that pod's;
3. otherwise it stays unattributed: it still counts in the GPU's ``used`` (NVML's
   device total), just not under any pod.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from nodeagent.cgroups import CgroupOwner
from nodeagent.growth import Growth, GrowthParams, Sample, analyze
from nodeagent.nvml import MIB, GpuDevice, GpuProcess, GpuSnapshot
from nodeagent.podresources import PodResourcesView
from packing.inventory import GpuInventory, Inventory, PodGpuUsage
from packing.model import GpuMode, MigInstance

log = logging.getLogger(__name__)


def product_label(name: str) -> str:
    """NVML's product name as GPU Feature Discovery writes ``nvidia.com/gpu.product``."""
    return name.strip().replace(" ", "-")


def to_mib(n_bytes: int) -> int:
    return n_bytes // MIB


@dataclass(frozen=True)
class PoolUsage:
    """Memory one pod uses in one memory pool: a whole GPU or one MIG device."""

    pod: str
    gpu_index: int
    gpu_uuid: str
    pool_uuid: str  # the GPU UUID, or the MIG device UUID
    used_bytes: int
    pool_total_bytes: int  # 0 when NVML could not say (a MIG device's memory call failed)
    pool_used_bytes: int


@dataclass(frozen=True)
class _Pool:
    gpu: GpuDevice
    uuid: str
    total: int
    used: int
    processes: tuple[GpuProcess, ...]


def _pools(dev: GpuDevice) -> list[_Pool]:
    assert dev.uuid is not None and dev.memory_total_bytes is not None
    if not dev.mig_enabled:
        return [_Pool(dev, dev.uuid, dev.memory_total_bytes, dev.memory_used_bytes or 0,
                      dev.processes)]
    return [
        _Pool(dev, ci.uuid, ci.memory_total_bytes or 0, ci.memory_used_bytes or 0, ci.processes)
        for gi in dev.gpu_instances for ci in gi.compute_instances
    ]


def index_ids(snapshot: GpuSnapshot) -> dict[str, str]:
    """The device plugin's index ids (``deviceIDStrategy: index``) mapped to UUIDs.

    The plugin names GPU ``i`` of NVML's enumeration ``"i"`` and the MIG device it gets
    from ``nvmlDeviceGetMigDeviceHandleByIndex(gpu i, k)`` ``"i:k"``; the agent walks
    the same calls, so the same ids name the same devices."""
    out: dict[str, str] = {}
    for dev in snapshot.devices:
        if dev.uuid is None:
            continue
        out[str(dev.index)] = dev.uuid
        for gi in dev.gpu_instances:
            for ci in gi.compute_instances:
                if ci.mig_index is not None:
                    out[f"{dev.index}:{ci.mig_index}"] = ci.uuid
    return out


def device_uuids(dev: GpuDevice) -> list[str]:
    """The UUIDs PodResources may name for ``dev``: the GPU's and its MIG devices'."""
    return [u for u in (dev.uuid, *(ci.uuid for gi in dev.gpu_instances
                                    for ci in gi.compute_instances)) if u]


def ambiguous_devices(snapshot: GpuSnapshot) -> dict[int, str]:
    """GPUs (by index) whose UUID, or one of whose MIG devices' UUIDs, is reported twice,
    and why. PodResources names devices by UUID only, so such GPUs' pods cannot be told
    apart: they are left out of the inventory rather than published with guessed (or
    no) owners."""
    where: dict[str, list[int]] = {}
    for dev in snapshot.devices:
        if dev.uuid is None:
            continue
        for u in device_uuids(dev):
            where.setdefault(u, []).append(dev.index)
    out: dict[int, str] = {}
    for u, indexes in where.items():
        if len(indexes) > 1:
            for i in indexes:
                others = sorted(set(indexes))
                out.setdefault(i, f"UUID {u[:48]} reported {len(indexes)} times (gpus "
                                  f"{', '.join(map(str, others))}); GPU left out")
    return out


def usable(dev: GpuDevice) -> bool:
    """A GPU with identity, memory and MIG layout known, and not lost; others are reported
    only as errors (a GPU whose MIG mode could not be read is not published as a free
    whole GPU, nor one that fell off the bus midway through its read as a healthy one)."""
    return (dev.uuid is not None and dev.memory_total_bytes is not None
            and dev.memory_used_bytes is not None and dev.layout_known and not dev.lost)


def attribute_memory(snapshot: GpuSnapshot, view: PodResourcesView,
                     pod_of_pid: Callable[[int], CgroupOwner | None],
                     pod_names: Mapping[str, str]) -> tuple[list[PoolUsage], set[str]]:
    """Per (pod, pool) memory, and the pod UIDs seen in cgroups but missing from
    ``pod_names`` (the caller refreshes its map when that set is not empty)."""
    holders = view.pods_by_uuid()
    sums: dict[tuple[str, str], int] = {}
    pools: dict[str, _Pool] = {}
    unknown_uids: set[str] = set()
    ambiguous = ambiguous_devices(snapshot)
    for dev in snapshot.devices:
        if not usable(dev) or dev.index in ambiguous:
            continue
        for pool in _pools(dev):
            pools[pool.uuid] = pool
            held = holders.get(pool.uuid, ())
            for proc in pool.processes:
                pod: str | None = None
                ref = pod_of_pid(proc.pid)
                if ref is not None:
                    pod = pod_names.get(ref.pod_uid)
                    if pod is None:
                        unknown_uids.add(ref.pod_uid)
                if pod is None and len(held) == 1:
                    pod = held[0]
                if pod is None:
                    continue
                key = (pod, pool.uuid)
                sums[key] = sums.get(key, 0) + (proc.used_bytes or 0)
    # Pods holding a device with no process on it yet still occupy it: report them at 0.
    for uuid, pods in holders.items():
        if uuid in pools:
            for pod in pods:
                sums.setdefault((pod, uuid), 0)
    usages = [
        PoolUsage(pod=pod, gpu_index=pools[uuid].gpu.index,
                  gpu_uuid=pools[uuid].gpu.uuid or "", pool_uuid=uuid, used_bytes=used,
                  pool_total_bytes=pools[uuid].total, pool_used_bytes=pools[uuid].used)
        for (pod, uuid), used in sorted(sums.items())
    ]
    return usages, unknown_uids


@dataclass
class UsageHistory:
    """Per (pod, pool) memory series across intervals, for peaks and growth."""

    params: GrowthParams = field(default_factory=GrowthParams)
    max_samples: int = 240
    _series: dict[tuple[str, str], deque[Sample]] = field(default_factory=dict)
    _peaks: dict[tuple[str, str], int] = field(default_factory=dict)
    # Ticks a series may go unseen before it is dropped: one failed NVML or PodResources
    # read must not reset a pod's peak (the extender sizes time-sliced pods by it).
    grace_ticks: int = 3
    _missed: dict[tuple[str, str], int] = field(default_factory=dict)

    def update(self, now: float, usages: Iterable[PoolUsage]) -> dict[tuple[str, str], Growth]:
        """Record this interval's usages and return each one's trend. Series of pods not
        seen for more than ``grace_ticks`` ticks are dropped (a pod that comes back after
        that starts afresh)."""
        result: dict[tuple[str, str], Growth] = {}
        seen: set[tuple[str, str]] = set()
        stepped_back = False
        for u in usages:
            key = (u.pod, u.pool_uuid)
            seen.add(key)
            series = self._series.setdefault(key, deque(maxlen=self.max_samples))
            if series and now < series[-1].t:
                # The clock went back: samples "from the future" would stay in the window
                # and turn the fit's time span negative (a leak hidden for an hour) or
                # pair old and new samples into a false slope. Start the series afresh;
                # its peak is kept.
                self._peaks[key] = max(self._peaks.get(key, 0),
                                       max(s.used_bytes for s in series))
                series.clear()
                stepped_back = True
            if len(series) == series.maxlen:
                # The oldest sample is about to fall out of a full series (short
                # intervals): fold it into the peak first, or a spike is forgotten
                # before the window ends.
                self._peaks[key] = max(self._peaks.get(key, 0), series[0].used_bytes)
            series.append(Sample(now, u.used_bytes))
            while series and series[0].t < now - self.params.window_s:
                old = series.popleft()
                self._peaks[key] = max(self._peaks.get(key, 0), old.used_bytes)
            # An unknown pool size is no time to exhaustion (0 would be "full now").
            free = (None if u.pool_total_bytes <= 0
                    else max(0, u.pool_total_bytes - u.pool_used_bytes))
            result[key] = analyze(list(series), free, self._peaks.get(key, 0), self.params)
        if stepped_back:
            log.warning("the clock went back to %.0f: memory series restarted (peaks kept)",
                        now)
        for key in list(self._series):
            if key in seen:
                self._missed.pop(key, None)
                continue
            self._missed[key] = self._missed.get(key, 0) + 1
            if self._missed[key] > self.grace_ticks:
                del self._series[key]
                self._peaks.pop(key, None)
                del self._missed[key]
        return result


@dataclass(frozen=True)
class Report:
    """One interval's result: the inventory plus the per-pod detail behind it."""

    inventory: Inventory
    usages: tuple[PoolUsage, ...]
    growth: Mapping[tuple[str, str], Growth]
    snapshot: GpuSnapshot


# The inventory is one annotation, and a Node's annotations hold 256 KiB in all: a flood
# of errors (a garbled process list: one per entry) must not make it unwritable, which
# would lose every GPU's report with it.
MAX_ERRORS = 40  # error lines published; the rest are counted in one more line
MAX_ERROR_CHARS = 400  # characters of one line


def _bounded(errors: list[str]) -> tuple[str, ...]:
    """At most ``MAX_ERRORS`` lines of at most ``MAX_ERROR_CHARS`` characters, plus one
    that counts those left out."""
    out = [e if len(e) <= MAX_ERROR_CHARS else e[:MAX_ERROR_CHARS - 3] + "..."
           for e in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        out.append(f"{len(errors) - MAX_ERRORS} more error(s) not listed (NVML's are counted "
                   "in the agent's metrics)")
    return tuple(out)


def _errors(snapshot: GpuSnapshot, view: PodResourcesView) -> list[str]:
    out: list[str] = []
    if snapshot.error:
        out.append(f"nvml: {snapshot.error}")
    out.extend(f"nvml: {e}" for e in snapshot.errors)
    for dev in snapshot.devices:
        errs = list(dev.errors)
        for gi in dev.gpu_instances:
            for ci in gi.compute_instances:
                errs.extend(ci.errors)
        out.extend(f"gpu {dev.index}: {e}" for e in errs)
    out.extend(f"gpu {i}: {why}" for i, why in sorted(ambiguous_devices(snapshot).items()))
    if view.error:
        out.append(view.error)
    return out


def gpu_mode(dev: GpuDevice, shared_uuids: frozenset[str]) -> GpuMode:
    if dev.mig_enabled:
        return GpuMode.MIG
    return GpuMode.SHARED if dev.uuid in shared_uuids else GpuMode.WHOLE


def capped_usage(pod: str, used_mib: int, peak_mib: int, memory_mib: int
                 ) -> tuple[PodGpuUsage, str | None]:
    """A pod's figures on a GPU, at most the GPU's memory, and why when capped: NVML's
    per-process figures can add up past the GPU (a process counted twice, a driver bug),
    and one such figure would make the extender refuse the node's whole inventory. The
    reason names the bound, not the figures: those change every interval (each would be
    a Node patch); the pod's metrics carry them uncapped."""
    if used_mib <= memory_mib and peak_mib <= memory_mib:
        return PodGpuUsage(pod=pod, used_mib=used_mib, peak_mib=peak_mib), None
    return (PodGpuUsage(pod=pod, used_mib=min(used_mib, memory_mib),
                        peak_mib=min(peak_mib, memory_mib)),
            f"pod {pod}: GPU memory used or peak above the GPU's {memory_mib} MiB; capped")


def build_inventory(node: str, ts: int, snapshot: GpuSnapshot, view: PodResourcesView,
                    usages: Iterable[PoolUsage],
                    growth: Mapping[tuple[str, str], Growth]) -> Inventory:
    holders = view.pods_by_uuid()
    by_gpu: dict[str, dict[str, tuple[int, int]]] = {}  # gpu uuid -> pod -> (used, peak)
    for u in usages:
        g = growth.get((u.pod, u.pool_uuid))
        peak = g.peak_bytes if g is not None else u.used_bytes
        per_pod = by_gpu.setdefault(u.gpu_uuid, {})
        used0, peak0 = per_pod.get(u.pod, (0, 0))
        # A pod on several MIG devices of one GPU: sum both figures (peaks of different
        # instances need not coincide, so the sum is an upper bound).
        per_pod[u.pod] = (used0 + u.used_bytes, peak0 + max(peak, u.used_bytes))
    gpus: list[GpuInventory] = []
    capped: list[str] = []
    ambiguous = ambiguous_devices(snapshot)
    for dev in snapshot.devices:
        if not usable(dev) or dev.index in ambiguous:
            continue
        assert dev.uuid is not None and dev.memory_total_bytes is not None
        memory_mib = to_mib(dev.memory_total_bytes)
        mig = tuple(
            MigInstance(profile=gi.profile, start=gi.placement.start,
                        owner=next((p for u in gi.uuids for p in holders.get(u, ())), None))
            for gi in dev.gpu_instances)
        pods: list[PodGpuUsage] = []
        for pod, (used, peak) in sorted(by_gpu.get(dev.uuid, {}).items()):
            usage, why = capped_usage(pod, to_mib(used), to_mib(peak), memory_mib)
            pods.append(usage)
            if why is not None:
                capped.append(f"gpu {dev.index}: {why}")
        gpus.append(GpuInventory(
            index=dev.index, uuid=dev.uuid,
            model=product_label(dev.name or "unknown") or "unknown",
            memory_mib=memory_mib,
            used_mib=to_mib(dev.memory_used_bytes or 0),
            mode=gpu_mode(dev, view.shared_uuids), mig=mig, pods=tuple(pods)))
    return Inventory(node=node, ts=ts, gpus=tuple(gpus),
                     errors=_bounded(_errors(snapshot, view) + capped
                                     + _unknown_devices(snapshot, holders)))


def _unknown_devices(snapshot: GpuSnapshot, holders: Mapping[str, Iterable[str]]
                     ) -> list[str]:
    """One error per device the kubelet says a pod holds that NVML does not list (a GPU
    lost or replaced, a MIG device re-created under a new UUID): its pod's memory is not
    attributed, and its slice or GPU is counted by nobody."""
    if snapshot.error:
        return []  # NVML listed nothing: that one error says it
    # Where a MIG layout could not be read, its MIG devices are unknown already (an
    # error says so): only whole GPUs are judged then.
    mig_judged = all(d.layout_known for d in snapshot.devices)
    known = {u for d in snapshot.devices for u in device_uuids(d)}
    return [f"PodResources: {', '.join(sorted(pods))[:120]} hold(s) device {uuid[:48]}, "
            "which NVML does not list"
            for uuid, pods in sorted(holders.items())
            if (uuid.startswith("GPU-") or (mig_judged and uuid.startswith("MIG-")))
            and uuid not in known]
