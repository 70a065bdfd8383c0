"""The MIG actuator's handler (scheduler/mig/loop.py) on a real cache with a fake API:
leader only, holds taken before anything is written (and the start cancelled when a pod
got the GPU), holds kept until the new layout appears, failure gives the GPUs back and
backs off, a new leader follows the changes in flight, metrics."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sched_builders import FakeClock, make_cache, mig_pod, node

from kube.pod_conditions import SLICES_CREATED
from packing.cpsat import SolverParams
from packing.model import Placement, PodRequest, RequestKind
from scheduler.mig.changes import Backoff, backoff_from_json, changes_json
from scheduler.mig.decide import HOLD_PREFIX, MigSettings
from scheduler.mig.loop import MigActuator
from scheduler.mig.metrics import MigMetrics, SliceFigures

FAST = SolverParams(max_time_s=2.0, workers=1, seed=1)


class FakeApi:
    def __init__(self) -> None:
        self.config: dict[str, Any] = {"version": "v1", "mig-configs": {}}
        self.changes = ""
        self.labels: list[tuple[str, str]] = []
        self.notes: list[tuple[str, str]] = []
        self.events: list[tuple[str, str, bool]] = []
        self.fail_writes = False
        self.on_write: Callable[[], None] | None = None

    def read(self) -> tuple[dict[str, Any], str, str | None]:
        return json.loads(json.dumps(self.config)), self.changes, "1"

    def write(self, update: Callable[[dict[str, Any], str], tuple[dict[str, Any], str]]
              ) -> None:
        if self.on_write is not None:
            self.on_write()
        if self.fail_writes:
            raise RuntimeError("403 Forbidden")
        self.config, self.changes = update(*self.read()[:2])

    def label_node(self, node: str, config: str) -> None:
        self.labels.append((node, config))

    def note_node(self, node: str, text: str) -> None:
        self.notes.append((node, text))

    def event(self, node: str, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((node, reason, warning))


def setup(pods: int = 3, leader: bool = True, propagation: float = 0.0
          ) -> tuple[Any, FakeApi, MigActuator, FakeClock, CollectorRegistry]:
    """An actuator over one node; the label is set with the entry unless ``propagation``
    (test_the_label_follows_the_entry_once_it_can_have_reached_the_manager)."""
    cache = make_cache([node("a")], [mig_pod(f"asr-{i}") for i in range(pods)])
    api = FakeApi()
    clock = FakeClock()
    registry = CollectorRegistry()
    act = MigActuator(cache, api, is_leader=lambda: leader, clock=clock, params=FAST,
                      settings=MigSettings(backoff_s=60, settle_s=0,
                                           config_propagation_s=propagation),
                      metrics=MigMetrics(registry))
    return cache, api, act, clock, registry


def mig_holds(cache: Any) -> set[str]:
    return {k for k in cache.holds() if k.startswith(HOLD_PREFIX)}


def test_standby_does_nothing() -> None:
    cache, api, act, _, _ = setup(leader=False)
    assert act.step() is None
    assert api.labels == [] and mig_holds(cache) == set()


def test_start_holds_then_writes_entry_changes_and_label() -> None:
    cache, api, act, _, registry = setup()
    seen_holds: list[set[str]] = []
    api.on_write = lambda: seen_holds.append(mig_holds(cache))
    d = act.step()
    assert d is not None and len(d.starts) == 1
    (config,) = api.config["mig-configs"]
    assert api.labels == [("a", config)]
    # A whole GPU turned MIG: mig-parted's mode step touches every GPU of the node, so
    # every GPU is held before anything is written.
    assert d.starts[0].change.node_wide
    assert seen_holds and seen_holds[0] == {f"{HOLD_PREFIX}a/{i}" for i in range(8)}
    assert [c["node"] for c in json.loads(api.changes)] == ["a"]
    assert [r for _, r, _ in api.events] == ["MigReconfigureStarted"]
    assert registry.get_sample_value("gpupack_mig_reconfigurations_total",
                                     {"result": "started"}) == 1
    assert registry.get_sample_value("gpupack_mig_reconfigurations_in_flight") == 1
    # The held GPU is not whole-free for anyone else.
    held_gpu = d.starts[0].change.targets[0][0]
    assert not cache.state.gpu("a", held_gpu).idle


def test_the_label_follows_the_entry_once_it_can_have_reached_the_manager() -> None:
    cache, api, act, clock, _ = setup(propagation=90.0)
    d = act.step()
    assert d is not None and len(d.starts) == 1
    (config,) = api.config["mig-configs"]
    assert api.labels == []  # the MIG manager's copy of the ConfigMap lacks the entry yet
    (written,) = json.loads(api.changes)
    assert written["config"] == config and written["labelled_at"] is None
    held = mig_holds(cache)
    assert held  # the GPUs are held from the start
    clock.advance(60)
    act.step()
    assert api.labels == [] and mig_holds(cache) == held
    clock.advance(31)
    d = act.step()
    assert d is not None and [c.node for c in d.labels] == ["a"]
    assert api.labels == [("a", config)]
    (written,) = json.loads(api.changes)
    assert written["labelled_at"] == clock()
    assert [r for _, r, _ in api.events] == ["MigReconfigureStarted"]
    # Labelled once: the next steps judge the label, they do not write it again.
    clock.advance(2)
    act.step()
    assert api.labels == [("a", config)]


def test_pod_on_the_gpu_since_the_decision_cancels_the_start() -> None:
    cache, api, act, clock, _ = setup()
    state = act.gather(clock())
    from scheduler.mig.decide import decide_mig

    d = decide_mig(state, clock(), act.settings, FAST)
    gpu = d.starts[0].change.targets[0][0]
    # A bind takes the GPU between the decision and the writes.
    req = PodRequest("default/llm", kind=RequestKind.WHOLE, gpu_count=1, uid="u1")
    cache.assume(req, "u1", Placement("default/llm", "a", (gpu,)))
    act.changes = {}
    act.apply(d, clock())
    assert api.labels == [] and api.config["mig-configs"] == {}
    assert mig_holds(cache) == set()


def test_failure_gives_back_backs_off_and_warns() -> None:
    cache, api, act, clock, registry = setup()
    d = act.step()
    assert d is not None
    config = api.labels[0][1]
    cache.upsert_node(node("a", labels={"nvidia.com/mig.config": config,
                                        "nvidia.com/mig.config.state": "failed"}))
    clock.advance(5)
    d = act.step()
    assert d is not None and [f.result for f in d.finishes] == ["failed"]
    assert mig_holds(cache) == set()
    assert ("a", "MigReconfigureFailed", True) in api.events
    assert api.notes and api.notes[-1][1].startswith("failed ")
    assert act.backoff["a"].failures == 1
    # No change in flight; the back-off is kept beside the changes.
    assert json.loads(api.changes) == [{"backoff": {"node": "a", "failures": 1,
                                                    "until": act.backoff["a"].until}}]
    clock.advance(5)
    assert act.step() is not None and api.labels == [("a", config)]  # no second try yet
    assert registry.get_sample_value("gpupack_mig_reconfigurations_total",
                                     {"result": "failed"}) == 1
    # A new leader does not retry the node at once either: it reads the back-off back.
    act2 = MigActuator(cache, api, clock=clock, params=FAST,
                       settings=MigSettings(config_propagation_s=0, settle_s=0))
    d2 = act2.step()
    assert d2 is not None and d2.starts == () and act2.backoff["a"] == act.backoff["a"]
    clock.advance(120)
    d2 = act2.step()
    assert d2 is not None and [s.change.node for s in d2.starts] == ["a"]


class Queue:
    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []

    def submit(self, name: str, obj: Any) -> None:
        self.writes.append((name, obj))


def test_success_requeues_the_pods_waiting_for_the_new_slices_oldest_first() -> None:
    """kube-scheduler retried them on the new allocatable, maybe before the cache showed
    it, and parked them again: once the change is recognised they get a condition (an
    update, which requeues them), at most as many as slices were made."""
    cache = make_cache([node("a", gpus=1)], [mig_pod(f"asr-{i}") for i in range(9)]
                       + [mig_pod("tts", "2g.20gb")])
    clock, api, queue = FakeClock(), FakeApi(), Queue()
    act = MigActuator(cache, api, clock=clock, params=FAST, requeue=queue,
                      settings=MigSettings(config_propagation_s=0, settle_s=0, min_idle_s=0))
    d = act.step()
    assert d is not None and len(d.starts) == 1 and queue.writes == []
    ((_, target),) = d.starts[0].change.targets
    made = dict(target)
    assert made.get("1g.10gb", 0) >= 1
    config = api.labels[0][1]
    cache.upsert_node(node("a", gpus=1, mig=made, labels={
        "nvidia.com/mig.config": config, "nvidia.com/mig.config.state": "success"}))
    clock.advance(3)
    d = act.step()
    assert d is not None and [f.result for f in d.finishes] == ["success"]
    woken = [name for name, _ in queue.writes]
    expected = [f"default/asr-{i}" for i in range(min(9, made["1g.10gb"]))]
    if made.get("2g.20gb", 0):
        expected.append("default/tts")
    assert woken == expected and act.woken == len(expected)
    cond = queue.writes[0][1]["status"]["conditions"][0]
    assert cond["type"] == SLICES_CREATED and f"{config} on node a is done" in cond["message"]
    assert queue.writes[0][1]["metadata"] == {"namespace": "default", "name": "asr-0"}


def test_write_refused_gives_back_and_backs_off() -> None:
    cache, api, act, _, registry = setup()
    api.fail_writes = True
    act.step()
    assert mig_holds(cache) == set() and api.labels == []
    assert act.backoff["a"].failures == 1
    assert registry.get_sample_value("gpupack_mig_reconfigurations_total",
                                     {"result": "error"}) == 1


class ApiError(Exception):
    def __init__(self, status: int | None) -> None:
        super().__init__(f"status {status}")
        self.status = status


def test_the_next_step_before_the_watch_shows_our_label_keeps_the_change() -> None:
    # The fake API never puts the label into the cache: as a watch that lags.
    cache, api, act, clock, _ = setup()
    act.step()
    held = mig_holds(cache)
    clock.advance(1)
    d = act.step()
    assert d is not None and d.finishes == () and d.starts == ()
    assert mig_holds(cache) == held and len(api.labels) == 1


@pytest.mark.parametrize(("error", "in_flight"), [
    (TimeoutError("read timed out"), True),  # the label may be set: followed
    (ApiError(503), True),
    (ApiError(403), False),  # refused: nothing was set
    (ApiError(422), False),
])
def test_a_label_write_whose_outcome_is_unknown_is_followed(error: Exception,
                                                             in_flight: bool) -> None:
    cache, api, act, _, registry = setup()

    def label_node(node: str, config: str) -> None:
        raise error

    api.label_node = label_node  # type: ignore[method-assign]
    act.step()
    assert bool(act.changes) is in_flight and bool(mig_holds(cache)) is in_flight
    assert ("a" in act.backoff) is not in_flight
    assert (("a", "MigReconfigureNotStarted", True) in api.events) is not in_flight
    assert registry.get_sample_value("gpupack_mig_reconfigurations_total",
                                     {"result": "started" if in_flight else "error"}) == 1


def test_gpupacks_entries_are_kept_while_a_node_cannot_be_read() -> None:
    cache, api, act, _, _ = setup()
    api.config["mig-configs"]["gpupack-0123456789abcdef"] = [{"devices": "all",
                                                              "mig-enabled": False}]
    cache.upsert_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "odd"},
                       "status": {"allocatable": {"nvidia.com/gpu": "many"}}})
    assert cache.unreadable_nodes() == {"odd"}
    act.step()  # writes its own entry; the unknown one may be on odd's label
    assert "gpupack-0123456789abcdef" in api.config["mig-configs"]


def test_new_leader_follows_changes_in_flight_and_holds_their_gpus() -> None:
    _, api, act, clock, _ = setup()
    act.step()
    config = api.labels[0][1]
    assert act.changes and act.changes["a"].node_wide  # a mode change: all GPUs held
    # A fresh replica (same API) becomes the leader.
    cache2 = make_cache([node("a", labels={"nvidia.com/mig.config": config,
                                            "nvidia.com/mig.config.state": "pending"})],
                        [mig_pod(f"asr-{i}") for i in range(3)])
    act2 = MigActuator(cache2, api, clock=clock, params=FAST)
    d = act2.step()
    assert d is not None and d.starts == () and d.finishes == ()
    assert mig_holds(cache2) == {f"{HOLD_PREFIX}a/{i}" for i in range(8)}
    assert api.changes == changes_json(act.changes or {})


def test_slice_figures_from_the_cache_without_an_actuator() -> None:
    cache = make_cache([node("m", mig={"1g.10gb": 7}, gpus=1)],
                       [mig_pod(f"asr-{i}") for i in range(9)])
    figures = SliceFigures(cache, lambda: None)
    free, waiting = figures.figures()
    assert sum(free.values()) == 7 and sum(waiting.values()) == 2
    registry = CollectorRegistry()
    MigMetrics(registry, figures)
    assert registry.get_sample_value("gpupack_mig_slices",
                                     {"profile": "1g.10gb", "state": "waiting"}) == 2


def test_the_reservation_book_leaves_mig_holds_alone_and_does_not_count_them() -> None:
    from scheduler.groups.loop import ReservationBook

    cache, _, act, _, _ = setup()
    act.step()
    held = mig_holds(cache)
    assert held
    book = ReservationBook(cache, records_listed=True)
    assert book.check_ready()
    book.step(force=True)
    assert mig_holds(cache) == held
    assert book.figures()[1] == 0  # gpupack_group_reserved_gpus counts groups' rooms only


def test_a_mig_gpu_being_relaid_keeps_its_instances_held_across_steps() -> None:
    # An idle MIG GPU (two free 3g slices) re-laid for waiting 1g pods: its free instances
    # are held at the start and stay held on every later step until the new layout
    # appears (they must not turn free for pods while the MIG manager works).
    cache = make_cache([node("a", gpus=1, mig={"3g.40gb": 2})],
                       [mig_pod(f"asr-{i}") for i in range(3)])
    clock = FakeClock()
    api = FakeApi()
    act = MigActuator(cache, api, clock=clock, params=FAST,
                      settings=MigSettings(config_propagation_s=0, settle_s=0, min_idle_s=0))
    d = act.step()
    assert d is not None and [s.change.node for s in d.starts] == ["a"]
    # The informer brings the label back; the MIG manager has not reported yet.
    cache.upsert_node(node("a", gpus=1, mig={"3g.40gb": 2},
                           labels={"nvidia.com/mig.config": api.labels[0][1]}))
    held = mig_holds(cache)
    assert len(held) == 2 and all(k.startswith(f"{HOLD_PREFIX}a/0/") for k in held)
    for _ in range(3):
        clock.advance(2)
        assert act.step() is not None
        assert mig_holds(cache) == held
        assert not cache.state.gpu("a", 0).idle



def test_the_forecast_counts_the_pods_no_free_slice_served() -> None:
    # The forecast shapes the layouts of GPUs that change: it must count demand for new
    # slices (pods that found none), not every arrival, and not depend on whether a
    # step happened to run before kube-scheduler bound a pod a free slice served.
    cache = make_cache([node("a", gpus=2, mig={"1g.10gb": 7})])
    clock = FakeClock()
    act = MigActuator(cache, FakeApi(), clock=clock, params=FAST,
                      settings=MigSettings(config_propagation_s=0, settle_s=0))
    cache.upsert_pod(mig_pod("asr"))  # a free 1g slice serves it
    cache.upsert_pod(mig_pod("tts", "2g.20gb"))  # no 2g slice anywhere
    state = act.gather(clock())
    assert [(p, t) for t, p, _ in state.arrivals] == [("2g.20gb", 1000.0)]
    clock.advance(1)
    cache.upsert_pod(mig_pod("asr", node="a"))
    assert act.gather(clock()).arrivals == state.arrivals  # counted once, when first unmet
    assert act.first_seen["default/tts", "uid-default-tts"] == 1000.0  # for the settle rule
    # Eight more 1g pods: the six free slices left serve six, two are unmet.
    for i in range(8):
        cache.upsert_pod(mig_pod(f"asr-{i}"))
    clock.advance(1)
    got = [(p, t) for t, p, _ in act.gather(clock()).arrivals]
    assert got == [("2g.20gb", 1000.0), ("1g.10gb", 1002.0), ("1g.10gb", 1002.0)]


def test_nothing_is_done_before_the_reservation_book_is_rebuilt() -> None:
    # Until the book has re-taken its holds, a reserved room's whole GPUs look idle:
    # a change (or a drain) could convert the GPUs an LLM group is waiting for.
    cache = make_cache([node("a")], [mig_pod(f"asr-{i}") for i in range(3)])
    api = FakeApi()
    ready = [False]
    act = MigActuator(cache, api, clock=FakeClock(), params=FAST,
                      settings=MigSettings(config_propagation_s=0, settle_s=0),
                      ready=lambda: ready[0])
    assert act.step() is None
    assert api.labels == [] and mig_holds(cache) == set()
    ready[0] = True
    d = act.step()
    assert d is not None and len(d.starts) == 1 and len(api.labels) == 1


def test_another_writers_backoff_is_kept_and_a_cleared_one_stays_cleared() -> None:
    # A replica that led for a moment saw a change on b fail and backed b off in the
    # ConfigMap; the leader's next write replaced the list with its own back-offs, and
    # b was retried at once.
    _, api, act, clock, _ = setup(pods=0)
    assert act.step() is not None  # leading: the changes (none) read back
    api.changes = changes_json({}, {"b": Backoff(clock() + 500, 2)})
    act.backoff["a"] = Backoff(clock() + 100, 1)
    act._write_changes()
    written, _ = backoff_from_json(api.changes)
    assert set(written) == {"a", "b"} and act.backoff["b"].failures == 2
    # a succeeds since: its back-off cleared here is not taken back from the old text.
    del act.backoff["a"]
    act._write_changes()
    assert set(backoff_from_json(api.changes)[0]) == {"b"}
    assert "a" not in act.backoff


def test_a_pod_whose_bind_failed_keeps_its_arrival_time() -> None:
    # Assumed (bind in flight, not pending), then forgotten (the bind failed): pending
    # again. A fresh arrival time would start the settle rule's clocks over.
    cache = make_cache([node("a", gpus=1, mig={"1g.10gb": 7})])
    clock = FakeClock()
    act = MigActuator(cache, FakeApi(), clock=clock, params=FAST,
                      settings=MigSettings(config_propagation_s=0))
    cache.upsert_pod(mig_pod("asr"))
    req = next(p for p in cache.pending() if p.key == "default/asr")
    assert [m.arrived for m in act.gather(clock()).mig_pods] == [1000.0]
    clock.advance(5)
    cache.assume(req, "uid-default-asr", Placement("default/asr", "a", (0,), "1g.10gb", 0))
    assert act.gather(clock()).mig_pods == ()
    clock.advance(5)
    cache.forget("default/asr")
    assert [m.arrived for m in act.gather(clock()).mig_pods] == [1000.0]
    clock.advance(4 * act.settings.half_life_s + 1)  # forgotten once long gone
    cache.delete_pod("default/asr")
    act.gather(clock())
    assert act.first_seen == {}


def test_a_foreign_backoff_is_kept_when_this_leaders_own_for_the_node_expired() -> None:
    _, api, act, clock, _ = setup(pods=0)
    assert act.step() is not None
    act.backoff["b"] = Backoff(clock() - 10, 1)  # this leader's, expired (still listed)
    api.changes = changes_json({}, {"b": Backoff(clock() + 500, 2)})
    act._write_changes()
    assert "b" in backoff_from_json(api.changes)[0] and act.backoff["b"].failures == 2


class _FailsAfterUpdate(FakeApi):
    """As kube.mig.api.MigApi.write: update() runs, then the replace may fail (5xx)."""

    fail_after_update = False

    def write(self, update: Callable[[dict[str, Any], str], tuple[dict[str, Any], str]]
              ) -> None:
        config, changes = update(*self.read()[:2])
        if self.fail_after_update:
            raise RuntimeError("500 Internal Server Error")
        self.config, self.changes = config, changes


def test_a_cleared_backoff_stays_cleared_after_a_failed_write() -> None:
    cache = make_cache([node("a")])
    clock = FakeClock()
    api = _FailsAfterUpdate()
    act = MigActuator(cache, api, clock=clock, params=FAST,
                      settings=MigSettings(config_propagation_s=0, backoff_s=60, settle_s=0))
    assert act.step() is not None
    act.backoff["a"] = Backoff(clock() + 100, 1)
    act._write_changes()
    del act.backoff["a"]  # a succeeded since
    api.fail_after_update = True
    act._write_changes()  # fails after update() ran: the ConfigMap keeps a's back-off
    api.fail_after_update = False
    act._write_changes()
    assert "a" not in act.backoff and "a" not in backoff_from_json(api.changes)[0]


def test_a_backoff_the_next_leader_cleared_is_not_taken_back_on_leading_again() -> None:
    cache = make_cache([node("a")])
    clock = FakeClock()
    api = FakeApi()
    leading = [True]
    act = MigActuator(cache, api, is_leader=lambda: leading[0], clock=clock, params=FAST,
                      settings=MigSettings(config_propagation_s=0, backoff_s=60, settle_s=0))
    assert act.step() is not None
    act.backoff["a"] = Backoff(clock() + 1000, 1)
    act._write_changes()
    leading[0] = False
    assert act.step() is None
    api.changes = changes_json({}, {})  # the next leader's change on a succeeded
    clock.advance(5)
    leading[0] = True
    act.step()
    assert "a" not in act._live_backoff() and "a" not in backoff_from_json(api.changes)[0]


def test_a_pod_recreated_under_its_name_is_another_arrival() -> None:
    # A StatefulSet's pod deleted and made again (a new UID) within the forecast's
    # horizon: counted once by name, the second arrival was lost, and it took the first
    # one's first-seen time.
    cache = make_cache([node("a", mig={"1g.10gb": 7})])
    clock = FakeClock()
    act = MigActuator(cache, FakeApi(), clock=clock, params=FAST,
                      settings=MigSettings(config_propagation_s=0, settle_s=0))
    cache.upsert_pod(mig_pod("db-0", "2g.20gb"))
    assert len(act.gather(clock()).arrivals) == 1
    cache.delete_pod("default/db-0")
    clock.advance(30)
    cache.upsert_pod(mig_pod("db-0", "2g.20gb", uid="second"))
    state = act.gather(clock())
    assert [t for t, _, _ in state.arrivals] == [1000.0, 1030.0]
    assert [m.arrived for m in state.mig_pods] == [1030.0]
