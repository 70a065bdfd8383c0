"""packing.dra.allocator and packing.dra.pools: the allocator's choice in table cases (order,
ExactCount and All, firstAvailable, constraints, counters, consumable capacity, taints,
pools, errors), and properties over random NVIDIA-shaped nodes and claims: no device
taken twice, no counter over-consumed, All takes every matching device, the answer does
not depend on dict order, and the search is complete (it allocates exactly when some
choice of free devices would satisfy the claim)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from decimal import Decimal

import pytest
from dra_builders import (
    ANY,
    allocated,
    claim,
    device,
    exact,
    first,
    names,
    nvidia_classes,
    nvidia_node,
    profile_sel,
    q,
    run,
    slice_,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.constraints import Requirement, Term
from packing.dra import nvidia
from packing.dra.allocator import Verdict, allocated_state
from packing.dra.cel import Outcome, evaluate
from packing.dra.objects import (
    Constraint,
    DeviceClass,
    DeviceTaint,
    DeviceTaintRule,
    DeviceToleration,
    Node,
    NodeSelector,
    RequestPolicy,
    ValidRange,
    frozen_map,
)
from packing.dra.pools import apply_taint_rules, gather_pools

A, B, C = device("a"), device("b"), device("c")
ALLOC, UNSCHED, ERR, UNK = (Verdict.ALLOCATED, Verdict.UNSCHEDULABLE, Verdict.ERROR,
                            Verdict.UNKNOWN)


# -- order and counts ----------------------------------------------------------------------


def test_first_fit_follows_pool_slice_and_device_order() -> None:
    slices = [slice_("s-b", C, pool="p1", count=2), slice_("s-a", B, A, pool="p1", count=2),
              slice_("s-0", device("z"), pool="p2")]
    # pools by name, slices by name within a pool, devices in slice order
    assert names(run(slices, claim("c", exact("r", count=4)))) == [["b", "a", "c", "z"]]
    state = allocated_state([allocated("x", "b", pool="p1")])
    assert names(run(slices, claim("c", exact("r")), state=state)) == [["a"]]


def test_claims_in_order_and_devices_not_shared() -> None:
    p = run([slice_("s", A, B, C)], claim("one", exact("r")), claim("two", exact("r", count=2)))
    assert names(p) == [["a"], ["b", "c"]]
    assert run([slice_("s", A, B)], claim("one", exact("r")),
               claim("two", exact("r", count=2))).verdict is UNSCHED


def test_all_takes_every_matching_device_or_nothing() -> None:
    slices = [slice_("s", device("a", attrs={"k": 1}), device("b", attrs={"k": 2}),
                     device("c", attrs={"k": 1}))]
    sel = f"device.attributes['{slices[0].driver}'].k == 1"
    assert names(run(slices, claim("c", exact("r", "any", sel, mode="All")))) == [["a", "c"]]
    state = allocated_state([allocated("x", "c")])
    assert run(slices, claim("c", exact("r", "any", sel, mode="All")),
               state=state).verdict is UNSCHED  # one in use: All fails
    none = f"device.attributes['{slices[0].driver}'].k == 9"
    assert run(slices, claim("c", exact("r", "any", none, mode="All"))).verdict is UNSCHED


def test_more_than_32_devices_is_an_error() -> None:
    many = slice_("s", *(device(f"d{i:02d}") for i in range(33)))
    assert run([many], claim("c", exact("r", mode="All"))).verdict is ERR
    assert run([many], claim("c", exact("r", count=33))).verdict is ERR
    assert run([many], claim("c", exact("r", count=32))).verdict is ALLOC


# -- firstAvailable and backtracking -------------------------------------------------------


def test_first_available_takes_the_first_subrequest_that_lets_everything_fit() -> None:
    slices = [slice_("s", device("small", attrs={"size": 1}),
                     device("big", attrs={"size": 2}))]
    d = slices[0].driver
    small = exact("small", "any", f"device.attributes['{d}'].size == 1")
    big = exact("big", "any", f"device.attributes['{d}'].size == 2")
    p = run(slices, claim("c", first("r", small, big)))
    assert names(p) == [["small"]] and p.results[0][0].request == "r/small"
    # The next claim needs the small device: the first claim falls back to the big one.
    p = run(slices, claim("c1", first("r", small, big)),
            claim("c2", exact("only", "any", f"device.attributes['{d}'].size == 1")))
    assert names(p) == [["big"], ["small"]] and p.results[0][0].request == "r/big"


def test_backtracking_finds_a_combination_first_fit_alone_misses() -> None:
    # Two requests with matchAttribute: the first device that fits the first request has
    # no partner, so the search moves on to the second.
    slices = [slice_("s", device("a1", attrs={"g": "x", "t": "a"}),
                     device("a2", attrs={"g": "y", "t": "a"}),
                     device("b2", attrs={"g": "y", "t": "b"}))]
    d = slices[0].driver
    c = claim("c", exact("a", "any", f"device.attributes['{d}'].t == 'a'"),
              exact("b", "any", f"device.attributes['{d}'].t == 'b'"),
              constraints=[Constraint(match_attribute=f"{d}/g")])
    assert names(run(slices, c)) == [["a2", "b2"]]


def test_distinct_attribute_spreads() -> None:
    slices = [slice_("s", device("a1", attrs={"g": "x"}), device("a2", attrs={"g": "x"}),
                     device("b1", attrs={"g": "y"}))]
    d = slices[0].driver
    c = claim("c", exact("r", count=2), constraints=[Constraint(distinct_attribute=f"{d}/g")])
    assert names(run(slices, c)) == [["a1", "b1"]]


@pytest.mark.parametrize("kind", ["matchAttribute", "distinctAttribute"])
def test_list_attributes_only_ever_admit_one_device(kind: str) -> None:
    # List values (the alpha DRAListTypeAttributes) are a type the constraints do not
    # compare: the first device of the set goes in, no second one does.
    s = [slice_("s", device("a", attrs={"g": (1, 2)}), device("b", attrs={"g": (3,)}))]
    d = s[0].driver
    one = Constraint(**{"match_attribute" if kind == "matchAttribute" else
                        "distinct_attribute": f"{d}/g"})
    assert names(run(s, claim("c", exact("r"), constraints=[one]))) == [["a"]]
    assert run(s, claim("c", exact("r", count=2), constraints=[one])).verdict is UNSCHED


def test_match_attribute_on_a_missing_attribute_never_fits() -> None:
    c = claim("c", exact("r"), constraints=[Constraint(match_attribute="test.example.com/g")])
    assert run([slice_("s", A)], c).verdict is UNSCHED


# -- NVIDIA: counters and MIG placements --------------------------------------------------


def nv(*claims_: object, gpus: int = 1, state: object = None, **kw: object) -> object:
    return run(nvidia_node(gpus=gpus, **kw), *claims_, classes=nvidia_classes(),  # type: ignore[arg-type]
               state=state)  # type: ignore[arg-type]


def mig(profile: str, count: int = 1, name: str = "c") -> object:
    return claim(name, exact("r", nvidia.MIG_CLASS, profile_sel(profile), count=count))


def test_mig_placements_follow_name_order_and_counters() -> None:
    p = nv(mig("1g.10gb"), mig("3g.40gb", name="d"), mig("2g.20gb", name="e"))
    # 1g at slice 0; 3g cannot start at 0 (slice 0 taken), so at 4; 2g at 2 (0-1 overlap)
    assert names(p) == [["gpu-0-mig-1g10gb-19-0"], ["gpu-0-mig-3g40gb-9-4"],
                        ["gpu-0-mig-2g20gb-14-2"]]
    whole = claim("w", exact("r", nvidia.GPU_CLASS))
    assert nv(mig("1g.10gb"), whole).verdict is UNSCHED  # a MIG device uses the GPU's counters
    state = allocated_state([allocated("x", "gpu-0", pool="n1", driver=nvidia.DRIVER)])
    assert nv(mig("1g.10gb"), state=state).verdict is UNSCHED


def test_a_media_extension_slice_per_gpu() -> None:
    me = [claim(f"m{i}", exact("r", nvidia.MIG_CLASS, profile_sel("1g.10gb+me")))
          for i in range(2)]
    p = nv(*me, gpus=2)
    assert names(p) == [["gpu-0-mig-1g10gb-me-20-0"], ["gpu-1-mig-1g10gb-me-20-0"]]
    assert nv(*me, gpus=1).verdict is UNSCHED  # the OFA counter allows one


def test_seven_1g_fill_a_gpu_then_the_next() -> None:
    p = nv(mig("1g.10gb", count=7), mig("1g.10gb", name="d"), gpus=2)
    assert names(p)[0] == [f"gpu-0-mig-1g10gb-19-{i}" for i in range(7)]
    assert names(p)[1] == ["gpu-1-mig-1g10gb-19-0"]


def test_counters_consumed_by_allocated_devices_on_any_slice() -> None:
    state = allocated_state([allocated("x", "gpu-0-mig-4g40gb-5-0", pool="n1",
                                       driver=nvidia.DRIVER)])
    p = nv(mig("4g.40gb"), mig("3g.40gb", name="d"), state=state)
    assert p.verdict is UNSCHED
    assert names(nv(mig("3g.40gb"), state=state)) == [["gpu-0-mig-3g40gb-9-4"]]


# -- consumable capacity -------------------------------------------------------------------


MEM = {"memory": RequestPolicy(default=q("1Gi"), valid_range=ValidRange(
    q("1Gi"), q("8Gi"), q("1Gi")))}


def shared(name: str = "g") -> object:
    return device(name, capacity={"memory": "8Gi"}, multi=True, policy=MEM)


@pytest.mark.parametrize(("asks", "consumed"), [
    (None, ["1Gi"]), ("1", ["1Gi"]), ("1500Mi", ["2Gi"]), ("8Gi", ["8Gi"]),
    ("3Gi", ["3Gi"])])
def test_capacity_requests_round_up_to_the_policy(asks: str | None, consumed: list[str]) -> None:
    r = exact("r", capacity=None if asks is None else {"memory": asks})
    p = run([slice_("s", shared())], claim("c", r))  # type: ignore[arg-type]
    (result,) = p.results[0]
    assert result.share_id is not None
    assert result.consumed_capacity == {"memory": q(consumed[0])}


def test_shared_device_fills_up() -> None:
    s = [slice_("s", shared(), shared("h"))]  # type: ignore[arg-type]
    p = run(s, claim("a", exact("r", capacity={"memory": "5Gi"})),
            claim("b", exact("r", capacity={"memory": "4Gi"})),
            claim("c", exact("r", capacity={"memory": "3Gi"})))
    assert names(p) == [["g"], ["h"], ["g"]]  # 5 + 3 on g; 4 would not fit beside 5
    too_big = run(s, claim("a", exact("r", capacity={"memory": "9Gi"})))
    assert too_big.verdict is UNSCHED
    unknown_capacity = run(s, claim("a", exact("r", capacity={"cores": "1"})))
    assert unknown_capacity.verdict is UNSCHED
    state = allocated_state([allocated("x", "g", share="s1", consumed={"memory": "7Gi"})])
    p = run(s, claim("a", exact("r", capacity={"memory": "2Gi"})), state=state)
    assert names(p) == [["h"]]


def test_shared_partition_charges_counters_once() -> None:
    info = nvidia.DriverInfo(consumable_shares="unlimited")
    sel = profile_sel("7g.80gb")
    # Only memory has a request policy: a claim that does not ask for the other
    # capacities (multiprocessors, engines) consumes all of them, so no second share fits.
    a = claim("a", exact("r", nvidia.MIG_CLASS, sel, capacity={"memory": "10Gi"}))
    assert nv(a, replace(a, name="b"), info=info).verdict is UNSCHED
    # Asking none of them: two shares of one 7g slice, its counters charged once (a
    # second 7g slice would not fit the GPU's counters).
    zero = {k: "0" for k in ("multiprocessors", "copyEngines", "decoders", "encoders",
                             "jpegEngines", "ofaEngines")}
    a = claim("a", exact("r", nvidia.MIG_CLASS, sel, capacity={"memory": "10Gi", **zero}))
    p = nv(a, replace(a, name="b"), info=info)
    assert names(p) == [["gpu-0-mig-7g80gb-0-0"], ["gpu-0-mig-7g80gb-0-0"]]
    assert p.results[0][0].share_id != p.results[1][0].share_id
    assert p.results[1][0].consumed_capacity is not None
    assert p.results[1][0].consumed_capacity["multiprocessors"] == 0


# -- taints ----------------------------------------------------------------------------------


def test_taints_and_tolerations() -> None:
    bad = DeviceTaint("gpu.example.com/unhealthy", "xid", "NoSchedule")
    gone = DeviceTaint("gpu.example.com/unhealthy", "xid", "NoExecute")
    info = DeviceTaint("note", "", "None")
    s = [slice_("s", device("a", taints=[bad]), device("b", taints=[gone]),
                device("c", taints=[info]))]
    assert names(run(s, claim("c", exact("r")))) == [["c"]]
    exists = DeviceToleration(key="gpu.example.com/unhealthy", operator="Exists",
                              effect="NoSchedule")
    assert names(run(s, claim("c", exact("r", tolerations=[exists])))) == [["a"]]
    equal = DeviceToleration(key="gpu.example.com/unhealthy", value="xid")
    assert names(run(s, claim("c", exact("r", count=3, tolerations=[equal])))) == [
        ["a", "b", "c"]]
    wrong_value = DeviceToleration(key="gpu.example.com/unhealthy", value="other")
    assert names(run(s, claim("c", exact("r", tolerations=[wrong_value])))) == [["c"]]


def test_device_taint_rules_apply_before_allocation() -> None:
    s = [slice_("s", A, B)]
    rule = DeviceTaintRule("keep", DeviceTaint("gpupack.io/kept", "", "NoSchedule"),
                           driver=s[0].driver, device="a")
    tainted = apply_taint_rules(s, [rule])
    assert tainted[0].devices[0].taints == (rule.taint,) and tainted[0].devices[1].taints == ()
    assert names(run(tainted, claim("c", exact("r")))) == [["b"]]
    nothing = DeviceTaintRule("none", rule.taint, has_selector=False)
    assert apply_taint_rules(s, [nothing])[0] == s[0]


# -- pools -----------------------------------------------------------------------------------


def test_pool_generations_completeness_and_validity() -> None:
    old = slice_("s-old", A, generation=1)
    new = slice_("s-new", B, generation=2)
    assert names(run([old, new], claim("c", exact("r")))) == [["b"]]
    part = slice_("s1", A, count=2)  # the pool's second slice is missing
    assert run([part], claim("c", exact("r"))).verdict is UNSCHED
    assert run([part], claim("c", exact("r", mode="All"))).verdict is ERR
    # the second slice exists for another node: complete, and A is still usable here
    other = slice_("s2", B, count=2, node="n2")
    assert names(run([part, other], claim("c", exact("r", count=1)))) == [["a"]]
    # a newer generation seen only on another node makes this pool obsolete: skipped
    newer = slice_("s3", C, count=2, node="n2", generation=2)
    assert gather_pools(Node("n1"), [part, newer]) == []
    dup = [slice_("s1", A, count=2), slice_("s2", A, count=2)]
    p = run(dup, claim("c", exact("r")))
    assert p.verdict is UNSCHED and "invalid" in p.reason
    missing_set = slice_("s", device("a", counters={"nope": {"x": 1}}))
    assert gather_pools(Node("n1"), [missing_set])[0].invalid == "counter set nope not found"


def test_node_selection() -> None:
    mine = slice_("s1", A, pool="p1")
    theirs = slice_("s2", B, pool="p2", node="n2")
    everywhere = slice_("s3", C, pool="p3", node=None, all_nodes=True)
    zone = replace(slice_("s4", device("z"), pool="p4", node=None),
                   node_selector=NodeSelector((Term((Requirement("zone", "In", ("a",)),)),)))
    other_zone = replace(zone, name="s5", pool="p5", node_selector=NodeSelector((Term((
        Requirement("zone", "In", ("b",)),)),)))
    p = run([mine, theirs, everywhere, zone, other_zone], claim("c", exact("r", mode="All")))
    assert names(p) == [["a", "c", "z"]]


def test_binding_condition_pools_come_last() -> None:
    waits = slice_("s", device("w", binding=["ready"]), pool="a-first-by-name")
    plain = slice_("s", device("p"), pool="z-last-by-name")
    assert [p.name for p in gather_pools(Node("n1"), [waits, plain])] == [
        "z-last-by-name", "a-first-by-name"]


# -- verdicts other than "allocated" -------------------------------------------------------


def test_missing_class_error_unknown_and_budget() -> None:
    s = [slice_("s", A, B, C)]
    assert run(s, claim("c", exact("r", "nope"))).verdict is UNSCHED
    assert run(s, claim("c", exact("r", "any", "device.attributes['x.com'].y == 1"))
               ).verdict is ERR
    assert run(s, claim("c", exact("r", "any", "device.driver.matches('.*')"))).verdict is UNK
    assert run(s, claim("c", replace(exact("r"), has_derived_attributes=True))).verdict is ERR
    assert run(s, claim("c", exact("r", count=3)), max_steps=2).verdict is UNK


def test_admin_access_ignores_and_is_ignored_by_use() -> None:
    state = allocated_state([allocated("x", "a")])
    s = [slice_("s", A)]
    assert names(run(s, claim("c", exact("r", admin=True)), state=state)) == [["a"]]
    assert allocated_state([allocated("y", "a", admin=True)]).in_use == frozenset()


# -- properties --------------------------------------------------------------------------------

PROFILES = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me")


@st.composite
def nvidia_claims(draw: st.DrawFn) -> list[object]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            out.append(claim(f"c{i}", exact("r", nvidia.MIG_CLASS,
                                            profile_sel(draw(st.sampled_from(PROFILES))),
                                            count=draw(st.integers(1, 3)))))
        else:
            out.append(claim(f"c{i}", exact("r", nvidia.GPU_CLASS,
                                            count=draw(st.integers(1, 2)))))
    return out


@st.composite
def busy_state(draw: st.DrawFn) -> object:
    """What earlier pods hold: a model-made allocation of random earlier claims."""
    slices = nvidia_node(gpus=2)
    taken = []
    for i, c in enumerate(draw(nvidia_claims())):
        p = run(slices, replace(c, name=f"old{i}"), classes=nvidia_classes(),  # type: ignore[type-var]
                state=allocated_state(taken))
        if p.verdict is ALLOC:
            taken.append(replace(c, name=f"old{i}", allocation=_allocation(p)))  # type: ignore[type-var]
    return allocated_state(taken)


def _allocation(p: object) -> object:
    from packing.dra.objects import Allocation

    return Allocation(p.results[0])  # type: ignore[attr-defined]


@settings(max_examples=60, deadline=None)
@given(busy_state(), nvidia_claims())
def test_no_device_twice_and_no_counter_overdrawn(state: object, claims_: list[object]) -> None:
    slices = nvidia_node(gpus=2)
    p = run(slices, *claims_, classes=nvidia_classes(), state=state)  # type: ignore[arg-type]
    if p.verdict is not ALLOC:
        return
    new = [f"{d.driver}/{d.pool}/{d.device}" for c in p.results for d in c]
    assert len(new) == len(set(new)) and not set(new) & state.in_use  # type: ignore[attr-defined]
    held = set(new) | state.in_use  # type: ignore[attr-defined]
    pool = gather_pools(Node("n1"), slices)[0]
    used: dict[tuple[str, str], Decimal] = {}
    for _s, d in pool.devices():
        if f"{nvidia.DRIVER}/n1/{d.name}" in held:
            for c in d.consumes_counters:
                for k, v in c.counters.items():
                    used[(c.counter_set, k)] = used.get((c.counter_set, k), Decimal(0)) + v
    for (cs, k), v in used.items():
        assert v <= pool.counter_sets[cs].counters[k], (cs, k)


@settings(max_examples=40, deadline=None)
@given(busy_state(), st.sampled_from(PROFILES))
def test_all_takes_every_matching_free_device(state: object, profile: str) -> None:
    slices = nvidia_node(gpus=1)
    p = run(slices, claim("c", exact("r", nvidia.MIG_CLASS, profile_sel(profile), mode="All")),
            classes=nvidia_classes(), state=state)  # type: ignore[arg-type]
    matching = [d.name for s in slices for d in s.devices
                if evaluate(profile_sel(profile), d, nvidia.DRIVER).outcome is Outcome.TRUE
                and evaluate(nvidia_classes()[1].selectors[0], d,
                             nvidia.DRIVER).outcome is Outcome.TRUE]
    if p.verdict is ALLOC:
        assert names(p) == [matching]


@settings(max_examples=40, deadline=None)
@given(nvidia_claims(), st.randoms(use_true_random=False))
def test_answer_does_not_depend_on_dict_or_list_order(claims_: list[object],
                                                      rnd: object) -> None:
    slices = nvidia_node(gpus=2)
    shuffled = []
    for s in slices:
        devices = []
        for d in s.devices:
            items = list(d.attributes.items())
            rnd.shuffle(items)  # type: ignore[attr-defined]
            caps = list(d.capacity.items())
            rnd.shuffle(caps)  # type: ignore[attr-defined]
            devices.append(replace(d, attributes=frozen_map(dict(items)),
                                   capacity=frozen_map(dict(caps))))
        shuffled.append(replace(s, devices=tuple(devices)))
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]  # the API lists slices in any order
    a = run(slices, *claims_, classes=nvidia_classes())  # type: ignore[arg-type]
    b = run(shuffled, *claims_, classes=nvidia_classes())  # type: ignore[arg-type]
    assert (a.verdict, a.results) == (b.verdict, b.results)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("xyz"), st.booleans()), min_size=1, max_size=6),
       st.integers(1, 4), st.booleans(), st.sets(st.integers(0, 5)))
def test_search_is_complete(devs: list[tuple[str, bool]], count: int, match: bool,
                            busy: set[int]) -> None:
    """Allocated exactly when some ``count`` free selectable devices satisfy the
    constraint; and then the first such combination in device order."""
    s = slice_("s", *(device(f"d{i}", attrs={"g": g, "ok": ok})
                      for i, (g, ok) in enumerate(devs)))
    d = s.driver
    cons = [Constraint(match_attribute=f"{d}/g")] if match else []
    state = allocated_state([allocated("x", *(f"d{i}" for i in busy if i < len(devs)))])
    c = claim("c", exact("r", "any", f"device.attributes['{d}'].ok", count=count),
              constraints=cons)
    p = run([s], c, state=state)
    free = [i for i, (_g, ok) in enumerate(devs) if ok and i not in busy]
    combos = [combo for combo in itertools.combinations(free, count)
              if not match or len({devs[i][0] for i in combo}) == 1]
    if combos:
        assert p.verdict is ALLOC and names(p) == [[f"d{i}" for i in combos[0]]]
    else:
        assert p.verdict is UNSCHED


def test_class_selectors_are_anded_with_the_request() -> None:
    klass = DeviceClass("only-a", ("device.attributes['test.example.com'].t == 'a'",))
    s = [slice_("s", device("x", attrs={"t": "b"}), device("y", attrs={"t": "a"}))]
    assert names(run(s, claim("c", exact("r", "only-a")), classes=[klass, ANY])) == [["y"]]
