"""The rare-shape price: keep the few nodes that alone can host a shape able to host it.

Some of a workload's shapes fit only a small part of the cluster: on the openb cluster an
8-GPU pod asking 120 cores fits only the 39 G3 nodes of 128 cores (of 1,213 nodes; every
other 8-GPU node has 96). Nothing else in the score sees this: FGD's typical shapes
cover 95% of the pods and leave such shapes out, and the capacity lookahead weighs a
shape by its frequency, so a fresh G3 node and a fresh G2 node rank within a fraction of
a level for a one-GPU pod, and a G3 node's extra cores even make it look cheaper
(openb gpushare40, seed 42: the first 39 one-GPU pods opened every G3 node one each
within 1.4% of the arrivals, and all five 120-core 8-GPU pods then failed).

For every shape s of the whole workload (all shapes, not only the typical ones) the
nodes that could host s when empty are counted from their capacity: cpu and memory at
least s's, at least s's GPUs (one for a share), and a GPU model s may use. s is **rare**
when 0 < hosts(s) <= ``RARE_SHARE`` x the nodes. A placement that leaves a node unable
to host a rare shape it could host before pays ``weight`` levels (``RARE_WEIGHT``): the
node can host s iff free cpu >= cpu_s, free memory >= mem_s, the model fits and (whole
GPUs) at least num_gpu_s fully free GPUs, (a share) a GPU with at least milli_s free.
So pods go to nodes that host no rare shape, or to one already unable to, before they
take the last capability a rare shape has; once no such node is left the price is the
same everywhere and the rank decides.

Where the score has no level (cpu-bound workloads,
:func:`~packing.policies.lookahead.workload_weights`) the price is off, as the
core-deficit price: it is counted in levels.

Measured on the openb traces (bench/README.md, "Packing quality", issue 38, idea 9): a
throwaway version (the price charged after the GPU was chosen) at seeds 42-46, 10
levels: gpushare40 +0.120 (s.e. 0.013), default +0.144 (0.013), multigpu40 +0.092
(0.007); 1,000 levels (lexicographic) the same on gpushare40 and default and only
+0.016 on multigpu40. Shipped, 10 seeds against the policy before
it: gpuspec20-33 +0.13 to +0.16, gpushare40 +0.12, multigpu40 +0.09, cpu050-200 and
default +0.06 to +0.08, gpuspec10 and multigpu20-30 +0.06-0.07; gpushare80 +0.02 and
multigpu50 +0.01 (within their standard errors); gpushare60, gpushare100 and cpu250
unchanged. ``RARE_SHARE`` 5% and 10% find the same shapes there (the 120-core 8-GPU
pods).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from packing.fragmentation import BoolArray, FloatArray, IntArray, MilliRequest, TypicalShapes
from packing.model import GPU_MILLI

# A shape that fits at most this share of the nodes (and at least one) is rare.
RARE_SHARE = 0.05
# Levels a placement pays for taking from a node the last of its room for a rare shape.
RARE_WEIGHT = 10.0


def _none(dtype: type) -> IntArray:
    return np.zeros(0, dtype=dtype)


@dataclass(frozen=True, eq=False)
class NodeCapacity:
    """The cluster's nodes as the rule counts hosts: each node's allocatable cpu (milli)
    and memory (MiB), its GPU count and its model id in the shapes' model list."""

    cpu: IntArray  # [N]
    mem: IntArray  # [N]
    gpus: IntArray  # [N]
    model: IntArray  # [N]


@dataclass(frozen=True, eq=False)
class RareShapeRule:
    """The price of the module docstring. ``cpu``, ``mem``, ``num_gpu``, ``milli``:
    the rare shapes' requests ``[R]``; ``model_ok`` ``[R, n_models]``."""

    active: bool
    cpu: IntArray = field(default_factory=lambda: _none(np.int64))
    mem: IntArray = field(default_factory=lambda: _none(np.int64))
    num_gpu: IntArray = field(default_factory=lambda: _none(np.int64))
    milli: IntArray = field(default_factory=lambda: _none(np.int64))
    model_ok: BoolArray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))
    weight: float = RARE_WEIGHT

    @staticmethod
    def of(shapes: TypicalShapes, nodes: NodeCapacity, share: float = RARE_SHARE,
           weight: float = RARE_WEIGHT) -> RareShapeRule:
        """The rule for every shape of ``shapes`` (pass all of the workload's, not the
        typical ones) on the cluster ``nodes``."""
        n = len(nodes.cpu)
        if n == 0 or not shapes.keys:
            return RareShapeRule(active=False)
        num_gpu = np.array([k.num_gpu for k in shapes.keys], dtype=np.int64)
        milli = np.array([k.gpu_milli for k in shapes.keys], dtype=np.int64)
        # hosts[s, n]: node n could host shape s when empty
        hosts = ((nodes.cpu[None, :] >= shapes.cpu_milli[:, None])
                 & (nodes.mem[None, :] >= shapes.memory_mib[:, None])
                 & (nodes.gpus[None, :] >= np.where(milli >= GPU_MILLI, num_gpu,
                                                    np.minimum(num_gpu, 1))[:, None])
                 & shapes.model_ok[:, nodes.model])
        count = hosts.sum(axis=1)
        rare = (count > 0) & (count <= share * n)
        if not rare.any():
            return RareShapeRule(active=False)
        return RareShapeRule(active=True, cpu=shapes.cpu_milli[rare].astype(np.int64),
                             mem=shapes.memory_mib[rare].astype(np.int64),
                             num_gpu=num_gpu[rare], milli=milli[rare],
                             model_ok=shapes.model_ok[rare], weight=weight)

    def applies(self, req: MilliRequest) -> bool:
        return self.active

    def hosts(self, free: IntArray, cpu: IntArray, mem: IntArray, model: IntArray
              ) -> BoolArray:
        """``[..., R]``: whether each node (rows of ``free`` ``[..., G]``, with its free
        ``cpu``, ``mem`` and ``model`` broadcast to the rows) can host each rare shape."""
        full = (free == GPU_MILLI).sum(axis=-1)[..., None]
        biggest = free.max(axis=-1, initial=0)[..., None]
        gpu_ok = np.where(self.num_gpu == 0, True,
                          np.where(self.milli >= GPU_MILLI, full >= self.num_gpu,
                                   biggest >= self.milli))
        return np.asarray((np.asarray(cpu)[..., None] >= self.cpu)
                          & (np.asarray(mem)[..., None] >= self.mem)
                          & np.moveaxis(self.model_ok[:, np.asarray(model)], 0, -1)
                          & gpu_ok, dtype=bool)

    def penalty_of(self, free: IntArray, cpu: IntArray, mem: IntArray, model: IntArray,
                   req: MilliRequest) -> FloatArray:
        """``weight`` where ``req`` leaves the node unable to host a rare shape it can
        host now, else 0: ``[n]`` for whole-GPU and CPU-only requests (a whole-GPU one
        takes the first fully free GPUs), ``[n, G]`` for a share (one per GPU)."""
        before = self.hosts(free, cpu, mem, model)
        c2, m2 = cpu - req.cpu, mem - req.mem
        if req.num_gpu == 0 or not req.shared:
            f2 = free
            if req.num_gpu > 0:
                isfull = free == GPU_MILLI
                f2 = np.where(isfull & (np.cumsum(isfull, axis=-1) <= req.num_gpu), 0, free)
            lost = (before & ~self.hosts(f2, c2, m2, model)).any(axis=-1)
            return np.asarray(np.where(lost, self.weight, 0.0), dtype=np.float64)
        g = free.shape[-1]
        f2 = free[:, None, :] - np.eye(g, dtype=np.int64)[None, :, :] * req.milli
        after = self.hosts(f2, c2[:, None], m2[:, None], np.asarray(model)[:, None])
        lost = (before[:, None, :] & ~after).any(axis=-1)
        return np.asarray(np.where(lost, self.weight, 0.0), dtype=np.float64)
