"""AsyncSeenSet: DRUM on its own thread, answers in order, acks after the consumer's commit, kill -9 safe."""

import asyncio
import json
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest
import uvloop

from crawlerd.seen import AsyncSeenSet, SeenSetError
from crawlerd.seen.drum_files import DrumCorrupt

SMALL = dict(buckets=4, bucket_buffer_bytes=4096, merge_bytes=1 << 15, cache_entries=256, max_results=50,
             poll_interval_s=0.01)


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request):
    if request.param == "uvloop":
        return uvloop.run
    return asyncio.run


def reference(batches):
    """Expected (key, unique) per seq for check+update over the stream, from a Python set."""
    seen, out = set(), []
    for keys in batches:
        for k in keys:
            out.append((k, k not in seen))
            seen.add(k)
    return out


async def bounded(aw):
    """Fail instead of hanging when an answer never comes (a lost ack would wait forever)."""
    return await asyncio.wait_for(aw, 60)


class Collector:
    """Consumer: records every delivery, acks it at once; ``done`` is set once ``want`` answers arrived."""

    def __init__(self, seen=None, want=None):
        self.seen = seen
        self.results = []
        self.deliveries = 0
        self.want = want
        self.done = asyncio.Event()

    def __call__(self, results):
        self.deliveries += 1
        self.results.extend(results)
        self.seen.ack()
        if self.want is not None and len(self.results) >= self.want:
            self.done.set()


def aux_of(k):
    return b"x%d" % k


def check_answers(results, batches, first_seq=0):
    ref = reference(batches)
    assert [r.seq for r in results] == list(range(first_seq, len(ref)))
    assert [(r.key, r.unique) for r in results] == ref[first_seq:]
    for r in results:
        assert (r.aux or b"") in (aux_of(r.key), b"")


def test_answers_equal_python_set_in_order(tmp_path, run):
    rng = random.Random(5)
    batches = [[rng.randrange(4000) for _ in range(rng.randrange(1, 120))] for _ in range(300)]

    async def main():
        s = AsyncSeenSet(str(tmp_path), **SMALL)
        col = Collector(s)
        for b in batches[:20]:                      # before start: queued, answered once started
            s.submit(b, [aux_of(k) for k in b])
        s.start(asyncio.get_running_loop(), col)
        for i, b in enumerate(batches[20:]):
            if i % 3 == 0:
                s.submit(np.array(b, dtype=np.uint64))      # no aux: answered with aux None or b""
            else:
                s.submit(b, [aux_of(k) for k in b])
            if i % 11 == 0:
                await asyncio.sleep(0)
            if i % 97 == 0:
                await bounded(s.flush())
                assert s.pending == 0
        await bounded(s.flush())
        assert s.pending == 0 and not s.backpressure
        await s.close()
        return col

    col = run(main())
    check_answers(col.results, batches)
    assert col.deliveries > 10                      # small max_results: many deliveries, each acked
    assert not [n for n in os.listdir(tmp_path) if n.startswith("intake.")]


def test_poll_merges_by_age_without_flush(tmp_path, run):
    batches = [[3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5, 8, 9, 7]]

    async def main():
        s = AsyncSeenSet(str(tmp_path), **{**SMALL, "max_age_s": 0.0})
        col = Collector(s, want=sum(map(len, batches)))
        s.start(asyncio.get_running_loop(), col)
        for b in batches:
            s.submit(b, [aux_of(k) for k in b])
        await asyncio.wait_for(col.done.wait(), 30)   # bound only; the pump's poll() merges
        await s.close()
        return col

    col = run(main())
    check_answers(col.results, batches)


def test_no_delivery_before_the_previous_one_is_acked(tmp_path, run):
    keys = list(range(1000))

    async def main():
        s = AsyncSeenSet(str(tmp_path), **SMALL)
        log = []
        got = []

        async def ack_later():
            for _ in range(20):                         # many loop turns for the pump to misbehave in
                await asyncio.sleep(0)
            log.append("ack")
            s.ack()

        def on(results):
            log.append("deliver")
            got.extend(results)
            asyncio.ensure_future(ack_later())

        s.start(asyncio.get_running_loop(), on)
        s.submit(keys, [aux_of(k) for k in keys])
        await bounded(s.flush())
        await s.close()
        return log, got

    log, got = run(main())
    check_answers(got, [keys])
    assert len(log) >= 2 * (len(keys) // SMALL["max_results"])
    assert log == ["deliver", "ack"] * (len(log) // 2)


def test_backpressure_rises_and_falls(tmp_path, run):
    async def main():
        s = AsyncSeenSet(str(tmp_path), **{**SMALL, "max_pending_keys": 100})
        col = Collector(s)
        s.submit(list(range(60)))
        assert not s.backpressure
        s.submit(list(range(60, 120)))
        assert s.backpressure and s.pending == 120      # over the bound, nothing dropped
        s.start(asyncio.get_running_loop(), col)
        await bounded(s.flush())
        assert not s.backpressure and s.pending == 0
        assert not s.flushing and s.last_flush_s > 0
        s.submit(list(range(50, 200)))
        assert s.backpressure
        s.request_flush()
        assert s.flushing
        await bounded(s.flush())
        assert not s.backpressure and not s.flushing
        await s.close()
        return col

    col = run(main())
    check_answers(col.results, [list(range(120)), list(range(50, 200))])


def test_close_leaves_unanswered_keys_for_the_next_start(tmp_path, run):
    keys = [7, 7, 8, 9, 8]

    async def first():
        s = AsyncSeenSet(str(tmp_path), **SMALL)
        s.submit(keys, [aux_of(k) for k in keys])
        s.start(asyncio.get_running_loop(), Collector(s))
        await s.close()
        with pytest.raises(SeenSetError):
            s.submit([1])

    async def second():
        s = AsyncSeenSet(str(tmp_path), **SMALL)
        assert s.pending == len(keys)
        col = Collector(s)
        s.start(asyncio.get_running_loop(), col)
        await bounded(s.flush())
        await s.close()
        return col

    run(first())
    assert not [n for n in os.listdir(tmp_path) if n.startswith("intake.")]   # handed to DRUM by close()
    check_answers(run(second()).results, [keys])


def test_consumer_failure_stops_the_pump_and_nothing_is_acked(tmp_path, run):
    keys = list(range(200)) + list(range(100))

    async def failing():
        s = AsyncSeenSet(str(tmp_path), **SMALL)

        def on(results):
            raise RuntimeError("frontier commit failed")

        s.start(asyncio.get_running_loop(), on)
        s.submit(keys, [aux_of(k) for k in keys])
        with pytest.raises(SeenSetError):
            await bounded(s.flush())
        with pytest.raises(SeenSetError):
            s.raise_if_failed()
        with pytest.raises(SeenSetError):
            s.submit([1])
        await s.close()

    async def again():
        s = AsyncSeenSet(str(tmp_path), **SMALL)
        col = Collector(s)
        s.start(asyncio.get_running_loop(), col)
        await bounded(s.flush())
        await s.close()
        return col

    run(failing())
    check_answers(run(again()).results, [keys])


def test_submits_inside_the_job_gap_wait_for_one_job_and_a_flush_or_the_bound_does_not_wait(tmp_path, run):
    # A gap far longer than the test: any job after the first ran because something could not wait.
    async def main():
        s = AsyncSeenSet(str(tmp_path), **{**SMALL, "poll_interval_s": 3600.0, "max_pending_keys": 100},
                         job_gap_s=3600.0)
        col = Collector(s)
        s.start(asyncio.get_running_loop(), col)
        s.submit([1, 2, 3])
        await bounded(_jobs_at_least(s, 1))             # the first job starts at once
        for k in range(10, 60, 10):
            s.submit(list(range(k, k + 10)))
            await asyncio.sleep(0.01)
        assert s.stats()["jobs"] == 1 and s.stats()["queued_keys"] == 50     # batched, waiting for the gap
        s.submit(list(range(100, 160)))                 # past the bound: goes now
        await bounded(_jobs_at_least(s, 2))
        assert s.stats()["queued_keys"] == 0
        s.submit([7, 7, 8])
        await bounded(s.flush())                        # a flush does not wait for the gap
        jobs = s.stats()["jobs"]
        await s.close()
        return col, jobs

    col, jobs = run(main())
    check_answers(col.results, [[1, 2, 3], *[list(range(k, k + 10)) for k in range(10, 60, 10)],
                                list(range(100, 160)), [7, 7, 8]])
    assert jobs >= 3


async def _jobs_at_least(s, n):
    while s.stats()["jobs"] < n:
        await asyncio.sleep(0.001)


def test_big_batch_hand_over_leaves_the_loop_running(tmp_path):
    # DRUM's journal and bucket code holds the GIL for a whole call: batches go over in CALL_KEYS calls.
    # Enough keys that the hand-over lasts many loop ticks on a fast, quiet box too (4 M keys took
    # ~55 ms there: four ticks of 10 ms and some lag, whether the loop was held or not)
    n = 16_000_000

    async def main():
        loop = asyncio.get_running_loop()
        s = AsyncSeenSet(str(tmp_path), buckets=64, merge_bytes=1 << 40, cache_entries=0,
                         max_pending_keys=1000)
        s.submit(np.random.default_rng(3).integers(0, 1 << 63, n, dtype=np.uint64))
        assert s.backpressure
        s.start(loop, Collector(s))
        lags = []
        while s.backpressure:                            # falls once the DRUM thread holds the batch
            t = loop.time()
            await asyncio.sleep(0.01)
            lags.append(loop.time() - t - 0.01)
        job_s = s.stats()["max_job_s"]
        assert s.pending == n
        await s.close()
        return lags, job_s

    lags, job_s = uvloop.run(main())
    # Held for the whole hand-over, the loop would tick once or twice, each tick as late as the job
    # is long. The median tick is the statement: a few ticks late because the box is loaded (the
    # process waiting for a CPU) do not make the loop held.
    assert len(lags) >= 5, (lags, job_s)
    median = sorted(lags)[len(lags) // 2]
    assert median < job_s / 3, (median, job_s, lags)
    print(f"hand-over job {job_s:.3f} s, median loop lag {median:.4f} s, max {max(lags):.4f} s over {len(lags)} ticks")


def test_loop_stays_responsive_during_a_merge(tmp_path):
    # A real merge of a few million keys (~0.5 s here) on the DRUM thread; the loop ticks on.
    n = 4_000_000

    async def main():
        loop = asyncio.get_running_loop()
        s = AsyncSeenSet(str(tmp_path), buckets=64, merge_bytes=1 << 40, cache_entries=0, max_results=1000)
        first = asyncio.Event()
        s.start(loop, lambda results: first.set())      # never acks: one delivery only
        s.submit(np.random.default_rng(7).integers(0, 1 << 63, n, dtype=np.uint64))
        s.request_flush()                                # same job: hand over, merge, first results
        lags = []

        async def ticker():
            while not first.is_set():
                t = loop.time()
                await asyncio.sleep(0.01)
                lags.append(loop.time() - t - 0.01)

        tick = asyncio.ensure_future(ticker())
        await asyncio.wait_for(first.wait(), 120)
        await tick
        job_s = s.stats()["max_job_s"]
        await s.close()
        return lags, job_s

    lags, job_s = uvloop.run(main())
    assert len(lags) >= 5, (lags, job_s)               # the ticker ran while the merge held the thread
    assert max(lags) < job_s / 3, (max(lags), job_s)
    print(f"merge job {job_s:.3f} s, max loop lag {max(lags):.4f} s over {len(lags)} ticks")


CHILD = r"""
import asyncio, json, os, random, signal, sys
from crawlerd.seen import AsyncSeenSet
path, seed, kill_at, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
rng = random.Random(seed)
batches = [[rng.randrange(3000) for _ in range(rng.randrange(1, 80))] for _ in range(40)]
extra = [rng.randrange(3000) for _ in range(150)]
small = dict(buckets=4, bucket_buffer_bytes=4096, merge_bytes=1 << 15, cache_entries=256, max_results=50,
             poll_interval_s=0.01)

def say(kind, data):
    print(json.dumps([kind, data]), flush=True)

async def main():
    s = AsyncSeenSet(path, **small, threaded_intake=True)
    n = 0
    def on(results):
        nonlocal n
        n += 1
        say("deliver", [[r.seq, r.key, r.unique] for r in results])
        if n == kill_at:
            s.submit(extra, [b"x%d" % k for k in extra])     # in the intake log only
            say("submitted", extra)
            # killed once the intake writer says the log holds them (the delivery never acked)
            s.when_logged(lambda: os.kill(os.getpid(), signal.SIGKILL))
            return
        s.ack()
    for b in batches:
        s.submit(b, [b"x%d" % k for k in b])
        say("submitted", b)
    if not start:
        os.kill(os.getpid(), signal.SIGKILL)
    s.start(asyncio.get_running_loop(), on)
    await asyncio.wait_for(s.flush(), 60)

asyncio.run(main())
"""


def run_child(path, seed, kill_at, start=True):
    p = subprocess.run([sys.executable, "-c", CHILD, str(path), str(seed), str(kill_at), "1" if start else "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    submitted, deliveries = [], []
    for line in p.stdout.splitlines():
        kind, data = json.loads(line)
        (submitted if kind == "submitted" else deliveries).append(data)
    return submitted, deliveries


def reopen_and_flush(path):
    async def main():
        s = AsyncSeenSet(str(path), **SMALL)
        col = Collector(s)
        s.start(asyncio.get_running_loop(), col)
        await bounded(s.flush())
        await s.close()
        return col.results
    return asyncio.run(main())


@pytest.mark.parametrize("kill_at", [1, 3])
def test_kill_9_redelivers_unacked_answers_and_keeps_intake(tmp_path, kill_at):
    submitted, deliveries = run_child(tmp_path, 17, kill_at)
    assert len(deliveries) == kill_at
    ref = reference(submitted)
    for d in deliveries:                                # what the child saw was right, in order
        assert [(k, u) for _, k, u in d] == ref[d[0][0]:d[-1][0] + 1]
    # Deliveries before kill_at were acked; the one being handled at the kill was not.
    first_unacked = deliveries[-1][0][0]
    results = reopen_and_flush(tmp_path)
    check_answers(results, submitted, first_seq=first_unacked)
    assert results[-1].aux == b"x%d" % submitted[-1][-1]    # the intake-only keys were answered too


def test_kill_9_before_start_keeps_intake_and_cuts_a_torn_tail(tmp_path):
    submitted, deliveries = run_child(tmp_path, 23, 0, start=False)
    assert not deliveries
    segs = [n for n in os.listdir(tmp_path) if n.startswith("intake.")]
    assert len(segs) == 1
    with open(tmp_path / segs[0], "ab") as f:           # a submit cut short: header + part of its keys
        f.write(b"ITAK" + bytes(4) + (100).to_bytes(4, "little") + bytes(20) + b"\x01" * 10)
    check_answers(reopen_and_flush(tmp_path), submitted)


def test_damaged_intake_record_before_the_end_is_an_error(tmp_path):
    run_child(tmp_path, 29, 0, start=False)
    seg = tmp_path / [n for n in os.listdir(tmp_path) if n.startswith("intake.")][0]
    data = bytearray(seg.read_bytes())
    data[40] ^= 0xFF                                     # a key of the first record; later records intact
    seg.write_bytes(bytes(data))
    with pytest.raises(DrumCorrupt):
        AsyncSeenSet(str(tmp_path), **SMALL)


def test_answers_ready_behind_a_delivery_come_after_its_ack_without_waiting_for_the_job_gap(tmp_path, run):
    # A merge of more answers than one delivery holds: each ack is followed by the next delivery at
    # once; only new keys wait for the gap (far longer than the test here).
    async def main():
        s = AsyncSeenSet(str(tmp_path), **{**SMALL, "poll_interval_s": 3600.0, "max_results": 10},
                         job_gap_s=3600.0)
        col = Collector(s, want=45)
        s.start(asyncio.get_running_loop(), col)
        s.submit(list(range(45)), [aux_of(k) for k in range(45)])
        await bounded(_jobs_at_least(s, 1))             # the first job starts at once (before any gap)
        s.request_flush()                               # no waiter: only the ready answers can skip the gap
        await bounded(col.done.wait())
        deliveries = col.deliveries
        s.submit([99])
        await asyncio.sleep(0.05)
        queued = s.stats()["queued_keys"]               # new keys do wait for the gap
        await s.close()
        return col, deliveries, queued

    col, deliveries, queued = run(main())
    check_answers(col.results, [list(range(45))])
    assert deliveries == 5
    assert queued == 1


class _HeldDrum:
    """Holds the DRUM thread inside its next hand-over until released (a merge that takes long)."""

    def __init__(self, monkeypatch):
        import threading

        from crawlerd.seen.drum import Drum
        self.release = threading.Event()
        self.entered = threading.Event()
        real = Drum.check_update

        def check_update(drum, keys, aux=None, values=None):
            self.entered.set()
            self.release.wait(60)
            return real(drum, keys, aux=aux, values=values)

        monkeypatch.setattr(Drum, "check_update", check_update)


@pytest.mark.parametrize("with_reserve", [True, False])
def test_the_bound_holds_for_what_work_in_flight_still_submits(tmp_path, monkeypatch, with_reserve):
    # A shard-shaped producer: a lease started while there is no backpressure submits its page's
    # links one loop tick later, whatever the backpressure is then. With the DRUM thread held, the
    # keys waiting in RAM stay within max_pending_keys only if backpressure counts what the leases
    # in flight can still submit (``reserve``); without it they pass the bound by up to the leases'
    # links. After the release every key is answered once, in order.
    cap, links, max_leases = 1000, 50, 100
    held = _HeldDrum(monkeypatch)

    async def main():
        s = AsyncSeenSet(str(tmp_path), **{**SMALL, "max_pending_keys": cap, "job_gap_s": 0})
        col = Collector(s)
        s.start(asyncio.get_running_loop(), col)
        leases: list[int] = []
        if with_reserve:
            s.reserve = lambda: len(leases) * links
        batches, most, nxt, ticks = [], 0, 0, 0
        while ticks < 200:                          # 200 ticks once the DRUM thread is held
            ticks += held.entered.is_set()
            for _ in leases:                        # the pages of last tick's leases give their links
                batches.append(list(range(nxt, nxt + links)))
                s.submit(batches[-1], aux=[aux_of(k) for k in batches[-1]])
                nxt += links
            leases = []
            while not s.backpressure and len(leases) < max_leases:
                leases.append(1)
            if s.backpressure:
                assert s.room == 0
            most = max(most, s.memory()["entries"])
            await asyncio.sleep(0.001)
            assert len(batches) < 10_000, "the DRUM thread never took a batch"
        held.release.set()
        await bounded(s.flush())
        await s.close()
        return col, batches, most

    col, batches, most = uvloop.run(main())
    print(f"reserve {with_reserve}: at most {most} keys waiting in RAM (bound {cap})")
    check_answers(col.results, batches)
    if with_reserve:
        assert most <= cap, most
    else:
        assert most > cap, most                     # the scenario passes the bound without the reserve


def test_a_released_delivery_lets_the_next_come_before_its_ack(tmp_path, run):
    # A consumer that releases each delivery once read and acknowledges it later (the shard: once its
    # commit is on disk) gets the next ones meanwhile, at most UNACKED_DELIVERIES of them; an ack
    # covers the answers before its seq only; after a restart the answers not acknowledged come again,
    # from the first of them, and nothing is lost.
    from crawlerd.seen.front import UNACKED_DELIVERIES

    keys = list(range(1000))
    got, ends = [], []

    async def first():
        s = AsyncSeenSet(str(tmp_path), **{**SMALL, "job_gap_s": 0})

        def consume(results):
            got.extend(results)
            ends.append(results[len(results) - 1].seq + 1)
            s.release()

        s.start(asyncio.get_running_loop(), consume)
        s.submit(keys, aux=[aux_of(k) for k in keys])
        s.request_flush()
        while len(ends) < UNACKED_DELIVERIES:
            await asyncio.sleep(0.001)
        jobs = s.stats()["jobs"]
        while s.stats()["jobs"] < jobs + 5:          # more trips to the DRUM thread bring no delivery
            s.request_flush()
            await asyncio.sleep(0.001)
        assert len(ends) == UNACKED_DELIVERIES
        s.ack(ends[1])                               # the first two deliveries are on disk
        while len(ends) < UNACKED_DELIVERIES + 2:
            await asyncio.sleep(0.001)
        acked = ends[1]
        await s.close()                              # the rest not acknowledged
        return acked

    acked = run(first())
    assert [r.seq for r in got] == list(range(len(got)))

    async def second():
        s = AsyncSeenSet(str(tmp_path), **SMALL)
        col = Collector(s)
        s.start(asyncio.get_running_loop(), col)
        await bounded(s.flush())
        await s.close()
        return col.results

    again = run(second())
    assert again[0].seq == acked
    check_answers(got[:acked] + again, [keys])
