"""The ``gpupack`` command: wiring only. Each subcommand's logic lives in its package.

Subcommand modules are imported only when their subcommand runs (or asks for its own
``--help``): ``gpupack --version`` and ``gpupack --help`` load argparse and nothing of
the solver, Kubernetes, web or plotting stacks, so they answer in well under 0.3 s
(``tests/cli/test_cli_start.py`` checks the import graph, ``bench/cli_start.py`` times
it). Inside a subcommand, heavy dependencies (matplotlib for the pictures, the
extender and webhook stacks) are imported by that subcommand alone; the image ships
without the ``[sim]`` extra.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

# name -> (module with add_arguments(parser) and run(args), one line of help).
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("gpupack.plan_cmd", "where would the pending pods go?"),
    "simulate": ("gpupack.simulate_cmd",
                 "replay a day, your cluster or the openb trace through policies"),
    "agent": ("gpupack.agent_cmd", "node agent: GPU inventory via NVML"),
    "serve": ("gpupack.serve_cmd", "kube-scheduler extender (HTTP)"),
    "webhook": ("gpupack.webhook_cmd", "mutating admission webhook (HTTPS)"),
    "explain": ("gpupack.explain_cmd", "what would the webhook do to a pod?"),
    "defrag": ("gpupack.defrag_cmd", "evictions to let LLM groups in"),
}


def package_version() -> str:
    # importlib.metadata is imported here: only --version needs it.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpupack")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


class _Version(argparse.Action):
    """``--version`` that reads the installed version only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(f"gpupack {package_version()}")
        parser.exit()


def _module(command: str) -> ModuleType:
    return importlib.import_module(COMMANDS[command][0])


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``only``, the options of that subcommand alone are added
    (the others are listed, with their help line, but their modules not imported)."""
    parser = argparse.ArgumentParser(
        prog="gpupack",
        description="GPU bin-packing for Kubernetes: MIG slices and time-sliced shares for "
        "small inference pods, whole GPUs and nodes kept free for LLM groups.",
    )
    parser.add_argument("--version", action=_Version, help="show the installed version")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, text) in COMMANDS.items():
        sp = sub.add_parser(name, help=text)
        if only is None or only == name:
            _module(name).add_arguments(sp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"] and ("--trace" in argv or "--trace=openb" in argv):
        from gpupack import simulate_cmd

        return simulate_cmd.run_openb(argv[1:])
    # The subcommand is the first word that is not an option (the top level has only
    # --help and --version, which take no value); an unknown one imports nothing and
    # argparse names the choices.
    command = next((a for a in argv if not a.startswith("-")), "")
    args = build_parser(only=command).parse_args(argv)
    result: int = _module(args.command).run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
