"""Node objects read into NodeInfos, memoized per node shape.

Inferring MIG layouts from allocatable counts (:func:`kube.node_objects.node_info`) is a
search that can take a tenth of a second per node, and large clusters are made of few
node shapes; :class:`NodeShapes` reads each shape once and copies it for the other
nodes of that shape (with their own name and labels).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kube import annotations as A
from kube.node_objects import node_info
from packing.model import NodeInfo

# Label and annotation prefixes node_info reads to find a node's GPUs.
_GPU_LABELS = ("nvidia.com/", "gpupack.io/")
MAX_SHAPES = 10_000  # node shapes remembered (past it, a new shape is read every time)


class NodeShapes:
    """``node_info`` memoized by what decides a node's GPUs (see :meth:`info`)."""

    def __init__(self, mig_actuator: bool = False) -> None:
        self.mig_actuator = mig_actuator
        self.memo: dict[str, NodeInfo] = {}  # node shape -> NodeInfo

    def __len__(self) -> int:
        return len(self.memo)

    def info(self, obj: Mapping[str, Any]) -> NodeInfo:
        """``node_info`` memoized by what decides a node's GPUs.

        Inferring MIG layouts from allocatable counts is a search that can take a tenth
        of a second per node, and large clusters are made of few node shapes: nodes that
        agree on allocatable, cordon, and the NVIDIA/gpupack labels and annotations get
        the same GPUs, so the inference runs once per shape and the rest is a copy with
        the node's own name and labels.
        """
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping) or not isinstance(meta.get("labels") or {}, Mapping):
            return node_info(obj, mig_actuator=self.mig_actuator)
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if isinstance(annotations, Mapping) and A.INVENTORY in annotations:
            # A node agent's inventory is the node's own (it names the node) and changes
            # with every write (its ts): no other node shares that shape, and keeping it
            # would only fill the memo. Reading it is a decode, not an inference.
            return node_info(obj, mig_actuator=self.mig_actuator)
        status = obj.get("status") or {}
        spec = obj.get("spec") or {}
        try:
            key = repr((
                sorted((k, v) for k, v in labels.items() if k.startswith(_GPU_LABELS)),
                sorted((k, v) for k, v in annotations.items() if k.startswith(_GPU_LABELS))
                if isinstance(annotations, Mapping) else annotations,
                sorted(status.get("allocatable", {}).items())
                if isinstance(status, Mapping) and isinstance(status.get("allocatable"), Mapping)
                else None,
                spec.get("unschedulable") if isinstance(spec, Mapping) else spec,
            ))
        except (AttributeError, TypeError):
            return node_info(obj, mig_actuator=self.mig_actuator)
        shape = self.memo.get(key)
        if shape is None:
            info = node_info(obj, mig_actuator=self.mig_actuator)
            if len(self.memo) < MAX_SHAPES:
                self.memo[key] = info
            return info
        mine = node_info({"metadata": {"name": meta.get("name"), "labels": labels}})
        return replace(shape, name=mine.name, labels=mine.labels)
