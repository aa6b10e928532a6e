"""BEAST (crawlerd.frontier.budgets.beast): the FIFO and its host turns, explain and stats, bounded RAM,
the batched offer path and late charges. The reader, probation and crash safety have files of their own
(test_beast_reader.py, test_beast_probation.py, test_beast_durability.py)."""

import collections
import os
import random
import shutil

import lmdb
import pytest

from crawlerd.frontier.budgets import domain_key
from tests.frontier.budget_parts import Parts, drain, to_format_4

# -- the FIFO: hosts in turn -----------------------------------------------------------------------

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
    to_format_4(os.path.join(str(tmp_path / "b"), "state"))      # the domain records in their own table
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


# -- reading, RAM ----------------------------------------------------------------------------------

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


# -- offer_many: the batched intake path -----------------------------------------------------------

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


# -- charges written late: a domain that deferred nothing ------------------------------------------

def _committed_records(p):
    with p.store.env.begin() as txn:        # the domain records: the deferred table's keys without a NUL
        return {bytes(k[:-1]): bytes(v) for k, v in txn.cursor(db=p.store.deferred) if b"\0" not in k}


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
