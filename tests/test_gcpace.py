"""GcPacer: the collector's passes run between loop callbacks, not inside a batch."""

import asyncio
import gc
import weakref

from crawlerd.gcpace import GcPacer


class Node:
    def __init__(self):
        self.me = self          # a cycle: only the collector frees it


class Box:                      # a container the collector tracks (no free list hides its allocation)
    pass


def test_a_batch_inside_a_callback_is_not_collected_mid_way_and_cycles_are_freed_after_it():
    async def go():
        loop = asyncio.get_running_loop()
        pacer = GcPacer(interval_s=0.005, young=500, auto=200_000)
        passes = []                         # (generation, inside the batch)
        inside = [False]

        def on_gc(phase, info):
            if phase == "start":
                passes.append((info["generation"], inside[0]))

        old = gc.get_threshold()
        gc.collect()
        gc.callbacks.append(on_gc)
        pacer.start(loop)
        try:
            def batch():
                inside[0] = True
                temporaries = [Box() for _ in range(50_000)]   # far past CPython's default trigger (700)
                garbage = Node()
                inside[0] = False
                return temporaries[:1_000], weakref.ref(garbage)     # what stays: past ``young``

            keep, ref = batch()
            for _ in range(50):
                await asyncio.sleep(0.005)
                if ref() is None:
                    break
            return passes, ref() is None, pacer.passes, len(keep)
        finally:
            pacer.stop()
            gc.callbacks.remove(on_gc)
            gc.set_threshold(*old)

    passes, freed, paced, _ = asyncio.run(go())
    assert freed                                            # the pacer's pass freed the cycle
    assert not any(mid for _, mid in passes), passes        # no pass inside the batch
    assert sum(paced) >= 1


def test_the_pacer_steps_up_a_generation_as_cpythons_thresholds_do():
    old = gc.get_threshold()
    now = [0.0]
    pacer = GcPacer(young=10, middle=3, old=2, auto=1_000_000, full_s=100.0, clock=lambda: now[0])
    pacer.start(asyncio.new_event_loop())
    try:
        gc.collect()
        gens = []
        for i in range(24):
            if i == 12:
                now[0] = 100.0                  # a full pass is due by time from here
            junk = [Box() for _ in range(50)]   # past ``young`` new containers
            gens.append(pacer.step())
            del junk
        assert pacer.step() is None             # nothing new since the last pass
    finally:
        pacer.stop()
        gc.set_threshold(*old)
    # a gen-1 pass every fourth; a full pass in place of a gen-1 pass once two came since the last
    # one, and full_s went by: none in the first 100 s, then one
    assert gens[:8] == [0, 0, 0, 1, 0, 0, 0, 1], gens
    assert 2 not in gens[:12] and gens[12:].count(2) == 1, gens
