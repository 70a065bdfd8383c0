"""The compaction flags, declared once (``gpupack/compact_flags.py``) for ``gpupack
serve`` (``--mig-compact-*``) and ``bench/mig.py`` (``--compact-*``): both spellings
give the shipped defaults, set every field, and name the flag of a value out of range."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from gpupack.compact_flags import FLAGS, add_compact_flags, compact_flag_error, compact_settings
from scheduler.mig.compact.decide import DEFAULT_COMPACT, CompactSettings

PREFIXES = ("--mig-compact-", "--compact-")


def parser(prefix: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_compact_flags(p, prefix, "")
    return p


@pytest.mark.parametrize("prefix", PREFIXES)
def test_defaults_are_the_shipped_settings(prefix: str) -> None:
    ns = parser(prefix).parse_args([])
    assert compact_flag_error(ns, prefix) is None
    assert compact_settings(ns, prefix) == DEFAULT_COMPACT


@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_flag_sets_its_field(prefix: str) -> None:
    argv, want = [], {}
    for f in FLAGS:
        default = getattr(DEFAULT_COMPACT, f.field)
        if f.kind is bool:
            argv.append(f"{prefix}{f.name}" if not default else f"--no-{prefix[2:]}{f.name}")
            want[f.field] = not default
        else:
            argv += [f"{prefix}{f.name}", str(f.kind(default) + f.kind(3))]
            want[f.field] = f.kind(default) + f.kind(3)
    got = compact_settings(parser(prefix).parse_args(argv), prefix)
    assert {k: getattr(got, k) for k in want} == want
    # Every setting but the drain timeout and the cool-down has a flag.
    assert {f.field for f in FLAGS} == {x.name for x in fields(CompactSettings)} - {
        "drain_timeout_s", "cooldown_s"}


@pytest.mark.parametrize(("prefix", "argv", "message"), [
    ("--mig-compact-", ["--mig-compact-steer-margin", "-1"],
     "--mig-compact-steer-margin -1: must be 0 or positive"),
    ("--compact-", ["--compact-max-pods", "0"], "--compact-max-pods 0: must be at least 1"),
    ("--mig-compact-", ["--mig-compact-steer-margin", "2", "--mig-compact-steer-keep", "3"],
     "--mig-compact-steer-keep 3: must be at most --mig-compact-steer-margin (2): fences "
     "stay up down to the keep, and go up at the margin"),
    ("--compact-", ["--compact-min-age", "-5"], "--compact-min-age -5.0: must be 0 or positive"),
])
def test_a_value_out_of_range_is_named(prefix: str, argv: list[str], message: str) -> None:
    assert compact_flag_error(parser(prefix).parse_args(argv), prefix) == message
