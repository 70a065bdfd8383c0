"""A cordoned node on the real control plane: the only node of a pool that holds MIG
slices is cordoned for maintenance. A pod sized by ``gpupack.io/gpu-memory`` that may
only take a MIG slice is admitted (converted to the slice, Pending, as kube-scheduler
keeps a pod for a cordoned node's resource) instead of refused by the webhook, and binds
to the node once it is uncordoned."""

from __future__ import annotations

import json
import time
from typing import Any

from cluster import bound, create_nodes, h100_mig, pod, pods_in, wait_for, wait_for_webhook
from conftest import Space

MIG = "nvidia.com/mig-1g.10gb"
DECISION = "gpupack.io/decision"


def test_a_pod_waits_for_a_cordoned_nodes_slices(space: Space, core: Any) -> None:
    pool = space.name
    (name,) = create_nodes(core, [h100_mig(f"{pool}-0", pool, {"1g.10gb": 56})])
    space.nodes.append(name)
    ns = space.namespace()
    asr = pod("asr", pool=pool, annotations={"gpupack.io/gpu-memory": "8Gi",
                                             "gpupack.io/isolation": "mig"})
    wait_for_webhook(core, ns, asr, MIG)  # the webhook's view has the node
    core.patch_node(name, {"spec": {"unschedulable": True}})

    def decided_on_the_cordon() -> Any:
        # Dry runs until the webhook's view has the cordon (a review answers from the
        # view it has while a changed one is condensed): the slices only a cordoned
        # node holds. The webhook refused the pod here before (a 403 fails the test).
        out = core.create_namespaced_pod(ns, dict(asr), dry_run="All")
        reason = json.loads((out.metadata.annotations or {})[DECISION])["reason"]
        return out if "waits until one is uncordoned" in reason else None

    wait_for(decided_on_the_cordon, 30, "the webhook's view to have the cordon")
    made = core.create_namespaced_pod(ns, dict(asr))
    assert MIG in (made.spec.containers[0].resources.limits or {})
    time.sleep(4)
    assert "asr" not in bound(pods_in(core, ns))  # kube-scheduler keeps it Pending

    core.patch_node(name, {"spec": {"unschedulable": False}})
    wait_for(lambda: bound(pods_in(core, ns)).get("asr") == name, 60,
             "the pod bound once the node is uncordoned")
