"""The ``gpupack`` command: wiring only. Each subcommand's logic lives in its package.

Subcommand modules import their heavy dependencies (matplotlib for the pictures, the
extender and webhook stacks) inside ``run``, so ``gpupack --help`` and the server
commands start without them; the image ships without the ``[sim]`` extra.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from gpupack import (
    agent_cmd,
    defrag_cmd,
    explain_cmd,
    plan_cmd,
    serve_cmd,
    simulate_cmd,
    webhook_cmd,
)


def package_version() -> str:
    try:
        return version("gpupack")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpupack",
        description="GPU bin-packing for Kubernetes: MIG slices and time-sliced shares for "
        "small inference pods, whole GPUs and nodes kept free for LLM groups.",
    )
    parser.add_argument("--version", action="version", version=f"gpupack {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    plan_cmd.add_arguments(sub.add_parser("plan", help="where would the pending pods go?"))
    simulate_cmd.add_arguments(
        sub.add_parser("simulate", help="replay a scenario or the openb trace through policies")
    )
    agent_cmd.add_arguments(sub.add_parser("agent", help="node agent: GPU inventory via NVML"))
    serve_cmd.add_arguments(sub.add_parser("serve", help="kube-scheduler extender (HTTP)"))
    webhook_cmd.add_arguments(sub.add_parser("webhook", help="mutating admission webhook (HTTPS)"))
    explain_cmd.add_arguments(sub.add_parser("explain", help="what would the webhook do to a pod?"))
    defrag_cmd.add_arguments(sub.add_parser("defrag", help="evictions to let LLM groups in"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"] and ("--trace" in argv or "--trace=openb" in argv):
        return simulate_cmd.run_openb(argv[1:])
    args = build_parser().parse_args(argv)
    runner = {"plan": plan_cmd.run, "simulate": simulate_cmd.run, "agent": agent_cmd.run,
              "serve": serve_cmd.run, "webhook": webhook_cmd.run, "explain": explain_cmd.run}
    runner["defrag"] = defrag_cmd.run
    return runner[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
