"""``gpupack serve --plan-batch`` is checked like the other planner flags: 0 planned
nothing (every pod got the greedy answer for ever) and a negative value dropped pods off
the end of every batch (a slice), both silently."""

from __future__ import annotations

import argparse

import pytest

from gpupack.serve_cmd import add_arguments, check_args


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize("value, why", [
    ("64", None),
    ("1", None),
    ("0", "--plan-batch 0: must be at least 1"),
    ("-5", "--plan-batch -5: must be at least 1"),
])
def test_plan_batch_must_be_at_least_1(value: str, why: str | None) -> None:
    assert check_args(_args("--plan-batch", value)) == why
