"""The crawl loop's cyclic garbage collector, run between callbacks.

CPython starts a gen-0 pass once its count of new container objects (allocations less
deallocations) reaches the threshold, wherever that happens: mostly inside a callback that
builds a large batch (a delivery's answers, a commit's layer, a worker's answer frame), so the
pass walks that batch's temporaries too and promotes them to gen 1, where the next gen-1 pass
walks them again. At 50,000 the crawl loop's passes took 20-60 ms (the loop's stall bound is
20 ms); at 10,000 they came 37 times as often, as every batch tripped one.

``GcPacer`` runs the passes from a loop timer instead, between callbacks, when the last
callback's temporaries are gone and a pass walks only what stays: gen 0 once the count reached
``young``, gen 1 in its place every ``middle`` gen-0 passes, a full pass every ``old`` gen-1
passes and ``full_s`` at the soonest (CPython's own rule has "a quarter of the old generation is
new" instead, which Python cannot read; a full pass walks every object not frozen: 0.5 s or more).
The interpreter's trigger stays on at ``auto`` as a safety net for a burst inside one callback.
``young`` 5,000 instead of 2,000 was measured (e2e bench, 20,000 hosts): 580 gen-0 passes of
2.7 ms a minute instead of ~900 of 1.8 ms, only 6% less GC time (a pass walks what the young
count stands for, so the cost follows the objects, not the passes), but gen-1 passes of 10.5 ms
(three over 20 ms) and 14 stall sites at the pacer's tick against 2: kept at 2,000.
What the passes walk (measured: the young generation's types sampled before the pacer's passes,
``crawlerd demo`` at 3,000 hosts, ~600 pages/s): before, 24 % of gen 0 and 41 % of gen 1 were
DRUM's answers (a delivery of 8,192 lives over several loop iterations), now the DRUM kernel's
``Result``, which the collector does not track: gen-0 passes walk ~6,200 objects instead of
~7,900. What stays: pairs of (key, value) and view entries the overlays hand the writer (~45 % of
gen 0, tuples of atoms: walked once, then untracked), DUST's ``Evidence`` lists (a third of
gen 1; their entries are now native records the collector does not track,
``crawlerd._native.dustobs``, the lists holding them remain); a page's ``Link``s were there too, until they became a native record the collector does
not track (``crawlerd._native.linkrec``). Fewer passes by a larger ``young`` saves little (above); fewer such
objects is what pays.
Invariant while started: one timer armed.
"""

from __future__ import annotations

import asyncio
import gc
import time

PACE_S = 0.02           # how often the count is looked at
YOUNG = 2_000           # a gen-0 pass between callbacks once the count reached this
MIDDLE = 20             # gen-0 passes per gen-1 pass
OLD = 100               # gen-1 passes per full pass
AUTO = 100_000          # the interpreter's own gen-0 trigger (a burst inside one callback)
FULL_S = 600.0          # a full pass at most this often


class GcPacer:
    def __init__(self, *, interval_s: float = PACE_S, young: int = YOUNG, middle: int = MIDDLE, old: int = OLD,
                 auto: int = AUTO, full_s: float = FULL_S, clock=time.monotonic):
        self.interval_s = interval_s
        self.full_s, self.clock = full_s, clock
        self.young, self.middle, self.old, self.auto = young, middle, old, auto
        self.passes = [0, 0, 0]         # passes this pacer ran, per generation
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_full = clock()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Pace the collector from ``loop`` (after start-up's objects were frozen)."""
        gc.set_threshold(self.auto, self.middle, self.old)
        self._loop = loop
        self._arm()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        self._timer = self._loop.call_later(self.interval_s, self._tick)

    def _tick(self) -> None:
        self.step()
        self._arm()

    def step(self) -> int | None:
        """One look at the count: the generation collected, or None."""
        young, middle, old = gc.get_count()
        if young < self.young:
            return None
        gen = 0
        if middle >= self.middle:
            gen = 1
            if old >= self.old and self.clock() - self._last_full >= self.full_s:
                gen = 2
                self._last_full = self.clock()
        gc.collect(gen)
        self.passes[gen] += 1
        return gen
