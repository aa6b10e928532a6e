"""Processing worker pool: N processes do the CPU work on fetched responses.

Each worker is a ``python -m crawlerd.process.pool --fd N`` child joined to the
crawl process by a Unix socketpair carrying length-prefixed pickles of plain
tuples. The first frame configures its :class:`PageProcessor` and its own WARC
writer (segment files named with the worker's tag ``<shard>_w<index>``, so
workers never share a file). A job's response body does not go through the
socket: it is copied once into a shared-memory ring (:mod:`crawlerd.process.ring`)
and the frame names its offset. Frames queued during one loop iteration go out
in one write. A worker handles its jobs one at a time in the order sent and
answers in that order. Jobs that arrive together are handled as a batch: their
records are flushed once and their answers sent in one frame (fewer syscalls
and wake-ups under load); the crawl process reads answers in a protocol
callback, every complete frame of a read at once.

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

Key: job id -> job. Invariant: a submitted job is in exactly one worker's
``outstanding`` map (a live worker's, or a dead one's until its death is
handled) or in the pool's ``backlog`` (while no worker is alive) until its
result comes back; then its future is resolved exactly once.

Crashes. A worker that dies is restarted. Before it starts a job, a worker
writes the job id into an 8-byte shared page (a memfd both processes map), so
only the job it was working on is blamed; the others it held are sent again,
unpenalised. A job blamed ``max_job_attempts`` times resolves with outcome
``process_crashed`` (poison page): none is silently lost. The WARC
stays exactly-once: each answer carries the segment and its size after the
job's records were flushed, and before a dead worker's segment is recovered
(``on_worker_death`` -> ``recover_segment``), records past the last answered
size are cut (those jobs run again elsewhere); a segment it opened without
answering for anything in it is removed. A worker rotates its segment only
after answering, so an answered record never sits in a segment that was closed
before the answer.

A worker that dies before starting any job ``MAX_START_DEATHS`` times in a row is not started
again: the pool has failed (``failed``, ``raise_if_failed``) and the crawl stops with that
reason instead of restarting workers in a loop while it reports "running".

Near duplicates. A worker first parses every job of a batch, then (if the pool
has a ``near_duplicate`` callback) sends one ``("near", [(job id, simhash, url)])``
frame and waits for the crawl process's answers before it writes any record, so
a capture's metadata record can name the stored page it nearly duplicates. One
round trip per batch; frames that arrive meanwhile are held and handled next.

Backpressure: ``process()`` waits for a free slot (``jobs_per_worker`` per
worker); ``calls`` counts the calls waiting or in a worker. The shard keeps the
lease of a response until it is processed (its transfer slot is free once the
transfer ends) and stops leasing while ``waiting`` reaches ``capacity``
(``behind``), so a slow pool stops new fetches instead of growing a queue of
fetched, unarchived responses (RAM, and the work a kill -9 makes the crawl redo);
no answer is dropped.

Testing hook: when the environment variable ``CRAWLERD_TEST_CRASH_PATTERN`` is
set (tests only), a worker exits (``os._exit``) on any job whose URL matches
that regular expression, after the job's records are flushed and before its
batch is answered: the worst moment for the WARC, standing for a page that
kills a worker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import mmap
import os
import pickle
import re
import socket
import struct
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field

from crawlerd.bytecache import ByteLRU, slots_bytes, str_bytes
from crawlerd.child import child_env, python_argv
from crawlerd.metrics import TRIM_INTERVAL_S, malloc_trim, proc_cpu_s
from crawlerd.outcome import Outcome, storage_error
from crawlerd.process.ring import BodyRing
from crawlerd.records import FetchResult, Link, PriorCapture, ProcessResult
from crawlerd.store.cdxj import cdxj_path
from crawlerd.store.recover import recover_segment
from crawlerd.store.segment import OPEN_SUFFIX

log = logging.getLogger("crawlerd.pool")

_LEN = struct.Struct("!I")
MAX_FRAME = 1 << 30
CRASH_ENV = "CRAWLERD_TEST_CRASH_PATTERN"
_CRASH_EXIT = 70
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._]+")      # as the WARC writer cleans segment name parts
_RESPAWN_DELAY_S = (0.0, 0.1, 0.3, 1.0, 3.0)       # after deaths in a row with no answer in between
_STARTED = struct.Struct("<q")      # the progress page: id of the job the worker is working on (0: none)
_MAX_BATCH = 32                     # jobs answered together at most
MAX_START_DEATHS = 3                # workers dying in a row before starting any job: the pool has failed
RING_BYTES = 32 << 20               # shared-memory body ring per worker (bodies that do not fit go inline)


class PoolFailed(RuntimeError):
    """The processing workers keep dying before they start any job."""


def default_workers(configured: int, shards: int = 1) -> int:
    """One shard's workers: ``process.workers`` in all (0: cores - shards, at least one per
    shard) shared out evenly among ``shards``."""
    total = configured if configured > 0 else max(shards, (os.cpu_count() or 2) - shards)
    return max(1, round(total / shards))


@dataclass
class _Job:
    job_id: int
    result: FetchResult
    prior: PriorCapture | None
    future: asyncio.Future
    digest: str = ""            # payload digest if the caller has it (saves the worker a pass)
    lookup: bool = False        # the worker finds the duplicate owner itself (module doc)
    crashes: int = 0            # workers that died while working on this job


class _Answers(asyncio.Protocol):
    """The crawl process's end of one worker's socket: parses every complete frame of each read.

    Invariant: ``buf[pos:]`` is the unparsed tail (a partial frame at most)."""

    def __init__(self, on_frame) -> None:
        self.on_frame = on_frame
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future = asyncio.get_running_loop().create_future()
        self.error: Exception | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, n = 0, len(buf)
        try:
            while n - pos >= _LEN.size:
                (size,) = _LEN.unpack_from(buf, pos)
                if size > MAX_FRAME:
                    raise pickle.UnpicklingError(f"frame of {size} bytes")
                end = pos + _LEN.size + size
                if end > n:
                    break
                msg = pickle.loads(memoryview(buf)[pos + _LEN.size:end])
                pos = end
                self.on_frame(msg)
        except (pickle.UnpicklingError, EOFError, ValueError) as e:
            self.error = e
            del buf[:]
            if self.transport is not None:
                self.transport.close()
            return
        del buf[:pos]

    def connection_lost(self, exc) -> None:
        if not self.closed.done():
            self.closed.set_result(exc or self.error)


@dataclass
class _Worker:
    index: int
    generation: int
    proc: subprocess.Popen
    transport: asyncio.Transport
    answers: _Answers
    progress: mmap.mmap          # the worker's progress page (see module doc)
    ring: BodyRing
    outstanding: dict[int, _Job] = field(default_factory=dict)   # in the order sent
    alive: bool = True
    segment: str = ""          # .open segment named in the last answer
    acked_bytes: int = 0       # its size once that answer's records were flushed
    answered: int = 0
    reader_task: asyncio.Task | None = None
    out: list[bytes] = field(default_factory=list)       # frames waiting for this iteration's write


class WorkerPool:
    """``workers`` processing processes; ``init`` configures each (see ``worker_main``)."""

    def __init__(self, workers: int, init: dict, *, jobs_per_worker: int = 32, max_job_attempts: int = 2,
                 on_worker_death=None, near_duplicate=None, ring_bytes: int = RING_BYTES):
        if workers < 1 or jobs_per_worker < 1 or max_job_attempts < 1:
            raise ValueError("workers, jobs_per_worker and max_job_attempts must be >= 1")
        self.n = workers
        self.init = init
        self.jobs_per_worker = jobs_per_worker
        self.max_job_attempts = max_job_attempts
        self.on_worker_death = on_worker_death
        self.near_duplicate = near_duplicate        # (simhash, url) -> near-duplicate URL or "" (module doc)
        self.ring_bytes = ring_bytes
        self._flush_scheduled = False
        self._workers: list[_Worker | None] = [None] * workers
        self._slots = asyncio.Semaphore(workers * jobs_per_worker)
        self.capacity = workers * jobs_per_worker     # jobs the workers hold at once
        self.waiting = 0                              # process() calls waiting for one of those slots
        self.held = 0                                 # process() calls holding one (in a worker or its backlog)
        self.answered = 0                             # process() calls answered so far
        self._backlog: deque[_Job] = deque()
        self._jobs: dict[int, _Job] = {}        # every job whose process() call has not returned
        self._next_id = 0
        self._closing = False
        self._quick_deaths = 0
        self._start_deaths = 0
        self.failed = ""                # why the pool gave up (workers that cannot start), or ""
        self.restarts = 0
        self.crashed_jobs = 0
        self.final_cpu_s: dict[int, float] = {}     # worker pid -> CPU s, read just before it exits

    def tag(self, index: int) -> str:
        """Worker ``index``'s tag, the last part of its segment names."""
        return _UNSAFE_NAME.sub("_", f"{self.init.get('shard', '0')}_w{index}")

    async def start(self) -> None:
        """Close segments an earlier run of this shard's workers left open, then start the workers."""
        for path in self._open_segments(None):
            for line in recover_segment(path, index_dir=self.init.get("index_dir") or None):
                log.warning("segment recovery at start: %s", line)
        for i in range(self.n):
            self._workers[i] = await self._spawn(i, 0)

    async def _spawn(self, index: int, generation: int) -> _Worker:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        init = dict(self.init, worker_tag=self.tag(index), ring_bytes=self.ring_bytes,
                    near_duplicates=self.near_duplicate is not None)
        page_fd = os.memfd_create(f"crawlerd-{self.tag(index)}-progress")
        ring = BodyRing(self.ring_bytes, f"crawlerd-{self.tag(index)}-ring")
        try:
            os.ftruncate(page_fd, _STARTED.size)
            progress = mmap.mmap(page_fd, _STARTED.size)
            # -P and PYTHONPATH: the worker imports this very package, never a crawlerd/ in the cwd
            proc = subprocess.Popen(python_argv("crawlerd.process.pool", "--fd", str(child.fileno()),
                                                "--progress-fd", str(page_fd), "--ring-fd", str(ring.fd)),
                                    pass_fds=[child.fileno(), page_fd, ring.fd], stdin=subprocess.DEVNULL,
                                    env=child_env())
        except BaseException:
            ring.close()
            raise
        finally:
            os.close(page_fd)
            child.close()
        loop = asyncio.get_running_loop()
        holder: list[_Worker] = []
        transport, answers = await loop.create_unix_connection(
            lambda: _Answers(lambda msg: self._on_answer(holder[0], msg)), sock=parent)
        w = _Worker(index, generation, proc, transport, answers, progress, ring)
        holder.append(w)
        transport.write(_frame(("init", init)))
        w.reader_task = asyncio.ensure_future(self._watch(w))
        return w

    def raise_if_failed(self) -> None:
        """PoolFailed when the workers cannot start (see ``failed``)."""
        if self.failed:
            raise PoolFailed(self.failed)

    @property
    def workers(self) -> list[_Worker]:
        return [w for w in self._workers if w is not None]

    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [w.proc.pid for w in self.workers if w.alive]

    def cpu_s(self) -> dict[int, float]:
        """CPU seconds per worker process (live, or as last read before exit)."""
        out = dict(self.final_cpu_s)
        for w in self.workers:
            cpu = proc_cpu_s(w.proc.pid)
            if cpu is not None:
                out[w.proc.pid] = cpu
        return out

    @property
    def calls(self) -> int:
        """``process()`` calls not returned yet: waiting for a slot or in a worker (the processing queue)."""
        return self.waiting + self.held

    @property
    def behind(self) -> bool:
        """More fetched responses wait for a worker than the workers hold: fetch no more for now."""
        return self.waiting >= self.capacity

    def outstanding(self) -> int:
        """Jobs sent to a worker (or waiting for one) and not answered yet."""
        return sum(len(w.outstanding) for w in self.workers) + len(self._backlog)

    async def process(self, result: FetchResult, prior: PriorCapture | None = None, *,
                      digest: str = "", lookup: bool = False) -> ProcessResult:
        """Process one response in a worker; waits for a free slot (backpressure).

        ``prior``: the capture this one revisits (exact-duplicate owner, or the capture a 304 confirms), or None.
        ``digest``: its payload digest (``entity_digest``) when the caller computed it already.
        ``lookup``: ignore ``prior``; the worker looks the digest up (``init["digest_dir"]`` and its
        own captures) and the result's ``duplicate_of`` tells what it found.
        """
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.held += 1
        try:
            loop = asyncio.get_running_loop()
            self._next_id += 1
            job = _Job(self._next_id, result, prior, loop.create_future(), digest, lookup)
            self._jobs[job.job_id] = job
            try:
                self._dispatch(job)
                return await job.future
            finally:
                del self._jobs[job.job_id]
                self.answered += 1
        finally:
            self.held -= 1
            self._slots.release()

    def _dispatch(self, job: _Job) -> None:
        live = [w for w in self._workers if w is not None and w.alive]
        if not live:
            self._backlog.append(job)       # sent when a worker is back
            return
        w = min(live, key=lambda w: len(w.outstanding))
        w.outstanding[job.job_id] = job
        r = job.result
        body = r.body
        offset = w.ring.put(job.job_id, body)
        meta = (r.url, r.outcome.value, r.status, r.ip, r.started_at, r.elapsed_s, r.request_head,
                r.response_head, r.headers, r.error, b"" if offset >= 0 else body)
        w.out.append(_frame(("job", job.job_id, meta, offset, len(body), job.prior, job.digest, job.lookup)))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_out)

    def _flush_out(self) -> None:
        """Write each worker's queued frames in one go (one syscall per worker per loop iteration)."""
        self._flush_scheduled = False
        for w in self._workers:
            if w is not None and w.out:
                data = b"".join(w.out)
                w.out.clear()
                if w.alive and not w.transport.is_closing():
                    w.transport.write(data)

    def _on_answer(self, w: _Worker, msg) -> None:
        """One frame from a worker: a near-duplicate question, or a batch of (job id, packed result)
        answered after its records were flushed."""
        if msg[0] == "near":
            self._answer_near(w, msg[1])
            return
        _kind, answers, segment, size = msg
        w.segment, w.acked_bytes = segment, size
        self._quick_deaths = 0
        self._start_deaths = 0
        for job_id, packed in answers:
            w.answered += 1
            w.ring.release(job_id)
            job = w.outstanding.pop(job_id, None)
            if job is not None and not job.future.done():
                job.future.set_result(unpack_result(packed))

    async def _watch(self, w: _Worker) -> None:
        """Wait for the worker's socket to close, then restart it (unless it was closed on purpose)."""
        exc = await w.answers.closed
        if exc is not None:
            log.warning("worker %d connection lost: %r", w.index, exc)
        if w.alive:
            await self._restart(w)

    def _answer_near(self, w: _Worker, queries: list) -> None:
        """A worker asks, before archiving a batch, which stored pages its pages nearly duplicate."""
        answers = {}
        for job_id, simhash, url in queries:
            near = ""
            if self.near_duplicate is not None:
                try:
                    near = self.near_duplicate(simhash, url) or ""
                except Exception:       # the worker waits for an answer: give one, say why
                    log.exception("near-duplicate check failed for %s", url)
            answers[job_id] = near
        if w.alive and not w.transport.is_closing():
            w.transport.write(_frame(("near", answers)))     # now: the worker waits for it

    async def _restart(self, dead: _Worker) -> None:
        dead.alive = False
        dead.out.clear()
        with contextlib.suppress(Exception):
            dead.transport.close()
        loop = asyncio.get_running_loop()
        rc = await loop.run_in_executor(None, _reap, dead.proc)
        self.restarts += 1
        log.error("worker %d died (exit %s) holding %d jobs", dead.index, rc, len(dead.outstanding))
        self._cut_unanswered(dead)
        if self.on_worker_death is not None:
            self.on_worker_death(dead.index, dead.segment)
        started = _STARTED.unpack_from(dead.progress)[0]
        dead.progress.close()
        dead.ring.close()
        jobs = list(dead.outstanding.values())
        dead.outstanding.clear()
        suspect = next((j for j in jobs if j.job_id == started), None)    # None: died between jobs
        if suspect is not None:
            suspect.crashes += 1
            if suspect.crashes >= self.max_job_attempts:
                jobs.remove(suspect)
                self.crashed_jobs += 1
                if not suspect.future.done():
                    suspect.future.set_result(ProcessResult(
                        url=suspect.result.url, outcome=Outcome.PROCESS_CRASHED, status=suspect.result.status,
                        error=f"{suspect.crashes} workers died processing this response"))
        for job in jobs:
            self._dispatch(job)         # to a live worker, else the backlog
        if self._closing:
            return                      # close() answers the backlog
        if dead.answered == 0 and started == 0:
            # died before starting any job (cannot import its modules, ...): a broken start, and
            # restarting it forever would only hide that; its jobs stay queued, unanswered
            self._start_deaths += 1
            if self._start_deaths >= MAX_START_DEATHS:
                self.failed = (f"processing workers keep dying at start ({self._start_deaths} in a row, last "
                               f"exit status {rc}; the worker's own error is logged above)")
                log.error("worker pool failed: %s", self.failed)
                return
        if dead.answered == 0:
            # died again before answering anything (broken start or poison pages): don't spin
            self._quick_deaths += 1
            await asyncio.sleep(_RESPAWN_DELAY_S[min(self._quick_deaths, len(_RESPAWN_DELAY_S) - 1)])
        if self._closing:
            return
        self._workers[dead.index] = await self._spawn(dead.index, dead.generation + 1)
        backlog, self._backlog = self._backlog, deque()
        for job in backlog:
            self._dispatch(job)

    def _open_segments(self, index: int | None) -> list[str]:
        """``.open`` segments of worker ``index`` (None: of any worker of this shard, any run)."""
        warc_dir = self.init.get("warc_dir")
        if not warc_dir or not os.path.isdir(warc_dir):
            return []
        tag = re.escape(self.tag(index)) if index is not None else re.escape(self.tag(0))[:-1] + r"\d+"
        pat = re.compile(rf"-{tag}\.warc\.gz{re.escape(OPEN_SUFFIX)}$")
        return sorted(os.path.join(warc_dir, n) for n in os.listdir(warc_dir) if pat.search(n))

    def _cut_unanswered(self, dead: _Worker) -> None:
        """Remove a dead worker's records that no answer covered: those jobs are processed again."""
        for path in self._open_segments(dead.index):
            try:
                if path == dead.segment:
                    if os.path.getsize(path) > dead.acked_bytes:
                        os.truncate(path, dead.acked_bytes)
                        log.warning("worker %d: cut %s back to %d answered bytes", dead.index, path,
                                    dead.acked_bytes)
                else:
                    os.remove(path)
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(cdxj_path(path, self.init.get("index_dir") or None) + OPEN_SUFFIX)
                    log.warning("worker %d: removed %s (no answered record)", dead.index, path)
            except OSError as e:
                log.error("worker %d: cannot cut segment %s: %s", dead.index, path, e)

    async def close(self, timeout_s: float = 10.0) -> None:
        """Let workers finish their jobs, close their WARC segments and exit.

        Jobs still unanswered after ``timeout_s`` resolve with ``process_crashed``; a worker
        that does not exit in time is killed and its segment cut and recovered like a death.
        """
        pending = [j.future for j in self._jobs.values()]
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)
        self._closing = True
        # a restart in progress finishes its cut, recovery and job answers (it spawns nothing now)
        dying = [w.reader_task for w in self.workers if not w.alive and w.reader_task is not None]
        if dying:
            await asyncio.wait(dying, timeout=timeout_s + 15.0)
        ws = [w for w in self.workers if w.alive]
        for w in ws:
            w.alive = False         # its reader will not restart it
            cpu = proc_cpu_s(w.proc.pid)
            if cpu is not None:
                self.final_cpu_s[w.proc.pid] = cpu
            self._flush_out()
            with contextlib.suppress(Exception):
                w.transport.write(_frame(("close",)))
        loop = asyncio.get_running_loop()
        for w in ws:
            try:
                await asyncio.wait_for(loop.run_in_executor(None, w.proc.wait), timeout_s)
            except TimeoutError:
                w.proc.kill()
                await loop.run_in_executor(None, w.proc.wait)
            if w.reader_task is not None:
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    await asyncio.wait_for(w.reader_task, timeout_s)     # reads the last answers
            if w.proc.returncode != 0:
                self._cut_unanswered(w)
                if self.on_worker_death is not None:
                    self.on_worker_death(w.index, w.segment)
            with contextlib.suppress(Exception):
                w.transport.close()
            w.progress.close()
            w.ring.close()
        for job in list(self._jobs.values()):
            _resolve_unprocessed(job, "pool closed before a worker answered")
        self._backlog.clear()


def _resolve_unprocessed(job: _Job, why: str) -> None:
    if not job.future.done():
        job.future.set_result(ProcessResult(url=job.result.url, outcome=Outcome.PROCESS_CRASHED,
                                            status=job.result.status, error=why))


# A ProcessResult crosses the socket as a tuple, its links as tuples: pickling dataclass
# instances with slots calls their Python-level __getstate__/__setstate__ per Link, which
# cost ~90 us per 50-link page on the two sides together (bench/process_bench.py).
_PR_FIELDS = tuple(f.name for f in dataclasses.fields(ProcessResult))
_LINKS_AT = _PR_FIELDS.index("links")
_OUTCOME_AT = _PR_FIELDS.index("outcome")


def not_archived(pr: ProcessResult, err: OSError, warc_dir: str) -> ProcessResult:
    """``pr`` marked as not archived because the WARC could not be written (the shard keeps the URL)."""
    pr.outcome = Outcome.PROCESS_ERROR
    pr.storage_error = storage_error(err, warc_dir)
    pr.error = f"not archived: {err.strerror or err}"
    pr.warc_file, pr.warc_offset, pr.warc_length = "", -1, 0
    pr.links = []
    return pr


def pack_result(pr: ProcessResult) -> tuple:
    """``pr`` as plain tuples for the wire (inverse: ``unpack_result``)."""
    values = [getattr(pr, name) for name in _PR_FIELDS]
    values[_OUTCOME_AT] = pr.outcome.value
    values[_LINKS_AT] = [(ln.url, ln.fp, ln.host_key, ln.nofollow) for ln in pr.links]
    return tuple(values)


def unpack_result(values: tuple) -> ProcessResult:
    values = list(values)
    values[_OUTCOME_AT] = Outcome(values[_OUTCOME_AT])
    values[_LINKS_AT] = [Link(*t) for t in values[_LINKS_AT]]
    return ProcessResult(*values)


def _reap(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _frame(obj) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


# -- the worker process ---------------------------------------------------------------------
class _FrameReader:
    """Length-prefixed frames from a blocking socket, read in large chunks (few recv calls)."""

    def __init__(self, sock: socket.socket, chunk_bytes: int = 1 << 20):
        self.sock = sock
        self.buf = bytearray()
        self.pos = 0
        self.chunk_bytes = chunk_bytes

    def next(self):
        """The next unpickled frame, or None at end of stream."""
        if not self._fill(_LEN.size):
            return None
        (n,) = _LEN.unpack_from(self.buf, self.pos)
        if not self._fill(_LEN.size + n):
            return None
        start = self.pos + _LEN.size
        msg = pickle.loads(memoryview(self.buf)[start:start + n])
        self.pos = start + n
        return msg

    def ready(self) -> bool:
        """True if a whole frame can be read without blocking."""
        if len(self.buf) - self.pos < _LEN.size or \
                len(self.buf) - self.pos < _LEN.size + _LEN.unpack_from(self.buf, self.pos)[0]:
            try:
                chunk = self.sock.recv(self.chunk_bytes, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return False
            if not chunk:
                return False
            del self.buf[:self.pos]
            self.pos = 0
            self.buf += chunk
        avail = len(self.buf) - self.pos
        return avail >= _LEN.size and avail >= _LEN.size + _LEN.unpack_from(self.buf, self.pos)[0]

    def _fill(self, need: int) -> bool:
        if len(self.buf) - self.pos >= need:
            return True
        del self.buf[:self.pos]
        self.pos = 0
        while len(self.buf) < need:
            try:
                chunk = self.sock.recv(max(self.chunk_bytes, need - len(self.buf)))
            except (ConnectionResetError, BrokenPipeError):
                return False          # the crawl process is gone (e.g. kill -9): same as end of input
            if not chunk:
                return False
            self.buf += chunk
        return True


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


def _fetch_result(meta: tuple, body: bytes) -> FetchResult:
    url, outcome, status, ip, started_at, elapsed_s, request_head, response_head, headers, error, _ = meta
    return FetchResult(url=url, outcome=Outcome(outcome), status=status, ip=ip, started_at=started_at,
                       elapsed_s=elapsed_s, request_head=request_head, response_head=response_head, body=body,
                       headers=headers, error=error)


def worker_main(fd: int, progress_fd: int = -1, ring_fd: int = -1) -> int:
    """Serve jobs on socket ``fd`` until it closes or a ``close`` frame comes; return the exit status."""
    import signal

    from crawlerd.process.ring import RingReader
    from crawlerd.process.worker import PageProcessor
    from crawlerd.store import linesort
    from crawlerd.store.warc import WarcWriter
    # the crawl process runs the ordered shutdown; a worker ends when its socket closes
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    crash = os.environ.get(CRASH_ENV)
    crash_re = re.compile(crash) if crash else None
    progress = mmap.mmap(progress_fd, _STARTED.size) if progress_fd >= 0 else None
    sock = socket.socket(fileno=fd)
    frames = _FrameReader(sock)
    ring: RingReader | None = None
    processor: PageProcessor | None = None
    warc: WarcWriter | None = None
    segment_max_bytes = 0
    # thresholds: PageProcessor's tune_allocator (for speed); the trim below gives freed pages back
    last_trim = time.monotonic()
    ask_near = False
    held: deque = deque()       # frames that came while waiting for a near-duplicate answer

    def next_frame():
        return held.popleft() if held else frames.next()

    def ready() -> bool:
        return bool(held) or frames.ready()

    def near_answers(queries: list) -> dict | None:
        """Ask the crawl process about the batch's pages; None when it is gone."""
        data = pickle.dumps(("near", queries), protocol=pickle.HIGHEST_PROTOCOL)
        sock.sendall(_LEN.pack(len(data)) + data)
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
            while len(batch) < _MAX_BATCH and msg[0] == "job" and ready():
                msg = next_frame()
                batch.append(msg)
            done = []           # (job_id, result, Analysis or the error it raised)
            for msg in batch:
                if msg[0] == "init":
                    init = msg[1]
                    segment_max_bytes = init["segment_max_bytes"]
                    ask_near = bool(init.get("near_duplicates"))
                    if ring_fd >= 0:
                        ring = RingReader(ring_fd, init["ring_bytes"])
                    # the writer never rotates by itself: this loop rotates after answering (module doc)
                    warc = WarcWriter(init["warc_dir"], prefix=init["prefix"], segment_max_bytes=1 << 62,
                                      shard=init["worker_tag"], user_agent=init["user_agent"],
                                      index_dir=init.get("index_dir") or None,
                                      index_sort_buffer_bytes=init.get("index_sort_buffer_bytes")
                                      or linesort.DEFAULT_BUFFER_BYTES)
                    captures = OwnCaptures(init.get("digest_dir") or "",
                                         cap_bytes=init.get("captures_bytes") or 4 << 20)
                    processor = PageProcessor(warc, agent_token=init["agent_token"],
                                              max_decoded_bytes=init["max_decoded_bytes"],
                                              max_links=init["max_links"])
                elif msg[0] == "job":
                    _, job_id, meta, offset, length, prior, digest, lookup = msg
                    result = _fetch_result(meta, ring.get(offset, length) if offset >= 0 else meta[-1])
                    if progress is not None:
                        _STARTED.pack_into(progress, 0, job_id)
                    try:
                        a = processor.analyse(result, prior=None if lookup else prior, digest=digest)
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
                    _STARTED.pack_into(progress, 0, 0)      # waiting: no job is to blame
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
                    _STARTED.pack_into(progress, 0, job_id)
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
                now = time.monotonic()
                if now - last_trim >= TRIM_INTERVAL_S:
                    malloc_trim()   # parser and decoder buffers freed: give the pages back
                    last_trim = now
                try:
                    warc.flush()    # answered records are on disk: a crash loses only unanswered ones
                except OSError as e:
                    # the writer cut its segment back and closed it: none of this batch is known archived
                    for _job_id, pr in answers:
                        if captures is not None and pr.digest:
                            captures.forget(pr.digest, pr.url)      # its record was cut back
                    answers = [(job_id, not_archived(pr, e, init["warc_dir"])) for job_id, pr in answers]
                segment = warc.current_path or ""
                size = os.path.getsize(segment) if segment else 0
                data = pickle.dumps(("results", [(job_id, pack_result(pr)) for job_id, pr in answers], segment, size),
                                    protocol=pickle.HIGHEST_PROTOCOL)
                try:
                    sock.sendall(_LEN.pack(len(data)) + data)
                except (ConnectionResetError, BrokenPipeError):
                    break             # the crawl process is gone: close the segment and exit quietly
                if progress is not None:
                    _STARTED.pack_into(progress, 0, 0)
                if size >= segment_max_bytes:
                    warc.close()        # the next record opens the next segment
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
    ap.add_argument("--ring-fd", type=int, default=-1, help="memfd of the body ring")
    args = ap.parse_args()
    return worker_main(args.fd, args.progress_fd, args.ring_fd)


if __name__ == "__main__":
    raise SystemExit(main())
