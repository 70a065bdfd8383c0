"""Safety of time-sliced shares: a server that sizes its GPU memory from the whole GPU
(vLLM's and SGLang's memory fraction flags) can take more than its share and OOM its
neighbours. :func:`sizing_problems` finds it (a warning, or a denial in strict mode);
``gpupack.io/memory-fraction: "set"`` has the webhook write the flag for the share
(:func:`set_fraction`, the edits from :mod:`webhook.sizing`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kube import annotations as A
from packing.catalog import (
    CATALOG,
)
from webhook.decision import AdmissionDecision
from webhook.pod import MEMORY_FRACTION, Container, Pod, gib, memory_fraction
from webhook.sizing import (
    apply_edits,
    engines_named,
    find_self_sizing,
    fraction_edits,
)


def _gpu_mib(decision: AdmissionDecision) -> int:
    """Memory of the largest GPU the share may land on (0: none known)."""
    return max((CATALOG[m].memory_mib if m in CATALOG else 0 for m in decision.models),
               default=0)


def _share_fraction(decision: AdmissionDecision) -> str | None:
    """The memory fraction that keeps a server within its share on every GPU it may land
    on, two decimals rounded down ("0.25"); None when the share is the whole GPU (nothing
    to protect) or less than 1% of it."""
    gpu_mib = _gpu_mib(decision)
    if not gpu_mib or decision.memory_mib >= gpu_mib:
        return None
    hundredths = decision.memory_mib * 100 // gpu_mib
    return f"{hundredths / 100:g}" if hundredths else None


def set_fraction(p: Pod, target: Container, decision: AdmissionDecision
                  ) -> tuple[AdmissionDecision, Mapping[str, Any], list[str]]:
    """(the decision with its flag edits, the container as it will run, what could not
    be set) for ``gpupack.io/memory-fraction: "set"`` on a time-sliced share."""
    fraction = _share_fraction(decision)
    if fraction is None or not memory_fraction(p):
        return decision, target.body, []
    edits, problems = fraction_edits(target.body, fraction)
    who = f"container {target.name or target.index}"
    return (replace(decision, arg_edits=tuple(edits)), apply_edits(target.body, edits),
            [f"{who}: {x}" for x in problems])


def sizing_problems(container: Container, decision: AdmissionDecision,
                     body: Mapping[str, Any] | None = None) -> tuple[list[str], list[str]]:
    """(over-share findings, unreadable values) for the container getting a share;
    ``body``: the container as it will run (after gpupack's own flag edits)."""
    gpu_mib = _gpu_mib(decision)
    if not gpu_mib:
        return [], []
    body = container.body if body is None else body
    model = "|".join(decision.models)
    share = decision.memory_mib
    who = f"container {container.name or container.index}"
    over, unreadable = [], []
    findings = find_self_sizing(body)
    named = {f.engine for f in findings}
    for spec in engines_named(body):
        if spec.default is None and spec.engine not in named and share < gpu_mib:
            # Self-sizing with no fixed default (SGLang picks its fraction from the GPU's
            # size): nothing bounds it by the share.
            where = "args" if isinstance(body.get("args"), list) else "command"
            over.append(
                f"spec.containers[{container.index}].{where}: {spec.engine} without "
                f"{spec.flag} sizes its memory from the whole time-sliced {model} "
                f"({gib(gpu_mib)}), not its {gib(share)} share, and can OOM its "
                f"neighbours; set {spec.flag} <= {int(share / gpu_mib * 100) / 100:g}, "
                f'{MEMORY_FRACTION}: "set" or {A.ISOLATION}: mig'
            )
    for f in findings:
        shown = f"{f.flag} {f.raw}" if not f.defaulted else f"{f.flag} (default {f.fraction:g})"
        if f.fraction is None:
            unreadable.append(f"{who}: cannot read {f.engine} {f.flag} value {f.raw!r}")
            continue
        takes = f.fraction * gpu_mib
        if takes > share:
            over.append(
                f"{who}: {f.engine} {shown} takes {gib(takes)} of a time-sliced {model} "
                f"({gib(gpu_mib)}), more than its {gib(share)} share, and can OOM its "
                f"neighbours; use <= {int(share / gpu_mib * 100) / 100:g} or "
                f"{A.ISOLATION}: mig"
            )
    return over, unreadable
