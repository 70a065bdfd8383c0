"""The MIG actuator's Kubernetes I/O: the mig-parted ConfigMap, the Node label that asks
the GPU Operator's MIG manager for a layout, and Events on the Node.

Protocol (``reference/nvidia-gpu-stack.md``): the MIG manager applies, on a node, the
entry of its mig-parted config named by the node label ``nvidia.com/mig.config`` and
reports progress in ``nvidia.com/mig.config.state`` (pending, rebooting, success,
failed). gpupack keeps its entries in a ConfigMap of its own (default
``gpupack-mig-parted-config``), which the GPU Operator is configured to read
(ClusterPolicy ``migManager.config.name``; docs/mig.md):

* ``data["config.yaml"]``: the mig-parted config, ``version: v1`` and ``mig-configs``
  (written as JSON, which is YAML). Entries gpupack did not write are kept as they are;
  gpupack's own (``gpupack-<hash>``) are kept while a node's label names them (the MIG
  manager applies its node's entry again when its pod restarts) and dropped otherwise.
  The manager reads a file the kubelet copies from the ConfigMap at its own sync, not
  the API: a new entry reaches it only later, so the node label follows the entry by
  ``MigSettings.config_propagation_s`` (``scheduler.mig.decide``).
* ``data["gpupack-changes.json"]``: the changes in flight (``scheduler.mig.decide``
  ``Change``), so a new leader follows what the last one started.

Every write is a read-modify-write with the read's resourceVersion (409: read again and
redo), although only the leader writes. Node labels go in a JSON merge patch that also
removes a stale ``nvidia.com/mig.config.state`` (the MIG manager sets it afresh); the
outcome of each change is noted in the Node annotation ``gpupack.io/mig-change``. Events
are core/v1 Events in namespace ``default`` about the Node, as the kubelet's are.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("gpupack.kube.mig")

CONFIG_KEY = "config.yaml"
CHANGES_KEY = "gpupack-changes.json"
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
EVENT_NAMESPACE = "default"
COMPONENT = "gpupack-mig-actuator"
OWN_PREFIX = "gpupack-"
CHANGE_ANNOTATION = "gpupack.io/mig-change"


class MigConfigError(ValueError):
    """The ConfigMap holds something that is not a mig-parted config; names the field."""


def parse_config(text: str | None) -> dict[str, Any]:
    """The mig-parted config in ``text`` (YAML or JSON); an empty one when absent."""
    if not text or not text.strip():
        return {"version": "v1", "mig-configs": {}}
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        try:
            import yaml

            raw = yaml.safe_load(text)
        except Exception as e:
            raise MigConfigError(f"data[{CONFIG_KEY!r}]: not YAML or JSON ({e})") from None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("mig-configs", {}), Mapping):
        raise MigConfigError(f"data[{CONFIG_KEY!r}]: expected an object with mig-configs")
    odd = [k for k in (raw.get("mig-configs") or {}) if not isinstance(k, str)]
    if odd:
        raise MigConfigError(f"data[{CONFIG_KEY!r}].mig-configs: entry name {odd[0]!r} is "
                             "not text")
    return {"version": raw.get("version", "v1"), "mig-configs": dict(raw.get("mig-configs") or {})}


def merged_config(current: Mapping[str, Any], add: Mapping[str, Any],
                  referenced: set[str] | None) -> dict[str, Any]:
    """``current`` with the entries of ``add`` put in, and gpupack's own entries that no
    node label (``referenced``) names and ``add`` does not bring dropped (None: none
    dropped, some node's label is not known)."""
    configs = {k: v for k, v in dict(current.get("mig-configs") or {}).items()
               if not str(k).startswith(OWN_PREFIX) or referenced is None or k in referenced}
    configs.update(add)
    return {"version": "v1", "mig-configs": dict(sorted(configs.items()))}


class MigApi:
    """The ConfigMap, Node labels and Events through the ``kubernetes`` client."""

    def __init__(self, api_client: Any, namespace: str, name: str,
                 clock: Callable[[], float] = time.time) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.clock = clock

    def read(self) -> tuple[dict[str, Any] | MigConfigError, str, str | None]:
        """(mig-parted config, or why it cannot be read; in-flight changes text;
        resourceVersion or None if absent). A config that cannot be read does not hide
        the changes in flight: a new leader still follows them."""
        from kubernetes.client.exceptions import ApiException

        try:
            cm = self.core.read_namespaced_config_map(self.name, self.namespace,
                                                      _request_timeout=10)
        except ApiException as e:
            if e.status == 404:
                return parse_config(None), "", None
            raise
        data = cm.data or {}
        rv = cm.metadata.resource_version if cm.metadata is not None else None
        config: dict[str, Any] | MigConfigError
        try:
            config = parse_config(data.get(CONFIG_KEY))
        except MigConfigError as e:
            config = e
        return config, data.get(CHANGES_KEY, ""), rv

    def write(self, update: Callable[[dict[str, Any], str], tuple[dict[str, Any], str]]
              ) -> None:
        """Read, apply ``update(config, changes) -> (config, changes)``, write back with
        the read's resourceVersion; on a conflict read again (3 tries)."""
        from kubernetes.client.exceptions import ApiException

        for attempt in range(3):
            read, changes, rv = self.read()
            if isinstance(read, MigConfigError):
                raise read  # never overwrite entries someone else wrote and we cannot read
            config, changes = update(read, changes)
            body: Any = {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/managed-by": "gpupack",
                                        "app.kubernetes.io/component": "mig-actuator"}},
                # default=str: a value YAML read as a date is written back as text.
                "data": {CONFIG_KEY: json.dumps(config, indent=1, sort_keys=True,
                                                default=str) + "\n",
                         CHANGES_KEY: changes}}
            try:
                if rv is None:
                    self.core.create_namespaced_config_map(self.namespace, body,
                                                           _request_timeout=10)
                else:
                    body["metadata"]["resourceVersion"] = rv
                    self.core.replace_namespaced_config_map(self.name, self.namespace, body,
                                                            _request_timeout=10)
                return
            except ApiException as e:
                if e.status not in (409,) or attempt == 2:
                    raise
                log.info("ConfigMap %s/%s changed meanwhile; read again", self.namespace,
                         self.name)

    def label_node(self, node: str, config: str) -> None:
        """Ask the MIG manager for entry ``config`` on ``node``."""
        self.core.patch_node(node, {"metadata": {"labels": {CONFIG_LABEL: config,
                                                            STATE_LABEL: None}}},
                             _request_timeout=10)

    def note_node(self, node: str, text: str) -> None:
        """Say the last change's outcome on the Node (annotation ``gpupack.io/mig-change``).
        Also a Node update: kube-scheduler retries the pods it rejected while the GPUs
        were held, at once rather than after its unschedulable-pod timeout."""
        self.core.patch_node(node, {"metadata": {"annotations": {CHANGE_ANNOTATION: text}}},
                             _request_timeout=10)

    def event(self, node: str, reason: str, message: str, warning: bool = False) -> None:
        """A core/v1 Event about ``node`` (best effort: a failure is logged)."""
        now = self.clock()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        body: Any = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{node}.{uuid.uuid4().hex[:16]}",
                         "namespace": EVENT_NAMESPACE},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
            "reason": reason, "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT, "reportingInstance": COMPONENT,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        try:
            self.core.create_namespaced_event(EVENT_NAMESPACE, body, _request_timeout=10)
        except Exception as e:
            log.warning("event %s on node %s not recorded: %s", reason, node, e)


def config_names_in_use(labels_by_node: Mapping[str, Mapping[str, str]]) -> set[str]:
    return {v for labels in labels_by_node.values()
            if (v := labels.get(CONFIG_LABEL)) is not None}
