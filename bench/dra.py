"""Placing GPU claims on the real control plane: gpupack (kube-scheduler with gpupack's
extender) against plain kube-scheduler's first fit, on GPUs published as ResourceSlices.

    python bench/dra.py [--nodes N] [--pods P] [--format json] [--dir /tmp/cp]

One pool of ``N`` nodes (tests/e2e/dra_workload.py): a quarter DynamicMIG H100 nodes
(every MIG placement a device, with counters), a tenth L40S nodes with shared GPUs
(consumable memory), the rest whole-GPU H100 nodes in NVLink cliques of four. ``P``
pods, small ones first: 40% ASR (a claim for a 1g.10gb partition), 15% TTS (2g.20gb),
15% embedders (6Gi of a shared L40S), 10% rerankers (one whole GPU), the rest in
LeaderWorkerSet groups of 2 pods x 8 GPUs (claim templates). Every claim comes from a
ResourceClaimTemplate. The workload runs under gpupack, then (its pods and claims
deleted) the same under the ``plain-kube-scheduler`` profile on the same pool.

Prints (``--format json``) exactly::

    {"gpupack": {"pods_bound": n, "groups_complete": g, "gpus_touched": t,
                 "whole_nodes_free": w, "pods_per_s": r},
     "default": {...the same keys},
     "agreement": {"claims": c, "same_device": s}}

``gpus_touched``: GPUs with any device allocated; ``whole_nodes_free``: nodes of the pool
with no device allocated; ``groups_complete``: groups whose two members are bound in one
clique; ``pods_per_s``: pods bound over the seconds from the first create to the last
bind. ``agreement``: the claims the extender compared (the allocation it assumed at bind
against the one kube-scheduler wrote) and how many had the same devices
(``gpupack_dra_predictions_checked_total``). Everything shares this machine's cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO))

import controlplane  # noqa: E402
import dra_workload as W  # noqa: E402
from kubernetes import client  # noqa: E402

NS = "bench-dra"


def pool_for(n: int) -> list[W.DraNode]:
    dyn = max(1, n // 4)
    l40s = max(1, n // 10)
    rest = max(0, n - dyn - l40s)
    cliques = [4] * (rest // 4) + ([rest % 4] if rest % 4 else [])
    return W.pool("dra", cliques=cliques, small=0, l40s=l40s, dyn=dyn)


def workload_for(p: int, scheduler: str) -> W.Workload:
    asr, tts, embed, rerank = round(0.4 * p), round(0.15 * p), round(0.15 * p), round(0.1 * p)
    groups = max(0, (p - asr - tts - embed - rerank) // 2)
    return W.workload("dra", scheduler, asr=asr, tts=tts, embed=embed, rerank=rerank,
                      groups=groups)


def publish(admin: Any, nodes: list[W.DraNode]) -> list[str]:
    """The pool's Nodes and slices, 8 at a time."""
    W.publish(admin, nodes[:1])  # the DeviceClasses once
    with ThreadPoolExecutor(max_workers=8) as ex:
        done = list(ex.map(lambda n: W.publish(admin, [n]), nodes[1:]))
    return [nodes[0].name] + [x for names in done for x in names]


def run(admin: Any, scheduler: str, pods: int, nodes: list[str], timeout_s: float
        ) -> tuple[dict[str, Any], W.Outcome]:
    core = client.CoreV1Api(admin)
    w = workload_for(pods, scheduler)
    objects = client.CustomObjectsApi(admin)
    for t in w.templates:
        objects.create_namespaced_custom_object(W.GROUP, W.VERSION, NS,
                                                "resourceclaimtemplates", t)
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as ex:
        list(ex.map(lambda p: core.create_namespaced_pod(NS, p), w.pods))
    created = time.monotonic() - start
    placed, last_bind = W.settle(admin, NS, len(w.pods), timeout_s, quiet_s=30.0)
    out = W.outcome(admin, NS, placed, nodes)
    seconds = max(last_bind, created, 1e-9)
    return out.as_json(seconds), out


def clear(admin: Any) -> None:
    """The run's pods, claims and templates gone (the pool stays)."""
    core = client.CoreV1Api(admin)
    W.cleanup(admin, [NS], [])
    end = time.monotonic() + 300
    while time.monotonic() < end:
        left = len(core.list_namespaced_pod(NS).items) + len(W.claims_in(admin, NS))
        if not left:
            return
        time.sleep(1.0)


def checked(stack: controlplane.Stack, admin: Any, token: str) -> tuple[float, float]:
    for _ in range(30):
        fams = controlplane.extender_metrics(stack, admin, token)
        if fams is not None:
            return (controlplane.metric_sample(fams, "gpupack_dra_predictions_checked",
                                               outcome="agree") or 0.0,
                    controlplane.metric_sample(fams, "gpupack_dra_predictions_checked",
                                               outcome="disagree") or 0.0)
        time.sleep(1.0)
    raise RuntimeError("the extender's metrics refused the token for 30 s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=60)
    p.add_argument("--pods", type=int, default=120)
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds each profile's pods may take to bind (default 900)")
    p.add_argument("--dir", type=Path, default=None,
                   help="a stack folder: reuse the stack running there, else start one")
    p.add_argument("--format", choices=["table", "json"], default="table")
    args = p.parse_args(argv)
    log = (lambda _m: None) if args.format == "json" else (lambda m: print(m, flush=True))

    base = args.dir or Path(tempfile.mkdtemp(prefix="gpupack-dra-bench-"))
    reuse = controlplane.Stack(base.resolve())
    started = not (reuse.state_file.exists() and reuse.alive("apiserver"))
    stack = controlplane.up(base, agent=False, standby=False) if started else reuse
    nodes: list[str] = []
    try:
        admin = controlplane._api(stack.kubeconfig)
        controlplane.ensure_namespace(admin, NS)
        with controlplane.claim_controller(stack), \
                controlplane.metrics_reader(admin, "bench-dra", "bench-dra") as token:
            t0 = time.monotonic()
            nodes = publish(admin, pool_for(args.nodes))
            log(f"pool: {len(nodes)} nodes published in {time.monotonic() - t0:.0f} s")
            time.sleep(5.0)  # the extender's and the schedulers' watches catch up
            a0, d0 = checked(stack, admin, token)
            ours, o = run(admin, controlplane.SCHEDULER_NAME, args.pods, nodes, args.timeout)
            a1, d1 = checked(stack, admin, token)
            log(f"gpupack: {ours} (claims {o.claims_allocated}/{o.claims} allocated, "
                f"{len(o.double_allocated)} devices allocated twice)")
            clear(admin)
            theirs, t = run(admin, controlplane.PLAIN_SCHEDULER_NAME, args.pods, nodes,
                            args.timeout)
            log(f"default: {theirs} (claims {t.claims_allocated}/{t.claims} allocated)")
            clear(admin)
    finally:
        if nodes:
            W.cleanup(controlplane._api(stack.kubeconfig), [NS], nodes)
        if started:
            stack.down()
    out = {"gpupack": ours, "default": theirs,
           "agreement": {"claims": int((a1 - a0) + (d1 - d0)), "same_device": int(a1 - a0)}}
    if args.format == "json":
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
