"""Who runs a shard in a cluster: a lease in a JetStream KV bucket, fenced on this node's clock.

The bucket ``crawlerd_<crawl>_leases`` has a TTL (``cluster.lease_ttl_s``): every revision of a
key is removed that long after the stream stored it. Key ``shard.<i>``, value: JSON naming the
owner (node, pid, since) and its latest numbers (pages, pages/s) for ``cluster status``.

- ``acquire()``: ``create`` (succeeds only when the key does not exist: never held, released,
  or expired); False while another owner holds it. With ``heir=True`` (the caller holds this
  machine's own lock on the shard, so no other process of this node runs it) a lease still held
  under this node's name belongs to a dead process of this node: it is taken over at once by
  compare-and-set on that revision (restart-in-place need not wait out the TTL). Node names must
  be unique in a crawl.
- renewal (a task): ``update`` with the revision this owner last wrote (compare-and-set), every
  ``renew_interval_s``. A CAS that fails means someone else holds the lease now: **lost**, for
  good (the shard stops; ``on_lost`` is called).
- ``held()``, the **fence**: true only until ``t0 + fence_s``, where ``t0`` is when the last
  successful write was *sent* (this node's monotonic clock) and ``fence_s`` < TTL. The server
  stamps the revision after ``t0``, so it expires no earlier than ``t0 + TTL``: a shard that
  asks ``held()`` before every request (``Fetcher`` gate) never starts one after a standby can
  have taken over, however long this process was stopped (SIGSTOP, a swapped-out VM).
  ``TTL - fence_s`` covers the rate difference of the clocks involved and the time between the
  check and the request's first byte; the NATS servers' clocks must agree to within it.
- ``release()``: delete with the revision (a standby may take over at once); a lost or
  expired lease is left alone.

``ClusterMeta.check_shards(n)``: the crawl's N in ``crawlerd_<crawl>_meta`` (written by the
first node; a node started with another N is refused, naming both).

Key: shard index; invariant: ``revision`` is the revision this owner wrote last, or 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Callable

import nats.js.errors

from crawlerd.cluster.engine import ClusterError, Link, stop_tasks, transient

log = logging.getLogger("crawlerd.cluster")


def lease_key(shard: int) -> str:
    return f"shard.{shard}"


def node_name() -> str:
    return socket.gethostname()


class KvShardLease:
    """The lease on shard ``shard`` for node ``node`` (see module doc); the ownership interface
    of ``handoff.ownership`` (acquire / held / renew / release) with async network calls."""

    def __init__(self, link: Link, shard: int, *, node: str, ttl_s: float = 6.0, renew_interval_s: float = 1.0,
                 fence_s: float = 4.0, replicas: int = 3, clock=time.monotonic, wall=time.time,
                 on_lost: Callable[[str], None] | None = None, heir: bool = False):
        if not 0 < renew_interval_s < fence_s < ttl_s:
            raise ClusterError(f"lease timing: need 0 < renew_interval_s ({renew_interval_s}) < fence_s "
                               f"({fence_s}) < lease_ttl_s ({ttl_s})")
        self.link = link
        self.shard = shard
        self.node = node
        self.ttl_s = ttl_s
        self.renew_interval_s = renew_interval_s
        self.fence_s = fence_s
        self.replicas = replicas
        self.clock = clock
        self.wall = wall
        self.on_lost = on_lost
        self.heir = heir
        self.inherited = False              # taken over from a dead process of this node
        self.key = lease_key(shard)
        self.kv = None
        self.revision = 0
        self.valid_until = 0.0
        self.since = 0.0
        self.lost = ""                      # why the lease is gone for good ("" while not lost)
        self.holder: dict | None = None     # the other owner, when acquire() said no
        self.numbers: dict = {}             # shard numbers carried in the value (pages, pages/s)
        self.renewals = 0
        self.renew_failures = 0
        self._task: asyncio.Task | None = None

    async def open(self) -> KvShardLease:
        self.kv = await self.link.kv(self.link.names.leases, replicas=self.replicas, ttl_s=self.ttl_s)
        return self

    def _value(self) -> bytes:
        return json.dumps({"node": self.node, "pid": os.getpid(), "since": self.since, "renewed": self.wall(),
                           "ttl_s": self.ttl_s, **self.numbers}, separators=(",", ":")).encode()

    # -- the ownership interface ------------------------------------------------------------
    async def acquire(self) -> bool:
        """Take the lease if nobody holds it; False (``holder`` says who) otherwise."""
        if self.held():
            return True
        self.since = self.wall()
        t0 = self.clock()
        try:
            rev = await self._create()
        except nats.js.errors.KeyWrongLastSequenceError:
            self.holder = await self.read_holder()
            if self._ours(self.holder):
                rev = self.holder["revision"]   # our create was stored; its answer was lost
            elif self.heir and self.holder and self.holder.get("node") == self.node:
                try:                        # an earlier, dead process of this node: take it over
                    rev = await self.link.retry(
                        lambda: self.kv.update(self.key, self._value(), last=self.holder["revision"]),
                        what="lease take-over")
                except nats.js.errors.KeyWrongLastSequenceError:
                    return False            # it changed meanwhile (expired and taken): not ours
                self.inherited = True
            else:
                return False
        self.revision = rev
        self.valid_until = t0 + self.fence_s
        self.lost = ""
        self.holder = None
        return True

    async def _create(self) -> int:
        """Create the key; KeyWrongLastSequenceError when somebody holds it.

        nats-py's ``create`` answers a refused create by reading the key (a deleted key's tombstone
        may be recreated); when the key expires between the refusal and that read (a standby polling
        at the TTL), the read raises KeyNotFoundError: the key is free now, so create again."""
        for _ in range(3):
            try:
                return await self.link.retry(lambda: self.kv.create(self.key, self._value()), what="lease create")
            except nats.js.errors.KeyNotFoundError:
                continue
        raise nats.js.errors.KeyWrongLastSequenceError(description="the lease key came and went three times")

    async def acquire_wait(self, timeout_s: float, poll_s: float = 0.2) -> bool:
        """A standby: try until the lease is free (released, or expired: TTL after its last renewal)."""
        deadline = self.clock() + timeout_s
        while True:
            if await self.acquire():
                return True
            if self.clock() > deadline:
                return False
            await asyncio.sleep(poll_s)

    def held(self, now: float | None = None) -> bool:
        """The fence (see module doc). ``now`` is ignored: the deadline lives on this lease's clock."""
        return not self.lost and self.clock() < self.valid_until

    def renew(self, now: float | None = None) -> bool:
        """Renewal runs in ``start()``'s task; this says whether the lease is still held."""
        return self.held()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._renewer())

    async def renew_once(self) -> bool:
        """One compare-and-set renewal. False when it failed for now (retried) or for good (``lost``)."""
        t0 = self.clock()
        try:
            rev = await self.kv.update(self.key, self._value(), last=self.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            holder = await self.read_holder()
            if self._ours(holder):          # our last update was stored, its answer lost: adopt
                self.revision = holder["revision"]      # (the deadline stays: that write's t0 is unknown)
                return False
            if holder is None:
                self._lose(f"the lease expired (not renewed within its {self.ttl_s:g} s TTL)")
            else:
                self._lose(f"node {holder.get('node')!r} holds the lease now (compare-and-set on "
                           f"revision {self.revision} refused)")
            return False
        except Exception as e:
            if not transient(e):
                raise
            self.renew_failures += 1
            return False
        if self.lost:
            return False
        self.revision = rev
        self.valid_until = t0 + self.fence_s
        self.renewals += 1
        return True

    async def _renewer(self) -> None:
        while not self.lost:
            t0 = self.clock()
            try:
                async with asyncio.timeout(self.fence_s):
                    await self.renew_once()
            except TimeoutError:
                self.renew_failures += 1
            except Exception as e:
                if not transient(e):        # a refused write that is no passing state: stop owning
                    self._lose(f"lease renewal failed: {e}")
                    return
                self.renew_failures += 1
            if self.clock() >= self.valid_until and not self.lost:
                log.warning("shard %d: lease not renewed in %.1f s: not fetching until it is",
                            self.shard, self.fence_s)
            await asyncio.sleep(max(0.0, self.renew_interval_s - (self.clock() - t0)))

    def _lose(self, why: str) -> None:
        if self.lost:
            return
        self.lost = why
        self.valid_until = 0.0
        log.error("shard %d: lease lost: %s", self.shard, why)
        if self.on_lost is not None:
            self.on_lost(why)

    def _ours(self, holder: dict | None) -> bool:
        """The stored value is this tenure's (same node, process and start)."""
        return bool(holder) and holder.get("node") == self.node and holder.get("pid") == os.getpid() \
            and holder.get("since") == self.since

    async def read_holder(self) -> dict | None:
        try:
            e = await self.link.retry(lambda: self.kv.get(self.key), what="lease read")
        except nats.js.errors.KeyNotFoundError:
            return None
        try:
            return {**json.loads(e.value), "revision": e.revision}
        except ValueError:
            return {"revision": e.revision}

    async def release(self) -> None:
        """Stop renewing; delete the key if this owner still holds it (CAS on our revision)."""
        if self._task is not None:
            await stop_tasks([self._task])
            self._task = None
        if self.held():
            try:
                await asyncio.wait_for(self.kv.delete(self.key, last=self.revision), 2.0)
            except Exception as e:          # it expires by itself within the TTL
                log.info("shard %d: lease not deleted (%s); it expires in %.0f s", self.shard, e, self.ttl_s)
        self.valid_until = 0.0
        self.revision = 0


class ClusterMeta:
    """The crawl's facts every node must agree on (bucket ``crawlerd_<crawl>_meta``, no TTL)."""

    def __init__(self, link: Link, *, replicas: int = 3):
        self.link = link
        self.replicas = replicas
        self.kv = None

    async def open(self) -> ClusterMeta:
        self.kv = await self.link.kv(self.link.names.meta, replicas=self.replicas)
        return self

    async def check_shards(self, n: int) -> int:
        """Record N on the first start; refuse (ClusterError naming both values) a different one."""
        try:
            await self.link.retry(lambda: self.kv.create("shards", str(n).encode()), what="record shards")
            return n
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        e = await self.link.retry(lambda: self.kv.get("shards"), what="read shards")
        stored = int(e.value)
        if stored != n:
            raise ClusterError(f"crawl {self.link.names.crawl!r} has crawl.shards = {stored} in the cluster; "
                               f"this node was started with {n} (the count is fixed for the life of a crawl)")
        return stored

    async def shards(self) -> int | None:
        try:
            e = await self.link.retry(lambda: self.kv.get("shards"), what="read shards")
        except nats.js.errors.KeyNotFoundError:
            return None
        return int(e.value)
