"""A worker's answer frame handled as one batch (``Answers.answer_frame``) against the per-page path.

The same stream of frames goes through both: the recrawl tables, the digest set, the event log's
bytes, the counters, the links handed to the intake and DUST's evidence must come out identical.
"""

import asyncio
import glob
import hashlib
import random

import lmdb
import pytest

from crawlerd import config
from crawlerd.frontier import QueuedURL
from crawlerd.frontier.recrawl import Recrawl
from crawlerd.metrics import Metrics
from crawlerd.outcome import Outcome
from crawlerd.records import FetchResult, Link, ProcessResult
from crawlerd.shard.answers import Answers
from crawlerd.shard.events import FetchEvents
from crawlerd.shard.storage import StorageFailure
from crawlerd.store import sha1_base32
from crawlerd.store.digest_set import DigestSet
from crawlerd.store.writer import WriteThread

T0 = 1_700_000_000.0


class FramePool:
    """Answers the calls waiting in it as one worker frame, as ``WorkerPool._on_answer`` does:
    ``on_frame`` (if set) with the calls that gave a ctx, then every call's result."""

    def __init__(self):
        self.on_frame = None
        self.hook_failed = 0
        self.waiting: list[tuple[FetchResult, object, asyncio.Future]] = []

    async def process(self, res, prior=None, *, digest="", lookup=False, sitemap=None, ctx=None):
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append((res, ctx, fut))
        return await fut

    def answer(self, results: dict[int, ProcessResult]) -> None:
        waiting, self.waiting = self.waiting, []
        answered = [(ctx, results[id(res)], fut) for res, ctx, fut in waiting]
        if self.on_frame is not None:
            try:
                self.on_frame([(ctx, pr) for ctx, pr, _ in answered if ctx is not None])
            except Exception:       # as WorkerPool: logged, each call still gets its answer
                self.hook_failed += 1
        for _ctx, pr, fut in answered:
            fut.set_result(pr)


class Intake:
    def __init__(self, events: FetchEvents):
        self.events = events
        self.calls = []

    def submit_links(self, links, *, depth, hops=0, priority=None, page=False):
        self.calls.append(("links", [ln.url for ln in links], depth, hops, priority, page))
        for ln in links:        # an intake that writes an event of its own, mid-page
            if "drop" in ln.url:
                self.events.dropped(ln.url, "test_drop")
        return len(links)

    def submit_urls(self, urls, *, depth, hops=0, priority=None, base=None):
        self.calls.append(("urls", list(urls), depth, hops, priority, base))
        return len(urls)

    def links_barrier(self):
        return None


class Near:
    def written(self):
        return None


def _digest(n: int) -> str:
    return "sha1:" + sha1_base32(hashlib.sha1(b"%d" % n).digest())


def _page(url: str, status: int, t: float, *, body: int = 0, headers=(), links=(), duplicate_of="",
          storage_error="", archived=True, canonical="") -> tuple[FetchResult, ProcessResult]:
    hdrs = [("Content-Type", "text/html"), *headers]
    res = FetchResult(url=url, outcome=Outcome.OK, status=status, ip="127.0.0.1", started_at=T0 + t,
                      elapsed_s=0.01, body=b"x" * 10, headers=hdrs)
    ls = [Link(u, int.from_bytes(hashlib.sha1(u.encode()).digest()[:8], "big"), u.split("/", 3)[0] + "//"
               + u.split("/")[2], "nofollow" in u) for u in links]
    pr = ProcessResult(url=url, outcome=Outcome.OK, status=status, links=ls, content_type="text/html",
                       digest=_digest(body) if status == 200 else "", simhash=body * 7919,
                       warc_file="w.warc.gz" if archived and not storage_error else "", warc_offset=int(t),
                       warc_length=100, warc_record_id=f"<urn:uuid:{url}-{t}>" if archived else "",
                       duplicate_of=duplicate_of, storage_error=storage_error, canonical=canonical)
    return res, pr


def _fp(url: str) -> int:
    return int.from_bytes(hashlib.sha1(url.encode()).digest()[8:16], "big")


A, B, C = "http://a.test", "http://b.test", "http://c.test"
LINKS = [f"{A}/l1", f"{B}/l2", f"{C}/nofollow", f"{A}/drop-me"]
# frames of (url, status, time, options): new pages, then revisits (304, unchanged, changed), a
# permanent redirect (forgotten), Gone (dropped), 429/503 (not recorded), errors to the drop, a
# URL answered twice in one frame, redirects in and over the hop limit, a page not archived
FRAMES = [
    [(f"{A}/1", 200, 1, dict(body=1, links=LINKS, headers=[("ETag", '"e1"')])),
     (f"{A}/2", 200, 2, dict(body=2, headers=[("Last-Modified", "Sat, 01 Jan 2000 00:00:00 GMT")])),
     (f"{B}/3", 200, 3, dict(body=3, links=LINKS[:2])),
     (f"{B}/4", 200, 4, dict(body=1, duplicate_of=f"{A}/1")),
     (f"{B}/5", 200, 5, dict(body=5)),
     (f"{C}/6", 200, 6, dict(body=6)),
     (f"{C}/7", 404, 7, dict()),
     (f"{C}/8", 302, 8, dict(headers=[("Location", "/8b")], hops=1)),
     (f"{C}/9", 302, 9, dict(headers=[("Location", "/9b")], hops=5)),
     (f"{C}/10", 200, 10, dict(body=10, links=LINKS)),
     (f"{C}/11", 500, 11, dict()),
     (f"{A}/12", 200, 12, dict(body=12, canonical=f"{A}/1"))],
    [(f"{A}/1", 304, 101, dict(headers=[("ETag", '"e2"')])),
     (f"{A}/2", 200, 102, dict(body=2)),
     (f"{B}/3", 200, 103, dict(body=33, links=LINKS)),
     (f"{B}/4", 301, 104, dict(headers=[("Location", "/4b")])),
     (f"{B}/5", 410, 105, dict()),
     (f"{C}/6", 429, 106, dict()),
     (f"{C}/6", 503, 107, dict()),
     (f"{A}/12", 200, 108, dict(body=120)),
     (f"{A}/12", 200, 109, dict(body=121)),
     (f"{C}/10", 200, 110, dict(body=10, storage_error="disk full: /w")),
     (f"{C}/13", 200, 111, dict(body=13, archived=False))],
    [(f"{C}/10", 500, 201, dict()), (f"{C}/10", 500, 202, dict()), (f"{A}/2", 503, 203, dict()),
     (f"{C}/10", 500, 203, dict()), (f"{A}/1", 200, 204, dict(body=1)), (f"{B}/3", 200, 205, dict(body=34)),
     (f"{A}/14", 200, 206, dict(body=14, links=LINKS[1:]))],
]


async def _crawl(tmp: str, batch: bool) -> dict:
    cfg = config.load(None, [f"crawl.data_dir={tmp!r}", "process.workers=1", "fetch.max_redirects=3"])
    loop = asyncio.get_running_loop()
    writer = WriteThread(loop, group_delay_s=0.001)
    # a commit every 4 visits: record_many's writes cross commits inside a frame
    recrawl = Recrawl(cfg.path("recrawl"), map_size_bytes=1 << 24, clock=lambda: T0, rng=random.Random(7),
                      group_ops=4, read_cache_bytes=1 << 16, key_filter_bytes=1 << 12)
    digests = DigestSet(cfg.path("dedup", "digests"), map_size_bytes=1 << 22)
    events = FetchEvents(cfg.path("events"), wall=lambda: T0 + 1000)
    recrawl.attach_writer(writer)
    digests.attach_writer(writer)
    pool, metrics, evidence = FramePool(), Metrics(), []
    intake = Intake(events)
    ans = Answers(cfg, pool=pool, digests=digests, near=Near(), recrawl=recrawl, frontier=None, intake=intake,
                  events=events, metrics=metrics, batch=batch)

    def observe(url, fp, host_key, sha1, pr, depth):
        evidence.append((url, fp, host_key, sha1, pr.simhash, depth))
        if pr.canonical:        # DUST writes events of its own between a page's steps
            events.record("dust_rule", host_key, "dust_trusted", rule=pr.canonical)
    ans.evidence = observe
    failed = []
    try:
        for frame in FRAMES:
            results, tasks = {}, []
            for url, status, t, opts in frame:
                opts = dict(opts)
                hops = opts.pop("hops", 0)
                res, pr = _page(url, status, t, **opts)
                results[id(res)] = pr
                item = QueuedURL(url=url, host_key=url.split("/", 3)[0] + "//" + url.split("/")[2], depth=1,
                                 hops=hops)
                tasks.append(asyncio.ensure_future(ans.process(url, _fp(url), item.host_key, item, res)))
            while len(pool.waiting) < len(frame):
                await asyncio.sleep(0)
            pool.answer(results)
            for task, (url, _status, t, _o) in zip(tasks, frame, strict=True):
                try:
                    await task
                except StorageFailure:
                    failed.append((url, t))
        recrawl.check_invariants()
        stats = recrawl.stats()
        recrawl.commit()
        done = loop.create_future()
        writer.barrier(lambda: done.set_result(None))
        await done
    finally:
        recrawl.attach_writer(None)
        digests.attach_writer(None)
        writer.close()
        recrawl.close()
        digests.close()
        events.close()
    tables = {}
    env = lmdb.open(cfg.path("recrawl"), max_dbs=3, readonly=True, lock=False)
    try:
        for name in (b"urls", b"due", b"meta"):
            db = env.open_db(name, create=False)
            with env.begin(db=db) as txn:
                tables[name] = list(txn.cursor())
    finally:
        env.close()
    env = lmdb.open(cfg.path("dedup", "digests"), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            tables[b"digests"] = list(txn.cursor())
    finally:
        env.close()
    log = b"".join(open(p, "rb").read() for p in sorted(glob.glob(cfg.path("events", "*"))))
    return {"tables": tables, "events": log, "counters": dict(metrics.counters), "dropped": dict(metrics.dropped),
            "intake": intake.calls, "evidence": evidence, "failed": failed,
            "stats": {k: v for k, v in stats.items() if k not in ("read_cache", "key_filter", "tracked")}}


def test_a_stream_of_frames_gives_the_same_stores_and_events_batched_as_page_by_page(tmp_path):
    per_page = asyncio.run(_crawl(str(tmp_path / "page"), batch=False))
    batched = asyncio.run(_crawl(str(tmp_path / "batch"), batch=True))
    assert per_page["tables"][b"urls"]          # the stream did record visits
    assert len(per_page["tables"][b"digests"]) >= 5
    assert per_page["stats"]["dropped"] >= 2 and per_page["stats"]["not_modified"] == 1
    assert per_page["failed"] == [(f"{C}/10", 110)]
    assert b'"test_drop"' in per_page["events"] and b'"dust_rule"' in per_page["events"]
    for key in per_page:
        assert batched[key] == per_page[key], key


@pytest.mark.parametrize("broken", ["recrawl", "events", "one_page"])
def test_a_failed_write_fails_the_pages_it_touched_and_none_completes_unrecorded(tmp_path, broken):
    """A frame's recrawl visits go in one pass and its events in one append: if either fails, every
    page of the frame raises in its own ``process`` (no lease completes without its records; each
    is fetched again). A page whose own follow-up fails (DUST's evidence) fails alone."""
    async def go():
        cfg = config.load(None, [f"crawl.data_dir={str(tmp_path)!r}", "process.workers=1"])
        recrawl = Recrawl(cfg.path("recrawl"), map_size_bytes=1 << 24)
        digests = DigestSet(cfg.path("dedup", "digests"), map_size_bytes=1 << 22)
        events = FetchEvents(cfg.path("events"), wall=lambda: T0)      # no on_error: a failed write raises
        pool = FramePool()
        ans = Answers(cfg, pool=pool, digests=digests, near=Near(), recrawl=recrawl, frontier=None,
                      intake=Intake(events), events=events, metrics=Metrics())

        def fail(*_a, **_k):
            raise OSError(f"{broken} failed")
        if broken == "recrawl":
            recrawl.record_many = fail
        elif broken == "events":
            events.log.write_many = fail
        else:
            ans.evidence = lambda url, *_a: fail() if url.endswith("/1") else None
        try:
            results, tasks = {}, []
            for i in range(3):
                url = f"{A}/{i}"
                res, pr = _page(url, 200, i, body=i)
                results[id(res)] = pr
                tasks.append(asyncio.ensure_future(ans.process(url, _fp(url), A, None, res)))
            while len(pool.waiting) < 3:
                await asyncio.sleep(0)
            pool.answer(results)
            got = await asyncio.gather(*tasks, return_exceptions=True)
            return [type(r).__name__ for r in got], pool.hook_failed
        finally:
            recrawl.close()
            digests.close()
            events.close()

    got, hook_failed = asyncio.run(go())
    assert hook_failed == 0
    assert got == (["NoneType", "OSError", "NoneType"] if broken == "one_page" else ["OSError"] * 3)


@pytest.mark.parametrize("group_ops", [1, 3, 1000])
def test_record_many_matches_record_one_by_one(tmp_path, group_ops):
    """``Recrawl.record_many`` with a writer (one overlay pass per table) against ``record`` and
    ``forget`` one by one without one: the same tables, counters and due times."""
    visits = []
    for i in range(12):
        visits.append((f"{A}/{i % 5}", i % 5, A, T0 + i, (200, 304, 200, 500, 410, 200)[i % 6],
                       f'"e{i}"' if i % 2 else None, None, f"{i % 3:040x}", i % 4))
        if i == 7:
            visits.append((None, 2))

    def dump(path):
        env = lmdb.open(path, max_dbs=3, readonly=True, lock=False)
        try:
            out = {}
            for name in (b"urls", b"due", b"meta"):
                with env.begin(db=env.open_db(name, create=False)) as txn:
                    out[name] = list(txn.cursor())
            return out
        finally:
            env.close()

    async def batched(path):
        r = Recrawl(path, map_size_bytes=1 << 24, rng=random.Random(3), group_ops=group_ops)
        writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.001)
        r.attach_writer(writer)
        try:
            r.record_many(visits[:6])
            r.record_many(visits[6:])
            r.check_invariants()
            r.commit()
            done = asyncio.get_running_loop().create_future()
            writer.barrier(lambda: done.set_result(None))
            await done
        finally:
            r.attach_writer(None)
            writer.close()
            r.close()

    one = Recrawl(str(tmp_path / "one"), map_size_bytes=1 << 24, rng=random.Random(3), group_ops=group_ops)
    try:
        for v in visits:
            if v[0] is None:
                one.forget(v[1])
            else:
                one.record(*v[:3], fetched_at=v[3], status=v[4], etag=v[5], last_modified=v[6], digest=v[7],
                           changed=None, depth=v[8])
    finally:
        one.close()
    asyncio.run(batched(str(tmp_path / "many")))
    assert dump(str(tmp_path / "many")) == dump(str(tmp_path / "one"))
