"""Agreement of gpupack's DRA allocator model with kube-scheduler v1.37.2 on the real
control plane, at any size: the differential run of tests/e2e/dra_differential.py.

    python bench/dra_agreement.py [--nodes 22] [--claims 300] [--seed S] [--format json]
    python bench/dra_agreement.py --dir /tmp/cp ...   # a stack already up there

Prints ``{"agreement": {"claims": c, "same_device": s, "allocated": a, ...}}`` (JSON) or
a line per figure: ``claims`` counts every claim of every settled pod, ``allocated`` the
claims kube-scheduler allocated, ``same_device`` those whose predicted devices are
exactly the allocated ones; ``agree_pods``/``pods`` also counts the pods predicted not to
fit (or to make the scheduler fail) that did not. Mismatches are listed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO))

import controlplane  # noqa: E402
import dra_differential  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=22)
    p.add_argument("--claims", type=int, default=300,
                   help="run until this many claims were allocated (default 300)")
    p.add_argument("--seed", type=int, default=20261206)
    p.add_argument("--release", type=float, default=0.35,
                   help="share of the bound pods deleted after each batch (default 0.35)")
    p.add_argument("--dir", type=Path, default=None,
                   help="a stack folder: reuse the stack running there, else start one")
    p.add_argument("--format", choices=["table", "json"], default="table")
    args = p.parse_args(argv)

    base = args.dir or Path(tempfile.mkdtemp(prefix="gpupack-dra-agreement-"))
    reuse = controlplane.Stack(base.resolve())
    started = not (reuse.state_file.exists() and reuse.alive("apiserver"))
    stack = controlplane.up(base, agent=False, standby=False) if started else reuse
    log = (lambda _m: None) if args.format == "json" else print
    try:
        admin = controlplane._api(stack.kubeconfig)
        ns = f"dra-agreement-{args.seed}"
        controlplane.ensure_namespace(admin, ns)
        prefix = f"dra-{args.seed}"
        with controlplane.claim_controller(stack):
            try:
                report = dra_differential.run(admin, ns, prefix=prefix, nodes=args.nodes,
                                              claims=args.claims, seed=args.seed,
                                              release=args.release, log=log)
            finally:
                dra_differential.cleanup(admin, ns, prefix)
    finally:
        if started:
            stack.down()
    out = {"agreement": report.as_json()}
    if args.format == "json":
        print(json.dumps(out, indent=1))
    else:
        for k, v in out["agreement"].items():
            print(f"{k}: {v}")
    return 0 if not report.mismatches else 1


if __name__ == "__main__":
    sys.exit(main())
