"""The DUST learner's store (crawlerd.frontier.dust_store): rules, evidence and the archived set
across reopens, host records and caches within their bytes, commits within the reserved buffers,
and the store on the LMDB writer thread (the same answers; a kill -9 keeps what landed)."""

import random
import textwrap

import pytest

from crawlerd.frontier.dust import DEFER, NORMAL, SAMPLE, SKIP, DustLearner
from crawlerd.frontier.dust_evidence import TRUSTED
from crawlerd.url.canonical import fingerprint
from crawlerd.url.hosts import host_key as host_key_of
from tests.frontier.dust_site import H, Site, tracking_content
from tests.kill9 import first_line_then_kill_9

# -- persistence and bounds -------------------------------------------------------------------------

def test_rules_evidence_and_archived_set_survive_reopen(tmp_path):
    s = Site(str(tmp_path / "d"), tracking_content, confirmations=2)
    for k in range(3):
        s.fetch(f"{H}/p/{k}.html")
        s.fetch(f"{H}/p/{k}.html?utm_source=x{k}")
    s.fetch(f"{H}/q/0.html")
    L = s.reopen()
    assert L.stats()["rules_trusted"] == 1
    assert s.admit(f"{H}/q/0.html?utm_source=after").action in (SKIP, SAMPLE)
    assert len(L.hosts.state(H).evidence) == 7
    s.learner.close()


def test_host_records_stay_within_their_bytes(tmp_path):
    s = Site(str(tmp_path / "d"), lambda u: u, max_host_bytes=4096, max_bytes=64 << 10, window=200,
             cache_hosts=16)
    for k in range(300):
        s.fetch(f"{H}/p/{k}-{'x' * 40}.html")
    for i in range(400):                       # many hosts: the oldest records are evicted
        s.fetch(f"http://h{i}.example/p/0.html")
    s.learner.commit()
    store = s.learner.store
    assert store.get_host(H) is None or store.encoded_size(store.get_host(H)) <= 4096
    assert store.meta["host_bytes"] <= store.max_hosts_bytes
    assert store.meta["evicted_hosts"] > 0
    sizes = [store.encoded_size(rec) for _, rec in store.hosts()]
    # each value: its record and its 8-byte write sequence
    assert max(sizes) <= 4096 and sum(sizes) + 8 * len(sizes) == store.meta["host_bytes"]


def test_trusted_rules_reach_admission_only_for_their_host(tmp_path):
    s = Site(str(tmp_path / "d"), tracking_content, confirmations=2)
    for k in range(3):
        s.fetch(f"{H}/p/{k}.html")
        s.fetch(f"{H}/p/{k}.html?utm_source=x{k}")
    other = "http://other.example"
    s.fetch(f"{other}/p/1.html")
    assert s.admit(f"{other}/p/1.html?utm_source=x").action != SKIP
    rules = s.learner.hosts.state(H).trusted()
    assert [r.rule.text for r in rules] == ["?utm_source"] and rules[0].state == TRUSTED


def test_a_sample_is_checked_against_the_archived_set_when_its_page_left_the_window(tmp_path):
    changed = set()

    def content(url):
        return url if url in changed else tracking_content(url)
    s = Site(str(tmp_path / "d"), content, confirmations=2, sample_share=1.0, window=4)
    for k in range(3):
        s.fetch(f"{H}/p/{k}.html")
        s.fetch(f"{H}/p/{k}.html?utm_source=x{k}")
    for k in range(10):                               # /p/0.html leaves the evidence window
        s.fetch(f"{H}/other/{k}.html")
    agreeing = f"{H}/p/0.html?utm_source=ok"
    assert s.admit(agreeing).action == SAMPLE
    assert s.fetch(agreeing).retired == []
    bad = f"{H}/p/1.html?utm_source=bad"
    changed.add(bad)
    assert s.admit(bad).action == SAMPLE
    assert s.fetch(bad).retired == ["?utm_source"]
    assert s.learner.stats()["sample_mismatches_total"] == 1


def test_without_admission_probes_a_suspect_waits_and_a_probe_is_taken_from_the_deferred_level(tmp_path):
    """Under BEAST budgets an admitted URL may wait before the frontier: no probe is spent on
    it at admission; once deferred in the frontier, a new host's suspect may be taken as a probe."""
    s = Site(str(tmp_path / "d"), lambda u: u, confirmations=2, probe_share=0.0, admission_probes=False)
    s.fetch(f"{H}/a")
    s.admit(f"{H}/a")
    L = s.learner
    L.tokens = 2.0
    assert s.admit(f"{H}/a?x=1").action == DEFER and L.counters["probes"] == 0
    assert L.wants_probe(H)
    assert L.take_probe(f"{H}/a?x=1", fingerprint(f"{H}/a?x=1"), H)
    assert L.tokens == 1.0 and not L.wants_probe(H)          # a new host needs 2 to start
    assert not L.take_probe(f"{H}/b?x=1", fingerprint(f"{H}/b?x=1"), H)


def test_cached_host_states_stay_within_cache_bytes_and_lose_no_evidence(tmp_path):
    def crawl(path, cache_bytes):
        s = Site(path, lambda u: u, window=24, cache_hosts=2048, cache_bytes=cache_bytes)
        peak = 0
        for k in range(24):                     # round robin over 200 hosts, as a crawl visits them
            for i in range(200):
                s.fetch(f"http://h{i}.example/p/{k}-{'x' * 30}.html")
                if (k * 200 + i) % 100 == 99:   # the shard commits every couple of seconds
                    s.learner.commit()
                    peak = max(peak, s.learner.hosts.memory()["bytes"])
        s.learner.commit()
        kept = {i: [e.url for e in s.learner.hosts.state(f"http://h{i}.example").evidence] for i in range(200)}
        return peak, s.learner.hosts.memory(), kept

    peak, mem, kept = crawl(str(tmp_path / "small"), 64 << 10)
    assert peak <= 64 << 10 and mem["bytes"] <= mem["cap_bytes"] == 64 << 10
    assert 1 < mem["entries"] < 200                           # the bound, not the entry count, evicted
    free_peak, _, reference = crawl(str(tmp_path / "free"), 1 << 30)
    assert free_peak > 4 * (64 << 10)                         # unbounded, the same crawl holds more
    assert kept == reference                                  # evicted states were written back whole
    assert all(len(urls) == 24 for urls in kept.values())


def test_the_store_commits_early_to_stay_within_its_reserved_page_buffers(tmp_path):
    # 64 pages reserved: 400 archived fingerprints without a commit from the learner take several
    # early commits (each a state a later commit would have made durable), and none is lost
    from crawlerd.frontier.dust_store import DustStore
    s = DustStore(str(tmp_path / "d"), max_bytes=64 << 20, max_host_bytes=16 << 10, sync=False,
                  write_buffer_bytes=64 * 4096)
    start = s.env.info()["last_txnid"]
    for fp in range(1, 401):
        s.add_archived(fp * 0x9E3779B97F4A7C15 & (2**64 - 1), 1)
    assert s.env.info()["last_txnid"] - start >= 400 // 28
    s.close()
    s = DustStore(str(tmp_path / "d"), max_bytes=64 << 20, max_host_bytes=16 << 10, sync=False)
    assert all(s.archived(fp * 0x9E3779B97F4A7C15 & (2**64 - 1)) is not None for fp in range(1, 401))
    s.close()


class ArchivedModel:
    """The archived set as specified (two generations, the older dropped once half of ``max_archived``
    fingerprints new to both were added to the current one; a weaker kind never overwrites a
    stronger one): fp -> value tuple."""

    def __init__(self, half):
        self.half, self.gens, self.gen, self.count = half, [{}, {}], 0, 0
        self.turns = 0                      # turn-overs since the last copy

    def get(self, fp):
        g = self.gen
        return self.gens[g].get(fp) or self.gens[1 - g].get(fp)

    def add(self, fp, value):
        prev = self.get(fp)
        if prev is not None and prev[0] < value[0]:
            return
        self.gens[self.gen][fp] = value
        self.count += prev is None
        if self.count >= self.half:
            self.gen, self.count = 1 - self.gen, 0
            self.gens[self.gen] = {}
            self.turns += 1

    def copy(self):
        m = ArchivedModel(self.half)
        m.gens, m.gen, m.count = [dict(self.gens[0]), dict(self.gens[1])], self.gen, self.count
        return m


@pytest.mark.parametrize("filter_bytes", [0, 64, 1 << 14])
def test_archived_set_answers_as_specified_through_commits_crashes_and_reopens(tmp_path, filter_bytes):
    """Random additions and look-ups (fingerprints drawn so that many repeat, kinds that compete)
    against the model, with the Bloom filters off, tiny (nearly every look-up reads) and sized: the
    same answers; a crash (no commit) reopens to the last commit's answers; the filters stay within
    their bytes, and a sized one spares most reads of fingerprints never archived."""
    import gc

    from crawlerd.frontier.dust_store import DustStore

    def open_store():
        return DustStore(str(tmp_path / "d"), max_bytes=128 << 10, max_host_bytes=16 << 10, sync=False,
                         filter_bytes=filter_bytes)

    rng = random.Random(filter_bytes)
    s = open_store()
    model = ArchivedModel(s.max_archived // 2)
    committed = model.copy()
    assert s.max_archived == 1024
    pool = [rng.getrandbits(64) for _ in range(1500)]
    turned = 0
    skipped = 0
    for step in range(12_000):
        op = rng.random()
        fp = rng.choice(pool) if rng.random() < 0.7 else rng.getrandbits(64)
        if op < 0.45:
            v = (rng.choice((1, 2, 3)), rng.randrange(4), rng.randrange(9), rng.getrandbits(32), rng.getrandbits(64))
            s.add_archived(fp, *v)
            model.add(fp, v)
        elif op < 0.9:
            got = s.archived(fp)
            assert (None if got is None else tuple(got)) == model.get(fp), step
        elif op < 0.97:
            s.commit()
            committed = model.copy()
            turned += model.turns
            model.turns = 0
        elif op < 0.985:
            skipped += s.memory()["reads_skipped"]
            s = None                      # kill -9: the open transaction and what waits for it are lost
            gc.collect()
            s = open_store()
            model = committed.copy()
        else:
            skipped += s.memory()["reads_skipped"]
            s.close()
            s = open_store()
            committed = model.copy()
        mem = s.memory()
        assert mem["bytes"] <= mem["cap_bytes"] <= filter_bytes
    assert turned >= 3                              # committed turn-overs of the generations
    for fp in pool:
        got = s.archived(fp)
        assert (None if got is None else tuple(got)) == model.get(fp)
    skipped += s.memory()["reads_skipped"]
    if filter_bytes >= 1 << 14:
        assert skipped > 2000
    elif filter_bytes == 0:
        assert skipped == 0
    s.close()


def check_host_tables(store):
    """The host records, their write sequences and the byte count agree (what put_host keeps)."""
    txn = store.txn()
    hosts = dict(txn.cursor(db=store._hosts))
    lru = dict(txn.cursor(db=store._lru))
    legacy = {k[4:]: v for k, v in txn.cursor(db=store._meta) if k.startswith(b"seq:")}
    # a host's sequence is in its value (in meta only for a record written before that)
    seqs = {hk: legacy[hk] if v[:1] == b"{" else v[:8] for hk, v in hosts.items()}
    assert store.meta["host_bytes"] == sum(len(v) for v in hosts.values())
    assert set(legacy) <= set(hosts) and len(lru) == len(hosts)
    assert all(lru[seq] == hk for hk, seq in seqs.items())
    assert all(int.from_bytes(seq, "big") <= store.meta["seq"] for seq in seqs.values())
    if store._reads is not None:                         # the read cache holds the stored values
        assert all(v == hosts.get(hk) for hk, v in store._reads.items())
    for host, (size, seq) in store._held.items():        # what it notes of the hosts held cached
        hk = host.encode()
        assert size == len(hosts.get(hk, b"")) and seq in (None, seqs.get(hk, b""))


def test_host_records_written_back_from_the_cache_keep_the_tables_exact_through_evictions_and_a_crash(tmp_path):
    """Many hosts round robin through a small host cache (states dropped and loaded again) and a store
    bound that evicts host records: written back without reading their sizes and sequences, the
    tables and byte count stay exact, after commits, a crash (no commit) and a reopen."""
    import gc
    path = str(tmp_path / "d")
    kw = dict(window=24, cache_hosts=2048, cache_bytes=96 << 10, max_bytes=96 << 10)
    s = Site(path, lambda u: u, **kw)
    for k in range(12):
        for i in range(150):
            s.fetch(f"http://h{i}.example/p/{k}-{'x' * 30}.html")
            if i % 50 == 49:
                s.learner.commit()
                check_host_tables(s.learner.store)
        if k == 5:
            s.learner = None                    # kill -9: the open transaction is lost
            gc.collect()
            s.learner = DustLearner(path, confirmations=3, sync=False, **kw)
            check_host_tables(s.learner.store)
    s.learner.commit()
    check_host_tables(s.learner.store)
    assert s.learner.store.meta["evicted_hosts"] > 0 and len(s.learner.store._held) > 0
    s.reopen()
    check_host_tables(s.learner.store)
    s.learner.close()


# -- on the writer thread ---------------------------------------------------------------------------

def dump_store(store):
    """Every table of a DUST store (committed state), for comparing two stores."""
    out = {}
    with store.env.begin() as txn:
        for name, db in [("hosts", store._hosts), ("lru", store._lru), ("arch0", store._arch[0]),
                         ("arch1", store._arch[1]), ("skips", store._skips), ("meta", store._meta)]:
            out[name] = dict(txn.cursor(db=db))
    return out


@pytest.mark.parametrize("filter_bytes", [0, 4 << 20])
def test_on_a_writer_thread_the_store_answers_as_with_its_own_transaction_and_the_loop_writes_nothing(
        tmp_path, monkeypatch, filter_bytes):
    """The same pages, admissions, skips and commits on a learner with its own write transaction and
    on one whose store commits on a writer thread, landing at random moments (read through the
    overlay meanwhile): the same decisions and changes throughout (rules trusted and retired, skips
    requeued, host records evicted, archived generations dropped), the same tables once the last
    commit landed, and every write transaction begun on the writer thread, none on the loop's.
    Without the archived set's filters every look-up reads the table (a dropped generation's
    entries must not answer before the drop landed)."""
    import asyncio
    import types

    from crawlerd.frontier import dust_evidence
    from crawlerd.store.writer import WriteThread
    from tests.frontier.budget_parts import RecordingEnv

    # one time for both learners (evidence carries it into the host records, and so their sizes)
    monkeypatch.setattr(dust_evidence, "time", types.SimpleNamespace(time=lambda: 1.7e9))
    changed = set()

    def content(url):
        return url if url in changed else tracking_content(url)

    # small bounds: host records evicted, the archived set's generations turned over (max_archived 1024)
    kw = dict(confirmations=2, sample_share=0.05, window=8, max_bytes=128 << 10, max_host_bytes=4 << 10,
              cache_hosts=16, cache_bytes=48 << 10, write_buffer_bytes=16 * 4096, clock=lambda: 1.7e9,
              archived_filter_bytes=filter_bytes)

    async def go():
        plain = Site(str(tmp_path / "a"), content, **kw)
        threaded = Site(str(tmp_path / "b"), content, **kw)
        store = threaded.learner.store
        env = store.env = RecordingEnv(store.env)
        writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.001)
        store.attach_writer(writer)
        ov, drops = store.overlay, []
        ov.drop = lambda db, delete=False, drop=ov.drop: (drops.append(db), drop(db, delete))
        env.recording = True
        both = (plain, threaded)
        rng = random.Random(7)
        hosts = [f"http://h{i}.example" for i in range(400)]
        landed = []
        for step in range(4000):
            op = rng.random()
            h = rng.choice(hosts[:20] if rng.random() < 0.6 else hosts)     # a few busy hosts learn rules
            page = f"{h}/p/{rng.randrange(30)}.html"
            if op < 0.55:
                url = page if rng.random() < 0.5 else f"{page}?utm_source=s{step}"
                if rng.random() < 0.01:
                    changed.add(url)                # the site answers differently: a rule retired
                simhash = rng.getrandbits(64)
                got = [s.fetch(url, simhash=simhash) for s in both]
                assert got[0] == got[1], step
            elif op < 0.85:
                url = f"{page}?utm_source=a{step}"
                d = [s.admit(url) for s in both]
                assert d[0] == d[1], step
                if d[0].action == SKIP:
                    for s in both:
                        s.learner.skipped(h, d[0], f"rec-{step}".encode())
            elif op < 0.93:
                plain.learner.commit()
                threaded.learner.commit(then=lambda step=step: landed.append(step))
            else:
                await asyncio.sleep(0.003 * rng.random())   # commits land meanwhile, or not
            if step % 50 == 0:
                assert plain.learner.stats() == threaded.learner.stats(), step
        done = asyncio.get_running_loop().create_future()
        plain.learner.commit()
        threaded.learner.commit(then=lambda: done.set_result(None))
        await done
        env.recording = False
        assert landed == sorted(landed) and len(landed) > 50        # landed, in commit order
        # the archived set turned over twice at least: a generation holding entries was dropped
        assert len(drops) >= 2
        assert plain.learner.store.meta["gen_count"] == store.meta["gen_count"]
        assert plain.learner.store.meta["evicted_hosts"] > 0 and plain.learner.stats()["rules_learned_total"] > 0
        assert dump_store(plain.learner.store) == dump_store(store)
        store.attach_writer(None)
        writer.close()
        assert env.write_threads and threading.get_ident() not in env.write_threads
        assert store.overlay is None
        for s in both:
            s.reopen()
        assert dump_store(plain.learner.store) == dump_store(threaded.learner.store)
        assert plain.learner.stats() == threaded.learner.stats()
        for s in both:
            s.learner.close()

    import threading
    asyncio.run(go())


CHILD_DUST = textwrap.dedent("""
    import asyncio, sys
    from crawlerd.frontier.dust_store import DustStore, URL
    from crawlerd.store.writer import WriteThread

    async def main():
        s = DustStore({path!r}, max_bytes=64 << 20, max_host_bytes=16 << 10)
        writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.001)
        s.attach_writer(writer)
        s.put_host("a", {{"rules": ["landed"]}})
        s.log_skip("a", "?x", b"skip-a", 0)
        for fp in range(1, 200):
            s.add_archived(fp, URL)
        done = asyncio.get_running_loop().create_future()
        s.commit(then=lambda: done.set_result(None))
        await done                              # landed: what a then would acknowledge
        writer.hold()                           # the next commit is handed over and never written
        s.put_host("b", {{"rules": ["not landed"]}})
        s.put_host("a", {{"rules": ["changed, not landed"]}})
        s.pop_skips("a", "?x")
        for fp in range(200, 400):
            s.add_archived(fp, URL)
        s.commit()
        await asyncio.sleep(0.05)
        print("ready", s.overlay.pending, flush=True)
        sys.stdin.read()

    asyncio.run(main())
""")


def test_kill_9_with_a_writer_keeps_the_dust_commits_that_landed(tmp_path):
    """A DUST commit handed to the writer is promised once it landed: kill -9 keeps it whole (host
    record, skip log, archived set), and a commit handed over and not written is lost whole."""
    from crawlerd.frontier.dust_store import DustStore
    path = str(tmp_path / "d")
    assert first_line_then_kill_9(CHILD_DUST.format(path=path)) == b"ready 1\n"
    s = DustStore(path, max_bytes=64 << 20, max_host_bytes=16 << 10)
    assert s.get_host("a") == {"rules": ["landed"]} and s.get_host("b") is None
    assert s.pop_skips("a", "?x") == [b"skip-a"]
    assert all(s.archived(fp) is not None for fp in range(1, 200))
    assert all(s.archived(fp) is None for fp in range(200, 400))
    check_host_tables(s)
    s.close()

def test_admission_decides_the_same_with_or_without_the_callers_host_keys(tmp_path):
    """The intake hands admit_batch the host keys it has; the decisions are those the learner
    makes when it takes each host from the URL (a trusted rule's host, another host, suspects)."""
    other = "http://other.example"
    sites = []
    for name in ("d", "e"):
        site = Site(str(tmp_path / name), tracking_content, confirmations=2)
        for k in range(3):
            site.fetch(f"{H}/p/{k}.html")
            site.fetch(f"{H}/p/{k}.html?utm_source=x{k}")
        site.fetch(f"{other}/p/1.html")          # archived there, but no rule of its own
        sites.append(site)
    s, twin = sites
    urls = [f"{H}/p/1.html?utm_source=feed", f"{H}/p/9.html?utm_source=feed", f"{other}/p/1.html?utm_source=x",
            f"{H}/p/2.html?utm_source=z", f"{other}/a/b/c.html", f"{other}/m/b/c.html", f"{H}/p/7.html"]
    fps, depths, hops = [fingerprint(u) for u in urls], [2] * len(urls), [0] * len(urls)
    plain = twin.learner.admit_batch(urls, fps, depths, hops)
    given = s.learner.admit_batch(tuple(urls), tuple(fps), tuple(depths), tuple(hops),
                                  tuple(host_key_of(u) for u in urls))
    assert given == plain
    assert {d.action for d in plain} >= {SKIP, NORMAL} or {d.action for d in plain} >= {SAMPLE, NORMAL}
