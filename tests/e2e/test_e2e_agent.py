"""The node agent's reach, as the API server enforces it: RBAC lets its account patch
Nodes, the chart's ValidatingAdmissionPolicy narrows that to its own Node (the one its
pod-bound token names) and to gpupack.io/ annotations there. Requests here are made with
the agent's own token and the user agent ``gpupack-e2e-probe``, which the RBAC test
leaves out of its count of refusals (these are refused on purpose)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cluster import create_nodes, h100_whole
from conftest import Space
from controlplane import AGENT_NODE, Stack, _api
from kubernetes import client
from kubernetes.client.rest import ApiException

PROBE_AGENT = "gpupack-e2e-probe"


@pytest.fixture
def as_agent(stack: Stack) -> Iterator[client.CoreV1Api]:
    api = _api(stack.dir / "kubeconfigs" / "node-agent")
    api.user_agent = PROBE_AGENT
    yield client.CoreV1Api(api)
    api.close()


def _merge(api: client.CoreV1Api, node: str, patch: dict[str, Any]) -> None:
    api.patch_node(node, patch, _content_type="application/merge-patch+json")


def test_agent_may_annotate_its_own_node(as_agent: client.CoreV1Api, core: Any) -> None:
    _merge(as_agent, AGENT_NODE, {"metadata": {"annotations": {"gpupack.io/e2e-probe": "1"}}})
    ann = core.read_node(AGENT_NODE).metadata.annotations
    assert ann["gpupack.io/e2e-probe"] == "1"


@pytest.mark.parametrize(("target", "patch", "needle"), [
    ("other", {"metadata": {"annotations": {"gpupack.io/inventory": "{}"}}},
     "only its own Node"),
    ("own", {"metadata": {"labels": {"nvidia.com/gpu.product": "forged"}}},
     "only gpupack.io/ annotations"),
    ("own", {"metadata": {"annotations": {"other.io/x": "1"}}}, "only gpupack.io/ annotations"),
    ("own", {"spec": {"taints": [{"key": "evil", "effect": "NoSchedule"}]}},
     "only gpupack.io/ annotations"),
])
def test_agent_refused_beyond_its_own_annotations(
        as_agent: client.CoreV1Api, core: Any, space: Space, target: str,
        patch: dict[str, Any], needle: str) -> None:
    node = AGENT_NODE
    if target == "other":
        node = f"{space.name}-other"
        space.nodes += create_nodes(core, [h100_whole(node, space.name)])
    before = core.read_node(node)
    with pytest.raises(ApiException) as err:
        _merge(as_agent, node, patch)
    assert err.value.status == 403, err.value
    assert needle in str(err.value.body), err.value.body
    after = core.read_node(node)
    assert after.metadata.labels == before.metadata.labels
    assert after.spec.taints == before.spec.taints
