"""Time-sliced shares against the NVIDIA device plugin's real choice of GPU (issue 18).

One time-sliced node (default: 4 x L40S at GFD's 46,068 MiB, 4 replicas each) receives a
random stream of share arrivals (ASR/TTS/small-LLM memory sizes) and departures. Two
bookers decide whether a share comes and on which GPU they count it:

* ``memory-first``: gpupack before issue 18: the first GPU with a free replica and room
  for the share's memory (GPU by GPU, by memory);
* ``plugin``: gpupack now: ``ClusterState.options``, i.e. the GPU the plugin will pick,
  and only when every GPU the plugin may pick has room.

Either way the share then lands where the simulated plugin puts it (``distributed``:
fewest replicas in use, ties at random) and the booker is told (the node agent's
observation wins). Printed per booker: arrivals admitted, GPUs that ran out of memory
(sum of the memory of the shares on one GPU above its size: a neighbour OOMs), and the
runs with at least one such GPU.

    python bench/device_plugin.py --runs 300 --arrivals 60 --seed 1
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packing.device_plugin import ReplicatedGpu, plugin_allocation
from packing.model import (
    GpuInfo,
    GpuMode,
    NodeInfo,
    Placement,
    PodRequest,
    RequestKind,
    Snapshot,
)
from packing.state import ClusterState

SIZES_MIB = (4_096, 6_144, 8_192, 12_288, 16_384, 20_480, 30_720)


@dataclass
class Tally:
    admitted: int = 0
    refused: int = 0
    oom_gpus: int = 0  # arrivals after which some GPU held more than its memory
    runs_with_oom: int = 0


def plugin_choice(counts: list[int], replicas: int, rng: random.Random) -> int:
    gpus = [ReplicatedGpu(i, replicas, c) for i, c in enumerate(counts)]
    return rng.choice(sorted(plugin_allocation(gpus).possible[0]))


def run(booker: str, n_gpus: int, replicas: int, memory: int, arrivals: int,
        rng: random.Random, tally: Tally) -> None:
    info = NodeInfo("n", 1_000_000, 10_000_000, tuple(
        GpuInfo(i, "L40S", memory, GpuMode.SHARED, replicas=replicas) for i in range(n_gpus)))
    state = ClusterState(Snapshot((info,)))
    real: dict[str, tuple[int, int]] = {}  # pod -> (GPU, MiB) where the plugin put it
    oom = False
    for k in range(arrivals):
        if real and rng.random() < 0.25:  # a departure
            key = rng.choice(sorted(real))
            gpu, mem = real.pop(key)
            state.undo(pod(key, mem), Placement(key, "n", (gpu,)))
            continue
        mem = rng.choice(SIZES_MIB)
        req = pod(f"p{k}", mem)
        counts = [len(g.shared_owners) for g in state.nodes["n"].gpus]
        if booker == "plugin":
            ok = bool(state.options(req, "n"))
        else:  # memory-first: some GPU with a replica and room by memory
            ok = any(len(g.shared_owners) < replicas
                     and g.shared_memory_used + mem <= memory for g in state.nodes["n"].gpus)
        if not ok:
            tally.refused += 1
            continue
        tally.admitted += 1
        gpu = plugin_choice(counts, replicas, rng)
        state.apply(req, Placement(req.key, "n", (gpu,)), allow_overcommit=True)
        real[req.key] = (gpu, mem)
        if any(g.shared_memory_used > memory for g in state.nodes["n"].gpus):
            tally.oom_gpus += 1
            oom = True
    tally.runs_with_oom += oom


def pod(key: str, mem: int) -> PodRequest:
    return PodRequest(key, 100, 1024, RequestKind.SHARED, gpu_memory_mib=mem)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--arrivals", type=int, default=60)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--memory", type=int, default=46_068, help="MiB per GPU")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    print(f"{args.runs} runs x {args.arrivals} events on {args.gpus} GPUs x "
          f"{args.replicas} replicas, {args.memory} MiB each (seed {args.seed})")
    print(f"{'booker':14} {'admitted':>9} {'refused':>8} {'OOM events':>11} {'runs w/ OOM':>12}")
    for booker in ("memory-first", "plugin"):
        rng = random.Random(args.seed)
        tally = Tally()
        for _ in range(args.runs):
            run(booker, args.gpus, args.replicas, args.memory, args.arrivals, rng, tally)
        print(f"{booker:14} {tally.admitted:9d} {tally.refused:8d} {tally.oom_gpus:11d} "
              f"{tally.runs_with_oom:7d} ({tally.runs_with_oom / args.runs:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
