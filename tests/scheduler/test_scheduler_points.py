"""scheduler.extender.points: the extension points called directly, typed arguments in and typed
results out, no HTTP (the HTTP contract is pinned by test_scheduler_http*.py)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter
from sched_builders import FakeClock, filter_args, make_cache, node, whole_pod
from test_groups_builders import lws_pod

from kube.source import BindError
from scheduler.extender.cycle import VerbError
from scheduler.extender.points import BindClaim, ExtensionPoints
from scheduler.extender.refusals import RecentRefusals
from scheduler.extender.request_pods import RequestPods
from scheduler.extender.view_lag import ViewLag
from scheduler.extender.wire import (
    BindingArgs,
    BindingResult,
    ExtenderArgs,
    FilterResult,
    PreemptionArgs,
)
from scheduler.groups.loop import ReservationBook
from scheduler.groups.plugin import GroupVerbs
from scheduler.memo.decide import Memo
from scheduler.memo.loop import Warmer
from scheduler.planner.loop import Planner


class Binder:
    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.calls: list[tuple[str, str, str]] = []

    def bind(self, namespace: str, name: str, uid: str, node_name: str, annotations: Any,
             pod: Any = None) -> None:
        self.calls.append((f"{namespace}/{name}", node_name, annotations["gpupack.io/gpus"]))
        if self.refuse:
            raise BindError("the API refused the Binding")


def points(pods: list[dict[str, Any]], binder: Any = None, gpus: int = 2,
           unschedulable: bool = False, refusals: RecentRefusals | None = None,
           clock: FakeClock | None = None) -> ExtensionPoints:
    """Extension points over one node ``n1`` of ``gpus`` whole GPUs and ``pods``."""
    cache = make_cache([node("n1", gpus=gpus, reconfigurable=False,
                             unschedulable=unschedulable)], pods)
    planner = Planner(cache, in_process=True)
    memo = Memo()
    book = ReservationBook(cache, scorer=lambda: planner.scorer.scorer, records_listed=True)
    binds = Counter("binds", "bind outcomes", ["result"], registry=CollectorRegistry())
    lag = ViewLag(clock=clock or FakeClock())
    return ExtensionPoints(cache, planner, binder, (GroupVerbs(book, lag),), memo,
                           Warmer(cache, memo, lambda: planner.scorer), RequestPods(), binds,
                           "gpupack", 0, lag, refusals)


def bind_args(name: str, node_name: str = "n1") -> BindingArgs:
    return BindingArgs.decode({"PodName": name, "PodNamespace": "x", "PodUID": f"uid-{name}",
                               "Node": node_name})


def count(p: ExtensionPoints, result: str) -> float:
    for metric in p.binds.collect():
        for sample in metric.samples:
            if sample.name == "binds_total" and sample.labels == {"result": result}:
                return float(sample.value)
    return 0.0


def test_filter_answers_a_typed_result_and_keeps_an_unlisted_pod_for_its_bind() -> None:
    binder = Binder()
    p = points([], binder)
    pod = whole_pod("a", 1, namespace="x", uid="uid-a")
    result = p.filter(ExtenderArgs.decode(filter_args(pod, ["n1", "ghost"])))
    assert isinstance(result, FilterResult)
    assert result.node_names == ("n1",) and set(result.failed) == {"ghost"}
    assert p.bind(bind_args("a")) == BindingResult()  # known from the filter request only
    assert binder.calls == [("x/a", "n1", "0")] and count(p, "ok") == 1


def test_a_refused_binding_frees_the_claim_and_keeps_the_request_pod() -> None:
    binder = Binder(refuse=True)
    p = points([], binder)
    pod = whole_pod("a", 2, namespace="x", uid="uid-a")
    p.prioritize(ExtenderArgs.decode(filter_args(pod, ["n1"])))
    claim = p.claim(bind_args("a"))
    assert isinstance(claim, BindClaim) and claim.choice.gpus == (0, 1)
    assert p.cache.is_assumed("x/a")
    assert p.write(bind_args("a"), claim) == BindingResult("the API refused the Binding")
    assert not p.cache.is_assumed("x/a") and count(p, "api_error") == 1
    binder.refuse = False
    assert p.bind(bind_args("a")) == BindingResult()  # both GPUs free again, pod kept


def test_bind_refusals_are_results_and_an_unknown_node_is_bad_input() -> None:
    p = points([whole_pod("b", 2, namespace="x", uid="uid-b")], Binder())
    assert p.bind(bind_args("nobody")) == BindingResult(
        "pod x/nobody is not in gpupack's cache and no filter request showed it")
    assert p.bind(bind_args("b")) == BindingResult()
    again = p.bind(bind_args("b"))  # its GPUs are assumed taken by the first bind
    assert again.error == "pod x/b does not fit n1 now: 0 whole GPU(s) free, 2 needed"
    assert count(p, "conflict") == 2
    with pytest.raises(VerbError, match="unknown node 'elsewhere'"):
        p.claim(bind_args("b", "elsewhere"))


def test_preempt_reads_the_pod_first() -> None:
    p = points([], Binder())
    with pytest.raises(VerbError):
        p.preempt(PreemptionArgs.decode({"Pod": {"metadata": {"name": "p"}, "spec": 1},
                                          "NodeNameToVictims": {}}))


# ---- one cycle per request: the pod read once -------------------------------------------------


def counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every read of a request's pod into a PodRequest (the one read path, cycle.read_pod),
    by pod name."""
    import scheduler.extender.cycle as cycle_module

    read: list[str] = []
    real = cycle_module.pod_request

    def counted(pod: Any, strict: bool = True) -> Any:
        read.append(pod["metadata"]["name"])
        return real(pod, strict)

    monkeypatch.setattr(cycle_module, "pod_request", counted)
    return read


CYCLE_PODS = [
    ("a pod of no group, no list has shown it", whole_pod("lone", 1, namespace="x"), False),
    ("a group member, no list has shown it", lws_pod("g", 0, 2, 1), False),
    ("a group member the cache lists", lws_pod("h", 0, 2, 1), True),
    ("a pod the cache lists", whole_pod("listed", 1, namespace="x"), True),
]


@pytest.mark.parametrize(("case", "obj", "listed"), CYCLE_PODS,
                         ids=[c[0] for c in CYCLE_PODS])
def test_each_point_reads_the_requests_pod_once(
        monkeypatch: pytest.MonkeyPatch, case: str, obj: dict[str, Any], listed: bool) -> None:
    p = points([obj] if listed else [])
    read = counting_reads(monkeypatch)
    name = obj["metadata"]["name"]
    p.filter(ExtenderArgs.decode(filter_args(obj, ["n1"])))
    assert read == [name], case  # remembered, asked of the groups, filtered: one read
    read.clear()
    p.prioritize(ExtenderArgs.decode(filter_args(obj, ["n1"])))
    assert read == [name], case
    read.clear()
    p.preempt(PreemptionArgs.decode({"Pod": obj, "NodeNameToMetaVictims": {}}))
    assert read == [name], case


def test_a_participant_answers_before_the_default_verb_and_sees_the_same_cycle() -> None:
    from scheduler.extender.cycle import Cycle

    seen: list[Cycle] = []

    class Claims:
        """A participant that claims the pod named 'mine' and reads the shared cycle."""

        def filter(self, args: ExtenderArgs, cycle: Cycle | None = None) -> Any:
            assert cycle is not None
            seen.append(cycle)
            if cycle.req.key.endswith("/mine"):
                return FilterResult(node_names=(), failed={"n1": "mine, refused"})
            return None

        def prioritize(self, args: ExtenderArgs, cycle: Cycle | None = None) -> Any:
            return None

        def preempt(self, args: PreemptionArgs, cycle: Cycle | None = None) -> Any:
            return None

        def reserve(self, pod: Any, uid: str, node: str) -> Any:
            return None

        def unreserve(self, key: str) -> None:
            pass

    base = points([])
    p = dataclasses.replace(base, participants=(Claims(), *base.participants))
    got = p.filter(ExtenderArgs.decode(filter_args(whole_pod("mine", 1, namespace="x"),
                                                ["n1"])))
    assert got.failed == {"n1": "mine, refused"} and got.node_names == ()
    other = p.filter(ExtenderArgs.decode(filter_args(whole_pod("other", 1, namespace="x"),
                                                  ["n1"])))
    assert other.node_names == ("n1",)  # not claimed: the default verb answered
    assert [c.key for c in seen] == ["x/mine", "x/other"]


class LateBinder(Binder):
    """A Binding that gets no answer in time (the API server may still apply it)."""

    def bind(self, namespace: str, name: str, uid: str, node_name: str, annotations: Any,
             pod: Any = None) -> None:
        from kube.source import BindUnknown

        super().bind(namespace, name, uid, node_name, annotations, pod)
        raise BindUnknown(f"binding {namespace}/{name} to {node_name}: no answer within 2s")


def test_a_bind_without_an_answer_keeps_its_gpus_until_the_watch_tells() -> None:
    """Issue 35 item 5: bind's API timeout was longer than kube-scheduler's extender
    timeout and a bind applied late was forgotten, its GPUs free for the next pod. The
    bind answers kube-scheduler with an error but keeps the GPUs assumed: confirmed when
    the watch shows the pod bound, freed only once no Binding can still be applied."""
    pods = [whole_pod("a", 2, namespace="x", uid="uid-a"),
            whole_pod("b", 2, namespace="x", uid="uid-b")]
    p = dataclasses.replace(points(pods, LateBinder()), unknown_hold_s=3600.0)
    result = p.bind(bind_args("a"))
    assert "no answer within 2s" in (result.error or "")
    assert p.cache.is_assumed("x/a") and count(p, "unknown") == 1
    # Another pod is not given the GPUs the late Binding may hold.
    assert "0 whole GPU(s) free" in (p.bind(bind_args("b")).error or "")
    # Applied after all: the watch shows it bound, the assumption is confirmed.
    bound = whole_pod("a", 2, namespace="x", uid="uid-a", node="n1")
    bound["metadata"]["annotations"] = {"gpupack.io/node": "n1", "gpupack.io/gpus": "0,1"}
    p.cache.upsert_pod(bound)
    assert not p.cache.is_assumed("x/a") and p.cache.counted("x/a") is not None
    claim = BindClaim(p.cache.counted("x/a")[0], "uid-a",  # type: ignore[index]
                      p.cache.counted("x/a")[1], None)  # type: ignore[index]
    p.end_unknown(claim)  # the hold's end finds nothing to free
    assert p.cache.counted("x/a") is not None


def test_a_bind_never_applied_frees_its_gpus_after_the_hold() -> None:
    p = dataclasses.replace(points([whole_pod("a", 2, namespace="x", uid="uid-a")],
                                   LateBinder()), unknown_hold_s=0.05)
    claim = p.claim(bind_args("a"))
    assert isinstance(claim, BindClaim)
    p.write(bind_args("a"), claim)
    assert p.cache.is_assumed("x/a")
    deadline = time.monotonic() + 5
    while p.cache.is_assumed("x/a") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not p.cache.is_assumed("x/a")  # no watch event came: the GPUs are free again
    assert p.cache.pending_pod("x/a") is not None
