"""The README's simulation table and picture are the output of the command the README
shows (issue 36, item 3): the table's text equal, the picture drawn from the same data
by the same code (the PNG carries the hash of both: gpupack/render_day.py)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from gpupack.render_day import png_hash

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def readme_command() -> list[str]:
    text = README.read_text()
    found = re.findall(r"^<!-- simulate: [^\n]*-->\n```sh\n(.*?)\n```$", text, re.M | re.S)
    assert len(found) == 1, "README.md: one block marked 'simulate:' expected"
    return shlex.split(found[0])


def readme_table() -> list[str]:
    text = README.read_text()
    body = text.split("<!-- simulate-table:start -->\n", 1)[1].split(
        "<!-- simulate-table:end -->", 1)[0]
    return [line for line in body.splitlines() if line]


def test_readme_table_and_picture_are_the_commands_output(tmp_path: Path) -> None:
    cmd = readme_command()
    assert cmd[:2] == ["gpupack", "simulate"]
    out_at = cmd.index("--out") + 1
    shown = REPO / cmd[out_at] / "packing.png"  # where the README's picture comes from
    assert f"]({shown.relative_to(REPO)})" in README.read_text()
    cmd[out_at] = str(tmp_path)  # the same command, drawing elsewhere
    r = subprocess.run([sys.executable, "-m", "gpupack", *cmd[1:]], capture_output=True,
                       text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stderr
    printed = [line for line in r.stdout.splitlines()
               if line and not line.startswith("picture: ")]
    assert readme_table() == printed, (
        "README.md's table is not what `gpupack simulate` prints now; paste its output "
        "between the simulate-table markers")
    fresh = png_hash(tmp_path / "packing.png")
    assert fresh is not None
    assert png_hash(shown) == fresh, (
        f"{shown.relative_to(REPO)} is not what the command draws now: run "
        f"`{' '.join(readme_command())}` and commit the picture")
