"""MIG layouts: validity, free placements and the maximal layouts of a GPU geometry.

A layout is a set of GPU instances, each a profile at a start memory slice. It is valid
when every instance sits at one of its profile's allowed starts, memory ranges do not
overlap, at most one ``+me`` instance exists, no profile exceeds its per-GPU maximum and
the compute slices add up to at most the GPU's (``reference/mig-geometry.md``). With the
published tables the last two follow from the first two; they are checked anyway so a
geometry that breaks that coincidence is still handled right.

Functions take any objects with ``profile`` and ``start`` (``MigSlot`` or
``packing.model.MigInstance``). Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from packing.catalog import MigGeometry, MigProfile


class SlotLike(Protocol):
    """Anything placed: a profile name at a start memory slice."""

    @property
    def profile(self) -> str: ...

    @property
    def start(self) -> int: ...


@dataclass(frozen=True, order=True)
class MigSlot:
    """One GPU instance of a layout: ``profile`` at memory slice ``start``."""

    profile: str
    start: int

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}"


def _label(slot: SlotLike) -> str:
    return f"{slot.profile}@{slot.start}"


def memory_range(geometry: MigGeometry, slot: SlotLike) -> range:
    """Memory slices the instance occupies (KeyError for a profile the GPU lacks)."""
    size = geometry.profile(slot.profile).memory_slices
    return range(slot.start, slot.start + size)


def _ranges_text(r: range) -> str:
    return str(r.start) if len(r) == 1 else f"{r.start}-{r.stop - 1}"


def layout_errors(geometry: MigGeometry, slots: Iterable[SlotLike]) -> list[str]:
    """Why a layout is invalid, one human-readable line per problem, naming the slots.

    Empty list = valid.
    """
    placed = list(slots)
    errors: list[str] = []
    known: list[tuple[SlotLike, MigProfile]] = []
    for slot in placed:
        if not geometry.has_profile(slot.profile):
            valid = ", ".join(geometry.profile_names)
            errors.append(f"{_label(slot)}: unknown profile {slot.profile!r} (valid: {valid})")
            continue
        profile = geometry.profile(slot.profile)
        known.append((slot, profile))
        if slot.start not in profile.starts:
            allowed = ", ".join(map(str, profile.starts))
            errors.append(
                f"{_label(slot)}: start {slot.start} not allowed for {profile.name} "
                f"(allowed starts: {allowed})"
            )

    # Overlap is checked on every known-profile slot, bad start or not: a wrongly placed
    # instance still claims memory and the caller wants to hear about both.
    for i, (a, pa) in enumerate(known):
        ra = range(a.start, a.start + pa.memory_slices)
        for b, pb in known[i + 1 :]:
            rb = range(b.start, b.start + pb.memory_slices)
            lo, hi = max(ra.start, rb.start), min(ra.stop, rb.stop)
            if lo < hi:
                errors.append(
                    f"{_label(a)} overlaps {_label(b)} on memory slices "
                    f"{_ranges_text(range(lo, hi))}"
                )

    with_me = [_label(s) for s, p in known if p.media_extensions]
    if len(with_me) > 1:
        errors.append(f"more than one +me instance: {', '.join(with_me)}")

    counts = Counter(p.name for _, p in known)
    for name, count in sorted(counts.items()):
        profile = geometry.profile(name)
        if count > profile.max_count:
            labels = ", ".join(_label(s) for s, p in known if p.name == name)
            errors.append(
                f"{count} x {name} exceeds the maximum of {profile.max_count} per GPU: {labels}"
            )

    compute = sum(p.compute_slices for _, p in known)
    if compute > geometry.compute_slices:
        labels = ", ".join(_label(s) for s, _ in known)
        errors.append(
            f"compute slices {compute} exceed the GPU's {geometry.compute_slices}: {labels}"
        )
    return errors


def is_valid_layout(geometry: MigGeometry, slots: Iterable[SlotLike]) -> bool:
    return not layout_errors(geometry, slots)


def used_slices(geometry: MigGeometry, slots: Iterable[SlotLike]) -> tuple[int, int]:
    """(compute slices, memory slices) the instances take (KeyError on unknown profile)."""
    compute = memory = 0
    for slot in slots:
        profile = geometry.profile(slot.profile)
        compute += profile.compute_slices
        memory += profile.memory_slices
    return compute, memory


def slice_bound(geometry: MigGeometry, compute: int, memory: int) -> int:
    """The fewest GPUs that hold ``compute`` and ``memory`` slices, layout rules aside:
    ``max(ceil(compute / C), ceil(memory / M))`` on the C/M-slice geometry."""
    return max(-(-compute // geometry.compute_slices), -(-memory // geometry.memory_slices))


def free_starts(geometry: MigGeometry, slots: Iterable[SlotLike], profile: str) -> tuple[int, ...]:
    """Starts at which one more ``profile`` instance keeps the layout valid, ascending.

    An invalid layout cannot be kept valid, and a profile the GPU lacks cannot be added:
    both give ``()``.
    """
    placed = list(slots)
    if not geometry.has_profile(profile) or layout_errors(geometry, placed):
        return ()
    new = geometry.profile(profile)
    compute, _ = used_slices(geometry, placed)
    if compute + new.compute_slices > geometry.compute_slices:
        return ()
    if sum(1 for s in placed if s.profile == profile) >= new.max_count:
        return ()
    if new.media_extensions and any(geometry.profile(s.profile).media_extensions for s in placed):
        return ()
    taken = {i for s in placed for i in memory_range(geometry, s)}
    return tuple(
        start for start in new.starts if taken.isdisjoint(range(start, start + new.memory_slices))
    )


def _default_profiles(geometry: MigGeometry) -> tuple[str, ...]:
    return tuple(p.name for p in geometry.classic)


def maximal_layouts(
    geometry: MigGeometry, profiles: Iterable[str] | None = None
) -> tuple[tuple[MigSlot, ...], ...]:
    """Every valid layout of ``profiles`` to which no further such instance can be added.

    ``profiles`` defaults to the non-``+me`` ones (``geometry.classic``). Each layout is
    sorted; layouts come in sorted order, so the answer is deterministic.
    """
    names = _default_profiles(geometry) if profiles is None else tuple(profiles)
    for name in names:
        geometry.profile(name)  # KeyError naming the valid profiles
    return _maximal_layouts(geometry, tuple(sorted(set(names))))


@lru_cache(maxsize=256)
def _maximal_layouts(
    geometry: MigGeometry, names: tuple[str, ...]
) -> tuple[tuple[MigSlot, ...], ...]:
    # Candidates as (slot, memory bit mask, profile); the rules are checked incrementally
    # on bit masks and counters because this runs for every geometry and profile set the
    # rebalancer asks about, and a layout-by-layout check is a hundred times slower.
    candidates = [
        (MigSlot(p.name, start), ((1 << p.memory_slices) - 1) << start, p)
        for p in (geometry.profile(n) for n in names)
        for start in p.starts
    ]
    candidates.sort(key=lambda c: c[0])
    counts: Counter[str] = Counter()
    found: list[tuple[MigSlot, ...]] = []
    chosen: list[MigSlot] = []

    def fits(mask: int, compute: int, media: bool, bits: int, p: MigProfile) -> bool:
        return (
            not mask & bits
            and compute + p.compute_slices <= geometry.compute_slices
            and counts[p.name] < p.max_count
            and not (media and p.media_extensions)
        )

    # Include/exclude each candidate in a fixed order, pruning invalid prefixes: every
    # valid layout is visited exactly once; the maximal ones are kept.
    def walk(i: int, mask: int, compute: int, media: bool) -> None:
        if i == len(candidates):
            if not any(fits(mask, compute, media, b, p) for _, b, p in candidates):
                found.append(tuple(sorted(chosen)))
            return
        slot, bits, profile = candidates[i]
        if fits(mask, compute, media, bits, profile):
            chosen.append(slot)
            counts[profile.name] += 1
            walk(
                i + 1,
                mask | bits,
                compute + profile.compute_slices,
                media or profile.media_extensions,
            )
            counts[profile.name] -= 1
            chosen.pop()
        walk(i + 1, mask, compute, media)

    walk(0, 0, 0, False)
    return tuple(sorted(found))


def layout_from_counts(
    geometry: MigGeometry, counts: Mapping[str, int] | Iterable[tuple[str, int]]
) -> tuple[MigSlot, ...] | None:
    """A valid layout with exactly these instance counts (mig-parted ``mig-devices``).

    Of all placements, the one leaving the most room is chosen: the most non-``+me``
    profiles that still fit, then the most free starts for them, then the smallest
    sorted layout. A lone 3g thus goes to start 4 (the reference's advice), keeping 4g@0
    possible. None when no placement exists. Deterministic.
    """
    items = counts.items() if isinstance(counts, Mapping) else counts
    wanted: list[str] = []
    for name, count in items:
        geometry.profile(name)  # KeyError naming the valid profiles
        wanted.extend([name] * count)
    wanted.sort(key=lambda n: (-geometry.profile(n).memory_slices, n))
    classic = _default_profiles(geometry)
    best: tuple[tuple[int, int], tuple[MigSlot, ...]] | None = None

    def room(layout: list[MigSlot]) -> tuple[int, int]:
        starts = [free_starts(geometry, layout, n) for n in classic]
        return sum(1 for f in starts if f), sum(len(f) for f in starts)

    def place(i: int, chosen: list[MigSlot]) -> None:
        nonlocal best
        if i == len(wanted):
            score, layout = room(chosen), tuple(sorted(chosen))
            if best is None or score > best[0] or (score == best[0] and layout < best[1]):
                best = (score, layout)
            return
        # Instances of one profile are interchangeable: take their starts in increasing
        # order so no permutation of the same placement is visited twice.
        after = chosen[-1].start if i > 0 and wanted[i - 1] == wanted[i] else -1
        for start in free_starts(geometry, chosen, wanted[i]):
            if start > after:
                chosen.append(MigSlot(wanted[i], start))
                place(i + 1, chosen)
                chosen.pop()

    place(0, [])
    return None if best is None else best[1]


def fewest_layouts(
    geometry: MigGeometry, counts: Mapping[str, int]
) -> tuple[tuple[MigSlot, ...], ...]:
    """The fewest valid layouts that together hold ``counts`` instances of each profile.

    This is ``slice_bound`` with the layout rules kept (allowed starts, per-profile
    maxima, one ``+me`` instance): a lower bound on the GPUs of any placement of one
    instance per count, even one free to move every pod at every instant. It can exceed
    ``slice_bound``: three ``3g`` instances fill 9 of 7 compute slices but two GPUs hold
    at most two each.

    Exact: ``f(n) = 1 + min over maximal layouts L of f(max(n - L, 0))``, ``f(0) = 0``,
    over the count vectors of ``maximal_layouts`` of the profiles asked for (any layout of
    them is part of a maximal one, so no other layout can do better), memoised. The
    states are the count vectors below ``counts``; meant for the tens of instances one
    GPU model holds in a benchmark, not for a request path. Each returned layout is one
    of ``maximal_layouts`` (it may hold more instances than asked).
    """
    names = tuple(sorted(n for n, c in counts.items() if c > 0))
    for name in names:
        geometry.profile(name)  # KeyError naming the valid profiles
    if any(c < 0 for c in counts.values()):
        raise ValueError(f"instance counts must not be negative: {dict(counts)}")
    if not names:
        return ()
    caps = _layout_caps(geometry, names)
    out: list[tuple[MigSlot, ...]] = []
    n = tuple(counts[name] for name in names)
    while any(n):
        cap, layout = caps[_fewest(geometry, names, n)[1]]
        out.append(layout)
        n = _less(n, cap)
    return tuple(out)


def _less(n: tuple[int, ...], cap: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(max(0, a - b) for a, b in zip(n, cap, strict=True))


@lru_cache(maxsize=1 << 18)
def _fewest(geometry: MigGeometry, names: tuple[str, ...], n: tuple[int, ...]) -> tuple[int, int]:
    """(fewest layouts holding ``n``, index in ``_layout_caps`` of a first one to take);
    memoised across calls, since a benchmark asks about nearby count vectors all run."""
    if not any(n):
        return 0, -1
    # Only layouts that hold at least one instance still wanted make progress.
    return min(
        (1 + _fewest(geometry, names, _less(n, cap))[0], i)
        for i, (cap, _) in enumerate(_layout_caps(geometry, names))
        if any(a and b for a, b in zip(n, cap, strict=True))
    )


@lru_cache(maxsize=64)
def _layout_caps(
    geometry: MigGeometry, names: tuple[str, ...]
) -> tuple[tuple[tuple[int, ...], tuple[MigSlot, ...]], ...]:
    """(instances per profile of ``names``, layout) of each maximal layout, one layout per
    count vector and none whose counts another's dominate."""
    by_counts: dict[tuple[int, ...], tuple[MigSlot, ...]] = {}
    for layout in maximal_layouts(geometry, names):
        held = Counter(s.profile for s in layout)
        by_counts.setdefault(tuple(held[n] for n in names), layout)
    vectors = list(by_counts)
    kept = [
        v for v in vectors
        if not any(w != v and all(a >= b for a, b in zip(w, v, strict=True)) for w in vectors)
    ]
    return tuple((v, by_counts[v]) for v in sorted(kept, reverse=True))
