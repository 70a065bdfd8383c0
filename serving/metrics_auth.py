"""Who may scrape ``/metrics``: delegated authentication and authorization, as
kube-scheduler and the kubelet do it, as a decision over two injected reviews.

A scrape must carry ``Authorization: Bearer <token>``. ``authenticate(token)`` says whose
token it is (the API server's TokenReview) or None when it is not accepted;
``authorize(identity, path, verb)`` says whether that identity may ``get`` the
non-resource URL ``/metrics`` (a SubjectAccessReview). :func:`check` turns the header and
the two answers into a :class:`Verdict`: 200, 401 (no token, or one the API server does
not accept), 403 (accepted, not allowed) or 503 (a review could not be made: the API
server is down or refused the review itself). Nothing here talks to the network: the
reviews are injected (``kube.delegated_auth`` makes the real ones), so the decision is
table-tested with plain functions.

:class:`ScrapeGuard` puts a bounded, short-lived cache in front of both reviews (an
answer is reused for a few tens of seconds, so Prometheus scraping every 15-30 s costs
the API server a review now and then, not two per scrape). Failures to review are never
cached: the next scrape asks again.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

METRICS_PATH = "/metrics"
METRICS_VERB = "get"

# A service account token is about 1 KiB; anything past this is not a token worth
# sending to the API server (the listener's header limit stops far larger ones first).
MAX_TOKEN_CHARS = 16 * 1024

# kube-scheduler caches both reviews for 10 s, the kubelet for 2 min (authenticated) and
# 5 min / 30 s (allowed / denied). Prometheus scrapes every 15-30 s: these TTLs make
# most scrapes free while a revoked grant or token stops working within a minute.
AUTHENTICATED_TTL_S = 60.0
UNAUTHENTICATED_TTL_S = 10.0
ALLOWED_TTL_S = 60.0
DENIED_TTL_S = 10.0
MAX_CACHED = 1024


class Identity(Hashable, Protocol):
    """What :func:`check` needs of an authenticated identity: a name for the 403
    message; hashable, so authorization answers can be cached per identity."""

    @property
    def username(self) -> str: ...


Who = TypeVar("Who", bound=Identity)
Authenticate = Callable[[str], Who | None]
Authorize = Callable[[Who, str, str], bool]


@dataclass(frozen=True)
class Verdict:
    """The answer to one scrape: ``status`` 200 (serve it), 401, 403 or 503, ``reason``
    what the client is told, ``username`` who the token belongs to when known."""

    status: int
    reason: str
    username: str | None = None

    @property
    def allowed(self) -> bool:
        return self.status == 200


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, as the API server's own
    bearer-token authenticator reads it (scheme case-insensitive, the token is the second
    space-separated word); None when there is none."""
    if not header:
        return None
    parts = header.split(" ", 2)
    if len(parts) < 2 or parts[0].lower() != "bearer":
        return None
    token = parts[1]
    if not token or len(token) > MAX_TOKEN_CHARS:
        return None
    return token


def check(header: str | None, authenticate: Authenticate[Who], authorize: Authorize[Who],
          path: str = METRICS_PATH, verb: str = METRICS_VERB) -> Verdict:
    """May the bearer of ``header`` ``verb`` the non-resource URL ``path``? A review that
    raises is an answer the server cannot give now (503), never a crash and never an
    allow."""
    token = bearer_token(header)
    if token is None:
        return Verdict(401, f"{path} needs 'Authorization: Bearer <token>' (a Kubernetes "
                            "token whose identity may get this URL)")
    try:
        who = authenticate(token)
    except Exception as e:
        return Verdict(503, f"cannot authenticate the token now (TokenReview failed: {e})")
    if who is None:
        return Verdict(401, "the token is not valid (the API server's TokenReview did not "
                            "authenticate it)")
    try:
        allowed = authorize(who, path, verb)
    except Exception as e:
        return Verdict(503, f"cannot authorize {who.username} now (SubjectAccessReview "
                            f"failed: {e})", who.username)
    if not allowed:
        return Verdict(403, f'forbidden: User "{who.username}" cannot {verb} path "{path}"',
                       who.username)
    return Verdict(200, "allowed", who.username)


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """At most ``max_entries`` answers, each kept ``ttl(value)`` seconds of ``clock``;
    when full, the entry stored longest ago goes. Thread-safe."""

    def __init__(self, ttl: Callable[[V], float], max_entries: int = MAX_CACHED,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self._ttl, self._max, self._clock = ttl, max_entries, clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def lookup(self, key: K) -> tuple[bool, V | None]:
        """(True, value) for a live entry; (False, None) for none or an expired one."""
        now = self._clock()
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return False, None
            if now >= hit[0]:
                del self._entries[key]
                return False, None
            return True, hit[1]

    def store(self, key: K, value: V) -> None:
        ttl = self._ttl(value)
        if ttl <= 0:
            return
        expires = self._clock() + ttl
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = (expires, value)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)


def token_key(token: str) -> bytes:
    """Cache key of a token: its digest, so the cache holds no credential."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class ScrapeGuard(Generic[Who]):
    """:func:`check` with both reviews cached: the callable a metrics app asks with the
    request's Authorization header."""

    def __init__(self, authenticate: Authenticate[Who], authorize: Authorize[Who],
                 clock: Callable[[], float] = time.monotonic, max_entries: int = MAX_CACHED,
                 authenticated_ttl_s: float = AUTHENTICATED_TTL_S,
                 unauthenticated_ttl_s: float = UNAUTHENTICATED_TTL_S,
                 allowed_ttl_s: float = ALLOWED_TTL_S, denied_ttl_s: float = DENIED_TTL_S
                 ) -> None:
        self._authenticate, self._authorize = authenticate, authorize
        self.tokens: TtlCache[bytes, Who | None] = TtlCache(
            lambda who: authenticated_ttl_s if who is not None else unauthenticated_ttl_s,
            max_entries, clock)
        self.decisions: TtlCache[tuple[Who, str, str], bool] = TtlCache(
            lambda ok: allowed_ttl_s if ok else denied_ttl_s, max_entries, clock)

    def authenticate(self, token: str) -> Who | None:
        key = token_key(token)
        hit, who = self.tokens.lookup(key)
        if hit:
            return who
        who = self._authenticate(token)  # raises: not cached, the next scrape asks again
        self.tokens.store(key, who)
        return who

    def authorize(self, who: Who, path: str, verb: str) -> bool:
        key = (who, path, verb)
        hit, ok = self.decisions.lookup(key)
        if hit:
            return bool(ok)
        ok = self._authorize(who, path, verb)
        self.decisions.store(key, ok)
        return ok

    def __call__(self, header: str | None) -> Verdict:
        return check(header, self.authenticate, self.authorize)


Guard = Callable[[str | None], Verdict]
"""What a metrics app calls per scrape: Authorization header -> :class:`Verdict`."""
