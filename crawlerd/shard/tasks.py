"""The shard's background tasks: one per lease, per DNS lookup, per archived robots/sitemap answer.

Every task the shard starts goes through :class:`Tasks`, so the ordered shutdown can wait for
all of them (and cancel what outlives the grace), and a task that fails is logged and kept in
``recent_errors`` (shown by ``crawlerd status``) instead of vanishing with its exception.

:class:`Wake` is the shard loop's sleep between steps: until something calls ``set`` (a transfer
or task ended, links arrived) or the timeout passes.

Both keep the loop they first ran on: CPython 3.11's ``asyncio.get_running_loop()`` (also behind
``ensure_future``, ``wait_for``, ``Event.wait``) makes a ``getpid`` system call each time, and these
run several times per request.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections import deque
from collections.abc import Callable, Coroutine

log = logging.getLogger("crawlerd.shard")


class Tasks:
    """The set of running tasks and the last errors.

    Invariant: a task is in the set from ``spawn`` until it ends; when it ends ``on_done`` runs
    (the loop's wake-up: a finished lease frees a slot)."""

    def __init__(self, on_done: Callable[[], None], *, errors_kept: int = 20,
                 store_errors: tuple[type[BaseException], ...] = (),
                 on_store_error: Callable[[BaseException], None] | None = None):
        self.on_done = on_done
        self.store_errors = store_errors
        self.on_store_error = on_store_error
        self.running: set[asyncio.Task] = set()
        self.recent_errors: deque[str] = deque(maxlen=errors_kept)
        self._loop: asyncio.AbstractEventLoop | None = None     # the loop of the first spawn

    def spawn(self, coro: Coroutine) -> None:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        t = loop.create_task(coro)
        self.running.add(t)
        t.add_done_callback(self._done)

    def note_error(self, text: str) -> None:
        self.recent_errors.append(text)

    def __len__(self) -> int:
        return len(self.running)

    async def finish(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the running tasks, then cancel those still running."""
        if self.running:
            await asyncio.wait(list(self.running), timeout=timeout_s)
        for t in list(self.running):
            t.cancel()

    def _done(self, t: asyncio.Task) -> None:
        self.running.discard(t)
        if not t.cancelled() and t.exception() is not None:
            exc = t.exception()
            if self.on_store_error is not None and isinstance(exc, self.store_errors):
                self.on_store_error(exc)          # a storage failure: one line, the crawl stops in order
                self.on_done()
                return
            log.error("task failed: %s", "".join(traceback.format_exception(exc)).replace("\n", " | "))
            self.recent_errors.append(repr(exc))
        self.on_done()


class Wake:
    """A wake-up for one sleeper at a time: ``sleep`` returns when ``set`` is called during it, or
    after its timeout. A ``set`` while nobody sleeps is not kept (the sleeper has just looked at
    everything). One future and one timer per sleep: no task, unlike ``wait_for(event.wait())``."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None     # the loop of the first sleep
        self._fut: asyncio.Future | None = None

    def set(self) -> None:
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(True)

    async def sleep(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s`` seconds; True if woken by ``set``."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        fut = self._fut = loop.create_future()
        timer = loop.call_later(timeout_s, _time_up, fut)
        try:
            return await fut
        finally:
            timer.cancel()
            self._fut = None


def _time_up(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(False)
