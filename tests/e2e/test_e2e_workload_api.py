"""LLM groups beside kube-scheduler's own gang scheduling (issue 39), on the real control
plane twice: two stacks of this module's own, started one after the other and alike but
for the ``GenericWorkload`` gate: off (v1.37.2's default: the API server drops
``spec.schedulingGroup`` and serves no PodGroup), and on (kube-apiserver and
kube-scheduler, ``--runtime-config=scheduling.k8s.io/v1beta1=true``). The session's
stack, which the other tests share, is left as it is.

The same workload on both, on the same pools as ``test_e2e_workload.py``: the singles
(ASR and TTS pods the webhook converts to MIG slices, embedders on shares, single-GPU
rerankers), then four groups of 2 pods x 8 GPUs made as LeaderWorkerSet's controller
makes them under lws#982 (its labels, and ``spec.schedulingGroup`` naming a gang
PodGroup of ``minCount: 2``). The whole-GPU nodes hold three such groups (four nodes in
NVLink clique a, two in clique b), so one group must wait.

* gate off: gpupack's own all-or-nothing (the groups by their LWS labels);
* gate on: kube-scheduler takes each PodGroup in one cycle and calls the extender member
  by member; gpupack's group is the PodGroup, and each member is steered to its room.

On both: three groups bound whole, each inside one clique, on exactly the nodes and GPUs
of the room gpupack's record held for it; the fourth holds nothing and none of its pods
is bound; no group partial; no GPU over-committed. The time from a group's creation to
its last member bound is printed for each stack, and with the gate on the PodGroups'
``PodGroupInitiallyScheduled`` conditions and kube-scheduler's log show that the gang
cycle (not pod-by-pod scheduling) placed them.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import controlplane
import pytest
from cluster import (
    GPU,
    create_nodes,
    create_pods,
    group_outcomes,
    lws_member,
    overcommits,
    pending_report,
    pod,
    pods_in,
    wait_for_webhook,
)
from conftest import Space, need_go
from test_e2e_workload import cluster, scheduling_trail, workload

from kube.groups.reservations import RECORD_SELECTOR

GATES = ("GenericWorkload=true",)
RUNTIME = ("scheduling.k8s.io/v1beta1=true",)
GROUPS = 4  # 2 x 8 GPUs each; the pool's whole nodes hold three


@pytest.fixture(scope="module", params=["off", "on"])
def twin(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[controlplane.Stack, bool]]:
    """A stack of this module's own, one at a time, alike but for the gate (so that their
    timings compare): kube-apiserver and one kube-scheduler with its extender, the
    webhook and the MIG manager double (no plain scheduler, no agent, no standby); "on"
    adds GenericWorkload and serves scheduling.k8s.io/v1beta1. (The session's stack,
    with the gate off, is left as the other tests know it.)"""
    need_go()
    gate = request.param == "on"
    keep = os.environ.get("GPUPACK_E2E_TWIN_DIR")
    base = (Path(keep) / request.param if keep
            else tmp_path_factory.mktemp(f"control-plane-gate-{request.param}"))
    try:
        s = controlplane.up(base, plain=False, agent=False, standby=False,
                            feature_gates=GATES if gate else (),
                            runtime_config=RUNTIME if gate else ())
    except controlplane.StackError as e:
        st = controlplane.Stack(base.resolve())
        if st.state_file.exists():
            st.down()
        raise AssertionError(f"the control plane (gate {request.param}) did not come up: "
                             f"{e}") from None
    # Its audit log counts for the chart's grants (test_e2e_z_rbac.py): the PodGroup and
    # Workload watches happen only on the gated one.
    controlplane.EXTRA_AUDIT_LOGS.append(s.dir / "logs" / "audit.log")
    try:
        yield s, gate
    finally:
        s.down()


Room = tuple[str, tuple[int, ...], str | None]  # node, GPUs, the pod it names (if any)


class RecordWatch:
    """Every reservation record gpupack writes while it runs (a watch resumed from the
    last version, so that records that live a second are seen): group -> its rooms as
    the last revision seen says. (A revision naming a member created after the room was
    reserved may never reach the API: the writer keeps only the latest write per record,
    and a delete at completion replaces it.)"""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.rooms: dict[str, list[Room]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RecordWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        from kubernetes import watch

        listed = self.core.list_namespaced_config_map(controlplane.NAMESPACE,
                                                      label_selector=RECORD_SELECTOR)
        for obj in listed.items:
            self._see(obj)
        rv = listed.metadata.resource_version
        while not self._stop.is_set():
            # Resumed from the last version seen: no record is missed between watches.
            w = watch.Watch()
            with contextlib.suppress(Exception):
                for ev in w.stream(self.core.list_namespaced_config_map, controlplane.NAMESPACE,
                                   label_selector=RECORD_SELECTOR, timeout_seconds=2,
                                   resource_version=rv):
                    rv = ev["object"].metadata.resource_version or rv
                    if ev["type"] != "DELETED":
                        self._see(ev["object"])
                    if self._stop.is_set():
                        break

    def _see(self, obj: Any) -> None:
        if not obj.data or "reservation" not in obj.data:
            return
        rec = json.loads(obj.data["reservation"])
        self.rooms[rec["g"]] = [(room["n"], tuple(room["g"]), room.get("p"))
                                for room in rec["m"].values()]


def group_members(pool: str, g: int, gang: bool) -> list[dict[str, Any]]:
    """A group's two pods as LWS's controller makes them under lws#982: its labels and
    size annotation, and spec.schedulingGroup naming the group's PodGroup."""
    out = []
    for w in range(2):
        p = lws_member(f"llm-{g}", w, 2, 8, pool)
        p["spec"]["schedulingGroup"] = {"podGroupName": f"llm-{g}"}
        out.append(p)
    del gang  # the same pods either way: with the gate off the API server drops the field
    return out


def pod_group(g: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": f"llm-{g}"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}}


def run(core: Any, admin: Any, stack: controlplane.Stack, space: Space, gang: bool
        ) -> dict[str, Any]:
    """The workload on ``stack``; what came of it (asserted by the caller)."""
    from kubernetes import client

    ns = space.namespace()
    space.nodes += create_nodes(core, cluster(space.name, space.name))
    wait_for_webhook(core, ns, pod("probe", pool=space.name, annotations={
        "gpupack.io/class": "asr", "gpupack.io/gpu-memory": "8Gi"}), "nvidia.com/mig-")
    singles = [p for p in workload(space.name) if not p["metadata"]["name"].startswith("llm-")]
    custom = client.CustomObjectsApi(admin)
    created: dict[str, float] = {}
    complete: dict[str, float] = {}
    with RecordWatch(core) as records:
        create_pods(core, ns, singles)
        for g in range(GROUPS):
            if gang:  # LWS's controller makes the PodGroup before the pods
                custom.create_namespaced_custom_object(
                    "scheduling.k8s.io", "v1beta1", ns, "podgroups", pod_group(g))
            created[f"llm-{g}"] = time.monotonic()
            stored = create_pods(core, ns, group_members(space.name, g, gang))
            has_field = [bool(p["spec"].get("schedulingGroup")) for p in stored]
            assert has_field == [gang, gang], (
                "the API server keeps spec.schedulingGroup only with the gate on")
        total = len(singles) + 2 * GROUPS
        end = time.monotonic() + 240
        quiet_until: float | None = None
        while time.monotonic() < end:
            pods = pods_in(core, ns)
            now = time.monotonic()
            for name, outcome in group_outcomes(core, pods).items():
                if outcome.complete and name not in complete:
                    complete[name] = now - created[name]
            singles_bound = sum(1 for p in pods if p["spec"].get("nodeName")
                                and not p["metadata"]["name"].startswith("llm-"))
            if len(complete) >= GROUPS - 1 and singles_bound == len(singles):
                # Then 10 s more: the group left over must still hold nothing.
                quiet_until = quiet_until or now + 10
                if now >= quiet_until:
                    break
            time.sleep(0.2)
        pods = pods_in(core, ns)
    outcomes = group_outcomes(core, pods)
    conditions = {}
    if gang:
        for g in range(GROUPS):
            obj = custom.get_namespaced_custom_object("scheduling.k8s.io", "v1beta1", ns,
                                                      "podgroups", f"llm-{g}")
            cond = next((c for c in (obj.get("status") or {}).get("conditions") or []
                         if c.get("type") == "PodGroupInitiallyScheduled"), {})
            conditions[f"llm-{g}"] = (cond.get("status"), cond.get("reason"))
    return {"ns": ns, "pods": pods, "total": total, "outcomes": outcomes,
            "complete_s": complete, "records": records, "conditions": conditions}


def check(core: Any, stack: controlplane.Stack, got: dict[str, Any], label: str,
          capsys: Any, key: Any) -> dict[str, Any]:
    """``key(lws name)``: gpupack's key of that group on this stack."""
    ns, pods, outcomes = got["ns"], got["pods"], got["outcomes"]
    whole = [g for g in outcomes.values() if g.complete]
    times = sorted(got["complete_s"].values())
    figures = {
        "stack": label,
        "groups whole in one clique": sum(g.one_clique for g in whole),
        "groups partial": sum(g.partial for g in outcomes.values()),
        "groups holding nothing": sum(not g.nodes for g in outcomes.values()),
        "singles bound": sum(1 for p in pods if p["spec"].get("nodeName")
                             and not p["metadata"]["name"].startswith("llm-")),
        "time to complete per group (s)": [round(t, 2) for t in times],
        "median (s)": round(statistics.median(times), 2) if times else None,
        "max (s)": round(max(times), 2) if times else None,
        "over-committed": len(overcommits(core, pods)),
        "groups with a record seen in the API": sum(
            1 for g in whole if key(g.name) in got["records"].rooms),
    }
    with capsys.disabled():
        print(f"\n  e2e groups, {label}: {json.dumps(figures)}")
    trail = f"{pending_report(core, ns)}\n" + scheduling_trail(stack, ns)
    assert figures["groups partial"] == 0, trail
    assert figures["groups whole in one clique"] == GROUPS - 1, trail
    assert len(whole) == GROUPS - 1 and figures["groups holding nothing"] == 1, trail
    assert figures["singles bound"] == got["total"] - 2 * GROUPS, trail
    assert figures["over-committed"] == 0
    # The rooms gpupack reserved are where the members landed: nodes and GPUs, and each
    # member a record named on its own room. A group that completes before its record's
    # write left the queue has no record in the API at all (the writer keeps the latest
    # write per record: the delete); the extender's log then says where its room was.
    rooms = got["records"].rooms
    reserved = reservations_logged(stack, ns)
    for g in whole:
        members = [p for p in pods if (p["metadata"].get("labels") or {}).get(
            "leaderworkerset.sigs.k8s.io/name") == g.name]
        landed = {}
        for p in members:
            gpus = tuple(int(i) for i in
                         p["metadata"]["annotations"]["gpupack.io/gpus"].split(","))
            assert len(gpus) == 8 and int(
                p["spec"]["containers"][0]["resources"]["limits"][GPU]) == 8
            landed[f"{ns}/{p['metadata']['name']}"] = (p["spec"]["nodeName"], gpus)
        held = rooms.get(key(g.name))
        if held is None:
            assert key(g.name) in reserved, f"{g.name}: no record, no reservation logged"
            assert {n for n, _ in landed.values()} == reserved[key(g.name)], (
                landed, reserved[key(g.name)])
            continue
        assert sorted(landed.values()) == sorted((n, gs) for n, gs, _ in held), (landed, held)
        for n, gs, pod_key in held:
            assert pod_key is None or landed[pod_key] == (n, gs), (pod_key, landed, held)
    mine = {k for k in rooms if k.startswith(f"{ns}/")}  # the stack's other tests' aside
    assert mine <= {key(f"llm-{i}") for i in range(GROUPS)}, sorted(mine)
    return figures


def reservations_logged(stack: controlplane.Stack, ns: str) -> dict[str, set[str]]:
    """Group -> the nodes of its room, from the extender's "reserved room for group ..."
    lines (the last one of each group in ``ns``)."""
    out: dict[str, set[str]] = {}
    marker = "reserved room for group "
    for line in stack.log_file("extender").read_text(errors="replace").splitlines():
        if marker not in line:
            continue
        group, _, rest = line.split(marker, 1)[1].partition(" (")
        if group.startswith(f"{ns}/"):
            out[group] = {n.strip() for n in rest.split(" on ", 1)[1].split(",")}
    return out


def test_groups_beside_kube_schedulers_gang(twin: tuple[controlplane.Stack, bool],
                                            capsys: Any) -> None:
    """Gate off: gpupack's own all-or-nothing, the groups by their LWS labels (the API
    server dropped spec.schedulingGroup). Gate on: gpupack's groups are the PodGroups
    (the one rule) and kube-scheduler's gang places each in one cycle, where gpupack's
    rooms are."""
    from kubernetes import client

    stack, gang = twin
    admin = controlplane._api(stack.kubeconfig)
    core = client.CoreV1Api(admin)
    space = Space(core, admin, f"e2e-groups-gate-{'on' if gang else 'off'}")
    if not gang:  # no PodGroup is served: LWS's controller could not create one
        with pytest.raises(client.ApiException) as e:
            client.CustomObjectsApi(admin).list_cluster_custom_object(
                "scheduling.k8s.io", "v1beta1", "podgroups")
        assert e.value.status == 404
    try:
        got = run(core, admin, stack, space, gang=gang)
        ns = got["ns"]
        label = ("GenericWorkload on (kube-scheduler's gang + gpupack)" if gang
                 else "GenericWorkload off (gpupack's all-or-nothing)")
        check(core, stack, got, label, capsys,
              key=(lambda name: f"{ns}/{name}") if gang else (lambda name: f"{ns}/{name}/0"))
        if not gang:
            return
        whole = {name for name, g in got["outcomes"].items() if g.complete}
        for name, (status, reason) in got["conditions"].items():
            if name in whole:
                assert status == "True", (name, status, reason)
            else:
                assert (status, reason) == ("False", "Unschedulable"), (name, status, reason)
        # kube-scheduler's gang cycle placed them, each PodGroup in one cycle.
        log = stack.log_file("scheduler").read_text(errors="replace")
        for name in whole:
            assert any("Successfully scheduled a pod group" in line and f"{ns}/{name}" in line
                       for line in log.splitlines()), f"no pod group cycle for {name}"
        ext = stack.log_file("extender").read_text(errors="replace")
        assert "podgroups served: watching them" in ext
    finally:
        space.cleanup()
