"""Benchmark: the FGD paper's openb experiment through ``gpupack.openb_cmd``.

python bench/openb.py --pods default --seeds 10   (a trace shipped in sim/openb/data, or a CSV path)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpupack.openb_cmd import main

if __name__ == "__main__":
    raise SystemExit(main())
