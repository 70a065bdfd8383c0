#!/usr/bin/env bash
# Read-only check of the node agent against a real GPU.
#
# Runs one inventory (`gpupack agent --once --no-patch`: no Node patch, no metrics
# server) and prints it next to what nvidia-smi reports, then compares the GPU UUIDs and
# MIG layouts. Only read-only nvidia-smi queries are used: never `-mig`, `mig -cgi/-dgi`,
# `-r` or anything else that changes MIG mode, instances or resets a GPU.
#
# Usage: bench/agent_device_check.sh [extra agent flags, e.g. --podresources-socket PATH]
# Exit status: 0 when the agent ran and agrees with nvidia-smi, 1 otherwise.
set -uo pipefail

cd "$(dirname "$0")/.."
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

section() { printf '\n===== %s =====\n' "$1"; }

if command -v nvidia-smi >/dev/null 2>&1; then
    section "nvidia-smi -L"
    nvidia-smi -L | tee "$out/smi-L.txt"
    section "nvidia-smi --query-gpu"
    nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,mig.mode.current,mig.mode.pending \
        --format=csv
    section "nvidia-smi mig -lgi (GPU instances)"
    nvidia-smi mig -lgi 2>&1 | tee "$out/smi-lgi.txt" || true
    section "nvidia-smi mig -lci (compute instances)"
    nvidia-smi mig -lci 2>&1 || true
    section "nvidia-smi --query-compute-apps"
    nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv 2>&1 || true
else
    echo "nvidia-smi not found; running the agent anyway" >&2
    : >"$out/smi-L.txt"
    : >"$out/smi-lgi.txt"
fi

section "gpupack agent --once --no-patch"
export NODE_NAME="${NODE_NAME:-$(hostname)}"
if command -v gpupack >/dev/null 2>&1 && gpupack agent --help >/dev/null 2>&1; then
    agent=(gpupack agent)
else
    agent=(python -m gpupack.agent_cmd)
fi
if ! timeout 120 "${agent[@]}" --once --no-patch "$@" >"$out/inventory.json" \
        2>"$out/agent.log"; then
    echo "agent failed:" >&2
    cat "$out/agent.log" >&2
    exit 1
fi
cat "$out/inventory.json"
section "agent log"
cat "$out/agent.log"

section "comparison"
python - "$out/inventory.json" "$out/smi-L.txt" "$out/smi-lgi.txt" <<'PY'
import json
import re
import sys

from packing.inventory import from_wire

inv = from_wire(json.load(open(sys.argv[1])))
smi_l = open(sys.argv[2]).read()
lgi = open(sys.argv[3]).read()
ok = True

smi_uuids = re.findall(r"\(UUID: (GPU-[0-9a-fA-F-]+)\)", smi_l)
agent_uuids = [g.uuid for g in inv.gpus]
print("GPU UUIDs  nvidia-smi:", smi_uuids)
print("GPU UUIDs  agent:     ", agent_uuids)
if smi_uuids and sorted(smi_uuids) != sorted(agent_uuids):
    ok = False
    print("MISMATCH: GPU UUIDs differ")

# `nvidia-smi mig -lgi` table rows: | GPU  Name  Profile-ID  Instance-ID  Placement(start:size) |
smi_layout = sorted(
    (int(gpu), name, int(start))
    for gpu, name, start in re.findall(
        r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+\d+\s+\d+\s+(\d+):\d+\s+\|", lgi, flags=re.M))
agent_layout = sorted((g.index, m.profile, m.start) for g in inv.gpus for m in g.mig)
print("MIG layout nvidia-smi:", smi_layout)
print("MIG layout agent:     ", agent_layout)
if smi_layout and smi_layout != agent_layout:
    ok = False
    print("MISMATCH: MIG layouts differ (profile names are derived from slices and memory)")

if not inv.gpus:
    ok = False
    print("NO GPU: the agent reported no GPU (see its errors)")
print("errors reported by the agent:", list(inv.errors))
print("RESULT:", "OK" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
PY
