#!/usr/bin/env bash
# Build the real etcd, kube-apiserver, kube-scheduler and kube-controller-manager from their Go modules into a
# cache folder keyed by their versions and the Go toolchain; a second run with the same
# versions does nothing; a binary missing from the cache is built alone. Prints the folder holding the binaries on its last line.
#
#   tests/e2e/build.sh            build (or find) the binaries
#   GPUPACK_E2E_CACHE=DIR ...     cache root (default ~/.cache/gpupack-e2e)
#
# kube-apiserver, kube-scheduler and kube-controller-manager come from k8s.io/kubernetes (this folder's go.mod,
# one replace per staging module); etcd from go.etcd.io/etcd/server/v3 in ./etcd, a
# module of its own (see its go.mod for why).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
k8s_version="$(sed -n 's/^\(require\)\{0,1\}[[:space:]]*k8s\.io\/kubernetes \(v[0-9.]*\)$/\2/p' "$here/go.mod" | head -1)"
etcd_version="$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/server/v3" {print $3; exit}' "$here/etcd/go.mod")"
go_min="$(awk '$1 == "go" {print $2; exit}' "$here/go.mod")"
if ! command -v go >/dev/null 2>&1; then
    echo "build.sh: Go is not installed (need go >= $go_min)" >&2
    exit 3
fi
# Go selects a newer toolchain itself (GOTOOLCHAIN=auto through the module proxy) when
# the module's go line asks for more than the local Go has.
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
go_version="$(cd "$here" && go env GOVERSION)"
root="${GPUPACK_E2E_CACHE:-$HOME/.cache/gpupack-e2e}"
out="$root/k8s-$k8s_version-etcd-$etcd_version-$go_version"
bins=(etcd kube-apiserver kube-scheduler kube-controller-manager)
missing=()
for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || missing+=("$b"); done
if [[ ${#missing[@]} == 0 ]]; then
    echo "$out"
    exit 0
fi
# Only the missing binaries are built; the ones already in the cache are kept (a new
# binary added to the list costs its own build, not a rebuild of the others).
mkdir -p "$out"
start=$(date +%s)
ldflags="-s -w"
echo "build.sh: building ${missing[*]} (etcd $etcd_version, Kubernetes $k8s_version) with $go_version into $out" >&2
for b in "${missing[@]}"; do
    if [[ $b == etcd ]]; then
        (cd "$here/etcd" && go build -trimpath -ldflags "$ldflags" -o "$out/$b.tmp" go.etcd.io/etcd/server/v3)
    else
        (cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b")
    fi
    mv "$out/$b.tmp" "$out/$b"
done
echo "build.sh: built in $(( $(date +%s) - start )) s; $(du -sh "$out" | cut -f1) in $out" >&2
echo "$out"
