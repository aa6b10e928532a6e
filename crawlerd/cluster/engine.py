"""The NATS JetStream engine as crawlerd uses it: names, one connection, retries through elections.

Everything a crawl keeps in the cluster is named from its crawl name (``cluster.crawl``, the
same on every node; letters, digits, ``_`` and ``-``):

=====================================  ==========================================================
stream ``CRAWLERD_<crawl>_URLS``       the URL hand-off; subject ``crawlerd.<crawl>.urls.<shard>``
                                       (work-queue retention: a message is gone once its shard
                                       acknowledged it, so the stream holds the backlog)
consumer ``shard-<i>``                 durable pull consumer of shard *i*, explicit acks
KV ``crawlerd_<crawl>_leases``         ``shard.<i>``: who runs shard *i* (bucket TTL = lease TTL)
KV ``crawlerd_<crawl>_meta``           ``shards``: N, fixed for the life of the crawl
``crawlerd.<crawl>.dedup.<shard>``     core NATS request/reply: digest claims for shard *i*
``crawlerd.<crawl>.ips.<shard>``       core NATS request/reply: per-IP turns of the IPs shard *i*
                                       owns (``cluster.ipgrants``)
=====================================  ==========================================================

``Link`` is one client connection (``nats-py``, asyncio) with its JetStream context; a shard
process opens one and shares it among its outbox, inbox and lease. ``transient(exc)`` says
whether an error is the kind a JetStream cluster gives while it elects a new leader (timeouts,
no responders, 503, a reconnecting client): the callers retry those and fail on the rest.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass

import nats
import nats.errors
import nats.js.errors
from nats.js import api

log = logging.getLogger("crawlerd.cluster")

_CRAWL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# JetStream API error codes a caller waits out (the cluster is electing, or a stream's peers
# are catching up): 10005 no suitable peers for placement (a peer not seen online yet while the
# cluster forms; a replica count the cluster can never place fails after ``retry``'s timeout,
# naming it), 10008 JetStream not enabled (yet), 10023 insufficient resources during placement,
# 10074 cluster not available / no meta leader.
_TRANSIENT_API = {10005, 10008, 10023, 10074}
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0


class ClusterError(RuntimeError):
    """The cluster refuses what this node asks (bad name, mismatched shard count); one line."""


def check_crawl_name(name: str) -> str:
    if not _CRAWL_NAME.match(name):
        raise ClusterError(f"cluster.crawl {name!r}: use 1-64 letters, digits, '_' or '-'")
    return name


@dataclass(frozen=True, slots=True)
class Names:
    """The cluster-side names of one crawl (see module doc)."""
    crawl: str

    @property
    def stream(self) -> str:
        return f"CRAWLERD_{self.crawl}_URLS"

    @property
    def subjects(self) -> str:
        return f"crawlerd.{self.crawl}.urls.*"

    def subject(self, shard: int) -> str:
        return f"crawlerd.{self.crawl}.urls.{shard}"

    @staticmethod
    def consumer(shard: int) -> str:
        return f"shard-{shard}"

    def dedup_subject(self, shard: int) -> str:
        """Request/reply subject of the digest owner ``shard`` (``cluster.dedup``)."""
        return f"crawlerd.{self.crawl}.dedup.{shard}"

    def ips_subject(self, shard: int) -> str:
        """Request/reply subject of the per-IP turn owner ``shard`` (``cluster.ipgrants``)."""
        return f"crawlerd.{self.crawl}.ips.{shard}"

    @property
    def leases(self) -> str:
        return f"crawlerd_{self.crawl}_leases"

    @property
    def meta(self) -> str:
        return f"crawlerd_{self.crawl}_meta"


def transient(exc: BaseException) -> bool:
    """True for errors a JetStream cluster gives while a leader is elected or a node is away."""
    if isinstance(exc, nats.js.errors.KeyWrongLastSequenceError):
        return False
    if isinstance(exc, (asyncio.TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError,
                        nats.js.errors.NoStreamResponseError, nats.errors.ConnectionReconnectingError,
                        nats.errors.StaleConnectionError, nats.errors.OutboundBufferLimitError,
                        nats.js.errors.ServiceUnavailableError, nats.js.errors.ServerError)):
        return True
    if isinstance(exc, nats.js.errors.APIError):
        return getattr(exc, "err_code", None) in _TRANSIENT_API
    return False


def backoff(delay: float) -> float:
    """The next retry delay: doubling from RETRY_FIRST_S, at most RETRY_MAX_S."""
    return min(RETRY_MAX_S, max(RETRY_FIRST_S, delay * 2))


async def stop_tasks(tasks: list[asyncio.Task], timeout_s: float = 5.0) -> None:
    """Cancel ``tasks`` and wait for them. A cancel can be swallowed by ``asyncio.wait_for`` in a
    library (Python 3.11 loses it when the awaited call completes at the same moment): such a
    task is cancelled again until it ends, at most ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pending = [t for t in tasks if not t.done()]
    while pending and loop.time() < deadline:
        for t in pending:
            t.cancel()
        _done, left = await asyncio.wait(pending, timeout=0.1)
        pending = list(left)


class Link:
    """One NATS connection and its JetStream context (``nc``, ``js``) for crawl ``names``."""

    def __init__(self, servers: list[str], names: Names, *, name: str = "crawlerd",
                 connect_timeout_s: float = 2.0, request_timeout_s: float = 2.0):
        if not servers:
            raise ClusterError("cluster.servers is empty")
        for s in servers:
            if not s.startswith(("nats://", "tls://")):
                raise ClusterError(f"cluster.servers {s!r}: expected nats://HOST:PORT")
        self.servers = list(servers)
        self.names = names
        self.client_name = name
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.nc: nats.NATS | None = None
        self.js = None
        self.disconnects = 0

    async def open(self, timeout_s: float = 30.0) -> Link:
        """Connect (to any of the servers) and wait until JetStream answers; ClusterError after
        ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s

        async def on_error(e):
            log.debug("nats: %s", e)

        async def on_disconnect():
            self.disconnects += 1

        last: BaseException | None = None
        while loop.time() < deadline:
            try:
                # (with unbounded reconnects the first connect would retry forever: bound it here)
                self.nc = await asyncio.wait_for(nats.connect(
                    servers=self.servers, name=self.client_name, connect_timeout=self.connect_timeout_s,
                    allow_reconnect=True, max_reconnect_attempts=-1, reconnect_time_wait=0.2,
                    error_cb=on_error, disconnected_cb=on_disconnect), max(0.1, deadline - loop.time()))
                break
            except (TimeoutError, OSError, nats.errors.Error) as e:
                last = e
                await asyncio.sleep(0.2)
        if self.nc is None:
            why = str(last) or ("no answer in time" if isinstance(last, TimeoutError) else type(last).__name__)
            raise ClusterError(f"cannot reach any of {', '.join(self.servers)}: {why}")
        self.js = self.nc.jetstream(timeout=self.request_timeout_s)
        delay = RETRY_FIRST_S
        while True:
            try:
                await self.js.account_info()
                return self
            except Exception as e:
                if not transient(e) or loop.time() > deadline:
                    await self.close()
                    raise ClusterError(f"JetStream not available at {', '.join(self.servers)}: {e}") from None
                await asyncio.sleep(delay)
                delay = backoff(delay)

    async def retry(self, op, *, what: str, timeout_s: float = 60.0):
        """``await op()`` again through transient errors (leader elections) for up to ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        delay = RETRY_FIRST_S
        while True:
            try:
                return await op()
            except Exception as e:
                if not transient(e) or loop.time() > deadline:
                    raise
                log.debug("%s: %s (retrying)", what, e)
                await asyncio.sleep(delay)
                delay = backoff(delay)

    async def ensure_stream(self, *, replicas: int, max_batches_per_shard: int, dedup_window_s: float):
        """Create the hand-off stream, or bring its limits to these values."""
        cfg = api.StreamConfig(
            name=self.names.stream, subjects=[self.names.subjects],
            retention=api.RetentionPolicy.WORK_QUEUE, storage=api.StorageType.FILE,
            num_replicas=replicas, duplicate_window=dedup_window_s,
            max_msgs_per_subject=max_batches_per_shard, discard=api.DiscardPolicy.NEW,
            discard_new_per_subject=True)

        async def op():
            try:
                return await self.js.add_stream(cfg)
            except nats.js.errors.BadRequestError as e:
                if e.err_code != 10058:         # exists with another configuration
                    raise
                return await self.js.update_stream(cfg)
        return await self.retry(op, what="create stream")

    async def ensure_consumer(self, shard: int, *, ack_wait_s: float, max_ack_pending: int):
        """The durable pull consumer of ``shard`` (created once; later calls find it)."""
        cfg = api.ConsumerConfig(
            durable_name=self.names.consumer(shard), filter_subject=self.names.subject(shard),
            ack_policy=api.AckPolicy.EXPLICIT, deliver_policy=api.DeliverPolicy.ALL,
            ack_wait=ack_wait_s, max_ack_pending=max_ack_pending, max_deliver=-1)
        return await self.retry(lambda: self.js.add_consumer(self.names.stream, cfg), what="create consumer")

    async def kv(self, bucket: str, *, replicas: int, ttl_s: float | None = None, history: int = 1):
        """Open a KV bucket, creating it when missing."""
        async def op():
            try:
                return await self.js.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                return await self.js.create_key_value(api.KeyValueConfig(
                    bucket=bucket, history=history, ttl=ttl_s, replicas=replicas,
                    storage=api.StorageType.FILE))
        return await self.retry(op, what=f"open bucket {bucket}")

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            try:
                await asyncio.wait_for(self.nc.close(), 5.0)
            except (TimeoutError, nats.errors.Error, RuntimeError):   # (its transport closed already)
                pass
        self.nc = None
        self.js = None
