"""The webhook picks a MIG slice that exists: the smallest fitting profile with a free
(or creatable) slice, and only when none is, the smallest fitting one to wait for.

Found on the real control plane (tests/e2e): a 16Gi TTS pod was given
``nvidia.com/mig-1g.20gb`` on H100 nodes whose frozen layouts had free 2g.20gb slices and
no 1g.20gb at all; kube-scheduler's resource fit then rejected every node for ever."""

from __future__ import annotations

from typing import Any

import pytest
from webhook_builders import OPT_IN, cluster, node, pod

from webhook.config import WebhookConfig
from webhook.decide import decide_admission
from webhook.decision import Kind

FROZEN = {"gpupack.io/mig-reconfigure": "false"}
MEM, ISO = "gpupack.io/gpu-memory", "gpupack.io/isolation"


def running(name: str, profile: str) -> dict[str, Any]:
    """A pod bound to h0 holding one ``profile`` slice."""
    return {"metadata": {"name": name, "namespace": "x"},
            "spec": {"nodeName": "h0", "containers": [
                {"name": "c", "resources": {"limits": {f"nvidia.com/mig-{profile}": "1"}}}]}}


@pytest.mark.parametrize(
    ("slices", "held", "ask", "profile", "waits"),
    [
        # 1g.20gb exists nowhere; 2g.20gb is free: take it.
        ({"1g.10gb": 14, "2g.20gb": 6}, [], "16Gi", "2g.20gb", False),
        # Both exist: the smaller wins as before.
        ({"1g.20gb": 4, "2g.20gb": 3}, [], "16Gi", "1g.20gb", False),
        # Only a 3g.40gb is free for 16Gi: larger still, but it exists.
        ({"1g.10gb": 7, "3g.40gb": 2}, [], "16Gi", "3g.40gb", False),
        # Nothing fitting is free, a 2g.20gb exists and a pod holds it: the pod waits for
        # that one, not for a 1g.20gb that no layout has and none will make.
        ({"1g.10gb": 7, "2g.20gb": 1}, ["2g.20gb"], "16Gi", "2g.20gb", True),
    ],
)
def test_smallest_available_profile(slices: dict[str, int], held: list[str], ask: str,
                                    profile: str, waits: bool) -> None:
    pods = [running(f"r{i}", p) for i, p in enumerate(held)]
    snap = cluster(node("h0", gpus=2, mig=slices, labels=FROZEN), pods=pods)
    d = decide_admission(pod(annotations={MEM: ask, ISO: "mig"}), snap, WebhookConfig())
    assert d.kind is Kind.MIG and d.profile == profile, d.reason
    assert ("waits" in d.reason) is waits, d.reason
    if waits:
        assert "1 exist, all in use" in d.reason
        assert "layouts stay as reported on the other MIG GPUs: 2 on nodes that freeze" in d.reason


@pytest.mark.parametrize(
    ("labels", "actuator", "kind", "needle"),
    [
        # No slice that holds 16Gi exists and the layout never changes: a pod given one
        # would stay Pending for ever, so it is denied, naming the case.
        (FROZEN, False, Kind.DENY, "2 on nodes that freeze their MIG layout"),
        ({}, False, Kind.DENY, "2 on nodes that do not opt in to MIG reconfiguration"),
        (OPT_IN, False, Kind.DENY, "2 on nodes that opt in to MIG reconfiguration while "
                                   "the MIG actuator is off"),
        # Opted in with the actuator on: a 1g.20gb may be created in the free room.
        (OPT_IN, True, Kind.MIG, "creatable by the MIG actuator"),
    ],
)
def test_a_profile_nothing_has_or_makes_is_not_promised(
        labels: dict[str, str], actuator: bool, kind: Kind, needle: str) -> None:
    snap = cluster(node("h0", gpus=2, mig={"1g.10gb": 6}, labels=labels),
                   mig_actuator=actuator)
    d = decide_admission(pod(annotations={MEM: "16Gi", ISO: "mig"}), snap, WebhookConfig())
    assert d.kind is kind, d.reason
    assert needle in d.reason, d.reason
