"""One owner per payload digest across machines: the dedup channel over NATS request/reply.

The owner of a digest is shard ``xxh3_64(SHA-1) mod N`` (``dedup.owners``), wherever it runs.
On its own machine a shard asks it over its Unix socket; a shard on another machine asks it on
subject ``crawlerd.<crawl>.dedup.<owner>`` (core NATS request/reply: a question that finds no
owner, or no answer within the timeout, costs that capture its deduplication, never a record).
``OwnerService`` is the owner's side: the process holding the shard's lease subscribes and
answers with ``DigestOwnerServer.handle``; ``OwnerPeer`` is the asking side, the peer interface
of ``DigestOwners`` (``ask``, ``tell``, ``close``). Confirms and releases are published without
an answer, as on the socket.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from crawlerd.cluster.answerer import Answerer
from crawlerd.cluster.engine import Link

log = logging.getLogger("crawlerd.cluster")


class OwnerPeer:
    """The way to the digest owner ``shard`` on another machine (``DigestOwners`` peer)."""

    def __init__(self, link: Link, shard: int):
        self.link = link
        self.subject = link.names.dedup_subject(shard)
        self._sends: set[asyncio.Task] = set()

    async def ask(self, msg: dict, timeout_s: float) -> tuple[bool, object]:
        nc = self.link.nc
        if nc is None or nc.is_closed:
            return False, None
        try:
            r = await nc.request(self.subject, json.dumps(msg).encode(), timeout=timeout_s)
            return True, json.loads(r.data)["p"]
        except Exception as e:          # no responders, a timeout, a reconnecting link: no answer
            log.debug("dedup ask %s: %r", self.subject, e)
            return False, None

    def tell(self, msg: dict) -> None:
        nc = self.link.nc
        if nc is None or nc.is_closed:
            return
        t = asyncio.ensure_future(nc.publish(self.subject, json.dumps(msg).encode()))
        self._sends.add(t)
        t.add_done_callback(self._sent)

    def _sent(self, t: asyncio.Task) -> None:
        self._sends.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.debug("dedup tell %s: %r", self.subject, t.exception())

    async def close(self) -> None:
        if self._sends:
            await asyncio.wait(list(self._sends), timeout=2.0)


class OwnerService(Answerer):
    """Answers the digest claims other machines send to shard ``shard`` (see module doc)."""

    what = "dedup request"

    def __init__(self, link: Link, shard: int, handle: Callable[[bytes], bytes | None]):
        super().__init__(link, link.names.dedup_subject(shard))
        self.handle = handle

    def answer(self, data: bytes) -> bytes | None:
        return self.handle(data)
