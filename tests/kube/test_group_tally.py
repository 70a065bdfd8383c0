"""kube/grouped.py's GroupTally against a plain dict (Hypothesis), and the cache's
``group_requests`` against the pass it replaces in the reservation book (every counted
entry and pending pod filtered for a group, in the snapshot's order), on a stateful
cache with group members and other pods bound, assumed, forgotten, deleted, relisted."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from sched_builders import make_cache, node, pod

from kube.grouped import GroupTally

OPS = st.lists(st.tuples(st.sampled_from(["set", "del", "pop", "pop_default", "clear"]),
                         st.integers(0, 5), st.integers(0, 9)), max_size=60)


@given(OPS)
def test_the_tally_counts_what_a_recount_counts(ops: list[tuple[str, int, int]]) -> None:
    t: GroupTally[int, int] = GroupTally(lambda v: v % 3 == 0)
    model: dict[int, int] = {}
    for op, k, v in ops:
        if op == "set":
            t[k] = v
            model[k] = v
        elif op == "del":
            if k in model:
                del t[k]
                del model[k]
            else:
                with pytest.raises(KeyError):
                    del t[k]
        elif op == "pop":
            if k in model:
                assert t.pop(k) == model.pop(k)
            else:
                with pytest.raises(KeyError):
                    t.pop(k)
        elif op == "pop_default":
            assert t.pop(k, None) == model.pop(k, None)
        else:
            t.clear()
            model.clear()
        assert dict(t) == model
        assert list(t) == list(model)  # insertion order kept, as a dict's
        assert t.grouped_count == sum(1 for x in model.values() if x % 3 == 0)


@pytest.mark.parametrize("call", [
    lambda t: t.update({1: 3}), lambda t: t.setdefault(1, 3), lambda t: t.popitem(),
])
def test_changes_that_would_bypass_the_tally_are_refused(call: Any) -> None:
    t: GroupTally[int, int] = GroupTally(lambda v: True)
    t[0] = 0
    with pytest.raises(TypeError):
        call(t)
    assert t.grouped_count == 1


PODS = 6


def _pod(i: int, bound_to: str | None = None) -> dict[str, Any]:
    """Pods 0-3 in group g (one GPU each), 4-5 alone."""
    ann = {"gpupack.io/group": "g", "gpupack.io/group-size": "4"} if i < 4 else None
    return pod(f"p{i}", {"nvidia.com/gpu": "1"}, annotations=ann, node=bound_to)


class GroupRequestsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache = make_cache([node("w", gpus=8, reconfigurable=False)], [])
        self.exists: set[int] = set()

    @rule(i=st.integers(0, PODS - 1))
    def create(self, i: int) -> None:
        self.cache.upsert_pod(_pod(i))
        self.exists.add(i)

    @rule(i=st.integers(0, PODS - 1))
    def assume(self, i: int) -> None:
        req = self.cache.pending_pod(f"default/p{i}")
        if req is None or self.cache.is_assumed(req.key):
            return
        options = self.cache.state.options(req, "w")
        if options:
            self.cache.assume(req, req.uid, options[0])

    @rule(i=st.integers(0, PODS - 1))
    def forget(self, i: int) -> None:
        self.cache.forget(f"default/p{i}")

    @rule(i=st.integers(0, PODS - 1))
    def watch_binds(self, i: int) -> None:
        if i in self.exists:
            self.cache.upsert_pod(_pod(i, "w"))

    @rule(i=st.integers(0, PODS - 1))
    def delete(self, i: int) -> None:
        self.cache.delete_pod(f"default/p{i}")
        self.exists.discard(i)

    @precondition(lambda self: bool(self.exists))
    @rule()
    def relist(self) -> None:
        self.cache.replace(None, [_pod(i) for i in sorted(self.exists)])

    @invariant()
    def group_requests_is_the_filtered_pass(self) -> None:
        counted, pending = self.cache.group_requests()
        assert counted == [(r, p) for r, p in self.cache.snapshot().running
                           if r.group is not None]
        assert pending == [p for p in self.cache.pending() if p.group is not None]


GroupRequestsMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30,
                                                  deadline=None)
TestGroupRequestsMachine = GroupRequestsMachine.TestCase
