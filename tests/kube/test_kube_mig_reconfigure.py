"""The node label ``gpupack.io/mig-reconfigure`` and the MIG actuator setting decide
whether a Node's MIG layouts may change (issue 19, item 1)."""

from __future__ import annotations

from typing import Any

import pytest

from kube.node_objects import node_info
from kube.snapshot import build_snapshot
from packing.model import MigReconfigure

R = MigReconfigure
KEY = "gpupack.io/mig-reconfigure"


def h100(labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": "h", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                             "nvidia.com/gpu.count": "2", **(labels or {})},
                     "annotations": annotations or {}},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "2"}},
    }


@pytest.mark.parametrize(
    ("labels", "annotations", "actuator", "case"),
    [
        ({}, {}, False, R.NOT_OPTED_IN),
        ({}, {}, True, R.NOT_OPTED_IN),
        ({KEY: "false"}, {}, True, R.FROZEN),
        ({KEY: "true"}, {}, False, R.ACTUATOR_OFF),
        ({KEY: "true"}, {}, True, R.ON),
        # The annotation never opts a node in: the node agent may write gpupack.io/
        # annotations of its Node (issue 35); it may only freeze one. The label wins.
        ({}, {KEY: "true"}, True, R.NOT_OPTED_IN),
        ({}, {KEY: "false"}, True, R.FROZEN),
        ({KEY: "false"}, {KEY: "true"}, True, R.FROZEN),
        ({KEY: "true"}, {KEY: "false"}, True, R.ON),
    ],
)
def test_label_and_actuator(labels: dict[str, str], annotations: dict[str, str],
                            actuator: bool, case: MigReconfigure) -> None:
    assert node_info(h100(labels, annotations), mig_actuator=actuator).mig_reconfigure is case


def test_an_unreadable_value_is_no_opt_in_and_noted() -> None:
    notes: list[str] = []
    info = node_info(h100({KEY: "yes"}), notes, mig_actuator=True)
    assert info.mig_reconfigure is R.NOT_OPTED_IN
    assert notes == [f"Node h: metadata.labels.{KEY}: 'yes' is not \"true\" or \"false\"; "
                     "the node does not opt in"]


def test_the_default_is_off() -> None:
    assert node_info(h100({KEY: "true"})).mig_reconfigure is R.ACTUATOR_OFF
    snap = build_snapshot([h100({KEY: "true"})], []).snapshot
    assert not snap.nodes[0].mig_reconfigurable
    snap = build_snapshot([h100({KEY: "true"})], [], mig_actuator=True).snapshot
    assert snap.nodes[0].mig_reconfigurable


def test_an_annotation_that_would_opt_in_is_noted() -> None:
    notes: list[str] = []
    info = node_info(h100({}, {KEY: "true"}), notes, mig_actuator=True)
    assert info.mig_reconfigure is R.NOT_OPTED_IN
    assert notes == [f"Node h: metadata.annotations.{KEY}: 'true' ignored: only the label "
                     "opts a node in (the node agent may write gpupack.io/ annotations)"]
