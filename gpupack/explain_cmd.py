"""``gpupack explain``: what the webhook would do to a pod, and why, without a cluster."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpupack.inputs import load_cluster, read_objects
from gpupack.webhook_cmd import add_config_arguments, config_from_args
from kube.objects import ObjectError
from webhook.admit import Admission, admit
from webhook.capacity import ClusterView
from webhook.decision import Kind


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pod", type=Path, help="Pod object(s) to explain (YAML/JSON)")
    p.add_argument(
        "--namespace",
        default=None,
        help="namespace of pods that do not name one (default: default)",
    )
    p.add_argument("--format", default="text", choices=["text", "json"])
    add_config_arguments(p, nodes_help="Node objects (YAML/JSON; required: explain reads "
                         "no API server)")


def _what(adm: Admission) -> str:
    d = adm.decision
    pin = f" on {'|'.join(d.models)}" if d.models else ""
    if d.kind is Kind.MIG:
        return f"MIG slice {d.resource}{pin}"
    if d.kind is Kind.SHARED:
        return f"time-sliced share {d.resource}{pin}"
    if d.kind is Kind.MPS:
        return f"MPS share {d.resource}{pin}"
    if d.kind is Kind.GPU:
        return f"whole GPU {d.resource} of a DRA node{pin}"
    if d.kind is Kind.DENY:
        return f"DENIED (HTTP-style code {d.status_code})"
    return {
        Kind.WHOLE: "whole GPUs: resources unchanged",
        Kind.EXPLICIT: "explicit GPU resource: unchanged",
        Kind.SKIP: "not a GPU pod: untouched",
    }[d.kind]


def _resulting(pod: Mapping[str, Any]) -> dict[str, Any]:
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    containers = spec.get("containers") if isinstance(spec.get("containers"), list) else []
    assert isinstance(containers, list)
    return {
        "schedulerName": spec.get("schedulerName"),
        "resources": {
            str(c.get("name", i)): c.get("resources")
            for i, c in enumerate(containers)
            if isinstance(c, Mapping)
        },
        "affinity": spec.get("affinity"),
        "annotations": meta.get("annotations"),
    }


def explain_json(pod: Mapping[str, Any], adm: Admission) -> dict[str, Any]:
    d = adm.decision
    out: dict[str, Any] = {
        "pod": _pod_name(pod),
        "kind": d.kind.value,
        "class": d.klass,
        "allowed": d.allowed,
        "reason": d.reason,
        "warnings": list(d.warnings),
    }
    if d.allowed:
        out["patch"] = list(adm.patch)
        out["result"] = _resulting(adm.result)
    else:
        out["code"] = d.status_code
    return out


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return "<unnamed>"
    name = meta.get("name") or meta.get("generateName") or ""
    return f"{meta.get('namespace') or 'default'}/{name}"


def _print_text(pod: Mapping[str, Any], adm: Admission) -> None:
    d = adm.decision
    print(f"pod {_pod_name(pod)} (class {d.klass}): {_what(adm)}")
    print(f"  why: {d.reason}")
    for w in d.warnings:
        print(f"  warning: {w}")
    if not d.allowed:
        return
    if not adm.patch:
        print("  patch: none (nothing to change)")
        return
    print("  patch (RFC 6902):")
    for op in adm.patch:
        print("    " + json.dumps(op, separators=(", ", ": ")))
    print("  resulting pod:")
    for key, value in _resulting(adm.result).items():
        print(f"    {key}: {json.dumps(value, sort_keys=True)}")


def run(args: argparse.Namespace) -> int:
    if args.nodes is None:
        print("gpupack explain: --nodes is required", file=sys.stderr)
        return 2
    try:
        pods = read_objects(args.pod, "Pod")
        built = load_cluster(args.nodes, args.pods, mig_actuator=args.mig_actuator)
    except ObjectError as e:
        print(f"gpupack explain: {e}", file=sys.stderr)
        return 2
    if not pods:
        print(f"gpupack explain: {args.pod}: no Pod object in the file", file=sys.stderr)
        return 2
    for note in built.notes:
        print(f"note: {note}", file=sys.stderr)
    config = config_from_args(args)
    view = ClusterView.of(built.snapshot)
    results = []
    denied = False
    for pod in pods:
        meta = pod.get("metadata")
        ns = (meta.get("namespace") if isinstance(meta, Mapping) else None) or args.namespace
        adm = admit(pod, view, config, config.namespace_labels(ns or "default"))
        denied = denied or not adm.decision.allowed
        if args.format == "json":
            results.append(explain_json(pod, adm))
        else:
            _print_text(pod, adm)
    if args.format == "json":
        print(json.dumps(results if len(results) > 1 else results[0], indent=2))
    # Like `kubectl auth can-i`: 1 is an answer (a pod the webhook would deny), 2 an error.
    return 1 if denied else 0
