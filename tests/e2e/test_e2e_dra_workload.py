"""The mixed AI workload on GPUs published as ResourceSlices (the NVIDIA DRA driver
double), through the real kube-scheduler with gpupack's extender and its DRA allocator,
and the same workload through plain kube-scheduler (profile ``plain-kube-scheduler``)
on an identical pool, for contrast (tests/e2e/dra_workload.py: the pool and the pods).

gpupack: every pod bound, every claim allocated, no device allocated twice, every
LeaderWorkerSet group whole in one NVLink clique, and each allocation the extender
assumed at bind equal to the one kube-scheduler wrote (its disagreement count stays 0).
Plain kube-scheduler spreads the rerankers over the clique nodes (its default scoring
balances CPU and memory and does not see devices), so groups no longer fit."""

from __future__ import annotations

import json
from typing import Any

import dra_workload as W
from cluster import pending_report
from conftest import Space
from controlplane import PLAIN_SCHEDULER_NAME, Stack, claim_controller, extender_metrics
from controlplane import metric_sample as sample


def test_dra_workload_gpupack_and_plain(space: Space, admin: Any, core: Any, stack: Stack,
                                        scraper: str, capsys: Any) -> None:
    ours_pool, plain_pool = space.name, f"{space.name}-p"
    ns, plain_ns = space.namespace(), space.namespace("-plain")
    nodes = {p: W.pool(p) for p in (ours_pool, plain_pool)}
    names = {p: [n.name for n in v] for p, v in nodes.items()}
    try:
        with claim_controller(stack):
            for v in nodes.values():
                space.nodes += W.publish(admin, v)
            fams = extender_metrics(stack, admin, scraper)
            before = sample(fams, "gpupack_dra_predictions_checked",
                            outcome="disagree") if fams else None
            work = W.workload(ours_pool, "gpupack")
            W.submit(admin, ns, work)
            placed, _ = W.settle(admin, ns, len(work.pods), 240)
            W.submit(admin, plain_ns, W.workload(plain_pool, PLAIN_SCHEDULER_NAME))
            plain, _ = W.settle(admin, plain_ns, len(work.pods), 150)
            ours = W.outcome(admin, ns, placed, names[ours_pool])
            theirs = W.outcome(admin, plain_ns, plain, names[plain_pool])
            fams = extender_metrics(stack, admin, scraper)
            after = {o: sample(fams, "gpupack_dra_predictions_checked", outcome=o)
                     for o in ("agree", "disagree")} if fams else {}
    finally:
        W.cleanup(admin, [ns, plain_ns], [n for v in names.values() for n in v])
    with capsys.disabled():
        for who, o in (("gpupack", ours), ("plain kube-scheduler", theirs)):
            print(f"\n  e2e DRA workload, {who}: " + json.dumps({
                "bound": f"{o.pods_bound}/{o.pods}", "groups whole in one clique":
                f"{o.groups_complete}/{o.groups}", "claims allocated":
                f"{o.claims_allocated}/{o.claims}", "GPUs touched": o.gpus_touched,
                "whole nodes free": o.whole_nodes_free}))
        print(f"  extender's predictions checked against the allocator: {after}")
    assert not ours.unbound, f"gpupack left pods pending: {ours.unbound}; " + pending_report(
        core, ns)
    assert ours.claims_allocated == ours.claims > 0
    assert ours.double_allocated == [] and theirs.double_allocated == []
    assert ours.groups_complete == ours.groups == 3
    # Every allocation the extender assumed at bind was the one kube-scheduler made.
    if after:
        assert (after["disagree"] or 0) == (before or 0), after
        assert (after["agree"] or 0) > 0, after
    # The contrast: plain kube-scheduler keeps no more groups whole, and binds no more.
    assert ours.groups_complete >= theirs.groups_complete
    assert ours.pods_bound >= theirs.pods_bound
