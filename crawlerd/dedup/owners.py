"""Exact duplicates across shards: one owner per payload digest, asked over a request channel.

With ``crawl.shards`` = N the first capture of a payload is decided by one shard, the digest's
owner ``xxh3_64(sha1) mod N``, whoever fetched it. A shard about to archive a 200 asks the
owner to *claim* its digest: the answer is the first capture (archived, or being archived by
some shard right now), so this copy becomes a revisit of it; or nothing, and this shard's
capture is the first. Once archived, the claimant *confirms* (the owner stores the capture in
its ``DigestSet``; an entry is never overwritten); if archiving failed it *releases* the claim.
A claim whose claimant died is forgotten after ``claim_ttl_s``.

Every shard's own ``DigestSet`` also keeps what it archived and the first captures it learned,
so a repeated question is answered at home and a 304 finds the capture it confirms. An owner
that does not answer within ``timeout_s`` (restarting) makes the capture a full response:
deduplication is lost for it, never a record (a revisit always names a capture that exists or
is being written).

The channel: one Unix socket per shard (``shards/<i>/dedup.sock``), JSON lines, requests
pipelined on one connection per peer and answered in order. A peer is anything with
``ask(msg, timeout_s)`` (→ ``(answered, payload)``), ``tell(msg)`` and ``close()``: the same
messages over a network request/reply (``crawlerd.cluster.dedup``, NATS) put the owner on
another machine (``DigestOwners.use_peer``), answered by ``DigestOwnerServer.handle``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable

import xxhash

from crawlerd.records import PriorCapture
from crawlerd.store.digest_set import DigestSet

log = logging.getLogger("crawlerd.dedup")


def owner_of(digest: bytes, shards: int) -> int:
    return xxhash.xxh3_64_intdigest(digest) % shards if shards > 1 else 0


class DigestOwner:
    """The owning shard's side. Key: 20-byte SHA-1 → first capture. Invariant: a digest is in
    ``digests`` (archived first capture) or in ``claims`` (being archived by its claimant,
    since a time) or unknown; a claim ends by confirm, release, or its ttl."""

    def __init__(self, digests: DigestSet, *, claim_ttl_s: float = 600.0, clock=time.monotonic):
        self.digests = digests
        self.claim_ttl_s = claim_ttl_s
        self.clock = clock
        self.claims: dict[bytes, tuple[PriorCapture, float]] = {}
        self.answered = 0

    def known(self, digest: bytes) -> PriorCapture | None:
        got = self.digests.owner(digest)
        return None if got is None else PriorCapture(got[0], float(got[1]), got[2])

    def claim(self, digest: bytes, url: str, fetched_at: float) -> PriorCapture | None:
        self.answered += 1
        prior = self.known(digest)
        if prior is not None:
            return prior
        now = self.clock()
        held = self.claims.get(digest)
        if held is not None and now - held[1] < self.claim_ttl_s and held[0].url != url:
            return held[0]
        self.claims[digest] = (PriorCapture(url, fetched_at), now)
        if len(self.claims) > 4096:
            self._expire(now)
        return None

    def confirm(self, digest: bytes, url: str, fetched_at: float, record_id: str) -> None:
        self.digests.add(digest, url, repr(fetched_at), record_id)
        held = self.claims.get(digest)
        if held is not None and held[0].url == url:
            del self.claims[digest]

    def release(self, digest: bytes, url: str) -> None:
        held = self.claims.get(digest)
        if held is not None and held[0].url == url:
            del self.claims[digest]

    def _expire(self, now: float) -> None:
        for d in [d for d, (_p, t) in self.claims.items() if now - t >= self.claim_ttl_s]:
            del self.claims[d]


class DigestOwnerServer:
    """Answers other shards' claims for the digests this shard owns (JSON lines, in order)."""

    def __init__(self, path: str, owner: DigestOwner):
        self.path = path
        self.owner = owner
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)            # this shard's own socket: only its live process serves it
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=self.path, limit=1 << 20)
        finally:
            os.umask(old)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._conns):
                w.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                out = self.handle(line)
                if out is not None:
                    writer.write(out)
        except (ConnectionError, asyncio.LimitOverrunError, ValueError) as e:
            log.warning("dedup channel closed: %r", e)
        finally:
            self._conns.discard(writer)
            writer.close()

    def handle(self, line: bytes) -> bytes | None:
        """One request (a JSON line) → its answer line (a claim) or None (confirm, release)."""
        req = json.loads(line)
        op, d = req["op"], bytes.fromhex(req["d"])
        o = self.owner
        if op == "claim":
            p = o.claim(d, req["u"], req["t"])
            body = None if p is None else [p.url, p.fetched_at, p.record_id]
            return json.dumps({"id": req.get("id", 0), "p": body}).encode() + b"\n"
        if op == "confirm":
            o.confirm(d, req["u"], req["t"], req.get("r", ""))
        elif op == "release":
            o.release(d, req["u"])
        return None


class _Peer:
    """One pipelined connection to another shard's owner server."""

    def __init__(self, path: str):
        self.path = path
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.waiting: dict[int, asyncio.Future] = {}
        self.task: asyncio.Task | None = None
        self._next = 0
        self._connecting: asyncio.Future | None = None     # one connect at a time (concurrent claims)

    async def ask(self, msg: dict, timeout_s: float) -> tuple[bool, object]:
        """Send a claim, wait for its answer: (False, None) when the owner did not answer."""
        if not await self.connect(timeout_s):
            return False, None
        self._next += 1
        msg = dict(msg, id=self._next)
        fut = asyncio.get_running_loop().create_future()
        self.waiting[self._next] = fut
        self.tell(msg)
        try:
            return True, await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            self.waiting.pop(msg["id"], None)
            return False, None

    def tell(self, msg: dict) -> None:
        """A message without an answer (confirm, release); dropped when not connected."""
        if self.writer is None:
            return
        try:
            self.writer.write(json.dumps(msg).encode() + b"\n")
        except (ConnectionError, RuntimeError):
            self.drop()

    async def close(self) -> None:
        task = self.task
        self.drop()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def connect(self, timeout_s: float) -> bool:
        if self.writer is not None:
            return True
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open(timeout_s))
        fut = self._connecting
        try:
            return await asyncio.shield(fut)
        finally:
            if fut.done() and self._connecting is fut:
                self._connecting = None

    async def _open(self, timeout_s: float) -> bool:
        try:
            reader, self.writer = await asyncio.wait_for(
                asyncio.open_unix_connection(self.path, limit=1 << 20), timeout_s)
        except (OSError, TimeoutError):
            return False
        self.reader = reader
        self.task = asyncio.ensure_future(self._read(reader))
        return True

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                msg = json.loads(line)
                fut = self.waiting.pop(msg["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(msg["p"])
        except (ConnectionError, ValueError):
            pass
        finally:
            self.drop()

    def drop(self) -> None:
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_result(None)        # no answer: this capture is archived in full
        self.waiting.clear()
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class DigestOwners:
    """A shard's way to the owner of any digest: itself, or a peer over the channel."""

    def __init__(self, me: int, shards: int, owner: DigestOwner, socket_of: Callable[[int], str], *,
                 timeout_s: float = 2.0):
        self.me = me
        self.shards = shards
        self.owner = owner
        self.timeout_s = timeout_s
        self.peers: dict[int, object] = {i: _Peer(socket_of(i)) for i in range(shards) if i != me}
        self.remote_claims = 0
        self.unanswered = 0

    async def claim(self, digest: bytes, url: str, fetched_at: float) -> PriorCapture | None:
        local = self.owner.known(digest)         # a first capture never changes: the answer at home
        if local is not None:
            return local
        dest = owner_of(digest, self.shards)
        if dest == self.me:
            return self.owner.claim(digest, url, fetched_at)
        self.remote_claims += 1
        answered, got = await self.peers[dest].ask({"op": "claim", "d": digest.hex(), "u": url, "t": fetched_at},
                                                   self.timeout_s)
        if not answered:
            self.unanswered += 1
            return None
        if got is None:
            return None
        prior = PriorCapture(got[0], float(got[1]), got[2])
        # learned: a later copy, or a 304 against a revisit of it, is answered at home
        self.owner.digests.add(digest, prior.url, repr(prior.fetched_at), prior.record_id)
        return prior

    def confirm(self, digest: bytes, url: str, fetched_at: float, record_id: str) -> None:
        """This shard archived the first capture: its owner (and this shard) keep it."""
        dest = owner_of(digest, self.shards)
        if dest == self.me:
            self.owner.confirm(digest, url, fetched_at, record_id)
            return
        self.owner.digests.add(digest, url, repr(fetched_at), record_id)
        self.peers[dest].tell({"op": "confirm", "d": digest.hex(), "u": url, "t": fetched_at, "r": record_id})

    def release(self, digest: bytes, url: str) -> None:
        dest = owner_of(digest, self.shards)
        if dest == self.me:
            self.owner.release(digest, url)
        else:
            self.peers[dest].tell({"op": "release", "d": digest.hex(), "u": url})

    def use_peer(self, shard: int, peer) -> None:
        """Reach shard ``shard``'s owner through ``peer`` (another channel: another machine)."""
        self.peers[shard] = peer

    async def close(self) -> None:
        for peer in self.peers.values():
            await peer.close()

    def stats(self) -> dict:
        return {"remote_claims": self.remote_claims, "unanswered": self.unanswered,
                "answered_for_others": self.owner.answered, "claims_open": len(self.owner.claims)}
