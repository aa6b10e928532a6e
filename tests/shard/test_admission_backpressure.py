"""robots.txt decides at admission; a disallowed lease costs no gap; a full processing queue pauses leasing;
fetched bodies not archived stay within process.queue_bytes."""

import asyncio
import os
import signal
import time

from crawlerd.frontier import KIND_ROBOTS, QueuedURL
from crawlerd.metrics import Metrics
from crawlerd.shard import Shard
from crawlerd.shard.intake import Intake
from crawlerd.shard.leases import LeaseRunner
from crawlerd.shard.outbound import Outbound
from crawlerd.url.canonical import fingerprint
from tests.frontier.server_ledger import FakeClock
from tests.shard.parts import Parts, run
from tests.shard.test_answers import make as make_answers
from tests.shard.test_hostfiles_leases import HOST, Server, lease_one, queue_host, wire

ROBOTS = (200, b"User-agent: *\nDisallow: /private/\n", [])
PAGE = b"<!DOCTYPE html><html><body><p>plain page</p></body></html>"


def pages_server(paths) -> Server:
    return Server({HOST + "/robots.txt": ROBOTS, **{HOST + p: (200, PAGE, []) for p in paths}})


def test_a_large_disallowed_area_is_dropped_at_admission_and_costs_the_host_nothing(tmp_path):
    clock = FakeClock(1000.0)
    allowed = [f"/p/{i}.html" for i in range(5)]
    server = pages_server(allowed)

    async def go():
        p = Parts(str(tmp_path), clock=clock)
        try:
            hf, runner, robots, _, _ = wire(p, server)
            runner.answers = make_answers(p)          # answers archived by a real worker
            await runner.answers.pool.start()
            queue_host(p, allowed[0])
            await hf.fetch_robots(lease_one(p, KIND_ROBOTS))
            intake = Intake(p.cfg, frontier=p.frontier, seen=p.seen, url_filter=p.url_filter, recrawl=p.recrawl,
                            metrics=p.metrics, wake=lambda: None, wall=time.time, robots=robots, clock=clock,
                            on_dropped=p.events.dropped)
            p.seen.start(asyncio.get_running_loop(), intake.on_seen_results)
            private = [f"{HOST}/private/{i}.html" for i in range(300)]
            intake.submit_urls(private + [HOST + a for a in allowed[1:]], depth=1)
            await p.seen.flush()
            assert p.frontier.queued() == len(allowed)           # only the allowed URLs were queued
            assert p.metrics.dropped["robots_denied"] == len(private)
            clock.t += 10.0
            t0 = clock()
            times = []
            while p.frontier.queued() and clock() < t0 + 60:
                for lease in p.frontier.lease(clock(), 10):
                    await runner.fetch_url(lease)
                    times.append(clock())
                clock.t += 0.25
            return times, t0, p.event_lines(), list(server.asked)
        finally:
            await runner.answers.pool.close()
            await p.close()

    times, t0, events, asked = run(go())
    assert asked[1:] == [HOST + a for a in allowed]              # every allowed URL, nothing else
    # one request per politeness gap (1 s): the crawl of the allowed URLs takes 4 gaps, as if the
    # disallowed area did not exist
    assert times[-1] - t0 <= (len(allowed) - 1) * 1.0 + 0.5
    denied = [e for e in events if e["kind"] == "dropped" and e["outcome"] == "robots_denied"]
    assert len(denied) == 300


def test_urls_found_disallowed_at_lease_time_are_released_without_a_gap(tmp_path):
    clock = FakeClock(1000.0)
    allowed = ["/p/0.html", "/p/1.html"]
    server = pages_server(allowed)

    async def go():
        p = Parts(str(tmp_path), clock=clock)
        try:
            hf, runner, _, _, _ = wire(p, server)
            runner.answers = make_answers(p)
            await runner.answers.pool.start()
            # queued before the rules were known: 40 disallowed URLs ahead of the two allowed ones
            queue_host(p, *[f"/private/{i}.html" for i in range(40)], *allowed)
            await hf.fetch_robots(lease_one(p, KIND_ROBOTS))
            clock.t += 5.0
            start = clock()
            leases = 0
            while clock() == start:
                got = p.frontier.lease(clock(), 10)
                if not got:
                    break
                for lease in got:
                    leases += 1
                    await runner.fetch_url(lease)
            return leases, p.metrics.outcomes["robots_denied"], list(server.asked), p.frontier.queued()
        finally:
            await runner.answers.pool.close()
            await p.close()

    leases, denied, asked, queued = run(go())
    assert denied == 40
    # all 40 released at the same instant (no gap charged), then the first allowed URL was fetched
    assert leases == 41 and asked[-1] == HOST + allowed[0] and queued == 1


def test_a_full_processing_queue_pauses_leasing_and_loses_nothing(tmp_path):
    clock = FakeClock(1000.0)

    async def go():
        from crawlerd import config
        cfg = config.load(None, [f"crawl.data_dir={str(tmp_path)!r}", "process.workers=1",
                                 "politeness.min_delay_s=0.0", "politeness.delay_factor=0.0", "budgets.enabled=false",
                                 'network.allow=["127.0.0.0/8"]'])
        shard = Shard(cfg, Metrics(), clock=clock)
        server = Server({})
        hosts = [f"http://h{i}.test" for i in range(100)]
        for h in hosts:
            server.answers[h + "/p"] = (200, PAGE, [])
        shard.frontier.add([QueuedURL(url=h + "/p", host_key=h, fp=fingerprint(h + "/p")) for h in hosts])
        for h in hosts:
            shard.frontier.set_host_ip(h, f"127.0.0.{hosts.index(h) + 1}")   # one IP each: per-IP limits aside
            shard.frontier.set_robots(h, expires_at=clock() + 3600, crawl_delay_s=None)
            from crawlerd.fetch.robots import robots_decision
            shard.robots.put(h, robots_decision(status=404, outcome_ok=True, body=b"", location=None, hops=0,
                                                previous=None, now=clock(), agent_token="crawlerd",
                                                cache_ttl_s=3600, error_retry_s=600, max_bytes=1 << 19))
        outbound = Outbound(guard=shard.guard, frontier=shard.frontier, resolve=None, host_busy=shard.leases.host_busy)
        runner = LeaseRunner(frontier=shard.frontier, table=shard.leases, tasks=shard.tasks, outbound=outbound,
                             fetch=server.fetch, robots=shard.robots, recrawl=shard.recrawl, host_files=None,
                             answers=shard.answers, events=shard.events, metrics=shard.metrics, clock=clock,
                             wall=time.time, storage_failed=shard.storage.failed, window=shard.window)
        await shard.pool.start()
        shard.seen.start(asyncio.get_running_loop(), shard.intake.on_seen_results)
        worker = shard.pool.pids()[0]
        os.kill(worker, signal.SIGSTOP)            # processing stalls: answers pile up
        try:
            for _ in range(40):
                shard._step(runner)
                await asyncio.sleep(0.01)
            stalled = (len(server.asked), shard.pool.calls, shard.frontier.queued(), shard.pool.behind,
                       shard.pool.capacity)
        finally:
            os.kill(worker, signal.SIGCONT)
        for _ in range(500):
            shard._step(runner)
            await asyncio.sleep(0.01)
            if len(server.asked) == len(hosts) and shard.pool.calls == 0 and not len(shard.leases):
                break
        done = (len(server.asked), shard.pool.calls, shard.frontier.queued(), shard.metrics.pages)
        await shard._shutdown()
        return stalled, done

    stalled, done = run(go())
    asked, calls, queued, behind, capacity = stalled
    # leasing stopped once as many answers waited for the worker as it holds
    assert behind and calls == asked == 2 * capacity and queued == 100 - asked
    assert done == (100, 0, 0, 100)                       # then everything was fetched and processed
class HeldFetcher:
    """Stands in for the fetcher: every transfer stays on the wire until the test lands it."""

    def __init__(self, server: Server, elapsed_s: float):
        self.server = server
        self.elapsed_s = elapsed_s
        self.wire: list[asyncio.Future] = []
        self.waiting = 0
        self.connections_open = 0

    @property
    def in_flight(self) -> int:
        return len(self.wire)

    async def fetch(self, req):
        turn = asyncio.get_running_loop().create_future()
        self.wire.append(turn)
        try:
            await turn
        finally:
            self.wire.remove(turn)
        res = await self.server.fetch(req)
        res.elapsed_s = self.elapsed_s         # the lease window's fetch time stays as the test set it
        return res

    def land(self, n: int) -> None:
        for turn in [t for t in self.wire if not t.done()][:n]:
            turn.set_result(None)

    async def close(self, grace: float) -> None:
        self.land(len(self.wire))


def crawl_shard(tmp_path, clock, hosts: int, body: bytes, *sets: str):
    """A one-worker shard whose ``hosts`` hosts each have one page, robots known, due now."""
    from crawlerd import config
    from crawlerd.fetch.robots import robots_decision
    cfg = config.load(None, [f"crawl.data_dir={str(tmp_path)!r}", "process.workers=1",
                             "politeness.min_delay_s=0.0", "politeness.delay_factor=0.0", "budgets.enabled=false",
                             'network.allow=["127.0.0.0/8"]', *sets])
    shard = Shard(cfg, Metrics(), clock=clock)
    server = Server({})
    urls = [f"http://h{i}.test/p" for i in range(hosts)]
    for i, url in enumerate(urls):
        h = url[:-2]
        server.answers[url] = (200, body, [])
        shard.frontier.add([QueuedURL(url=url, host_key=h, fp=fingerprint(url))])
        shard.frontier.set_host_ip(h, f"127.0.{i // 250}.{i % 250 + 1}")      # one IP each: per-IP limits aside
        shard.frontier.set_robots(h, expires_at=clock() + 3600, crawl_delay_s=None)
        shard.robots.put(h, robots_decision(status=404, outcome_ok=True, body=b"", location=None, hops=0,
                                            previous=None, now=clock(), agent_token="crawlerd",
                                            cache_ttl_s=3600, error_retry_s=600, max_bytes=1 << 19))
    return shard, server


def held_runner(shard, fetcher) -> LeaseRunner:
    outbound = Outbound(guard=shard.guard, frontier=shard.frontier, resolve=None, host_busy=shard.leases.host_busy)
    shard.fetcher = fetcher
    return LeaseRunner(frontier=shard.frontier, table=shard.leases, tasks=shard.tasks, outbound=outbound,
                       fetch=fetcher.fetch, robots=shard.robots, recrawl=shard.recrawl, host_files=None,
                       answers=shard.answers, events=shard.events, metrics=shard.metrics, clock=clock_of(shard),
                       wall=time.time, storage_failed=shard.storage.failed, window=shard.window)


def clock_of(shard):
    return shard.clock


async def settle() -> None:
    """Let the tasks just woken run up to their next wait (leases reach the fetcher, answers the pool)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def drain(shard, runner, fetcher, server) -> tuple[int, int, int, int]:
    """Step and land every transfer until nothing is queued, processing or leased (bounded):
    (requests the server saw, pool calls open, URLs queued, pages counted)."""
    for _ in range(3000):
        shard._step(runner)
        fetcher.land(len(fetcher.wire))
        await asyncio.sleep(0.005)
        if shard.frontier.queued() == 0 and shard.pool.calls == 0 and not len(shard.leases):
            break
    return len(server.asked), shard.pool.calls, shard.frontier.queued(), shard.metrics.pages


async def crawl_with_a_stopped_worker(shard, server, fetcher, runner, land_per_round: int, rounds: int):
    """Lease, land ``land_per_round`` transfers, again, while the worker is stopped; then let it go.
    Returns the largest (transfers + answers waiting for the worker, bodies not archived) seen
    after any step, and the end state (asked, processing calls, queued, pages)."""
    await shard.pool.start()
    shard.seen.start(asyncio.get_running_loop(), shard.intake.on_seen_results)
    worker = shard.pool.pids()[0]
    os.kill(worker, signal.SIGSTOP)            # processing stalls: answers pile up
    peak_open, peak_bytes = 0, 0
    try:
        for _ in range(rounds):
            shard._step(runner)
            await settle()
            peak_open = max(peak_open, fetcher.in_flight + shard.pool.waiting)
            fetcher.land(land_per_round)
            await settle()
            peak_open = max(peak_open, fetcher.in_flight + shard.pool.waiting)
            peak_bytes = max(peak_bytes, shard.memory()["fetched_bodies"]["bytes"])
        stalled = len(server.asked)
    finally:
        os.kill(worker, signal.SIGCONT)
    done = await drain(shard, runner, fetcher, server)
    await shard._shutdown()
    return peak_open, peak_bytes, stalled, done


def test_fetched_bodies_stay_within_process_queue_bytes_and_nothing_is_lost(tmp_path):
    clock = FakeClock(1000.0)
    body = b"<!DOCTYPE html><html><body><p>" + b"x" * (30 * 1024) + b"</p></body></html>"

    async def go():
        shard, server = crawl_shard(tmp_path, clock, 200, body, f"process.queue_bytes={1 << 20}")
        fetcher = HeldFetcher(server, elapsed_s=0.5)
        runner = held_runner(shard, fetcher)
        shard.window.rate, shard.window.fetch_s = 200.0, 0.5      # the count alone allows 64 + 200 transfers
        size = shard.window.size
        return size, await crawl_with_a_stopped_worker(shard, server, fetcher, runner, land_per_round=10,
                                                       rounds=12)

    size, (_, peak_bytes, stalled, done) = run(go())
    assert size == 264
    # the bodies waiting for the stopped worker, with the transfers' expected ones, stayed within
    # the cap: leasing waited (without the bound: 64 answers the pool holds, 2 MiB)
    assert 0 < peak_bytes <= 1 << 20
    assert stalled <= (1 << 20) // (30 * 1024)          # about 30 KiB each: 34 fetched at most
    assert done == (200, 0, 0, 200)                     # then everything was fetched and archived, once


def test_the_byte_bound_leaves_the_transfer_count_to_the_window(tmp_path):
    clock = FakeClock(1000.0)

    async def go():
        shard, server = crawl_shard(tmp_path, clock, 300, PAGE)     # small bodies: the bytes never bind
        fetcher = HeldFetcher(server, elapsed_s=0.5)
        runner = held_runner(shard, fetcher)
        shard.window.rate, shard.window.fetch_s = 200.0, 0.5
        await shard.pool.start()
        shard.seen.start(asyncio.get_running_loop(), shard.intake.on_seen_results)
        going = -1
        for _ in range(100):                    # a step leases at most LEASES_PER_STEP; nothing lands yet
            shard._step(runner)
            await settle()
            if fetcher.in_flight == going:
                break
            going = fetcher.in_flight
        fetcher.land(len(fetcher.wire))
        done = await drain(shard, runner, fetcher, server)
        await shard._shutdown()
        return shard.window.size, going, done

    size, going, done = run(go())
    assert going == size == 264                 # the steps leased the whole window (64 KiB each, 17 MiB < 64 MiB)
    assert done == (300, 0, 0, 300)
