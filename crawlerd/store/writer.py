"""Writes off the event loop: one thread does the disk writes the loop hands over, in groups.

A ``write()`` into the page cache (an LMDB commit without fdatasync, a log append) usually takes
microseconds, but it blocks whenever the kernel throttles dirty pages or the file system's
journal commits, and on a box where other processes write heavily that was the loop's worst
stall (hundreds of ms). So the loop only *hands over*: ``submit(sink, item, then)`` appends to a
list and returns (the thread is woken at most once per ``GROUP_DELAY_S`` by the loop, not per
item: a thread wake-up and a commit cost more CPU than most items); this thread takes everything pending, calls each sink once with its items in
submit order (``sink(items)``: one LMDB transaction begun and committed here, one ``writev``),
and then runs the ``then`` callbacks on the loop. A group's sinks run in the order their first
items came, except those named ``first(sink)``, which run before the others: the frontier's store,
whose commits must land no later than those of a store (budgets, recrawl, DUST) that forgets a
URL the frontier committed in the same loop callback. Items handed over while a group is written go
in the next group, so a write waits at most ``GROUP_DELAY_S`` plus about two group writes, and
the loop never waits.

py-lmdb write transactions are thread-affine (begun, used and committed on one thread), so an
LMDB store written here is written only here; the loop may read it at any time (a read
transaction sees the last commit), and each store keeps a RAM overlay of what it handed over
and was not written yet, so a read on the loop answers from the overlay until the write lands.

``hold()`` stops the thread before its next group until ``release()``: tests use it to prove
that no ``then`` (an acknowledgement) runs before the write it depends on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from crawlerd.sched import background_thread
from crawlerd.store.syncer import run_all

log = logging.getLogger("crawlerd.store")

Sink = Callable[[list[Any]], None]
GROUP_DELAY_S = 0.05        # the loop wakes the thread at most this often: bounds latency and wake-ups
                            # (each group costs a wake-up, a transaction and a commit per store, and a
                            # read transaction renewed on the loop; bench/RESULTS.md, "wake-ups" ninth pass)


class WriterError(RuntimeError):
    """A write on the writer thread failed; the writer stopped (nothing after it was written)."""


class WriteThread:
    """Key: none (one FIFO of (sink, item, then)). Invariants: every sink runs on this thread only
    and sees its items in submit order; a ``then`` runs on the loop exactly once, after every item
    submitted up to and including its own was written, and never after a write failed (the first
    failure stops the thread, is handed to ``on_error`` on the loop, and every later ``submit``
    raises it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, name: str = "crawlerd-writer",
                 on_error: Callable[[BaseException], None] | None = None, group_delay_s: float = GROUP_DELAY_S) -> None:
        self._loop = loop
        self._delay = group_delay_s
        self._on_error = on_error
        self._cv = threading.Condition()
        self._pending: list[tuple[Sink | None, Any, Callable[[], None] | None]] = []
        self._closed = False
        self._held = False
        self._loop_thread = threading.get_ident()   # made on the loop's thread
        self._kick_due = False
        self._first: list[Sink] = []
        self._error: BaseException | None = None
        self.groups = 0
        self.items = 0
        self.write_s = 0.0
        self.max_write_s = 0.0
        self._thread = background_thread(self._run, name)
        self._thread.start()

    def submit(self, sink: Sink | None, item: Any = None, then: Callable[[], None] | None = None) -> None:
        """Hand ``item`` to ``sink`` (None: no write, only ``then`` after everything before it)."""
        with self._cv:
            self._check_open()
            self._pending.append((sink, item, then))
            if not self._kick_from_loop():
                return
        # from the loop: one wake-up per group_delay_s at most, however many items it handed over
        self._loop.call_later(self._delay, self._kick)

    def submit_many(self, sink: Sink, items: list[Any], then: Callable[[], None] | None = None) -> None:
        """``submit`` of each item in order, ``then`` after the last (one hand-over, not one per item)."""
        if not items:
            return
        with self._cv:
            self._check_open()
            pending = self._pending
            for item in items[:-1]:
                pending.append((sink, item, None))
            pending.append((sink, items[-1], then))
            if not self._kick_from_loop():
                return
        self._loop.call_later(self._delay, self._kick)

    def _check_open(self) -> None:
        """Under the lock: raise if the writer stopped or was closed."""
        if self._error is not None:
            raise WriterError(f"writer stopped: {self._error!r}") from self._error
        if self._closed:
            raise WriterError("writer closed")

    def _kick_from_loop(self) -> bool:
        """Under the lock, after a hand-over: wake the writer (another thread) or note that the loop
        must arm the one delayed kick (True: the caller arms it once the lock is released)."""
        if threading.get_ident() != self._loop_thread:
            self._cv.notify()
            return False
        if self._kick_due:
            return False
        self._kick_due = True
        return True

    def first(self, sink: Sink) -> None:
        """Run ``sink`` before every other sink of a group (a store whose commits the others' follow)."""
        self._first.append(sink)

    def _kick(self) -> None:
        with self._cv:
            self._kick_due = False
            self._cv.notify()

    def barrier(self, then: Callable[[], None]) -> None:
        """Run ``then`` on the loop once everything submitted so far is written."""
        self.submit(None, None, then)

    @property
    def backlog(self) -> int:
        """Items handed over and not yet taken by the thread."""
        return len(self._pending)

    @property
    def error(self) -> BaseException | None:
        return self._error

    def hold(self) -> None:
        """Tests: the thread writes nothing more until ``release()`` (a group already taken ends)."""
        with self._cv:
            self._held = True

    def release(self) -> None:
        with self._cv:
            self._held = False
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while (self._held or not self._pending) and not (self._closed and not self._held):
                    self._cv.wait()
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
            ok = self._write_group(batch)
            del batch               # nothing of the group stays alive while the thread waits for the next
            if not ok:
                return

    def _write_group(self, batch: list) -> bool:
        """Write one group and post its callbacks; False: stop. A method of its own so that nothing
        of the group (its layers' keys and values) stays alive in a local while the thread waits
        for the next."""
        t0 = time.monotonic()
        # by equality: a bound method is a new object per access
        groups: dict[Sink, list[Any]] = {sink: [] for sink in self._first}
        for sink, item, _ in batch:
            if sink is not None:
                groups.setdefault(sink, []).append(item)
        try:
            for sink, items in groups.items():
                if items:
                    sink(items)
        except BaseException as e:          # a failing disk: stop here, acknowledge nothing more
            log.exception("background write failed")
            with self._cv:
                self._error = e
                self._pending = []
            if self._on_error is not None:
                self._post([functools.partial(self._on_error, e)])
            return False
        dt = time.monotonic() - t0
        self.groups += 1
        self.items += len(batch)
        self.write_s += dt
        self.max_write_s = max(self.max_write_s, dt)
        thens = [then for _, _, then in batch if then is not None]
        return not thens or self._post(thens)

    def _post(self, thens: list[Callable[[], None]]) -> bool:
        try:
            self._loop.call_soon_threadsafe(run_all, thens)
        except RuntimeError:                    # the loop closed under us (shutdown)
            return False
        return True

    def stats(self) -> dict:
        return {"groups": self.groups, "items": self.items, "write_s": round(self.write_s, 3),
                "max_write_ms": round(1000 * self.max_write_s, 1), "backlog": self.backlog}

    def close(self) -> None:
        """Write what is pending (a hold is lifted), then stop the thread; the last ``then`` callbacks
        may still be queued on the loop (run it once to deliver them)."""
        with self._cv:
            self._closed = True
            self._held = False
            self._cv.notify()
        self._thread.join()
