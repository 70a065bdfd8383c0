"""Why a node has no GPU of a usable kind: the reason names the node's GPU models and
modes and the actual obstacle, so "MIG pod on an H100 node" never reads as a
contradiction when MIG is merely off there."""

from __future__ import annotations

from dataclasses import replace

import pytest
from packing_builders import mig, node, shared, whole

from packing.model import GpuMode, MigReconfigure, NodeInfo, PodRequest, Snapshot
from packing.state import ClusterState


@pytest.mark.parametrize(
    ("info", "pod", "needles"),
    ids=["mig-off-not-opted-in", "mig-off-frozen", "mig-off-actuator-off", "no-mig-model",
         "no-such-profile", "whole-on-mig", "shared-on-whole", "model-limited"],
    argvalues=[
        (node("h", 2, reconfigurable=False), mig("p", "1g.10gb"),
         ["2 H100-80GB in whole-GPU mode",
          "MIG is off on this node and it does not opt in to reconfiguration",
          "pod needs MIG 1g.10gb"]),
        (node("h", 2, reconfigure=MigReconfigure.FROZEN), mig("p", "1g.10gb"),
         ["2 H100-80GB in whole-GPU mode",
          "MIG is off on this node and it freezes its MIG layout"]),
        (node("h", 2, reconfigure=MigReconfigure.ACTUATOR_OFF), mig("p", "1g.10gb"),
         ["2 H100-80GB in whole-GPU mode",
          "it opts in to reconfiguration but the MIG actuator is off"]),
        (node("l", 2, model="L40S", mode=GpuMode.SHARED), mig("p", "1g.10gb"),
         ["2 L40S in time-sliced mode", "these GPU models have no MIG"]),
        (node("h", 1, mode=GpuMode.MIG, layouts={0: [("7g.80gb", 0)]}), mig("p", "1g.5gb"),
         ["1 H100-80GB in MIG mode", "no 1g.5gb profile"]),
        (node("h", 1, mode=GpuMode.MIG, layouts={0: [("7g.80gb", 0)]}), whole("p"),
         ["in MIG mode", "no GPU here is advertised whole"]),
        (node("h", 2), shared("p"), ["in whole-GPU mode", "no GPU here is time-sliced"]),
        (node("h", 2), replace(whole("p"), gpu_models=frozenset({"A100-80GB"})),
         ["pod is limited to A100-80GB"]),
    ],
)
def test_unusable_reason_names_model_mode_and_obstacle(info: NodeInfo, pod: PodRequest,
                                                       needles: list[str]) -> None:
    state = ClusterState(Snapshot((info,)))
    for why in (state.reason(pod, info.name), state.unresolvable(pod, info.name)):
        assert why is not None and why.startswith("no GPU of a usable kind (")
        for needle in needles:
            assert needle in why, why
