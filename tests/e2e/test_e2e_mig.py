"""The MIG actuator end to end: the extender (``--mig-actuator``, the chart's
``migActuator.enabled``) asks the MIG manager double (``mig_manager_double.py``) for
layouts through the mig-parted ConfigMap and the ``nvidia.com/mig.config`` label, and
pods waiting for slices bind to the slices the double creates.

- A burst of ASR pods (sized by annotations; the webhook turns them into
  ``nvidia.com/mig-1g.10gb`` because slices may be created on the opted-in nodes) on
  whole H100 nodes that opt in ends with every pod bound to a slice the double created,
  one node changed (one per GPU model at a time), the other left whole.
- A change the double fails: the GPUs are held while it runs (a whole-node pod is not
  placed there), released when it fails (the pod is placed), a Warning Event, the node
  backed off, no MIG pod bound to a slice that does not exist.
- A node that freezes its layout (``gpupack.io/mig-reconfigure: "false"``) is left alone.
- The reverse direction: an opted-in node whose GPUs are all idle MIG GPUs is turned back
  to whole GPUs for a waiting 8-GPU pod, which then binds.
"""

from __future__ import annotations

import json
import time
from typing import Any

from cluster import (
    GPU,
    H100,
    NodeSpec,
    bound,
    create_nodes,
    create_pods,
    h100_mig,
    h100_whole,
    overcommits,
    pending_report,
    pod,
    pods_in,
    wait_for,
    wait_for_webhook,
)
from conftest import Space
from controlplane import MIG_CONFIG_MAP, NAMESPACE

from scheduler.mig.changes import changes_from_json

MIG = "nvidia.com/mig-1g.10gb"
CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"


def opted_in(spec: NodeSpec, value: str = "true") -> NodeSpec:
    return NodeSpec(spec.name, {**spec.labels, "gpupack.io/mig-reconfigure": value},
                    spec.allocatable)


def events(core: Any, node: str) -> list[tuple[str, str, str]]:
    items = core.list_namespaced_event("default",
                                       field_selector=f"involvedObject.name={node}").items
    return [(e.reason, e.type, e.message) for e in items
            if e.source and e.source.component == "gpupack-mig-actuator"]


def asr(name: str, pool: str) -> dict[str, Any]:
    return pod(name, pool=pool, annotations={"gpupack.io/class": "asr",
                                             "gpupack.io/gpu-memory": "8Gi"})


def test_asr_burst_binds_to_slices_the_mig_manager_created(space: Space, core: Any) -> None:
    ns = space.namespace()
    pool = space.name
    names = create_nodes(core, [opted_in(h100_whole(f"{pool}-{i}", pool)) for i in range(2)])
    space.nodes += names
    wait_for_webhook(core, ns, asr("probe", pool), MIG)
    t0 = time.monotonic()
    made = create_pods(core, ns, [asr(f"asr-{i}", pool) for i in range(20)])
    assert {tuple(p["spec"]["containers"][0]["resources"]["limits"]) for p in made} == {
        (MIG,)}, [p["spec"]["containers"][0]["resources"] for p in made]

    def all_bound() -> Any:
        got = bound(pods_in(core, ns))
        return got if len(got) == 20 else None

    try:
        placed = wait_for(all_bound, 120, "every ASR pod bound")
    except AssertionError:
        raise AssertionError(pending_report(core, ns)) from None
    elapsed = time.monotonic() - t0
    print(f"\nburst of 20 ASR pods: all bound {elapsed:.1f} s after creation")
    changed = [n for n in names if (core.read_node(n).metadata.labels or {}).get(CONFIG)]
    assert len(changed) == 1, changed  # one node per GPU model; the other stays whole
    # The device plugin restarts (allocatable) before the manager reports success; the
    # actuator then sees the change done.
    def done() -> bool:
        cm = core.read_namespaced_config_map(MIG_CONFIG_MAP, NAMESPACE)
        return changes_from_json(cm.data["gpupack-changes.json"])[0] == {} and core.read_node(
            changed[0]).metadata.labels.get(STATE) == "success"

    wait_for(done, 30, "the change reported done and nothing in flight")
    reasons = [r for r, _, _ in events(core, changed[0])]
    started, succeeded = reasons.count("MigReconfigureStarted"), reasons.count(
        "MigReconfigured")
    print(f"reconfigurations: {started} started, {succeeded} succeeded")
    assert started == succeeded >= 1, reasons
    node = core.read_node(changed[0])
    labels = node.metadata.labels
    assert labels[CONFIG].startswith("gpupack-")
    slices = int(node.status.allocatable[MIG])
    # The node entered MIG mode idle, so every GPU of it switched at once (a node in use
    # cannot switch a GPU's mode: mig-parted's mode step touches every GPU): 8 x 7.
    assert set(placed.values()) == {changed[0]} and slices == 56
    # The label followed the entry (the double's copy of the ConfigMap lags 3 s): no
    # change failed on an entry its file did not hold yet.
    assert "MigReconfigureFailed" not in reasons, reasons
    assert 8 - int(node.status.allocatable[GPU]) >= -(-slices // 7)  # GPUs turned MIG
    other = core.read_node(next(n for n in names if n != changed[0]))
    assert other.status.allocatable[GPU] == "8" and MIG not in other.status.allocatable
    # The entry the double applied is gpupack's, in gpupack's ConfigMap.
    cm = core.read_namespaced_config_map(MIG_CONFIG_MAP, NAMESPACE)
    entry = json.loads(cm.data["config.yaml"])["mig-configs"][labels[CONFIG]]
    assert sum(len(d["devices"]) * d.get("mig-devices", {}).get("1g.10gb", 0)
               for d in entry) == slices
    assert node.metadata.annotations["gpupack.io/mig-change"].startswith("success ")
    assert overcommits(core, pods_in(core, ns)) == []


def test_failed_change_releases_the_hold_and_backs_off(space: Space, core: Any) -> None:
    ns = space.namespace()
    pool = space.name
    (name,) = create_nodes(core, [opted_in(h100_whole(f"{pool}-0", pool))])
    space.nodes.append(name)
    # Fail on request, slowly enough to see the hold.
    core.patch_node(name, {"metadata": {"annotations": {"e2e.gpupack.io/mig-fail": "true",
                                                        "e2e.gpupack.io/mig-delay": "4"}}})
    create_pods(core, ns, [pod(f"asr-{i}", pool=pool, scheduler="gpupack",
                               limits={MIG: "1"}) for i in range(3)])
    wait_for(lambda: (core.read_node(name).metadata.labels or {}).get(STATE) == "pending", 60,
             "the MIG manager double to start the change")
    # While the change runs, the GPU it converts is held: an 8-GPU pod finds no room.
    create_pods(core, ns, [pod("whole", pool=pool, scheduler="gpupack", limits={GPU: "8"})])
    time.sleep(2.0)
    assert "whole" not in bound(pods_in(core, ns)), "placed on a GPU held for a MIG change"
    wait_for(lambda: any(r == "MigReconfigureFailed" for r, _, _ in events(core, name)), 60,
             "the failure Event")
    (warning,) = [(t, m) for r, t, m in events(core, name) if r == "MigReconfigureFailed"]
    assert warning[0] == "Warning"
    assert "left alone for" in warning[1], warning
    # Released: the whole-node pod is placed on the GPUs the change held.
    wait_for(lambda: bound(pods_in(core, ns)).get("whole") == name, 60,
             "the whole-node pod placed once the hold is released")
    # No MIG pod bound to a slice that does not exist, and no second try while backed off.
    time.sleep(3.0)
    assert not {k for k in bound(pods_in(core, ns)) if k.startswith("asr-")}
    assert MIG not in (core.read_node(name).status.allocatable or {})
    started = [r for r, _, _ in events(core, name) if r == "MigReconfigureStarted"]
    assert len(started) == 1, started


def test_frozen_node_is_left_alone(space: Space, core: Any) -> None:
    ns = space.namespace()
    pool = space.name
    (name,) = create_nodes(core, [opted_in(h100_whole(f"{pool}-0", pool), "false")])
    space.nodes.append(name)
    create_pods(core, ns, [pod(f"asr-{i}", pool=pool, scheduler="gpupack",
                               limits={MIG: "1"}) for i in range(3)])
    time.sleep(6.0)
    node = core.read_node(name)
    assert CONFIG not in (node.metadata.labels or {})
    assert events(core, name) == []
    assert bound(pods_in(core, ns)) == {}


def test_idle_mig_gpus_turn_whole_for_a_waiting_whole_gpu_pod(space: Space, core: Any) -> None:
    from packing.inventory import GpuInventory, Inventory, encode_inventory
    from packing.model import GpuMode, MigInstance

    ns = space.namespace()
    pool = space.name
    (name,) = create_nodes(core, [opted_in(h100_mig(f"{pool}-0", pool, {"1g.10gb": 56}))])
    space.nodes.append(name)
    seven = tuple(MigInstance("1g.10gb", s) for s in range(7))
    inv = Inventory(name, int(time.time()), tuple(
        GpuInventory(i, f"GPU-e2e-{i}", H100, 81559, 0, GpuMode.MIG, seven) for i in range(8)))
    annotations = {"gpupack.io/inventory": encode_inventory(inv)}
    core.patch_node(name, {"metadata": {"annotations": annotations}})
    create_pods(core, ns, [pod("llm", pool=pool, scheduler="gpupack", limits={GPU: "8"})])
    try:
        wait_for(lambda: bound(pods_in(core, ns)).get("llm") == name, 90,
                 "the 8-GPU pod bound once the idle MIG GPUs are whole again")
    except AssertionError:
        raise AssertionError(pending_report(core, ns)) from None
    node = core.read_node(name)
    assert node.status.allocatable[GPU] == "8" and MIG not in node.status.allocatable
    assert node.metadata.labels[CONFIG].startswith("gpupack-")
    reasons = [r for r, _, _ in events(core, name)]
    assert "MigReconfigureStarted" in reasons, reasons
