"""The node agent loop: read NVML and PodResources, build the inventory, export
metrics, and patch the Node annotation when it changed meaningfully (rate-limited).

Everything with a side effect is injected (GPU reader, PodResources source, pid -> pod
lookup, pod-name lookup, patch function, clock), so the loop's decisions are tested with
fakes and a fake clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kube.inventory_age import DEFAULT_REFRESH_S
from nodeagent.cgroups import CgroupOwner
from nodeagent.growth import GrowthParams
from nodeagent.metrics import AgentMetrics
from nodeagent.nvml import GpuReader, GpuSnapshot
from nodeagent.podresources import PodResourcesView
from nodeagent.report import (
    Report,
    UsageHistory,
    attribute_memory,
    build_inventory,
    index_ids,
)
from packing.inventory import (
    INVENTORY_ANNOTATION,
    Inventory,
    encode_inventory,
    meaningfully_changed,
)
from packing.model import is_pod_key

log = logging.getLogger(__name__)

Clock = Callable[[], float]
PatchFn = Callable[[Mapping[str, str | None]], None]


class PodResourcesSource(Protocol):
    def read(self) -> PodResourcesView: ...


@dataclass(frozen=True)
class AgentConfig:
    node: str
    min_patch_interval_s: float = 30.0
    mem_tolerance_mib: int = 512
    # An unchanged inventory is written again this long after the last write, so its
    # ``ts`` tells the extender the agent works (it stops trusting one older than its
    # --inventory-max-age, 15 minutes by default). 0: written only on change.
    refresh_s: float = DEFAULT_REFRESH_S
    # How often the UID -> name map may be refetched when an unknown pod UID shows up.
    pod_names_refresh_s: float = 30.0


class PodNameCache:
    """Pod UID -> ``namespace/name``, refetched only when a UID is missing, and then at
    most every ``refresh_s``: listing a node's pods every interval on every node would
    be a steady load on the API server for names that rarely change."""

    def __init__(self, fetch: Callable[[], Mapping[str, str]] | None, clock: Clock,
                 refresh_s: float) -> None:
        self._fetch = fetch
        self._clock = clock
        self._refresh_s = refresh_s
        self._names: dict[str, str] = {}
        self._fetched_at: float | None = None

    @property
    def names(self) -> Mapping[str, str]:
        return self._names

    def refresh_if_missing(self, uids: set[str]) -> bool:
        if self._fetch is None or not uids:
            return False
        now = self._clock()
        if self._fetched_at is not None and now - self._fetched_at < self._refresh_s:
            return False
        self._fetched_at = now
        try:
            fetched = dict(self._fetch())
        except Exception as e:  # an API hiccup must not stop GPU reporting
            log.warning("listing pods of the node failed: %s", e)
            return False
        self._names = usable_names(fetched)
        return True


def usable_names(fetched: Mapping[Any, object]) -> dict[str, str]:
    """The UID -> pod key entries that can be published; the others are logged (one
    bad key would make the whole inventory undecodable). Their pods are then named by
    PodResources, as if the API had not listed them."""
    out: dict[str, str] = {}
    for uid, key in fetched.items():
        if isinstance(uid, str) and is_pod_key(key):
            out[uid] = key
        else:
            log.warning("pod list: uid %.60r -> %.80r is not a namespace/name pod key; "
                        "ignored", uid, key)
    return out


@dataclass(frozen=True)
class TickResult:
    report: Report
    patched: bool
    reason: str  # why it did or did not patch


class Agent:
    def __init__(self, config: AgentConfig, gpus: GpuReader, podresources: PodResourcesSource,
                 pod_of_pid: Callable[[int], CgroupOwner | None], clock: Clock,
                 metrics: AgentMetrics | None = None, patch: PatchFn | None = None,
                 pod_names: Callable[[], Mapping[str, str]] | None = None,
                 growth: GrowthParams | None = None, monotonic: Clock | None = None) -> None:
        self.config = config
        self.gpus = gpus
        self.podresources = podresources
        self.pod_of_pid = pod_of_pid
        self.clock = clock  # wall clock: the inventory's timestamp
        # Pacing, the patch rate limit, the name refresh and the growth history use a
        # clock that never steps back: with the wall clock, an NTP step of an hour back
        # made the loop sleep an hour and rate-limited every patch meanwhile, and hid a
        # pod's memory growth behind samples "from the future".
        self.monotonic = monotonic if monotonic is not None else clock
        self.metrics = metrics if metrics is not None else AgentMetrics()
        self.patch = patch
        self.names = PodNameCache(pod_names, self.monotonic, config.pod_names_refresh_s)
        self.history = UsageHistory(params=growth or GrowthParams())
        self.last_patched: Inventory | None = None
        self.last_patch_attempt: float | None = None
        self.last_patched_at: float | None = None  # monotonic time of the last write
        self._nvml_error_logged = False
        self.inventories = 0  # inventories taken: the agent is ready after its first

    def _read_gpus(self) -> GpuSnapshot:
        try:
            return self.gpus.read()
        except Exception as e:  # a reader bug must not lose the PodResources side too
            log.exception("reading the GPUs failed")
            return GpuSnapshot(error=f"reading the GPUs failed: {type(e).__name__}")

    def _read_podresources(self) -> PodResourcesView:
        try:
            return self.podresources.read()
        except Exception as e:  # e.g. gRPC's ValueError on a closed channel
            log.exception("reading PodResources failed")
            return PodResourcesView(error=f"PodResources: {type(e).__name__}")

    def observe(self) -> Report:
        """One read of everything and the inventory built from it (no API write)."""
        now = self.clock()
        mono = self.monotonic()
        snapshot = self._read_gpus()
        if snapshot.error is not None and not self._nvml_error_logged:
            # Once per outage: the message repeats every interval otherwise.
            log.error("NVML unavailable, reporting an empty inventory: %s", snapshot.error)
            self._nvml_error_logged = True
        elif snapshot.error is None:
            self._nvml_error_logged = False
        view = self._read_podresources().with_ids(index_ids(snapshot))
        usages, unknown = attribute_memory(snapshot, view, self.pod_of_pid, self.names.names)
        if unknown and self.names.refresh_if_missing(unknown):
            usages, _ = attribute_memory(snapshot, view, self.pod_of_pid, self.names.names)
        growth = self.history.update(mono, usages)
        inventory = build_inventory(self.config.node, int(now), snapshot, view, usages, growth)
        self.metrics.update(now, snapshot, view, usages, growth)
        self.inventories += 1
        return Report(inventory=inventory, usages=tuple(usages), growth=growth,
                      snapshot=snapshot)

    def should_patch(self, new: Inventory, now: float) -> tuple[bool, str]:
        reason = "changed"
        if not meaningfully_changed(self.last_patched, new, self.config.mem_tolerance_mib):
            refresh = self.config.refresh_s
            if (refresh <= 0 or self.last_patched_at is None
                    or now - self.last_patched_at < refresh):
                return False, "unchanged"
            reason = "refresh"
        if (self.last_patch_attempt is not None
                and now - self.last_patch_attempt < self.config.min_patch_interval_s):
            return False, "rate-limited"
        return True, reason

    def tick(self) -> TickResult:
        report = self.observe()
        if self.patch is None:
            return TickResult(report, False, "patching disabled")
        now = self.monotonic()
        ok, reason = self.should_patch(report.inventory, now)
        if not ok:
            return TickResult(report, False, reason)
        self.last_patch_attempt = now
        try:
            self.patch({INVENTORY_ANNOTATION: encode_inventory(report.inventory)})
        except Exception as e:  # retried on a later tick, after the rate limit
            log.warning("patching node %s failed: %s", self.config.node, e)
            self.metrics.patches.labels(result="error").inc()
            # A timed-out patch may still have been applied: what the Node holds is no
            # longer known, so the next inventory is written even if it equals the last
            # one known written (else the Node could keep the failed one for ever).
            self.last_patched = None
            return TickResult(report, False, f"patch failed: {e}")
        self.metrics.patches.labels(result="ok").inc()
        self.last_patched = report.inventory
        self.last_patched_at = now
        return TickResult(report, True, reason)

    def run(self, interval_s: float, stop: threading.Event) -> None:
        """Tick every ``interval_s`` until ``stop`` is set. A failing tick is logged and
        the loop goes on: the agent must outlive driver and kubelet restarts."""
        while not stop.is_set():
            started = self.monotonic()
            try:
                result = self.tick()
                log.debug("tick: %s", result.reason)
            except Exception:
                log.exception("agent tick failed")
            elapsed = self.monotonic() - started
            stop.wait(min(interval_s, max(0.0, interval_s - elapsed)))
