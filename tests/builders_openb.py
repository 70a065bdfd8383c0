"""Builders of tiny openb clusters and pod lists (plain specs -> the trace's records), for
the bound's and the floors' tests. ``tests/`` is on the import path through
``tests/conftest.py``."""

from __future__ import annotations

from sim.traces import OpenbNode, OpenbPod


def openb_cluster(spec: list[tuple[int, int, int]]) -> list[OpenbNode]:
    """Nodes of one model (G2) from (cpu milli, memory MiB, GPUs)."""
    return [OpenbNode(f"n{i}", cpu, mem, gpus, "G2") for i, (cpu, mem, gpus) in enumerate(spec)]


def openb_pods(spec: list[tuple[int, int, int, int]]) -> list[OpenbPod]:
    """Pods any model takes, from (cpu milli, memory MiB, GPUs, milli per GPU)."""
    return [OpenbPod(f"p{i}", cpu, mem, k, m, frozenset())
            for i, (cpu, mem, k, m) in enumerate(spec)]
