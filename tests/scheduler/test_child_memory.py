"""What the warm and solver children cost in memory (issue 17 item 6): the warm child
never loads OR-Tools or pandas (with numpy, ~75 MiB a process; numpy alone it needs: the
placement score is numpy array math, see packing.policies.lookahead), and the solver child
gives freed C-heap memory back after each solve."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_warm_child_builds_its_scorer_without_or_tools() -> None:
    loaded = _run("""
        import sys
        from multiprocessing import Pipe
        from scheduler.memo.loop import _WarmHandler
        from scheduler.planner.solve import pickle_chunks
        from packing.model import PodRequest, Placement, RequestKind
        running = [(PodRequest("a/p", 1000, 1024, RequestKind.WHOLE, gpu_count=1),
                    Placement("a/p", "n", (0,)))]
        _WarmHandler()(("scorer", 1, "gpupack", pickle_chunks(running), pickle_chunks([]),
                        None, ()))
        print(sorted(m for m in ("ortools", "numpy", "pandas") if m in sys.modules))
    """)
    assert loaded == "['numpy']"


def test_a_solve_still_loads_or_tools_where_it_solves() -> None:
    loaded = _run("""
        import sys
        from packing.cpsat import SolverParams, solve_batch
        from packing.model import GpuInfo, NodeInfo, PodRequest, RequestKind, Snapshot
        from packing.state import ClusterState
        node = NodeInfo("n", 8000, 65536, (GpuInfo(0, "H100-80GB", 81920),))
        pod = PodRequest("a/p", 1000, 1024, RequestKind.WHOLE, gpu_count=1)
        r = solve_batch(ClusterState(Snapshot((node,))), [pod], params=SolverParams())
        print(r.status, "ortools" in sys.modules)
    """)
    assert loaded.split()[1] == "True" and loaded.split()[0] in ("OPTIMAL", "FEASIBLE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim")
def test_give_back_memory_returns_freed_heap_pages() -> None:
    # 150,000 blocks of 2 kB (glibc heap, not mmap), every 64th kept: the freed pages
    # between the survivors stay in the process until they are trimmed.
    out = _run("""
        from pathlib import Path
        from scheduler.child import give_back_memory
        def rss():
            return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20
        blocks = [bytes(2048) + bytes([i % 256]) for i in range(150_000)]
        kept = blocks[::64]
        del blocks
        before = rss()
        give_back_memory()
        print(before, rss(), len(kept))
    """)
    before, after, _ = (float(x) for x in out.split())
    assert before - after > 100, (before, after)


def test_a_spawned_child_does_not_import_the_parents_main_script(tmp_path: Path) -> None:
    # The main script imports a module nothing else does; spawn would run the script
    # again in the child (as __mp_main__) and import it there too.
    script = tmp_path / "main_script.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tests" / "scheduler")!r}]
        import xml.dom.minidom  # only the main script imports this
        from child_probe import report_modules
        from scheduler.child import ChildProcess

        if __name__ == "__main__":
            child = ChildProcess(report_modules, "probe")
            try:
                print(child.request(["xml.dom.minidom", "child_probe"], 60))
            finally:
                child.close()
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['child_probe']"
