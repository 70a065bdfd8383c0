"""The background planner (scheduler/planner/loop.py) on the cases a review found:

* a lasting fault: the failure backoff overflowed after 1,025 failures in a row, in the
  thread's exception handler, and the planner thread ended for good;
* two shapes of a batch on one class of equal nodes were counted on the same nodes, so
  the job held too few of them for the batch;
* a few high-priority pods that fit no node filled every bounded batch, and the pods
  behind them were never planned;
* the rank memo kept every pod shape ever planned for as long as its node states lived;
* a pod no candidate fits was "unschedulable: no nodes" in a plan over candidates;
* stop() could leave a solver child running, started by a thread still taking its
  snapshot, and the thread solved again after waits that stop() had ended."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from sched_builders import make_cache, node, whole_pod

from packing.cpsat import SolverParams
from scheduler.planner.decide import pick_candidates
from scheduler.planner.loop import Planner
from scheduler.planner.solve import SolveJob, SolveOutcome, solve

FAST = SolverParams(max_time_s=0.2, workers=1)


# ---- a lasting fault ---------------------------------------------------------------------


class _NoWaitStop(threading.Event):
    """The stop event, its timed waits over at once (1,025 failures at 60 s each are ~17
    hours of a lasting fault in production)."""

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            return super().wait()
        return self.is_set()


def test_the_thread_survives_a_long_run_of_failures() -> None:
    cache = make_cache([node("w", gpus=8, reconfigurable=False)], [])
    planner = Planner(cache, "gpupack-greedy", debounce_s=0.0, min_interval_s=0.0,
                      in_process=True)
    calls = 0

    def boom() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("a lasting fault")

    planner.solve_once = boom  # type: ignore[assignment, method-assign]
    planner.loop._stop = _NoWaitStop()
    logger = logging.getLogger("gpupack.scheduler.planner")
    logger.disabled = True
    try:
        planner.start()
        planner.loop.wake()
        assert planner.loop._thread is not None
        deadline = time.monotonic() + 30
        while calls < 1100 and planner.loop._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        alive = planner.loop._thread.is_alive()
    finally:
        planner.stop(1)
        logger.disabled = False
    assert alive and calls >= 1100, (alive, calls)
    assert planner.plan.status == "error" and planner.plan.error == "a lasting fault"


def test_the_backoff_is_1_2_4_up_to_60_seconds_for_ever() -> None:
    from scheduler.planner.decide import backoff_s

    assert [backoff_s(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff_s(1025) == backoff_s(10**9) == 60


# ---- two shapes on one class of equal nodes ----------------------------------------------


def _two_shapes() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    # 20 equal idle 8-GPU nodes; 8 pods of 8 GPUs asking 1 CPU and 8 asking 2 CPUs: each
    # node takes one pod, so the batch needs 16 nodes, within max_nodes (64).
    nodes = [node(f"n{i:02d}", gpus=8, reconfigurable=False) for i in range(20)]
    pods = ([whole_pod(f"a{i}", 8, cpu="1") for i in range(8)]
            + [whole_pod(f"b{i}", 8, cpu="2") for i in range(8)])
    return nodes, pods


def test_two_shapes_on_one_class_get_nodes_for_both() -> None:
    nodes, pods = _two_shapes()
    cache = make_cache(nodes, pods)
    planner = Planner(cache, "gpupack", FAST, in_process=True)
    plan = planner.solve_once()
    assert planner.last_job_nodes == 16
    assert len(plan.placements) == 16, (len(plan.placements), plan.status)
    everything = Planner(make_cache(nodes, pods), "gpupack", FAST, in_process=True,
                         per_class=0)
    assert len(everything.solve_once().placements) == 16


def test_pick_candidates_counts_a_node_for_one_shape_only() -> None:
    nodes, pods = _two_shapes()
    cache = make_cache(nodes, pods)
    state = cache.state
    picked, placeable = pick_candidates(
        lambda m: state.nodes[m].info.labels, cache.signatures(), cache.snapshot().pending,
        per_class=16, max_nodes=64,
        rank=lambda p, _sid, n: ((0,), 1) if state.options(p, n, dedupe=True) else None)
    assert len(picked) == len(set(picked)) == 16
    assert len(placeable) == 16


# ---- pods that fit no node keep the batch ------------------------------------------------


def test_unplaceable_high_priority_pods_do_not_keep_placeable_ones_out() -> None:
    # Two pods asking 16 GPUs (no node has that many) at priority 10 filled max_batch=2
    # for ever: the low-priority pod that fits was never planned.
    pods = [whole_pod(f"huge{i}", 16, priority=10) for i in range(2)] + [whole_pod("small", 1)]
    cache = make_cache([node("w", gpus=8, reconfigurable=False)], pods)
    planner = Planner(cache, "gpupack", FAST, max_batch=2, in_process=True)
    first = planner.solve_once()
    assert set(first.unschedulable) == {"default/huge0", "default/huge1"}
    for _ in range(3):
        plan = planner.solve_once()
        assert "default/small" in plan.placements, (dict(plan.placements),
                                                    dict(plan.unschedulable))
        # where room is left, a pod that did not fit is planned (and reported) again
        assert "default/huge0" in plan.unschedulable


def test_a_demoted_pod_is_planned_again_in_its_turn_once_it_fits() -> None:
    pods = [whole_pod("big", 8, priority=10), whole_pod("x", 1), whole_pod("y", 1),
            whole_pod("hold", 2, node="w")]
    cache = make_cache([node("w", gpus=8, reconfigurable=False)], pods)
    planner = Planner(cache, "gpupack-greedy", max_batch=2, in_process=True)
    plan = planner.solve_once()  # big does not fit beside hold
    assert "default/big" in plan.unschedulable
    plan = planner.solve_once()  # then it goes last: x and y are planned
    assert set(plan.placements) == {"default/x", "default/y"}
    cache.delete_pod("default/hold")
    cache.delete_pod("default/y")
    plan = planner.solve_once()  # room left in the batch: big is planned, and fits now
    assert "default/big" in plan.placements and "default/big" not in planner._unplaced


# ---- the rank memo is bounded --------------------------------------------------------------


def test_the_rank_memo_keeps_no_shape_no_pod_has_any_more() -> None:
    # A steady workload (20 running 1-GPU pods) and one-off pending pods of new CPU
    # sizes, each deleted after its plan: no node changes state and the scorer stays;
    # every one-off shape stayed memoized.
    running = [whole_pod(f"r{i}", 1, node=f"busy{i % 4}") for i in range(20)]
    nodes = ([node(f"busy{i}", gpus=8, reconfigurable=False) for i in range(4)]
             + [node(f"idle{i}", gpus=8, reconfigurable=False) for i in range(4)])
    cache = make_cache(nodes, running)
    planner = Planner(cache, "gpupack-greedy", FAST, in_process=True)
    planner.solve_once()
    gen = planner.scorer.gen
    sizes = []
    for i in range(12):
        cache.upsert_pod(whole_pod(f"once{i}", 1, cpu=f"{1000 + i}m"))
        planner.solve_once()
        cache.delete_pod(f"default/once{i}")
        planner.solve_once()
        sizes.append(len(planner._rank_memo))
    assert planner.scorer.gen == gen
    assert sizes == [sizes[0]] * len(sizes) and sizes[0] <= 2, sizes  # 1 shape x 2 states


# ---- the reason of a pod no candidate fits -------------------------------------------------


def _capped_and_full(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
                     ) -> tuple[dict[str, str], dict[str, str]]:
    cache = make_cache(nodes, pods)
    capped = Planner(cache, "gpupack", FAST, in_process=True).solve_once()
    full = Planner(cache, "gpupack", FAST, in_process=True, per_class=0).solve_once()
    return dict(capped.unschedulable), dict(full.unschedulable)


def test_a_capped_plans_reason_is_the_whole_clusters() -> None:
    capped, full = _capped_and_full([node("w", gpus=8, reconfigurable=False)],
                                    [whole_pod("huge", 16)])
    assert capped == full
    assert full["default/huge"] == "1 node(s): node has 8 usable GPU(s), pod needs 16"


def test_a_capped_plans_reason_counts_selectors_cordons_and_full_nodes() -> None:
    # Zone a: three idle nodes; zone b: two full ones and a cordoned one. A 2-GPU pod for
    # zone b and a 2-GPU pod for zone c; and 16-GPU pods, that never fit, with a selector.
    nodes = [node(f"a{i}", gpus=8, reconfigurable=False, labels={"zone": "a"})
             for i in range(3)]
    nodes += [node(f"b{i}", gpus=8, reconfigurable=False, labels={"zone": "b"})
              for i in range(2)]
    nodes.append(node("bc", gpus=8, reconfigurable=False, labels={"zone": "b"},
                      unschedulable=True))
    pods = [whole_pod(f"full{i}", 8, node=f"b{i}") for i in range(2)]
    for name, count, zone in (("zb", 2, "b"), ("zc", 2, "c"), ("hb", 16, "b")):
        p = whole_pod(name, count)
        p["spec"]["nodeSelector"] = {"zone": zone}
        pods.append(p)
    capped, full = _capped_and_full(nodes, pods)
    assert capped == full
    assert set(full) == {"default/zb", "default/zc", "default/hb"}
    assert full["default/zb"] == ("3 node(s): node selector zone=b does not match; "
                                  "2 node(s): 0 whole GPU(s) free, 2 needed")
    assert full["default/zc"] == ("5 node(s): node selector zone=c does not match; "
                                  "1 node(s): node is cordoned")
    assert full["default/hb"] == "6 node(s): node has 8 usable GPU(s), pod needs 16"


# ---- stop() ---------------------------------------------------------------------------------


class _FakeChild:
    pid = 1

    def solve(self, job: SolveJob, timeout_s: float) -> SolveOutcome:
        return solve(job)

    def shutdown(self) -> None:
        pass


def test_no_solver_child_is_started_after_stop() -> None:
    # stop() joins the thread for `timeout` and then stops the solver; a thread still
    # taking its snapshot (make_job) then started a fresh child, which nobody stopped.
    cache = make_cache([node("w", gpus=8, reconfigurable=False)], [whole_pod("a", 1)])
    planner = Planner(cache, "gpupack", FAST, debounce_s=0.0, min_interval_s=0.0)
    entered, release = threading.Event(), threading.Event()
    real_make_job = planner.make_job

    def slow_make_job() -> Any:
        entered.set()
        release.wait(10)
        return real_make_job()

    started_after_stop = []

    def child() -> Any:
        if planner.loop.stopped:
            started_after_stop.append(True)
        if planner._solver is None:
            planner._solver = _FakeChild()  # type: ignore[assignment]
        return planner._solver

    planner.make_job = slow_make_job  # type: ignore[method-assign]
    planner._child = child  # type: ignore[method-assign]
    planner.start()
    planner.loop.wake()
    assert entered.wait(10)
    planner.stop(timeout=0.1)
    release.set()
    assert planner.loop._thread is not None
    planner.loop._thread.join(10)
    assert not planner.loop._thread.is_alive()
    assert not started_after_stop
    assert planner._solver is None


def test_after_stop_the_planner_starts_no_child_and_stops_its_own() -> None:
    from scheduler.planner.solve import SolverError

    cache = make_cache([node("w", gpus=8, reconfigurable=False)], [whole_pod("a", 1)])
    planner = Planner(cache, "gpupack", FAST)
    stopped = []
    planner._solver = _FakeChild()  # type: ignore[assignment]
    planner._solver.shutdown = lambda: stopped.append(True)  # type: ignore[union-attr]
    planner.stop()
    assert stopped == [True] and planner._solver is None
    with pytest.raises(SolverError, match="stopped"):
        planner._child()
    assert planner._solver is None
