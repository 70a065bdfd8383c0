#!/usr/bin/env bash
# Build the gpupack image without a container daemon: buildah (vfs storage, chroot
# isolation; run as root), from manifests/image/Dockerfile and its lock.
#
#   manifests/image/build.sh [--debian-base] [--wheels DIR] [--tag TAG] [--check]
#                            [--root DIR]
#
# --debian-base  make the base from Debian's own packages with mmdebstrap (bookworm:
#                python3, python3-venv, python-is-python3, ca-certificates) instead of
#                pulling the Dockerfile's pinned python:3.11 image, for where that
#                registry cannot be reached. The published build keeps the pinned base.
# --wheels DIR   download the lock's wheels (hashes checked) into DIR on this machine
#                and install from there with no index: for builds behind a proxy whose
#                CA the base image does not trust.
# --tag TAG      the image's name (default localhost/gpupack:dev).
# --check        then run, as the image's user (65532), `gpupack --version` and the
#                servers' imports, check that matplotlib is absent, and print the size.
# --root DIR     buildah's storage under DIR (default: buildah's own, /var/lib/containers).
#
# Needs: buildah, and mmdebstrap for --debian-base (Debian: apt-get install buildah
# mmdebstrap). Measured figures: docs/install.md, section 2.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
tag=localhost/gpupack:dev
debian=0
wheels=""
check=0
root=""
while [ $# -gt 0 ]; do
  case "$1" in
    --debian-base) debian=1 ;;
    --wheels) wheels="$2"; shift ;;
    --tag) tag="$2"; shift ;;
    --check) check=1 ;;
    --root) root="$2"; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$(id -u)" != 0 ]; then
  echo "build.sh: run as root (buildah's vfs storage and chroot isolation)" >&2; exit 2
fi
command -v buildah >/dev/null || { echo "build.sh: buildah is not installed" >&2; exit 2; }
B=(buildah --storage-driver vfs)
if [ -n "$root" ]; then
  B+=(--root "$root/storage" --runroot "$root/run")
fi
args=(--isolation chroot -f "$repo/manifests/image/Dockerfile" -t "$tag")

if [ "$debian" = 1 ]; then
  command -v mmdebstrap >/dev/null || { echo "build.sh: mmdebstrap is not installed" >&2; exit 2; }
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  # minbase: dpkg, apt and the essential packages; docs, man pages and locales left out.
  mmdebstrap --variant=minbase --quiet \
    --include=python3,python3-venv,python-is-python3,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    bookworm "$work/base.tar" http://deb.debian.org/debian
  base=localhost/gpupack-base:bookworm
  ctr="$("${B[@]}" from scratch)"
  "${B[@]}" add "$ctr" "$work/base.tar" / >/dev/null
  "${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
  "${B[@]}" commit -q "$ctr" "$base" >/dev/null
  "${B[@]}" rm "$ctr" >/dev/null
  args+=(--build-arg "PYTHON_IMAGE=$base")
fi

if [ -n "$wheels" ]; then
  mkdir -p "$wheels"
  wheels="$(cd "$wheels" && pwd)"
  py="${PYTHON:-python3}"
  "$py" -m pip download --quiet --require-hashes --only-binary=:all: --no-deps \
    -r "$repo/manifests/image/requirements.lock" -d "$wheels"
  # gpupack's own build backend (pyproject.toml's build-system).
  "$py" -m pip download --quiet --only-binary=:all: "setuptools>=68" wheel -d "$wheels"
  args+=(--volume "$wheels:/wheels:ro" --build-arg WHEELS=/wheels)
fi

(cd "$repo" && "${B[@]}" bud "${args[@]}" .)

if [ "$check" = 1 ]; then
  ctr="$("${B[@]}" from -q "$tag")"
  run=("${B[@]}" run --isolation chroot --user 65532:65532 "$ctr" --)
  "${run[@]}" gpupack --version
  # Every module of the servers' packages, and the three server commands.
  "${run[@]}" python -c '
import importlib, os, pkgutil
n = 0
for pkg in ("scheduler", "webhook", "nodeagent", "kube", "serving"):
    for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
        importlib.import_module(info.name)
        n += 1
for cmd in ("serve_cmd", "webhook_cmd", "agent_cmd"):
    importlib.import_module("gpupack." + cmd)
print(f"servers import as uid {os.getuid()} ({n} modules)")'
  if "${run[@]}" python -c 'import matplotlib' 2>/dev/null; then
    echo "build.sh: matplotlib is in the image; it must not be (the [sim] extra)" >&2
    exit 1
  fi
  "${B[@]}" rm "$ctr" >/dev/null
  echo "image $tag: $("${B[@]}" images --format '{{.Size}}' "$tag")"
fi
