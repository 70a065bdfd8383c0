"""The two reviews of delegated authentication and authorization, asked of the API server:
the only place gpupack creates TokenReviews and SubjectAccessReviews.

kube-scheduler and the kubelet guard their metrics this way: the bearer token a scrape
carries goes to ``authentication.k8s.io/v1`` TokenReview (who is it?), the identity to
``authorization.k8s.io/v1`` SubjectAccessReview with ``nonResourceAttributes`` (may it
``get`` ``/metrics``?). The decision and its cache are ``serving.metrics_auth``; this
module only asks. The ServiceAccount asking needs ``create`` on both (the built-in
ClusterRole ``system:auth-delegator``).

Any failure to get an answer (the API server unreachable, slow past the timeout,
answering an error such as 403 when the grant is missing, or an answer that cannot be
read) raises :class:`ReviewUnavailable` naming the review and the cause; "not
authenticated" and "not allowed" are answers, not failures.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 5.0


class ReviewUnavailable(RuntimeError):
    """The API server gave no usable answer to a review."""


@dataclass(frozen=True)
class UserInfo:
    """An authenticated identity, as TokenReview's ``status.user`` gives it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


def _strings(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ReviewUnavailable(f"TokenReview answer: {field} is {value!r}, not a list of "
                                "strings")
    return tuple(value)


def user_info(status: Mapping[str, Any]) -> UserInfo | None:
    """The identity of a TokenReview ``status``; None when it is not authenticated.
    ReviewUnavailable when an authenticated answer names no usable user."""
    if status.get("authenticated") is not True:
        return None
    user = status.get("user")
    if not isinstance(user, Mapping):
        raise ReviewUnavailable(f"TokenReview answer: status.user is {user!r}")
    name = user.get("username")
    if not isinstance(name, str) or not name:
        raise ReviewUnavailable(f"TokenReview answer: status.user.username is {name!r}")
    uid = user.get("uid") or ""
    if not isinstance(uid, str):
        raise ReviewUnavailable(f"TokenReview answer: status.user.uid is {uid!r}")
    extra = user.get("extra") or {}
    if not isinstance(extra, Mapping):
        raise ReviewUnavailable(f"TokenReview answer: status.user.extra is {extra!r}")
    return UserInfo(name, uid, _strings(user.get("groups"), "status.user.groups"),
                    tuple(sorted((str(k), _strings(v, f"status.user.extra[{k!r}]"))
                                 for k, v in extra.items())))


def token_review_body(token: str, audiences: Sequence[str] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"token": token}
    if audiences:
        spec["audiences"] = list(audiences)
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}


def access_review_body(user: UserInfo, path: str, verb: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"user": user.username, "groups": list(user.groups),
                            "nonResourceAttributes": {"path": path, "verb": verb}}
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {k: list(v) for k, v in user.extra}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": spec}


class DelegatedAuth:
    """TokenReview and SubjectAccessReview through ``api_client`` (a ``kubernetes``
    ``ApiClient``), each call bounded by ``timeout_s``. ``audiences``: those the token
    must be meant for (default none: the API server's own, as a pod's projected
    service account token has)."""

    def __init__(self, api_client: Any, timeout_s: float = TIMEOUT_S,
                 audiences: Sequence[str] = ()) -> None:
        from kubernetes import client

        self._authn: Any = client.AuthenticationV1Api(api_client)
        self._authz: Any = client.AuthorizationV1Api(api_client)
        self.timeout_s = timeout_s
        self.audiences = tuple(audiences)

    def authenticate(self, token: str) -> UserInfo | None:
        """Whose token this is; None when the API server does not accept it."""
        status = self._create("TokenReview", self._authn.create_token_review,
                              token_review_body(token, self.audiences))
        who = user_info(status)
        if who is not None and self.audiences:
            meant_for = _strings(status.get("audiences"), "status.audiences")
            if not set(meant_for) & set(self.audiences):
                return None  # valid, but for someone else
        return who

    def authorize(self, user: UserInfo, path: str, verb: str) -> bool:
        """May ``user`` ``verb`` the non-resource URL ``path``?"""
        status = self._create("SubjectAccessReview",
                              self._authz.create_subject_access_review,
                              access_review_body(user, path, verb))
        return status.get("allowed") is True

    def _create(self, kind: str, create: Any, body: dict[str, Any]) -> Mapping[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            resp = create(body, _preload_content=False, _request_timeout=self.timeout_s)
            answer = json.loads(resp.data)
        except ApiException as e:
            raise ReviewUnavailable(f"{kind}: the API server answered {e.status} "
                                    f"{e.reason}") from None
        except Exception as e:  # urllib3's errors (refused, timed out), OSError, bad JSON
            raise ReviewUnavailable(f"{kind}: {type(e).__name__}: {e}") from None
        status = answer.get("status") if isinstance(answer, Mapping) else None
        if not isinstance(status, Mapping):
            raise ReviewUnavailable(f"{kind}: the answer has no status object")
        return status
