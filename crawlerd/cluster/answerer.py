"""A shard's answering side on a NATS subject: subscribe, decode and answer each request, stop.

The dedup channel (``cluster.dedup.OwnerService``) and the per-IP turns (``cluster.ipgrants.
IpTurnService``) answer questions the same way; only ``answer`` differs. A request that does not
decode is logged and left unanswered (the asker's timeout covers it, as for a lost message); a
reply that cannot be sent (the asker gone, the link reconnecting) is dropped: the asker asks again.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod

from crawlerd.cluster.engine import Link

log = logging.getLogger("crawlerd.cluster")


class Answerer(ABC):
    """Answers requests on ``subject`` with :meth:`answer`. Invariant: subscribed from ``start``
    until ``close``; ``answered`` counts the replies sent."""

    what = "request"            # how a log line names what was asked

    def __init__(self, link: Link, subject: str):
        self.link = link
        self.subject = subject
        self.answered = 0
        self._sub = None

    @abstractmethod
    def answer(self, data: bytes) -> bytes | None:
        """The reply to one request's payload, or None for none; ValueError/KeyError/TypeError for
        a request that does not decode."""

    async def start(self) -> None:
        self._sub = await self.link.nc.subscribe(self.subject, cb=self._on_msg)

    async def _on_msg(self, msg) -> None:
        try:
            out = self.answer(msg.data)
        except (ValueError, KeyError, TypeError) as e:
            log.warning("%s on %s not understood: %r", self.what, self.subject, e)
            return
        if out is not None and msg.reply:
            self.answered += 1
            with contextlib.suppress(Exception):
                await msg.respond(out)

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
