#!/usr/bin/env bash
# The real control plane on loopback for gpupack (etcd, kube-apiserver, kube-scheduler
# built from their Go modules by build.sh; gpupack serve, webhook and node agent).
#
#   control-plane.sh up DIR                  start everything; DIR/kubeconfig is cluster admin
#   control-plane.sh down DIR                stop exactly what up started, by pid
#   control-plane.sh restart DIR COMPONENT   restart one component and wait until ready
#   control-plane.sh kill DIR COMPONENT      SIGKILL one component
#   control-plane.sh start|stop DIR COMPONENT
#
# COMPONENT: etcd apiserver webhook extender scheduler extender-b scheduler-b
# plain-scheduler node-agent (the -b pair is the standby replica).
# Logs in DIR/logs/, pids in DIR/pids/. See controlplane.py and docs/e2e.md.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
exec python3 "$here/controlplane.py" "$@"
