"""Parsers for the openb trace (Alibaba cluster-trace-gpu-v2023, as used by the FGD paper).

Pure: every function takes the CSV *text* and returns frozen values; opening files is the
caller's job (``gpupack.openb_cmd``). Bad rows raise :class:`TraceError` naming the line
number (1-based, header is line 1), the column and the offending value, so a broken trace
file is fixed in one look.

Node rows: ``sn,cpu_milli,memory_mib,gpu,model``.
Pod rows: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,...]``;
the ``multigpu*`` files carry only the first five columns, so ``gpu_spec`` is optional.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial

from packing.model import (
    GPU_MILLI,
    GpuInfo,
    GpuMode,
    NodeInfo,
    PodRequest,
    RequestKind,
)

# GPU memory per model of the openb cluster, in MiB. The trace only names the model; the
# memory is the vendor figure for the card family (G2/G3 are Alibaba's internal names for
# their most common datacenter cards; their exact SKU is not published, so the figure is
# that of the 16 GiB / 32 GiB class they are reported as). Nothing in the FGD experiment
# uses GPU memory: a fractional pod is sized by gpu_milli alone.
GPU_MEMORY_MIB: Mapping[str, int] = {
    "G2": 16 * 1024,
    "G3": 32 * 1024,
    "P100": 16 * 1024,
    "T4": 16 * 1024,
    "V100M16": 16 * 1024,
    "V100M32": 32 * 1024,
    "A10": 24 * 1024,
}

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceError(ValueError):
    """A trace row that cannot be used; ``line``/``column``/``value`` say where and what."""

    def __init__(self, line: int, column: str, value: str, why: str) -> None:
        super().__init__(f"line {line}: column {column!r} = {value!r}: {why}")
        self.line = line
        self.column = column
        self.value = value


@dataclass(frozen=True)
class OpenbNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    model: str


@dataclass(frozen=True)
class OpenbPod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU: 1000 whole, 1..999 a share of one GPU, 0 CPU-only
    gpu_spec: frozenset[str]  # allowed GPU models; empty = any


def _rows(text: str, required: Iterable[str]) -> Iterable[tuple[int, dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    for col in required:
        if col not in header:
            raise TraceError(1, col, ",".join(header), "missing column in header")
    for row in reader:
        # reader.line_num is the physical line of the row just read (header = 1).
        if None in row:
            extra = row[None]
            raise TraceError(reader.line_num, "<extra>", ",".join(extra), "too many fields")
        yield reader.line_num, {k: (v if v is not None else "") for k, v in row.items()}


def _int(line: int, row: Mapping[str, str], col: str, lo: int, hi: int | None = None) -> int:
    raw = row.get(col, "")
    try:
        value = int(raw.strip())
    except ValueError:
        raise TraceError(line, col, raw, "not an integer") from None
    if value < lo or (hi is not None and value > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise TraceError(line, col, raw, f"out of range, expected {bound}")
    return value


def parse_nodes(text: str) -> tuple[OpenbNode, ...]:
    out: list[OpenbNode] = []
    seen: set[str] = set()
    for line, row in _rows(text, NODE_COLUMNS):
        name = row["sn"].strip()
        if not name:
            raise TraceError(line, "sn", row["sn"], "empty node name")
        if name in seen:
            raise TraceError(line, "sn", name, "duplicate node name")
        seen.add(name)
        gpus = _int(line, row, "gpu", 0, 64)
        model = row["model"].strip()
        if gpus > 0 and model not in GPU_MEMORY_MIB:
            raise TraceError(line, "model", row["model"], "unknown GPU model")
        out.append(
            OpenbNode(
                name=name,
                cpu_milli=_int(line, row, "cpu_milli", 0),
                memory_mib=_int(line, row, "memory_mib", 0),
                gpu_count=gpus,
                model=model if gpus > 0 else "",
            )
        )
    return tuple(out)


def parse_pods(text: str) -> tuple[OpenbPod, ...]:
    out: list[OpenbPod] = []
    for line, row in _rows(text, POD_COLUMNS):
        name = row["name"].strip()
        if not name:
            raise TraceError(line, "name", row["name"], "empty pod name")
        num_gpu = _int(line, row, "num_gpu", 0, 64)
        milli = _int(line, row, "gpu_milli", 0, GPU_MILLI)
        # A pod takes either whole GPUs (milli 1000, any count), one share of one GPU
        # (0 < milli < 1000, count 1) or no GPU (both 0); anything else has no placement.
        if num_gpu == 0 and milli != 0:
            raise TraceError(line, "gpu_milli", row["gpu_milli"], "gpu_milli without num_gpu")
        if num_gpu > 0 and milli == 0:
            raise TraceError(line, "gpu_milli", row["gpu_milli"], "num_gpu without gpu_milli")
        if num_gpu > 1 and milli != GPU_MILLI:
            raise TraceError(line, "gpu_milli", row["gpu_milli"], "multi-GPU share")
        spec_raw = row.get("gpu_spec", "").strip()
        spec = frozenset(s.strip() for s in spec_raw.split("|") if s.strip())
        for model in spec:
            if model not in GPU_MEMORY_MIB:
                raise TraceError(line, "gpu_spec", spec_raw, f"unknown GPU model {model!r}")
        out.append(
            OpenbPod(
                name=name,
                cpu_milli=_int(line, row, "cpu_milli", 0),
                memory_mib=_int(line, row, "memory_mib", 0),
                num_gpu=num_gpu,
                gpu_milli=milli,
                gpu_spec=spec,
            )
        )
    return tuple(out)


def to_snapshot_nodes(nodes: Iterable[OpenbNode]) -> tuple[NodeInfo, ...]:
    """openb nodes as packer nodes: every GPU FRACTIONAL, named by its trace model."""
    out: list[NodeInfo] = []
    for n in nodes:
        gpus = tuple(
            GpuInfo(
                index=i,
                model=n.model,
                memory_mib=GPU_MEMORY_MIB[n.model],
                mode=GpuMode.FRACTIONAL,
            )
            for i in range(n.gpu_count)
        )
        out.append(NodeInfo(name=n.name, cpu_milli=n.cpu_milli, memory_mib=n.memory_mib, gpus=gpus))
    return tuple(out)


def to_pod_request(pod: OpenbPod, namespace: str = "openb") -> PodRequest:
    """An openb pod as a packer request: WHOLE, SHARED (by gpu_milli) or NONE."""
    request = partial(PodRequest, key=f"{namespace}/{pod.name}", cpu_milli=pod.cpu_milli,
                      memory_mib=pod.memory_mib)
    if pod.num_gpu >= 1 and pod.gpu_milli == GPU_MILLI:
        return request(kind=RequestKind.WHOLE, gpu_count=pod.num_gpu,
                       gpu_models=pod.gpu_spec, klass="whole")
    if pod.num_gpu >= 1:
        return request(kind=RequestKind.SHARED, gpu_milli=pod.gpu_milli,
                       gpu_models=pod.gpu_spec, klass="small")
    return request(kind=RequestKind.NONE, klass="cpu")
