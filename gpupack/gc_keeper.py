"""The cyclic garbage collector's full collections, kept short and off the request path.

CPython's collector scans, in a full (generation 2) collection, every container object
it tracks that is not frozen, holding the GIL throughout. ``gpupack serve`` freezes
(``gc.freeze``) what the first lists of the cluster built, but much of the long-lived
heap is made after that: the per-node MIG views (~40,000 GPU views and their MIG slots
at 5,000 nodes) and rendered rows that the first scrape of ``/metrics`` builds and keeps
(the MIG actuator keeps views too, where it runs), the memo's entries, the plans.
Measured at 5,000 nodes (bench/README.md, section "What makes the tail"): ~220,000
objects made after the first freeze, and a full collection over them took 80-110 ms,
once every few thousand requests, inside whichever request triggered it.

:class:`GcKeeper` freezes again: ``first_s`` after the first freeze, then at doubling
intervals up to every ``every_s`` seconds, so that the start-up's builds (the first MIG
pass, the first scrape, the memo's warming, the first plan, all within seconds of the
first lists) are frozen soon after they are made, and what later work keeps is frozen
within ``every_s``. A step collects the young generations only (what was made since the
last one: well under a millisecond) and freezes what is left, which costs no scan at
all: so full collections the interpreter starts on its own scan only what is younger
than the last step, and no step is a pause of its own. A garbage cycle that had reached
the oldest generation is frozen with the rest, so every ``full_every_s`` seconds a step
first unfreezes everything and runs one full collection, reclaiming such cycles (an
object freed by reference counting, as most are, is freed at once, frozen or not): one
scan of the whole heap (~0.1 s at 5,000 nodes) that often, instead of one every few
thousand requests. A step waits for a moment when no request is in flight (``busy``),
for at most ``patience`` tries ``retry_s`` apart, then runs anyway.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from scheduler.engine import Loop, LoopMetrics, Outcome

log = logging.getLogger("gpupack.gc")

FREEZE_EVERY_S = 30.0
FIRST_S = 1.0
FULL_EVERY_S = 3600.0
RETRY_S = 0.02
PATIENCE = 50  # tries RETRY_S apart while requests are in flight (~1 s), then anyway


class GcKeeper:
    """Collect and freeze ``first_s`` after :meth:`start`, then at doubling intervals up to
    every ``every_s`` seconds (0: never); unfreeze first every ``full_every_s`` (0:
    never). ``collector``: the ``gc`` module (tests pass a recorder)."""

    def __init__(self, every_s: float = FREEZE_EVERY_S, full_every_s: float = FULL_EVERY_S,
                 first_s: float = FIRST_S,
                 busy: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 collector: Any = gc, retry_s: float = RETRY_S, patience: int = PATIENCE,
                 loop_metrics: LoopMetrics | None = None) -> None:
        self.every_s = every_s
        self.full_every_s = full_every_s
        self.busy = busy
        self.clock = clock
        self.sleep = sleep
        self.gc = collector
        self.retry_s = retry_s
        self.patience = patience
        self.freezes = 0  # steps done
        self.full = 0  # of which unfroze first
        self.last_pause_s = 0.0  # the last step's collection and freeze
        self._last_full = clock()
        self.loop = Loop("gc-freeze", self.step, poll_s=min(first_s, every_s), log=log,
                         metrics=loop_metrics)

    def start(self) -> None:
        if self.every_s > 0:
            self.loop.start()

    def stop(self) -> None:
        self.loop.stop()

    def freeze_now(self) -> None:
        """A full collection, then freeze what survived (the first lists' objects, at
        sync, before any request is answered)."""
        self.gc.collect()
        self.gc.freeze()

    def step(self) -> Outcome:
        for _ in range(self.patience):
            if not self.busy():
                break
            self.sleep(self.retry_s)
        began = self.clock()
        full = self.full_every_s > 0 and began - self._last_full >= self.full_every_s
        if full:
            self.gc.unfreeze()
            self._last_full = began
            self.full += 1
            self.gc.collect()
        else:
            self.gc.collect(1)  # the young generations: what was made since the last step
        self.gc.freeze()
        self.freezes += 1
        self.last_pause_s = self.clock() - began
        if self.loop.poll_s is not None:  # the next step: twice as far, up to every_s
            self.loop.poll_s = min(2 * self.loop.poll_s, self.every_s)
        return Outcome.DONE
