"""robots.txt decides at admission; a disallowed lease costs no gap; a full processing queue pauses leasing."""

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
