"""A double of the GPU Operator's MIG manager for the end-to-end tests, run as the
cluster admin (it stands for the operator, not for gpupack).

It follows the protocol of ``reference/nvidia-gpu-stack.md``: for each Node whose label
``nvidia.com/mig.config`` names an entry and whose ``nvidia.com/mig.config.state`` is
absent (gpupack removes it with each request; the real manager reacts to any change of
the config label), it

0. looks the entry up in its *file*: the real manager reads the kubelet's copy of the
   ConfigMap, which lags the API by up to the kubelet's sync period; here the
   ConfigMap as it was ``--file-lag`` seconds ago (what it held when the double started
   counts as copied). An entry not there: state ``failed`` at once, as the real
   manager's validation does, with no ``pending``;
1. sets the state ``pending``;
2. waits ``--delay`` seconds (or the node's annotation ``e2e.gpupack.io/mig-delay``:
   slow on request);
3. fails on request (annotation ``e2e.gpupack.io/mig-fail: "true"``): state ``failed``,
   nothing changed;
4. otherwise applies the entry to its model of the node's GPUs (at first what the agent
   inventory says, else all whole; then what it applied before), as the device plugin
   and GPU Feature Discovery would show it: ``status.allocatable``/``capacity``
   (``nvidia.com/gpu`` for the whole GPUs, ``nvidia.com/mig-<profile>`` counts), the GFD
   labels ``nvidia.com/mig-<p>.count``, and the node agent's ``gpupack.io/inventory``
   (each instance at a valid start, from ``packing.mig.layout.layout_from_counts``);
5. half a second later sets the state ``success`` (the device plugin restarts before
   the manager reports success, so allocatable moves first).

    python mig_manager_double.py --kubeconfig K --namespace gpupack \
        --config-map gpupack-mig-parted-config [--delay 1.0]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

import yaml  # noqa: E402
from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from packing.catalog import match_product  # noqa: E402
from packing.inventory import GpuInventory, Inventory, decode_inventory, encode_inventory  # noqa: E402
from packing.mig.layout import layout_from_counts  # noqa: E402
from packing.model import GpuMode, MigInstance  # noqa: E402

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
FAIL = "e2e.gpupack.io/mig-fail"
DELAY = "e2e.gpupack.io/mig-delay"
INVENTORY = "gpupack.io/inventory"
log = logging.getLogger("mig-manager-double")

# node -> GPU index -> {profile: count} (MIG) or None (whole)
Layouts = dict[int, dict[str, int] | None]


class Double:
    def __init__(self, core: Any, namespace: str, name: str, delay: float,
                 file_lag: float = 0.0) -> None:
        self.core, self.namespace, self.name, self.delay = core, namespace, name, delay
        self.file_lag = file_lag
        # The ConfigMap's mig-configs as seen at each poll (when first seen, content);
        # the first sighting counts as copied long ago.
        self.seen: list[tuple[float, dict[str, Any]]] = []
        self.layouts: dict[str, Layouts] = {}
        self.busy: set[str] = set()
        self.lock = threading.Lock()
        self.applied = 0

    def read_config_map(self) -> None:
        """Record the ConfigMap's mig-configs if they changed since the last poll."""
        try:
            cm = self.core.read_namespaced_config_map(self.name, self.namespace)
            text = (cm.data or {}).get("config.yaml", "")
            configs = (yaml.safe_load(text) or {}).get("mig-configs") or {}
        except ApiException as e:
            if e.status != 404:
                raise
            configs = {}
        if not self.seen or self.seen[-1][1] != configs:
            self.seen.append((time.monotonic() if self.seen else -math.inf, configs))
        # Keep the newest content already in the file, and everything after it.
        cut = time.monotonic() - self.file_lag
        while len(self.seen) > 1 and self.seen[1][0] <= cut:
            self.seen.pop(0)

    def entry(self, config_name: str) -> list[dict[str, Any]] | None:
        """The entry in the manager's file: the newest content seen ``file_lag`` ago."""
        cut = time.monotonic() - self.file_lag
        in_file = [c for t, c in self.seen if t <= cut]
        found = in_file[-1].get(config_name) if in_file else None
        return list(found) if isinstance(found, list) else None

    def set_state(self, node: str, state: str) -> None:
        self.core.patch_node(node, {"metadata": {"labels": {STATE_LABEL: state}}})

    def poll(self) -> None:
        self.read_config_map()
        nodes = self.core.list_node(label_selector=CONFIG_LABEL).items
        for n in nodes:
            labels = n.metadata.labels or {}
            name = n.metadata.name
            if STATE_LABEL in labels or not labels.get(CONFIG_LABEL):
                continue
            with self.lock:
                if name in self.busy:
                    continue
                self.busy.add(name)
            threading.Thread(target=self.apply, args=(n,), daemon=True).start()

    def apply(self, n: Any) -> None:
        name = n.metadata.name
        try:
            self._apply(n)
        except Exception:
            log.exception("node %s", name)
        finally:
            with self.lock:
                self.busy.discard(name)

    def _apply(self, n: Any) -> None:
        name = n.metadata.name
        labels = n.metadata.labels or {}
        ann = n.metadata.annotations or {}
        wanted = labels[CONFIG_LABEL]
        entry = self.entry(wanted)
        if entry is None:
            log.info("node %s: %s failed (no such entry in the file)", name, wanted)
            self.set_state(name, "failed")
            return
        self.set_state(name, "pending")
        log.info("node %s: applying %s", name, wanted)
        time.sleep(float(ann.get(DELAY, self.delay)))
        if ann.get(FAIL) == "true":
            log.info("node %s: %s failed (on request)", name, wanted)
            self.set_state(name, "failed")
            return
        product = labels.get("nvidia.com/gpu.product", "")
        gpus = int(labels.get("nvidia.com/gpu.count", "0"))
        model = match_product(product)
        geom = model.mig
        assert geom is not None, product
        if name not in self.layouts:
            self.layouts[name] = initial_layouts(ann, gpus)
        layouts = self.layouts[name]
        for dev in entry:
            devices = range(gpus) if dev.get("devices") == "all" else dev["devices"]
            for i in devices:
                layouts[int(i)] = ({str(p): int(k) for p, k in
                                    (dev.get("mig-devices") or {}).items()}
                                   if dev.get("mig-enabled") else None)
        counts: dict[str, int] = {}
        inventory = []
        for i in range(gpus):
            lay = layouts.get(i)
            mig: tuple[MigInstance, ...] = ()
            if lay is not None:
                slots = layout_from_counts(geom, lay)
                assert slots is not None, lay
                mig = tuple(MigInstance(s.profile, s.start) for s in slots)
                for s in slots:
                    counts[s.profile] = counts.get(s.profile, 0) + 1
            inventory.append(GpuInventory(i, f"GPU-e2e-{name}-{i}", product, model.memory_mib,
                                          0, GpuMode.MIG if lay is not None else GpuMode.WHOLE,
                                          mig))
        whole = sum(1 for i in range(gpus) if layouts.get(i) is None)
        old = n.status.allocatable or {}
        resources: dict[str, Any] = {k: None for k in old if k.startswith("nvidia.com/mig-")}
        resources.update({f"nvidia.com/mig-{p}": str(k) for p, k in counts.items()})
        resources["nvidia.com/gpu"] = str(whole)
        self.core.patch_node_status(name, {"status": {"allocatable": resources,
                                                      "capacity": resources}})
        gfd: dict[str, Any] = {k: None for k in labels
                               if k.startswith("nvidia.com/mig-") and k.endswith(".count")}
        gfd.update({f"nvidia.com/mig-{p}.count": str(k) for p, k in counts.items()})
        inv = Inventory(name, int(time.time()), tuple(inventory))
        annotations = {INVENTORY: encode_inventory(inv)}
        self.core.patch_node(name, {"metadata": {"labels": gfd, "annotations": annotations}})
        time.sleep(0.5)
        self.set_state(name, "success")
        self.applied += 1
        log.info("node %s: %s applied (%s; %d whole GPUs)", name, wanted,
                 json.dumps(counts, sort_keys=True), whole)


def initial_layouts(ann: dict[str, str], gpus: int) -> Layouts:
    """The node's GPUs before the first change: the agent inventory's, else all whole."""
    out: Layouts = {i: None for i in range(gpus)}
    if INVENTORY in ann:
        for g in decode_inventory(ann[INVENTORY]).gpus:
            if g.mode is GpuMode.MIG:
                counts: dict[str, int] = {}
                for m in g.mig:
                    counts[m.profile] = counts.get(m.profile, 0) + 1
                out[g.index] = counts
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mig_manager_double.py")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--config-map", required=True)
    p.add_argument("--delay", type=float, default=1.0)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--file-lag", type=float, default=0.0,
                   help="seconds the manager's copy of the ConfigMap lags the API")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    core = client.CoreV1Api(config.new_client_from_config(config_file=args.kubeconfig))
    double = Double(core, args.namespace, args.config_map, args.delay, args.file_lag)
    log.info("watching nodes for %s (ConfigMap %s/%s)", CONFIG_LABEL, args.namespace,
             args.config_map)
    while True:
        try:
            double.poll()
        except Exception as e:  # the API server may be restarting (fault tests)
            log.warning("poll: %s", e)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
