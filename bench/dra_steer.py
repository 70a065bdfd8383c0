"""Steering kube-scheduler's DRA allocator inside a node: is choosing the node enough, or
do DeviceTaintRules on the GPUs gpupack keeps pack MIG partitions tighter?

    python bench/dra_steer.py [--nodes 8] [--events 600] [--seed 1] [--format json]

In process, no control plane: the allocator is :mod:`packing.dra`'s model, which agrees
with kube-scheduler v1.37.2 claim for claim (tests/e2e/test_e2e_dra_allocator.py), and
gpupack is its extender's DRA participant (:class:`scheduler.dra.plugin.DraVerbs`) over
its cache. ``--nodes`` DynamicMIG H100 nodes of 8 GPUs take a stream of MIG claims
(1g.10gb, 2g.20gb, 3g.40gb, in the ratio 6:3:1) with departures (each event is an arrival
with probability 0.55, else a random departure), and, every 25 events, a whole-GPU claim.

Variants, on the same stream:

* ``node``: gpupack chooses the node (the device is the allocator's first fit there);
* ``taint``: as ``node``, and before each MIG arrival a DeviceTaintRule (NoSchedule)
  on every device of each idle GPU of a node that has a GPU in use with room for the
  claim: first fit then fills the GPUs in use before it opens an idle one. The rules are
  removed before a whole-GPU claim (it would not tolerate them).

Figures (means over the events): GPUs holding a partition, whole GPUs free, and the
arrivals that found no room.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from builders_dra import claim, claim_pod, dra_node, h100_slices  # noqa: E402

from kube.cache import ClusterCache  # noqa: E402
from kube.dra_store import CLAIMS, CLASSES, RULES, SLICES  # noqa: E402
from packing.dra import nvidia  # noqa: E402
from packing.policies.gpupack import make_gpupack_scorer  # noqa: E402
from scheduler.dra.plugin import DraVerbs  # noqa: E402
from scheduler.extender.wire import ExtenderArgs  # noqa: E402
from scheduler.memo.decide import ScorerRef  # noqa: E402

ATTR = f"device.attributes['{nvidia.DRIVER}']"
PROFILES = ("1g.10gb",) * 6 + ("2g.20gb",) * 3 + ("3g.40gb",)
TAINT = {"key": "gpupack.io/keep", "value": "idle", "effect": "NoSchedule"}


def mig_claim(name: str, profile: str) -> dict[str, Any]:
    return claim(name, klass=nvidia.MIG_CLASS, selectors=[f"{ATTR}.profile == '{profile}'"])


class Sim:
    def __init__(self, nodes: int, steer: bool) -> None:
        self.steer = steer
        self.cache = ClusterCache("gpupack")
        self.names = [f"n{i}" for i in range(nodes)]
        self.cache.replace([dra_node(n) for n in self.names], [])
        self.cache.replace_dra(SLICES, [s for n in self.names for s in h100_slices(n, 8)])
        self.cache.replace_dra(CLASSES, nvidia.device_classes())
        self.cache.mark_synced()
        ref = ScorerRef(make_gpupack_scorer(self.cache.snapshot()), 1)
        self.verbs = DraVerbs(self.cache, lambda: ref)
        self.live: dict[str, dict[str, Any]] = {}  # claim name -> its object, allocated
        self.rules: list[str] = []
        self.failed = 0

    def _devices(self, node: str) -> list[tuple[int, str]]:
        inv = self.cache.dra_inventory(node)
        assert inv is not None
        return [(d.gpu, d.id.rsplit("/", 1)[1]) for d in inv.devices.values()]

    def _retaint(self, profile: str | None) -> None:
        rules: list[dict[str, Any]] = []
        if self.steer and profile is not None:
            state = self.cache.state
            for node in self.names:
                gpus = state.nodes[node].gpus
                used = [g for g in gpus if not g.idle]
                if not used or not any(self._room(node, g.info.index, profile) for g in used):
                    continue
                idle = {g.info.index for g in gpus if g.idle}
                rules += [{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
                           "metadata": {"name": f"keep-{node}-{device}"},
                           "spec": {"deviceSelector": {"driver": nvidia.DRIVER, "pool": node,
                                                       "device": device}, "taint": TAINT}}
                          for gpu, device in self._devices(node) if gpu in idle]
        if rules or self.rules:
            self.cache.replace_dra(RULES, rules)
        self.rules = [r["metadata"]["name"] for r in rules]

    def _room(self, node: str, gpu: int, profile: str) -> bool:
        from packing.catalog import get_model
        from packing.mig.layout import MigSlot, free_starts

        g = self.cache.state.gpu(node, gpu)
        geom = get_model(g.info.model).mig
        assert geom is not None
        slots = [MigSlot(p, s) for s, (p, _o) in g.instances.items()]
        return g.whole_owner is None and bool(free_starts(geom, slots, profile))

    def arrive(self, name: str, obj: dict[str, Any], profile: str | None) -> None:
        self._retaint(profile)
        self.cache.upsert_dra(CLAIMS, obj)
        pod = claim_pod(name, claims=[name])
        self.cache.upsert_pod(pod)
        with self.cache.lock:
            got = self.verbs.filter(ExtenderArgs(pod, None, tuple(self.names)))
        assert got is not None
        self.cache.delete_pod(f"default/{name}")
        if not got.node_names:
            self.failed += 1
            self.cache.delete_dra(CLAIMS, f"default/{name}")
            return
        node = got.node_names[0]
        ans = self.verbs._answers[(f"default/{name}", node)]
        assert ans.prediction is not None
        (results,) = ans.prediction.results
        alloc = [{"request": r.request, "driver": r.driver, "pool": r.pool,
                  "device": r.device} for r in results]
        done = {**obj, "status": {"allocation": {"devices": {"results": alloc}}}}
        self.verbs._tentative.clear()
        self.cache.forget_dra(f"default/{name}")
        self.cache.upsert_dra(CLAIMS, done)
        self.live[name] = done

    def leave(self, name: str) -> None:
        self.live.pop(name)
        self.cache.delete_dra(CLAIMS, f"default/{name}")

    def figures(self) -> tuple[int, int]:
        gpus = [g for n in self.cache.state.nodes.values() for g in n.gpus]
        mig = sum(1 for g in gpus if g.instances and any(o for _, o in g.instances.values()))
        return mig, sum(1 for g in gpus if g.whole_free)


def run(nodes: int, events: int, seed: int, steer: bool) -> dict[str, float]:
    rng = random.Random(seed)
    sim = Sim(nodes, steer)
    mig_sum = free_sum = 0
    for i in range(events):
        if i % 25 == 24:
            sim.arrive(f"w{i}", claim(f"w{i}"), None)
        elif sim.live and rng.random() > 0.55:
            sim.leave(rng.choice(sorted(sim.live)))
        else:
            profile = rng.choice(PROFILES)
            sim.arrive(f"c{i}", mig_claim(f"c{i}", profile), profile)
        mig, free = sim.figures()
        mig_sum += mig
        free_sum += free
    return {"mig_gpus_mean": round(mig_sum / events, 2),
            "whole_gpus_free_mean": round(free_sum / events, 2),
            "arrivals_failed": sim.failed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--events", type=int, default=600)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--format", choices=["table", "json"], default="table")
    args = p.parse_args(argv)
    out = {v: run(args.nodes, args.events, args.seed, v == "taint") for v in ("node", "taint")}
    if args.format == "json":
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
