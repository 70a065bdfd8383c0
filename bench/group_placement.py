"""Cost of placing one LLM group when its first pod is seen: CP-SAT
(``packing/groups/solver.py``) against the member-by-member greedy pass, on a generated
cluster of 8-GPU nodes, some partly used, with and without NVLink clique labels.

    python bench/group_placement.py [--nodes 5000] [--clique-size 18] [--members 4]

Prints the wall time of each (it runs under the extender's cache lock) and what each
chose: the domain, and the idle GPUs left in that domain (best fit: fewer is better),
and whole nodes broken (a whole node used but not filled).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packing.groups.placement import place_members
from packing.model import (
    GpuInfo,
    GpuMode,
    GroupRef,
    NodeInfo,
    Placement,
    PodRequest,
    RequestKind,
    Snapshot,
)
from packing.policies import get_policy
from packing.state import ClusterState
from packing.status import Status

CLIQUE = "nvidia.com/gpu.clique"


def cluster(n: int, clique_size: int, seed: int) -> Snapshot:
    rng = random.Random(seed)
    nodes, running = [], []
    for i in range(n):
        name = f"n{i:05d}"
        gpus = tuple(GpuInfo(j, "H100-80GB", 81_559, GpuMode.WHOLE, (), 1) for j in range(8))
        nodes.append(NodeInfo(name, 128_000, 1_048_576, gpus, {CLIQUE: f"c{i // clique_size:04d}"}))
        k = rng.choice([0, 0, 1, 2, 4, 7, 8])
        if k:
            pod = PodRequest(f"run/{i}", 1000, 1024, RequestKind.WHOLE, gpu_count=k)
            running.append((pod, Placement(pod.key, name, tuple(range(k)))))
    return Snapshot(tuple(nodes), running=tuple(running))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--clique-size", type=int, default=18)
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=8, help="GPUs per member")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    snap = cluster(args.nodes, args.clique_size, args.seed)
    print(f"{'topology':<22} {'method':<7} {'ms':>8} {'domain':>7} {'idle left':>9} "
          f"{'whole broken':>12}")
    for key in (CLIQUE, None):
        state = ClusterState(snap)
        ref = GroupRef("llm/g/0", args.members, 0, key, False)
        members = [PodRequest(f"llm/g-{i}", 1000, 1024, RequestKind.WHOLE,
                              gpu_count=args.gpus, group=replace(ref, index=i), klass="llm")
                   for i in range(args.members)]
        scorer = get_policy("gpupack").make_scorer(replace(snap, pending=tuple(members)))
        for exact in (True, False):
            t0 = time.perf_counter()
            got = place_members(state, members, scorer, set(), exact=exact)
            ms = (time.perf_counter() - t0) * 1e3
            if isinstance(got, Status):
                print(f"{key or 'none':<22} {'cp-sat' if exact else 'greedy':<7} {ms:>8.1f} "
                      f"{got}")
                continue
            placements, domain = got
            nodes = {p.node for p in placements}
            scope = [n for n, s in state.nodes.items()
                     if key is None or s.info.labels.get(key) == domain]
            used = {n: sum(len(p.gpus) for p in placements if p.node == n) for n in nodes}
            idle = sum(sum(1 for g in state.nodes[n].gpus if g.idle) for n in scope)
            broken = sum(1 for n in nodes
                         if state.nodes[n].whole_free and used[n] < len(state.nodes[n].gpus))
            print(f"{key or 'none':<22} {'cp-sat' if exact else 'greedy':<7} {ms:>8.1f} "
                  f"{domain or '-':>7} {idle - sum(used.values()):>9} {broken:>12}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
