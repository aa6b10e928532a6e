"""NearDuplicates: answers against a brute-force model, persistence across crashes, host windows."""

import os
import random
import subprocess
import sys
import textwrap
from collections import deque

import pytest

from crawlerd.dedup.near import NearDuplicates
from tests.kill9 import first_line_then_kill_9


def flip(rng: random.Random, fp: int, bits: int) -> int:
    for b in rng.sample(range(64), bits):
        fp ^= 1 << b
    return fp


class Model:
    """The documented semantics, by brute force: originals only, closest then oldest wins."""

    def __init__(self, k: int):
        self.k = k
        self.docs: list[tuple[int, str]] = []

    def check_and_add(self, fp: int, url: str) -> str:
        best = None
        for i, (sfp, surl) in enumerate(self.docs):
            d = (sfp ^ fp).bit_count()
            if d <= self.k and (best is None or (d, i) < best[:2]):
                best = (d, i, surl)
        if best is None:
            self.docs.append((fp, url))
            return ""
        return "" if best[2] == url else best[2]


def stream(rng: random.Random, n: int):
    bases = [rng.getrandbits(64) for _ in range(max(1, n // 20))]
    for i in range(n):
        r = rng.random()
        if r < 0.4:
            fp = rng.getrandbits(64)
        else:
            fp = flip(rng, rng.choice(bases), rng.randrange(0, 6))
        url = f"http://h{i % 7}.test/p/{i if rng.random() < 0.9 else rng.randrange(i + 1)}"
        yield fp, url, f"http://h{i % 7}.test"


def test_within_distance_is_named_beyond_is_stored(tmp_path):
    with NearDuplicates(tmp_path, distance_bits=3) as nd:
        base = 0x0123_4567_89AB_CDEF
        assert nd.check_and_add(base, "http://a.test/1", "http://a.test") == ""
        assert nd.check_and_add(base ^ 0b111, "http://a.test/2", "http://a.test") == "http://a.test/1"
        assert len(nd) == 1     # a near duplicate is not stored
        assert nd.check_and_add(base ^ 0b1111, "http://a.test/3", "http://a.test") == ""
        assert len(nd) == 2
        assert nd.check_and_add(base, "http://a.test/1", "http://a.test") == ""     # recrawl of itself
        assert len(nd) == 2
        assert nd.url_of(0) == "http://a.test/1" and nd.url_of(1) == "http://a.test/3"
        assert nd.url_of(99) == ""
        assert nd.stats()["near_duplicates"] == 1 and nd.stats()["checked"] == 4


@pytest.mark.parametrize("k", [0, 1, 3])
def test_matches_brute_force_model(tmp_path, k):
    rng = random.Random(k)
    model = Model(k)
    with NearDuplicates(tmp_path, distance_bits=k, tail_capacity=16) as nd:
        for fp, url, host in stream(rng, 1500):
            assert nd.check_and_add(fp, url, host) == model.check_and_add(fp, url)
        assert len(nd) == len(model.docs) == nd.next_id


def test_batches_answer_as_single_calls(tmp_path):
    """Inside batch() (one transaction for a worker's batch) every answer is the model's, a page
    matching one stored earlier in the same batch included; a nested batch joins the open one."""
    rng = random.Random(11)
    model = Model(3)
    items = list(stream(rng, 1200))
    with NearDuplicates(tmp_path, tail_capacity=16) as nd:
        i = 0
        while i < len(items):
            n = rng.randrange(1, 40)
            with nd.batch():
                for fp, url, host in items[i:i + n]:
                    with nd.batch():
                        assert nd.check_and_add(fp, url, host) == model.check_and_add(fp, url)
            i += n
        base = rng.getrandbits(64)
        with nd.batch():
            assert nd.check_and_add(base, "http://z.test/1", "http://z.test") == ""
            assert nd.check_and_add(base ^ 1, "http://z.test/2", "http://z.test") == "http://z.test/1"
        assert len(nd) == len(model.docs) + 1 == nd.next_id


@pytest.mark.parametrize("host_windows_bytes", [16 << 20, 0])
def test_check_and_add_many_answers_and_demotes_as_one_by_one(tmp_path, host_windows_bytes):
    """A batch asked at once gets the answers and demotions of its pages asked one by one (each
    ``check_and_add`` then ``should_demote``): pages of one batch nearly duplicating each other
    (and the same page twice) included, across the index's tail and runs; with no room for host
    windows, no demotion either way."""
    rng = random.Random(21)
    model = Model(3)
    items = list(stream(rng, 3000))
    for _ in range(60):             # a batch of a trap's near copies of each other, new text
        base, at = rng.getrandbits(64), rng.randrange(len(items))
        items[at:at] = [(flip(rng, base, rng.randrange(0, 4)), f"http://trap.test/{rng.randrange(9)}",
                         "http://trap.test") for _ in range(rng.randrange(2, 12))]
    kw = {"tail_capacity": 16, "demote_min_pages": 4, "window_pages": 8, "host_windows_bytes": host_windows_bytes}
    demoted_many, demoted_one = [], []
    with NearDuplicates(tmp_path / "many", **kw) as many, NearDuplicates(tmp_path / "one", **kw) as one:
        i = 0
        while i < len(items):
            batch = items[i:i + rng.randrange(1, 40)]
            i += len(batch)
            answers, demoted = many.check_and_add_many(batch)
            demoted_many += demoted
            expect = []
            for fp, url, host in batch:
                expect.append(one.check_and_add(fp, url, host))
                assert expect[-1] == model.check_and_add(fp, url)
                if one.should_demote(host):
                    demoted_one.append(host)
            assert answers == expect
        assert many.stats() == one.stats()
        assert len(many) == len(one) == len(model.docs)
        assert many.index_stats()["ram_runs"] > 1
        for host in {h for _, _, h in items}:
            assert many.host_counts(host) == one.host_counts(host)
    assert demoted_many == demoted_one
    assert bool(demoted_many) == bool(host_windows_bytes)
    assert sum(1 for a in items if a[2] == "http://trap.test") > 100


def test_check_and_add_many_refuses_a_bad_fingerprint(tmp_path):
    with NearDuplicates(tmp_path) as nd:
        assert nd.check_and_add_many([]) == ([], [])
        with pytest.raises(ValueError):
            nd.check_and_add_many([(1, "http://a.test/1", "http://a.test"), (2**64, "http://a.test/2", "http://a.test")])


def test_kill_after_a_batch_loses_nothing(tmp_path):
    """A batch's docs are committed when the batch ends: kill -9 after it loses none of them."""
    script = textwrap.dedent(f"""
        import os, random
        from crawlerd.dedup.near import NearDuplicates
        nd = NearDuplicates({str(tmp_path)!r})
        rng = random.Random(3)
        with nd.batch():
            for i in range(50):
                assert nd.check_and_add(rng.getrandbits(64), f"http://a.test/{{i}}", "http://a.test") == ""
        os._exit(0)     # no close, no save: as kill -9
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    rng = random.Random(3)
    fps = [rng.getrandbits(64) for _ in range(50)]
    with NearDuplicates(tmp_path) as nd:
        assert nd.next_id == 50 and len(nd) == 50
        assert nd.url_of(49) == "http://a.test/49"
        assert nd.check_and_add(fps[7] ^ 2, "http://b.test/7", "http://b.test") == "http://a.test/7"


def test_save_reopen_gives_same_answers(tmp_path):
    rng = random.Random(5)
    items = list(stream(rng, 800))
    model = Model(3)
    with NearDuplicates(tmp_path, tail_capacity=32) as nd:
        for fp, url, host in items[:500]:
            assert nd.check_and_add(fp, url, host) == model.check_and_add(fp, url)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["near", "near-index"]
    with NearDuplicates(tmp_path, tail_capacity=32) as nd:
        assert len(nd) == len(model.docs)
        st = nd.index_stats()
        assert st["pairs_on_disk"] == len(model.docs) and st["ram_runs"] == 0     # close moved it to disk
        for fp, url, host in items[500:]:
            assert nd.check_and_add(fp, url, host) == model.check_and_add(fp, url)
    assert len(list((tmp_path / "near-index").glob("near-run-*.tbl"))) == 1


def test_kill_after_adds_loses_nothing(tmp_path):
    """Docs added after the last save come back from LMDB on open (replayed into the index)."""
    script = textwrap.dedent(f"""
        import os, random
        from crawlerd.dedup.near import NearDuplicates
        nd = NearDuplicates({str(tmp_path)!r})
        rng = random.Random(1)
        for i in range(300):
            nd.check_and_add(rng.getrandbits(64), f"http://a.test/{{i}}", "http://a.test")
            if i == 99:
                nd.save()
        os._exit(0)     # no close, no save: as kill -9
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    rng = random.Random(1)
    fps = [rng.getrandbits(64) for _ in range(300)]
    with NearDuplicates(tmp_path) as nd:
        assert nd.next_id == 300 and len(nd) == 300
        for i in (0, 150, 299):
            assert nd.check_and_add(fps[i] ^ 1, f"http://b.test/{i}", "http://b.test") == f"http://a.test/{i}"
        assert nd.check_and_add(fps[7], "http://a.test/new", "http://a.test") == "http://a.test/7"
        assert nd.check_and_add(rng.getrandbits(64), "http://a.test/300", "http://a.test") == ""
        assert nd.url_of(300) == "http://a.test/300"    # ids continue, none reused


def test_damaged_index_is_rebuilt_from_lmdb(tmp_path):
    rng = random.Random(2)
    fps = [rng.getrandbits(64) for _ in range(50)]
    with NearDuplicates(tmp_path) as nd:
        for i, fp in enumerate(fps):
            nd.check_and_add(fp, f"http://a.test/{i}", "http://a.test")
    (run,) = (tmp_path / "near-index").glob("near-run-*.tbl")
    with open(run, "r+b") as f:
        f.truncate(run.stat().st_size - 8)         # a torn run file
    (tmp_path / "near-index" / ".near-run-000000000099.tbl.tmp").write_bytes(b"torn")
    (tmp_path / "near-simhash-0000000000000099.idx").write_bytes(b"old in-RAM index file")
    with NearDuplicates(tmp_path) as nd:
        assert len(nd) == 50
        assert nd.check_and_add(fps[10] ^ 4, "http://b.test/x", "http://b.test") == "http://a.test/10"
    assert not list((tmp_path / "near-index").glob(".*")) and not list(tmp_path.glob("near-simhash-*"))


def test_one_owner(tmp_path):
    with NearDuplicates(tmp_path):
        with pytest.raises(RuntimeError, match="already open"):
            NearDuplicates(tmp_path)


def test_bad_parameters(tmp_path):
    with pytest.raises(ValueError, match="distance_bits"):
        NearDuplicates(tmp_path, distance_bits=4)
    with pytest.raises(ValueError, match="demote_min_pages"):
        NearDuplicates(tmp_path, demote_min_pages=200, window_pages=100)
    NearDuplicates(tmp_path).close()        # the failed opens released the lock


def test_demotion_needs_min_pages_and_ratio_then_starts_fresh(tmp_path):
    with NearDuplicates(tmp_path, demote_ratio=0.5, demote_min_pages=10, window_pages=20) as nd:
        host = "http://trap.test"
        base = 0xFEED_FACE_0000_0000
        nd.check_and_add(base, f"{host}/0", host)
        for i in range(1, 9):
            nd.check_and_add(base ^ (1 << (i % 3)), f"{host}/{i}?sid={i}", host)
        assert not nd.should_demote(host)           # 9 pages < min 10
        nd.check_and_add(base ^ 2, f"{host}/9?sid=9", host)
        assert nd.should_demote(host)               # 9 of 10 near duplicates
        assert not nd.should_demote(host)           # a fresh window
        assert nd.host_counts(host) == {"pages": 10, "near_duplicates": 9, "window_pages": 0,
                                        "window_near_duplicates": 0, "demotions": 1}
        assert nd.top_hosts() == [(host, 9)]
        # a host of distinct pages is never demoted
        rng = random.Random(3)
        for i in range(40):
            nd.check_and_add(rng.getrandbits(64), f"http://ok.test/{i}", "http://ok.test")
            assert not nd.should_demote("http://ok.test")
        assert not nd.should_demote("http://unknown.test")


def test_window_slides_against_a_deque(tmp_path):
    """Invariant: the window holds the last window_pages answers and counts its near duplicates."""
    rng = random.Random(4)
    window = 16
    model: deque[bool] = deque(maxlen=window)
    base = rng.getrandbits(64)
    with NearDuplicates(tmp_path, demote_ratio=0.75, demote_min_pages=8, window_pages=window) as nd:
        nd.check_and_add(base, "http://h.test/base", "http://other.test")
        for i in range(400):
            near = rng.random() < 0.6
            fp = base ^ 1 if near else rng.getrandbits(64)
            assert (nd.check_and_add(fp, f"http://h.test/{i}", "http://h.test") != "") == near
            model.append(near)
            c = nd.host_counts("http://h.test")
            assert c["window_pages"] == len(model) and c["window_near_duplicates"] == sum(model)
            expect = len(model) >= 8 and sum(model) >= 0.75 * len(model)
            assert nd.should_demote("http://h.test") == expect
            if expect:
                model.clear()


def test_host_windows_are_lru_bounded_in_bytes(tmp_path):
    one = NearDuplicates(tmp_path / "probe")
    one.check_and_add(1, "http://a.test/1", "http://a.test")
    per_host = one.memory()["near_host_windows"]["bytes"]
    one.close()
    with NearDuplicates(tmp_path, host_windows_bytes=3 * per_host) as nd:
        rng = random.Random(6)
        for h in ["a", "b", "c", "a", "d", "e"]:
            nd.check_and_add(rng.getrandbits(64), f"http://{h}.test/{rng.random()}", f"http://{h}.test")
        assert nd.stats()["hosts_tracked"] == 3
        assert nd.host_counts("http://b.test")["pages"] == 0            # least recently used: forgotten
        assert nd.host_counts("http://c.test")["pages"] == 0
        m = nd.memory()["near_host_windows"]
        assert m["bytes"] <= m["cap_bytes"] == 3 * per_host
        assert nd.host_counts("http://a.test")["pages"] == 2


def test_closed_store_refuses_save(tmp_path):
    nd = NearDuplicates(tmp_path)
    nd.close()
    nd.close()
    with pytest.raises(RuntimeError, match="closed"):
        nd.save()
    assert os.path.isdir(tmp_path / "near")


# -- on the writer thread ---------------------------------------------------------------------------

def test_on_a_writer_thread_batches_answer_as_the_model_and_the_loop_writes_nothing(tmp_path):
    """With a writer attached, batches answer as the model while their docs land at random moments
    (a page matches a doc handed over and not written yet), every write transaction is begun on the
    writer thread, ``save``'s fsync there too, and once written the store reopens with every doc."""
    import asyncio
    import threading

    from crawlerd.store.writer import WriteThread
    from tests.frontier.budget_parts import RecordingEnv

    rng = random.Random(13)
    model = Model(3)
    items = list(stream(rng, 1500))

    async def go():
        nd = NearDuplicates(tmp_path, tail_capacity=16)
        env = nd._env = RecordingEnv(nd._env)
        writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.001)
        nd.attach_writer(writer)
        env.recording = True
        i = pending_seen = 0
        while i < len(items):
            n = rng.randrange(1, 40)
            with nd.batch():
                for fp, url, host in items[i:i + n]:
                    assert nd.check_and_add(fp, url, host) == model.check_and_add(fp, url), i
            pending_seen = max(pending_seen, nd.pending)
            i += n
            if rng.random() < 0.1:
                nd.save()
            if rng.random() < 0.5:
                await asyncio.sleep(0.003 * rng.random())       # docs land meanwhile, or not
        done = asyncio.get_running_loop().create_future()
        writer.barrier(lambda: done.set_result(None))
        await done
        assert nd.pending == 0 and pending_seen > 0
        nd.attach_writer(None)
        writer.close()
        env.recording = False
        assert env.write_threads and threading.get_ident() not in env.write_threads
        assert len(nd) == len(model.docs) == nd.next_id
        nd._env = env._env
        nd.close()

    asyncio.run(go())
    with NearDuplicates(tmp_path) as nd:
        assert nd.next_id == len(model.docs)
        for doc, (_fp, url) in enumerate(model.docs):
            assert nd.url_of(doc) == url
        for fp, url, host in list(stream(random.Random(14), 300)):
            assert nd.check_and_add(fp, url, host) == model.check_and_add(fp, url)


def test_kill_9_with_a_writer_keeps_the_docs_that_were_written(tmp_path):
    """kill -9 with a writer: every doc whose batch was written survives (and is matched after the
    restart); the docs handed over and not written are the only loss, and their ids are not reused
    for docs the index holds (the store reopens consistent)."""
    script = textwrap.dedent(f"""
        import asyncio, random, sys
        from crawlerd.dedup.near import NearDuplicates
        from crawlerd.store.writer import WriteThread

        async def main():
            nd = NearDuplicates({str(tmp_path)!r})
            writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.001)
            nd.attach_writer(writer)
            rng = random.Random(3)
            with nd.batch():
                for i in range(50):
                    assert nd.check_and_add(rng.getrandbits(64), f"http://a.test/{{i}}", "http://a.test") == ""
            done = asyncio.get_running_loop().create_future()
            writer.barrier(lambda: done.set_result(None))
            await done                          # written
            writer.hold()                       # the next batch is handed over and never written
            with nd.batch():
                for i in range(50, 60):
                    assert nd.check_and_add(rng.getrandbits(64), f"http://a.test/{{i}}", "http://a.test") == ""
            await asyncio.sleep(0.05)
            print("ready", nd.pending, flush=True)
            sys.stdin.read()

        asyncio.run(main())
    """)
    assert first_line_then_kill_9(script) == b"ready 10\n"
    rng = random.Random(3)
    fps = [rng.getrandbits(64) for _ in range(60)]
    with NearDuplicates(tmp_path) as nd:
        assert nd.next_id == 50 and len(nd) == 50
        for i in (0, 25, 49):
            assert nd.url_of(i) == f"http://a.test/{i}"
            assert nd.check_and_add(fps[i] ^ 2, f"http://b.test/{i}", "http://b.test") == f"http://a.test/{i}"
        assert nd.url_of(55) == ""


def test_with_a_writer_written_is_done_only_once_the_docs_handed_over_are_written(tmp_path):
    """``written()``, which a page's lease completion awaits: pending while the writer holds the
    batch back, done once it wrote it (and the doc is then on disk), None with nothing pending."""
    import asyncio

    from crawlerd.store.writer import WriteThread

    async def go():
        nd = NearDuplicates(tmp_path)
        writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.001)
        nd.attach_writer(writer)
        assert nd.written() is None
        writer.hold()
        assert nd.check_and_add(0x0F0F_0F0F_0F0F_0F0F, "http://a.test/1", "http://a.test") == ""
        first = nd.written()
        assert nd.check_and_add(0xF0F0_F0F0_F0F0_F0F0, "http://a.test/2", "http://a.test") == ""
        second = nd.written()
        await asyncio.sleep(0.05)
        assert first is not None and not first.done() and not second.done()
        with nd._env.begin() as txn:
            assert txn.stat()["entries"] == 0               # not written: nothing to promise yet
        writer.release()
        await asyncio.wait_for(second, 5)
        assert first.done() and nd.written() is None and nd.pending == 0
        with nd._env.begin() as txn:
            assert txn.stat()["entries"] == 2
        nd.attach_writer(None)
        writer.close()
        nd.close()

    asyncio.run(go())
