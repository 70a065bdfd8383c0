#!/usr/bin/env bash
# Outside tools some tests drive for real: Prometheus and promtool (Debian's package),
# buildah and mmdebstrap (Debian's packages, for the image test: no daemon) and helm +
# kubectl (tests/manifests/install-k8s-tools.sh). Idempotent; a tool that cannot be
# installed is reported, and the tests that need it skip saying so.
#
# The tests start Prometheus themselves. Debian's package would also start and enable
# prometheus (and, through Recommends, prometheus-node-exporter) as system services, so
# the install runs without recommends and under a policy-rc.d that forbids starting
# services, and both units are then disabled and stopped: the host is left with the
# binaries only, no daemon running or enabled (tests/manifests/test_manifests_install_tools.py).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
units=(prometheus prometheus-node-exporter)
policy="${GPUPACK_POLICY_RC_D:-/usr/sbin/policy-rc.d}"

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# No unit of $units enabled (systemd or sysv) or running, however it was installed.
quiet_services() {
  local unit
  for unit in "${units[@]}"; do
    installed "$unit" || continue
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
      systemctl disable --now "$unit.service" >/dev/null 2>&1 || true
    else
      # No running systemd (a container, a chroot): remove the enablement links the
      # package made, so a later boot does not start it, and stop a sysv instance.
      if command -v deb-systemd-helper >/dev/null 2>&1; then
        deb-systemd-helper disable "$unit.service" >/dev/null 2>&1 || true
      fi
      if [ -x "/etc/init.d/$unit" ]; then
        "/etc/init.d/$unit" stop >/dev/null 2>&1 || true
      fi
    fi
    if command -v update-rc.d >/dev/null 2>&1 && [ -e "/etc/init.d/$unit" ]; then
      update-rc.d "$unit" disable >/dev/null 2>&1 || true
    fi
  done
}

install_prometheus() {
  local own_policy=""
  if [ ! -e "$policy" ]; then
    # invoke-rc.d and deb-systemd-invoke ask this script; 101 = "action forbidden".
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 0755 "$policy" && own_policy=1
  fi
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends prometheus >/dev/null) \
    || echo "install-tools: could not install prometheus" >&2
  if [ -n "$own_policy" ]; then rm -f "$policy"; fi
}

if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    install_prometheus
  else
    echo "install-tools: prometheus missing and apt-get (as root) unavailable" >&2
  fi
fi
if [ "$(id -u)" = 0 ] && command -v dpkg-query >/dev/null 2>&1; then
  quiet_services
fi
# tests/manifests/test_image_build.py builds the image with buildah (vfs, chroot
# isolation: no runtime, no daemon) on a base mmdebstrap makes; neither starts a service.
if ! command -v buildah >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends buildah mmdebstrap >/dev/null) \
      || echo "install-tools: could not install buildah and mmdebstrap" >&2
  else
    echo "install-tools: buildah/mmdebstrap missing and apt-get (as root) unavailable" >&2
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
