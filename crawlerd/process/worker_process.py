"""A processing worker process: ``python -m crawlerd.process.worker_process --fd N``, started
by :class:`crawlerd.process.pool.WorkerPool` (which tells the whole protocol and its
invariants). It configures its :class:`PageProcessor` and its own WARC writer from the first
frame, then serves jobs in order, a batch of the jobs that arrived together at a time
(``MAX_BATCH`` at most): parse all, one near-duplicate question for the batch, then write and
flush the records and answer the batch in one frame (``crawlerd.process.wire``).

Exact duplicates. For a 200 (``lookup``) the worker takes the payload digest
(one pass over the entity) and, just before writing the job's records, looks
it up itself: in a read-only view of the digest set (``init["digest_dir"]``,
LMDB: many readers, the crawl process the one writer) and in the captures it
archived itself since start (so a copy later in the same batch is a revisit of
an earlier one). A match is written as an identical-payload-digest revisit
naming the first capture's URL, date and record id; the crawl process records
a first capture (with its record id) in the digest set once its answer is
back. A capture archived by another worker in the last moments can be missed:
the page is then archived in full instead of as a revisit (never a revisit of
a record that does not exist). For a 304 the crawl process, which holds the
recrawl state, passes ``prior``: the capture it confirms.

Testing hook: when the environment variable ``CRAWLERD_TEST_CRASH_PATTERN`` is
set (tests only), a worker exits (``os._exit``) on any job whose URL matches
that regular expression, after the job's records are flushed and before its
batch is answered: the worst moment for the WARC, standing for a page that
kills a worker.

Diagnosis (``init["memtrace_dir"]``, set by the shard): with ``CRAWLERD_TRACEMALLOC_S`` a worker
traces its own allocations into ``<memtrace_dir>/<worker tag>/`` (``crawlerd.memtrace.MemTrace``),
with ``CRAWLERD_WORKER_MEMLOG_S`` it appends its memory numbers against the pages it served to
``<memtrace_dir>/<worker tag>.jsonl`` (``MemLog``); both after answering a batch, both off unless set.
"""

from __future__ import annotations

import argparse
import gc
import mmap
import os
import pickle
import re
import socket
from collections import deque

from crawlerd.allocator import Trimmer
from crawlerd.bytecache import ByteLRU, slots_bytes, str_bytes
from crawlerd.memtrace import MemLog, MemTrace
from crawlerd.outcome import Outcome, storage_error
from crawlerd.process.sitemaps import read_sitemap
from crawlerd.process.wire import LEN, PROGRESS, BodyReader, FrameReader, fetch_result, results_frame
from crawlerd.records import PriorCapture, ProcessResult
from crawlerd.sched import batch_this_thread

CRASH_ENV = "CRAWLERD_TEST_CRASH_PATTERN"
_CRASH_EXIT = 70
MAX_BATCH = 32                      # jobs answered together at most


def not_archived(pr: ProcessResult, err: OSError, warc_dir: str) -> ProcessResult:
    """``pr`` marked as not archived because the WARC could not be written (the shard keeps the URL)."""
    pr.outcome = Outcome.PROCESS_ERROR
    pr.storage_error = storage_error(err, warc_dir)
    pr.error = f"not archived: {err.strerror or err}"
    pr.warc_file, pr.warc_offset, pr.warc_length = "", -1, 0
    pr.links = []
    return pr


# Estimated bytes of one own capture beyond its strings (CPython 3.11, 64-bit; crawlerd.bytecache):
# the PriorCapture (a slotted record of four fields) and its float.
_CAPTURE_BYTES = slots_bytes(4) + 24


class OwnCaptures:
    """The duplicate owner as a worker sees it: the digest set (committed by the crawl process)
    and, in front of it, the first captures this worker archived itself (not committed yet).
    Key: payload digest string; value: the first capture, with its record id. Invariant: an
    entry names a record already written (an own entry is added after ``archive``; it dies
    with the process, as do the records a crash cuts). Bounded in bytes (``cap_bytes``, a
    ``ByteLRU``): the oldest own entry is forgotten first; by then the crawl process has long
    committed it to the digest set, where the view finds it."""

    def __init__(self, digest_dir: str, cap_bytes: int = 4 << 20) -> None:
        from crawlerd.store.digest_set import DigestView
        self.view = DigestView(digest_dir) if digest_dir else None
        self.own = ByteLRU(cap_bytes)

    def owner(self, digest: str) -> PriorCapture | None:
        """The first archived capture of ``digest`` known here, or None."""
        hit = self.own.get(digest)
        if hit is None and self.view is not None:
            prev = self.view.owner(digest)
            if prev is not None:
                hit = PriorCapture(prev[0], float(prev[1]), prev[2])
        return hit

    def archived(self, digest: str, pr: ProcessResult, fetched_at: float) -> None:
        """``pr`` was archived as a response (the first capture of ``digest`` as far as we know)."""
        cap = PriorCapture(pr.url, fetched_at, pr.warc_record_id, digest)
        self.own.put(digest, cap, _CAPTURE_BYTES + str_bytes(digest) + str_bytes(pr.url)
                     + str_bytes(pr.warc_record_id))

    def memory(self) -> dict[str, int]:
        """Estimated bytes of the own entries against their cap."""
        return self.own.memory()

    def forget(self, digest: str, url: str) -> None:
        """The capture of ``url`` with ``digest`` was not archived after all (its flush failed)."""
        hit = self.own.get(digest)
        if hit is not None and hit.url == url:
            self.own.pop(digest)


def worker_main(fd: int, progress_fd: int = -1, bodies_fd: int = -1) -> int:
    """Serve jobs on socket ``fd`` until it closes or a ``close`` frame comes; return the exit status."""
    import signal

    from crawlerd.process.worker import PageProcessor
    from crawlerd.store import linesort
    from crawlerd.store.warc import WarcWriter
    # the crawl process runs the ordered shutdown; a worker ends when its socket closes
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    crash = os.environ.get(CRASH_ENV)
    crash_re = re.compile(crash) if crash else None
    progress = mmap.mmap(progress_fd, PROGRESS.size) if progress_fd >= 0 else None
    sock = socket.socket(fileno=fd)
    frames = FrameReader(sock)
    bodies: BodyReader | None = None
    processor: PageProcessor | None = None
    warc: WarcWriter | None = None
    segment_max_bytes = 0
    # thresholds: PageProcessor's tune_allocator (for speed); the trim below gives freed pages back
    trimmer = Trimmer()
    ask_near = False
    memtrace: MemTrace | None = None      # diagnosis only (module doc)
    memlog: MemLog | None = None
    served = 0                            # jobs answered since start (the memory log's x axis)
    held: deque = deque()       # frames that came while waiting for a near-duplicate answer

    def next_frame():
        msg = held.popleft() if held else frames.next()
        if msg is not None and msg[0] == "jobs":        # the jobs of one frame, one at a time, in order
            jobs = msg[1]
            held.extendleft(reversed(jobs[1:]))
            return jobs[0]
        return msg

    def ready() -> bool:
        return bool(held) or frames.ready()

    def near_answers(queries: list) -> dict | None:
        """Ask the crawl process about the batch's pages; None when it is gone."""
        data = pickle.dumps(("near", queries), protocol=pickle.HIGHEST_PROTOCOL)
        sock.sendall(LEN.pack(len(data)) + data)
        while True:
            msg = frames.next()
            if msg is None:
                return None
            if msg[0] == "near":
                return msg[1]
            held.append(msg)

    try:
        while True:
            msg = next_frame()
            if msg is None:
                break
            batch = [msg]
            while len(batch) < MAX_BATCH and msg[0] == "job" and ready():
                msg = next_frame()
                batch.append(msg)
            done = []           # (job_id, result, Analysis or the error it raised)
            for msg in batch:
                if msg[0] == "init":
                    init = msg[1]
                    trimmer = Trimmer(init.get("trim_interval_s", trimmer.interval_s))
                    if init.get("nice"):
                        os.nice(init["nice"])      # the shard loop first on a busy machine (process.worker_nice)
                    if init.get("batch"):
                        batch_this_thread()        # woken by a job frame, never preempts the loop (crawlerd.sched)
                    segment_max_bytes = init["segment_max_bytes"]
                    ask_near = bool(init.get("near_duplicates"))
                    if bodies_fd >= 0:
                        bodies = BodyReader(bodies_fd, *init["body_pool"])
                    # the writer never rotates by itself: this loop rotates after answering (module doc)
                    warc = WarcWriter(init["warc_dir"], prefix=init["prefix"], segment_max_bytes=1 << 62,
                                      shard=init["worker_tag"], user_agent=init["user_agent"],
                                      index_dir=init.get("index_dir") or None,
                                      index_sort_buffer_bytes=init.get("index_sort_buffer_bytes")
                                      or linesort.DEFAULT_BUFFER_BYTES,
                                      # the sort's lines would raise this process's arena high-water
                                      # mark at each rotation, and leave arenas behind (linesort doc)
                                      index_sort_in_child=True)
                    captures = OwnCaptures(init.get("digest_dir") or "",
                                           cap_bytes=init.get("captures_bytes") or 4 << 20)
                    processor = PageProcessor(warc, agent_token=init["agent_token"],
                                              max_decoded_bytes=init["max_decoded_bytes"],
                                              max_links=init["max_links"])
                    if init.get("memtrace_dir"):
                        tagged = os.path.join(init["memtrace_dir"], f"worker-{init['worker_tag']}")
                        memtrace = MemTrace.from_env(tagged)
                        memlog = MemLog.from_env(tagged + ".jsonl")
                    # start-up objects (modules, caches) leave the collector's view and gen-0 passes
                    # are rarer: a page makes few cycles, and each pass cost ~1.5% of a worker's CPU
                    gc.collect()
                    gc.freeze()
                    gc.set_threshold(50_000, 20, 100)
                elif msg[0] == "job":
                    _, job_id, meta, first, size, prior, digest, lookup, sitemap = msg
                    result = fetch_result(meta, bodies.get(first, size) if first >= 0 else meta[-1])
                    if progress is not None:
                        PROGRESS.pack_into(progress, 0, job_id)
                    try:
                        a = processor.analyse(result, prior=None if lookup else prior, digest=digest)
                        if sitemap is not None:
                            a.pr.sitemap = read_sitemap(result, *sitemap)
                        done.append((job_id, result, a, lookup))
                    except Exception as e:  # a bug must not take the page with it: record it by name
                        done.append((job_id, result, e, False))
            # near duplicates are decided by the crawl process before the records are written,
            # so each capture's metadata record can name the page it nearly duplicates
            queries = [(job_id, a.pr.simhash, result.url) for job_id, result, a, _ in done
                       if not isinstance(a, Exception) and a.asks_near] if ask_near else []
            near: dict = {}
            if queries:
                if progress is not None:
                    PROGRESS.pack_into(progress, 0, 0)      # waiting: no job is to blame
                try:
                    got = near_answers(queries)
                except (ConnectionResetError, BrokenPipeError):
                    got = None
                if got is None:
                    break             # the crawl process is gone: close the segment and exit quietly
                near = got
            answers = []
            for job_id, result, a, lookup in done:
                if progress is not None:
                    PROGRESS.pack_into(progress, 0, job_id)
                if isinstance(a, Exception):
                    pr = processor.archive_failed(result, f"{type(a).__name__}: {a}")
                else:
                    try:
                        if lookup:      # decided here, in order: an earlier job of the batch may own it
                            processor.revisit_of(a, captures.owner(a.pr.digest))
                        pr = processor.archive(a, near.get(job_id, ""))
                        if lookup and not pr.duplicate_of and pr.warc_file:
                            captures.archived(pr.digest, pr, result.started_at)
                    except OSError as e:    # the WARC could not be written (disk full, read-only, EIO)
                        pr = not_archived(ProcessResult(url=result.url, outcome=Outcome.PROCESS_ERROR,
                                                        status=result.status), e, init["warc_dir"])
                    except Exception as e:
                        pr = processor.archive_failed(result, f"{type(e).__name__}: {e}")
                if crash_re is not None and crash_re.search(result.url):
                    warc.flush()
                    os._exit(_CRASH_EXIT)   # test hook: records written, batch not answered
                answers.append((job_id, pr))
            if answers:
                trimmer.maybe_trim()    # parser and decoder buffers freed: give the pages back
                try:
                    warc.flush()    # answered records are on disk: a crash loses only unanswered ones
                except OSError as e:
                    # the writer cut its segment back and closed it: none of this batch is known archived
                    for _job_id, pr in answers:
                        if captures is not None and pr.digest:
                            captures.forget(pr.digest, pr.url)      # its record was cut back
                    answers = [(job_id, not_archived(pr, e, init["warc_dir"])) for job_id, pr in answers]
                segment = warc.current_path or ""
                size = warc.size        # flushed above: the segment's length on disk, without a stat
                data = results_frame(answers, segment, size)
                try:
                    sock.sendall(data)
                except (ConnectionResetError, BrokenPipeError):
                    break             # the crawl process is gone: close the segment and exit quietly
                if progress is not None:
                    PROGRESS.pack_into(progress, 0, 0)
                if size >= segment_max_bytes:
                    warc.close()        # the next record opens the next segment
                served += len(answers)
                if memtrace is not None:
                    memtrace.maybe_dump()
                if memlog is not None:
                    memlog.maybe_write(served)
            if batch[-1][0] == "close":
                break
    finally:
        if warc is not None:
            warc.close()
        sock.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description="crawlerd processing worker (started by the crawl process)")
    ap.add_argument("--fd", type=int, required=True, help="socket to the crawl process")
    ap.add_argument("--progress-fd", type=int, default=-1, help="memfd of the progress page")
    ap.add_argument("--bodies-fd", type=int, default=-1, help="memfd of the body pool (mapped read-only)")
    args = ap.parse_args()
    return worker_main(args.fd, args.progress_fd, args.bodies_fd)


if __name__ == "__main__":
    raise SystemExit(main())
