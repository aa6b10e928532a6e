"""The DRUM thread of the seen-set (``front.py``) and the batching of its submissions into calls.

``DrumThread`` is one plain thread that runs every call handed to it, in order, and replies from
there (the seen-set posts its replies back to the loop in one ``call_soon_threadsafe``).
``Job`` is one trip there and ``Done`` what it brings back; ``JobCounts`` adds the trips up.
``drum_calls`` cuts a job's submitted chunks into DRUM calls of at most ``CALL_KEYS`` keys: DRUM's
journal and bucket code holds the GIL for one call, so the loop waits at most one call's time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from crawlerd.sched import background_thread
from crawlerd.seen.drum_answers import DrumResult

CALL_KEYS = 8192               # keys per DRUM call: its journal/bucket code holds the GIL for one call


@dataclass(slots=True)
class Job:
    """One trip to the DRUM thread; its steps run in this order."""
    ack: int | None            # acknowledge the answers before this seq
    chunks: list[tuple[np.ndarray, list[bytes] | None]]
    nkeys: int
    first_seq: int
    segment: str | None        # intake segment holding exactly ``chunks``; deleted once DRUM has them
    flush: bool
    poll: bool
    fetch: bool
    waiters: list[asyncio.Future] = field(default_factory=list)


@dataclass(slots=True)
class Done:
    results: Sequence[DrumResult]   # a Delivery (or [] when the job fetched nothing)
    acked_seq: int | None      # DRUM's acknowledged position right after the ack, if the job acked
    handed_seq: int            # first seq not handed out, before this job's results() call
    next_seq: int
    pending: int
    ready: int
    unmerged: int              # keys in DRUM's buckets waiting for a merge
    answers_ram: int           # bytes of merged answers DRUM holds in RAM (the epoch being handed out)
    merge_s: float             # the last merge's duration (any trigger), seconds
    merges: int
    busy_s: float
    flush_s: float | None      # duration of this job's flush(), if it ran one


@dataclass(slots=True)
class JobCounts:
    """What the jobs on the DRUM thread did, for the seen-set's ``stats`` (counted on the loop as
    each job ends: ``note``). Durations in seconds; ``last_*``: 0 before the first."""
    jobs: int = 0
    busy_s: float = 0.0
    max_job_s: float = 0.0
    merges: int = 0
    last_merge_s: float = 0.0   # the last merge's duration (any trigger)
    max_merge_s: float = 0.0
    last_flush_s: float = 0.0   # the last flush() merge's duration

    def note(self, done: Done) -> None:
        self.merges += done.merges
        if done.merges:
            self.last_merge_s = done.merge_s
            self.max_merge_s = max(self.max_merge_s, done.merge_s)
        if done.flush_s is not None:
            self.last_flush_s = done.flush_s
        self.jobs += 1
        self.busy_s += done.busy_s
        self.max_job_s = max(self.max_job_s, done.busy_s)


class DrumThread:
    """The one thread that runs every DRUM call, in the order handed over.

    Key: none (a FIFO of ``(fn, arg, reply)``). Invariant: ``fn(arg)`` runs on this thread only,
    one at a time, and ``reply(result, error)`` runs on it right after. A handover is one
    ``SimpleQueue.put``: one wake-up of this thread when it waits, none when it is busy.
    """

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = background_thread(self._serve, name)
        self._thread.start()

    def call(self, fn: Callable, arg, reply: Callable[[object, BaseException | None], None]) -> None:
        self._q.put((fn, arg, reply))

    def call_wait(self, fn: Callable, arg):
        """``fn(arg)`` on the thread; its result (or error) here, blocking (start-up only)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def reply(result, err):
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(result)

        self.call(fn, arg, reply)
        return fut.result()

    def stop(self) -> None:
        """End the thread once what was handed over ran."""
        self._q.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while (item := self._q.get()) is not None:
            fn, arg, reply = item
            try:
                result, err = fn(arg), None
            except BaseException as e:          # handed to the caller, as an executor would
                result, err = None, e
            reply(result, err)


def drum_calls(chunks) -> Iterator[tuple[np.ndarray, list[bytes] | None]]:
    # The batch as DRUM calls of at most CALL_KEYS keys (aux b"" where a submit had none).
    keys = chunks[0][0] if len(chunks) == 1 else np.concatenate([k for k, _ in chunks])
    aux = None
    if any(a is not None for _, a in chunks):
        aux = []
        for k, a in chunks:
            aux.extend(a if a is not None else [b""] * len(k))
    for i in range(0, len(keys), CALL_KEYS):
        yield keys[i:i + CALL_KEYS], None if aux is None else aux[i:i + CALL_KEYS]
