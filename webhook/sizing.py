"""Inference servers that size their GPU memory from the whole GPU, found in a container.

vLLM, SGLang and TGI take a fraction of *the GPU's* memory at start. On a MIG slice the
"GPU" is the slice, so that is safe; on a time-sliced share the process sees the whole
physical GPU and grabs far more than its share, and its neighbours go out of memory.
This module finds those flags in a container's command, args and env. Pure.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SizingFlag:
    engine: str
    flag: str  # canonical spelling, dashes
    # Fraction the engine takes when run without the flag; None when it is not a fixed
    # number (SGLang derives it from the GPU size), so an absent flag says nothing.
    default: float | None
    markers: tuple[str, ...]  # substrings of image, command or args that name the engine
    env: str | None = None  # environment variable with the same meaning


KNOWN_FLAGS: tuple[SizingFlag, ...] = (
    SizingFlag("vLLM", "--gpu-memory-utilization", 0.9, ("vllm",)),
    SizingFlag("SGLang", "--mem-fraction-static", None, ("sglang",)),
    SizingFlag(
        "TGI",
        "--cuda-memory-fraction",
        1.0,
        ("text-generation-launcher", "text-generation-inference"),
        env="CUDA_MEMORY_FRACTION",
    ),
)


@dataclass(frozen=True)
class SizingFinding:
    engine: str
    flag: str
    raw: str  # the value as written ("" when the default applies)
    fraction: float | None  # None: unreadable
    defaulted: bool


def _strings(value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, str)]


def _tokens(container: Mapping[str, Any]) -> list[str]:
    """command + args, each string split as a shell would (``sh -c "vllm serve ..."``)."""
    out: list[str] = []
    for text in _strings(container.get("command")) + _strings(container.get("args")):
        try:
            parts = shlex.split(text)
        except ValueError:  # unbalanced quotes: the shell would fail too; split plainly
            parts = text.split()
        out.extend(parts)
    return out


def _normal_flag(token: str) -> str:
    """``--gpu_memory_utilization=0.5`` -> ``--gpu-memory-utilization=0.5`` (vLLM and
    SGLang accept both spellings)."""
    if not token.startswith("--"):
        return token
    name, sep, value = token.partition("=")
    return name.replace("_", "-") + sep + value


def _flag_values(tokens: Sequence[str], flag: str) -> Iterator[str]:
    for i, token in enumerate(tokens):
        if token == flag:
            yield tokens[i + 1] if i + 1 < len(tokens) else ""
        elif token.startswith(flag + "="):
            yield token[len(flag) + 1 :]


def _env_value(container: Mapping[str, Any], name: str) -> str | None:
    env = container.get("env")
    if not isinstance(env, list):
        return None
    found = None
    for item in env:
        if isinstance(item, Mapping) and item.get("name") == name:
            value = item.get("value")
            found = value if isinstance(value, str) else None
    return found


def _fraction(raw: str) -> float | None:
    try:
        x = float(raw)
    except ValueError:
        return None
    return x if 0 < x <= 1 else None


def find_self_sizing(container: Mapping[str, Any]) -> list[SizingFinding]:
    """Memory fractions the container's inference server will take, one per engine."""
    tokens = [_normal_flag(t) for t in _tokens(container)]
    image = container.get("image")
    haystack = " ".join([*tokens, image if isinstance(image, str) else ""]).lower()
    findings = []
    for spec in KNOWN_FLAGS:
        values = list(_flag_values(tokens, spec.flag))
        if values:
            # argparse keeps the last occurrence.
            raw = values[-1]
            findings.append(SizingFinding(spec.engine, spec.flag, raw, _fraction(raw), False))
            continue
        env = _env_value(container, spec.env) if spec.env else None
        if env is not None:
            findings.append(SizingFinding(spec.engine, spec.env or "", env, _fraction(env), False))
            continue
        if spec.default is not None and any(m in haystack for m in spec.markers):
            findings.append(SizingFinding(spec.engine, spec.flag, "", spec.default, True))
    return findings


# ---- setting the fraction (gpupack.io/memory-fraction: "set") --------------------------------

# Engines whose memory fraction the webhook may set, by engine name: the flag and the
# markers that name the engine when the flag is absent.
SETTABLE: Mapping[str, SizingFlag] = {f.engine: f for f in KNOWN_FLAGS
                                      if f.engine in ("vLLM", "SGLang")}
# Shells by basename (/bin/sh, /usr/bin/bash, /bin/busybox sh ...): a server they start
# from a ``-c`` script never sees an argument appended after the script.
_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "busybox"})


@dataclass(frozen=True)
class ArgEdit:
    """One change to a container's ``command`` or ``args`` list."""

    field: str  # "command" | "args"
    index: int | None  # the element to replace; None: append to ``args``
    value: str


def engines_named(container: Mapping[str, Any]) -> list[SizingFlag]:
    """The settable engines the container runs: its flag is present, or the image,
    command or args name the engine."""
    tokens = [_normal_flag(t) for t in _tokens(container)]
    image = container.get("image")
    haystack = " ".join([*tokens, image if isinstance(image, str) else ""]).lower()
    return [spec for spec in SETTABLE.values()
            if any(t == spec.flag or t.startswith(spec.flag + "=") for t in tokens)
            or any(m in haystack for m in spec.markers)]


def _shell(container: Mapping[str, Any]) -> bool:
    """The container runs a shell script: the first word is a shell (by basename, after
    ``env``) and an option cluster names ``c`` (``-c``, ``-ec``, ``-xc``, ``-lc`` ...)."""
    words = [w.strip() for w in
             _strings(container.get("command")) + _strings(container.get("args"))]
    while words and words[0].rsplit("/", 1)[-1] == "env":
        words = words[1:]
    if not words or words[0].rsplit("/", 1)[-1] not in _SHELLS:
        return False
    return any(len(w) > 1 and w[0] == "-" and w[1] != "-" and "c" in w[1:]
               for w in words[1:])


def _flag_pattern(flag: str) -> re.Pattern[str]:
    """The flag in either spelling (dashes or underscores) inside a shell string, with
    its value after ``=`` or blanks."""
    body = re.escape(flag[2:]).replace("\\-", "[-_]")
    return re.compile(r"(--" + body + r")(=|\s+)(\S+)")


def fraction_edits(container: Mapping[str, Any], fraction: str
                   ) -> tuple[list[ArgEdit], list[str]]:
    """Edits that make every vLLM or SGLang server of ``container`` use ``fraction``
    ("0.25"), and what could not be set (the flag is absent and the server is started by
    a shell script, where appending could change the script's meaning)."""
    edits: list[ArgEdit] = []
    problems: list[str] = []
    for spec in engines_named(container):
        found = False
        pattern = _flag_pattern(spec.flag)
        for field_name in ("command", "args"):
            items = container.get(field_name)
            if not isinstance(items, list):
                continue
            for i, item in enumerate(items):
                if not isinstance(item, str):
                    continue
                token = _normal_flag(item)
                if token == spec.flag:
                    found = True
                    if i + 1 < len(items) and isinstance(items[i + 1], str):
                        edits.append(ArgEdit(field_name, i + 1, fraction))
                elif token.startswith(spec.flag + "="):
                    found = True
                    edits.append(ArgEdit(field_name, i, item.partition("=")[0] + "=" + fraction))
                elif pattern.search(item) and any(c.isspace() for c in item):
                    found = True
                    edits.append(ArgEdit(field_name, i, pattern.sub(
                        lambda m: m.group(1) + m.group(2) + fraction, item)))
        if found:
            continue
        if _shell(container):
            problems.append(f"{spec.engine} runs from a shell script without {spec.flag}: "
                            f"gpupack does not edit scripts; add {spec.flag} {fraction} to it")
            continue
        edits.append(ArgEdit("args", None, f"{spec.flag}={fraction}"))
    return edits, problems


def apply_edits(container: Mapping[str, Any], edits: Sequence[ArgEdit]) -> dict[str, Any]:
    """A copy of ``container`` with ``edits`` made (to judge the result)."""
    out = dict(container)
    for e in edits:
        items = list(out.get(e.field) or [])
        if e.index is None:
            items.append(e.value)
        else:
            items[e.index] = e.value
        out[e.field] = items
    return out
