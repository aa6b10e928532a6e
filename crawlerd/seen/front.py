"""The URL-seen set driven off the event loop: every DRUM call runs on one dedicated thread.

A DRUM merge (IRLbot, Lee et al., ACM TWeb 2009, §4.2) reads and rewrites the
whole key file; at 10^8-10^9 keys that is tens of seconds. Run on the loop it
would stall every transfer, politeness timer and control request. Here the
loop only appends to a batch; one thread runs the ``Drum`` (not thread-safe,
so never more than one), and its merge kernel releases the GIL.

Data flow::

    submit(keys, aux)  (loop)  -> intake log (one write) + pending batch
    pump step          (loop)  -> one job at a time on the DRUM thread:
        ack up to where the consumer acknowledged (the end of a delivery)
        check_update(batch) in calls of at most CALL_KEYS keys (drum_thread.py)
        flush() if asked, else poll() every poll_interval_s
        delivery() if no delivery is awaiting its ack (answers as arrays: ``Delivery``)
    on_results(delivery) (loop) -> consumer reads it slice by slice, commits (frontier.add), release()
                                   -> the next delivery; ack(its end) once that commit is durable

The pump is callbacks, not a task: a submit or an ack schedules one step for the
loop's next iteration (however many came in this one), and a job's end schedules
the next. The DRUM thread is a plain thread reading a queue: the loop puts a job
(one wake-up of the thread) and the thread posts its end back in one
``call_soon_threadsafe``. A job nothing waits for (new keys, an ack with no
answers ready behind it) starts at most every ``job_gap_s`` (``JOB_GAP_S``): each job costs a trip
to the thread and back and an intake segment created and deleted, so fewer,
larger batches cost less per key. A flush asked for or awaited, the poll,
answers DRUM has ready for the consumer (the rest of a merge after an ack), the
backpressure bound and close do not wait for the gap: the gap delays when keys
reach DRUM's buckets, never an answer a merge made. Nothing a lease waits for
is behind it (a lease waits for the intake log).

Invariant: every key submitted is answered exactly once to the consumer per
process lifetime, in submission order (``seq`` consecutive), and nothing is
acknowledged to DRUM before the consumer called ``ack()`` after its commit.
One delivery is being read at most (until ``release()`` or ``ack()``); at most
``UNACKED_DELIVERIES`` are handed out and not acknowledged, and DRUM's ack stops
where the acknowledged delivery ended (a delivery's commit made durable says
nothing of the next one's). A crash before the ack redelivers from the first
unacknowledged answer (at-least-once across restarts).

Where the pending keys wait: in RAM only the batch and the one a job takes
(``waiting.py``; ``backpressure`` bounds them with the ``reserve`` the work in
flight can still add); DRUM's buckets and files hold the keys waiting for a
merge and the merged answers not handed out (only the epoch being handed out
keeps its answers in RAM). ``waiting.PendingKeys`` keeps that account and the
bound; ``memory()`` gives the bytes, ``stats()`` the counts.

Intake log (``intake_log.py``): a key submitted but not yet handed to DRUM
is in RAM only, and a merge can hold the thread for tens of seconds; so
``submit`` first appends one record per call there (one write into the page
cache, which survives ``kill -9``); on open the records DRUM has not journalled
are replayed into it. With ``threaded_intake=True``, once started on a loop,
that write runs on the intake writer thread (``store/writer.py``): ``submit``
hands the record over and returns (without it ``submit`` returns after the
write). Both of the shard's seen-sets (its URLs, and the budgets' domain edges)
run so. Invariant: a key is *logged* once its record was written (or DRUM
journalled it); ``logged()`` / ``when_logged()`` wait for every key submitted
before the call, and whatever must not happen before the keys are kept (a
lease's completion, a hand-off acknowledgement) waits for them. A ``kill -9``
before that loses keys nothing has acknowledged: their lease is fetched
again, their hand-off batch delivered again. A failed intake write stops the
seen-set (``raise_if_failed``) and fails the waiters: nothing waiting is
acknowledged.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from crawlerd.seen.drum import Drum
from crawlerd.seen.drum_answers import DrumResult
from crawlerd.seen.drum_files import DrumError
from crawlerd.seen.drum_thread import Done, DrumThread, Job, JobCounts, drum_calls
from crawlerd.seen.intake_log import IntakeWriter, replay_intake
from crawlerd.seen.waiting import PendingKeys
from crawlerd.store.writer import WriteThread

log = logging.getLogger("crawlerd.seen")

# A job that nothing waits for (new keys, an ack with no answers ready behind it) starts at most this
# often: each is a trip to the thread and back, a delivery check and an intake segment created, closed and
# deleted on the intake thread. Keys wait for a merge anyway (a flush asked for or due, or a full bucket),
# and a flush takes every key submitted before it without waiting for the gap, so a longer gap makes the
# batches larger, not the answers later (at 20 ms the crawl's seen-set ran ~35 jobs a second).
JOB_GAP_S = 0.1
# Deliveries handed out and not yet acknowledged, at most. A consumer that ``release``s a delivery once
# its commits are handed over reads the next while that commit lands and syncs (the shard's ack waits
# for the writer thread and an fdatasync): answers reach admission at the rate it judges them, not one
# delivery per commit-and-sync round trip. Each is redelivered after a crash until acknowledged.
UNACKED_DELIVERIES = 4


class SeenSetError(DrumError):
    """The seen-set stopped (a DRUM call or the consumer failed, or it is closed); reopen to recover."""


class AsyncSeenSet:
    """A ``Drum`` (``auto_ack=False``) owned by one thread, fed and drained by a pump on the loop.

    Key: the 8-byte URL fingerprint, as in ``Drum``. Invariant: submissions
    reach DRUM in ``submit`` order with the seq numbers predicted at submit
    time (``_next_seq``); at most one delivery is being read (until ``release``
    or ``ack``) and at most ``UNACKED_DELIVERIES`` are unacknowledged; DRUM
    acknowledges only up to where a delivery ended.
    """

    def __init__(self, path: str, *, buckets: int = 64, bucket_buffer_bytes: int = 1 << 20,
                 merge_bytes: int = 256 << 20, max_age_s: float = 30.0, cache_entries: int = 1 << 20,
                 clock: Callable[[], float] = time.monotonic, max_results: int = 1 << 13,
                 max_pending_keys: int = 1 << 18, poll_interval_s: float = 0.5, threaded_intake: bool = False,
                 job_gap_s: float = JOB_GAP_S, intake_thread: str = "crawlerd-intake"):
        if max_pending_keys < 1 or poll_interval_s <= 0 or job_gap_s < 0:
            raise ValueError("max_pending_keys and poll_interval_s must be positive, job_gap_s not negative")
        self.path = os.path.abspath(path)
        self._threaded_intake = threaded_intake  # write the intake log on a thread once started
        self._intake_thread = intake_thread      # that thread's name
        self.poll_interval_s = poll_interval_s
        self.job_gap_s = job_gap_s
        self._thread = DrumThread("drum")
        kw = dict(buckets=buckets, bucket_buffer_bytes=bucket_buffer_bytes, merge_bytes=merge_bytes,
                  max_age_s=max_age_s, cache_entries=cache_entries, clock=clock, max_results=max_results)
        try:
            self._drum, last_segment = self._thread.call_wait(self._open, kw)
        except BaseException:
            self._thread.stop()
            raise
        d = self._drum
        self._next_seq = d.next_seq            # seq the next submitted key gets
        self._handed_seq = d.next_seq - d.pending
        self._acked_seq = self._handed_seq     # everything before it was acknowledged in an earlier life
        # keys pending by where they wait, and the bound (``room``)
        self._pending = PendingKeys(max_pending_keys, drum_pending=d.pending, ready=d.ready, unmerged=d.unmerged,
                                    answers_ram=d.answers_ram_bytes)
        self._intake = IntakeWriter(self.path, last_segment)
        self._logged_seq = self._next_seq      # every key before it is in the intake log (or DRUM)
        self._log_waiters: collections.deque[tuple[int, asyncio.Future | None, Callable[[], None] | None]] = \
            collections.deque()
        self._waiting = self._pending.waiting  # the batch, and the one the job on the DRUM thread takes
        self._outstanding = False              # a delivery is being read (until release() or ack())
        self._ack_to: int | None = None        # ack() called up to this seq; DRUM's ack not yet run
        self._unacked: collections.deque[int] = collections.deque()   # end seqs of deliveries not acked
        self._flush_asked = False
        self._flush_new: list[asyncio.Future] = []
        self._flush_wait: list[tuple[int, asyncio.Future]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_results: Callable[[Sequence[DrumResult]], None] | None = None
        self._job: Job | None = None          # the job on the DRUM thread (one at most)
        self._step_due = False                 # a pump step is scheduled for the loop's next iteration
        self._timer: asyncio.TimerHandle | None = None   # the next poll, or the end of the job gap
        self._next_poll = 0.0
        self._next_job = 0.0                   # loop time before which a job nothing waits for waits
        self._pump_failed = False
        self._idle: asyncio.Future | None = None   # close() waits here for the job on the thread
        self._stopping = False
        self._closed = False
        self._error: BaseException | None = None
        self._counts = JobCounts()             # what the jobs did (stats)
        self._delivered = 0
        self._flush_running = False

    # -- public API ---------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop, on_results: Callable[[Sequence[DrumResult]], None]) -> None:
        """Start the pump on ``loop``; ``on_results(delivery)`` runs on the loop and must end in ``ack()``
        once its commit is done (there or later); the ``Delivery`` is a sequence of ``DrumResult``
        whose objects are made as it is indexed or sliced. Answers redelivered after a crash come first."""
        if self._loop is not None or self._closed:
            raise SeenSetError("already started or closed")
        self._loop = loop
        self._on_results = on_results
        if self._threaded_intake:
            self._intake.attach(WriteThread(loop, name=self._intake_thread, on_error=self._intake_failed))
        self._next_poll = loop.time() + self.poll_interval_s
        self._poke()

    def submit(self, keys: Sequence[int] | np.ndarray, aux: Sequence[bytes] | None = None,
               lens: np.ndarray | None = None) -> None:
        """Queue keys for check+update (non-blocking, any time before close). Never drops a key:
        past ``max_pending_keys`` only ``backpressure`` rises. ``lens``: the aux records' lengths
        (uint32), when the caller has them."""
        self.raise_if_failed()
        if self._closed:
            raise SeenSetError("seen-set is closed")
        karr = np.array(keys, dtype=np.uint64)   # a copy: the caller may reuse its buffer
        if karr.ndim != 1:
            raise ValueError("keys must be one-dimensional")
        n = len(karr)
        if n == 0:
            return
        auxl = None
        if aux is not None:
            auxl = list(aux)
            if len(auxl) != n or (lens is not None and len(lens) != n):
                raise ValueError("aux must have one entry per key")
        then = None if self._intake.thread is None else functools.partial(self._on_logged, self._next_seq + n)
        auxb = self._intake.append(self._next_seq, karr, auxl, then, lens)
        if then is None:
            self._logged_seq = self._next_seq + n
        self._waiting.add(karr, auxl, auxb)
        self._next_seq += n
        self._poke()

    def logged(self) -> asyncio.Future | None:
        """None when every key submitted so far is in the intake log; else a future done once it is
        (failed if the seen-set stops first)."""
        if self._logged_seq >= self._next_seq:
            return None
        fut = self._loop.create_future()
        self._log_waiters.append((self._next_seq, fut, None))
        return fut

    @property
    def intake_writer(self) -> WriteThread | None:
        """The thread writing the intake log (None before ``start`` and after ``close``)."""
        return self._intake.thread

    def when_logged(self, then: Callable[[], None]) -> None:
        """Run ``then`` on the loop once every key submitted so far is in the intake log (at once
        if it is; never if the seen-set stops first)."""
        if self._logged_seq >= self._next_seq:
            then()
        else:
            self._log_waiters.append((self._next_seq, None, then))

    def _on_logged(self, seq: int) -> None:
        self._logged_seq = max(self._logged_seq, seq)
        w = self._log_waiters
        while w and w[0][0] <= self._logged_seq:
            _, fut, then = w.popleft()
            if fut is not None:
                if not fut.done():
                    fut.set_result(None)
            else:
                then()

    def _intake_failed(self, err: BaseException) -> None:
        if self._error is None:
            self._error = err
        log.error("seen-set intake log write failed; keys not logged are acknowledged to nobody: %r", err)
        self._fail_waiters(SeenSetError(f"seen-set stopped: {err!r}"))
        self._poke()

    def release(self) -> None:
        """The consumer has read the outstanding delivery and handed its commits over: the next one may
        come before this one's ``ack`` (at most ``UNACKED_DELIVERIES`` handed out and not acked)."""
        if self._outstanding:
            self._outstanding = False
            self._poke()

    def ack(self, upto: int | None = None) -> None:
        """The consumer committed the answers before seq ``upto`` (the end of a delivery; default:
        every delivery so far, the outstanding one released): acknowledge them in DRUM at the next job."""
        if upto is None:
            self._outstanding = False
        upto = self._handed_seq if upto is None else min(upto, self._handed_seq)
        if upto <= max(self._acked_seq, self._ack_to or 0):
            return
        self._ack_to = upto
        while self._unacked and self._unacked[0] <= upto:
            self._unacked.popleft()
        self._poke()

    async def contains(self, keys: Sequence[int]) -> list[bool]:
        """Whether each key is in DRUM's merged key file, looked up on the DRUM thread (between its jobs).

        Keys submitted since the last merge are not looked at (``pending`` says how many wait).
        """
        self.raise_if_failed()
        if self._closed or self._loop is None:
            raise SeenSetError("contains needs a started, open seen-set")
        return await self._call(self._drum.contains, list(keys))

    def request_flush(self) -> None:
        """Ask for a merge of everything pending at the next job, without waiting (from sync code)."""
        self._flush_asked = True
        self._poke()

    async def flush(self) -> None:
        """Merge everything submitted so far; return once all its answers were delivered and acked."""
        self.raise_if_failed()
        if self._loop is None or self._stopping:
            raise SeenSetError("flush needs a started, open seen-set")
        fut = self._loop.create_future()
        self._flush_new.append(fut)
        self._poke()
        await fut

    async def close(self) -> None:
        """Stop the pump (no delivery after this call), hand the rest of the batch to DRUM, close it.

        Answers not delivered yet stay in DRUM for the next start; call ``flush()`` first to get them.
        """
        if self._closed:
            return
        self._closed = self._stopping = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._job is not None:               # the pump ends after its current job
            self._idle = self._loop.create_future()
            await asyncio.wait([self._idle])
        self._fail_waiters(SeenSetError("seen-set closed"))
        job = None
        if self._error is None:
            job = self._take(poll=False, fetch=False)
        else:
            self._intake.close()             # its records are replayed at the next start
        try:
            await self._call(self._close_drum, job)
        finally:
            self._thread.stop()
            thread, self._intake.thread = self._intake.thread, None
            if thread is not None:
                thread.close()                  # the last records and deletions written
                await asyncio.sleep(0)          # their callbacks run (logged waiters)
            self._fail_waiters(SeenSetError("seen-set closed"))

    def raise_if_failed(self) -> None:
        """Raise the error that stopped the pump (call once per loop step, as DRUM errors used to surface)."""
        if self._error is not None:
            raise SeenSetError(f"seen-set stopped: {self._error!r}") from self._error

    @property
    def backpressure(self) -> bool:
        """True while the keys waiting in RAM for the DRUM thread, with those the work in flight can
        still submit (``reserve``), pass ``max_pending_keys``: stop leasing and taking hand-offs."""
        return self.room <= 0

    @property
    def room(self) -> int:
        """Keys that may still be submitted before ``backpressure`` (0 at or past the bound): the keys
        waiting in RAM and the ``reserve`` taken from ``max_pending_keys``."""
        return self._pending.room

    @property
    def reserve(self) -> Callable[[], int] | None:
        """Keys that work already started can still submit (the shard: leases in flight times the
        links a page gave so far), counted by ``backpressure`` so the bound holds for what they add."""
        return self._pending.reserve

    @reserve.setter
    def reserve(self, fn: Callable[[], int] | None) -> None:
        self._pending.reserve = fn

    def memory(self) -> dict:
        """The keys waiting in RAM (the batch, and the one the DRUM thread is taking) and DRUM's merged
        answers held in RAM, against the bound (``PendingKeys.memory``)."""
        return self._pending.memory()

    @property
    def flushing(self) -> bool:
        """A flush was asked for and its merge has not finished (do not ask again yet)."""
        return self._flush_asked or bool(self._flush_new) or self._flush_running

    @property
    def last_flush_s(self) -> float:
        """How long the last flush() merge took on the DRUM thread, seconds (0 before the first)."""
        return self._counts.last_flush_s

    @property
    def pending(self) -> int:
        """Keys submitted and not yet answered (delivered to on_results)."""
        return self._pending.keys

    @property
    def next_seq(self) -> int:
        """Sequence number the next submitted key gets (answers carry it as ``seq``)."""
        return self._next_seq

    def stats(self) -> dict:
        p, c = self._pending, self._counts
        return {"jobs": c.jobs, "busy_s": round(c.busy_s, 3), "max_job_s": round(c.max_job_s, 3),
                "delivered": self._delivered, "ready": p.ready, "queued_keys": self._waiting.keys,
                "inflight_keys": self._waiting.inflight_keys, "unmerged": p.unmerged,
                "outstanding": self._outstanding, "merges": c.merges,
                "last_merge_s": round(c.last_merge_s, 3), "max_merge_s": round(c.max_merge_s, 3),
                "last_flush_s": round(c.last_flush_s, 3),
                "pending": self.pending, "backpressure": self.backpressure,
                **({"intake_writer": self._intake.thread.stats()} if self._intake.thread is not None else {})}

    # -- pump (loop side) ---------------------------------------------------------------------------

    def _poke(self) -> None:
        # One pump step in the loop's next iteration, however many calls asked for one in this one.
        if not self._step_due and self._job is None and self._loop is not None and not self._stopping:
            self._step_due = True
            self._loop.call_soon(self._step)

    def _step(self) -> None:
        self._step_due = False
        if self._stopping or self._pump_failed or self._job is not None:
            return
        loop = self._loop
        now = loop.time()
        poll = now >= self._next_poll
        fetch = not self._outstanding and len(self._unacked) < UNACKED_DELIVERIES
        ready = self._pending.ready
        if not (self._ack_to is not None or self._waiting.batch or self._flush_new or self._flush_asked or poll
                or (fetch and ready)):
            self._arm(self._next_poll)
            return
        if (now < self._next_job and not (poll or self._flush_new or self._flush_asked or self._flush_wait)
                and not (fetch and ready) and not self.backpressure):
            self._arm(min(self._next_job, self._next_poll))     # nothing waits for it: batch up
            return
        if poll:
            self._next_poll = now + self.poll_interval_s
        self._next_job = now + self.job_gap_s
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            self._job = job = self._take(poll=poll, fetch=fetch)
        except Exception as e:
            self._fail_pump(e)
            return
        self._thread.call(self._run, job, functools.partial(self._post, self._job_done, job))

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            if self._timer.when() == when:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._poke()

    def _post(self, fn: Callable, *args) -> None:
        # on the DRUM thread: one call_soon_threadsafe back to the loop per job
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:                    # the loop closed under us (shutdown)
            pass

    def _job_done(self, job: Job, done: Done | None, err: BaseException | None) -> None:
        self._job = None
        try:
            if err is not None:
                raise err
            self._finish(job, done)
        except Exception as e:
            self._fail_pump(e)
        finally:
            if self._idle is not None and not self._idle.done():
                self._idle.set_result(None)
        self._poke()

    def _fail_pump(self, e: Exception) -> None:
        self._error = e
        self._pump_failed = True
        log.error("seen-set stopped; answers not acknowledged are redelivered after a restart", exc_info=e)
        self._fail_waiters(SeenSetError(f"seen-set stopped: {e!r}"))

    def _call(self, fn: Callable, arg) -> asyncio.Future:
        # ``fn(arg)`` on the DRUM thread, after the job there; its result on the running loop.
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def settle(result, err):
            if fut.done():
                return
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(result)

        def reply(result, err):
            try:
                loop.call_soon_threadsafe(settle, result, err)
            except RuntimeError:
                pass

        self._thread.call(fn, arg, reply)
        return fut

    def _take(self, *, poll: bool, fetch: bool) -> Job:
        # Hand the batch and its intake segment over; later submits start a new segment.
        w = self._waiting
        first_seq = self._next_seq - w.keys
        job = Job(ack=self._ack_to, chunks=w.take(), nkeys=w.inflight_keys,
                   first_seq=first_seq, segment=self._intake.take_segment(),
                   flush=bool(self._flush_new) or self._flush_asked, poll=poll, fetch=fetch,
                   waiters=self._flush_new)
        self._ack_to = None
        self._flush_running = job.flush
        self._flush_asked = False
        self._flush_new = []
        return job

    def _finish(self, job: Job, done: Done) -> None:
        self._waiting.landed()
        self._pending.reported(done.pending, done.ready, done.unmerged, done.answers_ram)
        self._counts.note(done)
        self._flush_running = False
        if done.acked_seq is not None:
            self._acked_seq = done.acked_seq
        for fut in job.waiters:
            self._flush_wait.append((done.next_seq, fut))
        rs = done.results
        if done.handed_seq != self._handed_seq or (rs and (rs[0].seq != self._handed_seq
                                                           or rs[-1].seq != self._handed_seq + len(rs) - 1)):
            raise SeenSetError(f"delivery out of order: DRUM at seq {done.handed_seq}, expected {self._handed_seq}")
        self._handed_seq += len(rs)
        self._resolve_waiters()
        if done.results and not self._stopping:
            # Not acknowledged: a stop here (close() during the job) redelivers them at the next start.
            self._outstanding = True
            self._unacked.append(self._handed_seq)
            self._delivered += len(done.results)
            self._on_results(done.results)

    def _resolve_waiters(self) -> None:
        keep = []
        for target, fut in self._flush_wait:
            if fut.done():
                continue
            if self._acked_seq >= target:
                fut.set_result(None)
            else:
                keep.append((target, fut))
        self._flush_wait = keep

    def _fail_waiters(self, err: Exception) -> None:
        for fut in self._flush_new + [f for _, f in self._flush_wait]:
            if not fut.done():
                fut.set_exception(err)
        self._flush_new, self._flush_wait = [], []
        for _, fut, _then in self._log_waiters:
            if fut is not None and not fut.done():
                fut.set_exception(err)
        self._log_waiters.clear()

    # -- DRUM thread ---------------------------------------------------------------------------------

    def _run(self, job: Job) -> Done:
        d = self._drum
        t0 = time.perf_counter()
        merges0 = d.merges
        acked = None
        if job.ack is not None:
            d.ack(job.ack)
            acked = d.acked_seq
        self._hand_over(job)
        flush_s = None
        if job.flush:
            t1 = time.perf_counter()
            d.flush()
            flush_s = time.perf_counter() - t1
        elif job.poll:
            d.poll()
        handed = d.next_seq - d.pending
        results = d.delivery() if job.fetch else []     # arrays: objects made slice by slice
        return Done(results, acked, handed, d.next_seq, d.pending, d.ready, d.unmerged, d.answers_ram_bytes,
                     d.last_merge_s, d.merges - merges0, time.perf_counter() - t0, flush_s)

    def _hand_over(self, job: Job) -> None:
        if not job.chunks:
            return
        d = self._drum
        if d.next_seq != job.first_seq:
            raise SeenSetError(f"DRUM is at seq {d.next_seq}, the batch starts at {job.first_seq}")
        for keys, aux in drum_calls(job.chunks):
            d.check_update(keys, aux=aux)
        if job.segment is not None:
            self._intake.unlink(job.segment)     # after its records, if a writer thread has them

    def _close_drum(self, job: Job | None) -> None:
        try:
            if job is not None:
                if job.ack is not None:
                    self._drum.ack(job.ack)
                self._hand_over(job)
        finally:
            self._drum.close()

    def _open(self, kw: dict) -> tuple[Drum, int]:
        # Open DRUM (its own recovery), then replay the intake records it has not journalled.
        d = Drum(self.path, auto_ack=False, **kw)
        try:
            last = replay_intake(d, self.path, drum_calls)
        except BaseException:
            d.close()
            raise
        return d, last
