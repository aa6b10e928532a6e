"""The DUST store's host table (crawlerd.frontier.dust_store): a host's write sequence kept in its
record and moved only when it fell more than ``touch_slack`` behind, records written before that
(the sequence in ``meta``) read and moved over, the host keys' filter in front of the reads, and
the meta record."""

import gc
import random

import orjson
import pytest

from crawlerd.frontier.dust import DustLearner
from crawlerd.frontier.dust_store import DustStore
from tests.frontier.dust_site import Site
from tests.frontier.test_dust_store import check_host_tables

_U64 = 8


def stored_seq(store, host: str) -> int:
    raw = store.txn().get(host.encode(), db=store._hosts)
    return int.from_bytes(raw[:_U64], "big")


def lru(store) -> dict:
    return dict(store.txn().cursor(db=store._lru))


def test_a_host_written_again_within_the_slack_keeps_its_place_and_one_behind_it_moves(tmp_path):
    """Writes within ``touch_slack`` sequence numbers leave the LRU table alone (the 3 writes a
    host write used to make there and in meta); past it the host moves to the newest end."""
    store = DustStore(str(tmp_path / "d"), max_bytes=16 << 20, max_host_bytes=4096, sync=False)
    assert store.touch_slack == (8 << 20) // 512 // 8
    store.put_host("a.example", {"n": 0})
    before, seq = lru(store), stored_seq(store, "a.example")
    for i in range(1, 4):
        store.put_host("a.example", {"n": i})
        assert lru(store) == before and stored_seq(store, "a.example") == seq
    assert store.get_host("a.example") == {"n": 3}
    for i in range(store.touch_slack):                     # others written meanwhile
        store.put_host(f"h{i}.example", {"n": i})
    store.put_host("a.example", {"n": 4})
    assert stored_seq(store, "a.example") == store.meta["seq"] > seq
    assert list(lru(store).values())[-1] == b"a.example"
    check_host_tables(store)
    store.close()


def test_with_the_slack_the_eviction_order_is_the_write_order_within_it_and_the_bound_exact(tmp_path):
    """Random writes over a pool of hosts past the store's host bound: after every write the
    tables agree, the byte count is within the bound, and every host's stored sequence is within
    ``touch_slack`` of the newest sequence when it was last written; the hosts evicted were the
    oldest by stored sequence."""
    rng = random.Random(7)
    store = DustStore(str(tmp_path / "d"), max_bytes=1 << 20, max_host_bytes=4096, sync=False)
    slack = store.touch_slack
    assert slack > 1
    at_write: dict[str, int] = {}           # host -> the newest sequence when it was last written
    stored: dict[str, int] = {}             # host -> the sequence its record keeps
    evicted = 0
    for step in range(6000):
        h = int(rng.paretovariate(1.1)) if rng.random() < 0.5 else rng.randrange(5000)
        host = f"h{h % 5000}.example"
        gone = store.put_host(host, {"p": "x" * rng.randrange(100, 600)})
        at_write[host] = store.meta["seq"]
        if gone:
            evicted += len(gone)
            kept = [stored[h] for h in stored if h not in gone and h != host]
            assert max(stored[g] for g in gone) < min(kept)     # the oldest by stored sequence
            for g in gone:
                del stored[g], at_write[g]
        stored[host] = stored_seq(store, host)
        assert store.meta["host_bytes"] <= store.max_hosts_bytes
        assert 0 <= at_write[host] - stored[host] <= slack
        if step % 500 == 499:
            check_host_tables(store)
            assert stored == {h: stored_seq(store, h) for h in stored}
            store.commit()
    assert evicted > 0
    for h, seq in at_write.items():
        assert 0 <= seq - stored_seq(store, h) <= slack
    store.close()


def test_records_written_before_the_sequence_was_kept_in_them_are_read_moved_and_deleted(tmp_path):
    """A store written by the earlier format (JSON value, its sequence in ``meta["seq:" + host]``):
    reopened, its records read as before, a write moves the sequence into the record (the meta key
    goes), a delete takes every trace of a record of either format, the tables exact throughout."""
    path = str(tmp_path / "d")
    store = DustStore(path, max_bytes=1 << 20, max_host_bytes=4096, sync=False)
    txn = store.txn()
    for i in range(3):
        hk, rec = f"old{i}.example".encode(), orjson.dumps({"old": i})
        store.meta["seq"] += 1
        seq = store.meta["seq"].to_bytes(8, "big")
        txn.put(hk, rec, db=store._hosts)
        txn.put(seq, hk, db=store._lru)
        txn.put(b"seq:" + hk, seq, db=store._meta)
        store.meta["host_bytes"] += len(rec)
    store.put_host("new.example", {"new": 1})
    store.close()

    store = DustStore(path, max_bytes=1 << 20, max_host_bytes=4096, sync=False)
    check_host_tables(store)
    assert dict(store.hosts()) == {"old0.example": {"old": 0}, "old1.example": {"old": 1},
                                   "old2.example": {"old": 2}, "new.example": {"new": 1}}
    assert store.get_host_sized("old0.example", remember=True)[0] == {"old": 0}
    store.put_host("old0.example", {"old": 0, "again": True})        # held: its sequence unknown
    store.put_host("old1.example", {"old": 1, "again": True})        # not held
    for hk in (b"old0.example", b"old1.example"):
        assert store.txn().get(b"seq:" + hk, db=store._meta) is None
    check_host_tables(store)
    store.delete_host("old2.example")
    store.delete_host("new.example")
    assert store.txn().get(b"seq:old2.example", db=store._meta) is None
    check_host_tables(store)
    assert sorted(h for h, _ in store.hosts()) == ["old0.example", "old1.example"]
    store.close()
    store = DustStore(path, max_bytes=1 << 20, max_host_bytes=4096, sync=False)
    assert store.get_host("old0.example") == {"old": 0, "again": True}
    check_host_tables(store)
    store.close()


def test_the_host_filter_skips_reads_of_hosts_never_written_and_knows_the_stored_ones_after_a_reopen(tmp_path):
    path = str(tmp_path / "d")
    store = DustStore(path, max_bytes=1 << 20, max_host_bytes=4096, sync=False)
    assert store.get_host("never.example") is None and store.host_reads_skipped == 1
    store.put_host("a.example", {"a": 1})
    assert store.get_host("a.example") == {"a": 1}
    store.delete_host("a.example")
    assert store.get_host("a.example") is None            # still in the filter: read, not found
    store.put_host("b.example", {"b": 1})
    store.close()
    store = DustStore(path, max_bytes=1 << 20, max_host_bytes=4096, sync=False)
    assert store.get_host("b.example") == {"b": 1}        # the filter is filled at open
    skipped = store.host_reads_skipped
    assert sum(store.get_host(f"x{i}.example") is None for i in range(1000)) == 1000
    assert store.host_reads_skipped - skipped > 990       # a false positive only reads
    store.close()


@pytest.mark.parametrize("max_bytes", [96 << 10, 1 << 20])
def test_learner_host_records_stay_exact_through_evictions_a_crash_and_a_reopen(tmp_path, max_bytes):
    """The learner over many hosts round robin, a small host cache and a store bound that evicts
    records, with a small slack (96 KiB: 12) and a larger one (1 MiB: 128): the tables and byte
    count exact after commits, a kill -9 (the open transaction lost) and a reopen, and every stored
    record one the learner wrote."""
    path = str(tmp_path / "d")
    kw = dict(window=24, cache_hosts=2048, cache_bytes=96 << 10, max_bytes=max_bytes)
    hosts = 150 if max_bytes < (1 << 20) else 1500
    s = Site(path, lambda u: u, **kw)
    assert s.learner.store.touch_slack == max_bytes // 2 // 512 // 8
    for k in range(8):
        for i in range(hosts):
            s.fetch(f"http://h{i}.example/p/{k}-{'x' * 30}.html")
            if i % 50 == 49:
                s.learner.commit()
                check_host_tables(s.learner.store)
        if k == 4:
            s.learner = None                    # kill -9: the open transaction is lost
            gc.collect()
            s.learner = DustLearner(path, confirmations=3, sync=False, **kw)
            check_host_tables(s.learner.store)
    s.learner.commit()
    store = s.learner.store
    check_host_tables(store)
    assert store.meta["evicted_hosts"] > 0 and store.meta["host_bytes"] <= store.max_hosts_bytes
    for host, rec in store.hosts():
        assert rec["e"] and all(e[0].startswith(f"{host}/p/") for e in rec["e"])
    s.reopen()
    check_host_tables(s.learner.store)
    s.learner.close()


def test_the_read_cache_changes_no_decision_and_no_table_through_evictions_a_crash_and_a_reopen(tmp_path, monkeypatch):
    """The same stream of pages, admissions, skips and commits on a learner without the read cache
    and on one with a small one (its entries evicted too), host states dropped from a 16-entry
    decoded cache and loaded again, host records evicted by the store's bound, both killed (-9)
    and reopened midway: the same changes and decisions at every step, and the same tables."""
    import types

    from crawlerd.frontier import dust_evidence
    from crawlerd.frontier.dust import SKIP
    from tests.frontier.dust_site import tracking_content
    from tests.frontier.test_dust_store import dump_store

    # one time for both learners (evidence carries it into the host records, and so their sizes)
    monkeypatch.setattr(dust_evidence, "time", types.SimpleNamespace(time=lambda: 1.7e9))
    changed = set()

    def content(url):
        return url if url in changed else tracking_content(url)

    kw = dict(confirmations=2, sample_share=0.05, window=8, max_bytes=128 << 10, max_host_bytes=4 << 10,
              cache_hosts=16, cache_bytes=48 << 10, clock=lambda: 1.7e9)
    sites = [Site(str(tmp_path / "plain"), content, read_cache_bytes=0, **kw),
             Site(str(tmp_path / "cached"), content, read_cache_bytes=8 << 10, **kw)]
    assert sites[0].learner.store._reads is None and sites[1].learner.store._reads is not None
    rng = random.Random(11)
    hosts = [f"http://h{i}.example" for i in range(300)]
    for step in range(4000):
        op = rng.random()
        h = rng.choice(hosts[:20] if rng.random() < 0.6 else hosts)
        page = f"{h}/p/{rng.randrange(30)}.html"
        if op < 0.55:
            url = page if rng.random() < 0.5 else f"{page}?utm_source=s{step}"
            if rng.random() < 0.01:
                changed.add(url)                    # the site answers differently: a rule retired
            got = [s.fetch(url) for s in sites]
            assert got[0] == got[1], step
        elif op < 0.85:
            url = f"{page}?utm_source=a{step}"
            d = [s.admit(url) for s in sites]
            assert d[0] == d[1], step
            if d[0].action == SKIP:
                for s in sites:
                    s.learner.skipped(h, d[0], f"rec-{step}".encode())
        elif op < 0.99:
            for s in sites:
                s.learner.commit()
                check_host_tables(s.learner.store)
        if step == 2500:                            # kill -9 both: their open transactions are lost
            for s in sites:
                s.learner = None                    # freed now (an LMDB object left to the cyclic
                gc.collect()                        # collector could be freed inside another's call)
                s.learner = DustLearner(s.path, **s.kw)
    assert sites[1].learner.store._reads.evictions > 0
    assert sites[0].learner.store.meta["evicted_hosts"] > 0
    assert sites[0].learner.stats() == sites[1].learner.stats()
    assert sites[0].learner.stats()["rules_learned_total"] > 0 and sites[0].learner.stats()["skipped_total"] > 0
    for s in sites:
        s.learner.commit()
    # the same tables; the order in which one commit writes its changed hosts (their write
    # sequences) follows a set's iteration, which may differ between the two learners after the kill
    a, b = dump_store(sites[0].learner.store), dump_store(sites[1].learner.store)
    for t in (a, b):
        t["hosts"] = {k: v[8:] for k, v in t["hosts"].items()}
        t["lru"] = sorted(t["lru"].values())
    assert a == b
    for s in sites:
        s.reopen()
        check_host_tables(s.learner.store)
        s.learner.close()


def test_a_host_rewritten_deleted_and_written_again_is_found_at_every_step_and_after_a_reopen(tmp_path):
    """A rewrite of a host that has a record sets no filter bits again (they are set and never
    cleared); a host whose record was deleted and one never written get theirs at their write."""
    path = str(tmp_path / "d")
    store = DustStore(path, max_bytes=1 << 20, max_host_bytes=4096, sync=False)
    hosts = [f"h{i}.example" for i in range(50)]
    for i, h in enumerate(hosts):
        store.put_host(h, {"v": 0})
        if i % 2:
            assert store.get_host_sized(h, remember=True)[0] == {"v": 0}    # held: rewritten without a read
        store.put_host(h, {"v": 1})
    for h in hosts[::3]:
        store.delete_host(h)
        assert store.get_host(h) is None
        store.put_host(h, {"v": 2})
    store.commit()
    want = {h: {"v": 2 if i % 3 == 0 else 1} for i, h in enumerate(hosts)}
    assert {h: store.get_host(h) for h in hosts} == want
    check_host_tables(store)
    store.close()
    store = DustStore(path, max_bytes=1 << 20, max_host_bytes=4096, sync=False)
    assert {h: store.get_host(h) for h in hosts} == want
    assert store.get_host("never.example") is None
    store.close()


def test_the_meta_record_keeps_any_text_and_large_counters_through_a_reopen(tmp_path):
    """Meta is written at each commit (compact JSON, orjson first): what orjson refuses (a lone
    surrogate, an integer past 64 bits) is written all the same."""
    path = str(tmp_path / "d")
    store = DustStore(path, max_bytes=1 << 20, max_host_bytes=4096, sync=False)
    store.meta["priors"] = {"?sid": [3, 0, 1], "?café": [2, 1, 0]}
    store.commit()
    store.close()
    store = DustStore(path, max_bytes=1 << 20, max_host_bytes=4096, sync=False)
    assert store.meta["priors"] == {"?sid": [3, 0, 1], "?café": [2, 1, 0]}
    store.meta["priors"]["?x\udcff"] = [1, 2 ** 70, 0]
    store.commit()
    store.close()
    store = DustStore(path, max_bytes=1 << 20, max_host_bytes=4096, sync=False)
    assert store.meta["priors"] == {"?sid": [3, 0, 1], "?café": [2, 1, 0], "?x\udcff": [1, 2 ** 70, 0]}
    store.close()


def test_a_host_record_orjson_refuses_is_read_back_as_written_and_after_a_reopen(tmp_path):
    """A record holding a lone surrogate (a URL that was not valid UTF-8, kept by surrogateescape)
    or an integer past 64 bits is written with ``json``; it reads back the same, cached or not."""
    path = str(tmp_path / "d")
    odd = {"urls": ["/a\udcff", "/b"], "n": 2 ** 70}
    store = DustStore(path, max_bytes=1 << 20, max_host_bytes=4096, sync=False)
    store.put_host("odd.example", odd)
    store.put_host("plain.example", {"urls": ["/c"]})
    assert store.get_host("odd.example") == odd
    store.commit()
    assert dict(store.hosts()) == {"odd.example": odd, "plain.example": {"urls": ["/c"]}}
    store.close()
    store = DustStore(path, max_bytes=1 << 20, max_host_bytes=4096, sync=False)
    assert store.get_host("odd.example") == odd
    store.close()
