"""The scrape decision of serving.metrics_auth (401/403/503/200 from the Authorization
header and two review callables) and its cache, table-driven, with a stateful
Hypothesis model of the cache."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from serving.metrics_auth import (
    MAX_TOKEN_CHARS,
    ScrapeGuard,
    TtlCache,
    Verdict,
    bearer_token,
    check,
    token_key,
)


@dataclass(frozen=True)
class Who:
    username: str
    groups: tuple[str, ...] = ()


PROM = Who("system:serviceaccount:monitoring:prometheus", ("system:serviceaccounts",))
OTHER = Who("system:serviceaccount:default:nosy")


@dataclass
class Reviews:
    """Fake reviews: tokens -> identity, identities allowed; records every call.
    ``fail_authn`` / ``fail_authz`` make the review raise as an unreachable API server."""

    tokens: dict[str, Who] = field(default_factory=lambda: {"good": PROM, "other": OTHER})
    allowed: set[Who] = field(default_factory=lambda: {PROM})
    fail_authn: bool = False
    fail_authz: bool = False
    authn_calls: list[str] = field(default_factory=list)
    authz_calls: list[tuple[Who, str, str]] = field(default_factory=list)

    def authenticate(self, token: str) -> Who | None:
        self.authn_calls.append(token)
        if self.fail_authn:
            raise ConnectionError("connection refused")
        return self.tokens.get(token)

    def authorize(self, who: Who, path: str, verb: str) -> bool:
        self.authz_calls.append((who, path, verb))
        if self.fail_authz:
            raise TimeoutError("read timed out")
        return who in self.allowed and (path, verb) == ("/metrics", "get")


@pytest.mark.parametrize(("header", "token"), [
    (None, None),
    ("", None),
    ("Bearer", None),
    ("Bearer ", None),
    ("Basic dXNlcjpwdw==", None),
    ("Token good", None),
    ("Bearer good", "good"),
    ("bearer good", "good"),
    ("BEARER good", "good"),
    ("Bearer good trailing words", "good"),  # as the API server's authenticator reads it
    ("Bearer  good", None),  # two spaces: the token word is empty
    ("Bearer " + "x" * MAX_TOKEN_CHARS, "x" * MAX_TOKEN_CHARS),
    ("Bearer " + "x" * (MAX_TOKEN_CHARS + 1), None),
])
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize(("header", "setup", "status", "authn", "authz"), [
    # No token at all: refused without asking the API server anything.
    (None, {}, 401, [], []),
    ("Basic dXNlcjpwdw==", {}, 401, [], []),
    ("Bearer " + "x" * (MAX_TOKEN_CHARS + 1), {}, 401, [], []),
    # A token the API server does not authenticate: 401, no authorization asked.
    ("Bearer forged", {}, 401, ["forged"], []),
    # Authenticated, not allowed /metrics: 403.
    ("Bearer other", {}, 403, ["other"], [(OTHER, "/metrics", "get")]),
    # Authenticated and allowed.
    ("Bearer good", {}, 200, ["good"], [(PROM, "/metrics", "get")]),
    ("bearer good", {}, 200, ["good"], [(PROM, "/metrics", "get")]),
    # The API server cannot be asked: 503, never an allow, never a crash.
    ("Bearer good", {"fail_authn": True}, 503, ["good"], []),
    ("Bearer good", {"fail_authz": True}, 503, ["good"], [(PROM, "/metrics", "get")]),
])
def test_check(header: str | None, setup: dict[str, bool], status: int,
               authn: list[str], authz: list[tuple[Who, str, str]]) -> None:
    reviews = Reviews(**setup)  # type: ignore[arg-type]
    verdict = check(header, reviews.authenticate, reviews.authorize)
    assert verdict.status == status, verdict
    assert verdict.allowed is (status == 200)
    assert reviews.authn_calls == authn
    assert reviews.authz_calls == authz


def test_check_reasons_name_what_failed() -> None:
    reviews = Reviews()
    assert "Authorization: Bearer" in check(None, reviews.authenticate,
                                            reviews.authorize).reason
    denied = check("Bearer other", reviews.authenticate, reviews.authorize)
    assert denied == Verdict(403, 'forbidden: User "system:serviceaccount:default:nosy" '
                                  'cannot get path "/metrics"', OTHER.username)
    down = check("Bearer good", Reviews(fail_authn=True).authenticate, reviews.authorize)
    assert "TokenReview" in down.reason and "connection refused" in down.reason
    slow = check("Bearer good", reviews.authenticate, Reviews(fail_authz=True).authorize)
    assert "SubjectAccessReview" in slow.reason and slow.username == PROM.username


def test_check_other_path_and_verb() -> None:
    reviews = Reviews()
    verdict = check("Bearer good", reviews.authenticate, reviews.authorize,
                    path="/debug", verb="post")
    assert verdict.status == 403 and reviews.authz_calls == [(PROM, "/debug", "post")]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def constant(ttl: float) -> Callable[[object], float]:
    return lambda _value: ttl


@pytest.mark.parametrize(("steps", "expect"), [
    # (op, key, value-or-seconds); expect: the lookups' answers in order.
    ([("put", "a", 1), ("get", "a", None)], [(True, 1)]),
    ([("put", "a", 1), ("wait", "", 9.999), ("get", "a", None)], [(True, 1)]),
    ([("put", "a", 1), ("wait", "", 10), ("get", "a", None)], [(False, None)]),
    ([("get", "a", None)], [(False, None)]),
    # Storing again refreshes the value and the time.
    ([("put", "a", 1), ("wait", "", 8), ("put", "a", 2), ("wait", "", 8), ("get", "a", None)],
     [(True, 2)]),
    # Full (3 entries): the one stored longest ago goes.
    ([("put", "a", 1), ("put", "b", 2), ("put", "c", 3), ("put", "d", 4),
      ("get", "a", None), ("get", "b", None), ("get", "d", None)],
     [(False, None), (True, 2), (True, 4)]),
    # A re-stored key counts as new: "b" goes first.
    ([("put", "a", 1), ("put", "b", 2), ("put", "c", 3), ("put", "a", 5), ("put", "d", 4),
      ("get", "a", None), ("get", "b", None)], [(True, 5), (False, None)]),
    # None is a value like any other (an unauthenticated token is an answer).
    ([("put", "a", None), ("get", "a", None)], [(True, None)]),
])
def test_ttl_cache(steps: list[tuple[str, str, object]], expect: list[tuple[bool, object]]
                   ) -> None:
    clock = Clock()
    cache: TtlCache[str, object] = TtlCache(constant(10.0), max_entries=3, clock=clock)
    got = []
    for op, key, arg in steps:
        if op == "put":
            cache.store(key, arg)
        elif op == "wait":
            clock.t += float(arg)  # type: ignore[arg-type]
        else:
            got.append(cache.lookup(key))
    assert got == expect
    assert len(cache) <= 3


def test_ttl_cache_per_value_ttl_and_bounds() -> None:
    clock = Clock()
    cache: TtlCache[str, bool] = TtlCache(lambda ok: 60.0 if ok else 10.0, clock=clock)
    cache.store("allowed", True)
    cache.store("denied", False)
    clock.t += 30
    assert cache.lookup("allowed") == (True, True)
    assert cache.lookup("denied") == (False, None)
    never: TtlCache[str, int] = TtlCache(constant(0.0), clock=clock)
    never.store("x", 1)
    assert len(never) == 0
    with pytest.raises(ValueError, match="max_entries"):
        TtlCache(constant(1.0), max_entries=0)


def guard_of(reviews: Reviews, clock: Clock, **kw: float) -> ScrapeGuard[Who]:
    return ScrapeGuard(reviews.authenticate, reviews.authorize, clock=clock,
                       authenticated_ttl_s=60, unauthenticated_ttl_s=10, allowed_ttl_s=60,
                       denied_ttl_s=10, **kw)  # type: ignore[arg-type]


def test_guard_reviews_once_per_ttl() -> None:
    reviews, clock = Reviews(), Clock()
    guard = guard_of(reviews, clock)
    for _ in range(5):
        assert guard("Bearer good").status == 200
        clock.t += 10
    # 5 scrapes 10 s apart (t = 0..40), all within the 60 s TTL: reviewed once.
    assert len(reviews.authn_calls) == 1 and len(reviews.authz_calls) == 1
    clock.t += 20  # t = 70
    assert guard("Bearer good").status == 200
    assert len(reviews.authn_calls) == 2 and len(reviews.authz_calls) == 2


@pytest.mark.parametrize(("token", "status", "ttl"), [
    ("forged", 401, 10),
    ("other", 403, 10),
])
def test_guard_caches_refusals_shorter(token: str, status: int, ttl: float) -> None:
    reviews, clock = Reviews(), Clock()
    guard = guard_of(reviews, clock)
    assert guard(f"Bearer {token}").status == status
    clock.t += ttl - 1
    assert guard(f"Bearer {token}").status == status
    calls = len(reviews.authn_calls) + len(reviews.authz_calls)
    # A grant given meanwhile shows once the refusal's TTL is over.
    reviews.tokens["forged"] = PROM
    reviews.allowed.add(OTHER)
    clock.t += 1
    assert guard(f"Bearer {token}").status == 200
    assert len(reviews.authn_calls) + len(reviews.authz_calls) > calls


def test_guard_does_not_cache_failures() -> None:
    reviews, clock = Reviews(fail_authn=True), Clock()
    guard = guard_of(reviews, clock)
    assert guard("Bearer good").status == 503
    assert guard("Bearer good").status == 503
    assert len(reviews.authn_calls) == 2  # asked again each time
    reviews.fail_authn = False
    assert guard("Bearer good").status == 200
    reviews.fail_authz = True
    clock.t += 61
    assert guard("Bearer good").status == 503
    reviews.fail_authz = False
    assert guard("Bearer good").status == 200


def test_guard_is_bounded_and_keeps_no_token() -> None:
    reviews, clock = Reviews(), Clock()
    guard = guard_of(reviews, clock, max_entries=16)
    for i in range(200):
        assert guard(f"Bearer forged-{i}").status == 401
    assert len(guard.tokens) == 16
    assert guard("Bearer good").status == 200
    hit, who = guard.tokens.lookup(token_key("good"))
    assert hit and who == PROM
    assert not any(isinstance(k, str) for k in guard.tokens._entries)


def test_guard_decisions_per_identity() -> None:
    reviews, clock = Reviews(tokens={"a": PROM, "b": PROM, "c": OTHER}), Clock()
    guard = guard_of(reviews, clock)
    assert [guard(f"Bearer {t}").status for t in "abc"] == [200, 200, 403]
    # Two tokens of one identity share its authorization answer.
    assert reviews.authz_calls == [(PROM, "/metrics", "get"), (OTHER, "/metrics", "get")]


class CacheModel(RuleBasedStateMachine):
    """TtlCache against a plain model: an entry is found exactly while it is among the
    last ``MAX`` distinct keys stored and younger than its TTL."""

    MAX = 4

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.cache: TtlCache[int, int] = TtlCache(lambda v: float(v % 7), self.MAX,
                                                 self.clock)
        self.model: dict[int, tuple[float, int]] = {}  # key -> (expires, value)
        self.order: list[int] = []  # keys, oldest store first

    @rule(key=st.integers(0, 7), value=st.integers(0, 50))
    def store(self, key: int, value: int) -> None:
        self.cache.store(key, value)
        ttl = float(value % 7)
        if ttl <= 0:
            return
        if key in self.order:
            self.order.remove(key)
        self.order.append(key)
        self.model[key] = (self.clock.t + ttl, value)
        while len(self.order) > self.MAX:
            self.model.pop(self.order.pop(0), None)

    @rule(seconds=st.floats(0, 8))
    def wait(self, seconds: float) -> None:
        self.clock.t += seconds

    @rule(key=st.integers(0, 7))
    def lookup(self, key: int) -> None:
        want = self.model.get(key)
        got = self.cache.lookup(key)
        if want is None or self.clock.t >= want[0]:
            assert got == (False, None)
            if want is not None:  # the cache dropped it on lookup: so does the model
                del self.model[key]
                self.order.remove(key)
        else:
            assert got == (True, want[1])

    @invariant()
    def bounded(self) -> None:
        assert len(self.cache) <= self.MAX


CacheModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                        deadline=None)
test_cache_model = CacheModel.TestCase
