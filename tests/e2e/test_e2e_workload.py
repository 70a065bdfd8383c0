"""A mixed AI-pipeline workload through the real kube-scheduler, the gpupack extender
and webhook, and the same workload through plain kube-scheduler for contrast.

The cluster (one pool for each scheduler, identical):
- two H100 nodes in MIG mixed strategy (slices for ASR and TTS), one of them with four
  whole GPUs beside its slices,
- one L40S node, time-sliced (4 GPUs x 4 replicas),
- six whole-GPU H100 nodes of 8 GPUs: four in NVLink clique a, two in clique b.
The workload, created in this order (small pods first: the fragmenting order):
- 10 ASR pods and 4 TTS pods carrying only ``gpupack.io/class`` and
  ``gpupack.io/gpu-memory`` (the webhook picks the concrete resource),
- 6 embedders on time-sliced shares (``gpupack.io/isolation: shared``),
- 4 single-GPU rerankers (``nvidia.com/gpu: 1``),
- three LeaderWorkerSet groups of 2 pods x 8 GPUs.
Whole nodes are just enough for the groups if nothing small lands on them; the plain
scheduler, spreading by least allocation, puts rerankers there.
"""

from __future__ import annotations

import copy
from typing import Any

from cluster import (
    GPU,
    bound,
    create_nodes,
    create_pods,
    group_outcomes,
    h100_mig,
    h100_whole,
    l40s_shared,
    lws_member,
    overcommits,
    pending_report,
    pod,
    pods_in,
    wait_for_webhook,
)
from conftest import Space
from controlplane import PLAIN_SCHEDULER_NAME, Stack


def cluster(prefix: str, pool: str) -> list[Any]:
    return [
        h100_mig(f"{prefix}-mig-0", pool, {"1g.10gb": 28, "2g.20gb": 6, "3g.40gb": 4}),
        h100_mig(f"{prefix}-mig-1", pool, {"1g.10gb": 28}, whole=4),
        l40s_shared(f"{prefix}-l40s-0", pool),
        *[h100_whole(f"{prefix}-a-{i}", pool, clique=f"{prefix}-clique-a") for i in range(4)],
        *[h100_whole(f"{prefix}-b-{i}", pool, clique=f"{prefix}-clique-b") for i in range(2)],
    ]


def workload(pool: str) -> list[dict[str, Any]]:
    pods = []
    pods += [pod(f"asr-{i}", pool=pool, annotations={
        "gpupack.io/class": "asr", "gpupack.io/gpu-memory": "8Gi"}) for i in range(10)]
    pods += [pod(f"tts-{i}", pool=pool, annotations={
        "gpupack.io/class": "tts", "gpupack.io/gpu-memory": "16Gi"}) for i in range(4)]
    pods += [pod(f"embed-{i}", pool=pool, annotations={
        "gpupack.io/gpu-memory": "6Gi", "gpupack.io/isolation": "shared"}) for i in range(6)]
    pods += [pod(f"rerank-{i}", pool=pool, limits={GPU: "1"}) for i in range(4)]
    for g in range(3):
        pods += [lws_member(f"llm-{g}", w, 2, 8, pool) for w in range(2)]
    return pods


def as_plain(stored: dict[str, Any], pool: str) -> dict[str, Any]:
    """The same pod as the webhook left it (its concrete GPU resource), for plain
    kube-scheduler on the other pool."""
    p = copy.deepcopy(stored)
    meta = p["metadata"]
    p["metadata"] = {"name": meta["name"], "labels": meta.get("labels") or {},
                     "annotations": {k: v for k, v in (meta.get("annotations") or {}).items()
                                     if k.startswith("leaderworkerset")}}
    spec = p["spec"]
    p["spec"] = {"containers": [{"name": c["name"], "image": c["image"],
                                 "resources": c.get("resources") or {}}
                                for c in spec["containers"]],
                 "schedulerName": PLAIN_SCHEDULER_NAME,
                 "terminationGracePeriodSeconds": 0,
                 "nodeSelector": {"e2e.gpupack.io/pool": pool}}
    return p


def settle(core: Any, ns: str, n: int, timeout_s: float) -> list[dict[str, Any]]:
    """Wait until all ``n`` pods are bound, or until nothing changed for 10 s."""
    import time

    last, since = -1, time.monotonic()
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        pods = pods_in(core, ns)
        done = sum(1 for p in pods if p["spec"].get("nodeName"))
        if done == n:
            return pods
        if done != last:
            last, since = done, time.monotonic()
        elif time.monotonic() - since > 10:
            return pods
        time.sleep(0.3)
    return pods_in(core, ns)


def scheduling_trail(stack: Stack, ns: str, lines: int = 60) -> str:
    """What kube-scheduler and the extender logged about ``ns`` (both replicas): each
    bind with kube-scheduler's count of feasible nodes, and the extender's lines. A
    failure of this test was once not reproducible (1 run in 4); this is what it lacked."""
    out = []
    for component in ("scheduler", "scheduler-b", "extender", "extender-b"):
        try:
            text = stack.log_file(component).read_text(errors="replace").splitlines()
        except OSError:
            continue
        mine = [t for t in text if ns in t][-lines:]
        if mine:
            out.append(f"--- {component}\n" + "\n".join(t[:400] for t in mine))
    return "\n".join(out)


def test_mixed_workload_gpupack_and_plain(space: Space, core: Any, stack: Stack,
                                          capsys: Any) -> None:
    ns = space.namespace()
    plain_ns = space.namespace("-plain")
    space.nodes += create_nodes(core, cluster(space.name, space.name))
    plain_pool = f"{space.name}-p"
    space.nodes += create_nodes(core, cluster(plain_pool, plain_pool))
    # The webhook sees the new nodes through its watch; a dry-run create runs admission.
    probe = pod("probe", pool=space.name, annotations={
        "gpupack.io/class": "asr", "gpupack.io/gpu-memory": "8Gi"})

    wait_for_webhook(core, ns, probe, "nvidia.com/mig-")

    pods = workload(space.name)
    stored = create_pods(core, ns, pods)
    for p in stored:
        assert p["spec"]["schedulerName"] == "gpupack", p["metadata"]["name"]
        limits = p["spec"]["containers"][0]["resources"].get("limits") or {}
        assert any(k.startswith("nvidia.com/") for k in limits), (p["metadata"]["name"], limits)
    asr = [p for p in stored if p["metadata"]["name"].startswith("asr-")]
    assert all("nvidia.com/mig-1g.10gb" in p["spec"]["containers"][0]["resources"]["limits"]
               for p in asr), [p["spec"]["containers"][0]["resources"] for p in asr]
    embed = [p for p in stored if p["metadata"]["name"].startswith("embed-")]
    assert all("nvidia.com/gpu.shared" in p["spec"]["containers"][0]["resources"]["limits"]
               for p in embed)

    placed = settle(core, ns, len(pods), 180)
    create_pods(core, plain_ns, [as_plain(p, plain_pool) for p in stored])
    plain = settle(core, plain_ns, len(pods), 120)

    def summary(name: str, result: list[dict[str, Any]]) -> dict[str, Any]:
        groups = group_outcomes(core, result)
        return {"scheduler": name,
                "bound": sum(1 for p in result if p["spec"].get("nodeName")),
                "pods": len(result),
                "groups complete in one clique": sum(g.one_clique for g in groups.values()),
                "groups split across cliques": sum(g.complete and not g.one_clique
                                                   for g in groups.values()),
                "groups partial": sum(g.partial for g in groups.values()),
                "over-committed": len(overcommits(core, result))}

    ours, theirs = summary("gpupack", placed), summary("plain kube-scheduler", plain)
    with capsys.disabled():
        print(f"\n  e2e mixed workload: {ours}\n  e2e mixed workload: {theirs}")

    unbound = [p["metadata"]["name"] for p in placed if not p["spec"].get("nodeName")]
    assert not unbound, (f"gpupack left pods pending: {unbound}; "
                         f"{pending_report(core, ns)}; bound: {bound(placed)}\n"
                         + scheduling_trail(stack, ns))
    groups = group_outcomes(core, placed)
    assert len(groups) == 3
    for g in groups.values():
        assert g.one_clique, f"group {g.name} on {g.nodes} (cliques {g.cliques})"
        assert len(set(g.nodes)) == 2
    assert overcommits(core, placed) == []
    # The contrast: plain kube-scheduler places no more of it, and keeps no more groups whole.
    assert ours["bound"] >= theirs["bound"]
    assert ours["groups complete in one clique"] >= theirs["groups complete in one clique"]
