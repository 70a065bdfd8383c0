"""Node state signatures, the (shape, signature) memo, selectors, warming, and the
packer's unresolvable check on reconfigurable nodes."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from sched_builders import filter_args, make_cache, mig_pod, node, whole_pod

from packing.model import Placement, Snapshot
from packing.policies.gpupack import make_gpupack_scorer
from scheduler.extender.cycle import read_pod
from scheduler.extender.verbs import NoPlan, choose_placement, filter_nodes, prioritize
from scheduler.extender.wire import ExtenderArgs
from scheduler.memo.decide import Memo, ScorerRef
from scheduler.memo.loop import Warmer

NAMES = [f"w{i}" for i in range(6)]


def whole_nodes() -> list[dict[str, Any]]:
    return [node(n, gpus=8, reconfigurable=False, labels={"zone": "a" if i < 3 else "b"})
            for i, n in enumerate(NAMES)]


def scorer(gen: int = 1) -> ScorerRef:
    return ScorerRef(make_gpupack_scorer(Snapshot(nodes=())), gen)


def test_nodes_in_one_state_share_a_signature_and_a_change_splits_them() -> None:
    cache = make_cache(whole_nodes())
    sigs = dict(cache.signatures())
    assert len(set(sigs.values())) == 1
    cache.upsert_pod(whole_pod("r", 2, node="w0"))
    after = cache.signatures()
    assert after["w0"] != sigs["w0"]
    assert all(after[n] == sigs[n] for n in NAMES[1:])
    cache.delete_pod("default/r")  # back to the same state: the same id again
    assert cache.signatures()["w0"] == sigs["w0"]
    cache.delete_node("w5")
    assert "w5" not in cache.signatures()


def test_one_evaluation_serves_every_node_in_that_state() -> None:
    cache = make_cache(whole_nodes(), [whole_pod("r", 7, node="w0")])
    memo = Memo()
    args = ExtenderArgs.decode(filter_args(whole_pod("llm", 2), NAMES))
    result = filter_nodes(args, cache, memo)
    assert result.node_names == tuple(NAMES[1:])
    assert "1 whole GPU(s) free, 2 needed" in result.failed["w0"]
    assert memo.misses == 2 and memo.hits == 4
    out = prioritize(args, cache, memo, scorer(), NoPlan())
    scores = {h.host: h.score for h in out}
    assert scores["w0"] == 0
    # Equal states, equal preferences: the first by name alone gets 10 (one winner, so
    # kube-scheduler's random tie-break cannot spread a burst), the others 9.
    assert {n: scores[n] for n in NAMES[1:]} == {n: 10 if n == NAMES[1] else 9
                                                  for n in NAMES[1:]}
    assert memo.misses == 2


def test_prioritize_normalizes_over_the_request_nodes() -> None:
    cache = make_cache(whole_nodes(), [whole_pod("r", 7, node="w0")])
    one = whole_pod("one", 1)
    # The scorer of a workload of 7-GPU and 1-GPU pods (the planner builds it from the
    # cache's pods): the one GPU left on w0 serves no 7-GPU pod, so filling it lowers
    # the fragment (FGD) while any idle node would lose room for one.
    workload = Snapshot((), running=((read_pod(whole_pod("r", 7)), Placement("default/r", "w0")),),
                        pending=(read_pod(one),))
    ref = ScorerRef(make_gpupack_scorer(workload), 1)
    args = ExtenderArgs.decode(filter_args(one, NAMES))
    scores = {h.host: h.score for h in prioritize(args, cache, Memo(), ref, NoPlan())}
    # It alone gets 10.
    assert scores["w0"] == 10 and all(scores[n] == 0 for n in NAMES[1:])
    only_idle = ExtenderArgs.decode(filter_args(one, NAMES[1:]))
    scores = {h.host: h.score for h in prioritize(only_idle, cache, Memo(), ref, NoPlan())}
    assert scores == {n: 10 if n == NAMES[1] else 9 for n in NAMES[1:]}


def test_selector_is_checked_per_node_and_the_answer_shared() -> None:
    cache = make_cache(whole_nodes())
    memo = Memo()
    p = whole_pod("zoned", 1)
    p["spec"]["nodeSelector"] = {"zone": "b"}
    result = filter_nodes(ExtenderArgs.decode(filter_args(p, NAMES)), cache, memo)
    assert result.node_names == ("w3", "w4", "w5")
    assert result.unresolvable["w0"] == "node selector zone=b does not match"
    assert memo.misses == 1
    plain = filter_nodes(ExtenderArgs.decode(filter_args(whole_pod("any", 1), NAMES)), cache,
                         memo)
    assert plain.node_names == tuple(NAMES) and memo.misses == 1  # same selector-free shape
    scores = prioritize(ExtenderArgs.decode(filter_args(p, NAMES)), cache, memo, scorer(),
                        NoPlan())
    assert {h.host for h in scores if h.score == 0} >= {"w0", "w1", "w2"}


def test_cordon_wins_over_a_selector_mismatch() -> None:
    cache = make_cache([node("c", unschedulable=True, labels={"zone": "a"})])
    p = whole_pod("zoned", 1)
    p["spec"]["nodeSelector"] = {"zone": "b"}
    result = filter_nodes(ExtenderArgs.decode(filter_args(p, ["c"])), cache, Memo())
    assert result.unresolvable == {"c": "node is cordoned"}


def test_warmer_fills_fit_and_score_for_pending_shapes() -> None:
    cache = make_cache([*whole_nodes(), node("m", mig={"1g.10gb": 7})],
                       [mig_pod("asr"), whole_pod("llm", 2), whole_pod("r", 3, node="w1")])
    memo = Memo()
    ref = scorer()
    warmer = Warmer(cache, memo, lambda: ref, ahead=False)  # counts the states seen only
    assert warmer.sweep() == 2 * 3  # 2 shapes x 3 signatures (idle whole, used whole, MIG)
    assert warmer.sweep() == 0  # nothing changed
    names = [*NAMES, "m"]
    for p in (mig_pod("asr"), whole_pod("llm", 2)):
        args = ExtenderArgs.decode(filter_args(p, names))
        filter_nodes(args, cache, memo)
        prioritize(args, cache, memo, ref, NoPlan())
    assert memo.misses == 0
    cache.upsert_pod(whole_pod("r2", 1, node="w2"))
    assert warmer.sweep() == 2  # the new state, for each shape
    ref = scorer(2)  # a new scorer: fitting entries are re-scored
    assert warmer.sweep() == 4


def test_the_states_binds_create_are_warmed_before_the_binds() -> None:
    # A bind puts its node into "state + pod at the memoized best option"; the warmer
    # has answers for that state ready, so the requests after the bind do not miss.
    cache = make_cache([*whole_nodes(), node("m", mig={"1g.10gb": 7})],
                       [mig_pod("asr"), mig_pod("asr2"), whole_pod("llm", 2),
                        whole_pod("r", 3, node="w1")])
    memo = Memo()
    ref = scorer()
    warmer = Warmer(cache, memo, lambda: ref)
    assert warmer.sweep() > 2 * 3 and warmer.successors > 0
    names = [*NAMES, "m"]
    for key, node_name in (("default/asr", "m"), ("default/llm", "w2")):
        req = cache.pending_pod(key)
        with cache.view() as view:
            p = choose_placement(view, req, node_name, ref.scorer, NoPlan(), memo, ref.gen)
        assert not isinstance(p, str)
        cache.assume(req, req.uid, p)
        before = memo.misses
        for q in (mig_pod("asr2"), whole_pod("llm", 2)):
            args = ExtenderArgs.decode(filter_args(q, names))
            filter_nodes(args, cache, memo)
            prioritize(args, cache, memo, ref, NoPlan())
        assert memo.misses == before, key  # the bind's new state was warmed ahead
    # Without looking ahead, the same binds miss.
    cold = make_cache([*whole_nodes(), node("m", mig={"1g.10gb": 7})],
                      [mig_pod("asr"), mig_pod("asr2"), whole_pod("r", 3, node="w1")])
    memo2 = Memo()
    Warmer(cold, memo2, lambda: ref, ahead=False).sweep()
    req = cold.pending_pod("default/asr")
    with cold.view() as view:
        p = choose_placement(view, req, "m", ref.scorer, NoPlan(), memo2, ref.gen)
    assert not isinstance(p, str)
    cold.assume(req, req.uid, p)
    filter_nodes(ExtenderArgs.decode(filter_args(mig_pod("asr2"), names)), cold, memo2)
    assert memo2.misses == 1


def test_unresolvable_counts_idle_whole_gpus_of_a_reconfigurable_node() -> None:
    cache = make_cache([node("r", gpus=2), node("f", gpus=2, reconfigurable=False)])
    p = read_pod(mig_pod("asr"))
    assert cache.state.unresolvable(p, "r") is None
    assert "no GPU of a usable kind" in (cache.state.unresolvable(p, "f") or "")
    result = filter_nodes(ExtenderArgs.decode(filter_args(mig_pod("asr"), ["r", "f"])), cache,
                          Memo())
    assert result.node_names == ("r",) and "f" in result.unresolvable


def test_warm_child_process_gives_the_same_answers_as_the_request_path() -> None:
    from scheduler.planner.loop import Planner

    nodes = [*whole_nodes(), node("m", mig={"1g.10gb": 7}), node("m2", mig={"2g.20gb": 3})]
    pods = [mig_pod("asr"), whole_pod("llm", 2), whole_pod("r", 3, node="w1"),
            mig_pod("s", node="m")]
    names = [*NAMES, "m", "m2"]

    def answers(memo: Memo, ref: ScorerRef, cache: Any) -> list[Any]:
        out = []
        for p in (mig_pod("asr"), whole_pod("llm", 2)):
            args = ExtenderArgs.decode(filter_args(p, names))
            f = filter_nodes(args, cache, memo)
            out.append((f.node_names, dict(f.failed), dict(f.unresolvable),
                        prioritize(args, cache, memo, ref, NoPlan())))
        return out

    cache = make_cache(nodes, pods)
    planner = Planner(cache, "gpupack", in_process=True)
    planner.solve_once()  # the scorer of the workload, with its source
    ref = planner.scorer
    assert ref.policy == "gpupack" and ref.source is not None
    memo = Memo()
    warmer = Warmer(cache, memo, lambda: ref, ahead=False)
    try:
        assert warmer.sweep() == 2 * 4
        assert warmer.child is not None and warmer.child.pid not in (None, os.getpid())
        warm = answers(memo, ref, cache)
        assert memo.misses == 0
        assert warm == answers(Memo(), ref, make_cache(nodes, pods))  # computed here
    finally:
        warmer.stop()


def test_a_new_scorer_reaches_the_verbs_only_once_it_is_warmed() -> None:
    import time

    cache = make_cache([*whole_nodes(), node("m", mig={"1g.10gb": 7})],
                       [mig_pod("asr"), whole_pod("llm", 2), whole_pod("r", 3, node="w1")])
    memo = Memo()
    refs = [scorer(1)]
    warmer = Warmer(cache, memo, lambda: refs[0], in_process=True, interval_s=0.2)
    warmer.start()
    try:
        deadline = time.monotonic() + 10
        while warmer.active is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        refs[0] = scorer(2)
        assert warmer.current().gen in (1, 2)
        while warmer.current().gen != 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        entries = [ev for t in memo.tables.values() for ev in t.values() if ev.fits]
        assert entries and all(ev.knows(1) and ev.knows(2) for ev in entries)
        args = ExtenderArgs.decode(filter_args(mig_pod("asr"), [*NAMES, "m"]))
        first = prioritize(args, cache, memo, scorer(1), NoPlan())
        for gen in (2, 1, 2):  # both generations answer from the memo, no re-scoring
            assert prioritize(args, cache, memo, ScorerRef(refs[0].scorer, gen), NoPlan()) \
                == first
        assert all(ev.knows(1) and ev.knows(2) for ev in entries)
    finally:
        warmer.stop()


def test_a_failing_warming_pass_backs_off_instead_of_restarting_at_every_event() -> None:
    # A failed pass stops the warm child; the loop ran again at the next cache event
    # (settle 1 ms), so a failure that repeats started a fresh child per event.
    cache = make_cache(whole_nodes())
    warmer = Warmer(cache, Memo(), lambda: scorer(), interval_s=0.1)
    calls: list[float] = []
    fail = threading.Event()
    fail.set()

    def sweep() -> int:
        calls.append(time.monotonic())
        if fail.is_set():
            raise RuntimeError("warm child failed: the same error each time")
        return 0

    warmer.sweep = sweep  # type: ignore[method-assign]
    warmer.start()
    try:
        end = time.monotonic() + 1.0
        i = 0
        while time.monotonic() < end:  # a busy cluster: cache events all the time
            cache.upsert_pod(whole_pod(f"p{i % 3}", 1, node="w0"))
            i += 1
            time.sleep(0.002)
        # Pauses of 0.1, 0.2, 0.4, 0.8 s: at most 5 passes in the second.
        assert 2 <= len(calls) <= 5, len(calls)
        assert warmer.failures == len(calls)
        fail.clear()
        warmer.failures = 1  # the next pass comes within 0.1 s and succeeds
        deadline = time.monotonic() + 3.0
        while warmer.failures and time.monotonic() < deadline:
            cache.upsert_pod(whole_pod("p9", 1, node="w1"))
            time.sleep(0.01)
        assert warmer.failures == 0
    finally:
        warmer.stop()


def test_warming_retry_delays_double_up_to_the_cap() -> None:
    warmer = Warmer(make_cache(whole_nodes()), Memo(), lambda: scorer(), interval_s=1.0)
    delays = []
    for n in (0, 1, 2, 3, 7, 8, 30, 2000):  # (2.0 ** 1999 would overflow)
        warmer.failures = n
        delays.append(warmer.retry_delay_s())
    assert delays == [0.0, 1.0, 2.0, 4.0, 60.0, 60.0, 60.0, 60.0]
