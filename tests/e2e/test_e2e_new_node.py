"""A node that arrives for a pending pod (as a cluster autoscaler's does) is used at once.

kube-scheduler retries a pod that nothing could take when a node is added or its
allocatable grows; its informer may show that before gpupack's watch does. The extender
then answers with an error (retried after kube-scheduler's backoff) rather than refusing
the pod, which would park it until some later cluster event (scheduler/extender/verbs.py,
filter_nodes). Here the node comes in three writes (created, its allocatable, its
not-ready taint lifted), each an event that requeues the pod, so this test shows the
scenario works end to end on the real stack but cannot force the race: the branches
themselves are tested in tests/scheduler/test_view_lag.py and test_scheduler_verbs.py.
"""

from __future__ import annotations

from typing import Any

from cluster import GPU, bound, create_nodes, create_pods, h100_whole, pod, pods_in, wait_for
from conftest import Space


def _refused(core: Any, ns: str, name: str) -> bool:
    p = core.read_namespaced_pod(name, ns)
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
               for c in p.status.conditions or [])


def test_a_pod_waiting_for_a_node_binds_when_the_node_arrives(space: Space, core: Any) -> None:
    pool = space.name
    ns = space.namespace()
    create_pods(core, ns, [pod("waits", pool=pool, limits={GPU: "8"})])
    wait_for(lambda: _refused(core, ns, "waits"), 60, "kube-scheduler to find no node")
    space.nodes += create_nodes(core, [h100_whole(f"{pool}-new", pool)])
    # 30 s: well inside kube-scheduler's five-minute flush of unschedulable pods, so the
    # retry that binds it came from the node's own events (and backoff).
    got = wait_for(lambda: bound(pods_in(core, ns)), 30, "the pod to bind to the new node")
    assert got == {"waits": f"{pool}-new"}
