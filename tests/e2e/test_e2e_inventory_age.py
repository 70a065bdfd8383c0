"""The age limit on node agent inventories on the real control plane.

A share on a time-sliced L40S declared 4Gi; the node's inventory says the agent saw it
peak at 40,000 MiB. While the inventory is fresh the extender books the peak plus 10%
and a 16Gi share does not fit beside it. Written long ago (the agent stopped), the
inventory is ignored: the share is booked at 4Gi and the 16Gi share binds. Fresh again,
the peak counts again; left to age in place, with no write to the Node at all, it is
dropped when it passes the extender's --inventory-max-age (900 s by default).
"""

from __future__ import annotations

import json
import time
from typing import Any

from cluster import (
    MANUAL_SCHEDULER,
    SHARED,
    bind_with_records,
    bound,
    create_nodes,
    l40s_shared,
    pod,
    pods_in,
    wait_for,
    wait_for_webhook,
)
from conftest import Space
from controlplane import (
    SCHEDULER_NAME,
    Stack,
    extender_metrics,
    metric_sample,
    webhook_metrics,
)

MAX_AGE_S = 900  # the extender's default --inventory-max-age
PEAK_MIB = 40_000
BOOKED_AT_PEAK = -(-PEAK_MIB * 110 // 100)  # observed peak plus 10%
DECLARED_MIB = 4 * 1024
TTS_MIB = 16 * 1024


def inventory(node: str, pod_key: str, ts: int) -> str:
    return json.dumps({"v": 1, "node": node, "ts": ts, "gpus": [
        {"i": 0, "uuid": f"GPU-e2e-{node}-0", "model": "NVIDIA-L40S", "mem": 46068,
         "used": PEAK_MIB, "mode": "shared",
         "pods": [{"pod": pod_key, "used": PEAK_MIB, "peak": PEAK_MIB}]}]})


def test_a_stale_inventory_is_not_trusted(stack: Stack, admin: Any, core: Any, space: Space,
                                          scraper: str) -> None:
    pool = space.name
    node = f"{pool}-l40s"
    space.nodes += create_nodes(core, [l40s_shared(node, pool, gpus=1)])
    ns = space.namespace()
    key = f"{ns}/big"

    def write(ts: int) -> None:
        core.patch_node(node, {"metadata": {"annotations": {
            "gpupack.io/inventory": inventory(node, key, ts)}}})

    def booked() -> float | None:
        fams = extender_metrics(stack, admin, scraper)
        return None if fams is None else metric_sample(
            fams, "gpupack_gpu_memory_booked_mib", node=node, gpu="0")

    def stale() -> float:
        fams = extender_metrics(stack, admin, scraper) or {}
        return metric_sample(fams, "gpupack_node_inventories_stale") or 0.0

    def webhook_stale() -> float:
        # The webhook keeps a cache of its own and applies the same limit to it.
        fams = webhook_metrics(stack, scraper) or {}
        return metric_sample(fams, "gpupack_node_inventories_stale") or 0.0

    def webhook_stale_is(n: float, what: str) -> None:
        wait_for(lambda: webhook_stale() == n, 30, what)

    def booked_at(mib: int, what: str, timeout_s: float = 60) -> None:
        wait_for(lambda: booked() == mib, timeout_s, what)

    # Pods only once the webhook's view has the node: it refuses a share where it knows
    # of no time-sliced GPU.
    probe = pod("probe", pool=pool, annotations={"gpupack.io/gpu-memory": "16Gi",
                                                 "gpupack.io/isolation": "shared"})
    wait_for_webhook(core, ns, probe, SHARED)
    # The share the agent saw grow, bound as gpupack's bind records it.
    big = pod("big", pool=pool, scheduler=MANUAL_SCHEDULER, cpu="10m", memory="16Mi",
              limits={SHARED: "1"}, annotations={"gpupack.io/gpu-memory": "4Gi"})
    core.create_namespaced_pod(ns, big)
    bind_with_records(core, ns, "big", node, {"gpupack.io/gpus": "0"})
    write(int(time.time()))
    booked_at(BOOKED_AT_PEAK, "the share booked at its observed peak (fresh inventory)")
    before = stale()
    webhook_before = webhook_stale()

    core.create_namespaced_pod(ns, pod(
        "tts", pool=pool, scheduler=SCHEDULER_NAME, limits={SHARED: "1"},
        annotations={"gpupack.io/gpu-memory": "16Gi"}))
    time.sleep(5)  # kube-scheduler tries it meanwhile: 44,000 + 16,384 > 46,068 MiB
    assert "tts" not in bound(pods_in(core, ns))

    # The agent stopped long ago: its last inventory is ignored, the 4Gi share is
    # counted at 4Gi and the 16Gi one binds beside it.
    write(int(time.time()) - 10 * MAX_AGE_S)
    wait_for(lambda: bound(pods_in(core, ns)).get("tts") == node, 60,
             "the 16Gi share bound beside the 4Gi one (stale inventory)")
    booked_at(DECLARED_MIB + TTS_MIB, "both shares booked at what they declared")
    assert stale() == before + 1
    webhook_stale_is(webhook_before + 1, "the webhook ignoring the stale inventory too")

    # Written again: trusted again.
    write(int(time.time()))
    booked_at(BOOKED_AT_PEAK + TTS_MIB, "the observed peak booked again (fresh inventory)")
    assert stale() == before
    webhook_stale_is(webhook_before, "the webhook trusting the inventory again")

    # Ageing in place: 8 s from the limit, then no write to the Node at all.
    write(int(time.time()) - MAX_AGE_S + 8)
    booked_at(BOOKED_AT_PEAK + TTS_MIB, "the observed peak booked (inventory still fresh)")
    booked_at(DECLARED_MIB + TTS_MIB,
              "the peak dropped once the inventory aged past the limit", timeout_s=45)
    assert stale() == before + 1
    webhook_stale_is(webhook_before + 1, "the webhook dropping the inventory that aged")
