"""Steering the DRA allocator off idle GPUs while a GPU in MIG mode has room (issue 34):
which MIG partition devices of which idle DynamicMIG GPUs to fence, as one pure function,
:func:`steer_fences`.

Why: kube-scheduler's DRA allocator gives a claim the first fitting device on the node
in the driver's order, which is GPU index order. On a node whose GPU 0 is idle (MIG
mode off) and whose GPU 5 is in MIG mode with room for a ``2g.20gb``, a ``2g.20gb``
claim gets GPU 0: its instance turns GPU 0's MIG mode on (about 10 s the pod waits) and
a second GPU is in use where one had room. Node choice cannot avoid it (every fit on
that node opens GPU 0); measured on seed 1 at 200 pods/h (``bench/mig.py --protocol
dra-dynamic``), 26 of the 69 H100 mode switches pods waited for came this way.

The fence is a ``NoSchedule`` device taint (:mod:`kube.mig.fences`): the allocator
skips a tainted device that the request does not tolerate and tries the next one, and
the taint of one device leaves the other devices of the same counter set alone
(``taintPreventsAllocation`` per device in k8s.io/dynamic-resource-allocation v0.37.2's
allocator; the counters it reserved for the candidate are rolled back).

Rule, per node, per MIG profile ``p`` of the node's DynamicMIG GPUs:

* **open** GPUs: DynamicMIG, MIG mode on, not being drained (a drained GPU's devices
  are fenced already and its room is not there to take).
* **room**: the ``p`` instances the open GPUs can still take, counted greedily per GPU
  (one at the lowest free start, again, until none is free; the layout rules kept).
* **idle** GPUs: DynamicMIG, MIG mode off, nothing holding them. Only an idle GPU of
  lower index than the last open GPU with room for ``p`` comes first in the allocator's
  order, so only those are fenced.
* fence the ``p`` devices of those idle GPUs when the room is at least ``margin``;
  once fenced, keep them while it is at least ``keep`` (hysteresis: between the two,
  a pod that comes or goes on the GPUs in MIG mode no longer puts up or takes down
  about 20 DeviceTaintRules per idle GPU; measured in docs/mig.md).

What stays open, by construction: the whole-GPU device of every idle GPU (a whole-GPU
pod keeps it), and every profile the node's open GPUs have no room for (a pod of that
profile still opens an idle GPU, as it must). The fence lifts at the next step once the
room falls below ``margin``; between two steps a pod can find the node's room taken and
the idle GPUs fenced, and then goes to another node or waits for that step
(``margin`` above 1 trades fewer such pods for more openings).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from packing.catalog import MigGeometry, get_model
from packing.mig.layout import MigSlot, free_starts
from scheduler.mig.decide import GpuView, NodeView

GpuKey = tuple[str, int]  # (node, GPU index)
Steer = tuple[str, int, str]  # (node, GPU index, MIG profile) whose devices are fenced


def room(geometry: MigGeometry, layout: Sequence[MigSlot], profile: str) -> int:
    """How many more ``profile`` instances fit beside ``layout``, each at the lowest
    free start (the allocator's first fit on one GPU)."""
    placed = list(layout)
    n = 0
    while True:
        starts = free_starts(geometry, placed, profile)
        if not starts:
            return n
        placed.append(MigSlot(profile, starts[0]))
        n += 1


def _geometry(model: str) -> MigGeometry | None:
    try:
        return get_model(model).mig
    except (KeyError, ValueError):
        return None  # a GPU the catalog does not know: nothing to count its room by


def _idle(g: GpuView) -> bool:
    return g.dynamic and not g.mig_enabled and not g.holders


def steer_fences(nodes: Sequence[NodeView], draining: Collection[GpuKey] = (),
                 margin: int = 1, keep: int = 0, up: Collection[Steer] = ()
                 ) -> tuple[Steer, ...]:
    """The (node, GPU, profile) whose MIG devices to fence now (sorted); none when
    ``margin`` is 0 or less. ``up``: the fences up now; a profile with fences up on a
    node keeps them while its room is at least ``keep`` (1 .. ``margin``; 0 or more
    than the margin: the margin). See the module docstring."""
    if margin <= 0:
        return ()
    keep = keep if 0 < keep < margin else margin
    fenced_now = {(node, p) for node, _, p in up}
    out: list[Steer] = []
    for n in nodes:
        if n.unschedulable or n.tainted:
            continue  # no ordinary pod lands there: nothing to steer
        idle = [g for g in n.gpus if _idle(g) and (n.name, g.index) not in draining]
        if not idle:
            continue
        open_ = [g for g in n.gpus if g.dynamic and g.mig_enabled
                 and (n.name, g.index) not in draining]
        for model in sorted({g.model for g in idle}):
            geom = _geometry(model)
            if geom is None:
                continue
            mine = [g for g in open_ if g.model == model]
            for p in geom.profile_names:
                rooms = [(g.index, room(geom, g.layout, p)) for g in mine]
                total = sum(k for _, k in rooms)
                if total < (keep if (n.name, p) in fenced_now else margin):
                    continue
                last = max(i for i, k in rooms if k)
                out += [(n.name, g.index, p) for g in idle
                        if g.model == model and g.index < last]
    return tuple(sorted(out))


__all__ = ["Steer", "room", "steer_fences"]
