"""MIG compaction's handler as a Hypothesis state machine on a real cache: pods of a
ReplicaSet come and go on the free slices of an opted-in node of three 7 x 1g.10gb GPUs
(as the extender would place them: only on instances no one holds), bare pods too,
the leader steps, evictions are accepted or refused, evicted pods go (the kubelet
confirms) and their replacements bind to free slices.

Invariants: every drain hold is on a GPU being drained; no pod ever lands on a drained
GPU (no drain ends ``refilled``: the holds keep everything off it); only pods a
controller recreates, on a GPU being drained, are evicted, each at most once; one drain
per GPU model in flight; a drain that ends gives all its holds back."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from sched_builders import FakeClock, make_cache, node, pod
from test_mig_compact_act import OWNED, FakeEvents
from test_mig_loop import FAST, FakeApi

from kube.annotations import placement_annotations
from kube.defrag.inputs import PodOwners
from kube.evictions import EvictionResult, PodRef
from packing.model import Placement
from scheduler.mig.compact.decide import DRAIN_PREFIX, CompactSettings
from scheduler.mig.compact.loop import Compactor
from scheduler.mig.decide import MigSettings
from scheduler.mig.loop import MigActuator

GPUS = 3


class Evictor:
    """Accepts or refuses as the test says; remembers what it was asked."""

    def __init__(self) -> None:
        self.refuse = False
        self.asked: list[str] = []

    def evict(self, ref: PodRef) -> EvictionResult:
        self.asked.append(ref.key)
        return EvictionResult("pdb", "budget") if self.refuse else EvictionResult("evicted")


class Compaction(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache = make_cache([node("a", gpus=GPUS, mig={"1g.10gb": 7 * GPUS})], [])
        self.owners = PodOwners(self.cache)
        self.owners.replace(None, [])
        self.clock = FakeClock()
        self.evictor = Evictor()
        self.api = FakeApi()
        self.compactor = Compactor(
            self.cache, self.owners, self.evictor, FakeEvents(), self.api,
            settings=CompactSettings(min_pod_age_s=0, max_pods=3, min_excess=1,
                                     evictions_per_hour=1000))
        self.act = MigActuator(self.cache, self.api, clock=self.clock, params=FAST,
                               settings=MigSettings(config_propagation_s=0, settle_s=0),
                               compactor=self.compactor)
        self.n = 0
        self.bare: set[str] = set()
        self.evicted: list[str] = []  # accepted, in order
        self.ended: list[str] = []

    # ---- the world ----------------------------------------------------------------------

    def _free_slots(self) -> list[tuple[int, int]]:
        """Instances no pod and no hold uses: where the extender may place a pod."""
        out = []
        for g in self.cache.state.nodes["a"].gpus:
            out += [(g.info.index, s) for s, (_, owner) in sorted(g.instances.items())
                    if owner is None]
        return out

    def _bind(self, name: str, slot: tuple[int, int], owned: bool) -> None:
        key = f"default/{name}"
        p = pod(name, {"nvidia.com/mig-1g.10gb": "1"}, node="a",
                annotations=placement_annotations(
                    Placement(key, "a", (slot[0],), "1g.10gb", slot[1]), "gpupack"))
        if owned:
            p["metadata"]["ownerReferences"] = OWNED
        else:
            self.bare.add(key)
        self.owners.upsert_pod(p)

    @rule(data=st.data(), owned=st.booleans())
    def pod_lands(self, data: st.DataObject, owned: bool) -> None:
        free = self._free_slots()
        if free:
            self.n += 1
            self._bind(f"p{self.n}", data.draw(st.sampled_from(free)), owned)

    @rule(data=st.data())
    def pod_ends(self, data: st.DataObject) -> None:
        pods = sorted(k for k in self._pods() if k not in self.evicted)
        if pods:
            self.owners.delete_pod(data.draw(st.sampled_from(pods)))

    @rule(data=st.data())
    def evicted_pod_goes_and_is_replaced(self, data: st.DataObject) -> None:
        gone = [k for k in self.evicted if k in self._pods()]
        if not gone:
            return
        key = data.draw(st.sampled_from(gone))
        counted = self.cache.counted(key)
        assert counted is not None
        left = (counted[1].gpus[0], counted[1].mig_start)
        self.owners.delete_pod(key)
        free = self._free_slots()
        if free:
            # The ReplicaSet's replacement at once, on the very slot its pod left when
            # that is free (the worst case: nothing but the drain's hold keeps it off).
            self.n += 1
            slot = left if left in free else data.draw(st.sampled_from(free))
            self._bind(f"p{self.n}", slot, True)

    @rule(refuse=st.booleans(), dt=st.sampled_from([1.0, 30.0, 700.0]))
    def leader_steps(self, refuse: bool, dt: float) -> None:
        self.evictor.refuse = refuse
        before = len(self.evictor.asked)
        self.clock.advance(dt)
        self.act.step()
        d = self.compactor.last
        assert d is not None
        self.ended += [e.result for e in d.ends]
        for key in self.evictor.asked[before:]:
            assert key not in self.bare, f"{key} has no controller but was evicted"
            assert key not in self.evicted, f"{key} evicted twice"
            if not refuse:
                self.evicted.append(key)
                self._terminating(key)
        for e in d.ends:
            held = {k for k in self.cache.holds()
                    if k.startswith(f"{DRAIN_PREFIX}{e.drain.node}/{e.drain.gpu}/")}
            assert not held, f"drain of {e.drain.gpu_key} ended {e.result}, holds kept"

    def _terminating(self, key: str) -> None:
        """The API server's side of an accepted eviction: the pod is marked for deletion
        (it goes when the kubelet confirms: evicted_pod_goes_and_is_replaced)."""
        counted = self.cache.counted(key)
        assert counted is not None
        p = counted[1]
        name = key.partition("/")[2]
        obj = pod(name, {"nvidia.com/mig-1g.10gb": "1"}, node="a",
                  annotations=placement_annotations(p, "gpupack"))
        obj["metadata"]["ownerReferences"] = OWNED
        obj["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
        self.owners.upsert_pod(obj)

    def _pods(self) -> set[str]:
        return {k for k in (self.cache.pod_entry(f"default/p{i}") and f"default/p{i}"
                            for i in range(1, self.n + 1)) if k}

    # ---- invariants ---------------------------------------------------------------------

    @invariant()
    def drain_holds_only_on_drained_gpus(self) -> None:
        draining = {(d.node, d.gpu) for d in self.compactor.drains.values()}
        for k in self.cache.holds():
            if k.startswith(DRAIN_PREFIX):
                node, gpu, _ = k[len(DRAIN_PREFIX):].split("/")
                assert (node, int(gpu)) in draining, k

    @invariant()
    def nothing_lands_on_a_drained_gpu(self) -> None:
        assert "refilled" not in self.ended
        for d in self.compactor.drains.values():
            g = self.cache.state.gpu(d.node, d.gpu)
            pods = {o for _, o in g.instances.values()
                    if o is not None and not o.startswith(DRAIN_PREFIX)}
            assert pods <= set(d.pods), (d, pods)

    @invariant()
    def one_drain_per_model(self) -> None:
        assert len(self.compactor.drains) <= 1  # one GPU model here


Compaction.TestCase.settings = settings(max_examples=40, stateful_step_count=40,
                                        deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])
TestCompactionStateful = Compaction.TestCase


def test_the_machine_drains_something() -> None:
    """The machine is not vacuous: a plain run starts and empties a drain."""
    m = Compaction()
    m._bind("x1", (0, 0), True)
    for s in range(3):
        m._bind(f"y{s}", (1, s), True)
    m.n = 0
    m.leader_steps(refuse=False, dt=1.0)
    assert m.evictor.asked == ["default/x1"]
    m.owners.delete_pod("default/x1")
    m.leader_steps(refuse=False, dt=1.0)
    assert m.ended == ["emptied"]
    m.teardown()
