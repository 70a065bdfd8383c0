#!/usr/bin/env bash
# Regenerate requirements.lock: the server's dependencies (pyproject's [project]
# dependencies, no extras) pinned with hashes, for every platform the image is built for.
# Needs uv (python3 -m pip install uv). Run from anywhere.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$here/requirements.lock"
{
  echo "# Server dependencies of the gpupack image, pinned with hashes for linux/amd64 and"
  echo "# linux/arm64 (universal). Generated from pyproject.toml by manifests/image/lock.sh;"
  echo "# regenerate after changing [project].dependencies."
  uv pip compile "$root/pyproject.toml" --universal --python-version 3.11 --generate-hashes \
    --no-header --quiet -o -
} > "$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $out"
