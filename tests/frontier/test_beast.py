"""BEAST (crawlerd.frontier.budgets.beast): queues and their reader, probation, refunds, explain and
stats, bounded RAM, kill -9 safety, a plain model through reopens, the host-turn read cache and the
batched offer path."""

import collections
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading

import lmdb
import pytest

from crawlerd.frontier.budgets import (
    domain_key,
)
from tests.frontier.budget_parts import Landing, Parts, drain

# -- BEAST ---------------------------------------------------------------------------------------

def test_a_domain_passes_its_budget_per_queue_and_the_rest_waits_in_order(parts):
    b = parts.beast
    recs = [f"r{i}".encode() for i in range(9)]
    assert parts.offer("x.com", recs) == recs[:2]
    assert b.readmit(100) == []                          # the reader stays: nothing more this queue
    assert b.readmit(100, advance=True) == recs[2:]      # queues 1, 2, 3, 4 ...: two each, in order
    assert b.reader > 0
    parts.check()


def test_new_urls_wait_behind_deferred_ones_and_a_new_queue_takes_them_first(parts):
    b = parts.beast
    parts.offer("x.com", [b"a0", b"a1", b"a2"])
    assert not b.offer("x.com", b"new")                  # FIFO: behind a2
    assert b.readmit(2, advance=True) == [b"a2", b"new"]


def test_the_hosts_of_a_domain_take_turns(parts):
    b = parts.beast
    for i in range(10):
        b.offer("uni.edu", f"a{i}".encode(), host="http://a.uni.edu")
    for i in range(3):
        b.offer("uni.edu", f"b{i}".encode(), host="http://b.uni.edu")
    b.offer("uni.edu", b"c0", host="http://c.uni.edu")
    # a0, a1 passed at once (budget 2); then every host's first waiting URL before any host's second
    got = b.readmit(7, advance=True)
    assert got == [b"a2", b"b0", b"c0", b"a3", b"b1", b"a4", b"b2"]
    # a host new to the backlog starts at the domain's current turn, ahead of the long host's tail
    b.offer("uni.edu", b"d0", host="http://d.uni.edu")
    b.offer("uni.edu", b"d1", host="http://d.uni.edu")
    assert drain(b) == [b"d0", b"a5", b"d1", b"a6", b"a7", b"a8", b"a9"]
    parts.check()                     # drained: no host turn is kept for it any more


def test_turns_survive_a_reopen(tmp_path):
    p = Parts(tmp_path / "b", mode="all")
    for i in range(6):
        p.beast.offer("uni.edu", f"a{i}".encode(), host="http://a.uni.edu")
    assert p.beast.readmit(2, advance=True) == [b"a2", b"a3"]
    p.close()
    p = Parts(tmp_path / "b", mode="all")
    p.beast.offer("uni.edu", b"b0", host="http://b.uni.edu")     # the current turn: before a4
    p.beast.offer("uni.edu", b"a6", host="http://a.uni.edu")     # host a's next turn: after a5
    assert drain(p.beast) == [b"b0", b"a4", b"a5", b"a6"]
    p.check()
    p.close()


def test_a_backlog_of_the_arrival_only_format_keeps_its_order(tmp_path):
    """State written before hosts took turns (deferred key: domain, NUL, arrival) is read in order."""
    p = Parts(tmp_path / "b", mode="all")
    for i in range(5):
        p.beast.offer("x.com", f"r{i}".encode(), host=f"http://h{i}.x.com")
    p.close()
    env = lmdb.open(os.path.join(str(tmp_path / "b"), "state"), max_dbs=8, map_size=1 << 26)
    deferred, domains, meta = (env.open_db(n) for n in (b"deferred", b"domains", b"meta"))
    with env.begin(write=True) as txn:
        rows = list(txn.cursor(db=deferred))
        txn.drop(deferred, delete=False)
        for k, v in rows:
            cut = k.index(b"\0") + 1
            txn.put(k[:cut] + k[cut + 8:], v, db=deferred)       # drop the turn: arrival only
        raw = txn.get(b"x.com", db=domains)
        txn.put(b"x.com", raw[:56], db=domains)                 # its first eight fields: no turns
        m = __import__("json").loads(txn.get(b"beast", db=meta))
        del m["fifo"]
        txn.put(b"beast", __import__("json").dumps(m).encode(), db=meta)
        txn.drop(env.open_db(b"turns", txn=txn), delete=False)
    env.close()
    p = Parts(tmp_path / "b", mode="all")
    p.check()
    assert drain(p.beast) == [b"r2", b"r3", b"r4"]
    p.check()
    p.close()


def test_spam_is_spread_geometrically_never_dropped(tmp_path):
    p = Parts(tmp_path / "b", queues=4, max_spread=1 << 20)
    b = p.beast
    p.offer("spam.com", [f"s{i}".encode() for i in range(2000)])
    passes = []                                          # queue of each pass of spam.com
    while True:
        got = b.readmit(2, advance=True)                 # one pass per call: its budget is 2
        if not got:
            break
        passes.append((b.reader, len(got)))
    gaps = [q2 - q1 for (q1, _), (q2, _) in zip(passes, passes[1:], strict=False)]
    assert sum(n for _, n in passes) == 2000 - 2         # every URL passed, two per queue
    assert all(n == 2 for _, n in passes)
    assert gaps[:3] == [1, 1, 1] and max(gaps) >= 256     # one queue apart at first, then further and further
    assert gaps == sorted(gaps)
    p.check()
    p.close()


def test_a_fresh_domain_passes_every_queue_while_spam_waits_longer(tmp_path):
    p = Parts(tmp_path / "b", queues=2)
    b = p.beast
    p.offer("spam.com", [f"s{i}".encode() for i in range(5000)])
    for _ in range(200):                                 # long enough for several wrap-arounds
        b.readmit(2, advance=True)
    p.offer("fresh.org", [f"f{i}".encode() for i in range(40)])
    got = []
    for _ in range(20):
        got += b.readmit(2, advance=True)
    spam = sum(r.startswith(b"s") for r in got)
    assert sum(r.startswith(b"f") for r in got) >= 10 * max(spam, 1)
    p.close()


def test_a_rising_in_degree_lets_a_waiting_domain_pass_at_once(parts):
    b = parts.beast
    parts.offer("x.com", [f"r{i}".encode() for i in range(20)])
    parts.edges.add("a.org", ["x.com"])
    parts.edges.flush()                                  # budget 2 + 3 = 5: three more in this queue
    assert b.readmit(100) == [b"r2", b"r3", b"r4"]
    assert b.domain("x.com")["spent"] == 5
    parts.check()


def test_domains_due_now_pass_merged_with_the_readers_queue_in_domain_order(parts):
    """Domains whose in-degree rose while listed in a later queue are due now (in RAM, their queue
    entry kept): the reader's queue hands out its listed domains and the due ones merged in domain
    key order, as one table would, across calls that stop mid-domain; passing them writes no
    queue entry beyond moving those listed in the reader's queue."""
    b = parts.beast
    for d in "abcdef":
        parts.offer(f"{d}.com", [f"{d}{i}".encode() for i in range(10)])
    assert b.readmit(2, advance=True) == [b"a2", b"a3"]      # the reader on queue 1; a.com now listed in 2
    for d in ("bb", "zz"):                                   # new while the reader stands on 1: listed in 2
        assert parts.offer(f"{d}.com", [f"{d}{i}".encode() for i in range(10)]) == [f"{d}0".encode(), f"{d}1".encode()]
    parts.edges.add("s.org", ["a.com", "bb.com", "zz.com"])
    parts.edges.flush()                                      # budget 5: three more each in queue 1
    assert b.domain("bb.com")["queue"] == b.reader == 1
    got = []
    for _ in range(100):
        got += b.readmit(1)
    assert got == [b"a4", b"a5", b"a6", b"b2", b"b3", b"bb2", b"bb3", b"bb4", b"c2", b"c3", b"d2", b"d3",
                   b"e2", b"e3", b"f2", b"f3", b"zz2", b"zz3", b"zz4"]
    assert all(b.domain(f"{d}.com")["queue"] == 2 for d in ("a", "b", "bb", "c", "zz"))
    parts.check()


def test_a_due_domain_is_kept_across_a_close(tmp_path):
    p = Parts(tmp_path / "b", mode="all")
    p.offer("x.com", [f"r{i}".encode() for i in range(20)])
    p.edges.add("a.org", ["x.com"])
    p.edges.flush()                                          # due now: three more in this queue
    p.close()
    p = Parts(tmp_path / "b", mode="all")
    assert p.beast.readmit(100) == [b"r2", b"r3", b"r4"]
    p.check()
    p.close()


def test_a_crash_forgets_a_due_domain_which_passes_in_its_own_queue(tmp_path):
    """The state a kill -9 leaves (the last commit, copied aside while the store is open): a domain
    due now is forgotten as such, so it passes in the queue it is listed in, not at once; every
    deferred URL comes back and the tables agree."""
    import shutil
    p = Parts(tmp_path / "b", mode="all")
    p.offer("x.com", [f"r{i}".encode() for i in range(20)])
    p.edges.add("a.org", ["x.com"])
    p.edges.flush()
    p.store.commit()
    assert p.beast.domain("x.com")["queue"] == 0
    shutil.copytree(tmp_path / "b", tmp_path / "crashed")    # what a kill -9 here leaves
    p.close()
    c = Parts(tmp_path / "crashed", mode="all")
    c.check()
    assert c.beast.domain("x.com")["queue"] == 1 and c.beast.readmit(100) == []
    assert c.beast.readmit(5, advance=True) == [f"r{i}".encode() for i in range(2, 7)]   # budget 5, in queue 1
    assert c.beast.reader == 1
    assert sorted(drain(c.beast)) == sorted(f"r{i}".encode() for i in range(7, 20))
    c.check()
    c.close()


def test_on_probation_a_domain_nobody_vouches_for_waits_for_the_next_queue(tmp_path):
    p = Parts(tmp_path / "b", probation=True)
    b = p.beast
    p.graph.add_root("seed.org")
    assert p.offer("seed.org", [b"s0", b"s1"]) == [b"s0", b"s1"]     # a trust root: not on probation
    assert p.offer("spam.net", [b"f0", b"f1", b"f2"]) == []            # in-degree 0: nothing passes now
    assert b.domain("spam.net")["on_probation"] and b.domain("spam.net")["queue"] == 1
    assert b.readmit(100) == []                                        # not in the reader's queue
    assert b.readmit(2, advance=True) == [b"f0", b"f1"]                # the next queue: its base budget
    assert b.reader == 1 and b.domain("spam.net")["queue"] == 4      # still on probation: the next window
    assert b.stats()["probation"] == 1
    p.check()
    p.close()


def test_on_probation_a_vouch_lets_the_domain_pass_at_once(tmp_path):
    p = Parts(tmp_path / "b", probation=True)
    b = p.beast
    p.graph.add_root("seed.org")
    assert p.offer("x.com", [f"r{i}".encode() for i in range(10)]) == []
    p.edges.add("seed.org", ["x.com"])
    p.edges.flush()                                   # in-degree 1: budget 2 + 3 in the reader's queue
    assert not b.domain("x.com")["on_probation"]
    assert b.readmit(100) == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    assert p.offer("x.com", [b"late"]) == []          # behind its own backlog, as any domain
    p.check()
    p.close()


def test_on_probation_a_domain_nobody_vouches_for_passes_once_per_window(tmp_path):
    p = Parts(tmp_path / "b", queues=4, max_spread=64, probation=True)
    b = p.beast
    p.graph.add_root("seed.org")
    p.edges.add("seed.org", ["good.com"])
    p.edges.flush()
    p.offer("good.com", [f"g{i}".encode() for i in range(2000)])
    p.offer("spam.net", [f"s{i}".encode() for i in range(2000)])
    planned = {"good.com": [], "spam.net": []}     # the queues each domain is listed in, in order
    for _ in range(1000):                     # windows of 4, 8, 16, 32 queues
        if b.reader >= 60:
            break
        for d, qs in planned.items():
            q = b.domain(d)["queue"]
            if not qs or qs[-1] != q:
                qs.append(q)
        b.readmit(1, advance=True)
    assert planned["spam.net"] == [1, 4, 12, 28, 60]    # the queue after it was found, then once per window
    assert len(planned["good.com"]) > 3 * len(planned["spam.net"])
    p.check()
    p.close()


def test_probation_keeps_a_farm_of_fresh_domains_out_while_the_reader_stands(tmp_path):
    """Fresh domains found while honest work is ready: without probation each passes its base budget
    in the reader's queue at once; with it none passes until the reader moves on, and then each
    passes its base budget (delayed, never dropped)."""
    farm = [f"spam{i}.net" for i in range(200)]
    passed = {}
    for probation in (False, True):
        p = Parts(tmp_path / str(probation), probation=probation)
        passed[probation] = sum(len(p.offer(f, [f"{f}/{k}".encode() for k in range(50)])) for f in farm)
        if probation:
            assert len(p.beast.readmit(2 * len(farm), advance=True)) == 2 * len(farm)
            assert p.beast.reader == 1
            assert p.beast.waiting == 48 * len(farm)
        p.check()
        p.close()
    assert passed == {False: 2 * len(farm), True: 0}


def test_a_refund_lets_the_domain_pass_another_url_in_this_queue(parts):
    b = parts.beast
    parts.offer("x.com", [b"a", b"b", b"c", b"d"])
    assert b.refund("x.com") == 1
    assert b.readmit(100) == [b"c"]
    b.readmit(100, advance=True)
    assert b.refund("other.com") == 0
    parts.check()


def test_explain_finds_a_waiting_url_and_its_queue(parts):
    b = parts.beast
    for i in range(10):
        b.offer("x.com", f"r{i}".encode(), fp=1000 + i)
    info = b.explain("x.com", 1007)
    assert info["waiting"] and info["position"] == 5 and info["expected_queue"] == 1 + 5 // 2
    assert not b.explain("x.com", 1000)["waiting"]       # passed at once
    assert info["budget"] == 2 and info["spent"] == 2 and info["deferred"] == 8


def test_stats_list_top_domains_with_budget_spent_deferred_and_queue(parts):
    for i in range(10):
        parts.edges.add(f"s{i}.org", ["big.com"])
    parts.edges.flush()
    parts.offer("big.com", [b"u"] * 40)
    parts.offer("spam.com", [b"u"] * 12)
    s = parts.beast.stats(top=5)
    tops = {t["domain"]: t for t in s["top_domains"]}
    assert tops["big.com"]["indegree"] == 10 and tops["big.com"]["budget"] == 32
    assert tops["big.com"]["spent"] == 32 and tops["big.com"]["deferred"] == 8
    assert tops["spam.com"]["deferred"] == 10 and tops["spam.com"]["queue"] == 1
    assert s["reader_queue"] == 0 and s["deferred_now"] == 18
    assert s["admitted"] == 32 + 2 and s["deferred"] == 18


def test_ram_is_bounded_by_the_lrus_and_write_back_is_exact(tmp_path):
    p = Parts(tmp_path / "b", mode="all", cache=8)
    rng = random.Random(3)
    want = collections.Counter()
    for _ in range(3000):
        d = f"d{rng.randrange(400)}.com"
        if p.beast.offer(d, d.encode()):
            want[d] += 1
        assert p.beast.cached <= 8 and p.graph.cached <= 8
    for i in range(400):
        p.edges.add(f"s{i % 7}.org", [f"d{i}.com"])
    p.edges.flush()
    p.close()
    p = Parts(tmp_path / "b", mode="all", cache=8)
    for i in range(400):
        d = f"d{i}.com"
        assert p.beast.domain(d)["admitted"] == want[d]
        assert p.graph.indegree(d) == 1
    p.check()
    p.close()


# -- crash safety ----------------------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {tests!r})
    from frontier.budget_parts import Parts
    p = Parts({path!r})
    for d in range(10):
        p.offer(f"d{{d}}.com", [f"d{{d}}/{{i}}".encode() for i in range(30)])
    p.store.commit()
    with open({queued!r}, "ab") as q:
        for commit in (True, False):
            got = p.beast.readmit(6, advance=True)
            q.write(b"".join(r + b"\\n" for r in got))
            q.flush()
            os.fsync(q.fileno())
            if commit:
                p.store.commit()
    for d in range(5):
        p.edges.add(f"late{{d}}.org", ["d9.com"])        # returned: in the DRUM journal
    p.graph.add_root("late0.org")
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
    offered = {f"d{d}/{i}".encode() for d in range(10) for i in range(30)}
    admitted = {f"d{d}/{i}".encode() for d in range(10) for i in range(2)}
    with open(queued, "rb") as f:
        queued_recs = f.read().split(b"\n")[:-1]
    assert len(queued_recs) == 12
    p = Parts(path)
    p.check()
    rest = drain(p.beast)
    assert admitted | set(queued_recs) | set(rest) == offered
    assert len(rest) == len(offered - admitted) - 6          # the 6 committed ones are gone, the rest came back
    assert len(set(queued_recs) & set(rest)) == 6            # the 6 uncommitted ones come twice
    p.graph.add_root("late0.org")
    p.edges.flush()
    assert p.graph.indegree("d9.com") == 1                   # the root's link counts; the others cannot vouch
    p.close()


CHILD_WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from frontier.budget_parts import Landing, Parts
    landing = Landing()
    p = Parts({path!r}, landing=landing)
    for d in range(10):
        p.offer(f"d{{d}}.com", [f"d{{d}}/{{i}}".encode() for i in range(30)])
    p.store.commit()
    landing.land(p.store)                   # landed: what a then would acknowledge
    landing.writer.hold()                   # the next commit is handed over and never written
    got = p.beast.readmit(6, advance=True)
    p.store.commit()
    print("ready", len(got), flush=True)
    sys.stdin.read()
""")


def test_kill_9_with_a_writer_keeps_what_landed_and_returns_what_did_not(tmp_path):
    """A commit handed to the writer is promised once it landed: kill -9 keeps every deferral that
    landed, and readmissions whose commit had not landed are handed out again (twice, never lost)."""
    path = str(tmp_path / "b")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child = subprocess.Popen([sys.executable, "-c", CHILD_WRITER.format(tests=tests, path=path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        line = child.stdout.readline()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert line == b"ready 6\n"
    p = Parts(path)
    p.check()
    rest = drain(p.beast)
    offered = {f"d{d}/{i}".encode() for d in range(10) for i in range(30)}
    admitted = {f"d{d}/{i}".encode() for d in range(10) for i in range(2)}
    assert len(rest) == len(offered - admitted) and set(rest) == offered - admitted
    p.close()


# -- against a plain model --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("writer", [False, True])
def test_matches_a_plain_model_through_reopens(tmp_path, seed, writer):
    """With ``writer`` the store commits on a writer thread whose commits land at random moments:
    the loop reads its own writes through the overlay until they do, and begins no write transaction."""
    rng = random.Random(seed)
    path = tmp_path / "b"
    landing = Landing() if writer else None
    lands = random.Random(seed)             # when commits land: the same operations with or without

    def reopen():
        return Parts(path, mode="all", cache=5, queues=3, max_spread=1, landing=landing)

    p = reopen()      # max_spread 1: a pass every queue
    writers: set[int] = set()
    doms = [f"d{i}.com" for i in range(12)]
    inlinks = collections.defaultdict(set)
    spent = collections.Counter()
    deferred = collections.defaultdict(collections.deque)
    pending = []
    serial = 0

    def budget(d):
        return min(50, 2 + 3 * len(inlinks[d]))

    for step in range(600):
        op = rng.random()
        if op < 0.5:
            d = rng.choice(doms)
            serial += 1
            rec = f"{d}#{serial}".encode()
            ok = not deferred[d] and spent[d] < budget(d)
            assert p.beast.offer(d, rec) == ok, (step, d)
            if ok:
                spent[d] += 1
            else:
                deferred[d].append(rec)
        elif op < 0.65:
            src = f"s{rng.randrange(20)}.org"
            tgts = rng.sample(doms, 3)
            p.edges.add(src, tgts)
            pending.extend((src, t) for t in tgts)
        elif op < 0.7:
            p.edges.flush()                        # edges count once the DRUM has answered them
            for src, t in pending:
                inlinks[t].add(src)
            pending.clear()
        elif op < 0.85:
            advance = rng.random() < 0.5
            got = p.beast.readmit(10_000, advance=advance)
            if advance and any(deferred.values()):
                spent.clear()                      # the reader moved to the next queue
            want = []
            for d in doms:
                n = min(budget(d) - spent[d], len(deferred[d]))
                if n > 0:
                    spent[d] += n
                    want.extend(deferred[d].popleft() for _ in range(n))
            assert sorted(got) == sorted(want), step
            p.store.commit()
            if landing is not None and lands.random() < 0.3:
                landing.land(p.store)              # else the commits pile up in the overlay
        elif op < 0.9:
            if landing is not None:
                writers |= p.env.write_threads
            p.close()
            p = reopen()
        else:
            p.check()
    p.edges.flush()
    for src, t in pending:
        inlinks[t].add(src)
    p.check()
    for d in doms:
        assert p.beast.domain(d)["deferred"] == len(deferred[d])
        assert p.graph.indegree(d) == len(inlinks[d])
    if landing is not None:
        p.close()
        writers |= p.env.write_threads
        landing.close()
        assert writers and threading.get_ident() not in writers     # only the writer thread wrote
        return
    p.close()


# -- the host-turn read cache -----------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
def test_with_a_read_cache_on_a_writer_beast_hands_out_exactly_what_a_plain_one_does(tmp_path, seed):
    """The same offers over many hosts of a few domains on a plain store and on one whose commits land
    on a writer at random moments, reading host turns through a read cache of a few hundred bytes
    (it evicts): the same decisions, the same readmissions in the same order (host turns decide it),
    through reopens; the cache stays within its bytes and answers reads."""
    rng = random.Random(seed)
    landing = Landing()
    lands = random.Random(seed + 100)

    def both():
        return (Parts(tmp_path / "plain", queues=3, max_spread=4),
                Parts(tmp_path / "cached", queues=3, max_spread=4, landing=landing, read_cache_bytes=700))

    plain, cached = both()
    doms = [f"d{i}.com" for i in range(4)]
    hits = evictions = 0
    for step in range(1500):
        op = rng.random()
        if op < 0.6:
            d = rng.choice(doms)
            host = f"h{rng.randrange(6)}.{d}"
            rec = f"{host}/{step}".encode()
            assert plain.beast.offer(d, rec, step, host) == cached.beast.offer(d, rec, step, host), step
        elif op < 0.8:
            advance = rng.random() < 0.5
            assert plain.beast.readmit(7, advance=advance) == cached.beast.readmit(7, advance=advance), step
            plain.store.commit()
            cached.store.commit()
        elif op < 0.95:
            plain.store.commit()
            cached.store.commit()
            if lands.random() < 0.5:
                landing.land(cached.store)
        else:
            mem = cached.store.overlay.cache_memory()
            assert mem["bytes"] <= mem["cap_bytes"] == 700
            hits += cached.store.overlay.cache_hits
            evictions += mem["evictions"]
            plain.close()
            cached.close()
            plain, cached = both()
    mem = cached.store.overlay.cache_memory()
    assert mem["bytes"] <= mem["cap_bytes"] == 700
    hits += cached.store.overlay.cache_hits
    assert hits > 0 and evictions + mem["evictions"] > 0
    assert drain(plain.beast) == drain(cached.beast)
    plain.check()
    cached.check()
    plain.close()
    cached.close()
    plain, cached = both()                  # reopened: the same state on disk
    assert drain(plain.beast) == drain(cached.beast) == []
    plain.close()
    cached.close()
    landing.close()


# -- offer_many: the batched intake path ----------------------------------------------------------

def _tables(p: Parts) -> dict:
    """Every table of a committed budget store, as it is on disk."""
    p.store.commit()
    st = p.store
    with st.env.begin() as txn:
        return {name: list(txn.cursor(db=db)) for name, db in
                (("graph", st.graph), ("votes", st.votes), ("domains", st.domains), ("deferred", st.deferred),
                 ("queues", st.queues), ("turns", st.turns), ("meta", st.meta))}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("probation", [False, True])
def test_offer_many_decides_and_writes_exactly_what_one_offer_per_url_does(tmp_path, seed, probation):
    """Pages' links (runs of a domain's hosts, several domains, a domain again later in the batch)
    offered as one batch per page group and one ``offer`` each, on two stores fed the same stream
    of edges, readmissions and commits: the same verdicts, the same readmissions in the same order,
    and byte for byte the same tables (FIFO keys carry the host turn and the arrival sequence)."""
    rng = random.Random(seed)
    one = Parts(tmp_path / "one", cache=6, queues=3, max_spread=4, probation=probation)
    many = Parts(tmp_path / "many", cache=6, queues=3, max_spread=4, probation=probation)
    doms = [f"d{i}.com" for i in range(8)]
    serial = 0
    for step in range(300):
        op = rng.random()
        if op < 0.55:
            batch: list[tuple[str, str, bytes, int]] = []       # (pld, host key, record, fp)
            for _ in range(rng.randrange(1, 5)):                # a few pages
                d = rng.choice(doms)
                hosts = [f"http://{h}.{d}" for h in rng.sample(["a", "b", "c", "www"], rng.randrange(1, 4))]
                for _ in range(rng.randrange(1, 12)):
                    serial += 1
                    batch.append((d, rng.choice(hosts), f"{d}#{serial}".encode(), serial))
            want = [one.beast.offer(d, rec, fp, hk) for d, hk, rec, fp in batch]
            got = many.beast.offer_many([domain_key(d) for d, _, _, _ in batch], [b[2] for b in batch],
                                        [b[3] for b in batch], [b[1] for b in batch])
            assert got == want, step
        elif op < 0.7:
            src, tgts = f"s{rng.randrange(6)}.org", rng.sample(doms, 2)
            for p in (one, many):
                p.edges.add(src, tgts)
        elif op < 0.75:
            for p in (one, many):
                p.edges.flush()
        elif op < 0.9:
            advance = rng.random() < 0.5
            assert one.beast.readmit(7, advance=advance) == many.beast.readmit(7, advance=advance), step
        else:
            for p in (one, many):
                p.store.commit()
    assert _tables(one) == _tables(many)
    assert one.beast.stats() == many.beast.stats()
    for p in (one, many):
        p.check()
        p.close()


# -- charges written late: a domain that deferred nothing ---------------------------------------------

def _committed_records(p):
    with p.store.env.begin() as txn:
        return {bytes(k): bytes(v) for k, v in txn.cursor(db=p.store.domains)}


def test_a_charge_of_a_domain_that_deferred_nothing_is_written_commits_later_and_at_close(tmp_path):
    """A domain that passes URLs and defers none is written ``SOFT_COMMITS`` commits after its first
    such charge (charges in between ride along), not at each commit; its charges hold in RAM
    meanwhile; a deferral is written at the next commit; close writes everything."""
    from crawlerd.frontier.budgets import store as store_mod
    n = store_mod.SOFT_COMMITS
    p = Parts(tmp_path / "b", mode="all")
    assert p.beast.offer("a.com", b"a0", host="http://a.com")
    p.store.commit()
    assert b"a.com" not in _committed_records(p)
    assert p.beast.offer("a.com", b"a1", host="http://a.com")          # its second charge, in RAM
    assert not p.beast.offer("a.com", b"a2", host="http://a.com")      # over budget: deferred
    assert p.beast.offer("b.com", b"b0", host="http://b.com")
    p.store.commit()
    recs = _committed_records(p)
    assert b"a.com" in recs and b"b.com" not in recs                   # the deferral's record at once
    for _ in range(n - 2):
        p.store.commit()
    assert b"b.com" not in _committed_records(p)
    p.store.commit()
    assert b"b.com" in _committed_records(p)                           # SOFT_COMMITS commits after its charge
    assert p.beast.offer("c.com", b"c0", host="http://c.com")
    assert p.beast.domain("c.com")["spent"] == 1
    p.close()
    p = Parts(tmp_path / "b", mode="all")
    assert p.beast.domain("c.com")["spent"] == 1 and p.beast.domain("b.com")["spent"] == 1
    assert p.beast.offer("c.com", b"c1", host="http://c.com")
    assert not p.beast.offer("c.com", b"c2", host="http://c.com")      # its budget of 2, across the close
    p.check()
    p.close()


def test_a_crash_may_forget_late_charges_never_a_deferred_url(tmp_path):
    """The state a kill -9 leaves (the last commit, copied aside while the store is open): charges
    not written yet are forgotten, so a domain may pass up to one budget more in the reader's
    queue, but every deferred URL comes back and the tables agree."""
    import shutil
    p = Parts(tmp_path / "b", mode="all")
    passed, kept = [], []
    for d in range(6):
        for i in range(5):
            rec = f"d{d}/{i}".encode()
            (passed if p.beast.offer(f"d{d}.com", rec, host=f"http://d{d}.com") else kept).append(rec)
        p.beast.offer(f"e{d}.com", b"e", host=f"http://e{d}.com")        # passes, deferred nothing
        p.store.commit()
    shutil.copytree(tmp_path / "b", tmp_path / "crashed")             # what a kill -9 here leaves
    p.close()
    c = Parts(tmp_path / "crashed", mode="all")
    c.check()
    assert all(c.beast.domain(f"e{d}.com")["spent"] == 0 for d in range(6))  # forgotten: at most a budget
    assert sorted(drain(c.beast)) == sorted(kept)                    # nothing deferred is lost
    c.check()
    c.close()
