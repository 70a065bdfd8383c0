"""The MIG actuator's thin handler: gathers :class:`scheduler.mig.decide.ActuatorState`
from the extender's cache, runs :func:`~scheduler.mig.decide.decide_mig`, and applies the
decision: cache holds, the mig-parted ConfigMap and the Node label
(:class:`kube.mig.api.MigApi`), Events and metrics.

It runs inside the extender (``gpupack serve --mig-actuator``) and acts **only on the
leader** (``is_leader``) and only once the cache is synced, as the reservation book
does: the decision needs the cache (pending pods, what each GPU holds, the groups'
holds), its holds must be in the same cache the verbs answer from, and one writer at a
time is what the scheduler's lease already gives. A standby does nothing; when it
becomes the leader it reads the changes in flight back from the ConfigMap and holds
their GPUs before it decides anything.

Leadership is checked again right before every API write of a step (the ConfigMap,
inside the update that a conflict calls again; the Node label; the Node note; each
Event), not only at its start: the decision may take a second and each write up to ten,
and a replica whose lease ran out meanwhile must not hand the MIG manager a change the
new leader knows nothing of. A step that finds it no longer leads stops there
(:class:`NotLeading`); the next one gives everything back.

The ConfigMap's changes are this leader's, but a write that meets a conflict reads
them again: a change found there for a node this leader has no change of, and that it
did not itself read or write so (another replica's, written since), is kept in the
write and followed from then on, not erased.

Order of a start (the re-check): the holds are taken under the cache lock first (each
fails if a pod, an assumed bind or a reservation took the GPU since the decision); only
then is the ConfigMap entry written, and the Node label ``config_propagation_s`` later
(a later step: the MIG manager reads a copy of the ConfigMap that the kubelet refreshes
at its own pace). A write that fails gives the holds back and backs the node off. The
clock is injected (wall-clock seconds: the changes' start times are written to the
ConfigMap and must survive a failover).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from kube.cache import ClusterCache
from kube.mig.api import merged_config
from kube.pod_conditions import slices_created
from kube.record_writer import Submitter
from packing.cpsat import SolverParams
from packing.mig.plan import DEFAULT_PARAMS, WHOLE
from packing.model import RequestKind
from scheduler.engine import GatedHandler, Lead, LeaderGate, Loop, LoopMetrics, Outcome
from scheduler.mig.changes import (
    Backoff,
    Change,
    backoff_from_json,
    changes_from_json,
    changes_json,
)
from scheduler.mig.compact.loop import Compactor
from scheduler.mig.decide import (
    CONFIG_LABEL,
    DEFAULT_SETTINGS,
    HOLD_PREFIX,
    ActuatorState,
    Hold,
    MigDecision,
    MigPod,
    MigSettings,
    WholePod,
    backed_off,
    decide_mig,
    unmet_pods,
)
from scheduler.mig.holds import mig_hold_request, sync_holds, take_holds
from scheduler.mig.metrics import MigMetrics
from scheduler.mig.views import Views

log = logging.getLogger("gpupack.scheduler.mig")
Clock = Callable[[], float]


class NotLeading(Exception):
    """This replica stopped leading in the middle of a step: it writes nothing more."""


class MigWriter(Protocol):
    """What the handler needs of the API (kube.mig.api.MigApi; a fake in unit tests)."""

    def read(self) -> tuple[dict[str, Any] | Exception, str, str | None]: ...

    def write(self, update: Callable[[dict[str, Any], str], tuple[dict[str, Any], str]]
              ) -> None: ...

    def label_node(self, node: str, config: str) -> None: ...

    def note_node(self, node: str, text: str) -> None: ...

    def event(self, node: str, reason: str, message: str, warning: bool = False) -> None: ...


class MigActuator(GatedHandler):
    """See the module docstring."""

    default_poll_s = 2.0  # the changes in flight: timeouts, labels to write

    def __init__(self, cache: ClusterCache, api: MigWriter, *,
                 is_leader: Callable[[], bool] = lambda: True,
                 reserved: Callable[[], set[str]] = set,
                 settings: MigSettings = DEFAULT_SETTINGS, params: SolverParams = DEFAULT_PARAMS,
                 clock: Clock = time.time, metrics: MigMetrics | None = None,
                 min_interval_s: float = 1.0, compactor: Compactor | None = None,
                 requeue: Submitter | None = None,
                 ready: Callable[[], bool] = lambda: True,
                 loop_metrics: LoopMetrics | None = None) -> None:
        self.cache = cache
        # Whether the reservation book has rebuilt its holds (GroupBook.check_ready):
        # until then a reserved room's GPUs look idle, and a change or a drain could
        # take them.
        self.ready = ready
        # Where the status patches go that requeue pods waiting for what a change made
        # (kube.pod_conditions; None: nowhere).
        self.requeue = requeue
        self.woken = 0
        self.api = api
        self.gate = LeaderGate(is_leader)
        self.reserved = reserved  # pending group members whose room is reserved
        self.settings = settings
        self.params = params
        self.clock = clock
        self.metrics = metrics
        self.compactor = compactor  # --mig-compact: drains MIG GPUs in the same step
        if compactor is not None and compactor.gate is None:
            # It evicts after this step's slow part: it asks this actuator's gate, before
            # each eviction, whether this replica still leads.
            compactor.gate = self.gate
        self.changes: dict[str, Change] | None = None  # None: not read back yet
        # Per node, the change as this leader last read it from the ConfigMap or wrote it
        # (or tried to): a change re-read that differs is another writer's (_merged).
        self._known: dict[str, Change] = {}
        self._known_backoff: dict[str, Backoff] = {}  # the same, for the back-offs
        self.backoff: dict[str, Backoff] = {}
        self.idle_since: dict[tuple[str, int], float] = {}
        # The forecast's arrivals (unmet MIG pods, by key and UID), and when each pending
        # MIG pod was first seen pending (its arrival for the settle rule).
        self.arrivals: dict[tuple[str, str], tuple[float, str, frozenset[str]]] = {}
        self.first_seen: dict[tuple[str, str], float] = {}
        self.last: MigDecision | None = None
        self.views = Views(cache)
        self.outcome = Outcome.IDLE  # what the last step did (the loop counts it)
        # A step on every cache change (at most one per min_interval_s), and at least
        # every poll_s (the changes in flight: timeouts, labels to write).
        self.loop = Loop("mig-actuator", self._turn, poll_s=2.0,
                         min_interval_s=min_interval_s, log=log, metrics=loop_metrics)
        cache.subscribe(self.loop.wake)


    # ---- gathering -------------------------------------------------------------------------

    def gather(self, now: float) -> ActuatorState:
        """The decision's input, from the cache (under its lock) and this handler."""
        with self.cache.lock:
            nodes = self.views.all()
            pending = self.cache.pending()
            reserved = self.reserved()
            unreadable = self.cache.unreadable_nodes()
        mig_pods: list[MigPod] = []
        whole: list[WholePod] = []
        # Each pod by key and UID: a pod recreated under its name (a StatefulSet's) is
        # another arrival, with its own first-seen time.
        incarnation: dict[str, tuple[str, str]] = {}
        for p in pending:
            if p.kind is RequestKind.MIG and p.mig_profile:
                incarnation[p.key] = (p.key, p.uid)
                mig_pods.append(MigPod(p.key, p.mig_profile, p.gpu_models,
                                       self.first_seen.get((p.key, p.uid), now)))
            elif p.kind is RequestKind.WHOLE and p.gpu_count > 0 and p.key not in reserved:
                whole.append(WholePod(p.key, p.gpu_count, p.gpu_models))
        # Kept past a pod's bind for a while (a bind that fails puts it back pending:
        # with a fresh time, the settle rule's clocks would start over).
        horizon = now - 4 * self.settings.half_life_s  # also the forecast's (below)
        pending_now = set(incarnation.values())
        for m in mig_pods:
            self.first_seen.setdefault(incarnation[m.key], m.arrived)
        self.first_seen = {k: t for k, t in self.first_seen.items()
                           if k in pending_now or t >= horizon}
        idle: dict[tuple[str, int], float] = {}
        for n in nodes:
            for g in n.gpus:
                if g.mig_enabled and not g.busy:
                    idle[n.name, g.index] = self.idle_since.get((n.name, g.index), now)
        self.idle_since = idle
        state = ActuatorState(tuple(nodes), dict(self.changes or {}), tuple(mig_pods),
                              tuple(whole), dict(self.backoff), dict(idle),
                              unreadable=unreadable)
        # The forecast's arrivals: pods a step found unmet (mig_actuator, "forecast").
        by_key = {m.key: m for m in mig_pods}
        for key in unmet_pods(state):
            m = by_key[key]
            self.arrivals.setdefault(incarnation[key], (m.arrived, m.profile, m.models))
        self.arrivals = {k: a for k, a in self.arrivals.items() if a[0] >= horizon}
        return replace(state, arrivals=tuple(sorted(self.arrivals.values(),
                                                    key=lambda a: a[0])))

    # ---- one step ----------------------------------------------------------------------------

    def step(self) -> MigDecision | None:
        """On the leader, with a synced cache and a rebuilt reservation book: decide_mig and
        apply. None when it did not act."""
        lead = self.gate.step()
        if not lead.leading:
            self.outcome = Outcome.STANDBY
            if lead is Lead.LOST:
                log.info("no longer leading: MIG holds given back")
                self._sync_holds(())
                if self.compactor is not None:
                    self.compactor.release()
                self.changes = None
                # The next leader owns the back-offs from now on (it may clear them):
                # leading again, this replica reads them back from the ConfigMap.
                self.backoff = {}
                self._known_backoff = {}
            return None
        self.outcome = Outcome.IDLE
        if not self.cache.synced or not self.ready():
            return None
        self.gate.act()
        now = self.clock()
        if self.changes is None:
            try:
                config, text, _ = self.api.read()
            except Exception as e:
                log.warning("MIG changes in flight not read back: %s; acting later", e)
                return None
            if isinstance(config, Exception):
                # The changes in flight are still followed; new ones cannot be written
                # (each start fails, with an Event) until the config is mended.
                log.warning("MIG: %s; no change can be started until it is mended", config)
            self.changes, problems = changes_from_json(text)
            self._known = dict(self.changes)
            backoff, more = backoff_from_json(text)
            self._known_backoff = dict(backoff)
            # A back-off the last leader set still holds (capped at the longest one
            # this leader would set: a clock far ahead is not a node lost for ever).
            self.backoff = {**self._adopted(backoff, now), **self.backoff}
            for p in problems + more:
                log.warning("%s; ignored", p)
            if self.changes:
                log.info("leading: following %d MIG change(s) in flight: %s",
                         len(self.changes), ", ".join(sorted(self.changes)))
        self.outcome = Outcome.DONE
        state = self.gather(now)
        d = decide_mig(state, now, self.settings, self.params)
        self.apply(d, now)
        self.last = d
        if self.compactor is not None and self.changes is not None and self.is_leader():
            # (It asks again before each eviction: its own step writes too.)
            self.compactor.step(state, now, set(self.changes))
        return d

    def apply(self, d: MigDecision, now: float) -> None:
        assert self.changes is not None
        self.backoff = dict(d.backoff)
        started_holds = {h.key for s in d.starts for h in d.holds if h.node == s.change.node}
        # Holds of changes already in flight (and of ended ones given back) first.
        kept = tuple(h for h in d.holds if h.key not in started_holds)
        self._sync_holds(kept, keep=started_holds)
        for f in d.finishes:
            self.changes.pop(f.change.node, None)
            self._finished(f.change, f.result, f.message)
        if d.finishes:
            self._write_changes()
        for c in d.labels:
            if not self._label_now(c):
                return
        if d.labels:  # when each was labelled, for a new leader
            self._write_changes()
        for s in d.starts:
            mine = [h for h in d.holds if h.node == s.change.node]
            why = take_holds(self.cache, mine)
            if why is not None:  # a pod took a GPU since the decision: not started at all
                log.info("MIG change on %s not started: %s", s.change.node, why)
                continue
            try:
                entry = {s.plan.config_name: [dev.to_json() for dev in s.plan.devices]}
                changes = {**self.changes, s.change.node: s.change}
                referenced = self._referenced(changes)

                def update(cfg: dict[str, Any], old: str, e: dict[str, Any] = entry,
                           c: dict[str, Change] = changes, r: set[str] | None = referenced
                           ) -> tuple[dict[str, Any], str]:
                    return _merge(cfg, e, r), self._changes_text(c, old)

                self._still_leading()
                self.api.write(update)
                self.changes[s.change.node] = s.change
                if s.change.labelled_at is not None:  # no wait for the entry to arrive
                    self._still_leading()
                    self._label(s.change)
            except NotLeading:
                # The next step (a standby's) gives every hold back and forgets the
                # changes; a change written but not labelled ends superseded for the
                # new leader, which reads it back.
                log.info("no longer leading: MIG change on %s not handed over",
                         s.change.node)
                self._give_back(mine)
                self.changes.pop(s.change.node, None)
                return
            except Exception as e:
                log.warning("MIG change on %s not handed over: %s", s.change.node, e)
                self._event(s.change.node, "MigReconfigureNotStarted",
                            f"{s.why}; but {s.change.config} could not be handed to the "
                            f"MIG manager: {e}", warning=True)
                self._give_back(mine)
                self.changes.pop(s.change.node, None)
                self.backoff[s.change.node] = backed_off(self.backoff.get(s.change.node), now,
                                                         self.settings)
                self._count("error")
                self._write_changes()
                continue
            log.info("MIG change %s on %s: %s", s.change.config, s.change.node, s.why)
            if s.change.labelled_at is not None:
                asked = f"asked the MIG manager for {s.change.config} ({CONFIG_LABEL})"
            else:
                asked = (f"wrote the mig-parted entry {s.change.config}; {CONFIG_LABEL} "
                         f"follows in {self.settings.config_propagation_s:.0f} s, once the "
                         "kubelet has copied it to the MIG manager")
            self._event(s.change.node, "MigReconfigureStarted", f"{s.why}; {asked}")
            self._count("started")
        self._figures(d)

    # ---- pieces --------------------------------------------------------------------------------

    def _label_now(self, c: Change) -> bool:
        """Label the node of a change whose entry has had time to reach the MIG manager,
        and remember when (the caller writes it to the ConfigMap: a new leader then
        judges the label from that time, or labels again, which changes nothing). False
        when this replica no
        longer leads (the step stops there). A refused label counts as written: the
        change ends ``superseded`` once the label is judged (the node does not carry
        it), and its GPUs are given back."""
        try:
            self._still_leading()
            self._label(c)
        except NotLeading:
            log.info("no longer leading: MIG change on %s not labelled", c.node)
            return False
        except Exception as e:
            log.warning("MIG change %s on %s: label refused (%s)", c.config, c.node, e)
            self._event(c.node, "MigReconfigureNotLabelled",
                        f"{CONFIG_LABEL}={c.config} could not be set: {e}", warning=True)
        assert self.changes is not None
        self.changes[c.node] = c
        log.info("MIG change %s on %s: %s asked", c.config, c.node, CONFIG_LABEL)
        return True

    def _label(self, c: Change) -> None:
        """Set the node's config label. An answer that says the patch was refused (4xx
        but 408/429) raises; any other failure (a timeout, 5xx, a lost connection) may
        have set the label anyway, so the change stays in flight and holds its GPUs: the
        label is judged ``label_grace_s`` after the start (superseded if it never came)."""
        try:
            self.api.label_node(c.node, c.config)
        except Exception as e:
            status = getattr(e, "status", None)
            if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
                raise
            log.warning("MIG change %s on %s: label write outcome unknown (%s); followed "
                        "as if it was set", c.config, c.node, e)

    def _still_leading(self) -> None:
        """Raise :class:`NotLeading` unless this replica leads right now."""
        if not self.is_leader():
            raise NotLeading

    def _event(self, node: str, reason: str, message: str, warning: bool = False) -> None:
        """An Event on ``node``, from the leader only: a replica that lost the lease in
        the middle of a step says nothing the new leader may contradict."""
        if self.is_leader():
            self.api.event(node, reason, message, warning=warning)

    def _changes_text(self, mine: Mapping[str, Change], old: str) -> str:
        """Inside a ConfigMap update (called again after a conflict), right before it is
        written: raise :class:`NotLeading` unless this replica leads, else the changes
        text to write: ``mine`` :meth:`_merged` with the ``old`` text just read."""
        self._still_leading()
        merged = self._merged(mine, old)
        self._known.update(merged)
        backoff = self._merged_backoff(old)
        # Added to, not replaced (as _known): this write may still fail, and the text
        # read next then holds what was known before, which must not look foreign.
        self._known_backoff.update(backoff)
        return changes_json(merged, backoff)

    def _merged_backoff(self, old: str) -> dict[str, Backoff]:
        """This leader's live back-offs plus those ``old`` has that it neither read nor
        wrote so: another writer's (a replica that led for a moment saw a change fail).
        Dropped, the node would be retried at once; a back-off this leader cleared (a
        success since) is in ``old`` as it read or wrote it, and stays cleared."""
        theirs, _ = backoff_from_json(old)
        now = self.clock()
        live = self._live_backoff()
        foreign = {n: b for n, b in theirs.items() if b.until > now
                   and n not in live and self._known_backoff.get(n) != b}
        if foreign:
            log.warning("MIG back-off of %s written by another replica meanwhile: kept",
                        ", ".join(sorted(foreign)))
            self.backoff.update(self._adopted(foreign, now))
        return self._live_backoff()

    def _adopted(self, theirs: Mapping[str, Backoff], now: float) -> dict[str, Backoff]:
        """Back-offs another leader wrote that still hold, each capped at the longest
        this leader would set: a clock far ahead is not a node lost for ever."""
        cap = now + self.settings.backoff_max_s
        return {n: Backoff(min(b.until, cap), b.failures) for n, b in theirs.items()
                if b.until > now}

    def _merged(self, mine: Mapping[str, Change], old: str) -> dict[str, Change]:
        """``mine`` plus the changes ``old`` has for nodes ``mine`` has none of and that
        this leader did not itself read or write so: another writer's (a replica that
        led for a moment and started a change, labelling its node). Erased, its GPUs
        would be handed out while the MIG manager re-partitions them; kept, they are
        followed (held, judged, ended) from this step on. A change this leader ended
        is in ``old`` as it read or wrote it, and stays ended."""
        theirs, _ = changes_from_json(old)
        foreign = {n: c for n, c in theirs.items()
                   if n not in mine and self._known.get(n) != c}
        if not foreign:
            return dict(mine)
        log.warning("MIG change(s) on %s written by another replica meanwhile: kept and "
                    "followed", ", ".join(sorted(foreign)))
        if self.changes is not None:
            for n, c in foreign.items():
                self.changes.setdefault(n, c)
        return {**foreign, **mine}

    def _referenced(self, changes: Mapping[str, Change]) -> set[str] | None:
        """The entries some node's label or a change in flight names; None (keep every
        entry) while a node cannot be read: its label is not known."""
        with self.cache.lock:
            if self.cache.unreadable_nodes():
                return None
            names = {v for n in self.cache.state.nodes.values()
                     if (v := n.info.labels.get(CONFIG_LABEL)) is not None}
        return names | {c.config for c in changes.values()}

    def _write_changes(self) -> None:
        assert self.changes is not None
        changes = dict(self.changes)

        def update(cfg: dict[str, Any], old: str) -> tuple[dict[str, Any], str]:
            return _merge(cfg, {}, self._referenced(changes)), self._changes_text(changes, old)

        try:
            self._still_leading()
            self.api.write(update)
        except NotLeading:
            log.info("no longer leading: MIG changes in flight not written")
        except Exception as e:
            log.warning("MIG changes in flight not written: %s", e)

    def _live_backoff(self) -> dict[str, Backoff]:
        now = self.clock()
        return {n: b for n, b in self.backoff.items() if b.until > now}

    def _finished(self, c: Change, result: str, message: str) -> None:
        failed = result in ("failed", "timeout")
        (log.warning if failed else log.info)("MIG change %s on %s: %s (%s)", c.config,
                                              c.node, result, message)
        reason = {"success": "MigReconfigured", "failed": "MigReconfigureFailed",
                  "timeout": "MigReconfigureTimedOut",
                  "superseded": "MigReconfigureSuperseded"}[result]
        extra = ""
        if failed and c.node in self.backoff:
            b = self.backoff[c.node]
            extra = (f"; GPUs given back, node left alone for "
                     f"{max(0.0, b.until - self.clock()):.0f} s (failure {b.failures})")
        self._event(c.node, reason, message + extra, warning=result != "success")
        if (result != "superseded" or "gone" not in message) and self.is_leader():
            try:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))
                self.api.note_node(c.node, f"{result} {c.config} {stamp}")
            except Exception as e:
                log.warning("node %s: outcome of %s not noted: %s", c.node, c.config, e)
        self._count(result)
        if result == "success" and self.metrics is not None:
            for _, t in c.targets:
                self.metrics.converted.labels("whole" if t == WHOLE else "mig").inc()
        if result == "success":
            self._wake_waiting(c)

    def _wake_waiting(self, c: Change) -> None:
        """Requeue pending pods that ask for what ``c`` made (in the cache's order, at
        most as many per profile as the changed GPUs' instances of it, and whole-GPU pods
        up to the GPUs turned whole): kube-scheduler retried them on the node's new
        allocatable, maybe before the cache (which has it now: the change was recognised
        there) showed it, and parked them again."""
        if self.requeue is None:
            return
        made: dict[str, int] = {}
        whole = 0
        for _, t in c.targets:
            if isinstance(t, str):  # WHOLE
                whole += 1
            else:
                for profile, n in t:
                    made[profile] = made.get(profile, 0) + n
        with self.cache.lock:
            pending = self.cache.pending()
        now = dt.datetime.fromtimestamp(self.clock(), dt.UTC)
        for p in pending:
            if p.kind is RequestKind.MIG and made.get(p.mig_profile or "", 0) > 0:
                made[p.mig_profile or ""] -= 1
                what = f"new {p.mig_profile} slices"
            elif p.kind is RequestKind.WHOLE and 0 < p.gpu_count <= whole:
                whole -= p.gpu_count
                what = "GPUs turned whole"
            else:
                continue
            self.requeue.submit(p.key, slices_created(p.key, c.node, c.config, what, now))
            self.woken += 1
            if self.metrics is not None:
                self.metrics.requeued.inc()

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.reconfigurations.labels(result).inc()

    def _figures(self, d: MigDecision) -> None:
        if self.metrics is None:
            return
        m = self.metrics
        m.in_flight.set(len(self.changes or {}))
        m.backoff.set(sum(1 for b in self.backoff.values() if b.until > self.clock()))
        with self.cache.lock:
            m.held.set(len({k.rsplit("/", 1)[0] if k.count("/") > 2 else k
                            for k in self.cache.holds() if k.startswith(HOLD_PREFIX)}))

    def _give_back(self, holds: list[Hold]) -> None:
        for h in holds:
            self.cache.unhold(h.key)

    def _sync_holds(self, wanted: tuple[Hold, ...],
                    keep: frozenset[str] | set[str] = frozenset()) -> None:
        # A hold a pod took (bound by someone else) is not had: the MIG manager will meet
        # a busy GPU and fail; the change ends as failed and backs off.
        sync_holds(self.cache, wanted, HOLD_PREFIX, keep.__contains__)

    # ---- the thread ------------------------------------------------------------------------


    def _turn(self) -> Outcome:
        self.step()
        return self.outcome


def _merge(cfg: dict[str, Any], add: Mapping[str, Any], referenced: set[str] | None
           ) -> dict[str, Any]:
    return merged_config(cfg, add, referenced)


__all__ = ["MigActuator", "MigMetrics", "mig_hold_request"]
