#!/usr/bin/env bash
# Outside tools some tests drive for real: Prometheus and promtool (Debian's package) and
# helm + kubectl (tests/manifests/install-k8s-tools.sh). Idempotent; a tool that cannot be
# installed is reported, and the tests that need it skip saying so.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null) \
      || echo "install-tools: could not install prometheus" >&2
  else
    echo "install-tools: prometheus missing and apt-get (as root) unavailable" >&2
  fi
fi
if [ "$(id -u)" = 0 ]; then
  bash "$here/manifests/install-k8s-tools.sh" || echo "install-tools: could not install helm/kubectl" >&2
else
  mkdir -p "$HOME/.local/bin"
  bash "$here/manifests/install-k8s-tools.sh" "$HOME/.local/bin" \
    || echo "install-tools: could not install helm/kubectl" >&2
fi
exit 0
