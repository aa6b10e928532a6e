"""Group commit off the event loop: one thread makes committed LMDB data durable (fdatasync).

The loop commits its LMDB transactions without a sync (``sync=False``: a commit reaches the page
cache and survives ``kill -9``); whatever must also survive a power loss before something else
happens asks this thread: ``request(flush, then)`` runs ``flush`` (e.g. ``env.sync(True)``, which
LMDB allows from any thread beside a writer) and then calls ``then`` on the loop. Requests that
arrive while a sync runs are served together by the next one, each distinct ``flush`` once, so
the latency is bounded by about two syncs and the loop never waits for the disk.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from crawlerd.sched import background_thread

log = logging.getLogger("crawlerd.store")


class SyncThread:
    """Key: the flush callable. Invariant: every ``then`` runs on the loop exactly once, after a
    ``flush`` that started after its request was made (or with the error logged, at close)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str = "crawlerd-sync") -> None:
        self._loop = loop
        self._cv = threading.Condition()
        self._pending: list[tuple[Callable[[], None], Callable[[], None] | None]] = []
        self._closed = False
        self.syncs = 0
        self.sync_s = 0.0                       # total time spent syncing
        self.max_sync_s = 0.0
        self._thread = background_thread(self._run, name)
        self._thread.start()

    def request(self, flush: Callable[[], None], then: Callable[[], None] | None = None) -> None:
        with self._cv:
            if self._closed:
                raise RuntimeError("sync thread closed")
            self._pending.append((flush, then))
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending and self._closed:
                    return
                batch, self._pending = self._pending, []
            t0 = time.monotonic()
            done: set[int] = set()
            for flush, _ in batch:
                if id(flush) not in done:
                    done.add(id(flush))
                    try:
                        flush()
                    except Exception:           # a failing disk: say so; the data stays committed
                        log.exception("background sync failed")
            dt = time.monotonic() - t0
            self.syncs += 1
            self.sync_s += dt
            self.max_sync_s = max(self.max_sync_s, dt)
            thens = [then for _, then in batch if then is not None]
            if thens:
                try:
                    self._loop.call_soon_threadsafe(run_all, thens)
                except RuntimeError:            # the loop closed under us (shutdown)
                    return

    def stats(self) -> dict:
        return {"syncs": self.syncs, "sync_s": round(self.sync_s, 3), "max_sync_ms": round(1000 * self.max_sync_s, 1)}

    def close(self) -> None:
        """Serve what is pending, then stop the thread (the last ``then`` callbacks may still be queued
        on the loop)."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()


def run_all(thens: list[Callable[[], None]]) -> None:
    """Run a group's callbacks in order, on the loop (after the writes they wait for)."""
    for then in thens:
        then()
