"""Small builders for packing tests: nodes, GPUs and pods with sensible defaults."""

from __future__ import annotations

from packing.catalog import get_model
from packing.model import (
    GpuInfo,
    GpuMode,
    GroupRef,
    MigInstance,
    MigReconfigure,
    NodeInfo,
    PodRequest,
    RequestKind,
)


def node(
    name: str,
    gpus: int = 8,
    model: str = "H100-80GB",
    mode: GpuMode = GpuMode.WHOLE,
    cpu: int = 128_000,
    mem: int = 1_048_576,
    replicas: int = 4,
    labels: dict[str, str] | None = None,
    layouts: dict[int, list[tuple[str, int]]] | None = None,
    reconfigurable: bool = True,
    reconfigure: MigReconfigure | None = None,
) -> NodeInfo:
    """A node of ``gpus`` GPUs. Solver tests want layouts that may change
    (``reconfigurable``: opted in, actuator on); ``reconfigure`` names any other case."""
    m = get_model(model)
    infos = []
    for i in range(gpus):
        mig = tuple(MigInstance(p, s) for p, s in (layouts or {}).get(i, []))
        infos.append(
            GpuInfo(i, m.name, m.memory_mib, mode, mig, replicas if mode is GpuMode.SHARED else 1)
        )
    if reconfigure is None:
        reconfigure = MigReconfigure.ON if reconfigurable else MigReconfigure.NOT_OPTED_IN
    return NodeInfo(name, cpu, mem, tuple(infos), labels or {}, mig_reconfigure=reconfigure)


def mig(key: str, profile: str = "1g.10gb", cpu: int = 1000, prio: int = 0) -> PodRequest:
    return PodRequest(
        key, cpu, 1024, RequestKind.MIG, mig_profile=profile, priority=prio, klass="small"
    )


def shared(key: str, milli: int = 250, gmem: int = 8192, cpu: int = 1000) -> PodRequest:
    return PodRequest(key, cpu, 1024, RequestKind.SHARED, gpu_milli=milli, gpu_memory_mib=gmem)


def whole(
    key: str, count: int = 1, cpu: int = 1000, prio: int = 0, group: GroupRef | None = None
) -> PodRequest:
    return PodRequest(
        key, cpu, 1024, RequestKind.WHOLE, gpu_count=count, priority=prio, group=group, klass="llm"
    )


def cpu_pod(key: str, cpu: int = 1000) -> PodRequest:
    return PodRequest(key, cpu, 1024)


def group(
    key: str,
    size: int,
    topology: str | None = None,
    exclusive: bool = False,
    count: int = 8,
    cpu: int = 1000,
) -> list[PodRequest]:
    return [
        whole(f"{key}-{i}", count, cpu, group=GroupRef(key, size, i, topology, exclusive))
        for i in range(size)
    ]
