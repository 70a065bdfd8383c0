"""The webhook promises only MIG slices that exist or will be created (issue 19, item 1).

Reproduced before the fix: with an idle whole H100 beside a free time-sliced L40S, an
8Gi ASR pod was turned into ``nvidia.com/mig-1g.10gb`` ("14 free or creatable"), though
nothing creates MIG instances; on a cluster kube-scheduler's resource fit then rejects
every node and the pod stays Pending for ever. An idle GPU counts as a MIG GPU only when
its node opts in (``gpupack.io/mig-reconfigure: "true"``) and the MIG actuator is on.
"""

from __future__ import annotations

import pytest
from webhook_builders import OPT_IN, cluster, node, pod

from packing.model import MigReconfigure
from webhook.capacity import ClusterView
from webhook.config import WebhookConfig
from webhook.decide import decide_admission
from webhook.decision import Kind

FROZEN = {"gpupack.io/mig-reconfigure": "false"}
ASR = {"gpupack.io/class": "asr"}  # 8Gi by default


def _h100_and_l40s(labels: dict[str, str], actuator: bool) -> ClusterView:
    return ClusterView.of(cluster(node("h100", gpus=2, mode="whole", labels=labels),
                                  node("l40s", "L40S", 1, "shared"), mig_actuator=actuator))


@pytest.mark.parametrize(
    ("labels", "actuator", "resource", "needle"),
    ids=["no-label", "no-label-actuator-on", "frozen", "frozen-actuator-on",
         "opted-in-actuator-off", "opted-in-actuator-on"],
    argvalues=[
        ({}, False, "nvidia.com/gpu.shared",
         "H100-80GB MIG off: 2 on nodes that do not opt in to MIG reconfiguration"),
        ({}, True, "nvidia.com/gpu.shared",
         "H100-80GB MIG off: 2 on nodes that do not opt in to MIG reconfiguration"),
        (FROZEN, False, "nvidia.com/gpu.shared",
         "H100-80GB MIG off: 2 on nodes that freeze their MIG layout"),
        (FROZEN, True, "nvidia.com/gpu.shared",
         "H100-80GB MIG off: 2 on nodes that freeze their MIG layout"),
        (OPT_IN, False, "nvidia.com/gpu.shared",
         "H100-80GB MIG off: 2 on nodes that opt in to MIG reconfiguration while the MIG "
         "actuator is off"),
        # Only here may the idle H100s be partitioned, so only here is MIG promised.
        (OPT_IN, True, "nvidia.com/mig-1g.10gb",
         "14 creatable by the MIG actuator on nodes that opt in on H100-80GB"),
    ],
)
def test_idle_whole_h100_beside_a_free_l40s(labels: dict[str, str], actuator: bool,
                                             resource: str, needle: str) -> None:
    d = decide_admission(pod(annotations=ASR), _h100_and_l40s(labels, actuator), WebhookConfig())
    assert d.resource == resource, d.reason
    assert needle in d.reason, d.reason


@pytest.mark.parametrize(
    ("labels", "actuator", "case"),
    [
        ({}, False, MigReconfigure.NOT_OPTED_IN),
        (FROZEN, True, MigReconfigure.FROZEN),
        (OPT_IN, False, MigReconfigure.ACTUATOR_OFF),
    ],
)
def test_whole_gpus_that_may_not_become_mig_offer_no_slice(
        labels: dict[str, str], actuator: bool, case: MigReconfigure) -> None:
    h100 = _h100_and_l40s(labels, actuator).models["H100-80GB"]
    assert h100.mig_gpus == 0 and h100.mig_available("1g.10gb") == 0
    assert not h100.mig_possible("1g.10gb")
    assert dict(h100.mig_off) == {case: 2}


def test_opted_in_whole_gpus_with_the_actuator_on_count_as_creatable_not_free() -> None:
    h100 = _h100_and_l40s(OPT_IN, True).models["H100-80GB"]
    assert h100.mig_gpus == 2 and h100.mig_changeable_gpus == 2
    assert h100.mig_free.get("1g.10gb", 0) == 0 and h100.mig_creatable["1g.10gb"] == 14
    assert h100.mig_possible("1g.20gb") and not h100.mig_off


def test_only_h100s_that_may_not_change_deny_a_mig_only_pod_naming_the_case() -> None:
    snap = cluster(node("h100", gpus=2, mode="whole", labels=OPT_IN))
    d = decide_admission(pod(annotations={**ASR, "gpupack.io/isolation": "mig"}), snap,
                         WebhookConfig())
    assert d.kind is Kind.DENY and d.status_code == 403
    assert "no MIG slices [H100-80GB MIG off: 2 on nodes that opt in to MIG " \
           "reconfiguration while the MIG actuator is off]" in d.reason


def test_existing_slices_serve_whatever_the_case() -> None:
    # A reported layout is real: its free instances are offered on every node.
    for labels, actuator in (({}, False), (FROZEN, True), (OPT_IN, False), (OPT_IN, True)):
        snap = cluster(node("h0", gpus=1, mig={"1g.10gb": 7}, labels=labels),
                       mig_actuator=actuator)
        d = decide_admission(pod(annotations=ASR), snap, WebhookConfig())
        assert d.resource == "nvidia.com/mig-1g.10gb" and "7 free on H100-80GB" in d.reason


def test_a_mig_node_coming_up_lets_the_pod_wait_for_its_slice() -> None:
    # GFD labels say MIG, the device plugin has advertised no slice yet (a Node's status
    # is patched after it is created): the layout is unknown, not empty. Found on the
    # real control plane, whose nodes get their allocatable just after creation.
    snap = cluster(node("h0", gpus=8, labels=FROZEN))
    d = decide_admission(pod(annotations={**ASR, "gpupack.io/isolation": "mig"}), snap,
                         WebhookConfig())
    assert d.resource == "nvidia.com/mig-1g.10gb", d.reason
    assert "8 GPU(s) report MIG on but no instance yet" in d.reason


def test_a_node_that_reports_its_layout_promises_nothing_else() -> None:
    # 8 GPUs, 7 slices advertised (one GPU's worth): the other GPUs add no profile.
    snap = cluster(node("h0", gpus=8, mig={"1g.10gb": 7}, labels=FROZEN))
    view = ClusterView.of(snap)
    assert not view.models["H100-80GB"].mig_possible("2g.20gb")
    d = decide_admission(
        pod(annotations={"gpupack.io/gpu-memory": "16Gi", "gpupack.io/isolation": "mig"}),
        view, WebhookConfig())
    assert d.kind is Kind.DENY and "largest MIG slice 1g.10gb" in d.reason, d.reason
