"""Print the shell block of README.md marked ``<!-- ci: NAME ... -->`` (the line before
its ```sh fence), so .ci/run runs the README's commands exactly as written.

    python3 .ci/readme_block.py install
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def block(name: str, text: str) -> str:
    pattern = rf"^<!-- ci: {re.escape(name)}\b[^\n]*-->\n```sh\n(.*?)^```$"
    found = re.findall(pattern, text, re.M | re.S)
    if len(found) != 1:
        raise SystemExit(f"README.md: expected one block marked 'ci: {name}', found "
                         f"{len(found)}")
    return str(found[0])


if __name__ == "__main__":
    sys.stdout.write(block(sys.argv[1], README.read_text()))
