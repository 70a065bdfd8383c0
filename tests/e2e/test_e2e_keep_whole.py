"""Whole nodes kept for LLM groups on plain nodes, before any group pod exists, on the
real control plane: the ``gpupack.io/keep-whole-nodes: "true"`` node label.

The pool: plain 8-GPU H100 nodes (no NVLink clique), one GPU of node a in use, and 7-GPU
pods waiting elsewhere (their shape is in the workload). A 1-GPU pod then goes where the
packing rank puts it: on an empty node, which keeps 7 GPUs free on every node. Once a
node carries the label, the next 1-GPU pod goes to a node in use and the last empty node
stays whole for the group that comes later.
"""

from __future__ import annotations

import time
from typing import Any

from cluster import (
    GPU,
    MANUAL_SCHEDULER,
    bind_with_records,
    bound,
    create_nodes,
    create_pods,
    h100_whole,
    pending_report,
    pod,
    pods_in,
    wait_for,
)
from conftest import Space
from controlplane import SCHEDULER_NAME

LABEL = "gpupack.io/keep-whole-nodes"
SETTLE_S = 4.0  # the extender's scorer follows the workload after its debounce


def _bound_to(core: Any, ns: str, name: str) -> str:
    try:
        return wait_for(lambda: bound(pods_in(core, ns)).get(name), 60, f"{name} bound")
    except AssertionError:
        raise AssertionError(pending_report(core, ns)) from None


def test_the_label_keeps_whole_nodes_before_any_group(space: Space, core: Any) -> None:
    pool = space.name
    a, b, c = (f"{pool}-{x}" for x in "abc")
    space.nodes += create_nodes(core, [h100_whole(n, pool) for n in (a, b, c)])
    ns = space.namespace()
    used = pod("used", pool=pool, scheduler=MANUAL_SCHEDULER, cpu="10m", memory="16Mi",
               limits={GPU: "1"})
    core.create_namespaced_pod(ns, used)
    bind_with_records(core, ns, "used", a, {"gpupack.io/gpus": "0"})
    # 7-GPU pods that wait for another pool: only their shape counts here.
    create_pods(core, ns, [pod(f"big-{i}", pool=f"{pool}-later", scheduler=SCHEDULER_NAME,
                               limits={GPU: "7"}) for i in range(2)])
    time.sleep(SETTLE_S)

    # Without the label (no clique, no group pod): the rank opens an empty node.
    create_pods(core, ns, [pod("one", pool=pool, scheduler=SCHEDULER_NAME,
                               limits={GPU: "1"})])
    opened = _bound_to(core, ns, "one")
    assert opened in (b, c)
    empty = c if opened == b else b

    # With the label on a node of the pool, the next one goes to a node in use.
    core.patch_node(a, {"metadata": {"labels": {LABEL: "true"}}})
    time.sleep(SETTLE_S)
    create_pods(core, ns, [pod("two", pool=pool, scheduler=SCHEDULER_NAME,
                               limits={GPU: "1"})])
    assert _bound_to(core, ns, "two") != empty
