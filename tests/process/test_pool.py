"""WorkerPool with real worker processes: results, WARC read back by warcio, crashes, backpressure."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
import signal
from collections import Counter

import pytest
from warcio.archiveiterator import ArchiveIterator

from crawlerd._native.bodypool import BodyPool
from crawlerd.memtrace import ENV as TRACEMALLOC_ENV
from crawlerd.memtrace import MEMLOG_ENV
from crawlerd.outcome import Outcome
from crawlerd.process.pool import WorkerPool
from crawlerd.process.worker import PageProcessor
from crawlerd.process.worker_process import CRASH_ENV
from crawlerd.records import FetchResult
from crawlerd.store.encoding import payload_digest
from crawlerd.store.recover import recover_segment
from crawlerd.store.segment import OPEN_SUFFIX
from crawlerd.store.warc import WarcWriter
from crawlerd.url.canonical import fingerprint

T0 = 1_700_000_000.0
WORDS = ("crawler politeness frontier robots simhash digest segment archive bucket queue host page link "
         "parser worker shard budget lease fetch decode").split()


def page_html(i: int, n_links: int = 12, words: int = 300) -> bytes:
    rng = random.Random(i)
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    links = "".join(f'<li><a href="/p/{rng.randrange(1000)}.html">x</a></li>' for _ in range(n_links))
    return (f"<!DOCTYPE html><html><head><title>Page {i}</title></head><body><h1>Page {i}</h1>"
            f"<p>{text}</p><ul>{links}</ul><a href='http://other.test/'>o</a></body></html>").encode()


def chunk(body: bytes, size: int = 1000) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


def response(url: str, body: bytes, *, status: int = 200, ctype: str = "text/html; charset=utf-8",
             gz: bool = False, chunked: bool = False,
             extra: list[tuple[str, str]] | None = None) -> FetchResult:
    headers = [("Content-Type", ctype)] + list(extra or [])
    if gz:
        body = gzip.compress(body, mtime=0)
        headers.append(("Content-Encoding", "gzip"))
    if chunked:
        body = chunk(body)
        headers.append(("Transfer-Encoding", "chunked"))
    else:
        headers.append(("Content-Length", str(len(body))))
    reason = {200: "OK", 404: "Not Found"}.get(status, "X")
    head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    path = url.split("/", 3)[3] if url.count("/") >= 3 else ""
    req = f"GET /{path} HTTP/1.1\r\nHost: {url.split('/')[2]}\r\nUser-Agent: crawlerd-test\r\n\r\n"
    return FetchResult(url=url, outcome=Outcome.OK, status=status, ip="127.0.0.1", started_at=T0,
                       elapsed_s=0.01, request_head=req.encode(), response_head=head.encode(), body=body,
                       headers=headers)


def init_for(tmp_path, segment_max_bytes: int = 1 << 30) -> dict:
    return {"warc_dir": str(tmp_path / "warc"), "index_dir": str(tmp_path / "index"), "prefix": "t",
            "segment_max_bytes": segment_max_bytes, "shard": "0", "user_agent": "crawlerd-test/0.1",
            "agent_token": "crawlerd", "max_decoded_bytes": 1 << 20, "max_links": 5000}


def warc_records(warc_dir) -> list[tuple[str, str, str]]:
    """(type, target URI, file) of every record in every segment, read by warcio."""
    out = []
    for name in sorted(os.listdir(warc_dir)):
        with open(os.path.join(warc_dir, name), "rb") as f:
            for rec in ArchiveIterator(f):
                out.append((rec.rec_type, rec.rec_headers.get_header("WARC-Target-URI") or "", name))
    return out


def responses_per_url(warc_dir) -> Counter:
    return Counter(uri for kind, uri, _ in warc_records(warc_dir) if kind in ("response", "revisit"))


def record_at(warc_dir, name: str, offset: int):
    with open(os.path.join(warc_dir, name), "rb") as f:
        f.seek(offset)
        rec = next(iter(ArchiveIterator(f)))
        return rec, rec.rec_headers, rec.raw_stream.read()


class Recovering:
    """The shard's on_worker_death: close the dead worker's segment (torn tail cut)."""

    def __init__(self, index_dir: str):
        self.index_dir = index_dir
        self.calls: list[tuple[int, str]] = []

    def __call__(self, index: int, segment: str) -> None:
        self.calls.append((index, segment))
        if segment:
            recover_segment(segment, index_dir=self.index_dir)


async def wait_until(cond, what: str, rounds: int = 2000, poll_s: float = 0.005) -> None:
    """Let the loop run until ``cond()`` holds (each round waits for I/O up to ``poll_s``); bounded."""
    for _ in range(rounds):
        if cond():
            return
        await asyncio.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def test_results_match_in_process_and_warc_reads_back(tmp_path):
    init = init_for(tmp_path)
    cases = {
        "http://a.test/plain": response("http://a.test/plain", page_html(1)),
        "http://a.test/gzip": response("http://a.test/gzip", page_html(2), gz=True),
        "http://a.test/chunked": response("http://a.test/chunked", page_html(3), chunked=True),
        "http://a.test/both": response("http://a.test/both", page_html(4), gz=True, chunked=True),
        "http://a.test/missing": response("http://a.test/missing", b"<p>gone</p>", status=404),
        "http://a.test/img.png": response("http://a.test/img.png", b"\x89PNG....", ctype="image/png"),
        "http://a.test/nofollow": response("http://a.test/nofollow", page_html(5),
                                           extra=[("X-Robots-Tag", "nofollow")]),
        "http://a.test/badgzip": response("http://a.test/badgzip", b"not gzip at all",
                                          extra=[("Content-Encoding", "gzip")]),
    }
    dup = response("http://a.test/copy", page_html(1))
    prior = ("http://a.test/plain", T0 - 60)
    ref = PageProcessor(WarcWriter(str(tmp_path / "ref")), agent_token="crawlerd", max_decoded_bytes=1 << 20,
                        max_links=5000)

    async def run():
        pool = WorkerPool(2, init, jobs_per_worker=3)
        await pool.start()
        try:
            got = await asyncio.gather(*(pool.process(r) for r in cases.values()), pool.process(dup, prior))
        finally:
            await pool.close()
        return got

    got = asyncio.run(run())
    results = dict(zip([*cases, dup.url], got, strict=True))
    for url, res in cases.items():
        want = ref.process(res, prior=None)
        pr = results[url]
        assert (pr.outcome, pr.status, pr.links, pr.digest, pr.simhash, pr.noindex, pr.nofollow,
                pr.content_type) == (want.outcome, want.status, want.links, want.digest, want.simhash,
                                     want.noindex, want.nofollow, want.content_type), url
    plain = results["http://a.test/plain"]
    assert plain.outcome is Outcome.OK and len(plain.links) >= 5 and plain.simhash != 0
    assert "http://other.test/" in [ln.url for ln in plain.links]
    for coded in ("gzip", "chunked", "both"):     # decoded before parsing: same links as the plain page
        assert results[f"http://a.test/{coded}"].links and results[f"http://a.test/{coded}"].simhash
    assert results["http://a.test/nofollow"].links == [] and results["http://a.test/nofollow"].nofollow
    assert results["http://a.test/badgzip"].outcome is Outcome.BAD_ENCODING
    assert results["http://a.test/missing"].links == []
    # the digest is over the entity with the transfer coding removed, content coding kept
    assert results["http://a.test/chunked"].digest == payload_digest(page_html(3))
    assert results["http://a.test/both"].digest == payload_digest(gzip.compress(page_html(4), mtime=0))
    warc_dir = init["warc_dir"]
    assert not [n for n in os.listdir(warc_dir) if n.endswith(OPEN_SUFFIX)]
    for url, pr in results.items():
        rec, headers, content = record_at(warc_dir, pr.warc_file, pr.warc_offset)
        assert headers.get_header("WARC-Target-URI") == url
        assert headers.get_header("WARC-Payload-Digest") == pr.digest
        if url == dup.url:
            assert rec.rec_type == "revisit" and pr.duplicate_of == "http://a.test/plain"
            assert headers.get_header("WARC-Refers-To-Target-URI") == "http://a.test/plain"
        else:
            assert rec.rec_type == "response"
            assert content == cases[url].body       # exactly as received
    assert responses_per_url(warc_dir) == Counter(results.keys())
    kinds = Counter(kind for kind, _, _ in warc_records(warc_dir))
    assert kinds["metadata"] == len(results)     # one per capture
    metas = {}
    for name in sorted(os.listdir(warc_dir)):
        with open(os.path.join(warc_dir, name), "rb") as f:
            for rec in ArchiveIterator(f):
                if rec.rec_type == "metadata":
                    metas[rec.rec_headers.get_header("WARC-Target-URI")] = rec.content_stream().read()
    assert b"robots: nofollow" in metas["http://a.test/nofollow"]
    assert b"x-robots-tag: nofollow" in metas["http://a.test/nofollow"]
    assert b"outlink: http://other.test/" in metas["http://a.test/plain"]


def run_pool(tmp_path, jobs, *, workers=2, jobs_per_worker=4, segment_max_bytes=1 << 30, during=None,
             max_job_attempts=2):
    """Start a pool, submit ``jobs`` at once, run ``during(pool)`` concurrently, close; return results."""
    init = init_for(tmp_path, segment_max_bytes)
    recovering = Recovering(init["index_dir"])

    async def run():
        pool = WorkerPool(workers, init, jobs_per_worker=jobs_per_worker, on_worker_death=recovering,
                          max_job_attempts=max_job_attempts)
        await pool.start()
        try:
            tasks = [asyncio.ensure_future(pool.process(r)) for r in jobs]
            if during is not None:
                await during(pool, tasks)
            results = await asyncio.gather(*tasks)
        finally:
            await pool.close()
        return pool, results

    pool, results = asyncio.run(run())
    return pool, results, init, recovering


def test_sigkill_worker_holding_jobs_every_page_once(tmp_path):
    jobs = [response(f"http://k.test/p/{i}", page_html(i)) for i in range(40)]
    first, rest = jobs[:10], jobs[10:]
    killed: list[int] = []

    async def kill_one(pool, tasks):
        await wait_until(lambda: sum(t.done() for t in tasks) >= 5, "first answers")
        victim = pool.workers[0]
        os.kill(victim.proc.pid, signal.SIGSTOP)        # freeze it so it surely holds jobs
        # the rest are sent only now, while it is frozen: a job goes to the worker holding fewest
        # (ties to worker 0), so the frozen worker is handed one however fast the first ten went
        tasks.extend(asyncio.ensure_future(pool.process(r)) for r in rest)
        await wait_until(lambda: len(victim.outstanding) >= 1, "a job queued at the frozen worker")
        os.kill(victim.proc.pid, signal.SIGKILL)
        killed.append(victim.proc.pid)
        await wait_until(lambda: len(pool.pids()) == 2 and victim.proc.pid not in pool.pids(), "a replacement")

    pool, results, init, recovering = run_pool(tmp_path, first, segment_max_bytes=40_000, during=kill_one)
    assert pool.restarts == 1 and killed
    assert [r.url for r in results] == [j.url for j in jobs]
    assert all(r.outcome is Outcome.OK for r in results)
    assert recovering.calls and recovering.calls[0][0] == 0
    warc_dir = init["warc_dir"]
    assert not [n for n in os.listdir(warc_dir) if n.endswith(OPEN_SUFFIX)]
    assert responses_per_url(warc_dir) == Counter(j.url for j in jobs)
    for r in results:       # every answer's location is a record of its page
        _rec, headers, _ = record_at(warc_dir, r.warc_file, r.warc_offset)
        assert headers.get_header("WARC-Target-URI") == r.url


def test_crash_after_writing_before_answering_is_cut_and_poison_resolves_crashed(tmp_path, monkeypatch):
    """The hook exits after the page's records are flushed and before the answer: the worst moment."""
    monkeypatch.setenv(CRASH_ENV, r"/poison\b")
    jobs = [response(f"http://c.test/p/{i}", page_html(i)) for i in range(6)]
    jobs.insert(2, response("http://c.test/poison", page_html(99)))
    pool, results, init, recovering = run_pool(tmp_path, jobs, workers=1, jobs_per_worker=8,
                                               max_job_attempts=2)
    by_url = {r.url: r for r in results}
    assert by_url["http://c.test/poison"].outcome is Outcome.PROCESS_CRASHED
    assert "2 workers died" in by_url["http://c.test/poison"].error
    assert all(r.outcome is Outcome.OK for u, r in by_url.items() if u != "http://c.test/poison")
    assert pool.restarts == 2 and pool.crashed_jobs == 1 and len(recovering.calls) == 2
    counts = responses_per_url(init["warc_dir"])
    assert counts == Counter(j.url for j in jobs if "poison" not in j.url)     # cut: no torn or extra copy


def test_a_recovery_that_fails_neither_loses_jobs_nor_stops_the_restart(tmp_path, monkeypatch, caplog):
    """The dead worker's segment cannot be closed (say the disk is full): the restart goes on, every
    job is answered, and the segment left open is recovered at the next start, each page once."""
    monkeypatch.setenv(CRASH_ENV, r"/poison\b")
    jobs = [response(f"http://f.test/p/{i}", page_html(i)) for i in range(6)]
    jobs.insert(2, response("http://f.test/poison", page_html(99)))
    calls = []

    def failing_recovery(index: int, segment: str) -> None:
        calls.append(segment)
        raise OSError(28, "No space left on device", segment)

    init = init_for(tmp_path)

    async def run():
        pool = WorkerPool(1, init, jobs_per_worker=8, on_worker_death=failing_recovery, max_job_attempts=2)
        await pool.start()
        try:        # the first pages are answered before the poison comes: the dead worker's segment holds them
            first = await asyncio.gather(*(pool.process(r) for r in jobs[:2]))
            rest = await asyncio.gather(*(pool.process(r) for r in jobs[2:]))
        finally:
            await pool.close()
        return pool, first + rest

    pool, results = asyncio.run(run())
    by_url = {r.url: r for r in results}
    assert by_url["http://f.test/poison"].outcome is Outcome.PROCESS_CRASHED
    assert all(r.outcome is Outcome.OK for u, r in by_url.items() if u != "http://f.test/poison")
    assert pool.restarts == 2 and len(calls) == 2 and not pool.failed
    assert "closing its segment" in caplog.text
    assert [n for n in os.listdir(init["warc_dir"]) if n.endswith(OPEN_SUFFIX)]     # left open ...

    async def restart():
        again = WorkerPool(1, init)
        await again.start()
        await again.close()

    asyncio.run(restart())          # ... and closed by the next start's recovery
    assert not [n for n in os.listdir(init["warc_dir"]) if n.endswith(OPEN_SUFFIX)]
    assert responses_per_url(init["warc_dir"]) == Counter(j.url for j in jobs if "poison" not in j.url)


def test_backpressure_process_waits_for_a_free_slot(tmp_path):
    jobs = [response(f"http://b.test/p/{i}", page_html(i)) for i in range(3)]
    seen: dict[str, object] = {}

    async def frozen(pool, tasks):
        w = pool.workers[0]
        os.kill(w.proc.pid, signal.SIGSTOP)
        try:
            await wait_until(lambda: pool.outstanding() == 2, "two jobs in flight")
            for _ in range(20):
                await asyncio.sleep(0)
            seen["outstanding"] = pool.outstanding()
            seen["done"] = [t.done() for t in tasks]
        finally:
            os.kill(w.proc.pid, signal.SIGCONT)

    pool, results, _, _ = run_pool(tmp_path, jobs, workers=1, jobs_per_worker=2, during=frozen)
    assert seen == {"outstanding": 2, "done": [False, False, False]}     # the third waits, none dropped
    assert [r.outcome for r in results] == [Outcome.OK] * 3


def test_slots_go_to_waiters_in_order_and_a_cancelled_waiter_loses_no_slot(tmp_path):
    """The pool's own slot count (no asyncio.Semaphore): with the worker frozen, calls beyond its
    slots wait (``waiting``, ``behind``); a waiter cancelled before its turn, and one cancelled
    just after a slot was handed to it, give nothing up for good: every other call is answered,
    in the order they came, and afterwards every slot can be taken again at once."""
    jobs = [response(f"http://s.test/p/{i}", page_html(i)) for i in range(6)]
    init = init_for(tmp_path)
    seen: dict[str, object] = {}

    async def run():
        pool = WorkerPool(1, init, jobs_per_worker=2)
        await pool.start()
        tasks: list[asyncio.Future] = []
        answered: list[str] = []

        async def call(i):
            pr = await pool.process(jobs[i])
            answered.append(pr.url)
            if i == 0:
                # its slot was just handed to call 2 (call 3 left the line): call 2 gives up before
                # it runs, so the slot must go on to call 4
                tasks[2].cancel()
            return pr

        w = pool.workers[0]
        try:
            os.kill(w.proc.pid, signal.SIGSTOP)
            try:
                tasks.extend(asyncio.ensure_future(call(i)) for i in range(6))
                await wait_until(lambda: pool.outstanding() == 2 and pool.waiting == 4, "two held, four waiting")
                seen["behind"] = pool.behind
                tasks[3].cancel()                       # waiting: leaves the line
                await wait_until(lambda: pool.waiting == 3, "the cancelled waiter gone")
            finally:
                os.kill(w.proc.pid, signal.SIGCONT)
            await asyncio.gather(*tasks, return_exceptions=True)
            seen["cancelled"] = [t.cancelled() for t in tasks]
            seen["answered"] = answered
            seen["after"] = (pool.waiting, pool.held, pool.calls)
            # every slot is free again: with the worker frozen, as many calls as slots go out at once
            os.kill(w.proc.pid, signal.SIGSTOP)
            try:
                again = [asyncio.ensure_future(pool.process(response(f"http://s.test/q/{i}", page_html(i))))
                         for i in range(3)]
                await wait_until(lambda: pool.outstanding() == 2 and pool.waiting == 1, "both slots taken")
            finally:
                os.kill(w.proc.pid, signal.SIGCONT)
            seen["again"] = [r.outcome for r in await asyncio.gather(*again)]
            seen["total"] = pool.answered
        finally:
            await pool.close()

    asyncio.run(run())
    assert seen["behind"] is True                       # four waiting for two slots: fetch no more
    assert seen["cancelled"] == [False, False, True, True, False, False]
    assert seen["answered"] == [jobs[i].url for i in (0, 1, 4, 5)]
    assert seen["after"] == (0, 0, 0)
    assert seen["again"] == [Outcome.OK] * 3
    assert seen["total"] == 4 + 3


def test_jobs_that_arrive_together_are_answered_in_one_frame(tmp_path):
    jobs = [response(f"http://t.test/p/{i}", page_html(i)) for i in range(6)]

    async def together(pool, tasks):
        w = pool.workers[0]
        os.kill(w.proc.pid, signal.SIGSTOP)         # before the first job is sent: all six wait in its socket
        try:
            await wait_until(lambda: pool.outstanding() == 6, "six jobs sent")
        finally:
            os.kill(w.proc.pid, signal.SIGCONT)

    pool, results, _, _ = run_pool(tmp_path, jobs, workers=1, jobs_per_worker=8, during=together)
    assert [r.outcome for r in results] == [Outcome.OK] * 6
    assert (pool.answer_frames, pool.answers_framed) == (1, 6)


def test_jobs_sent_together_go_in_one_frame_and_are_served_in_order(tmp_path, monkeypatch):
    """The jobs of one loop iteration go to their worker in one ``jobs`` frame; a job whose body
    does not fit the body pool goes inline in a frame of its own, between them, and the worker still
    serves every job in the order sent (its records are in that order)."""
    from crawlerd.process import pool as pool_mod

    kinds: list[str] = []
    real_frame = pool_mod.frame

    def counting(msg):
        kinds.append(msg[0])
        return real_frame(msg)
    monkeypatch.setattr(pool_mod, "frame", counting)
    big = 3      # its body is larger than the whole body pool: inline
    bodies = BodyPool(8 * 8192)
    jobs = [response(f"http://o.test/p/{i}", page_html(i, words=12000 if i == big else 100)) for i in range(7)]
    assert len(jobs[big].body) > bodies.cap_bytes

    async def go():
        pool = WorkerPool(1, init_for(tmp_path), jobs_per_worker=8, body_pool=bodies)
        await pool.start()
        try:
            return await asyncio.gather(*[pool.process(r) for r in jobs])
        finally:
            await pool.close()

    try:
        results = asyncio.run(go())
    finally:
        bodies.close()
    assert [r.outcome for r in results] == [Outcome.OK] * 7
    assert [k for k in kinds if k in ("job", "jobs")] == ["jobs", "job", "jobs"]
    order = [uri for kind, uri, _ in warc_records(tmp_path / "warc") if kind == "response"]
    assert order == [r.url for r in jobs]


def test_close_times_out_a_stuck_worker_and_resolves_its_jobs(tmp_path):
    init = init_for(tmp_path)
    recovering = Recovering(init["index_dir"])

    async def run():
        pool = WorkerPool(1, init, jobs_per_worker=4, on_worker_death=recovering)
        await pool.start()
        first = await pool.process(response("http://s.test/1", page_html(1)))
        os.kill(pool.workers[0].proc.pid, signal.SIGSTOP)
        stuck = asyncio.ensure_future(pool.process(response("http://s.test/2", page_html(2))))
        await pool.close(timeout_s=0.5)
        return first, await stuck

    first, stuck = asyncio.run(run())
    assert first.outcome is Outcome.OK
    assert stuck.outcome is Outcome.PROCESS_CRASHED
    assert len(recovering.calls) == 1
    warc_dir = init["warc_dir"]
    assert not [n for n in os.listdir(warc_dir) if n.endswith(OPEN_SUFFIX)]
    assert responses_per_url(warc_dir) == Counter({"http://s.test/1": 1})


def test_start_closes_segments_a_dead_run_left_open(tmp_path):
    init = init_for(tmp_path)
    # worker 5 of an earlier run with more workers: still this shard's
    left = WarcWriter(init["warc_dir"], prefix="t", shard="0_w5", index_dir=init["index_dir"])
    res = response("http://old.test/", page_html(7))
    left.write_fetch(url=res.url, fetched_at=T0, ip=res.ip, request_head=res.request_head,
                     response_head=res.response_head, body=res.body)
    left.flush()            # then "crashed": the segment stays .open
    other = WarcWriter(init["warc_dir"], prefix="t", shard="10_w0", index_dir=init["index_dir"])
    other.write_fetch(url="http://other-shard.test/", fetched_at=T0, ip=res.ip, request_head=res.request_head,
                      response_head=res.response_head, body=res.body)
    other.flush()

    async def run():
        pool = WorkerPool(1, init)
        await pool.start()
        await pool.close()

    asyncio.run(run())
    names = os.listdir(init["warc_dir"])
    assert [n for n in names if n.endswith(OPEN_SUFFIX)] == [os.path.basename(other.current_path)]
    assert responses_per_url(init["warc_dir"])["http://old.test/"] == 1
    other.close()


def test_bad_sizes_refused():
    with pytest.raises(ValueError):
        WorkerPool(0, {})


@pytest.mark.parametrize("kill_after", [3, 17, 31])
def test_sigkill_at_any_moment_keeps_every_page_exactly_once(tmp_path, kill_after):
    """No freezing: the worker dies wherever it is (processing, flushing, answering, rotating)."""
    jobs = [response(f"http://r.test/p/{i}", page_html(i)) for i in range(48)]

    held: list[int] = []

    async def kill_running(pool, tasks):
        # checked at every turn of the loop, so the answers can't all be in before the kill
        await wait_until(lambda: sum(t.done() for t in tasks) >= kill_after
                         and any(w.outstanding for w in pool.workers), f"{kill_after} answers",
                         rounds=2_000_000, poll_s=0)
        victim = max(pool.workers, key=lambda w: len(w.outstanding))
        held.append(len(victim.outstanding))
        os.kill(victim.proc.pid, signal.SIGKILL)

    pool, results, init, _ = run_pool(tmp_path, jobs, jobs_per_worker=6, segment_max_bytes=30_000,
                                      during=kill_running)
    assert held[0] > 0 and pool.restarts == 1
    assert [r.outcome for r in results] == [Outcome.OK] * len(jobs)
    warc_dir = init["warc_dir"]
    assert not [n for n in os.listdir(warc_dir) if n.endswith(OPEN_SUFFIX)]
    assert responses_per_url(warc_dir) == Counter(j.url for j in jobs)
    for name in os.listdir(warc_dir):       # every closed segment has its CDXJ
        assert os.path.exists(os.path.join(init["index_dir"], name.removesuffix(".warc.gz") + ".cdxj"))


def test_near_duplicates_are_decided_before_the_records_are_written(tmp_path):
    """The pool asks its near_duplicate owner (one round trip per batch) before a worker archives a
    page with text; the answer is in the result and in the capture's metadata record."""
    from crawlerd.dedup.near import NearDuplicates
    init = init_for(tmp_path)
    pages = [response(f"http://a.test/v{i}", page_html(99) + b"<p>variant %d</p>" % i) for i in range(6)]
    pages.append(response("http://a.test/other", page_html(5)))
    pages.append(response("http://a.test/img.png", b"\x89PNG....", ctype="image/png"))     # no text: not asked
    asked = []

    async def run():
        with NearDuplicates(tmp_path / "dedup") as nd:
            def near(simhash, url):
                asked.append(url)
                return nd.check_and_add(simhash, url, "http://a.test")
            pool = WorkerPool(2, init, jobs_per_worker=4, near_duplicate=near)
            await pool.start()
            try:
                first = await pool.process(pages[0])        # the original is stored before the others come
                rest = await asyncio.gather(*(pool.process(r) for r in pages[1:]))
            finally:
                await pool.close()
            return [first, *rest]

    results = dict(zip([p.url for p in pages], asyncio.run(run()), strict=True))
    assert sorted(asked) == sorted(p.url for p in pages if p.url != "http://a.test/img.png")
    assert results["http://a.test/v0"].near_duplicate_of == ""
    assert all(results[f"http://a.test/v{i}"].near_duplicate_of == "http://a.test/v0" for i in range(1, 6))
    assert results["http://a.test/other"].near_duplicate_of == ""
    metas = {}
    warc_dir = init["warc_dir"]
    for name in sorted(os.listdir(warc_dir)):
        with open(os.path.join(warc_dir, name), "rb") as f:
            for rec in ArchiveIterator(f):
                if rec.rec_type == "metadata":
                    metas[rec.rec_headers.get_header("WARC-Target-URI")] = rec.content_stream().read()
    assert b"near-duplicate-of: http://a.test/v0" in metas["http://a.test/v3"]
    assert b"near-duplicate-of" not in metas["http://a.test/v0"]
    assert b"simhash: " in metas["http://a.test/other"] and b"simhash" not in metas["http://a.test/img.png"]


def test_near_duplicate_questions_can_be_answered_a_batch_at_a_time(tmp_path):
    """With ``near_duplicates`` the pool asks once per worker batch (every question of it, in
    order), and each page gets its own answer."""
    from crawlerd.dedup.near import NearDuplicates
    init = init_for(tmp_path)
    pages = [response(f"http://a.test/v{i}", page_html(99) + b"<p>variant %d</p>" % i) for i in range(6)]
    pages.append(response("http://a.test/other", page_html(5)))
    calls = []

    async def run():
        with NearDuplicates(tmp_path / "dedup") as nd:
            def near_many(batch):
                calls.append([url for _simhash, url in batch])
                with nd.batch():
                    return [nd.check_and_add(simhash, url, "http://a.test") for simhash, url in batch]
            pool = WorkerPool(1, init, jobs_per_worker=8)
            pool.near_duplicates = near_many
            await pool.start()
            try:
                first = await pool.process(pages[0])
                rest = await asyncio.gather(*(pool.process(r) for r in pages[1:]))
            finally:
                await pool.close()
            return [first, *rest]

    results = dict(zip([p.url for p in pages], asyncio.run(run()), strict=True))
    assert sorted(u for batch in calls for u in batch) == sorted(p.url for p in pages)
    assert len(calls) < len(pages)          # the later pages came in batches of several
    assert results["http://a.test/v0"].near_duplicate_of == ""
    assert all(results[f"http://a.test/v{i}"].near_duplicate_of == "http://a.test/v0" for i in range(1, 6))
    assert results["http://a.test/other"].near_duplicate_of == ""


def test_a_sitemap_job_is_archived_and_read_by_the_worker(tmp_path):
    """The crawl process never parses a sitemap: the worker archives it and sends back its reading."""
    urls = "".join(f"<url><loc>http://s.test/p/{i}</loc><lastmod>2023-11-14</lastmod></url>" for i in range(300))
    urlset = f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'
    index = ('<?xml version="1.0"?><sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
             '<sitemap><loc>http://s.test/more.xml</loc></sitemap>'
             '<sitemap><loc>http://elsewhere.test/x.xml</loc></sitemap></sitemapindex>')
    jobs = [response("http://s.test/sitemap.xml", urlset.encode(), ctype="application/xml", gz=True, chunked=True),
            response("http://s.test/index.xml", index.encode(), ctype="application/xml"),
            response("http://s.test/bad.xml", b"not gzip", ctype="application/xml",
                     extra=[("Content-Encoding", "gzip")]),
            response("http://s.test/gone.xml", b"no", status=404, ctype="text/plain")]

    async def run():
        pool = WorkerPool(1, init_for(tmp_path))
        await pool.start()
        try:
            return await asyncio.gather(*(pool.process(r, None, sitemap=(100, 1 << 20)) for r in jobs))
        finally:
            await pool.close()

    urlset_pr, index_pr, bad_pr, gone_pr = asyncio.run(run())
    got_urls, children, rejected, problem = urlset_pr.sitemap
    assert problem == "" and children == [] and rejected == 0
    assert [u for u, _, _ in got_urls] == [f"http://s.test/p/{i}" for i in range(100)]     # max_urls
    assert all(fp == fingerprint(u) for u, fp, _ in got_urls)          # ready for the seen-set
    assert all(lastmod == 1_699_920_000.0 for _, _, lastmod in got_urls)
    assert index_pr.sitemap[1] == ["http://s.test/more.xml"]      # same site only
    assert bad_pr.sitemap[3] == "undecodable"
    assert gone_pr.sitemap == ([], [], 0, "")
    archived = responses_per_url(tmp_path / "warc")
    assert all(archived[r.url] == 1 for r in jobs), archived


def test_workers_run_at_the_configured_niceness_above_the_crawl_loop(tmp_path):
    def niceness(pid: int) -> int:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[16])     # proc(5) field 19, "nice"

    async def run():
        pool = WorkerPool(1, {**init_for(tmp_path), "nice": 3})
        await pool.start()
        try:
            await pool.process(response("http://n.test/", page_html(1)))
            return [niceness(pid) for pid in pool.pids()]
        finally:
            await pool.close()

    assert asyncio.run(run()) == [min(19, os.nice(0) + 3)]     # the kernel caps niceness at 19


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH on this platform")
@pytest.mark.parametrize("batch", [True, False])
def test_workers_run_under_sched_batch_only_when_asked(tmp_path, batch):
    async def run():
        pool = WorkerPool(1, {**init_for(tmp_path), "batch": batch})
        await pool.start()
        try:
            await pool.process(response("http://b.test/", page_html(1)))    # the init frame was read
            return [os.sched_getscheduler(pid) for pid in pool.pids()]
        finally:
            await pool.close()

    assert asyncio.run(run()) == [os.SCHED_BATCH if batch else os.sched_getscheduler(0)]


def test_a_worker_logs_its_memory_and_traces_itself_only_when_asked(tmp_path, monkeypatch):
    # diagnosis: the debug switches reach the worker process (it inherits the environment)
    def serve(memtrace_dir, pages: int) -> str:
        async def run():
            pool = WorkerPool(1, {**init_for(tmp_path / memtrace_dir), "memtrace_dir": str(tmp_path / memtrace_dir)})
            await pool.start()
            try:
                for i in range(pages):      # one at a time: a batch each, so the log is due after each
                    pr = await pool.process(response(f"http://m.test/{memtrace_dir}/{i}", page_html(i)))
                    assert pr.outcome is Outcome.OK
                return pool.tag(0)
            finally:
                await pool.close()
        return asyncio.run(run())

    monkeypatch.delenv(MEMLOG_ENV, raising=False)
    monkeypatch.delenv(TRACEMALLOC_ENV, raising=False)
    serve("off", 3)
    assert not [n for n in os.listdir(tmp_path / "off") if n.startswith("worker-")]
    monkeypatch.setenv(MEMLOG_ENV, "0.000001")
    tag = serve("log", 5)
    with open(tmp_path / "log" / f"worker-{tag}.jsonl") as f:
        lines = [json.loads(x) for x in f]
    assert [x["pages"] for x in lines] == [1, 2, 3, 4, 5]
    assert all(x["rss_anon"] > 0 and x["arenas"] >= 1 for x in lines)
    monkeypatch.delenv(MEMLOG_ENV)
    monkeypatch.setenv(TRACEMALLOC_ENV, "0.000001")
    serve("traced", 3)
    assert [n for n in os.listdir(tmp_path / "traced" / f"worker-{tag}") if n.endswith(".snap")]


def pooled(r: FetchResult, bodies: BodyPool) -> FetchResult:
    """``r`` with its body moved into ``bodies``, as the fetcher hands it over."""
    body = bodies.put(r.body)
    assert body is not None
    r.body, r.pooled = b"", body
    return r


def response_payloads(warc_dir) -> dict[str, bytes]:
    """Target URI -> the raw HTTP body of its response record (as the wire carried it)."""
    out = {}
    for name in sorted(os.listdir(warc_dir)):
        with open(os.path.join(warc_dir, name), "rb") as f:
            for rec in ArchiveIterator(f):
                if rec.rec_type == "response":
                    out[rec.rec_headers.get_header("WARC-Target-URI")] = rec.raw_stream.read()
    return out


def test_a_pooled_body_goes_back_only_when_its_worker_answered(tmp_path):
    """While a worker holds a job (it asks the near-duplicate question before it archives) the
    body's blocks are taken; once answered they are free and a late read raises instead of
    returning whatever reuses them. The WARC holds each body exactly."""
    init = init_for(tmp_path)
    bodies = BodyPool(256 * 8192)
    originals = {f"http://r.test/p/{i}": page_html(i, words=3000 + 500 * i) for i in range(5)}
    jobs = {u: pooled(response(u, b), bodies) for u, b in originals.items()}
    asked = []

    def near(simhash, url):
        asked.append((url, jobs[url].pooled.released, bodies.used))
        return ""

    async def run():
        pool = WorkerPool(1, init, jobs_per_worker=1, near_duplicate=near, body_pool=bodies)
        await pool.start()
        try:
            return await asyncio.gather(*(pool.process(r) for r in jobs.values()))
        finally:
            await pool.close()

    try:
        results = asyncio.run(run())
        assert [r.outcome for r in results] == [Outcome.OK] * 5
        assert len(asked) == 5 and all(not released and used > 0 for _, released, used in asked)
        assert all(r.pooled.released for r in jobs.values()) and bodies.used == 0 and bodies.bodies == 0
        with pytest.raises(ValueError):
            jobs["http://r.test/p/0"].content()
        assert response_payloads(init["warc_dir"]) == originals
    finally:
        bodies.close()


def test_heap_bodies_go_through_the_pool_or_inline_when_it_is_full(tmp_path):
    """A body not in the pool is copied in at dispatch when it fits, else sent inline: with a pool
    of a few blocks some of each, and every body archived exactly."""
    init = init_for(tmp_path)
    bodies = BodyPool(12 * 8192)
    originals = {f"http://h.test/p/{i}": page_html(i, words=2000) for i in range(12)}

    async def run():
        pool = WorkerPool(2, init, jobs_per_worker=4, body_pool=bodies)
        await pool.start()
        try:
            results = await asyncio.gather(*(pool.process(response(u, b)) for u, b in originals.items()))
        finally:
            await pool.close()
        return pool, results

    try:
        pool, results = asyncio.run(run())
        assert [r.outcome for r in results] == [Outcome.OK] * 12
        assert pool.inline > 0 and bodies.pooled > 0 and bodies.used == 0
        assert response_payloads(init["warc_dir"]) == originals
    finally:
        bodies.close()


def test_a_respawned_worker_reads_a_resent_jobs_pooled_body(tmp_path, monkeypatch):
    """A worker dies holding jobs; the ones it did not start go to its successor, which maps the
    same pool and reads their bodies where the fetcher wrote them."""
    monkeypatch.setenv(CRASH_ENV, r"/poison\b")
    bodies = BodyPool(256 * 8192)
    originals = {f"http://c.test/p/{i}": page_html(i, words=1500) for i in range(6)}
    jobs = [pooled(response(u, b), bodies) for u, b in originals.items()]
    jobs.insert(1, pooled(response("http://c.test/poison", page_html(99)), bodies))
    init = init_for(tmp_path)
    recovering = Recovering(init["index_dir"])

    async def run():
        pool = WorkerPool(1, init, jobs_per_worker=8, on_worker_death=recovering, max_job_attempts=2,
                          body_pool=bodies)
        await pool.start()
        try:
            return pool, await asyncio.gather(*(pool.process(r) for r in jobs))
        finally:
            await pool.close()

    try:
        pool, results = asyncio.run(run())
        by_url = {r.url: r for r in results}
        assert pool.restarts == 2 and by_url.pop("http://c.test/poison").outcome is Outcome.PROCESS_CRASHED
        assert all(r.outcome is Outcome.OK for r in by_url.values())
        assert response_payloads(init["warc_dir"]) == originals
        assert all(j.pooled.released for j in jobs) and bodies.used == 0     # the poison page's too
    finally:
        bodies.close()
