"""The node agent (``gpupack agent``, a DaemonSet on GPU nodes): what NVML and the
kubelet's PodResources say about the node's GPUs, MIG layouts, owners and memory, written
as the inventory on its Node (:mod:`packing.inventory`), and its metrics.

May import: :mod:`packing`, :mod:`serving` and :mod:`kube` (the Node writes).
"""
