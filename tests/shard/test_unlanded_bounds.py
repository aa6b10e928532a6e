"""DUST's and the frontier's (with recrawl's) writes not landed stay within ``dust.unlanded_bytes`` and
``frontier.unlanded_bytes`` while the writer is held back: the steps that write wait for a landing
(backpressure), and once the writer runs again everything arrives, once."""

import asyncio
import hashlib
import time

import pytest

from crawlerd.config import load
from crawlerd.frontier.dust import DustLearner
from crawlerd.metrics import Metrics
from crawlerd.shard.dust import DustGate
from crawlerd.shard.events import FetchEvents
from crawlerd.store.writer import WriteThread
from crawlerd.url.canonical import fingerprint
from tests.shard.parts import MostUnlanded, Parts, run

HOSTS = 3000
LATE_HOSTS = 600
DUST_CAP = 512 << 10
FRONTIER_CAP = 1 << 20


@pytest.mark.parametrize("cap", [DUST_CAP, 0], ids=["bounded", "no-bound"])
def test_a_held_writer_holds_dusts_sliced_commit_at_the_bound_and_every_host_is_written_once_released(tmp_path, cap):
    # every host stays cached (an evicted changed host is written at once, one record per page seen)
    learner = DustLearner(str(tmp_path / "dust"), sync=False, initial_probes=0, unlanded_bytes=cap,
                          cache_hosts=4 * HOSTS)
    gate = DustGate(load(), learner, frontier=None, intake=None,
                    events=FetchEvents(None, wall=time.time), metrics=Metrics())
    hosts = [f"http://h{i}.example" for i in range(HOSTS + LATE_HOSTS)]

    def observe(some, pages):
        for h in some:
            for p in pages:
                url = f"{h}/{p}.html"
                learner.observe(url, fingerprint(url), h, hashlib.sha1(url.encode()).digest(), 0, "")

    observe(hosts[:HOSTS], "abc")

    async def go():
        w = WriteThread(asyncio.get_running_loop(), name="test-writer", group_delay_s=0.001)
        gate.attach_writer(w)
        ov = learner.store.overlay
        watch = MostUnlanded(ov)
        watch.start()
        try:
            w.hold()
            gate.commit_sliced()
            for _ in range(200):                # held on: slices run until the bound, then wait
                await asyncio.sleep(0)
            held = dict(gate.unlanded_memory(), dirty=len(learner.dirty_hosts()))
            # more hosts change while the round waits: written in slices too, not all in its last step
            # (their archived pages, written at a commit, are not held back: a page is not gated)
            observe(hosts[HOSTS:], "a")
            w.release()
            for _ in range(4000):               # the waiting slices run at the landings, then the commit lands
                await asyncio.sleep(0.002)
                if learner.dirty_hosts():
                    gate.commit_sliced()        # the shard's tick: a new round once one is done
                if not learner.dirty_hosts() and not ov.pending and not ov.dirty:
                    break
            left = len(learner.dirty_hosts()), ov.pending
            return held, watch.stop(), left
        finally:
            watch.stop()
            gate.close_gate()
            gate.commit()
            await asyncio.sleep(0.05)
            w.close()
            await asyncio.sleep(0)
            gate.attach_writer(None)

    held, most, left = run(go())
    if cap:
        assert held["waits"] > 0 and held["dirty"] > 0      # the commit stopped writing hosts
        assert most <= cap, (most, held)
    else:
        assert held["dirty"] == 0 and most > DUST_CAP, (most, held)     # all of them at once: past the bound
    assert left == (0, 0)                       # every changed host written, every commit landed
    store = learner.store
    assert all(store.get_host(h) is not None for h in hosts)
    assert len(list(store.hosts())) == HOSTS + LATE_HOSTS     # each once
    gate.close()


@pytest.mark.parametrize("cap", [FRONTIER_CAP, 0], ids=["bounded", "no-bound"])
def test_a_held_writer_holds_the_intake_at_the_frontiers_bound_and_every_url_is_queued_once_released(tmp_path, cap):
    n = 4 * HOSTS

    async def go():
        loop = asyncio.get_running_loop()
        p = Parts(str(tmp_path))
        w = WriteThread(loop, name="test-writer", group_delay_s=0.001)
        p.frontier.attach_writer(w)
        p.recrawl.attach_writer(w)
        p.intake.bound_writes(cap)
        watch = MostUnlanded(p.frontier.overlay, p.recrawl.overlay)
        watch.start()
        p.seen.start(loop, p.intake.on_seen_results)
        try:
            w.hold()
            p.intake.submit_urls([f"http://h{i % HOSTS}.test/p{i}" for i in range(n)], depth=1)
            flushed = asyncio.ensure_future(p.seen.flush())
            for _ in range(2000):           # until the delivery is added, or waits for a landing
                await asyncio.sleep(0.005)
                if p.intake.frontier_gate.waits or p.frontier.overlay.unlanded_bytes > 2 * FRONTIER_CAP:
                    break
            for _ in range(50):             # held on: no slice runs while nothing lands
                await asyncio.sleep(0)
            held = dict(p.intake.frontier_gate.memory(), flushed=flushed.done())
            w.release()
            await flushed
            for _ in range(1000):
                if not p.frontier.overlay.pending:
                    break
                await asyncio.sleep(0.002)
            return held, watch.stop(), p.frontier.queued(), p.metrics.counters["seen_duplicate"]
        finally:
            watch.stop()
            p.intake.frontier_gate.close()
            p.frontier.commit(flush=False)
            p.recrawl.commit(flush=False)
            await asyncio.sleep(0.05)
            w.close()
            await asyncio.sleep(0)
            p.frontier.attach_writer(None)
            p.recrawl.attach_writer(None)
            await p.close()

    held, most, queued, dup = run(go())
    if cap:
        assert held["waits"] > 0 and not held["flushed"]    # the intake stopped: the delivery is not done
        assert most <= cap, (most, held)
    else:
        assert most > FRONTIER_CAP, (most, held)        # the delivery's URLs in one add: past the bound
    assert queued == n and dup == 0, (queued, dup)           # nothing lost, nothing twice
