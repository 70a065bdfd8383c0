"""Benchmark: the FGD paper's openb experiment through ``gpupack.openb_cmd``.

python bench/openb.py --pods ../shared/traces/openb/openb_pod_list_default.csv --seeds 10
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpupack.openb_cmd import main

if __name__ == "__main__":
    raise SystemExit(main())
