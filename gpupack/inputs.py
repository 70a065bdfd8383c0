"""Cluster files given on the command line (``--nodes``, ``--pods``), read into a snapshot
with every error naming the file it comes from."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kube.files import load_objects
from kube.objects import ObjectError
from kube.snapshot import BuiltSnapshot, build_snapshot

MIG_ACTUATOR_HELP = (
    "count MIG slices that could be created on idle GPUs of nodes labelled "
    'gpupack.io/mig-reconfigure: "true" (only right where something re-partitions them: '
    "on gpupack serve against a cluster this also runs the MIG actuator, which asks the "
    "GPU Operator's MIG manager for the layouts, docs/mig.md; off by default: every "
    "node's MIG layout is what it reports)")


def add_mig_actuator_argument(p: argparse.ArgumentParser) -> None:
    """``--mig-actuator``: the setting every command that reads a cluster takes."""
    p.add_argument("--mig-actuator", action="store_true", help=MIG_ACTUATOR_HELP)


def read_objects(path: Path, kind: str) -> list[dict[str, Any]]:
    """The ``kind`` objects of one file; ObjectError starting with the path."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ObjectError(f"{path}: {e.strerror or e}") from None
    return load_objects(text, str(path), kind)


def load_cluster(nodes_path: Path, pods_path: Path | None,
                 scheduler_name: str | None = None, *,
                 mig_actuator: bool = False) -> BuiltSnapshot:
    """The snapshot of the two files; ObjectError naming the file, object and field.

    build_snapshot reads both lists at once and names only the object; on an error the
    nodes alone are read again to tell which file holds the culprit (only the error path
    pays for it). ``mig_actuator``: whether MIG layouts of nodes that opt in may change."""
    nodes = read_objects(nodes_path, "Node")
    pods = read_objects(pods_path, "Pod") if pods_path is not None else []
    try:
        return build_snapshot(nodes, pods, scheduler_name, mig_actuator=mig_actuator)
    except ObjectError as e:
        culprit = nodes_path
        if pods_path is not None:
            try:
                build_snapshot(nodes, [], scheduler_name)
                culprit = pods_path
            except ObjectError:
                pass
        raise ObjectError(f"{culprit}: {e}") from None
