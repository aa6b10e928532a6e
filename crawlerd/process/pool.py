"""Processing worker pool: N processes do the CPU work on fetched responses.

Each worker is a ``python -m crawlerd.process.worker_process --fd N`` child joined
to the crawl process by a Unix socketpair carrying length-prefixed pickles of
plain tuples (``crawlerd.process.wire``). The first frame configures its
:class:`PageProcessor` and its own WARC writer (segment files named with the
worker's tag ``<shard>_w<index>``, so workers never share a file). A body
does not go through the socket: the frame names its first block in the body
pool (:mod:`crawlerd._native.bodypool`, mapped read-only by every worker),
where the fetcher wrote it; a heap body is copied in at dispatch, or sent
inline when the pool is full. Its blocks go back once a worker answered. The jobs
sent to a worker during one loop iteration go in one ``("jobs", [job])`` frame (one
pickle; a job whose body goes inline goes in a frame of its own, in order), and the
frames queued go out in one write. A worker
handles its jobs one at a time in the order sent and answers in that order.
Jobs that arrive together are handled as a batch: their records are flushed
once and their answers sent in one frame (fewer syscalls and wake-ups under
load); the crawl process reads answers in a protocol callback, every complete
frame of a read at once.

Exact duplicates are looked up by the worker itself (``crawlerd.process.worker_process``).

Key: job id -> job. Invariant: a submitted job is in exactly one worker's
``outstanding`` map (a live worker's, or a dead one's until its death is
handled) or in the pool's ``backlog`` (while no worker is alive) until its
result comes back; then its future is resolved exactly once.

Crashes. A worker that dies is restarted (``crawlerd.process.restart``): only the job it was
working on is blamed, the others it held are sent again; a job blamed ``max_job_attempts`` times
resolves with outcome ``process_crashed`` (poison page); its segment is cut back to the last
answered record before it is recovered, so the WARC stays exactly-once. Workers that keep dying
at start fail the pool (``failed``, ``raise_if_failed``): the crawl stops with that reason.

Frames. A worker's answer frame (a batch) is decoded whole, then, if the pool has an
``on_frame`` hook, the frame's answers whose ``process()`` call gave a ``ctx`` go to it in one
call, ``[(ctx, result)]`` in the frame's order, before any of those calls returns: the caller
can do a frame's bookkeeping as one batch (``crawlerd.shard.answers``). A job answered otherwise
(a crash's ``process_crashed``, the pool closing) never reaches the hook.

Near duplicates. A worker first parses every job of a batch, then (if the pool
has a ``near_duplicate`` callback, or ``near_duplicates`` for a whole batch) sends one
``("near", [(job id, simhash, url)])`` frame and waits for the crawl process's answers before it writes any record, so
a capture's metadata record can name the stored page it nearly duplicates. One
round trip per batch; frames that arrive meanwhile are held and handled next.

Backpressure: ``process()`` waits for a free slot (``jobs_per_worker`` per
worker; a count and a FIFO of waiters, a slot handed straight to the next
waiter); ``calls`` counts the calls waiting or in a worker. The shard keeps the
lease of a response until it is processed (its transfer slot is free once the
transfer ends) and stops leasing while ``waiting`` reaches ``capacity``
(``behind``), so a slow pool stops new fetches instead of growing a queue of
fetched, unarchived responses (RAM, and the work a kill -9 makes the crawl redo);
no answer is dropped. ``body_bytes`` is the bodies of the calls not returned: the
shard's lease window keeps them, with the transfers' expected bodies, within
``process.queue_bytes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import re
import socket
import subprocess
from collections import deque
from collections.abc import Callable

from crawlerd._native.bodypool import BodyPool
from crawlerd.child import child_env, python_argv
from crawlerd.metrics import proc_cpu_s
from crawlerd.outcome import Outcome
from crawlerd.process.jobs import Job, WorkerLink, release_body
from crawlerd.process.restart import Restarts, WorkerSegments
from crawlerd.process.wire import PROGRESS, AnswerReader, frame, unpack_results
from crawlerd.records import FetchResult, PriorCapture, ProcessResult

log = logging.getLogger("crawlerd.pool")

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._]+")      # as the WARC writer cleans segment name parts
POOL_BYTES = 32 << 20               # the body pool a WorkerPool makes itself when not given the fetcher's


class PoolFailed(RuntimeError):
    """The processing workers keep dying before they start any job."""


def default_workers(configured: int, shards: int = 1) -> int:
    """One shard's workers: ``process.workers`` in all (0: cores - shards, at least one per
    shard) shared out evenly among ``shards``."""
    total = configured if configured > 0 else max(shards, (os.cpu_count() or 2) - shards)
    return max(1, round(total / shards))


class WorkerPool:
    """``workers`` processing processes; ``init`` configures each
    (see ``crawlerd.process.worker_process.worker_main``)."""

    def __init__(self, workers: int, init: dict, *, jobs_per_worker: int = 32, max_job_attempts: int = 2,
                 on_worker_death=None, near_duplicate=None, body_pool: BodyPool | None = None):
        if workers < 1 or jobs_per_worker < 1 or max_job_attempts < 1:
            raise ValueError("workers, jobs_per_worker and max_job_attempts must be >= 1")
        self.n = workers
        self.init = init
        self.jobs_per_worker = jobs_per_worker
        self.near_duplicate = near_duplicate        # (simhash, url) -> near-duplicate URL or "" (module doc)
        # or all of a batch's questions at once: [(simhash, url)] -> [near-duplicate URL or ""]
        self.near_duplicates = None
        # the bodies every worker reads (the fetcher's pool; one of its own if not given)
        self._own_bodies = body_pool is None
        self.bodies = body_pool if body_pool is not None else BodyPool(POOL_BYTES, name="crawlerd-pool-bodies")
        self.inline = 0                                 # bodies sent inline in the frame (no pool space)
        # the answers of one worker frame at once: [(ctx, result)] of its jobs that have a ctx, in
        # the frame's order, called before their process() calls return (module doc, "Frames")
        self.on_frame: Callable[[list[tuple[object, ProcessResult]]], None] | None = None
        self._flush_scheduled = False
        self._workers: list[WorkerLink | None] = [None] * workers
        self._loop: asyncio.AbstractEventLoop | None = None      # the loop the pool started on
        self._free = workers * jobs_per_worker        # slots nobody holds (see _wait_slot)
        self._slot_waiters: deque[asyncio.Future] = deque()     # process() calls waiting for a slot, FIFO
        self.capacity = workers * jobs_per_worker     # jobs the workers hold at once
        self.waiting = 0                              # process() calls waiting for one of those slots
        self.held = 0                                 # process() calls holding one (in a worker or its backlog)
        self.answered = 0                             # process() calls answered so far
        self.body_bytes = 0                           # bodies of the process() calls not returned (calls)
        self.answer_frames = 0                        # workers' answer frames (a batch each) so far
        self.answers_framed = 0                       # jobs those frames answered
        self._backlog: deque[Job] = deque()
        self._jobs: dict[int, Job] = {}        # every job whose process() call has not returned
        self._next_id = 0
        self._closing = False
        self._segments = WorkerSegments(init.get("warc_dir"), init.get("index_dir"), self.tag)
        self._deaths = Restarts(self._segments, max_job_attempts=max_job_attempts, on_worker_death=on_worker_death,
                                resend=self._dispatch, respawn=self._respawn, closing=lambda: self._closing)
        self.final_cpu_s: dict[int, float] = {}     # worker pid -> CPU s, read just before it exits

    def tag(self, index: int) -> str:
        """Worker ``index``'s tag, the last part of its segment names."""
        return _UNSAFE_NAME.sub("_", f"{self.init.get('shard', '0')}_w{index}")

    @property
    def restarts(self) -> int:
        """Workers that died and were handled (cut, jobs handed on, restarted unless closing)."""
        return self._deaths.restarts

    @property
    def crashed_jobs(self) -> int:
        """Jobs answered ``process_crashed``: blamed for ``max_job_attempts`` deaths."""
        return self._deaths.crashed_jobs

    @property
    def failed(self) -> str:
        """Why the pool gave up (workers that cannot start or restart), or ""."""
        return self._deaths.failed

    async def start(self) -> None:
        """Close segments an earlier run of this shard's workers left open, then start the workers."""
        self._loop = asyncio.get_running_loop()
        self._segments.recover_left_open()
        for i in range(self.n):
            self._workers[i] = await self._spawn(i, 0)

    async def _respawn(self, index: int, generation: int) -> None:
        """A dead worker's slot gets a new worker, and the jobs that waited for one go to the workers."""
        self._workers[index] = await self._spawn(index, generation)
        backlog, self._backlog = self._backlog, deque()
        for job in backlog:
            self._dispatch(job)

    async def _spawn(self, index: int, generation: int) -> WorkerLink:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        b = self.bodies
        init = dict(self.init, worker_tag=self.tag(index), body_pool=(b.size, b.blocks, b.header, b.block_bytes),
                    near_duplicates=self.near_duplicate is not None or self.near_duplicates is not None)
        page_fd = os.memfd_create(f"crawlerd-{self.tag(index)}-progress")
        try:
            os.ftruncate(page_fd, PROGRESS.size)
            progress = mmap.mmap(page_fd, PROGRESS.size)
            # -P and PYTHONPATH: the worker imports this very package, never a crawlerd/ in the cwd
            proc = subprocess.Popen(python_argv("crawlerd.process.worker_process", "--fd", str(child.fileno()),
                                                "--progress-fd", str(page_fd), "--bodies-fd", str(b.fd)),
                                    pass_fds=[child.fileno(), page_fd, b.fd], stdin=subprocess.DEVNULL,
                                    env=child_env())
        finally:
            os.close(page_fd)
            child.close()
        loop = asyncio.get_running_loop()
        holder: list[WorkerLink] = []
        transport, answers = await loop.create_unix_connection(
            lambda: AnswerReader(lambda msg: self._on_answer(holder[0], msg)), sock=parent)
        w = WorkerLink(index, generation, proc, transport, answers, progress)
        holder.append(w)
        transport.write(frame(("init", init)))
        w.reader_task = asyncio.ensure_future(self._deaths.watch(w))
        return w

    def raise_if_failed(self) -> None:
        """PoolFailed when the workers cannot start or restart (see ``failed``)."""
        if self.failed:
            raise PoolFailed(self.failed)

    @property
    def workers(self) -> list[WorkerLink]:
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
                      digest: str = "", lookup: bool = False,
                      sitemap: tuple[int, int] | None = None, ctx: object = None) -> ProcessResult:
        """Process one response in a worker; waits for a free slot (backpressure).

        ``prior``: the capture this one revisits (exact-duplicate owner, or the capture a 304 confirms), or None.
        ``digest``: its payload digest (``entity_digest``) when the caller computed it already.
        ``lookup``: ignore ``prior``; the worker looks the digest up (``init["digest_dir"]`` and its
        own captures) and the result's ``duplicate_of`` tells what it found.
        ``sitemap``: (max_urls, max_bytes) to have the worker also decode and parse the answer as a
        sitemap; the result's ``sitemap`` holds the reading (the parse never runs on this loop).
        """
        self.body_bytes += result.size
        if self._free > 0 and not self._slot_waiters:
            self._free -= 1
        else:
            try:
                await self._wait_slot()
            except BaseException:
                self.body_bytes -= result.size
                raise
        self.held += 1
        try:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            self._next_id += 1
            job = Job(self._next_id, result, prior, loop.create_future(), digest, lookup, sitemap, 0, ctx=ctx)
            self._jobs[job.job_id] = job
            try:
                self._dispatch(job)
                return await job.future
            finally:
                del self._jobs[job.job_id]
                self.answered += 1
        finally:
            self.held -= 1
            self.body_bytes -= result.size
            self._release_slot()

    async def _wait_slot(self) -> None:
        """Wait in line for a slot: ``_release_slot`` hands it over by resolving the future (the
        count of free slots does not change). A waiter cancelled after it was handed one passes
        it on, so no slot is lost."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._slot_waiters.append(fut)
        self.waiting += 1
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self._release_slot()            # handed a slot just as it gave up: the next one takes it
            else:
                with contextlib.suppress(ValueError):
                    self._slot_waiters.remove(fut)
            raise
        finally:
            self.waiting -= 1

    def _release_slot(self) -> None:
        """A slot comes back: to the first waiter still waiting, else to the free count."""
        waiters = self._slot_waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1

    def _dispatch(self, job: Job) -> None:
        w, held = None, 0           # the first live worker holding the fewest jobs
        for live in self._workers:
            if live is not None and live.alive and (w is None or len(live.outstanding) < held):
                w, held = live, len(live.outstanding)
        if w is None:
            self._backlog.append(job)       # sent when a worker is back
            return
        w.outstanding[job.job_id] = job
        r = job.result
        pooled = r.pooled
        if pooled is None and r.body:
            if job.copy is None:
                job.copy = self.bodies.put(r.body)      # None: no room, the body goes inline
            pooled = job.copy
        if pooled is not None:
            if pooled.released:         # would reach the worker as an empty body: never archive that
                raise ValueError(f"{r.url}: its pooled body was released before a worker answered")
            first, size, inline = pooled.first, pooled.size, b""
        else:
            first, size, inline = -1, len(r.body), r.body
            if inline:
                self.inline += 1
        meta = (r.url, r.outcome.value, r.status, r.ip, r.started_at, r.elapsed_s, r.request_head,
                r.response_head, r.headers, r.error, inline)
        msg = ("job", job.job_id, meta, first, size, job.prior, job.digest, job.lookup, job.sitemap)
        if not inline:
            w.jobs.append(msg)          # with the iteration's other jobs, in one frame (_flush_out)
        else:                           # its body inline: a frame of its own, in order
            if w.jobs:
                w.out.append(frame(("jobs", w.jobs)))
                w.jobs = []
            w.out.append(frame(msg))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            (self._loop or asyncio.get_running_loop()).call_soon(self._flush_out)

    def _flush_out(self) -> None:
        """Write each worker's queued frames in one go (one syscall per worker per loop iteration)."""
        self._flush_scheduled = False
        for w in self._workers:
            if w is not None and w.jobs:
                w.out.append(frame(("jobs", w.jobs)))
                w.jobs = []
            if w is not None and w.out:
                data = b"".join(w.out)
                w.out.clear()
                if w.alive and not w.transport.is_closing():
                    w.transport.write(data)

    def _on_answer(self, w: WorkerLink, msg) -> None:
        """One frame from a worker: a near-duplicate question, or a batch of (job id, packed result)
        answered after its records were flushed."""
        if type(msg) is tuple and msg and msg[0] == "near":
            self._answer_near(w, msg[1])
            return
        # decoded whole before anything is applied: a frame that does not decode (ValueError, the
        # connection closes and the worker restarts) leaves every job it named outstanding, sent again
        results, segment, size = unpack_results(msg)
        w.segment, w.acked_bytes = segment, size
        self.answer_frames += 1
        self.answers_framed += len(results)
        self._deaths.answered()
        answered = []
        for job_id, pr in results:
            w.answered += 1
            job = w.outstanding.pop(job_id, None)
            if job is not None:
                release_body(job)      # answered: its blocks are free (a later read raises)
                if not job.future.done():
                    answered.append((job, pr))
        on_frame = self.on_frame
        if on_frame is not None:
            frame_ = [(job.ctx, pr) for job, pr in answered if job.ctx is not None]
            if frame_:
                try:
                    on_frame(frame_)
                except Exception:       # each caller's process() still returns its answer
                    log.exception("answer frame hook failed for %d answers", len(frame_))
        for job, pr in answered:
            job.future.set_result(pr)

    def _answer_near(self, w: WorkerLink, queries: list) -> None:
        """A worker asks, before archiving a batch, which stored pages its pages nearly duplicate."""
        answers = {}
        if self.near_duplicates is not None:
            try:
                found = self.near_duplicates([(simhash, url) for _job, simhash, url in queries])
            except Exception:           # the worker waits for an answer: give one, say why
                log.exception("near-duplicate check failed for a batch of %d", len(queries))
                found = [""] * len(queries)
            answers = {q[0]: near or "" for q, near in zip(queries, found, strict=True)}
            queries = ()
        for job_id, simhash, url in queries:
            near = ""
            if self.near_duplicate is not None:
                try:
                    near = self.near_duplicate(simhash, url) or ""
                except Exception:       # the worker waits for an answer: give one, say why
                    log.exception("near-duplicate check failed for %s", url)
            answers[job_id] = near
        if w.alive and not w.transport.is_closing():
            w.transport.write(frame(("near", answers)))     # now: the worker waits for it

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
                w.transport.write(frame(("close",)))
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
                self._deaths.settle(w)
            with contextlib.suppress(Exception):
                w.transport.close()
            w.progress.close()
        for job in list(self._jobs.values()):
            _resolve_unprocessed(job, "pool closed before a worker answered")
        self._backlog.clear()
        if self._own_bodies:
            self.bodies.close()


def _resolve_unprocessed(job: Job, why: str) -> None:
    release_body(job)          # the workers are gone (close)
    if not job.future.done():
        job.future.set_result(ProcessResult(url=job.result.url, outcome=Outcome.PROCESS_CRASHED,
                                            status=job.result.status, error=why))
