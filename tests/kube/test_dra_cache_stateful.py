"""The cache's DRA bookkeeping as a state machine: nodes come and go, drivers publish and
retract slices (and taint GPUs), claims are allocated and released, the extender assumes
allocations and forgets them, pods bind on DRA nodes, lists are replayed; after every
step the cache kept incrementally equals a cache built afresh from the same objects, no
device is counted for two holders, and every DRA GPU a claim holds is not free."""

from __future__ import annotations

from typing import Any

from builders_dra import claim, claim_pod, dra_node, h100_slices, result
from builders_nodes import H100, gpu_node
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kube.cache import ClusterCache
from kube.dra_store import CLAIMS, CLASSES, SLICES
from packing.dra import nvidia
from packing.dra.objects import AllocatedDevice

DRA_NODES = ("d0", "d1")
NODES = (*DRA_NODES, "p0")
CLAIM_NAMES = tuple(f"c{i}" for i in range(5))
PODS = tuple(f"p{i}" for i in range(3))
# Per GPU: the whole device, or two MIG partitions that do not overlap.
DEVICES = tuple(f"gpu-{g}{m}" for g in range(2)
                for m in ("", "-mig-1g10gb-19-0", "-mig-3g40gb-9-4"))
TAINT = {"key": "gpu.nvidia.com/unhealthy", "value": "xid", "effect": "NoSchedule"}


def _gpu(device: str) -> int:
    return int(device.split("-")[1])


def _node_obj(name: str) -> dict[str, Any]:
    if name == "p0":
        return gpu_node("p0", H100, gpus=2, whole=2, hostname=True)
    return dra_node(name, product=H100)


def _slices(node: str, tainted: bool) -> list[dict[str, Any]]:
    info = nvidia.DriverInfo(taints={"gpu-1": [TAINT]}) if tainted else None
    return h100_slices(node, 2, info=info)


class DraCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache = ClusterCache("gpupack")
        self.cache.replace_dra(CLASSES, nvidia.device_classes())
        self.cache.mark_synced()
        self.nodes: set[str] = set()
        self.published: dict[str, bool] = {}  # node -> tainted
        self.claims: dict[str, tuple[str, str] | None] = {}  # name -> (node, device)
        self.flight: dict[str, tuple[str, str, str]] = {}  # pod -> (claim, node, device)
        self.pods: dict[str, str] = {}  # pod -> node it is bound to

    # -- what is held (the API never allocates a device twice, nor overlapping ones) --

    def _held(self) -> set[tuple[str, str]]:
        out = {v for v in self.claims.values() if v is not None}
        out |= {(n, d) for _, n, d in self.flight.values()}
        return out

    def _free(self, node: str, device: str) -> bool:
        for n, d in self._held():
            if n == node and _gpu(d) == _gpu(device) and (
                    d == device or "mig" not in d or "mig" not in device):
                return False
        return True

    def _claim_obj(self, name: str) -> dict[str, Any]:
        held = self.claims.get(name)
        return claim(name, results=None if held is None else [result(*held)])

    # -- rules ------------------------------------------------------------------------

    @rule(node=st.sampled_from(NODES))
    def node_up(self, node: str) -> None:
        self.cache.upsert_node(_node_obj(node))
        self.nodes.add(node)

    @rule(node=st.sampled_from(NODES))
    def node_down(self, node: str) -> None:
        self.cache.delete_node(node)
        self.nodes.discard(node)
        for p in [p for p, n in self.pods.items() if n == node]:
            self.cache.delete_pod(f"default/{p}")
            del self.pods[p]

    @rule(node=st.sampled_from((*DRA_NODES, "p0")), tainted=st.booleans())
    def publish(self, node: str, tainted: bool) -> None:
        old = {s["metadata"]["name"] for s in _slices(node, False)}
        for s in _slices(node, tainted):
            self.cache.upsert_dra(SLICES, s)
        assert {s["metadata"]["name"] for s in _slices(node, tainted)} == old
        self.published[node] = tainted

    @rule(node=st.sampled_from(DRA_NODES))
    def unpublish(self, node: str) -> None:
        for s in _slices(node, False):
            self.cache.delete_dra(SLICES, s["metadata"]["name"])
        self.published.pop(node, None)

    @rule(name=st.sampled_from(CLAIM_NAMES), node=st.sampled_from(DRA_NODES),
          device=st.sampled_from(DEVICES))
    def allocate(self, name: str, node: str, device: str) -> None:
        if self.claims.get(name) is not None or not self._free(node, device):
            return
        self.claims[name] = (node, device)
        for pod, (c, _, _) in list(self.flight.items()):
            if c == name:
                del self.flight[pod]  # the watch shows the claim: its assumption is over
        self.cache.upsert_dra(CLAIMS, self._claim_obj(name))

    @rule(name=st.sampled_from(CLAIM_NAMES))
    def create_unallocated(self, name: str) -> None:
        if name in self.claims:
            return
        self.claims[name] = None
        self.cache.upsert_dra(CLAIMS, self._claim_obj(name))

    @rule(name=st.sampled_from(CLAIM_NAMES))
    def release(self, name: str) -> None:
        if self.claims.get(name) is None:
            return
        self.claims[name] = None
        self.cache.upsert_dra(CLAIMS, self._claim_obj(name))

    @rule(name=st.sampled_from(CLAIM_NAMES))
    def delete_claim(self, name: str) -> None:
        self.claims.pop(name, None)
        self.cache.delete_dra(CLAIMS, f"default/{name}")

    @rule(pod=st.sampled_from(PODS), name=st.sampled_from(CLAIM_NAMES),
          node=st.sampled_from(DRA_NODES), device=st.sampled_from(DEVICES))
    def assume(self, pod: str, name: str, node: str, device: str) -> None:
        if name not in self.claims or self.claims[name] is not None:
            return
        if any(c == name for c, _, _ in self.flight.values()):
            return
        self.flight.pop(pod, None)
        if not self._free(node, device):
            self.cache.forget_dra(f"default/{pod}")
            return
        self.flight[pod] = (name, node, device)
        self.cache.assume_dra(f"default/{pod}", {f"default/{name}": (
            AllocatedDevice("r", nvidia.DRIVER, node, device),)})

    @rule(pod=st.sampled_from(PODS))
    def forget(self, pod: str) -> None:
        self.flight.pop(pod, None)
        self.cache.forget_dra(f"default/{pod}")

    @rule(pod=st.sampled_from(PODS), node=st.sampled_from(NODES))
    def bind_pod(self, pod: str, node: str) -> None:
        if pod in self.pods:
            return
        self.pods[pod] = node
        self.cache.upsert_pod(claim_pod(pod, node=node, gpus=1, cpu="2"))

    @rule(pod=st.sampled_from(PODS))
    def delete_pod(self, pod: str) -> None:
        self.pods.pop(pod, None)
        self.cache.delete_pod(f"default/{pod}")

    @rule()
    def relist(self) -> None:
        self.cache.replace_dra(CLAIMS, [self._claim_obj(n) for n in self.claims])
        self.cache.replace_dra(SLICES, self._all_slices())

    def _all_slices(self) -> list[dict[str, Any]]:
        return [s for n, t in sorted(self.published.items()) for s in _slices(n, t)]

    # -- invariants -------------------------------------------------------------------

    def _fresh(self) -> ClusterCache:
        fresh = ClusterCache("gpupack")
        fresh.replace([_node_obj(n) for n in sorted(self.nodes)],
                      [claim_pod(p, node=n, gpus=1, cpu="2") for p, n in self.pods.items()])
        fresh.replace_dra(CLASSES, nvidia.device_classes())
        fresh.replace_dra(SLICES, self._all_slices())
        fresh.replace_dra(CLAIMS, [self._claim_obj(n) for n in self.claims])
        for pod, (name, node, device) in sorted(self.flight.items()):
            fresh.assume_dra(f"default/{pod}", {f"default/{name}": (
                AllocatedDevice("r", nvidia.DRIVER, node, device),)})
        return fresh

    @staticmethod
    def _view(cache: ClusterCache) -> dict[str, Any]:
        out = {}
        for name, n in sorted(cache.state.nodes.items()):
            gpus = [(g.whole_owner or "", sorted(g.instances.items()), sorted(g.shared_owners))
                    for g in n.gpus]
            if not cache.is_dra_node(name):
                # A device-plugin pod without a recorded GPU is counted on the first free
                # one, which depends on what came before: its GPU, not which, is the fact.
                gpus.sort()
            out[name] = (n.cpu_free, n.info.gpus, gpus)
        return {"nodes": out, "dra": sorted(cache.dra_nodes())}

    @invariant()
    def incremental_equals_fresh(self) -> None:
        assert self._view(self.cache) == self._view(self._fresh())

    @invariant()
    def held_devices_are_not_free(self) -> None:
        for node, device in self._held():
            if node not in self.nodes or node not in self.published:
                continue
            g = self.cache.state.nodes[node].gpus[_gpu(device)]
            assert not g.idle, (node, device)

    @invariant()
    def device_plugin_node_keeps_its_own_gpus(self) -> None:
        if "p0" in self.nodes:
            assert not self.cache.is_dra_node("p0")
            assert len(self.cache.state.nodes["p0"].gpus) == 2


DraCacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=25,
                                             deadline=None)
TestDraCache = DraCacheMachine.TestCase
