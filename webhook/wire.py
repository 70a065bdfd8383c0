"""AdmissionReview (admission.k8s.io/v1) on the wire, as typed values.

Decoding is tolerant: unknown fields are ignored and optional ones default, so a newer
API server does not break the webhook. What the webhook cannot do without raises
:class:`ReviewError` naming the field; the app answers it with HTTP 400.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
KIND = "AdmissionReview"
# The API server may truncate longer warnings; cutting them here keeps the end readable.
MAX_WARNING_CHARS = 256


class ReviewError(ValueError):
    """An AdmissionReview the webhook cannot read; ``field`` is the JSON path at fault."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class GroupVersionKind:
    group: str
    version: str
    kind: str


@dataclass(frozen=True)
class GroupVersionResource:
    group: str
    version: str
    resource: str


@dataclass(frozen=True)
class AdmissionRequest:
    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    sub_resource: str
    operation: str  # CREATE | UPDATE | DELETE | CONNECT
    name: str
    namespace: str
    object: Mapping[str, Any] | None
    dry_run: bool
    username: str

    @property
    def is_pod_create(self) -> bool:
        return (
            self.operation == "CREATE"
            and self.kind.group == ""
            and self.kind.kind == "Pod"
            and self.sub_resource == ""
        )


@dataclass(frozen=True)
class AdmissionReview:
    api_version: str
    request: AdmissionRequest


@dataclass(frozen=True)
class AdmissionResponse:
    uid: str
    allowed: bool
    patch: Sequence[Mapping[str, Any]] = ()  # JSON Patch operations; empty: no patch
    status_code: int | None = None  # with a denial: 400 for bad input, 403 by policy
    message: str = ""
    warnings: Sequence[str] = ()
    audit_annotations: Mapping[str, str] = field(default_factory=dict)


def _obj(value: Any, path: str, *, required: bool = True) -> Mapping[str, Any]:
    if value is None and not required:
        return {}
    if value is None:
        raise ReviewError(path, "missing")
    if not isinstance(value, Mapping):
        raise ReviewError(path, f"expected an object, got {type(value).__name__}")
    return value


def _str(m: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> str:
    value = m.get(key)
    if value is None:
        if required:
            raise ReviewError(f"{path}.{key}", "missing")
        return ""
    if not isinstance(value, str):
        raise ReviewError(f"{path}.{key}", f"expected a string, got {type(value).__name__}")
    if required and not value:
        raise ReviewError(f"{path}.{key}", "empty")
    return value


def decode_review(body: bytes | str | Any) -> AdmissionReview:
    """An AdmissionReview from request bytes (or already decoded JSON)."""
    if isinstance(body, bytes | str):
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise ReviewError("body", f"not JSON: {e}") from None
        except RecursionError:
            raise ReviewError("body", "not JSON this webhook reads: nested too deeply") from None
    else:
        doc = body
    top = _obj(doc, "body")
    api_version = _str(top, "apiVersion", "body", required=True)
    if api_version not in API_VERSIONS:
        raise ReviewError("apiVersion", f"{api_version!r} is not one of {', '.join(API_VERSIONS)}")
    kind = _str(top, "kind", "body", required=True)
    if kind != KIND:
        raise ReviewError("kind", f"{kind!r} is not {KIND}")
    req = _obj(top.get("request"), "request")
    uid = _str(req, "uid", "request", required=True)
    gvk = _obj(req.get("kind"), "request.kind")
    gvr = _obj(req.get("resource"), "request.resource", required=False)
    operation = _str(req, "operation", "request", required=True)
    obj = req.get("object")
    if obj is not None and not isinstance(obj, Mapping):
        raise ReviewError("request.object", f"expected an object, got {type(obj).__name__}")
    dry_run = req.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise ReviewError("request.dryRun", f"expected a boolean, got {dry_run!r}")
    user = req.get("userInfo")
    username = ""
    if isinstance(user, Mapping):
        username = _str(user, "username", "request.userInfo")
    request = AdmissionRequest(
        uid=uid,
        kind=GroupVersionKind(
            _str(gvk, "group", "request.kind"),
            _str(gvk, "version", "request.kind"),
            _str(gvk, "kind", "request.kind", required=True),
        ),
        resource=GroupVersionResource(
            _str(gvr, "group", "request.resource"),
            _str(gvr, "version", "request.resource"),
            _str(gvr, "resource", "request.resource"),
        ),
        sub_resource=_str(req, "subResource", "request"),
        operation=operation,
        name=_str(req, "name", "request"),
        namespace=_str(req, "namespace", "request"),
        object=obj,
        dry_run=dry_run,
        username=username,
    )
    if request.is_pod_create and obj is None:
        raise ReviewError("request.object", "missing on a Pod CREATE")
    return AdmissionReview(api_version=api_version, request=request)


_REASONS = {400: "BadRequest", 403: "Forbidden", 500: "InternalError",
            503: "ServiceUnavailable"}


def _clip(text: str) -> str:
    if len(text) <= MAX_WARNING_CHARS:
        return text
    return text[: MAX_WARNING_CHARS - 3] + "..."


def encode_response(api_version: str, response: AdmissionResponse) -> dict[str, Any]:
    """The AdmissionReview answer, echoing the request's apiVersion."""
    out: dict[str, Any] = {"uid": response.uid, "allowed": response.allowed}
    if not response.allowed or response.status_code is not None:
        out["status"] = {
            "code": response.status_code or 403,
            "message": response.message,
            # metav1.Status reason, so kubectl prints something sensible.
            "reason": _REASONS.get(response.status_code or 403, "Forbidden"),
        }
    if response.allowed and response.patch:
        raw = json.dumps(list(response.patch), separators=(",", ":")).encode()
        out["patchType"] = "JSONPatch"
        out["patch"] = base64.b64encode(raw).decode("ascii")
    if response.warnings:
        out["warnings"] = [_clip(w) for w in response.warnings]
    if response.audit_annotations:
        out["auditAnnotations"] = dict(response.audit_annotations)
    return {"apiVersion": api_version, "kind": KIND, "response": out}


def error_body(err: ReviewError) -> dict[str, Any]:
    """JSON body of an HTTP 400 for a review the webhook could not read."""
    return {"error": str(err), "field": err.field}
