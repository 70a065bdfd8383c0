"""The webhook picks a MIG slice that exists: the smallest fitting profile with a free
(or creatable) slice, and only when none is, the smallest fitting one to wait for.

Found on the real control plane (tests/e2e): a 16Gi TTS pod was given
``nvidia.com/mig-1g.20gb`` on H100 nodes whose frozen layouts had free 2g.20gb slices and
no 1g.20gb at all; kube-scheduler's resource fit then rejected every node for ever."""

from __future__ import annotations

import pytest
from webhook_builders import cluster, node, pod

from webhook.config import WebhookConfig
from webhook.decide import Kind, decide

FROZEN = {"gpupack.io/mig-reconfigure": "false"}
MEM, ISO = "gpupack.io/gpu-memory", "gpupack.io/isolation"


@pytest.mark.parametrize(
    ("slices", "ask", "profile", "waits"),
    [
        # 1g.20gb exists nowhere; 2g.20gb is free: take it.
        ({"1g.10gb": 14, "2g.20gb": 6}, "16Gi", "2g.20gb", False),
        # Both exist: the smaller wins as before.
        ({"1g.20gb": 4, "2g.20gb": 3}, "16Gi", "1g.20gb", False),
        # Only a 3g.40gb is free for 16Gi: larger still, but it exists.
        ({"1g.10gb": 7, "3g.40gb": 2}, "16Gi", "3g.40gb", False),
        # Nothing fitting is free: the smallest fitting, and the reason says it waits.
        ({"1g.10gb": 7}, "16Gi", "1g.20gb", True),
    ],
)
def test_smallest_available_profile(slices: dict[str, int], ask: str, profile: str,
                                    waits: bool) -> None:
    snap = cluster(node("h0", gpus=2, mig=slices, labels=FROZEN))
    d = decide(pod(annotations={MEM: ask, ISO: "mig"}), snap, WebhookConfig())
    assert d.kind is Kind.MIG and d.profile == profile, d.reason
    assert ("waits" in d.reason) is waits, d.reason
