"""A burst of 30 sized pods through the real API server and webhook, against a mix of
free MIG slices and time-sliced L40S shares (issue #18 item 4).

The webhook decides each pod from a cluster view that lags the API server; pods of a
burst arrive before the watch has delivered the ones converted just before. The
webhook counts what it handed out (webhook.claims) and the pending pods its view shows
(ClusterView.of), so the burst is spread over the kinds the cluster has: no pod may be
given a resource the pool cannot serve, and all 30 must bind.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cluster import (
    SHARED,
    NodeSpec,
    create_nodes,
    double_bookings,
    h100_mig,
    l40s_shared,
    overcommits,
    pending_report,
    pod,
    pods_in,
    wait_for_webhook,
)
from conftest import Space

PODS = 30
# Places for a 30Gi pod in the pool: 6 + 2 MIG slices on H100s, and one per L40S GPU
# (a second 30Gi share does not fit beside the first in its memory): 3 nodes x 8.
MIG_FREE = {"nvidia.com/mig-3g.40gb": 6, "nvidia.com/mig-7g.80gb": 2}
L40S_GPUS = 24


def _limit(p: dict[str, Any]) -> str:
    limits = p["spec"]["containers"][0]["resources"].get("limits") or {}
    gpu = [k for k in limits if k.startswith("nvidia.com/")]
    assert len(gpu) == 1, (p["metadata"]["name"], limits)
    return gpu[0]


def test_burst_of_30_is_spread_over_mig_slices_and_l40s_shares(
        space: Space, core: Any, capsys: Any) -> None:
    ns = space.namespace()
    # The node watch is ordered: once the webhook's view has the last node created, it
    # has the others, and none that an earlier test deleted before. The probe (a dry
    # run: it claims nothing) needs that last node's 3g.40gb slices.
    space.nodes += create_nodes(core, [
        *(l40s_shared(f"{space.name}-l40s-{i}", space.name, gpus=8) for i in range(3)),
        h100_mig(f"{space.name}-mig-b", space.name, {"7g.80gb": 2}),
        h100_mig(f"{space.name}-mig-a", space.name, {"3g.40gb": 6}),
    ])
    probe = pod("probe", pool=space.name, annotations={"gpupack.io/gpu-memory": "30Gi"})
    wait_for_webhook(core, ns, probe, "nvidia.com/mig-3g.40gb")

    bodies = [pod(f"asr-{i:02d}", pool=space.name,
                  annotations={"gpupack.io/gpu-memory": "30Gi"}) for i in range(PODS)]

    def create(body: dict[str, Any]) -> dict[str, Any]:
        made = core.create_namespaced_pod(ns, body)
        out: dict[str, Any] = core.api_client.sanitize_for_serialization(made)
        return out

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        stored = list(pool.map(create, bodies))
    created_s = time.monotonic() - start

    spread = Counter(_limit(p) for p in stored)
    for p in stored:
        assert p["spec"]["schedulerName"] == "gpupack", p["metadata"]["name"]
    # Nothing converted to a resource the pool cannot serve.
    reasons = sorted(
        (p["metadata"]["creationTimestamp"], p["metadata"]["name"], _limit(p),
         json.loads(p["metadata"]["annotations"]["gpupack.io/decision"])["reason"][-40:])
        for p in stored)
    for resource, n in spread.items():
        if resource == SHARED:
            assert n <= L40S_GPUS, (spread, reasons)
        else:
            assert n <= MIG_FREE.get(resource, 0), (spread, reasons)

    deadline = time.monotonic() + 120
    placed: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        placed = pods_in(core, ns)
        if sum(1 for p in placed if p["spec"].get("nodeName")) == PODS:
            break
        time.sleep(0.5)
    bound_s = time.monotonic() - start
    nodes = Counter(p["spec"].get("nodeName", "").rsplit("-", 2)[-2] for p in placed
                    if p["spec"].get("nodeName"))
    with capsys.disabled():
        print(f"\n  e2e webhook burst: {PODS} pods of 30Gi created in {created_s:.2f}s, "
              f"converted to {dict(sorted(spread.items()))}, bound "
              f"{sum(nodes.values())} in {bound_s:.1f}s ({dict(sorted(nodes.items()))})")
    unbound = [p["metadata"]["name"] for p in placed if not p["spec"].get("nodeName")]
    assert not unbound, pending_report(core, ns)
    assert overcommits(core, placed) == []
    assert double_bookings(placed) == []


def _l40s_mps(name: str, pool: str, gpus: int, replicas: int) -> NodeSpec:
    """An L40S node whose device plugin shares GPUs with MPS (sharing.mps, renamed)."""
    base = l40s_shared(name, pool, gpus=gpus, replicas=replicas)
    labels = {**base.labels, "nvidia.com/gpu.sharing-strategy": "mps",
              "nvidia.com/mps.capable": "true"}
    return NodeSpec(name, labels, base.allocatable)


def test_mps_replicas_take_what_fits_their_cap(space: Space, core: Any, capsys: Any) -> None:
    """8Gi pods go to MPS replicas (48Gi / 4 = 12Gi per client) and bind on the MPS
    node; 20Gi pods cannot fit a client and go to time-sliced GPUs, kept off the MPS node
    by the sharing-strategy pin (both kinds advertise nvidia.com/gpu.shared)."""
    ns = space.namespace()
    mps_node, ts_node = f"{space.name}-mps", f"{space.name}-ts"
    # The MPS node last: once the webhook's view has it (the probe asks for MPS only),
    # it has the time-sliced one and none of an earlier test's nodes (ordered watch).
    space.nodes += create_nodes(core, [l40s_shared(ts_node, space.name, gpus=4),
                                       _l40s_mps(mps_node, space.name, gpus=2, replicas=4)])
    probe = pod("probe", pool=space.name, annotations={"gpupack.io/gpu-memory": "8Gi",
                                                       "gpupack.io/isolation": "mps"})
    wait_for_webhook(core, ns, probe, SHARED)
    # isolation "shared": a share of either kind, MPS first (the control plane's agent
    # node offers MIG slices, which "any" would prefer, outside this pool).
    def share(name: str, memory: str) -> dict[str, Any]:
        return pod(name, pool=space.name, annotations={"gpupack.io/gpu-memory": memory,
                                                       "gpupack.io/isolation": "shared"})

    bodies = [share(f"small-{i}", "8Gi") for i in range(8)]
    bodies += [share(f"big-{i}", "20Gi") for i in range(4)]
    stored = [core.api_client.sanitize_for_serialization(core.create_namespaced_pod(ns, b))
              for b in bodies]
    kinds = {p["metadata"]["name"]: _decision_kind(p) for p in stored}
    assert all(kinds[f"small-{i}"] == "mps" for i in range(8)), [
        (k, json.loads(p["metadata"]["annotations"]["gpupack.io/decision"])["reason"][-60:])
        for k, p in zip(kinds, stored, strict=True)]
    assert all(kinds[f"big-{i}"] == "shared" for i in range(4)), kinds

    deadline = time.monotonic() + 90
    placed: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        placed = pods_in(core, ns)
        if sum(1 for p in placed if p["spec"].get("nodeName")) == len(bodies):
            break
        time.sleep(0.5)
    where = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in placed}
    with capsys.disabled():
        print(f"\n  e2e MPS: {Counter(n.rsplit('-', 1)[-1] for n in where.values() if n)}")
    assert all(where[f"small-{i}"] == mps_node for i in range(8)), pending_report(core, ns)
    assert all(where[f"big-{i}"] == ts_node for i in range(4)), pending_report(core, ns)
    assert overcommits(core, placed) == []


def _decision_kind(p: dict[str, Any]) -> str:
    kind: str = json.loads(p["metadata"]["annotations"]["gpupack.io/decision"])["kind"]
    return kind
