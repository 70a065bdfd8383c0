"""The extender's filter keeps a MIG pod off an idle whole H100 unless the node opts in
and the MIG actuator is on (issue 19, item 1), and its reason names the case."""

from __future__ import annotations

from typing import Any

import pytest
from sched_builders import filter_args, mig_pod, node

from kube.cache import ClusterCache
from scheduler.extender.verbs import filter_nodes
from scheduler.extender.view_lag import ViewLag
from scheduler.extender.wire import ExtenderArgs
from scheduler.memo.decide import Memo

KEY = "gpupack.io/mig-reconfigure"


def cache_of(n: dict[str, Any], actuator: bool) -> ClusterCache:
    cache = ClusterCache("gpupack", mig_actuator=actuator)
    cache.replace([n], [])
    cache.mark_synced()
    return cache


def whole_h100(label: str | None) -> dict[str, Any]:
    n = node("h", gpus=2)
    labels = n["metadata"]["labels"]
    labels.pop(KEY)
    if label is not None:
        labels[KEY] = label
    return n


@pytest.mark.parametrize(
    ("label", "actuator", "why"),
    [
        (None, False, "MIG is off on this node and it does not opt in to reconfiguration"),
        (None, True, "MIG is off on this node and it does not opt in to reconfiguration"),
        ("false", True, "MIG is off on this node and it freezes its MIG layout"),
        ("true", False, "MIG is off on this node; it opts in to reconfiguration but the MIG "
                        "actuator is off"),
        ("true", True, None),  # passes: the idle GPU may be switched to MIG
    ],
)
def test_filter_on_an_idle_whole_h100(label: str | None, actuator: bool,
                                      why: str | None) -> None:
    cache = cache_of(whole_h100(label), actuator)
    # kube-scheduler's own fit never offers a node without the pod's MIG resource; offered
    # anyway, gpupack takes its view to be behind (an error, for a grace): these are the
    # refusals once the grace is over (grace 0).
    result = filter_nodes(ExtenderArgs.decode(filter_args(mig_pod("asr"), ["h"])), cache, Memo(),
                          lag=ViewLag(grace_s=0))
    if why is None:
        assert list(result.node_names or ()) == ["h"]
        return
    assert not result.node_names
    # The node can never take it as it is: unresolvable, so preemption is not tried.
    assert why in result.unresolvable["h"], result.unresolvable
