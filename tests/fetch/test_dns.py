"""Resolver against the loopback DNS responder: answers, TTL clamp, caches, outcomes, bounds."""

import asyncio

import uvloop

from crawlerd.fetch.dns import Resolver
from crawlerd.outcome import Outcome
from crawlerd.simweb.dns import DnsServer


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def run(scenario, server: DnsServer, **kw):
    """Start ``server``, build a Resolver against it, run ``scenario(resolver)``, clean up."""
    async def main():
        await server.start()
        params = dict(nameservers=[server.nameserver], timeout_s=0.2, tries=1, min_ttl_s=0.0, max_ttl_s=3600.0,
                      negative_ttl_s=60.0, max_in_flight=100, static_hosts={}, ipv6=False)
        params.update(kw)
        r = Resolver(asyncio.get_running_loop(), **params)
        try:
            return await scenario(r)
        finally:
            await r.close()
            server.close()
    return uvloop.run(main())


def test_a_records_and_ttl():
    s = DnsServer({"a.test": (["127.0.0.2", "127.0.0.3"], 120)})

    async def scenario(r):
        return await r.resolve("a.test")
    res = run(scenario, s)
    assert res.outcome is Outcome.OK
    assert res.ips == ["127.0.0.2", "127.0.0.3"]
    assert res.ttl_s == 120


def test_ttl_is_clamped_to_floor_and_cap():
    s = DnsServer({"short.test": (["127.0.0.2"], 1), "long.test": (["127.0.0.3"], 10**6)})

    async def scenario(r):
        return await r.resolve("short.test"), await r.resolve("long.test")
    short, long_ = run(scenario, s, min_ttl_s=300.0, max_ttl_s=3600.0)
    assert short.ttl_s == 300.0
    assert long_.ttl_s == 3600.0


def test_cache_serves_until_expiry_then_asks_again():
    clock = FakeClock()
    # TTL 0 on the wire keeps c-ares' own cache out of the way; our floor makes it 50 s.
    s = DnsServer({"c.test": (["127.0.0.5"], 0)})

    async def scenario(r):
        first = await r.resolve("C.Test.")
        clock.now += 30
        second = await r.resolve("c.test")
        asked_before_expiry = s.queries["c.test"]
        clock.now += 21
        third = await r.resolve("c.test")
        return first, second, asked_before_expiry, third, r.stats()
    first, second, asked, third, stats = run(scenario, s, min_ttl_s=50.0, clock=clock)
    assert first.ips == second.ips == third.ips == ["127.0.0.5"]
    assert asked == 1
    assert second.ttl_s == 20.0                  # remaining life, not the original TTL
    assert s.queries["c.test"] == 2
    assert stats["cache_hits"] == 1


def test_negative_cache_for_nxdomain_and_servfail():
    clock = FakeClock()
    s = DnsServer(nxdomain={"gone.test"}, servfail={"broken.test"})

    async def scenario(r):
        out = [await r.resolve("gone.test"), await r.resolve("broken.test"),
               await r.resolve("gone.test"), await r.resolve("broken.test")]
        clock.now += 61
        out.append(await r.resolve("gone.test"))
        return out
    a, b, a2, b2, a3 = run(scenario, s, negative_ttl_s=60.0, clock=clock)
    assert a.outcome is Outcome.DNS_NXDOMAIN and a2.outcome is Outcome.DNS_NXDOMAIN
    assert b.outcome is Outcome.DNS_SERVFAIL and b2.outcome is Outcome.DNS_SERVFAIL
    assert a3.outcome is Outcome.DNS_NXDOMAIN
    assert s.queries["broken.test"] == 1
    assert s.queries["gone.test"] == 2          # asked again only after negative_ttl_s
    assert a.ips == [] and b.ips == []


def test_timeout_is_reported_and_not_cached():
    s = DnsServer(silent={"quiet.test"})

    async def scenario(r):
        return await r.resolve("quiet.test"), await r.resolve("quiet.test")
    one, two = run(scenario, s)
    assert one.outcome is Outcome.DNS_TIMEOUT and two.outcome is Outcome.DNS_TIMEOUT
    assert s.queries["quiet.test"] == 2


def test_garbage_answer_is_dns_error():
    s = DnsServer(garbage={"junk.test"})

    async def scenario(r):
        return await r.resolve("junk.test")
    res = run(scenario, s)
    assert res.outcome is Outcome.DNS_ERROR
    assert res.error


def test_name_without_address_records_is_nxdomain():
    s = DnsServer({"v6only.test": (["::1"], 60)})

    async def scenario(r):
        return await r.resolve("v6only.test")
    res = run(scenario, s)
    assert res.outcome is Outcome.DNS_NXDOMAIN


def test_ipv6_adds_aaaa_after_a():
    s = DnsServer({"dual.test": (["127.0.0.9", "::1"], 60), "v6only.test": (["::1"], 60)})

    async def scenario(r):
        return await r.resolve("dual.test"), await r.resolve("v6only.test")
    dual, v6 = run(scenario, s, ipv6=True)
    assert dual.ips == ["127.0.0.9", "::1"]
    assert v6.outcome is Outcome.OK and v6.ips == ["::1"]


def test_literals_and_static_hosts_never_query():
    s = DnsServer()

    async def scenario(r):
        return [await r.resolve(h) for h in ("127.0.0.1", "[::1]", "::1", "pinned.test", "PINNED.test.")]
    out = run(scenario, s, static_hosts={"pinned.test": "127.0.0.7"})
    assert [o.ips for o in out] == [["127.0.0.1"], ["::1"], ["::1"], ["127.0.0.7"], ["127.0.0.7"]]
    assert all(o.outcome is Outcome.OK for o in out)
    assert sum(s.queries.values()) == 0


def test_concurrent_lookups_of_one_name_share_one_query():
    s = DnsServer({"busy.test": (["127.0.0.4"], 0)})

    async def scenario(r):
        results = await asyncio.gather(*(r.resolve("busy.test") for _ in range(20)))
        return results, r.stats()
    results, stats = run(scenario, s)
    assert all(x.ips == ["127.0.0.4"] for x in results)
    assert s.queries["busy.test"] == 1
    assert stats["coalesced"] == 19


def test_queries_in_flight_are_bounded():
    s = DnsServer(lookup=lambda name: (["127.0.0.8"], 0))
    live = {"now": 0, "peak": 0}

    async def scenario(r):
        ask = r._ask

        async def counting_ask(name, qtype):
            live["now"] += 1
            live["peak"] = max(live["peak"], live["now"])
            try:
                return await ask(name, qtype)
            finally:
                live["now"] -= 1
        r._ask = counting_ask
        return await asyncio.gather(*(r.resolve(f"h{i}.test") for i in range(40)))
    results = run(scenario, s, max_in_flight=3)
    assert all(x.outcome is Outcome.OK for x in results)
    assert live["peak"] == 3


def test_prefetch_starts_one_lookup_that_resolve_then_uses():
    s = DnsServer({"warm.test": (["127.0.0.6"], 0)})

    async def scenario(r):
        r.prefetch("warm.test")
        r.prefetch("warm.test")                   # already pending: no second query
        hit = await r.resolve("warm.test")        # joins the prefetch or reads its cached answer
        return hit, r.stats()
    hit, stats = run(scenario, s, min_ttl_s=60.0)
    assert hit.ips == ["127.0.0.6"]
    assert stats["queries"] == 1
    assert stats["cache_hits"] + stats["coalesced"] == 1
    assert s.queries["warm.test"] == 1


def test_cache_is_bounded_in_bytes_least_recent_out():
    s = DnsServer(lookup=lambda name: (["127.0.0.8"], 0))
    cap = 20 * 400

    async def scenario(r):
        for i in range(50):
            await r.resolve(f"n{i}.test")
            await r.resolve("n0.test")          # kept warm: the least recently used go first
            assert r.memory()["bytes"] <= cap
        return r.stats(), r.memory(), r.cached("n0.test"), r.cached("n1.test")
    stats, mem, warm, cold = run(scenario, s, min_ttl_s=60.0, cache_bytes=cap)
    assert 5 <= stats["cache_entries"] < 50 and mem["cap_bytes"] == cap
    assert warm is not None and cold is None


def test_bad_name_is_dns_error_not_exception():
    s = DnsServer()

    async def scenario(r):
        return await r.resolve("a" * 70 + ".test"), await r.resolve("..")
    long_label, dots = run(scenario, s)
    assert long_label.outcome in (Outcome.DNS_ERROR, Outcome.DNS_NXDOMAIN)
    assert dots.outcome in (Outcome.DNS_ERROR, Outcome.DNS_NXDOMAIN)


def test_rebinding_is_seen_after_expiry():
    clock = FakeClock()
    s = DnsServer({"flip.test": (["127.0.0.2"], 0)})

    async def scenario(r):
        first = await r.resolve("flip.test")
        s.set_record("flip.test", ["127.0.0.3"], 0)
        cached = await r.resolve("flip.test")
        clock.now += 11
        fresh = await r.resolve("flip.test")
        return first, cached, fresh
    first, cached, fresh = run(scenario, s, min_ttl_s=10.0, clock=clock)
    assert first.ips == cached.ips == ["127.0.0.2"]
    assert fresh.ips == ["127.0.0.3"]


def test_cancelled_first_caller_releases_waiters_and_caches_nothing():
    s = DnsServer(silent={"slow.test"}, records={"slow2.test": (["127.0.0.2"], 0)})

    async def scenario(r):
        first = asyncio.ensure_future(r.resolve("slow.test"))
        await asyncio.sleep(0)                    # first caller starts its query
        waiter = asyncio.ensure_future(r.resolve("slow.test"))
        await asyncio.sleep(0)                    # waiter joins it
        first.cancel()
        joined = await waiter
        return joined, first.cancelled(), r.cached("slow.test"), r.stats()
    joined, cancelled, cached, stats = run(scenario, s, timeout_s=5.0)
    assert cancelled
    assert joined.outcome is Outcome.DNS_ERROR and "cancelled" in joined.error
    assert cached is None
    assert stats["in_flight"] == 0


def test_gate_hands_slots_over_in_order_and_survives_cancelled_waiters():
    from crawlerd.fetch.dns import _Gate

    async def main():
        gate = _Gate(1)
        order = []
        await gate.acquire()

        async def user(i):
            await gate.acquire()
            order.append(i)
            gate.release()
        tasks = [asyncio.ensure_future(user(i)) for i in range(5)]
        await asyncio.sleep(0)
        tasks[2].cancel()
        gate.release()
        await asyncio.gather(*tasks, return_exceptions=True)
        await gate.acquire()                      # the slot came back: nothing leaked
        return order, gate._free
    order, free = uvloop.run(main())
    assert order == [0, 1, 3, 4]
    assert free == 0


def test_cache_saved_and_loaded_within_ttl(tmp_path):
    """A restart reuses answers still within their TTL (wall clock), and asks for the rest."""
    path = str(tmp_path / "dns-cache.jsonl")
    clock = FakeClock()
    s = DnsServer({"keep.test": (["127.0.0.7"], 600), "short.test": (["127.0.0.8"], 30)})

    async def first(r):
        await r.resolve("keep.test")
        await r.resolve("short.test")
        await r.resolve("gone.test")            # NXDOMAIN, cached 60 s
        return r.save(path, 5_000.0)
    assert run(first, s, clock=clock) == 3

    clock2 = FakeClock()
    clock2.now = 17.0                           # a new boot: the monotonic clock starts again
    s2 = DnsServer({"keep.test": (["127.0.0.99"], 600), "short.test": (["127.0.0.98"], 30)})

    async def second(r):
        loaded = r.load(path, 5_000.0 + 45.0)    # 45 s later: short.test (30 s) has expired
        keep = await r.resolve("keep.test")
        short = await r.resolve("short.test")
        gone = await r.resolve("gone.test")      # its negative answer has 15 s left
        return loaded, keep, short, gone, r.stats()["queries"]
    loaded, keep, short, gone, queries = run(second, s2, clock=clock2)
    assert loaded == 2 and gone.outcome is Outcome.DNS_NXDOMAIN
    assert keep.ips == ["127.0.0.7"] and keep.ttl_s == 555.0     # from the saved answer, its TTL running on
    assert short.ips == ["127.0.0.98"] and queries == 1


def test_a_snapshot_is_written_off_the_loop_as_it_was_taken(tmp_path):
    """The shard saves the cache on its writer thread: the loop takes a snapshot, the thread
    formats and writes it; what the loop resolves meanwhile is not in that file, what it held is."""
    import threading

    from crawlerd.fetch.dns import write_snapshot

    path = str(tmp_path / "dns-cache.jsonl")
    s = DnsServer({"a.test": (["127.0.0.5"], 600), "b.test": (["127.0.0.6"], 600)})

    async def scenario(r):
        await r.resolve("a.test")
        snap = r.snapshot(5_000.0)
        await r.resolve("b.test")               # after the snapshot
        out = []
        t = threading.Thread(target=lambda: out.append(write_snapshot(path, snap)))
        t.start()
        t.join()
        return out[0]
    assert run(scenario, s) == 1

    async def reload(r):
        return r.load(path, 5_000.0), r.cached("a.test"), r.cached("b.test")
    n, a, b = run(reload, DnsServer({}))
    assert n == 1 and a.ips == ["127.0.0.5"] and b is None


def test_damaged_cache_file_loads_what_it_can(tmp_path):
    path = tmp_path / "dns-cache.jsonl"
    path.write_text('["ok.test", 9000.0, "ok", ["127.0.0.4"]]\nnot json\n["x", 9000, "ok", ["300.1.1.1"]]\n'
                    '["y", 9000, "dns_timeout", []]\n[1, 2]\n')

    async def scenario(r):
        n = r.load(str(path), 1000.0)
        return n, r.cached("ok.test")
    n, hit = run(scenario, DnsServer({}))
    assert n == 1 and hit.ips == ["127.0.0.4"]
