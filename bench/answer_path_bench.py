"""The crawl process's answer path per page, alone (issue 10; branch ans19).

Two parts, CPU seconds of the loop thread per page (min over ``--repeats``):

1. ``Answers.process`` with the shard's real stores (recrawl, digest set, near-duplicate store,
   event log, metrics; the first three write through a writer thread, whose CPU is not counted) and stand-ins for what belongs to others: the pool answers at once with a
   prepared processing result of ``--links`` links (as the worker's answer frame would give it),
   the intake takes the links and the redirects without filtering them (``Intake.submit_links`` is
   another component's cost), no budgets, no DUST. The figure includes decoding the page's
   answer (``wire.unpack_result``, also in part 2). Every page a new URL (a first visit, as most
   of an e2e crawl's pages are).
   Pages come ``--batch`` to a worker frame (their calls wait together and are answered at once,
   as ``WorkerPool`` answers a frame; ``--per-page``: a tree's ``Answers`` with ``batch=False``).
2. The pool's hand-over: a worker's answer frame of ``--batch`` results decoded and resolved
   as ``WorkerPool`` does it (``_Answers.data_received``), and the job frames of ``--batch`` pages
   as the tree's ``WorkerPool._dispatch`` and ``_flush_out`` make them (one frame per job before
   the twentieth pass, one per worker and loop iteration since).

Run it with each tree's Python to compare (the same script; run it from outside a source tree so
each Python imports its own crawlerd)::

    cd /tmp && /work/wt/ans19/.venv/bin/python /work/wt/ans19/bench/answer_path_bench.py
    cd /tmp && /work/wt/integ18/.venv/bin/python /work/wt/ans19/bench/answer_path_bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import pickle
import tempfile
import time

import crawlerd
from crawlerd import config
from crawlerd.dedup.near import NearDuplicates
from crawlerd.frontier import QueuedURL
from crawlerd.frontier.recrawl import Recrawl
from crawlerd.metrics import Metrics
from crawlerd.outcome import Outcome
from crawlerd.process import pool as pool_mod
from crawlerd.process import wire
from crawlerd.records import FetchResult, Link, ProcessResult
from crawlerd.shard.answers import Answers
from crawlerd.shard.events import FetchEvents
from crawlerd.store import sha1_base32
from crawlerd.store.digest_set import DigestSet
from crawlerd.store.writer import WriteThread

HEADERS = [("Date", "Fri, 04 Dec 2026 09:00:00 GMT"), ("Server", "simweb"),
           ("Content-Type", "text/html; charset=utf-8"), ("Content-Length", "20000"),
           ("Connection", "keep-alive"), ("ETag", '"5f1c-abc"'),
           ("Last-Modified", "Fri, 04 Dec 2026 08:00:00 GMT"), ("Cache-Control", "max-age=60")]


def fetch_result(i: int) -> FetchResult:
    url = f"http://h{i % 5000}.example.com/p/{i}.html"
    head = "HTTP/1.1 200 OK\r\n" + "".join(f"{k}: {v}\r\n" for k, v in HEADERS) + "\r\n"
    req = f"GET /p/{i}.html HTTP/1.1\r\nHost: h{i % 5000}.example.com\r\nUser-Agent: crawlerd/1.0\r\n\r\n"
    return FetchResult(url=url, outcome=Outcome.OK, status=200, ip="127.0.0.1", started_at=1.7e9 + i * 1e-3,
                       elapsed_s=0.012, request_head=req.encode(), response_head=head.encode(),
                       body=b"x" * 20000, headers=list(HEADERS))


def process_result(i: int, links: int) -> ProcessResult:
    """Half the links relative (the page's own host key, one object, as the resolver gives it),
    half absolute to 7 other hosts (a key object each, as the resolver gives them)."""
    own = f"http://h{i % 5000}.example.com"
    ls = [Link(f"{own}/some/path/{i}/{j}.html", (i * 1000003 + j * 7919) & (2**64 - 1), own, j % 9 == 0)
          if j % 2 else
          Link(f"http://h{(i + j) % 7}.example.com/some/path/{i}/{j}.html", (i * 1000003 + j * 7919) & (2**64 - 1),
               f"http://h{(i + j) % 7}.example.com", j % 9 == 0) for j in range(links)]
    return ProcessResult(url=f"http://h{i % 5000}.example.com/p/{i}.html", outcome=Outcome.OK, status=200, links=ls,
                         content_type="text/html", digest="sha1:" + sha1_base32(hashlib.sha1(b"%d" % i).digest()),
                         simhash=(i * 0x9E3779B97F4A7C15) & (2**64 - 1),
                         warc_file="/data/warc/crawl-20261204090000000000-00001-0_w0.warc.gz.open",
                         warc_offset=1000 * i, warc_length=9876,
                         warc_record_id=f"<urn:uuid:12345678-1234-1234-1234-{i:012d}>")


def _pack(pr: ProcessResult) -> bytes:
    """A one-answer frame's pickle as the tree's worker writes it (decoded by ``_unpack``)."""
    if hasattr(wire, "results_frame"):      # links as columns (wire24)
        return wire.results_frame([(0, pr)], "seg", 123)[wire.LEN.size:]
    try:
        return pickle.dumps(wire.pack_result(pr, {}), protocol=5)
    except TypeError:       # a tree before host keys were shared
        return pickle.dumps(wire.pack_result(pr), protocol=5)


def _unpack(data: bytes) -> ProcessResult:
    if hasattr(wire, "unpack_results"):
        return wire.unpack_results(pickle.loads(data))[0][0][1]
    return wire.unpack_result(pickle.loads(data))


class _Pool:
    """Answers the calls waiting in it as one worker frame, each with its prepared answer decoded as
    ``WorkerPool`` decodes a worker's; as ``WorkerPool._on_answer``, a tree whose ``Answers`` set an
    ``on_frame`` hook gets the frame's answers in one call first (twentieth pass)."""

    def __init__(self, answers: list[bytes]):
        self.answers = answers
        self.on_frame = None
        self.waiting: list[tuple[object, asyncio.Future]] = []

    async def process(self, res, prior=None, *, digest="", lookup=False, sitemap=None, ctx=None):
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append((ctx, fut))
        return await fut

    def answer(self) -> None:
        waiting, self.waiting = self.waiting, []
        answered = [(ctx, _unpack(self.answers.pop()), fut) for ctx, fut in waiting]
        if self.on_frame is not None:
            self.on_frame([(ctx, pr) for ctx, pr, _ in answered if ctx is not None])
        for _ctx, pr, fut in answered:
            fut.set_result(pr)


class _Intake:
    def submit_links(self, links, *, depth, hops=0, priority=None, page=False):
        return len(links)

    def submit_urls(self, urls, **kw):
        return len(urls)

    def links_barrier(self):
        return None


async def _answer_all(ans: Answers, results: list[FetchResult], items: list[QueuedURL], batch: int) -> float:
    """Loop-thread CPU seconds of ``ans.process`` for every result, ``batch`` pages per worker frame
    (their calls wait in the pool together, answered at once), the stores writing through a writer
    thread as in a crawl (its CPU is not counted)."""
    stores = (ans.recrawl, ans.digests, ans.near)
    writer = WriteThread(asyncio.get_running_loop())
    for store in stores:
        store.attach_writer(writer)
    gc.collect()
    gc.freeze()             # the prepared pages are not the path's objects: out of the collector's view
    t0 = time.thread_time()
    for i in range(0, len(results), batch):
        tasks = [asyncio.ensure_future(ans.process(res.url, hash(res.url) & (2**64 - 1), it.host_key, it, res))
                 for res, it in zip(results[i:i + batch], items[i:i + batch], strict=True)]
        while len(ans.pool.waiting) < len(tasks):
            await asyncio.sleep(0)
        ans.pool.answer()
        for task in tasks:
            await task
    took = time.thread_time() - t0
    gc.unfreeze()
    ans.recrawl.commit()
    done = asyncio.get_running_loop().create_future()
    writer.barrier(lambda: done.set_result(None))
    await done
    for store in stores:
        store.attach_writer(None)
    writer.close()
    return took


def bench_process(pages: int, links: int, repeats: int, batch: int, per_page: bool) -> float:
    best = float("inf")
    for r in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            cfg = config.load(None, [f"crawl.data_dir={d!r}", "process.workers=1"])
            recrawl = Recrawl(cfg.path("recrawl"), map_size_bytes=1 << 28, clock=time.time)
            digests = DigestSet(cfg.path("dedup", "digests"), map_size_bytes=1 << 26)
            near = NearDuplicates(cfg.path("dedup"))
            events = FetchEvents(cfg.path("events"), wall=time.time)
            base = r * pages
            pool = _Pool([_pack(process_result(base + i, links))
                          for i in reversed(range(pages))])
            kw = {"batch": False} if per_page else {}       # a tree before frames as batches: page by page
            ans = Answers(cfg, pool=pool, digests=digests, near=near, recrawl=recrawl, frontier=None,
                          intake=_Intake(), events=events, metrics=Metrics(), **kw)
            results = [fetch_result(base + i) for i in range(pages)]
            items = [QueuedURL(url=res.url, host_key=res.url.rsplit("/", 2)[0], depth=1) for res in results]
            best = min(best, asyncio.run(_answer_all(ans, results, items, batch)) / pages)
            events.close()
            near.close()
            digests.close()
            recrawl.close()
    return best * 1e6


def bench_handover(pages: int, links: int, batch: int, repeats: int) -> dict[str, float]:
    prs = [process_result(i, links) for i in range(batch)]
    columns = hasattr(wire, "results_frame")
    if columns:     # links as columns (wire24)
        data = wire.results_frame(list(enumerate(prs)), "seg", 123)
    else:
        try:        # as the tree's worker packs a frame (host keys shared within it, where it does)
            host_keys: dict[str, str] = {}
            packed = [(i, wire.pack_result(pr, host_keys)) for i, pr in enumerate(prs)]
        except TypeError:
            packed = [(i, wire.pack_result(pr)) for i, pr in enumerate(prs)]
        data = wire.frame(("results", packed, "seg", 123))
    frames = max(1, pages // batch)
    got: list = []

    class _W:
        answered = 0
        segment = ""
        acked_bytes = 0

        class ring:
            @staticmethod
            def release(job_id):
                pass

    def on_frame(msg):
        # what WorkerPool._on_answer does per answer, less the futures
        if columns:
            got.extend(pr for _job_id, pr in wire.unpack_results(msg)[0])
            return
        for _job_id, packed in msg[1]:
            got.append(wire.unpack_result(packed))
    best_answer = best_job = float("inf")
    for _ in range(repeats):
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        proto = loop.run_until_complete(_make_answers(on_frame))
        gc.collect()
        t0 = time.process_time()
        for _ in range(frames):
            proto.data_received(data)
            got.clear()
        best_answer = min(best_answer, (time.process_time() - t0) / (frames * batch))
        loop.close()
        best_job = min(best_job, _job_frames(frames, batch))
    return {"answer frame decode": best_answer * 1e6, "job frame": best_job * 1e6}


class _Ring:
    @staticmethod
    def put(job_id, body):
        return 0            # every body in the ring


class _Transport:
    @staticmethod
    def is_closing():
        return False

    @staticmethod
    def write(data):
        pass


class _Worker:
    """What ``WorkerPool._dispatch`` and ``_flush_out`` touch of a worker."""

    def __init__(self):
        self.alive, self.outstanding, self.ring, self.transport = True, {}, _Ring, _Transport
        self.out, self.jobs = [], []


def _job_frames(frames: int, batch: int) -> float:
    """CPU seconds per job of the tree's ``WorkerPool._dispatch`` for ``batch`` jobs, then its
    ``_flush_out`` (the iteration's write, to a transport that drops it): the job frames as the tree
    makes them."""
    loop = asyncio.new_event_loop()
    pool = pool_mod.WorkerPool(1, {})
    pool._loop = loop
    w = _Worker()
    pool._workers = [w]
    results = [fetch_result(i) for i in range(batch)]
    fut = loop.create_future()
    job_class = getattr(pool_mod, "Job", None) or pool_mod._Job      # a tree before it moved
    t0 = time.process_time()
    for _ in range(frames):
        pool._flush_scheduled = True        # no call_soon: _flush_out is called below
        for i, r in enumerate(results):
            pool._dispatch(job_class(i, r, None, fut, "", True, None))
        pool._flush_out()
        w.outstanding.clear()
    took = time.process_time() - t0
    loop.close()
    return took / (frames * batch)


async def _make_answers(on_frame):
    reader = getattr(wire, "AnswerReader", None) or pool_mod._Answers     # a tree before it moved
    return reader(on_frame)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=20_000)
    ap.add_argument("--links", type=int, default=40, help="links per page")
    ap.add_argument("--batch", type=int, default=20, help="answers per answer frame (e2e: ~20)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--per-page", action="store_true", help="Answers(batch=False): the per-page path")
    args = ap.parse_args()
    out = {"tree": os.path.dirname(os.path.dirname(crawlerd.__file__)),
           "Answers.process us/page": bench_process(args.pages, args.links, args.repeats, args.batch,
                                                    args.per_page)}
    out.update({f"{k} us/page": v for k, v in bench_handover(args.pages, args.links, args.batch,
                                                              args.repeats).items()})
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    main()
