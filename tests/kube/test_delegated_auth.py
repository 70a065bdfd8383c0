"""kube.delegated_auth: the TokenReview and SubjectAccessReview it sends through the real
``kubernetes`` client, and what it makes of the answers, against a small fake of the two
endpoints over real HTTP (the real API server: tests/e2e/test_e2e_metrics_auth.py)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kube.delegated_auth import (
    DelegatedAuth,
    ReviewUnavailable,
    UserInfo,
    access_review_body,
    token_review_body,
    user_info,
)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

PROM: dict[str, Any] = {"username": "system:serviceaccount:monitoring:prometheus", "uid": "u-1",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/pod-name": ["prom-0"]}}


class FakeReviews:
    """Answers each review with ``answers[path]``: (HTTP status, body object or raw bytes);
    ``delay_s`` before answering; records (path, request body, Authorization header)."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, Any]] = {}
        self.delay_s = 0.0
        self.seen: list[tuple[str, dict[str, Any], str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                path = self.path.split("?", 1)[0]
                fake.seen.append((path, body, self.headers.get("Authorization", "")))
                time.sleep(fake.delay_s)
                status, answer = fake.answers.get(path, (404, {"kind": "Status"}))
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (timeout tests)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def token_status(self, status: dict[str, Any], code: int = 201) -> None:
        self.answers[TOKEN_REVIEWS] = (code, {"apiVersion": "authentication.k8s.io/v1",
                                              "kind": "TokenReview", "status": status})

    def access_status(self, status: dict[str, Any], code: int = 201) -> None:
        self.answers[ACCESS_REVIEWS] = (code, {"apiVersion": "authorization.k8s.io/v1",
                                               "kind": "SubjectAccessReview",
                                               "status": status})


def api_client(url: str) -> Any:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = url
    cfg.api_key = {"authorization": "the-server-s-own-token"}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(cfg)


@pytest.fixture()
def fake() -> Iterator[FakeReviews]:
    f = FakeReviews()
    try:
        yield f
    finally:
        f.httpd.shutdown()
        f.httpd.server_close()


def test_token_review_sent_and_read(fake: FakeReviews) -> None:
    fake.token_status({"authenticated": True, "user": PROM, "audiences": ["api"]})
    who = DelegatedAuth(api_client(fake.url)).authenticate("scraper-token")
    assert who == UserInfo(PROM["username"], "u-1",
                           ("system:serviceaccounts", "system:authenticated"),
                           (("authentication.kubernetes.io/pod-name", ("prom-0",)),))
    ((path, body, auth),) = fake.seen
    assert path == TOKEN_REVIEWS
    assert body == {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                    "spec": {"token": "scraper-token"}}
    assert auth == "Bearer the-server-s-own-token"  # the server's identity asks


def test_access_review_sent_and_read(fake: FakeReviews) -> None:
    fake.access_status({"allowed": True, "reason": "RBAC: allowed by ClusterRoleBinding"})
    reviews = DelegatedAuth(api_client(fake.url))
    who = UserInfo("alice", "u-2", ("g1",), (("k", ("v1", "v2")),))
    assert reviews.authorize(who, "/metrics", "get") is True
    ((path, body, _),) = fake.seen
    assert path == ACCESS_REVIEWS
    assert body == {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                    "spec": {"user": "alice", "uid": "u-2", "groups": ["g1"],
                             "extra": {"k": ["v1", "v2"]},
                             "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}}


@pytest.mark.parametrize(("status", "allowed"), [
    ({"allowed": True}, True),
    ({"allowed": False}, False),
    ({"allowed": False, "denied": True, "reason": "no"}, False),
    ({"allowed": False, "evaluationError": "webhook down"}, False),
    ({}, False),  # allowed omitted: false
    ({"allowed": "true"}, False),  # not a boolean: not an allow
])
def test_access_review_answers(fake: FakeReviews, status: dict[str, Any], allowed: bool
                               ) -> None:
    fake.access_status(status)
    assert DelegatedAuth(api_client(fake.url)).authorize(UserInfo("u"), "/metrics",
                                                         "get") is allowed


@pytest.mark.parametrize(("status", "expect"), [
    ({"authenticated": False, "error": "invalid bearer token"}, None),
    ({"authenticated": False}, None),
    ({}, None),
    ({"authenticated": "yes", "user": PROM}, None),  # only a real true authenticates
    ({"authenticated": True, "user": {"username": "bob"}}, UserInfo("bob")),
    ({"authenticated": True, "user": {"username": "bob", "groups": None, "extra": None}},
     UserInfo("bob")),
    ({"authenticated": True}, "status.user is None"),
    ({"authenticated": True, "user": {"username": ""}}, "status.user.username is ''"),
    ({"authenticated": True, "user": {"username": 7}}, "status.user.username is 7"),
    ({"authenticated": True, "user": {"username": "b", "uid": 3}}, "status.user.uid is 3"),
    ({"authenticated": True, "user": {"username": "b", "groups": "admins"}},
     "status.user.groups is 'admins'"),
    ({"authenticated": True, "user": {"username": "b", "extra": {"k": "v"}}},
     "status.user.extra['k'] is 'v'"),
    ({"authenticated": True, "user": {"username": "b", "extra": ["k"]}},
     "status.user.extra is ['k']"),
])
def test_user_info(status: dict[str, Any], expect: UserInfo | str | None) -> None:
    if isinstance(expect, str):
        with pytest.raises(ReviewUnavailable, match=expect.replace("[", r"\[")):
            user_info(status)
    else:
        assert user_info(status) == expect


@pytest.mark.parametrize(("answer", "message"), [
    ((500, {"kind": "Status", "code": 500}), "TokenReview: the API server answered 500"),
    # The asking account lacks system:auth-delegator.
    ((403, {"kind": "Status", "code": 403}), "TokenReview: the API server answered 403"),
    ((429, {"kind": "Status", "code": 429}), "answered 429"),
    ((201, b"<html>not json"), "TokenReview: JSONDecodeError"),
    ((201, {"kind": "TokenReview"}), "the answer has no status object"),
    ((201, [1, 2]), "the answer has no status object"),
])
def test_token_review_failures(fake: FakeReviews, answer: tuple[int, Any], message: str
                               ) -> None:
    fake.answers[TOKEN_REVIEWS] = answer
    with pytest.raises(ReviewUnavailable, match=message):
        DelegatedAuth(api_client(fake.url)).authenticate("t")


def test_access_review_failure_names_the_review(fake: FakeReviews) -> None:
    fake.answers[ACCESS_REVIEWS] = (503, {"kind": "Status"})
    with pytest.raises(ReviewUnavailable, match="SubjectAccessReview: the API server "
                                                "answered 503"):
        DelegatedAuth(api_client(fake.url)).authorize(UserInfo("u"), "/metrics", "get")


def test_slow_api_server_times_out(fake: FakeReviews) -> None:
    fake.token_status({"authenticated": True, "user": PROM})
    fake.delay_s = 3.0
    started = time.monotonic()
    with pytest.raises(ReviewUnavailable, match=r"TokenReview: .*(?i:timed out|timeout)"):
        DelegatedAuth(api_client(fake.url), timeout_s=0.3).authenticate("t")
    assert time.monotonic() - started < 2.0


def test_unreachable_api_server() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    reviews = DelegatedAuth(api_client(f"http://127.0.0.1:{port}"), timeout_s=1.0)
    with pytest.raises(ReviewUnavailable, match="TokenReview"):
        reviews.authenticate("t")


def test_audiences(fake: FakeReviews) -> None:
    reviews = DelegatedAuth(api_client(fake.url), audiences=("gpupack",))
    fake.token_status({"authenticated": True, "user": PROM, "audiences": ["other"]})
    assert reviews.authenticate("t") is None  # valid, but meant for someone else
    assert fake.seen[0][1]["spec"] == {"token": "t", "audiences": ["gpupack"]}
    fake.token_status({"authenticated": True, "user": PROM, "audiences": ["gpupack"]})
    assert reviews.authenticate("t") is not None


def test_bodies() -> None:
    assert token_review_body("t", ("a",))["spec"] == {"token": "t", "audiences": ["a"]}
    assert access_review_body(UserInfo("u"), "/metrics", "get")["spec"] == {
        "user": "u", "groups": [], "nonResourceAttributes": {"path": "/metrics",
                                                             "verb": "get"}}
