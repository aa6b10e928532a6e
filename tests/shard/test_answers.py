"""Answers with a real worker pool: exact duplicates, links back to the intake, redirect limits, recrawl."""

import asyncio
from pathlib import Path

from warcio.archiveiterator import ArchiveIterator

from crawlerd.frontier import QueuedURL
from crawlerd.outcome import Outcome
from crawlerd.process.pool import WorkerPool
from crawlerd.shard.answers import Answers, on_worker_death
from tests.shard.parts import Parts, answer, run

PAGE = (b"<!DOCTYPE html><html><head><title>t</title></head><body><p>" + b"crawler frontier robots " * 60
        + b'</p><a href="/next">n</a><a href="http://c.test/far" rel="nofollow">f</a></body></html>')


def make(p: Parts) -> Answers:
    cfg = p.cfg
    pool = WorkerPool(1, {
        "warc_dir": cfg.path("warc"), "index_dir": cfg.path("index"), "prefix": "t",
        "segment_max_bytes": 1 << 30, "shard": "0", "user_agent": "crawlerd-test/0.1",
        "agent_token": "crawlerd", "max_decoded_bytes": 1 << 20, "max_links": 100,
        "digest_dir": cfg.path("dedup", "digests")},
        on_worker_death=on_worker_death(p.metrics, cfg.path("index")))
    return Answers(cfg, pool=pool, digests=p.digests, near=p.near, recrawl=p.recrawl, frontier=p.frontier,
                   intake=p.intake, events=p.events, metrics=p.metrics)


def item(url: str, hops: int = 0) -> QueuedURL:
    return QueuedURL(url=url, host_key=url.split("/", 3)[0] + "//" + url.split("/")[2], depth=0, hops=hops)


def test_second_copy_is_an_exact_duplicate_of_the_first_and_links_reach_the_seen_set(tmp_path):
    async def go():
        p = Parts(str(tmp_path), "fetch.max_redirects=2")
        ans = make(p)
        await ans.pool.start()
        p.seen.start(asyncio.get_running_loop(), p.intake.on_seen_results)
        try:
            # two copies at once: the worker archives the first, the other becomes its revisit
            await asyncio.gather(ans.process("http://a.test/one", 1, "http://a.test", item("http://a.test/one"),
                                             answer("http://a.test/one", PAGE)),
                                 ans.process("http://b.test/two", 2, "http://b.test", item("http://b.test/two"),
                                             answer("http://b.test/two", PAGE)))
            # and one later, once the first is archived (found in the digest set's committed view)
            await ans.process("http://a.test/three", 3, "http://a.test", item("http://a.test/three"),
                              answer("http://a.test/three", PAGE))
            # a redirect one hop over the limit ends with a reason, not in the seen-set
            await ans.process("http://a.test/r", 4, "http://a.test", item("http://a.test/r", hops=2),
                              answer("http://a.test/r", b"", status=302, headers=[("Location", "/s")]))
            await p.seen.flush()
            queued = p.frontier.queued()
            assert len(p.digests) == 1                  # the first capture owns the digest
            return p.event_lines(), dict(p.metrics.counters), dict(p.metrics.dropped), queued, p
        finally:
            await ans.pool.close()
            await p.close()

    events, counters, dropped, queued, p = run(go())
    pages = {e["url"]: e for e in events if e["kind"] == "page"}
    firsts = [u for u in ("http://a.test/one", "http://b.test/two") if not pages[u]["duplicate_of"]]
    assert len(firsts) == 1
    dups = {u: pages[u]["duplicate_of"] for u in pages if pages[u]["duplicate_of"]}
    assert set(dups) == {"http://a.test/one", "http://b.test/two", "http://a.test/three"} - set(firsts)
    assert all(firsts[0] in str(v) for v in dups.values()), dups
    assert counters["duplicate_exact"] == 2
    assert dropped[Outcome.TOO_MANY_REDIRECTS.value] == 1
    assert any(e["kind"] == "dropped" and e["url"] == "http://a.test/s" for e in events)
    assert dropped["nofollow"] == 3                 # one per page, never followed
    assert queued == 2                              # a.test/next and b.test/next, once each
    # both revisits name the first capture's record (WARC-Refers-To), found in the worker
    ids, refers = {}, {}
    warc_dir = Path(p.cfg.path("warc"))
    for seg in sorted(warc_dir.glob("*.warc.gz")):
        with open(seg, "rb") as f:
            for rec in ArchiveIterator(f):
                uri = rec.rec_headers.get_header("WARC-Target-URI")
                if rec.rec_type == "response":
                    ids[uri] = rec.rec_headers.get_header("WARC-Record-ID")
                elif rec.rec_type == "revisit":
                    refers[uri] = rec.rec_headers.get_header("WARC-Refers-To")
    assert set(refers) == set(dups) and set(refers.values()) == {ids[firsts[0]]}


class EdgeRecorder:
    """Stands in for the budgets: the pages (their host keys) whose STAR edges were handed over,
    call by call."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def record_pages_links(self, pages):
        self.calls.append([page for page, _host_keys in pages])
        return 0

    def pages(self) -> set[str]:
        return {u for call in self.calls for u in call}

    def edges_logged(self):
        return None


def test_edges_of_pages_answered_together_go_in_one_call_before_their_leases_complete(tmp_path):
    """A page's domain edges are handed to the budgets with those of the other pages answered in
    the same loop iteration, and always before its ``process`` returns (its lease completes)."""
    async def go():
        p = Parts(str(tmp_path))
        ans = make(p)
        rec = ans.budgets = EdgeRecorder()
        await ans.pool.start()
        p.seen.start(asyncio.get_running_loop(), p.intake.on_seen_results)
        done_before = {}

        async def one(host: str):
            url = f"http://{host}/p"
            await ans.process(url, hash(url) & 0xFFFF, f"http://{host}", item(url), answer(url, PAGE + host.encode()))
            done_before[f"http://{host}"] = f"http://{host}" in rec.pages()   # handed over before its lease completes

        try:
            await one("solo.test")
            await asyncio.gather(*(one(f"h{i}.test") for i in range(6)))
            await p.seen.flush()
            return rec.calls, done_before
        finally:
            await ans.pool.close()
            await p.close()

    calls, done_before = run(go())
    assert all(done_before.values()) and len(done_before) == 7
    pages = [u for call in calls for u in call]
    assert sorted(pages) == sorted(done_before)             # each page once
    assert len(calls) < len(pages)                          # pages answered together: one call


def test_a_failed_edge_handover_fails_the_page_instead_of_completing_it(tmp_path):
    """The budgets refuse the edges (a failed edge DRUM): ``process`` raises for the page, so its
    lease is not completed, and the edges are not dropped silently."""
    class Failing(EdgeRecorder):
        def record_pages_links(self, pages):
            raise OSError("edge DRUM failed")

    async def go():
        p = Parts(str(tmp_path))
        ans = make(p)
        ans.budgets = Failing()
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, _ctx: None)       # the iteration's flush fails too
        await ans.pool.start()
        p.seen.start(loop, p.intake.on_seen_results)
        try:
            url = "http://f.test/p"
            try:
                await ans.process(url, 9, "http://f.test", item(url), answer(url, PAGE))
            except OSError as e:
                return str(e)
            return "completed"
        finally:
            await ans.pool.close()
            await p.close()

    assert run(go()) == "edge DRUM failed"


def test_a_page_completes_only_once_the_edge_drum_intake_log_holds_its_edges(tmp_path):
    """The edge DRUM writes its intake log on its own thread: with that thread held, a page's
    ``process`` (its lease's completion) waits though its links are logged, and its edge is not on
    disk; once released, it returns."""
    from crawlerd.frontier.budgets import Budgets
    from crawlerd.seen.intake_log import read_intake, segment_path, segments

    async def go():
        loop = asyncio.get_running_loop()
        p = Parts(str(tmp_path))
        ans = make(p)
        b = ans.budgets = Budgets(str(tmp_path / "budgets"), base_budget=2, per_inlink=2, max_budget=100,
                                  map_size_bytes=1 << 24, edge_buckets=2, edge_merge_bytes=1 << 20,
                                  edge_cache_entries=1 << 10, sync=False, mode="all")
        await ans.pool.start()
        p.seen.start(loop, p.intake.on_seen_results)
        b.start(loop)
        edges_dir = str(tmp_path / "budgets" / "edges")
        try:
            w = b.edges.intake_writer
            assert w is not None and w is not p.seen.intake_writer
            w.hold()
            url = "http://src.test/p"
            body = PAGE.replace(b'<a href="/next">', b'<a href="http://dst.test/x">')   # an edge src -> dst
            task = asyncio.ensure_future(ans.process(url, 7, "http://src.test", item(url), answer(url, body)))
            while p.seen.logged() is not None or not ans._links_flushes:
                await asyncio.sleep(0.01)   # its links logged, its edges handed over
            for _ in range(20):
                await asyncio.sleep(0.01)
            held_done = task.done()
            on_disk_held = [n for s in segments(edges_dir) for _, ks, _ in read_intake(segment_path(edges_dir, s))
                            for n in [len(ks)]]
            w.release()
            await asyncio.wait_for(task, 60)
            return held_done, on_disk_held, b.edges_logged(), b.edges.next_seq
        finally:
            await ans.pool.close()
            await b.close()
            await p.close()

    held_done, on_disk_held, logged, edges = run(go())
    assert edges == 1
    assert held_done is False and on_disk_held == []
    assert logged is None       # released: written (then handed to DRUM, which journals it)


def test_a_page_waiting_for_its_links_to_be_kept_holds_none_of_its_links(tmp_path):
    """While a page's lease waits for its links to be durable, its result and links are already
    let go: the collector's passes between callbacks do not walk them (gcpace)."""
    import gc

    from crawlerd.records import Link, ProcessResult

    class OnePool:
        async def process(self, res, prior=None, *, digest="", lookup=False, sitemap=None, ctx=None):
            links = [Link(f"http://x{j}.test/p", 100 + j, f"http://x{j}.test", j == 0) for j in range(5)]
            return ProcessResult(url=res.url, outcome=Outcome.OK, status=200, links=links,
                                 digest="sha1:GVVBSK3ZCOYEYVCXJUMMFDKG4Y4VIKFL", warc_file="w.warc.gz",
                                 warc_offset=0, warc_length=1, warc_record_id="<urn:uuid:1>")

    class HeldIntake:
        def __init__(self):
            self.kept = asyncio.get_running_loop().create_future()
            self.urls = []

        def submit_links(self, links, *, depth, hops=0, priority=None, page=False):
            self.urls += [ln.url for ln in links]       # what the seen-set keeps: no Link
            return len(links)

        def links_barrier(self):
            return None if self.kept.done() else self.kept

    async def go():
        p = Parts(str(tmp_path))
        intake = HeldIntake()
        ans = Answers(p.cfg, pool=OnePool(), digests=p.digests, near=p.near, recrawl=p.recrawl,
                      frontier=p.frontier, intake=intake, events=p.events, metrics=p.metrics)
        url = "http://a.test/one"
        try:
            task = asyncio.ensure_future(ans.process(url, 1, "http://a.test", item(url), answer(url, PAGE)))
            while not intake.urls:
                await asyncio.sleep(0)
            await asyncio.sleep(0)
            waiting = not task.done()
            gc.collect()            # earlier tests' cyclic garbage is not what this page holds
            alive = sum(1 for o in gc.get_objects() if isinstance(o, (Link, ProcessResult)))
            intake.kept.set_result(None)
            await task
            return waiting, alive, intake.urls, p.event_lines()
        finally:
            await p.close()

    waiting, alive, urls, events = run(go())
    assert waiting                  # the lease is at its wait
    assert alive == 0               # and holds no Link and no ProcessResult through it
    assert len(urls) == 4           # the followable links went to the seen-set first
    assert [e["links_out"] for e in events if e["kind"] == "page"] == [5]
