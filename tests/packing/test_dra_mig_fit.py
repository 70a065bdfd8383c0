"""The DRA allocator fit's DynamicMIG key (packing/dra/mig_fit.py): nodes of the NVIDIA
driver's slices read as the cache reads them (inventory, claim uses), one row per term,
and the neutral key for every other fit."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from packing.dra import nvidia
from packing.dra.inventory import DraInventory, claim_uses, node_inventory, with_dra_gpus
from packing.dra.mig_fit import NEUTRAL, dynamic_mig_key
from packing.dra.objects import AllocatedDevice
from packing.dra.parse import parse_resource_slice
from packing.model import NodeInfo, Placement, PodRequest, RequestKind, Snapshot
from packing.state import ClusterState

H100, A100 = "H100-80GB", "A100-80GB"


def name(minor: int, profile: str, start: int, model: str = H100) -> str:
    from packing.catalog import get_model

    m = get_model(model)
    assert m.mig is not None
    pid, _ = nvidia.profile_info(m, m.mig.profile(profile))
    return nvidia.mig_device_name(minor, profile, pid, start)


def cluster(model: str = H100, gpus: int = 2, held: Sequence[tuple[str, str]] = (),
            layout: nvidia.Layout = nvidia.Layout.SPLIT, mig_mode: Sequence[int] = (),
            static: Sequence[tuple[str, int]] = ()
            ) -> tuple[ClusterState, DraInventory]:
    """Node ``n`` of ``gpus`` GPUs with ``held``: (claim key, device) allocated."""
    specs = [nvidia.GpuSpec(i, model, mig_mode=i in mig_mode,
                            static_mig=tuple(static) if i in mig_mode else ())
             for i in range(gpus)]
    slices = [parse_resource_slice(s) for s in nvidia.node_slices("n", specs, layout=layout)]
    ids = {f"{nvidia.DRIVER}/n/{d}" for _, d in held}
    inv = node_inventory("n", slices, ids)
    assert inv is not None
    info, _ = with_dra_gpus(NodeInfo("n", 64_000, 512_000), inv)
    state = ClusterState(Snapshot(nodes=(info,)))
    for key, device in held:
        for req, p in claim_uses(inv, key, [AllocatedDevice("r", nvidia.DRIVER, "n", device)]):
            state.apply(req, p, allow_overcommit=True)
    return state, inv


def key_of(state: ClusterState, inv: DraInventory, device: str
           ) -> tuple[int, int, int, int, int, int]:
    uses = claim_uses(inv, "ns/new", [AllocatedDevice("r", nvidia.DRIVER, "n", device)])
    return dynamic_mig_key(state, inv, uses)


def test_terms_in_order() -> None:
    busy = [("ns/a", name(0, "1g.10gb", 0)), ("ns/b", name(0, "1g.10gb", 1))]
    state, inv = cluster(held=busy)
    # A node with a pod is not whole: on the busy GPU, beside its instances.
    assert key_of(state, inv, name(0, "1g.10gb", 2)) == (0, 0, 0, 4, -4, -8)
    # The idle GPU of the same node: opens it.
    assert key_of(state, inv, name(1, "1g.10gb", 0))[:2] == (0, 1)
    # An idle node: breaking it whole comes first.
    idle_state, idle_inv = cluster()
    assert key_of(idle_state, idle_inv, name(0, "1g.10gb", 0))[0] == 1


def test_compute_stranded_and_best_fit() -> None:
    state, inv = cluster(held=[("ns/a", name(0, "3g.40gb", 4))])
    # A second 3g at 0 strands a compute slice of GPU 0; a 1g there does not.
    assert key_of(state, inv, name(0, "3g.40gb", 0))[2] == 1
    assert key_of(state, inv, name(0, "1g.10gb", 0))[2] == 0
    # The fuller GPU ranks first among GPUs in use.
    full, finv = cluster(held=[("ns/a", name(0, "3g.40gb", 4)),
                               ("ns/b", name(1, "1g.10gb", 0))])
    assert key_of(full, finv, name(0, "1g.10gb", 0)) < key_of(full, finv, name(1, "1g.10gb", 1))


def test_an_ampere_gpu_turned_to_mig_for_good_ranks_after_one_that_can_go_back() -> None:
    busy = [("ns/a", name(0, "1g.10gb", 0, A100))]
    state, inv = cluster(A100, gpus=3, held=busy, mig_mode=[1])
    idle_mig = key_of(state, inv, name(1, "1g.10gb", 0, A100))  # MIG on already, idle
    idle_whole = key_of(state, inv, name(2, "1g.10gb", 0, A100))  # MIG off: on for good
    assert (idle_mig[1], idle_whole[1]) == (1, 2)
    h_state, h_inv = cluster(H100, gpus=2, held=[("ns/a", name(0, "1g.10gb", 0))])
    assert key_of(h_state, h_inv, name(1, "1g.10gb", 0))[1] == 1  # Hopper goes back


NEUTRAL_CASES = [
    ("a whole GPU", "gpu-1", nvidia.Layout.SPLIT, (), ()),
    ("a static MIG instance (no counters)", "gpu-0-mig-1g10gb-19-0", nvidia.Layout.STATIC,
     [0], [("1g.10gb", 0)]),
]


@pytest.mark.parametrize("label,device,layout,mig_mode,static", NEUTRAL_CASES,
                         ids=[c[0] for c in NEUTRAL_CASES])
def test_other_fits_are_neutral(label: str, device: str, layout: nvidia.Layout,
                                mig_mode: Sequence[int], static: Sequence[tuple[str, int]]
                                ) -> None:
    state, inv = cluster(layout=layout, mig_mode=mig_mode, static=static)
    assert key_of(state, inv, device) == NEUTRAL


def test_no_inventory_or_no_use_is_neutral() -> None:
    state, inv = cluster()
    assert dynamic_mig_key(state, None, []) == NEUTRAL
    assert dynamic_mig_key(state, inv, []) == NEUTRAL
    req = PodRequest("ns/x", kind=RequestKind.MIG, mig_profile="1g.10gb")
    assert dynamic_mig_key(state, inv, [(req, Placement("ns/x", "gone", (0,), "1g.10gb", 0,
                                                        True))]) == NEUTRAL
