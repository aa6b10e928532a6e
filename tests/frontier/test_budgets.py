"""STAR budgets: the rule, vouched in-degrees, the edge DRUM's schedule and deliveries, vouches across
shards, the top-k list, and the first layout's import. BEAST's queues are in test_beast*.py."""

import asyncio
import collections
import random
import struct

import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawlerd.frontier.budgets import (
    BudgetRule,
    Budgets,
    BudgetStore,
    DomainGraph,
    EdgeClock,
    EdgeDrum,
    domain_key,
)
from crawlerd.frontier.budgets.store import KeyMemo
from crawlerd.frontier.budgets.topk import TopK
from crawlerd.seen.drum import Drum
from crawlerd.url.hosts import registered_domain
from tests.frontier.budget_parts import RULE, Parts, drain

# -- the rule ----------------------------------------------------------------------------------

@pytest.mark.parametrize("d", [0, 1, 7, 15, 16, 40])
def test_budget_is_base_plus_per_inlink_capped(d):
    assert BudgetRule(**RULE).budget(d) == min(50, 2 + 3 * d)


def test_bad_rule_is_refused():
    with pytest.raises(ValueError):
        BudgetRule(0, 1, 10)
    with pytest.raises(ValueError):
        BudgetRule(10, 1, 5)


# -- STAR: in-degree -----------------------------------------------------------------------------

def test_links_inside_one_pld_earn_nothing(parts):
    farm = [f"s{i}.spamfarm.com" for i in range(300)]
    for i, host in enumerate(farm):
        parts.link(host, [farm[(i + j) % len(farm)] for j in range(1, 21)])
    parts.edges.flush()
    assert parts.graph.indegree("spamfarm.com") == 0
    assert parts.offer("spamfarm.com", [f"u{i}".encode() for i in range(2000)]) == [b"u0", b"u1"]
    assert parts.beast.readmit(10_000) == []


def test_plain_counting_counts_distinct_linking_domains_once(tmp_path):
    p = Parts(tmp_path / "b", mode="all")
    for _ in range(3):
        p.edges.add("a.org", ["t.com", "t.com", "a.org", ""])          # repeats, a self-link, junk
    p.edges.add("b.org", ["t.com"])
    assert p.edges.flush() == 2
    p.edges.add("a.org", ["t.com"])
    assert p.edges.flush() == 0
    p.close()
    p = Parts(tmp_path / "b", mode="all")                              # and after a reopen
    p.edges.add("b.org", ["t.com"])
    p.edges.add("c.org", ["t.com"])
    assert p.edges.flush() == 1
    assert p.graph.indegree("t.com") == 3
    assert p.beast.budget("t.com") == 2 + 3 * 3
    p.check()
    p.close()


def test_seed_domains_vouch_for_all_others_for_half_their_in_degree(tmp_path):
    p = Parts(tmp_path / "b")
    p.graph.add_root("seed.org")
    p.edges.add("seed.org", ["a.com", "b.com", "c.com"])
    p.edges.add("a.com", ["x.com", "y.com"])           # a.com has in-degree 1: it vouches for nobody yet
    p.edges.flush()
    assert [p.graph.indegree(d) for d in ("a.com", "b.com", "x.com", "y.com")] == [1, 1, 0, 0]
    p.edges.add("b.com", ["a.com"])                    # b.com cannot vouch either
    p.edges.add("seed2.org", ["a.com"])
    p.graph.add_root("seed2.org")                      # its waiting link counts once it is a root
    p.edges.flush()
    assert p.graph.indegree("a.com") == 2              # seed + seed2: a.com now vouches for one domain
    assert p.graph.indegree("x.com") + p.graph.indegree("y.com") == 1
    assert p.graph.stats()["votes_waiting"] == 2        # a.com -> y.com, b.com -> a.com
    p.check()
    p.close()


def test_a_farm_linking_to_itself_earns_only_what_honest_domains_give_it(tmp_path):
    rng = random.Random(5)
    farm = [f"spam{i}.net" for i in range(200)]
    honest = [f"site{i}.org" for i in range(400)]
    counts = {}
    for mode in ("all", "vouched"):
        p = Parts(tmp_path / mode, mode=mode)
        for s in honest[:40]:
            p.graph.add_root(s)
        for s in honest:
            p.edges.add(s, rng.sample(honest, 8) + ([rng.choice(farm)] if rng.random() < 0.05 else []))
        for f in farm:                                  # every farm page links to 30 other farm domains
            p.edges.add(f, rng.sample(farm, 30))
        p.edges.flush()
        counts[mode] = (sum(p.graph.indegree(f) for f in farm) / len(farm),
                        sum(p.graph.indegree(s) for s in honest) / len(honest))
        p.check()
        p.close()
    farm_all, honest_all = counts["all"]
    farm_v, honest_v = counts["vouched"]
    assert farm_all > 3 * honest_all                    # plain counting: the farm looks best
    assert farm_v < honest_v / 4                        # vouched: it earns about what honest sites give it
    assert farm_v < 1.0


def test_redelivered_edge_answers_are_not_counted_twice(tmp_path, monkeypatch):
    p = Parts(tmp_path / "b", mode="all")
    for i in range(6):
        p.edges.add(f"s{i}.org", ["t.com"])
    monkeypatch.setattr(Drum, "ack", lambda self: None)      # crash between the commit and the ack
    p.edges.flush()
    assert p.graph.indegree("t.com") == 6
    p.close()
    monkeypatch.undo()
    p = Parts(tmp_path / "b", mode="all")
    p.edges.flush()
    assert p.graph.indegree("t.com") == 6
    assert p.graph.stats()["redelivered_skipped"] == 6
    p.close()


def test_long_names_get_a_hashed_key():
    assert domain_key("a" * 300 + ".com") != domain_key("b" * 300 + ".com")
    assert len(domain_key("a" * 300 + ".com")) < 64
    assert domain_key("example.com") == b"example.com"
    assert b"\0" not in domain_key("bad\0name")


def test_simweb_hosts_are_their_own_registered_domains():
    # The public suffix list's default rule ("*") makes an unknown TLD a suffix: hN.sim is a PLD.
    assert registered_domain("h3.sim") == "h3.sim"
    assert registered_domain("www.h3.sim") == "h3.sim"


def test_offer_many_charges_each_host_to_its_registered_domain_as_offer_does(tmp_path):
    """``Budgets.offer_many`` (a host's domain key looked up once per run of its URLs) and one
    ``Budgets.offer`` per URL, fed the same stream: the same verdicts, and each host's URLs charged
    to its registered domain (hosts of one domain share its budget; an IP host and a name too long
    for a key are domains of their own)."""
    long_name = "x" * 250 + ".com"
    plds = {"http://a.example.co.uk": "example.co.uk", "https://b.example.co.uk:8443": "example.co.uk",
            "http://c.example.co.uk": "example.co.uk", "http://www.h1.sim": "h1.sim", "http://h1.sim": "h1.sim",
            "http://h2.sim": "h2.sim", "http://192.0.2.7:8080": "192.0.2.7", f"http://{long_name}": long_name}
    rng = random.Random(5)
    sides = [Budgets(str(tmp_path / name), base_budget=3, per_inlink=2, max_budget=100, map_size_bytes=1 << 24,
                     sync=False, mode="all") for name in ("one", "many")]
    try:
        want, got, serial = [], [], 0
        offered = collections.Counter()
        for _ in range(40):
            batch = []
            for _ in range(rng.randrange(1, 5)):            # a page's links: runs of a few hosts
                hk = rng.choice(list(plds))
                for _ in range(rng.randrange(1, 6)):
                    serial += 1
                    batch.append((f"{hk}/p/{serial}".encode(), serial, hk))
                    offered[plds[hk]] += 1
            want += [sides[0].offer(rec.decode(), rec, fp, hk) for rec, fp, hk in batch]
            got += sides[1].offer_many([b[0] for b in batch], [b[1] for b in batch], [b[2] for b in batch])
        assert got == want
        assert True in got and False in got
        assert sides[0].beast.stats() == sides[1].beast.stats()
        for pld, n in offered.items():
            one, many = (b.beast.domain(pld) for b in sides)
            assert one == many
            assert many["admitted"] + many["deferred_all"] == n, pld      # its hosts' URLs, no other
    finally:
        for b in sides:
            asyncio.run(b.close())


def test_a_key_memo_answers_what_its_function_does_and_holds_at_most_its_entries():
    calls = []

    def fn(k: str) -> bytes:
        calls.append(k)
        return k.encode()[::-1]

    memo = KeyMemo(fn, 3)
    for k in ["a", "b", "a", "c", "d", "e", "a", "e"]:
        assert memo[k] == fn(k)
        assert len(memo) <= 3
    assert memo.get("zz") is None                # a plain look-up computes nothing


# -- the edge DRUM's schedule -------------------------------------------------------------------

def test_edges_merge_on_age_or_pending_and_never_more_than_a_tenth_of_the_time():
    c = EdgeClock(max_age_s=10.0, max_pending=100)
    assert not c.should_merge(0.0, 0)
    c.submitted(0, 5, now=0.0)
    assert not c.should_merge(9.0, 5)
    assert c.should_merge(10.0, 5)                       # the oldest edge is 10 s old
    assert c.should_merge(1.0, 100)                      # 100 edges wait
    c.merged(10.0, duration_s=3.0)
    assert not c.should_merge(20.0, 500)                 # merged 10 s ago, and a merge takes 3 s
    assert c.should_merge(40.0, 500)
    c.delivered(5, now=12.5)
    assert c.lag_last_s == 12.5 and c.oldest_age(12.5) == 0.0


def test_in_degree_lag_follows_the_age_trigger(tmp_path):
    now = [100.0]
    store = BudgetStore(str(tmp_path / "s"), map_size_bytes=1 << 26, sync=False)
    g = DomainGraph(store, mode="all")
    e = EdgeDrum(str(tmp_path / "e"), g, max_age_s=5.0, max_pending=10_000, buckets=2, clock=lambda: now[0])
    for t in range(30):
        now[0] = 100.0 + t
        e.add(f"s{t}.org", ["t.com"])
        e.poll()
        assert g.indegree("t.com") >= t - 5             # never more than max_age_s behind
    assert e.timing.lag_max_s <= 5.0 + 1.0
    store.close()
    e.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 5)), max_size=300), st.integers(1, 6))
def test_topk_is_exact(notes, k):
    top = TopK(k)
    value = collections.Counter()
    for key, inc in notes:
        dk = f"k{key}".encode()
        value[dk] += inc
        top.note(dk, value[dk])
    want = sorted(value.values(), reverse=True)[:k]
    assert [v for _, v in top.top(k)] == want
    again = TopK(k, top.saved())
    assert again.top(k) == top.top(k)


def test_state_of_the_first_layout_is_imported_without_losing_a_deferred_url(tmp_path):
    state = tmp_path / "b" / "state"
    state.mkdir(parents=True)
    env = lmdb.open(str(state), max_dbs=8, map_size=1 << 26)
    dbs = {n: env.open_db(n) for n in (b"indeg", b"domains", b"deferred", b"backlog", b"grown", b"meta")}
    want = []
    with env.begin(write=True) as txn:
        for d in range(3):
            for i in range(5):
                rec = f"0 0 1 http://d{d}.com/{i}".encode()
                txn.put(f"d{d}.com".encode() + b"\0" + struct.pack(">Q", d * 5 + i), rec, db=dbs[b"deferred"])
                want.append(rec)
            txn.put(f"d{d}.com".encode(), b"", db=dbs[b"backlog"])
        txn.put(b"budgets", b"{}", db=dbs[b"meta"])
    env.close()
    (tmp_path / "b" / "edges").mkdir()
    (tmp_path / "b" / "edges" / "MANIFEST").write_text("not the new edge DRUM's")
    b = Budgets(str(tmp_path / "b"), base_budget=2, per_inlink=2, max_budget=100)
    b.beast.check_invariants()
    got = drain(b.beast)
    assert sorted(got) == sorted(want)
    asyncio.run(b.close())
    assert not (tmp_path / "b" / "state.v1").exists()
    b = Budgets(str(tmp_path / "b"), base_budget=2, per_inlink=2, max_budget=100)     # opens as the new layout
    assert b.beast.waiting == 0
    asyncio.run(b.close())


def test_vouches_across_shards_count_where_their_target_lives_once_and_cascade(tmp_path):
    """Two shards: each decides the edges of its own domains; a vouch for the other's domain is
    handed over (delivered twice here, as a hand-off after a crash may), counted once, and lets
    that domain vouch in turn. The in-degrees equal those of one graph holding every domain."""
    owner = {"seed.org": 0, "a1.com": 0, "a2.com": 0, "seed2.org": 1, "b1.com": 1, "b2.com": 1}
    pages = [("seed.org", ["b1.com", "a1.com"]), ("seed2.org", ["b1.com", "a1.com"]),
             ("a1.com", ["b1.com"]), ("b1.com", ["a2.com"])]
    one = Parts(tmp_path / "one")
    for root in ("seed.org", "seed2.org"):
        one.graph.add_root(root)
    for src, dsts in pages:
        one.edges.add(src, dsts)
    one.edges.flush()
    want = {d: one.graph.indegree(d) for d in owner}
    one.check()
    one.close()
    assert want == {"seed.org": 0, "a1.com": 2, "a2.com": 1, "seed2.org": 0, "b1.com": 3, "b2.com": 0}

    shards = [Parts(tmp_path / "s0"), Parts(tmp_path / "s1")]
    outbox: list[list[tuple[bytes, bytes]]] = [[], []]
    for i, p in enumerate(shards):
        def export(src, dst, me=i):
            dest = owner[dst.decode()]
            if dest == me:
                return False
            outbox[dest].append((src, dst))
            return True
        p.graph.export = export
    shards[0].graph.add_root("seed.org")
    shards[1].graph.add_root("seed2.org")
    for src, dsts in pages:
        shards[owner[src]].edges.add(src, dsts)
    for _ in range(10):
        for p in shards:
            p.edges.flush()
        if not any(outbox):
            break
        for i, p in enumerate(shards):
            got, outbox[i] = outbox[i], []
            p.edges.add_vouches(got)
            p.edges.add_vouches(got)        # delivered again: the DRUM absorbs it
    got = {d: shards[owner[d]].graph.indegree(d) for d in owner}
    assert got == want
    assert shards[0].graph.stats()["vouches_handed"] > 0 and shards[1].graph.stats()["vouches_received"] > 0
    for p in shards:
        p.check()
        p.close()


def test_edges_of_many_loop_iterations_go_to_the_edge_drum_in_few_jobs_and_all_count(tmp_path):
    """Pages' edges handed over in 60 loop iterations 10 ms apart (as ``Answers`` does, one ``record_pages_links``
    per iteration) reach the edge DRUM in jobs at most ``EDGE_JOB_GAP_S`` apart (plus its polls),
    not one job per iteration; after a flush every edge is counted once."""
    from crawlerd.frontier.budgets.stage import EDGE_JOB_GAP_S

    async def go():
        b = Budgets(str(tmp_path / "budgets"), base_budget=2, per_inlink=2, max_budget=100, map_size_bytes=1 << 24,
                    edge_buckets=2, edge_merge_bytes=1 << 20, edge_cache_entries=1 << 10, sync=False, mode="all")
        loop = asyncio.get_running_loop()
        b.start(loop)
        try:
            await asyncio.sleep(0)
            jobs0, t0 = b.edges.stats()["jobs"], loop.time()
            for i in range(60):
                b.record_pages_links([(f"http://s{i}.org", {"http://t.com", f"http://u{i % 7}.com"})])
                await asyncio.sleep(0.01)       # a later loop iteration
            jobs, elapsed = b.edges.stats()["jobs"] - jobs0, loop.time() - t0
            await b.edges.flush()
            return jobs, elapsed, b.graph.indegree("t.com"), [b.graph.indegree(f"u{k}.com") for k in range(7)]
        finally:
            await b.close()

    jobs, elapsed, t_in, u_in = asyncio.run(go())
    # the gap bounds the jobs whatever the box's speed: one at the start, one per gap (at least
    # 0.25 s: a job costs a trip, an intake segment and a delivery) and per poll (0.5 s)
    assert EDGE_JOB_GAP_S >= 0.25
    assert jobs <= 2 + elapsed / 0.25 + elapsed / 0.5, (jobs, elapsed)
    assert jobs < 60
    assert t_in == 60 and u_in == [9, 9, 9, 9, 8, 8, 8]       # every edge counted once


def test_an_edge_delivery_is_applied_in_slices_committed_once_then_acknowledged(tmp_path, monkeypatch):
    """The stage applies an edge delivery EDGE_SLICE answers per loop iteration and commits and
    acknowledges once, after the last slice, in an iteration of its own."""
    import crawlerd.frontier.budgets.stage as stage_module

    monkeypatch.setattr(stage_module, "EDGE_SLICE", 8)

    async def go():
        b = Budgets(str(tmp_path / "budgets"), base_budget=2, per_inlink=2, max_budget=100, map_size_bytes=1 << 24,
                    edge_buckets=2, edge_merge_bytes=1 << 20, edge_cache_entries=1 << 10, sync=False, mode="all")
        loop = asyncio.get_running_loop()
        b.start(loop)
        ticks, events = [0], []
        real_apply, real_commit, real_ack = b.graph.apply, b.store.commit, b.edges.ack

        def tick():                     # once per loop iteration
            ticks[0] += 1
            loop.call_soon(tick)
        tick()

        def apply(results):
            events.append(("apply", len(results), ticks[0]))
            return real_apply(results)

        def commit(then=None):
            events.append(("commit", 0, ticks[0]))
            real_commit(then)           # the ack waits for ``then``: the commit written

        def ack():
            events.append(("ack", 0, ticks[0]))
            real_ack()

        b.graph.apply, b.store.commit, b.edges.ack = apply, commit, ack
        try:
            n = b.record_pages_links([(f"http://s{i}.org/", ["http://t.com"]) for i in range(30)])
            await b.edges.flush()
            return n, events, b.graph.indegree("t.com")
        finally:
            await b.close()

    n, events, indeg = asyncio.run(go())
    assert n == 30 and indeg == 30
    applies = [e for e in events if e[0] == "apply"]
    assert [size for _, size, _ in applies] == [8, 8, 8, 6]
    assert len({t for *_, t in applies}) == 4                  # one slice per loop iteration
    first, last = events.index(applies[0]), events.index(applies[-1])
    assert all(e[0] == "apply" for e in events[first:last + 1])  # nothing committed between slices
    assert [e[0] for e in events[last + 1:last + 3]] == ["commit", "ack"]    # then commit, then ack
    assert events[last + 1][2] > applies[-1][2]                  # the commit in an iteration of its own


def test_edge_keys_by_domain_key_are_the_edge_keys_by_name(tmp_path):
    """``domain_edge_keys`` (what ``record_pages_links`` calls with the memo's domain keys) gives the
    same edges as ``edge_keys`` on the names: links to the page's own domain, to the empty name
    and repeats left out, a name too long or unusable for a key hashed alike."""
    store = BudgetStore(str(tmp_path / "s"), map_size_bytes=1 << 26, sync=False)
    g = DomainGraph(store, mode="all")
    names = ["a.org", "b.org", "", "x" * 300 + ".org", "#odd", "nul\0.org", "c.net"]
    rng = random.Random(5)
    for _ in range(300):
        src = rng.choice(names)
        targets = {rng.choice(names) for _ in range(rng.randrange(6))}
        want = sorted(zip(*g.edge_keys(src, targets), strict=True))
        got = sorted(zip(*g.domain_edge_keys(domain_key(src), {domain_key(t) for t in targets}), strict=True))
        assert got == want, (src, targets)
    store.close()


def _vouched_model(roots, links, ratio):
    """In-degrees by the vouching rule on plain containers: each source counts its first
    min(its links, limit) distinct targets, limit = floor(ratio x in-degree) (roots: all), to the
    least fixed point (counting only raises limits, so it is unique)."""
    indeg = collections.Counter()
    cast = collections.Counter()
    while True:
        moved = False
        for src, targets in links.items():
            limit = len(targets) if src in roots else int(ratio * indeg[src])
            while cast[src] < min(limit, len(targets)):
                indeg[targets[cast[src]]] += 1
                cast[src] += 1
                moved = True
        if not moved:
            return indeg


@pytest.mark.parametrize("seed", range(4))
def test_waiting_votes_stored_a_delivery_per_entry_count_as_one_link_per_entry_did(tmp_path, seed, monkeypatch):
    """Votes that wait are written one entry per source and delivery (FIFO format 4; entries split at
    ``VOTES_BYTES``, made small here): over random deliveries of links between a few domains, some
    roots, with commits and reopens between deliveries, the in-degrees are the vouching rule's at
    every step, the pending counts match the stored votes, and fewer entries are stored than votes."""
    from crawlerd.frontier.budgets import graph as graph_mod
    monkeypatch.setattr(graph_mod, "VOTES_BYTES", 40, raising=False)
    rng = random.Random(seed)
    doms = [f"d{i}.com" for i in range(14)]
    roots = {"d0.com", "d1.com"}
    links: dict[str, list[str]] = collections.defaultdict(list)
    p = Parts(tmp_path / "b")
    for r in sorted(roots):
        p.graph.add_root(r)
    multi = False
    for step in range(30):
        for _ in range(rng.randrange(1, 5)):
            src = rng.choice(doms)
            targets = [t for t in rng.sample(doms, rng.randrange(1, 8)) if t != src and t not in links[src]]
            links[src] += targets
            for t in targets:           # one call per link: a call's links reach the DRUM as a set
                p.edges.add(src, [t])
        p.edges.flush()
        model = _vouched_model(roots, links, 0.5)
        assert {d: p.graph.indegree(d) for d in doms} == {d: model[d] for d in doms}, step
        with p.store.env.begin() as txn:
            multi |= any(b"\0" in bytes(v) for v in txn.cursor(db=p.store.votes).iternext(keys=False))
        p.check()
        if rng.random() < 0.3:
            p.close()
            p = Parts(tmp_path / "b")
    assert multi
    assert p.graph.stats()["votes_waiting"] == sum(len(t) for t in links.values()) - sum(model.values())
    p.close()
