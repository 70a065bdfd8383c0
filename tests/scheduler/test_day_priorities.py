"""The day replay's model of the extender's prioritize answer
(packing.policies.kube_default.extender_priorities) is the extender's own mapping
(scheduler/extender/verbs.py prioritize, no planner node) on the same preferences."""

from __future__ import annotations

from typing import Any

import pytest
from sched_builders import filter_args, make_cache, mig_pod, node, shared_pod, whole_pod

from packing.model import Snapshot
from packing.policies.gpupack import make_gpupack_scorer
from packing.policies.kube_default import extender_priorities
from scheduler.extender.verbs import Memo, NoPlan, ScorerRef, preferences, prioritize, read_pod
from scheduler.extender.wire import ExtenderArgs

NODES = [
    node("mig-a", mig={"1g.10gb": 7}),
    node("mig-b", mig={"1g.10gb": 7}),
    node("mig-c", gpus=2, mig={"1g.10gb": 2, "3g.40gb": 1}, reconfigurable=False),
    node("whole-a", gpus=8, reconfigurable=False),
    node("whole-b", gpus=8, reconfigurable=False),
    node("whole-c", gpus=4, reconfigurable=False),
]
RUNNING = [
    mig_pod("r0", node="mig-b",
            annotations={"gpupack.io/gpus": "0", "gpupack.io/mig": "1g.10gb@0"}),
    whole_pod("big", 6, node="whole-a", namespace="llm"),
    whole_pod("mid", 2, node="whole-c", namespace="llm"),
]
NAMES = [n["metadata"]["name"] for n in NODES]


@pytest.mark.parametrize("pod", [mig_pod("asr"), whole_pod("llm", 2), whole_pod("one", 1),
                                 mig_pod("rr", "3g.40gb"),
                                 shared_pod("ts", memory="8Gi", compute="0.25")],
                         ids=["mig", "whole-2", "whole-1", "mig-3g", "share"])
def test_extender_priorities_equal_prioritize(pod: dict[str, Any]) -> None:
    cache = make_cache(NODES, RUNNING)
    scorer = ScorerRef(make_gpupack_scorer(Snapshot(nodes=())), 1)
    args = ExtenderArgs.decode(filter_args(pod, NAMES))
    served = {h.host: h.score for h in prioritize(args, cache, Memo(), scorer, NoPlan())}
    prefs = preferences(NAMES, read_pod(args.pod), cache, Memo(), scorer)
    assert extender_priorities(prefs, NAMES, cache.state) == served
