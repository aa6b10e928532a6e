"""The budget store's writes not landed stay within ``budgets.unlanded_bytes`` while the writer is
held back: the intake's slices wait for a landing (backpressure), and nothing is lost."""

import asyncio

import pytest

from crawlerd.frontier.budgets import Budgets
from crawlerd.store.writer import WriteThread
from tests.shard.parts import MostUnlanded, Parts, run

CAP = 1 << 20
DOMAINS = 2000          # base budget 2: the first 2 URLs of each pass, the rest are deferred


def _budgets(path: str, cap: int, **kw) -> Budgets:
    return Budgets(path, base_budget=2, per_inlink=2, max_budget=100, map_size_bytes=1 << 26, edge_buckets=2,
                   edge_merge_bytes=1 << 20, edge_cache_entries=1 << 10, sync=False, unlanded_bytes=cap, **kw)


@pytest.mark.parametrize("cap", [CAP, 0], ids=["bounded", "no-bound"])
def test_a_held_writer_holds_the_intake_at_the_bound_and_every_url_arrives_once_released(tmp_path, cap):
    n = 4 * DOMAINS

    async def go():
        loop = asyncio.get_running_loop()
        p = Parts(str(tmp_path))
        b = _budgets(str(tmp_path / "budgets"), cap)
        w = WriteThread(loop, name="test-writer", group_delay_s=0.001)
        b.attach_writer(w)
        p.intake.budgets = b
        watch = MostUnlanded(b.store.overlay)
        watch.start()
        p.seen.start(loop, p.intake.on_seen_results)
        try:
            w.hold()
            p.intake.submit_urls([f"http://h{i % DOMAINS}.test/p{i}" for i in range(n)], depth=1)
            flushed = asyncio.ensure_future(p.seen.flush())
            counters = p.metrics.counters
            for _ in range(2000):           # until the delivery is judged, or waits for a landing
                await asyncio.sleep(0.005)
                if b.unlanded_memory()["waits"] or counters["budget_deferred"] == n - 2 * DOMAINS:
                    break
            for _ in range(50):             # held on: no slice runs while nothing lands
                await asyncio.sleep(0)
            held = dict(b.unlanded_memory(), deferred=counters["budget_deferred"], flushed=flushed.done())
            w.release()
            await flushed
            return held, watch.stop(), p.frontier.queued(), b.beast.waiting, counters["budget_deferred"]
        finally:
            watch.stop()
            await p.close()
            await b.close()
            w.close()

    held, most, queued, waiting, deferred = run(go())
    assert not held["flushed"]                  # the ack waits for the budget commit to land
    if cap:
        assert held["waits"] > 0 and held["deferred"] < n - 2 * DOMAINS    # the intake stopped adding
        assert most <= cap, (most, held)
    else:
        assert held["deferred"] == n - 2 * DOMAINS and most > CAP       # judged whole: past the bound
    # nothing lost, nothing twice
    assert queued == 2 * DOMAINS and waiting == deferred == n - 2 * DOMAINS


@pytest.mark.parametrize("cap", [256 << 10, 0], ids=["bounded", "no-bound"])
def test_a_readmission_waits_at_the_bound_under_a_held_writer_and_passes_every_url_once_released(tmp_path, cap):
    n = 4 * DOMAINS
    batch = n

    async def go():
        loop = asyncio.get_running_loop()
        p = Parts(str(tmp_path), f"budgets.readmit_batch={batch}")
        b = _budgets(str(tmp_path / "budgets"), cap)
        w = WriteThread(loop, name="test-writer", group_delay_s=0.001)
        b.attach_writer(w)
        p.intake.budgets = b
        p.seen.start(loop, p.intake.on_seen_results)
        try:
            p.intake.submit_urls([f"http://h{i % DOMAINS}.test/p{i}" for i in range(n)], depth=1)
            await p.seen.flush()                # judged and landed: 2 per domain queued, the rest wait
            before = (p.frontier.queued(), b.beast.waiting)
            watch = MostUnlanded(b.store.overlay)
            watch.start()
            counters = p.metrics.counters
            w.hold()
            p.intake.free_slots = lambda: 100       # the fetcher would idle: the reader moves on
            now = p.clock() + 10.0
            p.intake.step_budgets(now)
            for _ in range(400):                # until the readmission is done, or waits for a landing
                await asyncio.sleep(0)
                if b.unlanded_memory()["waits"] or not p.intake._readmitting:
                    break
            for _ in range(50):
                await asyncio.sleep(0)
            held = dict(b.unlanded_memory(), readmitted=counters["budget_readmitted"])
            w.release()
            for _ in range(2000):               # the waiting slices run at the landings
                await asyncio.sleep(0.002)
                if not p.intake._readmitting:
                    break
            return before, held, watch.stop(), p.frontier.queued(), b.beast.waiting, counters["budget_readmitted"]
        finally:
            await p.close()
            await b.close()
            w.close()

    before, held, most, queued, waiting, readmitted = run(go())
    assert before == (2 * DOMAINS, n - 2 * DOMAINS)
    if cap:
        assert held["waits"] > 0 and held["readmitted"] < n - 2 * DOMAINS       # the reader stopped
        assert most <= cap, (most, held)
    else:
        assert most > 256 << 10, most
    assert queued + waiting == n and readmitted == queued - 2 * DOMAINS     # each URL queued or waiting, once


@pytest.mark.parametrize("cap", [128 << 10, 0], ids=["bounded", "no-bound"])
def test_an_edge_delivery_waits_at_the_bound_under_a_held_writer_and_counts_every_edge_once(tmp_path, cap):
    targets = 3000

    async def go():
        loop = asyncio.get_running_loop()
        b = _budgets(str(tmp_path / "budgets"), cap, mode="all")
        w = WriteThread(loop, name="test-writer", group_delay_s=0.001)
        b.attach_writer(w)
        b.start(loop)
        watch = MostUnlanded(b.store.overlay)
        watch.start()
        try:
            b.record_pages_links([(f"http://s{i % 3}.org", {f"http://t{i}.com"}) for i in range(targets)])
            w.hold()
            flushed = asyncio.ensure_future(b.edges.flush())
            for _ in range(2000):           # until applied, or waiting for a landing
                await asyncio.sleep(0.005)
                if b.unlanded_memory()["waits"] or b.store.overlay.pending:
                    break
            for _ in range(50):
                await asyncio.sleep(0)
            held = dict(b.unlanded_memory(), flushed=flushed.done())
            w.release()
            await flushed
            return held, watch.stop(), [b.graph.indegree(f"t{i}.com") for i in range(targets)]
        finally:
            watch.stop()
            await b.close()
            w.close()

    held, most, indegrees = run(go())
    assert not held["flushed"]
    if cap:
        assert held["waits"] > 0
        assert most <= cap, (most, held)
    else:
        assert most > 128 << 10, most
    assert indegrees == [1] * targets           # every edge counted once
