"""The shard's background tasks: one per lease, per DNS lookup, per archived robots/sitemap answer.

Every task the shard starts goes through :class:`Tasks`, so the ordered shutdown can wait for
all of them (and cancel what outlives the grace), and a task that fails is logged and kept in
``recent_errors`` (shown by ``crawlerd status``) instead of vanishing with its exception.
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

    def spawn(self, coro: Coroutine) -> None:
        t = asyncio.ensure_future(coro)
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
