"""STAR/BEAST budgets: the budget rule on a synthetic PLD graph, deferral and readmission, crash safety."""

import collections
import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawlerd import url as urlmod
from crawlerd.frontier.budgets import Budgets, DomainGraph, _TopK, domain_key
from crawlerd.seen.drum import Drum

PARAMS = dict(base_budget=5, per_inlink=3, max_budget=50)


def open_pair(path, *, lru=64, cache=64, sweep_step=1024, **params):
    g = DomainGraph(str(path), lru_entries=lru, map_size_bytes=1 << 26, sync=False, drum_buckets=4,
                    drum_bucket_buffer_bytes=4096, drum_merge_bytes=1 << 20, drum_cache_entries=1024)
    b = Budgets(g, cache_entries=cache, sweep_step=sweep_step, **(params or PARAMS))
    return g, b


@pytest.fixture
def pair(tmp_path):
    g, b = open_pair(tmp_path / "budgets")
    yield g, b
    g.close()


def link(g, src, targets):
    """Edges of one page, the way the shard records them: hosts mapped to registered domains."""
    g.add_edges(urlmod.registered_domain(src), [urlmod.registered_domain(t) for t in targets])


def offer(b, pld, records):
    """The shard's intake: admit each URL or defer it; returns the admitted ones."""
    admitted = []
    for r in records:
        if b.admit(pld):
            admitted.append(r)
        else:
            b.defer(pld, r)
    return admitted


# -- STAR: the budget rule ----------------------------------------------------------------------

def test_spam_farm_of_one_pld_gets_only_the_base_budget(pair):
    g, b = pair
    farm = [f"s{i}.spamfarm.com" for i in range(300)]
    for i, host in enumerate(farm):                       # every farm host links to 20 others
        link(g, host, [farm[(i + j) % len(farm)] for j in range(1, 21)])
    g.flush()
    assert g.indegree("spamfarm.com") == 0                # links inside a PLD earn nothing
    admitted = offer(b, "spamfarm.com", [f"u{i}".encode() for i in range(2000)])
    assert len(admitted) == PARAMS["base_budget"]
    assert b.deferred_of("spamfarm.com") == 2000 - PARAMS["base_budget"]
    assert b.readmit(10_000) == []


def test_many_plds_without_inlinks_each_get_base_and_linked_one_gets_more(pair):
    g, b = pair
    loners = [f"loner{i}.net" for i in range(100)]
    for p in loners:                                      # each links out to popular.org, none links in
        link(g, f"www.{p}", ["popular.org", f"cdn.{p}"])
    g.flush()
    for p in loners:
        assert b.budget(p) == PARAMS["base_budget"]
        assert len(offer(b, p, [b"x"] * 20)) == PARAMS["base_budget"]
    assert g.indegree("popular.org") == 100
    assert b.budget("popular.org") == PARAMS["max_budget"]       # 5 + 3 x 100, capped
    assert len(offer(b, "popular.org", [b"y"] * 80)) == PARAMS["max_budget"]
    b.check_invariants()


@pytest.mark.parametrize("k", [0, 1, 7, 15, 16, 40])
def test_budget_is_base_plus_per_inlink_capped(pair, k):
    g, b = pair
    for i in range(k):
        g.add_edges(f"src{i}.org", ["target.com"])
    g.flush()
    assert g.indegree("target.com") == k
    assert b.budget("target.com") == min(50, 5 + 3 * k)


def test_duplicate_edges_count_once(tmp_path):
    g, b = open_pair(tmp_path / "b")
    for _ in range(3):
        g.add_edges("a.org", ["t.com", "t.com", "a.org", ""])          # repeats, a self-link, junk
    g.add_edges("b.org", ["t.com"])
    assert g.flush() == 2
    g.add_edges("a.org", ["t.com"])                                    # again after the merge
    g.add_edges("t.com", ["t.com"])
    assert g.flush() == 0
    g.close()
    g, b = open_pair(tmp_path / "b")                                   # and after a reopen
    g.add_edges("b.org", ["t.com"])
    g.add_edges("c.org", ["t.com"])
    assert g.flush() == 1
    assert g.indegree("t.com") == 3
    st_ = g.stats()
    assert st_["edges_unique"] == 3 and st_["domains_linked"] == 1
    g.close()


def test_simweb_hosts_are_their_own_registered_domains():
    # The public suffix list's default rule ("*") makes an unknown TLD a suffix: hN.sim is a PLD.
    assert urlmod.registered_domain("h3.sim") == "h3.sim"
    assert urlmod.registered_domain("www.h3.sim") == "h3.sim"


def test_long_names_get_a_hashed_key():
    long = "a" * 300 + ".com"
    assert domain_key(long) != domain_key("b" * 300 + ".com")
    assert len(domain_key(long)) < 64
    assert domain_key("example.com") == b"example.com"


# -- BEAST: defer and readmit -------------------------------------------------------------------

def test_deferred_urls_come_back_when_the_budget_grows_oldest_first(pair):
    g, b = pair
    recs = [f"r{i}".encode() for i in range(20)]
    admitted = offer(b, "x.com", recs)
    assert admitted == recs[:5]
    b.commit()
    assert b.readmit(100) == []                        # no growth, nothing comes back
    g.add_edges("a.org", ["x.com"])
    g.flush()                                          # budget 8: three more
    assert b.readmit(100) == recs[5:8]
    assert b.readmit(100) == []
    for s in ("b.org", "c.org", "d.org"):
        g.add_edges(s, ["x.com"])
    g.flush()                                          # budget 17: nine more, in two calls
    assert b.readmit(4) == recs[8:12]
    assert b.readmit(100) == recs[12:17]
    assert b.spent("x.com") == 17 == b.budget("x.com")
    assert b.deferred_of("x.com") == 3
    b.check_invariants()


def test_new_urls_wait_behind_deferred_ones(pair):
    g, b = pair
    offer(b, "x.com", [f"old{i}".encode() for i in range(8)])     # 5 admitted, 3 deferred
    g.add_edges("a.org", ["x.com"])
    g.flush()                                                      # room for 3 now
    assert not b.admit("x.com")                                   # FIFO: the deferred go first
    b.defer("x.com", b"new0")
    assert b.readmit(100) == [b"old5", b"old6", b"old7"]
    assert b.deferred_of("x.com") == 1
    b.check_invariants()


def test_new_cycle_readmits_every_backlog(pair):
    g, b = pair
    for p in ("a.com", "b.com", "c.com"):
        offer(b, p, [f"{p}/{i}".encode() for i in range(12)])
    b.commit()
    assert b.readmit(100) == []
    b.new_cycle(at=1234.5)
    assert b.cycle == 1 and b.stats()["cycle_started_at"] == 1234.5
    got = b.readmit(100)
    doms = ("a.com", "b.com", "c.com")
    assert sorted(got) == sorted(f"{p}/{i}".encode() for p in doms for i in range(5, 10))
    for p in ("a.com", "b.com", "c.com"):
        assert b.spent(p) == 5 and b.deferred_of(p) == 2
    b.check_invariants()
    b.new_cycle()
    assert len(b.readmit(100)) == 6
    b.check_invariants()
    assert b.stats()["deferred_now"] == 0


def test_a_new_cycle_sweeps_the_backlog_in_bounded_steps(tmp_path):
    g, b = open_pair(tmp_path / "b", sweep_step=3)
    doms = [f"d{i:02d}.com" for i in range(10)]
    for p in doms:
        offer(b, p, [f"{p}/{i}".encode() for i in range(7)])       # 5 admitted, 2 deferred each
    b.new_cycle()
    got = []
    for _ in range(4):                                               # 3 domains visited per call
        got.extend(b.readmit(100))
        b.check_invariants()
    assert b.stats()["sweeping"] is False
    assert sorted(got) == sorted(f"{p}/{i}".encode() for p in doms for i in (5, 6))
    g.close()


def test_a_record_deferred_with_room_left_is_readmitted(pair):
    g, b = pair
    b.defer("x.com", b"direct")            # deferred for another reason while under budget
    b.check_invariants()
    assert b.readmit(10) == [b"direct"]


def test_raised_budget_on_reopen_readmits(tmp_path):
    g, b = open_pair(tmp_path / "b")
    offer(b, "x.com", [f"r{i}".encode() for i in range(30)])
    g.close()
    g, b = open_pair(tmp_path / "b", base_budget=20, per_inlink=3, max_budget=50)
    assert b.stats()["sweeping"]
    assert b.readmit(100) == [f"r{i}".encode() for i in range(5, 20)]
    b.check_invariants()
    g.close()


def test_counters_add_up_and_top_spenders(pair):
    g, b = pair
    for i in range(10):
        g.add_edges(f"s{i}.org", ["big.com"])
    g.add_edges("s0.org", ["mid.com"])
    g.flush()
    offer(b, "big.com", [b"u"] * 40)
    offer(b, "mid.com", [b"u"] * 12)
    offer(b, "small.com", [b"u"] * 3)
    s = b.stats(top=2)
    assert [t["domain"] for t in s["top_spenders"]] == ["big.com", "mid.com"]
    assert s["top_spenders"][0] == {"domain": "big.com", "spent": 35, "budget": 35, "indegree": 10,
                                    "deferred": 5}
    assert s["admitted"] == 35 + 8 + 3
    assert s["deferred_total"] == s["deferred_now"] + s["readmitted"] == 5 + 4
    assert s["graph"]["top_indegree"][0] == {"domain": "big.com", "indegree": 10}


def test_ram_is_bounded_by_the_lrus_and_write_back_is_exact(tmp_path):
    g, b = open_pair(tmp_path / "b", lru=8, cache=8)
    rng = random.Random(3)
    want = collections.Counter()
    for _ in range(3000):
        p = f"d{rng.randrange(400)}.com"
        if b.admit(p):
            want[p] += 1
        else:
            b.defer(p, p.encode())
        assert b.cached <= 8 and g.cached <= 8
    for i in range(400):
        g.add_edges(f"s{i % 7}.org", [f"d{i}.com"])
    g.flush()
    assert g.cached <= 8
    g.close()
    g, b = open_pair(tmp_path / "b", lru=8, cache=8)
    for i in range(400):
        p = f"d{i}.com"
        assert b.spent(p) == want[p]
        assert g.indegree(p) == 1
    b.check_invariants()
    g.close()


# -- crash safety ---------------------------------------------------------------------------------

def test_redelivered_edge_answers_are_not_counted_twice(tmp_path, monkeypatch):
    g, b = open_pair(tmp_path / "b")
    for i in range(6):
        g.add_edges(f"s{i}.org", ["t.com"])
    monkeypatch.setattr(Drum, "ack", lambda self: None)      # crash between the commit and the ack
    g.flush()
    assert g.indegree("t.com") == 6
    g.close()
    monkeypatch.undo()
    g, b = open_pair(tmp_path / "b")
    g.poll()
    assert g.indegree("t.com") == 6
    assert g.stats()["redelivered_skipped"] == 6
    g.close()


CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {tests!r})
    from frontier.test_budgets import open_pair, offer
    g, b = open_pair({path!r})
    for d in range(10):
        offer(b, f"d{{d}}.com", [f"d{{d}}/{{i}}".encode() for i in range(30)])
    b.commit()
    for d in range(4):
        g.add_edges(f"s{{d}}.org", [f"d{{d}}.com"])
    g.flush()
    with open({queued!r}, "ab") as q:
        for commit in (True, False):
            got = b.readmit(6)
            q.write(b"".join(r + b"\\n" for r in got))
            q.flush()
            os.fsync(q.fileno())
            if commit:
                b.commit()
    for d in range(5):
        g.add_edges(f"late{{d}}.org", ["d9.com"])           # returned: in the DRUM journal
    print("ready", flush=True)
    sys.stdin.read()
""")


def test_kill_9_loses_no_deferred_record(tmp_path):
    path, queued = str(tmp_path / "b"), str(tmp_path / "queued")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = CHILD.format(tests=tests, path=path, queued=queued)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"ready\n"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    # Every record offered was admitted at once (5 per domain), or must be queued or still deferred.
    offered = {f"d{d}/{i}".encode() for d in range(10) for i in range(30)}
    admitted = {f"d{d}/{i}".encode() for d in range(10) for i in range(5)}
    with open(queued, "rb") as f:
        queued_recs = f.read().split(b"\n")[:-1]
    assert len(queued_recs) == 12
    g, b = open_pair(path, base_budget=1000, per_inlink=3, max_budget=1000)
    b.check_invariants()
    rest = b.readmit(10_000)
    assert admitted | set(queued_recs) | set(rest) == offered
    assert len(rest) + 6 == len(offered - admitted)           # only the 6 uncommitted ones come twice
    assert len(set(queued_recs) & set(rest)) == 6
    g.flush()
    assert g.indegree("d9.com") == 5 and g.indegree("d0.com") == 1
    g.close()


# -- against a plain model --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_matches_a_plain_model_through_reopens(tmp_path, seed):
    rng = random.Random(seed)
    path = tmp_path / "b"
    g, b = open_pair(path, lru=5, cache=5)
    doms = [f"d{i}.com" for i in range(12)]
    inlinks = collections.defaultdict(set)
    spent = collections.Counter()
    deferred = collections.defaultdict(collections.deque)
    pending = []
    serial = 0

    def budget(p):
        return min(50, 5 + 3 * len(inlinks[p]))

    for step in range(600):
        op = rng.random()
        if op < 0.55:
            p = rng.choice(doms)
            serial += 1
            rec = f"{p}#{serial}".encode()
            ok = not deferred[p] and spent[p] < budget(p)
            assert b.admit(p) == ok, (step, p)
            if ok:
                spent[p] += 1
            else:
                b.defer(p, rec)
                deferred[p].append(rec)
        elif op < 0.7:
            src = f"s{rng.randrange(20)}.org"
            tgts = rng.sample(doms, 3)
            g.add_edges(src, tgts)
            pending.extend((src, t) for t in tgts)
        elif op < 0.75:
            g.flush()                              # edges count once the DRUM has answered them
            for src, t in pending:
                inlinks[t].add(src)
            pending.clear()
        elif op < 0.9:
            got = b.readmit(10_000)
            want = []
            for p in doms:
                n = min(budget(p) - spent[p], len(deferred[p]))
                if n > 0:
                    spent[p] += n
                    want.extend(deferred[p].popleft() for _ in range(n))
            assert sorted(got) == sorted(want), step
            per_dom = collections.defaultdict(list)
            for r in got:
                per_dom[r.split(b"#")[0]].append(int(r.split(b"#")[1]))
            assert all(v == sorted(v) for v in per_dom.values())       # oldest first per domain
            b.commit()
        elif op < 0.93:
            b.new_cycle()
            spent.clear()
        elif op < 0.96:
            g.close()
            g, b = open_pair(path, lru=5, cache=5)
        else:
            b.check_invariants()
    g.flush()
    for src, t in pending:
        inlinks[t].add(src)
    b.check_invariants()
    for p in doms:
        assert b.spent(p) == spent[p] and b.deferred_of(p) == len(deferred[p])
        assert g.indegree(p) == len(inlinks[p])
    g.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 5)), max_size=300), st.integers(1, 6))
def test_topk_is_exact(notes, k):
    top = _TopK(k)
    value = collections.Counter()
    for key, inc in notes:
        dk = f"k{key}".encode()
        value[dk] += inc
        top.note(dk, value[dk])
    want = sorted(value.values(), reverse=True)[:k]
    assert [v for _, v in top.top(k)] == want
    again = _TopK(k, top.saved())
    assert again.top(k) == top.top(k)
