"""Cluster and workload of the openb replay as numpy arrays.

Nodes are rows; per-GPU free compute is a ``[n_nodes, MAX_GPUS]`` matrix in milli-GPUs
with absent GPUs padded as 0 free (a padded slot then behaves exactly like a fully
allocated GPU, so no mask is needed anywhere). Pods are referenced by index into the
parsed trace; distinct request tuples get a *request id* so that node-local scores can be
cached per (node, request id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from packing.fragmentation import BoolArray, IntArray
from packing.model import GPU_MILLI
from sim.traces import OpenbNode, OpenbPod

MAX_GPUS = 8


@dataclass(frozen=True, eq=False)
class Nodes:
    """Static node data."""

    names: tuple[str, ...]
    models: tuple[str, ...]  # model id -> name ("" for CPU-only nodes)
    cpu_milli: IntArray
    memory_mib: IntArray
    gpu_count: IntArray
    model_id: IntArray

    @property
    def size(self) -> int:
        return len(self.names)

    @property
    def gpu_capacity_milli(self) -> int:
        return int(self.gpu_count.sum()) * GPU_MILLI

    @staticmethod
    def from_trace(nodes: Sequence[OpenbNode]) -> Nodes:
        models = tuple(sorted({n.model for n in nodes}))
        if any(n.gpu_count > MAX_GPUS for n in nodes):
            raise ValueError(f"nodes with more than {MAX_GPUS} GPUs are not supported")
        return Nodes(
            names=tuple(n.name for n in nodes),
            models=models,
            cpu_milli=np.array([n.cpu_milli for n in nodes], dtype=np.int64),
            memory_mib=np.array([n.memory_mib for n in nodes], dtype=np.int64),
            gpu_count=np.array([n.gpu_count for n in nodes], dtype=np.int64),
            model_id=np.array([models.index(n.model) for n in nodes], dtype=np.int64),
        )


@dataclass(frozen=True, eq=False)
class Pods:
    """The trace's pods as arrays, with a request id per distinct request tuple."""

    pods: tuple[OpenbPod, ...]
    cpu_milli: IntArray
    memory_mib: IntArray
    num_gpu: IntArray
    gpu_milli: IntArray
    request_id: IntArray  # [P] index into the distinct requests below
    # distinct requests: (cpu, mem, num_gpu, milli, spec) and the models each may use
    requests: tuple[tuple[int, int, int, int, frozenset[str]], ...]
    request_model_ok: BoolArray  # [Q, n_models]

    @property
    def demand_milli(self) -> IntArray:
        """GPU demand per pod: num_gpu x gpu_milli (the protocol's unit of load)."""
        return self.num_gpu * self.gpu_milli

    @staticmethod
    def from_trace(pods: Sequence[OpenbPod], models: Sequence[str]) -> Pods:
        index: dict[tuple[int, int, int, int, frozenset[str]], int] = {}
        rid = np.zeros(len(pods), dtype=np.int64)
        for i, p in enumerate(pods):
            key = (p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec)
            rid[i] = index.setdefault(key, len(index))
        reqs = tuple(index)
        ok = np.zeros((len(reqs), len(models)), dtype=bool)
        for q, (_, _, k, _, spec) in enumerate(reqs):
            for mu, name in enumerate(models):
                # A GPU pod cannot go to a CPU-only node (model ""); gpu_spec narrows models.
                ok[q, mu] = k == 0 or (name != "" and (not spec or name in spec))
        return Pods(
            pods=tuple(pods),
            cpu_milli=np.array([p.cpu_milli for p in pods], dtype=np.int64),
            memory_mib=np.array([p.memory_mib for p in pods], dtype=np.int64),
            num_gpu=np.array([p.num_gpu for p in pods], dtype=np.int64),
            gpu_milli=np.array([p.gpu_milli for p in pods], dtype=np.int64),
            request_id=rid,
            requests=reqs,
            request_model_ok=ok,
        )


class ReplayState:
    """Mutable free resources; ``version[n]`` bumps whenever node n changes."""

    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes
        n = nodes.size
        self.free_cpu = nodes.cpu_milli.copy()
        self.free_mem = nodes.memory_mib.copy()
        slots = np.arange(MAX_GPUS)[None, :] < nodes.gpu_count[:, None]
        self.free_gpu: IntArray = np.where(slots, GPU_MILLI, 0).astype(np.int64)
        self.n_full: IntArray = nodes.gpu_count.copy()  # GPUs with all 1000 milli free
        self.max_free: IntArray = self.free_gpu.max(axis=1) if n else np.zeros(0, np.int64)
        self.version: IntArray = np.zeros(n, dtype=np.int64)
        self.allocated_milli = 0

    def feasible(
        self, cpu: int, mem: int, num_gpu: int, milli: int, model_ok: BoolArray
    ) -> IntArray:
        """Indices of nodes that can host the request (the scheduler's filter)."""
        ok = (self.free_cpu >= cpu) & (self.free_mem >= mem) & model_ok[self.nodes.model_id]
        if num_gpu > 0:
            if milli >= GPU_MILLI:
                ok &= self.n_full >= num_gpu
            else:
                ok &= self.max_free >= milli
        return np.flatnonzero(ok)

    def whole_gpus(self, node: int, num_gpu: int) -> tuple[int, ...]:
        """The first ``num_gpu`` fully free GPUs of the node (the simulator's choice)."""
        free = np.flatnonzero(self.free_gpu[node] == GPU_MILLI)
        return tuple(int(g) for g in free[:num_gpu])

    def place(
        self, node: int, cpu: int, mem: int, num_gpu: int, milli: int, gpus: Sequence[int]
    ) -> None:
        self.free_cpu[node] -= cpu
        self.free_mem[node] -= mem
        for g in gpus:
            self.free_gpu[node, g] -= milli
        if num_gpu > 0:
            row = self.free_gpu[node]
            self.n_full[node] = int((row == GPU_MILLI).sum())
            self.max_free[node] = int(row.max())
        self.allocated_milli += num_gpu * milli
        self.version[node] += 1
