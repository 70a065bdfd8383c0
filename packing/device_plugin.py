"""Which GPU the NVIDIA device plugin hands out for a replicated (time-sliced or MPS)
resource: a pure model of its choice.

For a shared resource (``nvidia.com/gpu.shared``, or ``nvidia.com/gpu`` when
``renameByDefault`` is off) every GPU is advertised as N replicas, ``GPU-<uuid>::<r>``.
The kubelet's device manager picks which replicas a container gets: without a topology
manager hint every healthy free replica is "unaligned", so it asks the plugin's
``GetPreferredAllocation`` with all of them (``available``, passed as Go set order, i.e.
unordered), none required, and takes the plugin's answer. The plugin (``internal/rm``,
``getPreferredAllocation``) sees annotated ids and so does not use its NVLink-aligned
allocator; it runs ``greedyAlloc`` with the comparator of its allocation policy
(``--shared-devices-allocation-policy``, default ``distributed``):

* it groups the available replicas by physical GPU; for each, ``total`` = replicas the
  plugin advertises for that GPU, ``available`` = free replicas offered, so
  ``allocated = total - available`` is the number of replicas already in use there;
* it takes one replica at a time from the best GPU and updates that GPU's counts
  (``allocated`` + 1, ``pickedFrom`` + 1), until the request is served. Best is:
  ``distributed``: fewest allocated, then fewest picked by this request;
  ``packed``: most allocated, then fewest picked; ``spread``: fewest picked, then fewest
  allocated. A GPU with no free replica is not a candidate.

It balances replica COUNTS, never memory: a GPU whose one pod fills its memory has fewer
replicas in use than a GPU holding two small pods, so ``distributed`` hands the next
share to the full one. Equal keys are broken by Go map iteration order (the heap is
built from a map), i.e. arbitrarily: the model returns every GPU the plugin may pick
(``possible``) and names the lowest index as its prediction. Older plugins (a sort by
``allocated`` alone, before ``pickedFrom`` existed) choose the same GPUs for one-replica
requests, which is all gpupack places.

``renameByDefault`` changes the resource name only, never the choice. A request for
more than one replica is refused at ``Allocate`` when ``failRequestsGreaterThanOne`` is
true (time-slicing leaves it false when unset; MPS forces true), with "maximum request
size for shared resources is 1"; otherwise each replica is picked as above, possibly
two on one GPU. Time-slicing and MPS allocate alike: MPS only adds a per-replica memory
limit (GPU memory / replicas) at ``Allocate``.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

# What "unlimited replicas" (gpupack's 0) counts as: more than any request can use.
UNLIMITED = 1 << 30


class AllocationPolicy(StrEnum):
    """The plugin's ``--shared-devices-allocation-policy`` flag (env
    ``SHARED_DEVICES_ALLOCATION_POLICY``)."""

    DISTRIBUTED = "distributed"
    PACKED = "packed"
    SPREAD = "spread"


class PluginRefusal(ValueError):
    """The plugin (or the kubelet) refuses the request; the message says why, as it does."""


@dataclass(frozen=True)
class ReplicatedGpu:
    """One physical GPU of a replicated resource, as the plugin counts it."""

    index: int
    replicas: int  # replicas advertised for this GPU (0: unlimited)
    allocated: int  # replicas of it in use now

    @property
    def total(self) -> int:
        return self.replicas if self.replicas > 0 else UNLIMITED

    @property
    def available(self) -> int:
        return max(0, self.total - self.allocated)


@dataclass(frozen=True)
class PluginChoice:
    """The GPU of each replica handed out, in the plugin's order.

    ``gpus``: the prediction (the lowest GPU index among equally good ones at each step).
    ``possible``: at each step, every GPU the plugin may pick (more than one on a tie),
    assuming the earlier steps went as predicted.
    """

    gpus: tuple[int, ...]
    possible: tuple[frozenset[int], ...]

    @property
    def first(self) -> int:
        return self.gpus[0]

    @property
    def certain(self) -> bool:
        """Whether the plugin has exactly one choice at every step."""
        return all(len(p) == 1 for p in self.possible)


def _key(policy: AllocationPolicy, allocated: int, picked: int) -> tuple[int, int]:
    if policy is AllocationPolicy.PACKED:
        return (-allocated, picked)
    if policy is AllocationPolicy.SPREAD:
        return (picked, allocated)
    return (allocated, picked)


def plugin_allocation(
    gpus: Sequence[ReplicatedGpu],
    size: int = 1,
    *,
    policy: AllocationPolicy = AllocationPolicy.DISTRIBUTED,
    fail_requests_greater_than_one: bool = True,
) -> PluginChoice:
    """The replicas the plugin hands out for a request of ``size`` on these GPUs.

    PluginRefusal when the request is refused: more than one replica under
    ``failRequestsGreaterThanOne``, or fewer free replicas than asked (the kubelet's
    "requested number of devices unavailable"). ValueError for a size below 1 or a GPU
    listed twice.
    """
    if size < 1:
        raise ValueError(f"request size must be at least 1, got {size}")
    indexes = [g.index for g in gpus]
    if len(set(indexes)) != len(indexes):
        raise ValueError(f"GPU listed twice in {indexes}")
    if size > 1 and fail_requests_greater_than_one:
        raise PluginRefusal(f"request for {size} replicas too large: maximum request size "
                            "for shared resources is 1")
    free = sum(g.available for g in gpus)
    if free < size:
        raise PluginRefusal(f"requested number of devices unavailable: requested {size}, "
                            f"available {free}")
    allocated = {g.index: g.allocated for g in gpus}
    available = {g.index: g.available for g in gpus}
    picked = dict.fromkeys(allocated, 0)
    chosen: list[int] = []
    possible: list[frozenset[int]] = []
    for _ in range(size):
        keys = {i: _key(policy, allocated[i], picked[i]) for i in allocated if available[i] > 0}
        best = min(keys.values())
        ties = frozenset(i for i, k in keys.items() if k == best)
        pick = min(ties)
        chosen.append(pick)
        possible.append(ties)
        allocated[pick] += 1
        available[pick] -= 1
        picked[pick] += 1
    return PluginChoice(tuple(chosen), tuple(possible))
