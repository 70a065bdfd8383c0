"""A hostile tenant against the real control plane: the attacks of issue 35, replayed.

    python bench/hostile.py --tenant [--dir DIR] [--format table|json]

Starts the stack of tests/e2e/controlplane.py (etcd, kube-apiserver, kube-scheduler
v1.37.2 built from their modules, gpupack's extender, webhook and node agent, as the
chart deploys them) in DIR (a temporary folder by default), runs each attack as someone
who may only create pods in their own namespace (or reach the pod network), and prints
what it achieved, beside what the issue measured before the fixes. Slow: about three
minutes (one group reservation must expire, and the extender is restarted once).

Attacks, in order (the JSON keys):

- ``forged_reviews_no_cert``: 24 AdmissionReviews for 30Gi pods of namespace ``evil``
  posted to the webhook's port without a client certificate;
- ``forged_reviews_with_cert``: the same with the API server's own client certificate
  (as if the webhook could not verify its caller): a victim's server-side dry run in
  another namespace, before and after;
- ``free_reservations``: two pending 1-GPU pods labelled as groups of 64 on a 16-node,
  128-GPU pool (the stack's --max-namespace-reserved-gpus is 64);
- ``exclusive_squatters``: one 1-GPU pod per NVLink clique with forged LWS labels and
  the exclusive-topology annotation, then a real 2 x 8-GPU group of another namespace;
- ``unreadable_share``: a bound 40Gi share's gpu-memory set to "lots", the extender
  restarted, then a 20Gi share on the same one-GPU L40S;
- ``extender_rights``: the extender's own token asked to delete a pod, create a
  PersistentVolume and take kube-scheduler's Lease.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO))

import cluster  # noqa: E402
import controlplane  # noqa: E402
import tenants  # noqa: E402

# What issue 35 measured before the fixes, as it states it.
BEFORE = {
    "forged_reviews_no_cert": "answered (no credentials asked)",
    "forged_reviews_with_cert": "victim: nvidia.com/mig-3g.40gb -> nvidia.com/gpu.shared",
    "free_reservations": "128 of 128 GPUs held by one namespace",
    "exclusive_squatters": "the real LLM group left waiting",
    "unreadable_share": "skipped after a restart: a share put beside it (over-commit)",
    "extender_rights": "allowed (kube-scheduler's account)",
}


def _namespace(admin: Any, name: str) -> str:
    controlplane.ensure_namespace(admin, name)
    return name


def forged_reviews(stack: controlplane.Stack, admin: Any, core: Any) -> dict[str, Any]:
    victim = _namespace(admin, "bench-victim")
    tenants.issue_pool(core, "bench-forged")
    probe = cluster.pod("probe", annotations={"gpupack.io/gpu-memory": "30Gi"},
                        pool="bench-forged")
    cluster.wait_for_webhook(core, victim, probe, tenants.MIG)
    before = tenants.decision(core, victim, "bench-forged")[0]
    no_cert = tenants.forge(stack, "bench-forged", "evil", 24, None)
    with_cert = tenants.forge(stack, "bench-forged", "evil", 24, "webhook-client")
    after = tenants.decision(core, victim, "bench-forged")[0]
    return {
        "forged_reviews_no_cert": {
            "now": f"{no_cert.count(401)} of {len(no_cert)} refused with HTTP 401",
            "fails": set(no_cert) == {401}},
        "forged_reviews_with_cert": {
            "now": f"victim: {before} -> {after} ({with_cert.count(200)} forged claims held "
                   "for namespace evil)",
            "fails": before == after == tenants.MIG},
    }


def free_reservations(stack: controlplane.Stack, admin: Any, core: Any) -> dict[str, Any]:
    ns = _namespace(admin, "bench-evil-groups")
    cluster.create_nodes(core, [cluster.h100_whole(f"bench-res-{i:02d}", "bench-res")
                                for i in range(16)])
    cluster.create_pods(core, ns, [tenants.labelled("a", 64, 1, "bench-res"),
                                   tenants.labelled("b", 64, 1, "bench-res")])
    held = cluster.wait_for(lambda: tenants.records(core, ns), 30, "a reservation")
    time.sleep(5)  # a second group would be reserved within the book's next passes
    held = tenants.records(core, ns)
    gpus = sum(len(r["m"]) for r in held.values())
    cap = controlplane.E2E_NAMESPACE_RESERVED_GPUS
    return {"free_reservations": {
        "now": f"{len(held)} group(s), {gpus} of 128 GPUs held by the namespace "
               f"(cap {cap}); the other waits",
        "fails": len(held) == 1 and gpus <= cap}}


def exclusive_squatters(stack: controlplane.Stack, admin: Any, core: Any) -> dict[str, Any]:
    evil, ns = _namespace(admin, "bench-evil-lws"), _namespace(admin, "bench-llm")
    cliques = ["bench-c0", "bench-c1"]
    cluster.create_nodes(core, [cluster.h100_whole(f"bench-{c}-{i}", "bench-ex", clique=c)
                                for c in cliques for i in range(3)])
    for c, clique in enumerate(cliques):
        squatter = cluster.lws_member(f"squat{c}", 0, 1, 1, "bench-ex")
        squatter["metadata"]["annotations"][cluster.LWS + "exclusive-topology"] = tenants.CLIQUE
        squatter["spec"]["schedulerName"] = cluster.MANUAL_SCHEDULER
        cluster.create_pods(core, evil, [squatter])
        cluster.bind_with_records(core, evil, f"squat{c}-0", f"bench-{clique}-0", {})
    members = [cluster.lws_member("vllm", w, 2, 8, "bench-ex") for w in range(2)]
    cluster.create_pods(core, ns, members)
    start = time.monotonic()
    try:
        cluster.wait_for(lambda: len(cluster.bound(cluster.pods_in(core, ns))) == 2, 60,
                         "the real group")
        now, fails = f"the real group bound in {time.monotonic() - start:.2f}s", True
    except AssertionError:
        now, fails = "the real group still waits after 60 s", False
    return {"exclusive_squatters": {"now": now, "fails": fails}}


def unreadable_share(stack: controlplane.Stack, admin: Any, core: Any) -> dict[str, Any]:
    ns = _namespace(admin, "bench-rewrite")
    cluster.create_nodes(core, [cluster.l40s_shared("bench-l40s", "bench-l40s", gpus=1)])

    def share(name: str, memory: str) -> dict[str, Any]:
        return cluster.pod(name, pool="bench-l40s", limits={tenants.SHARED: "1"},
                           scheduler="gpupack", annotations={"gpupack.io/gpu-memory": memory})

    cluster.wait_for(lambda: tenants.admitted(core, ns, share("probe", "40Gi")), 30,
                     "the webhook to see the L40S")
    cluster.create_pods(core, ns, [share("big", "40Gi")])
    cluster.wait_for(lambda: "big" in cluster.bound(cluster.pods_in(core, ns)), 60, "bind")
    core.patch_namespaced_pod("big", ns, {"metadata": {"annotations": {
        "gpupack.io/gpu-memory": "lots"}}})
    active = "extender" + controlplane.active_replica(stack, admin)
    stack.restart(active)
    cluster.wait_for(lambda: tenants.ready(stack, active), 60, "the restarted extender")
    cluster.create_pods(core, ns, [share("small", "20Gi")])
    time.sleep(10)
    placed = "small" in cluster.bound(cluster.pods_in(core, ns))
    return {"unreadable_share": {
        "now": "the 20Gi share was placed beside it" if placed else
               "counted at its worst: the 20Gi share waits",
        "fails": not placed}}


def extender_rights(stack: controlplane.Stack, admin: Any, core: Any) -> dict[str, Any]:
    from kubernetes import client

    ns = _namespace(admin, "bench-victims")
    cluster.create_pods(core, ns, [cluster.pod("victim", scheduler=cluster.MANUAL_SCHEDULER)])
    api = controlplane._api(stack.dir / "kubeconfigs" / "extender")
    ext = client.CoreV1Api(api)
    leases = client.CoordinationV1Api(api)
    name = f"{controlplane.RELEASE}-scheduler"

    def status(call: Callable[[], Any]) -> int:
        try:
            call()
        except client.ApiException as e:
            return int(e.status)
        return 200

    lease = leases.read_namespaced_lease(name, controlplane.NAMESPACE)
    lease.spec.holder_identity = "bench_0"
    got = {
        "delete a pod": status(lambda: ext.delete_namespaced_pod("victim", ns,
                                                                 grace_period_seconds=0)),
        "create a PV": status(lambda: ext.create_persistent_volume({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "bench-pv"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "hostPath": {"path": "/tmp/x"}}})),
        "take the Lease": status(lambda: leases.replace_namespaced_lease(
            name, controlplane.NAMESPACE, lease)),
    }
    api.close()
    return {"extender_rights": {
        "now": ", ".join(f"{k}: HTTP {v}" for k, v in got.items()),
        "fails": set(got.values()) == {403}}}


ATTACKS = (forged_reviews, free_reservations, exclusive_squatters, unreadable_share,
           extender_rights)


def run(dir_: Path | None, fmt: str) -> int:
    base = dir_ or Path(tempfile.mkdtemp(prefix="gpupack-hostile-tenant-"))
    stack = controlplane.up(base, plain=False, standby=False)
    results: dict[str, Any] = {}
    try:
        admin = controlplane._api(stack.kubeconfig)
        from kubernetes import client

        core = client.CoreV1Api(admin)
        for attack in ATTACKS:
            results.update(attack(stack, admin, core))
    finally:
        stack.down()
    out = {k: {"before": BEFORE[k], **v} for k, v in results.items()}
    if fmt == "json":
        print(json.dumps(out, indent=1))
    else:
        print("| attack | before (issue 35) | now | attack fails |")
        print("|---|---|---|---|")
        for k, v in out.items():
            print(f"| {k} | {v['before']} | {v['now']} | {'yes' if v['fails'] else 'NO'} |")
    return 0 if all(v["fails"] for v in out.values()) else 1
