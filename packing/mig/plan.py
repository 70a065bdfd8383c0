"""MIG layout planning: which idle GPUs of opted-in nodes get which new layout.

The pure core of the MIG actuator (issue 19, item 2); nothing here talks to a cluster.
Given the nodes (every GPU with its mode, its current instances and whether a pod or a
reservation holds it), the MIG pods that wait because no free slice serves them, a
forecast per profile, and the whole-GPU pods (LLM group members included) that wait,
:func:`plan_mig` chooses new per-GPU layouts and says them as mig-parted config entries
plus the value of the node label ``nvidia.com/mig.config`` that selects each entry
(``reference/nvidia-gpu-stack.md``).

Rules every plan keeps (checked by :func:`plan_errors`, which the tests share):
  - only GPUs of nodes that opt in, and never a GPU that a pod or a reservation holds;
  - every new layout is a valid MIG layout of the GPU's model (``packing.mig.layout``);
  - at most one node per GPU model changes at a time, and none of a model whose change
    is still in flight (the MIG manager restarts the node's GPU clients while it works);
  - a node's config entry names every GPU of the node, the untouched ones as they are
    (mig-parted leaves a GPU whose config already matches alone), so applying the entry
    changes exactly the planned GPUs;
  - a GPU's MIG mode (whole <-> MIG) changes only on a node where nothing is in use
    (:attr:`MigNode.busy`): mig-parted's mode step clears the instances of every MIG GPU
    of the node, busy or not, and resets every GPU when the driver asks for it
    (``cmd/nvidia-mig-parted/apply/mode.go``); within MIG mode only the changed GPU is
    re-laid.

Layouts are chosen as instance counts per profile (mig-parted's ``mig-devices``): the
MIG manager places the instances itself, and every count vector offered here has a valid
placement (:func:`layout_from_counts`).

CP-SAT model (all Boolean unless said):
  y[g, o]     candidate GPU g takes option o: a count vector (MIG on, those instances)
              or WHOLE (MIG off); none of its y set means g stays as it is
  c[g]        g changes (= sum_o y[g, o])
  k[n, m]     node n changes a GPU of model m
  sw[m, p]    waiting pods of (model m, profile p) served by new instances (integer)
  sf[m, p]    forecast instances of (m, p) made too (integer)
  v[q, n]     waiting whole-GPU pod q gets its GPUs on node n
Constraints:
  sum_o y[g, o] <= 1;  c[g] -> k[n, model(g)];  sum_n k[n, m] <= 1 (0 if m in flight);
  sw[m, p] + sf[m, p] <= sum_g,o gain(g, o, p) y[g, o], gain = new instances of p the
  option adds over what g has;  sw <= waiting, sf <= forecast;
  sum_n v[q, n] <= 1;  sum_q gpus_q v[q, n] <= whole GPUs of n that no one holds, less
  those turned to MIG, plus MIG GPUs turned WHOLE.
Objective (lexicographic through weights that cannot overflow into each other):
  maximize  A * (waiting MIG pods served + waiting whole pods served)
          - B * whole-free nodes that get a MIG GPU      (keep whole nodes for LLMs)
          - C * nodes not in MIG mode that enter it      (prefer nodes already in MIG mode)
          - D * GPUs changed                             (convert the fewest GPUs)
Besides: a node that switches a GPU to MIG switches all its whole candidate GPUs
(b[n] -> c[g]): MIG mode changes need the node idle, so the node's whole GPUs could not
follow later.
          + E * forecast instances made                  (on GPUs that change anyway)
          + G * compute slices of the new layouts in demanded profiles  (fill the GPU)
          - F * instances created                        (no gratuitous slices)
          - T * nodes changed that the greedy plan does not change  (ties, determinism)
The forecast never converts a GPU by itself: it only shapes the layouts of GPUs that
change for pods that wait (D outweighs E). A GPU that changes is then filled with
instances of the profiles that pods wait for or the forecast expects on its model (G):
once a pod runs on it, its layout cannot change until it is idle again, so room left
without instances would be lost (measured by bench/mig.py: bench/README.md, "MIG
partitioning policies"). Profiles nobody asks for are never created (F). Freed MIG
instances that no pod waits for are not counted as a loss: a pod that could use them
would not be waiting.

Solved with explicit limits, seed and workers; FEASIBLE is accepted; UNKNOWN, an invalid
model or an invalid answer falls back to the greedy plan, which is also the hint. Whole
demand is matched only to nodes whose GPUs are all of one model (mixed nodes are left
to the MIG side).

Past 600 lines as one planner: the greedy fill and the CP-SAT plan choose among the
same candidate layouts for the same demand and are checked by the same
:func:`plan_errors`; split, the rules every plan keeps would be stated far from one of
the two that must keep them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType

from ortools.sat.python import cp_model

from packing.catalog import MigGeometry, get_model
from packing.cpsat import SolverParams
from packing.mig.layout import MigSlot, layout_errors, layout_from_counts

Counts = tuple[tuple[str, int], ...]  # profile -> count, sorted by profile, no zeros
WHOLE = "whole"  # the option of turning MIG off
# A plan is wanted within a control loop's tick, not a batch's: one deterministic second.
DEFAULT_PARAMS = SolverParams(max_time_s=1.0)


@dataclass(frozen=True)
class MigGpu:
    """One GPU of a node as the planner sees it."""

    index: int
    model: str  # catalog model name
    mig_enabled: bool
    layout: tuple[MigSlot, ...] = ()  # its instances (MIG enabled)
    held: bool = False  # a pod or a reservation holds it, or one of its instances

    @property
    def counts(self) -> Counts:
        return _counts(s.profile for s in self.layout) if self.mig_enabled else ()


@dataclass(frozen=True)
class MigNode:
    name: str
    gpus: tuple[MigGpu, ...]
    opted_in: bool = False  # gpupack.io/mig-reconfigure: "true" (and no freeze)
    # A pod or a reservation uses one of its GPUs (any GPU, MIG-capable or not). None:
    # judged from the GPUs' ``held`` (which may also mean "recently idle").
    in_use: bool | None = None

    @property
    def busy(self) -> bool:
        """Whether a GPU of the node is in use. mig-parted switches MIG mode node by
        node: it clears the instances of every GPU in MIG mode on the node (a busy one
        fails the change) and, when the driver wants it, resets every GPU. So a GPU's
        MIG mode changes only on a node where nothing is in use."""
        return any(g.held for g in self.gpus) if self.in_use is None else self.in_use

    @property
    def in_mig_mode(self) -> bool:
        return any(g.mig_enabled for g in self.gpus)

    @property
    def whole_free(self) -> bool:
        """Every GPU whole and held by no one: room for an LLM node."""
        return bool(self.gpus) and all(not g.mig_enabled and not g.held for g in self.gpus)


@dataclass(frozen=True)
class WholeDemand:
    """A waiting whole-GPU pod: ``gpus`` GPUs on one node of one of ``models``."""

    key: str
    gpus: int
    models: frozenset[str] = frozenset()  # empty: any model


@dataclass(frozen=True)
class MigDemand:
    # (model, profile) -> pods waiting for a slice that no free one serves
    waiting: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # (model, profile) -> instances expected to be asked for soon (recent arrivals)
    forecast: Mapping[tuple[str, str], int] = field(default_factory=dict)
    whole: tuple[WholeDemand, ...] = ()


@dataclass(frozen=True)
class DeviceConfig:
    """One entry of a mig-parted config: these GPU indices, MIG on or off, instances."""

    devices: tuple[int, ...]
    mig_enabled: bool
    mig_devices: Counts = ()

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"devices": list(self.devices), "mig-enabled": self.mig_enabled}
        if self.mig_enabled:
            out["mig-devices"] = dict(self.mig_devices)
        return out


@dataclass(frozen=True)
class NodeChange:
    node: str
    models: tuple[str, ...]  # GPU models of the changed GPUs
    changed: tuple[int, ...]  # indices of the GPUs whose layout changes
    devices: tuple[DeviceConfig, ...]  # the node's whole config, every GPU
    config_name: str  # the mig-parted entry, and the value of nvidia.com/mig.config

    @property
    def label_value(self) -> str:
        return self.config_name


@dataclass(frozen=True)
class MigPlan:
    changes: tuple[NodeChange, ...]
    status: str  # OPTIMAL | FEASIBLE | greedy | <status>/fallback-greedy | nothing-to-do
    served: Mapping[tuple[str, str], int]  # (model, profile) -> waiting pods served
    whole_served: tuple[str, ...] = ()  # keys of waiting whole pods given GPUs

    def mig_parted_config(self) -> dict[str, object]:
        """The entries to merge into the mig-parted ConfigMap's config.yaml."""
        return {"version": "v1", "mig-configs": {
            c.config_name: [d.to_json() for d in c.devices] for c in self.changes}}


# ---- layouts ---------------------------------------------------------------------------


def _counts(profiles: Iterable[str]) -> Counts:
    n: dict[str, int] = defaultdict(int)
    for p in profiles:
        n[p] += 1
    return tuple(sorted(n.items()))


@lru_cache(maxsize=64)
def count_vectors(geometry: MigGeometry) -> tuple[Counts, ...]:
    """Every non-empty instance-count vector of the classic profiles that has a valid
    layout (78 on 7-slice parts), deterministic order."""
    profiles = geometry.classic
    out = []
    for c in itertools.product(*(range(p.max_count + 1) for p in profiles)):
        if not any(c):
            continue
        if sum(k * p.compute_slices for k, p in zip(c, profiles, strict=True)) > \
                geometry.compute_slices:
            continue
        if sum(k * p.memory_slices for k, p in zip(c, profiles, strict=True)) > \
                geometry.memory_slices:
            continue
        counts = tuple(sorted((p.name, k) for k, p in zip(c, profiles, strict=True) if k))
        if layout_from_counts(geometry, dict(counts)) is not None:
            out.append(counts)
    return tuple(out)


def _gain(option: Counts | str, old: Counts) -> dict[str, int]:
    """New instances per profile that ``option`` adds over ``old``."""
    if option == WHOLE:
        return {}
    assert not isinstance(option, str)
    had = dict(old)
    return {p: k - had.get(p, 0) for p, k in option if k > had.get(p, 0)}


def config_name(devices: Sequence[DeviceConfig]) -> str:
    """A content-addressed entry name: the same node config always gets the same name, a
    valid label value (at most 63 characters)."""
    text = json.dumps([d.to_json() for d in devices], sort_keys=True)
    return "gpupack-" + hashlib.sha256(text.encode()).hexdigest()[:16]


_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


# ---- the validator -----------------------------------------------------------------------


def plan_errors(nodes: Sequence[MigNode], plan: MigPlan,
                in_flight: frozenset[str] = frozenset()) -> list[str]:
    """Every rule ``plan`` breaks on ``nodes``; empty means valid. Solvers and tests both
    use it."""
    errors: list[str] = []
    by_name = {n.name: n for n in nodes}
    touched_models: dict[str, str] = {}
    seen_nodes: set[str] = set()
    for ch in plan.changes:
        node = by_name.get(ch.node)
        if node is None:
            errors.append(f"{ch.node}: no such node")
            continue
        if ch.node in seen_nodes:
            errors.append(f"{ch.node}: changed twice")
        seen_nodes.add(ch.node)
        if not node.opted_in:
            errors.append(f"{ch.node}: does not opt in to MIG reconfiguration")
        gpus = {g.index: g for g in node.gpus}
        listed = [i for d in ch.devices for i in d.devices]
        if sorted(listed) != sorted(gpus):
            errors.append(f"{ch.node}: config names GPUs {sorted(listed)}, node has "
                          f"{sorted(gpus)}")
        config = {i: d for d in ch.devices for i in d.devices}
        for i, g in gpus.items():
            d = config.get(i)
            if d is None:
                continue
            same = d.mig_enabled == g.mig_enabled and (not d.mig_enabled
                                                       or d.mig_devices == g.counts)
            if i in ch.changed:
                if same:
                    errors.append(f"{ch.node} GPU {i}: listed as changed but unchanged")
                if d.mig_enabled != g.mig_enabled and node.busy:
                    errors.append(f"{ch.node} GPU {i}: MIG mode changes on a node in use "
                                  "(mig-parted clears every MIG GPU of the node and may "
                                  "reset them all)")
                if g.held:
                    errors.append(f"{ch.node} GPU {i}: held by a pod or a reservation")
                geom = get_model(g.model).mig
                if geom is None:
                    errors.append(f"{ch.node} GPU {i}: {g.model} has no MIG")
                    continue
                if d.mig_enabled:
                    errors.extend(f"{ch.node} GPU {i}: {e}" for e in
                                  _counts_errors(geom, g.model, d.mig_devices))
                prev = touched_models.setdefault(g.model, ch.node)
                if prev != ch.node:
                    errors.append(f"{g.model}: nodes {prev} and {ch.node} change at once")
                if g.model in in_flight:
                    errors.append(f"{ch.node} GPU {i}: a {g.model} change is in flight")
            elif not same:
                errors.append(f"{ch.node} GPU {i}: config differs from its state but the "
                              "GPU is not listed as changed")
        for i in ch.changed:
            if i not in gpus:
                errors.append(f"{ch.node}: no GPU {i}")
        if not ch.changed:
            errors.append(f"{ch.node}: a change that changes nothing")
        if ch.config_name != config_name(ch.devices) or not _LABEL_VALUE.match(ch.config_name):
            errors.append(f"{ch.node}: config name {ch.config_name!r} is not the entry's own")
    return errors


def _counts_errors(geom: MigGeometry, model: str, counts: Counts) -> list[str]:
    for p, k in counts:
        if not geom.has_profile(p):
            return [f"{model} has no MIG profile {p}"]
        if k <= 0:
            return [f"{p}: count {k}"]
    slots = layout_from_counts(geom, dict(counts))
    if slots is None:
        return [f"mig-devices {dict(counts)} have no valid layout on {model}"]
    return layout_errors(geom, slots)


# ---- building a plan from per-GPU choices --------------------------------------------------


def _changes(nodes: Sequence[MigNode], chosen: Mapping[tuple[str, int], Counts | str]
             ) -> tuple[NodeChange, ...]:
    out = []
    for node in nodes:
        mine = {i: o for (n, i), o in chosen.items() if n == node.name}
        if not mine:
            continue
        state: dict[int, tuple[bool, Counts]] = {}
        for g in node.gpus:
            o = mine.get(g.index)
            if o is None:
                state[g.index] = (g.mig_enabled, g.counts)
            elif o == WHOLE:
                state[g.index] = (False, ())
            else:
                assert not isinstance(o, str)
                state[g.index] = (True, o)
        grouped: dict[tuple[bool, Counts], list[int]] = defaultdict(list)
        for i, s in sorted(state.items()):
            grouped[s].append(i)
        devices = tuple(sorted(
            (DeviceConfig(tuple(ix), on, counts) for (on, counts), ix in grouped.items()),
            key=lambda d: d.devices))
        models = tuple(sorted({g.model for g in node.gpus if g.index in mine}))
        out.append(NodeChange(node.name, models, tuple(sorted(mine)), devices,
                              config_name(devices)))
    return tuple(out)


def _served(nodes: Sequence[MigNode], demand: MigDemand,
            chosen: Mapping[tuple[str, int], Counts | str]) -> dict[tuple[str, str], int]:
    gains: dict[tuple[str, str], int] = defaultdict(int)
    for node in nodes:
        for g in node.gpus:
            o = chosen.get((node.name, g.index))
            if o is not None:
                for p, k in _gain(o, g.counts).items():
                    gains[g.model, p] += k
    return {mp: min(n, gains[mp]) for mp, n in demand.waiting.items() if min(n, gains[mp])}


# ---- candidates ------------------------------------------------------------------------------


def _candidates(nodes: Sequence[MigNode]) -> list[tuple[MigNode, MigGpu]]:
    """GPUs that may change: MIG-capable, on nodes that opt in, held by no one; on a node
    in use (:attr:`MigNode.busy`) only MIG GPUs, whose mode stays."""
    return [(n, g) for n in nodes if n.opted_in for g in n.gpus
            if not g.held and get_model(g.model).mig is not None
            and (g.mig_enabled or not n.busy)]


def _options(g: MigGpu, busy: bool = False) -> list[Counts | str]:
    """Layouts ``g`` may take: every count vector but its own; WHOLE for a MIG GPU on a
    node in use by no one (a mode change)."""
    geom = get_model(g.model).mig
    assert geom is not None
    opts: list[Counts | str] = [c for c in count_vectors(geom)
                                if not (g.mig_enabled and c == g.counts)]
    if g.mig_enabled and not busy:
        opts.append(WHOLE)
    return opts


def _demanded(demand: MigDemand) -> frozenset[tuple[str, str]]:
    """(model, profile) that pods wait for or the forecast expects."""
    return frozenset(mp for mp, n in (*demand.waiting.items(), *demand.forecast.items())
                     if n > 0)


def _compute_slices(g: MigGpu) -> int:
    geom = get_model(g.model).mig
    return 0 if geom is None else geom.compute_slices


def _fill(g: MigGpu, option: Counts | str, demanded: frozenset[tuple[str, str]]) -> int:
    """Compute slices of the layout ``option`` in profiles that are demanded on g's model:
    a GPU that changes is partitioned in full for what is asked, since once a pod runs on
    it its layout can no longer change and room left without instances is lost."""
    if option == WHOLE:
        return 0
    geom = get_model(g.model).mig
    assert geom is not None and not isinstance(option, str)
    return sum(k * geom.profile(p).compute_slices for p, k in option
               if (g.model, p) in demanded)


def _max_instances(g: MigGpu) -> int:
    geom = get_model(g.model).mig
    return 0 if geom is None else geom.memory_slices


def _single_model(node: MigNode) -> str | None:
    models = {g.model for g in node.gpus}
    return next(iter(models)) if len(models) == 1 else None


# ---- greedy ----------------------------------------------------------------------------------


def greedy_mig_plan(nodes: Sequence[MigNode], demand: MigDemand,
                    in_flight: frozenset[str] = frozenset()) -> MigPlan:
    """Per model, the one node whose idle GPUs serve the most waiting MIG pods (MIG-mode
    nodes first, whole-free nodes last), GPU by GPU the layout serving the most of what is
    left; then whole-GPU pods by turning idle MIG GPUs back, on nodes not already chosen
    for another change of that model."""
    chosen: dict[tuple[str, int], Counts | str] = {}
    cands = _candidates(nodes)
    models = sorted({g.model for _, g in cands} - in_flight)
    node_of_model: dict[str, str] = {}
    demanded = _demanded(demand)
    for model in models:
        wait = {p: n for (m, p), n in demand.waiting.items() if m == model and n > 0}
        if not wait:
            continue
        fore = {p: n for (m, p), n in demand.forecast.items() if m == model and n > 0}
        best: tuple[tuple[int, ...], str, dict[int, Counts | str]] | None = None
        for node in nodes:
            gpus = [g for n, g in cands if n is node and g.model == model]
            if not gpus:
                continue
            # Idle MIG GPUs first: they break no whole GPU.
            gpus.sort(key=lambda g: (not g.mig_enabled, g.index))
            left, left_f = dict(wait), dict(fore)
            picks: dict[int, Counts | str] = {}
            served = 0
            for g in gpus:
                opt, n_w, _ = _best_option(g, left, left_f, demanded, node.busy)
                if opt is None or n_w == 0:
                    continue
                picks[g.index] = opt
                served += n_w
                _consume(_gain(opt, g.counts), left, left_f)
                if not any(left.values()):
                    break
            if not picks:
                continue
            if any(not _gpu(node, i).mig_enabled for i in picks):
                # Switching MIG mode needs the node idle: every whole GPU switches now
                # (plan_mig's rule), partitioned for what is left of the forecast.
                for g in gpus:
                    if not g.mig_enabled and g.index not in picks:
                        opt, _, _ = _best_option(g, left, left_f, demanded, node.busy)
                        if opt is not None:
                            picks[g.index] = opt
                            _consume(_gain(opt, g.counts), left, left_f)
            to_mig = sum(1 for i in picks if not _gpu(node, i).mig_enabled)
            score = (served, -int(node.whole_free and to_mig > 0),
                     -int(not node.in_mig_mode), -len(picks))
            if best is None or score > best[0]:
                best = (score, node.name, picks)
        if best is not None:
            node_of_model[model] = best[1]
            chosen.update({(best[1], i): o for i, o in best[2].items()})
    whole_served = _greedy_whole(nodes, demand, in_flight, chosen, node_of_model)
    return MigPlan(_changes(nodes, chosen), "greedy", _served(nodes, demand, chosen),
                   whole_served)


def _consume(gain: Mapping[str, int], left: dict[str, int], left_f: dict[str, int]) -> None:
    """Take new instances ``gain`` off the waiting pods ``left`` first, the rest off the
    forecast ``left_f``."""
    for p, k in gain.items():
        use = min(k, left.get(p, 0))
        left[p] = left.get(p, 0) - use
        left_f[p] = max(0, left_f.get(p, 0) - (k - use))


def _gpu(node: MigNode, index: int) -> MigGpu:
    return next(g for g in node.gpus if g.index == index)


def _best_option(g: MigGpu, left: Mapping[str, int], left_f: Mapping[str, int],
                 demanded: frozenset[tuple[str, str]] = frozenset(), busy: bool = False
                 ) -> tuple[Counts | str | None, int, int]:
    best: tuple[tuple[int, int, int, int], Counts | str] | None = None
    for o in _options(g, busy):
        if o == WHOLE:
            continue
        gain = _gain(o, g.counts)
        n_w = sum(min(k, left.get(p, 0)) for p, k in gain.items())
        n_f = sum(min(k - min(k, left.get(p, 0)), left_f.get(p, 0)) for p, k in gain.items())
        created = sum(gain.values())
        key = (n_w, n_f, _fill(g, o, demanded), -created)
        if best is None or key > best[0]:
            best = (key, o)
    if best is None:
        return None, 0, 0
    return best[1], best[0][0], best[0][1]


def _greedy_whole(nodes: Sequence[MigNode], demand: MigDemand, in_flight: frozenset[str],
                  chosen: dict[tuple[str, int], Counts | str],
                  node_of_model: dict[str, str]) -> tuple[str, ...]:
    served: list[str] = []
    room: dict[str, int] = {}  # node -> whole GPUs no one holds (after the MIG picks)
    convertible: dict[str, list[int]] = {}  # node -> idle MIG GPUs that may turn whole
    for node in nodes:
        model = _single_model(node)
        if model is None:
            continue
        room[node.name] = sum(1 for g in node.gpus if not g.mig_enabled and not g.held
                              and (node.name, g.index) not in chosen)
        convertible[node.name] = [g.index for g in node.gpus if node.opted_in and g.mig_enabled
                                  and not g.held and (node.name, g.index) not in chosen
                                  and model not in in_flight and not node.busy]
    for q in sorted(demand.whole, key=lambda q: (-q.gpus, q.key)):
        best: tuple[int, str] | None = None
        for node in nodes:
            model = _single_model(node)
            if model is None or (q.models and model not in q.models):
                continue
            owner = node_of_model.get(model)
            can_convert = owner in (None, node.name)
            extra = len(convertible[node.name]) if can_convert else 0
            if room[node.name] + extra < q.gpus:
                continue
            need = max(0, q.gpus - room[node.name])
            if best is None or (need, node.name) < best:
                best = (need, node.name)
        if best is None:
            continue
        need, name = best
        model = _single_model(next(n for n in nodes if n.name == name))
        assert model is not None
        for i in convertible[name][:need]:
            chosen[name, i] = WHOLE
        if need:
            node_of_model[model] = name
        convertible[name] = convertible[name][need:]
        room[name] += need - q.gpus
        served.append(q.key)
    return tuple(served)


# ---- CP-SAT ----------------------------------------------------------------------------------


def plan_mig(nodes: Sequence[MigNode], demand: MigDemand, *,
             in_flight: frozenset[str] = frozenset(),
             params: SolverParams = DEFAULT_PARAMS,
             max_nodes_per_model: int = 16) -> MigPlan:
    """The layouts to ask the MIG manager for; see the module docstring. Never invalid:
    an answer :func:`plan_errors` rejects is replaced by the greedy one, and that by no
    change at all."""
    if not any(n > 0 for n in demand.waiting.values()) and not demand.whole:
        return MigPlan((), "nothing-to-do", {})
    hint = greedy_mig_plan(nodes, demand, in_flight)
    if plan_errors(nodes, hint, in_flight):
        hint = MigPlan((), "greedy-invalid", {})
    # ---- data ----------------------------------------------------------------------------
    cands = [(n, g) for n, g in _candidates(nodes) if g.model not in in_flight]
    # Bound the model: per model, the nodes the greedy order prefers (MIG mode first).
    by_model: dict[str, list[str]] = defaultdict(list)
    for n, _ in cands:
        for m in {g.model for g in n.gpus}:
            if n.name not in by_model[m]:
                by_model[m].append(n.name)
    node_by_name = {n.name: n for n in nodes}
    keep: set[str] = set()
    hinted_nodes = {c.node for c in hint.changes}
    for names in by_model.values():
        names.sort(key=lambda x: (x not in hinted_nodes, not node_by_name[x].in_mig_mode,
                                  node_by_name[x].whole_free, x))
        keep.update(names[:max_nodes_per_model])
    cands = [(n, g) for n, g in cands if n.name in keep]
    model = cp_model.CpModel()
    y: dict[tuple[str, int, int], cp_model.IntVar] = {}
    opts: dict[tuple[str, int], list[Counts | str]] = {}
    changed: dict[tuple[str, int], cp_model.IntVar] = {}
    gain_terms: dict[tuple[str, str], list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
    created_terms: list[tuple[int, cp_model.IntVar]] = []
    fill_terms: list[tuple[int, cp_model.IntVar]] = []  # compute slices of demanded profiles
    demanded = _demanded(demand)
    for n, g in cands:
        key = (n.name, g.index)
        opts[key] = _options(g, n.busy)
        for j, o in enumerate(opts[key]):
            v = model.new_bool_var(f"y[{n.name},{g.index},{j}]")
            y[n.name, g.index, j] = v
            for p, k in _gain(o, g.counts).items():
                gain_terms[g.model, p].append((k, v))
                created_terms.append((k, v))
            filled = _fill(g, o, demanded)
            if filled:
                fill_terms.append((filled, v))
        c = model.new_bool_var(f"c[{n.name},{g.index}]")
        model.add(sum(y[n.name, g.index, j] for j in range(len(opts[key]))) == c)
        changed[key] = c

    # ---- one node per model at a time ------------------------------------------------------
    k_vars: dict[tuple[str, str], cp_model.IntVar] = {}
    for (name, index), c in changed.items():
        m = _gpu(node_by_name[name], index).model
        if (name, m) not in k_vars:
            k_vars[name, m] = model.new_bool_var(f"k[{name},{m}]")
        model.add_implication(c, k_vars[name, m])
    per_model: dict[str, list[cp_model.IntVar]] = defaultdict(list)
    for (_, m), v in k_vars.items():
        per_model[m].append(v)
    for vs in per_model.values():
        model.add(sum(vs) <= 1)

    # ---- MIG demand ------------------------------------------------------------------------
    sw: dict[tuple[str, str], cp_model.IntVar] = {}
    sf: dict[tuple[str, str], cp_model.IntVar] = {}
    for mp in sorted(set(demand.waiting) | set(demand.forecast)):
        w_n, f_n = max(0, demand.waiting.get(mp, 0)), max(0, demand.forecast.get(mp, 0))
        terms = gain_terms.get(mp, [])
        cap = sum(k for k, _ in terms)
        sw[mp] = model.new_int_var(0, min(w_n, cap), f"sw[{mp}]")
        sf[mp] = model.new_int_var(0, min(f_n, cap), f"sf[{mp}]")
        model.add(sw[mp] + sf[mp] <= sum(k * v for k, v in terms))

    # ---- whole demand ------------------------------------------------------------------------
    v_q: dict[tuple[str, str], cp_model.IntVar] = {}
    for q in demand.whole:
        for node in nodes:
            only = _single_model(node)
            if only is None or (q.models and only not in q.models):
                continue
            v_q[q.key, node.name] = model.new_bool_var(f"v[{q.key},{node.name}]")
        model.add(sum(v for (k, _), v in v_q.items() if k == q.key) <= 1)
    for node in nodes:
        mine = [(q, v_q[q.key, node.name]) for q in demand.whole if (q.key, node.name) in v_q]
        if not mine:
            continue
        room = []
        fixed_room = 0
        for g in node.gpus:
            key = (node.name, g.index)
            if g.held:
                continue
            if not g.mig_enabled:
                if key in changed:  # stays whole unless it changes (to MIG)
                    room.append(1 - changed[key])
                else:
                    fixed_room += 1
            elif key in changed and WHOLE in opts[key]:
                j = opts[key].index(WHOLE)
                room.append(y[node.name, g.index, j])
        model.add(sum(q.gpus * v for q, v in mine) <= fixed_room + sum(room))

    # ---- objective -------------------------------------------------------------------------
    broken: list[cp_model.IntVar] = []  # whole-free nodes that get a MIG GPU
    entering: list[cp_model.IntVar] = []  # nodes not in MIG mode that enter it
    for node in nodes:
        to_mig = [y[node.name, g.index, j] for g in node.gpus if (node.name, g.index) in opts
                  for j, o in enumerate(opts[node.name, g.index]) if o != WHOLE
                  and not g.mig_enabled]
        if not to_mig:
            continue
        b = model.new_bool_var(f"b[{node.name}]")
        for v in to_mig:
            model.add_implication(v, b)
        # A node that switches a GPU to MIG switches every whole GPU it may: the switch
        # needs the node idle (MigNode.busy), which a node in use seldom is again, so a
        # GPU left whole now could not become MIG later.
        for g in node.gpus:
            if not g.mig_enabled and (node.name, g.index) in changed:
                model.add_implication(b, changed[node.name, g.index])
        if node.whole_free:
            broken.append(b)
        if not node.in_mig_mode:
            entering.append(b)
    LE = cp_model.LinearExpr
    # Each weight exceeds the largest total of every term below it. Those totals are
    # bounded by what one plan can change, not by the candidates: one node per model
    # changes, so at most most[m] GPUs of model m (the most candidates of m on one node),
    # each creating at most its memory slices of instances and filling at most its
    # compute slices; and at most one node per model changes, enters MIG mode, breaks a
    # whole-free node or is off the hint. (Summed over every candidate instead, the
    # product of the weights passes 2^63 on a few hundred nodes of many models, and the
    # model is invalid.)
    per_node: dict[tuple[str, str], list[MigGpu]] = defaultdict(list)
    for n, g in cands:
        per_node[n.name, g.model].append(g)
    most: dict[str, list[MigGpu]] = {}
    for (_, m), gs in per_node.items():
        if len(gs) > len(most.get(m, ())):
            most[m] = gs
    n_models = len(most)
    n_changed = sum(len(gs) for gs in most.values())
    n_created = sum(_max_instances(g) for gs in most.values() for g in gs)
    n_fore = min(n_created, sum(max(0, n) for n in demand.forecast.values()))
    n_fill = sum(_compute_slices(g) for gs in most.values() for g in gs)
    # Last, on a tie: the nodes the greedy plan (the hint) changes, so that symmetric
    # nodes are chosen deterministically.
    off_hint = [v for (name, _), v in k_vars.items() if name not in hinted_nodes]
    t_w = 1
    f_w = t_w * (min(len(off_hint), n_models) + 1)
    g_w = f_w * (n_created + 1)
    e_w = g_w * (n_fill + 1)
    d_w = e_w * (n_fore + 1)
    c_w = d_w * (n_changed + 1)
    b_w = c_w * (min(len(entering), n_models) + 1)
    a_w = b_w * (min(len(broken), n_models) + 1)
    model.maximize(
        a_w * (LE.sum(list(sw.values())) + LE.sum(list(v_q.values())))
        - b_w * LE.sum(broken)
        - c_w * LE.sum(entering)
        - d_w * LE.sum(list(changed.values()))
        + e_w * LE.sum(list(sf.values()))
        + g_w * LE.weighted_sum([v for _, v in fill_terms], [k for k, _ in fill_terms])
        - f_w * LE.weighted_sum([v for _, v in created_terms], [k for k, _ in created_terms])
        - t_w * LE.sum(off_hint)
    )

    # ---- hint from the greedy plan -------------------------------------------------------------
    hinted: dict[tuple[str, int], Counts | str] = {}
    for ch in hint.changes:
        node = node_by_name[ch.node]
        config = {i: d for d in ch.devices for i in d.devices}
        for i in ch.changed:
            d = config[i]
            hinted[ch.node, i] = d.mig_devices if d.mig_enabled else WHOLE
    for (name, index, j), v in y.items():
        model.add_hint(v, 1 if hinted.get((name, index)) == opts[name, index][j] else 0)
    for key, c in changed.items():
        model.add_hint(c, 1 if key in hinted else 0)
    for (name, m), kv in k_vars.items():
        model.add_hint(kv, 1 if any(n == name and _gpu(node_by_name[n], i).model == m
                                   for n, i in hinted) else 0)

    # ---- solve -------------------------------------------------------------------------------
    solver = params.solver()
    status = solver.solve(model)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _fallback(hint, name)

    # ---- read --------------------------------------------------------------------------------
    chosen: dict[tuple[str, int], Counts | str] = {}
    for (node_name, index, j), v in y.items():
        if solver.boolean_value(v):
            chosen[node_name, index] = opts[node_name, index][j]
    whole_served = tuple(sorted({k for (k, _), v in v_q.items() if solver.boolean_value(v)}))
    plan = MigPlan(_changes(nodes, chosen), name, _served(nodes, demand, chosen), whole_served)
    if plan_errors(nodes, plan, in_flight):
        return _fallback(hint, f"{name}-invalid")
    return plan


def _fallback(hint: MigPlan, status: str) -> MigPlan:
    return MigPlan(hint.changes, f"{status}/fallback-greedy", MappingProxyType(dict(hint.served)),
                   hint.whole_served)
