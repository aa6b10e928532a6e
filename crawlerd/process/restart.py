"""A processing worker's death: its segment cut back, its jobs handed on, the worker restarted.

``Restarts`` watches each worker's socket (``watch``); when it closes while the worker was not
closed on purpose, the worker has died, and:

1. its records that no answer covered are cut (``WorkerSegments.cut_unanswered``): each answer
   carries the segment and its size after the job's records were flushed, so records past the
   last answered size are cut (those jobs run again elsewhere) and a segment it opened without
   answering for anything in it is removed. A worker rotates its segment only after answering,
   so an answered record never sits in a segment that was closed before the answer;
2. ``on_worker_death(index, segment)`` closes (recovers) the cut segment. A recovery that fails
   (a full disk, say) is logged and the restart goes on; the segment left ``.open`` is recovered
   at the next start (``WorkerSegments.recover_left_open``) and no later death's cut of the same
   worker slot removes it (it holds answered records);
3. its jobs are blamed or handed on: before it starts a job, a worker writes the job id into an
   8-byte shared page, so only the job it was working on is blamed; the others it held are sent
   again (``resend``), unpenalised. A job blamed ``max_job_attempts`` times resolves with outcome
   ``process_crashed`` (poison page): none is silently lost;
4. the worker is started again (``respawn``), after a growing delay while workers keep dying
   before answering anything. A worker that dies before starting any job ``MAX_START_DEATHS``
   times in a row is not started again: ``failed`` says why and the crawl stops with that reason
   instead of restarting workers in a loop while it reports "running". Any other failure of a
   restart sets ``failed`` too, rather than leaving its jobs unanswered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import subprocess
from collections.abc import Awaitable, Callable

from crawlerd.outcome import Outcome
from crawlerd.process.jobs import Job, WorkerLink, release_body
from crawlerd.process.wire import PROGRESS
from crawlerd.records import ProcessResult
from crawlerd.store.cdxj import cdxj_path
from crawlerd.store.recover import recover_segment
from crawlerd.store.segment import OPEN_SUFFIX

log = logging.getLogger("crawlerd.pool")

_RESPAWN_DELAY_S = (0.0, 0.1, 0.3, 1.0, 3.0)       # after deaths in a row with no answer in between
MAX_START_DEATHS = 3                # workers dying in a row before starting any job: the pool has failed


class WorkerSegments:
    """The ``.open`` WARC segments of one shard's workers in ``warc_dir``, by worker slot.

    Key: a slot's tag (``tag(index)``, the last part of its segment names). Invariant: a segment
    in ``kept`` holds answered records (closing it failed at a death); no later cut of its slot
    removes or cuts it, and the next start's ``recover_left_open`` closes it."""

    def __init__(self, warc_dir: str | None, index_dir: str | None, tag: Callable[[int], str]):
        self.warc_dir = warc_dir
        self.index_dir = index_dir or None
        self.tag = tag
        self.kept: set[str] = set()

    def left_open(self, index: int | None) -> list[str]:
        """``.open`` segments of worker ``index`` (None: of any worker of this shard, any run)."""
        if not self.warc_dir or not os.path.isdir(self.warc_dir):
            return []
        tag = re.escape(self.tag(index)) if index is not None else re.escape(self.tag(0))[:-1] + r"\d+"
        pat = re.compile(rf"-{tag}\.warc\.gz{re.escape(OPEN_SUFFIX)}$")
        return sorted(os.path.join(self.warc_dir, n) for n in os.listdir(self.warc_dir) if pat.search(n))

    def recover_left_open(self) -> None:
        """Close the segments an earlier run of this shard's workers left open (at the pool's start)."""
        for path in self.left_open(None):
            for line in recover_segment(path, index_dir=self.index_dir):
                log.warning("segment recovery at start: %s", line)

    def cut_unanswered(self, dead: WorkerLink) -> None:
        """Remove a dead worker's records that no answer covered: those jobs are processed again."""
        for path in self.left_open(dead.index):
            if path in self.kept:
                continue                # an earlier generation's answered records, waiting for recovery
            try:
                if path == dead.segment:
                    if os.path.getsize(path) > dead.acked_bytes:
                        os.truncate(path, dead.acked_bytes)
                        log.warning("worker %d: cut %s back to %d answered bytes", dead.index, path,
                                    dead.acked_bytes)
                else:
                    os.remove(path)
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(cdxj_path(path, self.index_dir) + OPEN_SUFFIX)
                    log.warning("worker %d: removed %s (no answered record)", dead.index, path)
            except OSError as e:
                log.error("worker %d: cannot cut segment %s: %s", dead.index, path, e)


class Restarts:
    """The deaths of one pool's workers and their restarts (module doc).

    What it needs of the pool, it is given: ``resend(job)`` sends a job to a live worker (or the
    backlog), ``respawn(index, generation)`` starts a worker in slot ``index`` and sends it the
    backlog, ``closing()`` says the pool is closing (nothing is started again)."""

    def __init__(self, segments: WorkerSegments, *, max_job_attempts: int,
                 on_worker_death: Callable[[int, str], None] | None,
                 resend: Callable[[Job], None], respawn: Callable[[int, int], Awaitable[None]],
                 closing: Callable[[], bool]):
        self.segments = segments
        self.max_job_attempts = max_job_attempts
        self.on_worker_death = on_worker_death
        self._resend = resend
        self._respawn = respawn
        self._closing = closing
        self.restarts = 0               # workers that died and were handled
        self.crashed_jobs = 0           # jobs resolved process_crashed (blamed max_job_attempts times)
        self.failed = ""                # why the pool gave up (workers that cannot start or restart), or ""
        self._quick_deaths = 0          # deaths in a row with no answer in between
        self._start_deaths = 0          # deaths in a row before starting any job

    def answered(self) -> None:
        """A worker answered: the deaths since are no longer in a row."""
        self._quick_deaths = 0
        self._start_deaths = 0

    async def watch(self, w: WorkerLink) -> None:
        """Wait for the worker's socket to close, then restart it (unless it was closed on purpose)."""
        exc = await w.answers.closed
        if exc is not None:
            log.warning("worker %d connection lost: %r", w.index, exc)
        if w.alive:
            try:
                await self.restart(w)
            except Exception as e:      # a restart that stops half-way would leave jobs unanswered forever
                log.exception("worker %d could not be restarted", w.index)
                self.failed = f"processing worker {w.index} could not be restarted: {type(e).__name__}: {e}"

    async def restart(self, dead: WorkerLink) -> None:
        dead.alive = False
        dead.out.clear()
        dead.jobs = []
        with contextlib.suppress(Exception):
            dead.transport.close()
        loop = asyncio.get_running_loop()
        rc = await loop.run_in_executor(None, _reap, dead.proc)
        self.restarts += 1
        log.error("worker %d died (exit %s) holding %d jobs", dead.index, rc, len(dead.outstanding))
        self.settle(dead)
        started = PROGRESS.unpack_from(dead.progress)[0]
        dead.progress.close()
        jobs = list(dead.outstanding.values())
        dead.outstanding.clear()
        suspect = next((j for j in jobs if j.job_id == started), None)    # None: died between jobs
        if suspect is not None:
            suspect.crashes += 1
            if suspect.crashes >= self.max_job_attempts:
                jobs.remove(suspect)
                self.crashed_jobs += 1
                release_body(suspect)      # no worker holds it any more
                if not suspect.future.done():
                    suspect.future.set_result(ProcessResult(
                        url=suspect.result.url, outcome=Outcome.PROCESS_CRASHED, status=suspect.result.status,
                        error=f"{suspect.crashes} workers died processing this response"))
        for job in jobs:
            self._resend(job)           # to a live worker, else the backlog
        if self._closing():
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
        if self._closing():
            return
        await self._respawn(dead.index, dead.generation + 1)

    def settle(self, dead: WorkerLink) -> None:
        """A dead (or killed) worker's segment: cut back to its last answer, then closed."""
        self.segments.cut_unanswered(dead)
        self._report_death(dead)

    def _report_death(self, dead: WorkerLink) -> None:
        """Tell ``on_worker_death`` (which closes the dead worker's segment). Its failure is logged and
        goes no further: the jobs must still be sent again, and a segment left ``.open`` is closed by
        the recovery at the next start."""
        if self.on_worker_death is None:
            return
        try:
            self.on_worker_death(dead.index, dead.segment)
        except Exception:
            log.exception("worker %d: closing its segment %s failed; it stays open until the next start",
                          dead.index, dead.segment)
            if dead.segment:
                self.segments.kept.add(dead.segment)    # answered records: no later cut may remove them


def _reap(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
