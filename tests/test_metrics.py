"""Metrics: the loop-lag histogram and per-process usage."""

import asyncio
import os
import time

import pytest

from crawlerd.metrics import (
    LAG_BUCKETS_S,
    STALL_SPLIT_S,
    LoopLag,
    lag_quantile_s,
    proc_rss_bytes,
    process_usage,
)


def test_lag_samples_land_in_the_first_bucket_at_or_above_them():
    lag = LoopLag()
    for v in (0.0, 0.001, 0.0011, 0.3, 99.0):
        lag.record(v)
    snap = lag.snapshot()
    assert snap["buckets_s"] == list(LAG_BUCKETS_S)
    cum = dict(zip(LAG_BUCKETS_S, snap["cumulative"], strict=True))
    assert cum[0.001] == 2 and cum[0.0025] == 3 and cum[0.25] == 3 and cum[0.5] == 4 and cum[10.0] == 4
    assert snap["count"] == 5 and snap["sum_s"] == pytest.approx(99.3021)
    assert snap["max_s"] == 99.0 and snap["recent_max_s"] == 99.0
    assert snap["cumulative"] == sorted(snap["cumulative"])


def test_a_blocking_callback_shows_as_loop_lag():
    async def main():
        lag = LoopLag(interval_s=0.02)
        lag.start(asyncio.get_running_loop())
        while lag.count < 3:                  # timers fire on an idle loop
            await asyncio.sleep(0.01)
        before = lag.snapshot()
        time.sleep(0.3)                       # the stall being measured: the loop cannot run the timer
        n = lag.count
        while lag.count == n:
            await asyncio.sleep(0.01)
        lag.stop()
        return before, lag.snapshot()

    before, after = asyncio.run(main())
    assert before["max_s"] < 0.25
    assert after["max_s"] >= 0.25
    i = LAG_BUCKETS_S.index(0.25)
    assert after["count"] - after["cumulative"][i] >= 1        # one sample above 250 ms


def test_process_usage_of_this_process_and_a_gone_one():
    me = process_usage("shard", os.getpid(), "0")
    assert me["role"] == "shard" and me["shard"] == "0" and me["cpu_s"] > 0
    assert me["rss_bytes"] > 10 << 20
    assert proc_rss_bytes(2 ** 22 + 12345) is None


def test_lag_quantile_is_the_bound_of_the_bucket_holding_it():
    lag = LoopLag()
    for v in [0.0005] * 997 + [0.018, 0.018, 3.0]:
        lag.record(v)
    snap = lag.snapshot()
    assert lag_quantile_s(snap["cumulative"], snap["count"], 0.5) == 0.001
    assert lag_quantile_s(snap["cumulative"], snap["count"], 0.999) == 0.02
    assert lag_quantile_s(snap["cumulative"], snap["count"], 1.0) == 5.0
    lag.record(60.0)
    snap = lag.snapshot()
    assert lag_quantile_s(snap["cumulative"], snap["count"], 1.0) == float("inf")
    assert lag_quantile_s([0] * len(LAG_BUCKETS_S), 0, 0.99) is None


def test_lag_p999_tells_the_20_ms_bound_from_30_and_50_ms():
    """The stall bound is 20 ms: a p99.9 just over it reads 30 ms, not the next coarse bucket."""
    for worst, p999 in ((0.012, 0.015), (0.019, 0.02), (0.025, 0.03), (0.04, 0.05)):
        lag = LoopLag()
        for v in [0.0005] * 998 + [worst] * 2:
            lag.record(v)
        snap = lag.snapshot()
        assert lag_quantile_s(snap["cumulative"], snap["count"], 0.999) == p999


def test_lag_quantile_reads_a_histogram_with_its_own_bounds():
    """A daemon of another version reports its own ``buckets_s``; the quantile uses those."""
    old = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
    cum = [990, 990, 990, 990, 990, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000]
    assert lag_quantile_s(cum, 1000, 0.999, old) == 0.05


def test_a_stall_is_traced_to_the_function_that_held_the_loop():
    import asyncio
    import time as _time

    from crawlerd.metrics import LoopLag

    def hold_the_loop_for(seconds: float) -> None:
        end = _time.monotonic() + seconds
        while _time.monotonic() < end:       # a synchronous callback that never yields
            pass

    async def crawl():
        lag = LoopLag(interval_s=0.01, watch_s=0.05)
        lag.start(asyncio.get_running_loop())
        await asyncio.sleep(0.05)
        hold_the_loop_for(1.0)     # long: on a loaded box the watch thread must get a CPU inside it
        await asyncio.sleep(0.05)
        snap = lag.snapshot()
        lag.stop()
        return snap

    snap = asyncio.run(crawl())
    # On a loaded box the loop may also stall elsewhere (waiting for a CPU); those are other places.
    held = [s for s in snap["stall_sites"] if "hold_the_loop_for" in s["where"]]
    assert len(held) == 1, snap
    assert held[0]["stalls"] == 1
    assert held[0]["worst_s"] >= 0.2
    assert snap["max_s"] >= 0.9


def test_a_loop_that_never_stalls_names_no_place():
    import asyncio

    from crawlerd.metrics import LoopLag

    async def crawl():
        lag = LoopLag(interval_s=0.01, watch_s=0.2)
        lag.start(asyncio.get_running_loop())
        for _ in range(20):
            await asyncio.sleep(0.01)
        snap = lag.snapshot()
        lag.stop()
        return snap

    assert asyncio.run(crawl())["stall_sites"] == []


def test_the_loop_threads_times_grow_with_its_own_work():
    from crawlerd.metrics import ThreadTimes

    t = ThreadTimes()
    cpu0, wait0 = t.read()
    end = time.monotonic() + 0.05
    while time.monotonic() < end:
        pass
    cpu1, wait1 = t.read()
    t.close()
    assert cpu1 - cpu0 > 0.0
    assert wait0 is None or wait1 >= wait0


def test_the_schedstat_read_parses_the_file():
    import os

    import pytest

    from crawlerd._native.schedstat import read_schedstat

    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:
        pytest.skip("no /proc/thread-self/schedstat")
    try:
        before = [int(f) for f in os.pread(fd, 96, 0).split()[:2]]
        got = read_schedstat(fd)
        after = [int(f) for f in os.pread(fd, 96, 0).split()[:2]]
        assert all(b <= g <= a for b, g, a in zip(before, got, after, strict=True))
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        read_schedstat(-1)


def test_the_due_clock_answers_once_the_due_time_is_overdue_and_ends_on_stop():
    import threading

    from crawlerd._native.stallclock import DueClock

    clock = DueClock()
    assert clock.due == 0.0
    start = time.monotonic()
    clock.due = start + 0.1
    due, late = clock.wait_overdue(0.05, 0.005)
    assert due == clock.due and late >= 0.05
    assert time.monotonic() - start >= 0.15           # not before the due time plus the threshold

    clock.due = time.monotonic() + 3600.0             # never overdue: only stop() ends the wait
    got = []
    waiter = threading.Thread(target=lambda: got.append(clock.wait_overdue(0.02, 0.005)))
    waiter.start()
    spins = 0
    end = time.monotonic() + 0.1
    while time.monotonic() < end:                     # this thread runs Python while the other waits
        spins += 1
    clock.stop()
    waiter.join(timeout=2.0)
    assert not waiter.is_alive() and got == [None]
    assert spins > 1000
    clock.reset()
    clock.due = time.monotonic() - 1.0
    assert clock.wait_overdue(0.5, 0.005)[1] >= 1.0  # usable again after reset


async def lag_around(block, lag: LoopLag) -> dict:
    """``lag`` started on this loop; after its first samples ``block()`` holds the loop, then one
    more sample lands (the late one) and the snapshot is returned."""
    lag.start(asyncio.get_running_loop())
    while lag.count < 3:
        await asyncio.sleep(0.01)
    block()
    n = lag.count
    while lag.count == n:
        await asyncio.sleep(0.01)
    lag.stop()
    return lag.snapshot()


def test_a_sleeping_stall_is_the_loops_own_and_split_into_its_parts():
    """A callback that blocks (here: sleeps) is the loop's own stall: its thread was not waiting
    for a CPU, so the own-lag histogram holds it as the wall-lag histogram does."""
    snap = asyncio.run(lag_around(lambda: time.sleep(0.3), LoopLag(interval_s=0.01)))
    i = LAG_BUCKETS_S.index(0.1)
    assert snap["count"] - snap["own_cumulative"][i] >= 1          # an own sample above 100 ms
    assert snap["own_max_s"] >= 0.2
    assert snap["own_cumulative"][-1] <= snap["count"]
    assert all(o >= w for o, w in zip(snap["own_cumulative"], snap["cumulative"], strict=True))  # own <= wall
    st = snap["stalls"]
    assert st["count"] >= 1 and st["lag_s"] >= 0.25
    assert st["cpu_s"] < st["lag_s"]          # asleep: the thread's CPU is a small part of the stall


def test_a_full_collection_during_a_stall_is_timed_and_named_as_gc():
    import gc

    def collect_while_holding_the_loop():
        junk = [[i] for i in range(300_000)]         # a heap for the collector to walk
        end = time.monotonic() + 0.15
        while time.monotonic() < end:                  # hold the loop so the watch names the stall
            gc.collect()
        del junk

    snap = asyncio.run(lag_around(collect_while_holding_the_loop, LoopLag(interval_s=0.01, watch_s=0.05)))
    assert snap["gc"]["gen2"]["collections"] >= 1 and snap["gc"]["gen2"]["total_s"] > 0
    g = snap["gc"]["gen2"]
    assert (g["over_stall"] > 0) == (g["max_s"] > STALL_SPLIT_S) and g["over_stall"] <= g["collections"]
    assert snap["stalls"]["gc_s"] > 0
    assert any(site["gc_s"] > 0 for site in snap["stall_sites"]), snap["stall_sites"]
