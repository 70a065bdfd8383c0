"""How long ``gpupack --version`` and ``gpupack --help`` take, against Python's own start.

    python bench/cli_start.py [--runs 20] [--format json]

Each command runs ``--runs`` times in a fresh process (the installed ``gpupack`` entry
point of this environment); the figures are the median and the slowest wall time, and
the median minus the median of ``python -c pass`` (the interpreter's own start, measured
in the same run): what the command adds. Issue 36 asks for under 0.3 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time


def timed(cmd: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--format", choices=["table", "json"], default="table")
    args = ap.parse_args()
    exe = shutil.which("gpupack")
    if exe is None:
        print("bench/cli_start.py: no gpupack on PATH (pip install -e . first)", file=sys.stderr)
        return 2
    cases = {"python -c pass": [sys.executable, "-c", "pass"],
             "gpupack --version": [exe, "--version"],
             "gpupack --help": [exe, "--help"]}
    rows = {name: timed(cmd, args.runs) for name, cmd in cases.items()}
    base = statistics.median(rows["python -c pass"])
    result = {name: {"median_s": round(statistics.median(t), 4), "max_s": round(max(t), 4),
                     "over_python_s": round(statistics.median(t) - base, 4)}
              for name, t in rows.items()}
    if args.format == "json":
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'command':20} {'median s':>9} {'max s':>7} {'over python s':>14}")
    for name, r in result.items():
        print(f"{name:20} {r['median_s']:9.3f} {r['max_s']:7.3f} {r['over_python_s']:14.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
