"""The hand-off over NATS JetStream: shards on several machines (same interface as ``spool``).

Sender (``JetStreamOutbox``): staged records are written as batch files into a spool directory
on the sender's own disk (``SpoolOutbox``: the durable outbox, bounded by ``max_pending``
unpublished batches per destination), then a relay publishes each file to the destination's
subject ``crawlerd.<crawl>.urls.<dest>`` with ``Nats-Msg-Id: <source>-<seq>`` (prefixed with
the node's name for the supervisor's seeds: source N on every node) and deletes it only once
JetStream acknowledged the publish (stored on a quorum of the stream's replicas). A
publish that fails while the cluster elects a new stream leader, or that the stream refuses
because the destination's backlog is at its limit (``max_msgs_per_subject``, discard new),
is tried again with backoff; the file stands meanwhile, so ``kill -9`` of the sender, of a
server or of the stream leader loses nothing, and a publish repeated after a lost answer is
dropped by the stream's duplicate window. ``barrier()`` resolves once records are in files.

Receiver (``JetStreamInbox``): a task pulls from the shard's durable consumer ``shard-<i>``
into a small buffer; ``receive()`` hands buffered batches out; ``ack(batch)`` (after the seen-set
journal holds it) acknowledges the message with a confirmed ack, retried through elections. A
message not acknowledged within the consumer's ack wait is delivered again (a receiver killed
mid-batch); buffered messages get ``in_progress`` so a slow receiver is not redelivered to, and
a batch already applied in this process (its ack answer was lost) is acknowledged again without
being handed out twice. After a receiver restart a redelivered batch is absorbed by its DRUM.

Keys: a batch is ``(source, seq)``; a buffered message is keyed by its stream sequence.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
from collections.abc import Iterable

import nats.errors
import nats.js.errors

from crawlerd.cluster.engine import Link, backoff, stop_tasks, transient
from crawlerd.handoff.batch import Batch, BatchError, decode_batch, encode_batch
from crawlerd.handoff.spool import SpoolInbox, SpoolOutbox

log = logging.getLogger("crawlerd.handoff")

MSG_ID = "Nats-Msg-Id"
WRITTEN = "Crawlerd-Written"        # wall time the batch file was written (hand-off latency)
_IDLE_POLL_S = 0.05                 # drain() looks at what is left this often
# the flusher wakes a relay when it wrote files; without a wake a relay looks again this often
# (files a previous process left, a publish given up for the moment): N-1 relays per shard,
# so this is not a busy poll
_RELAY_IDLE_S = 1.0
_RECENT_ACKED = 65536               # (source, seq) of batches applied by this process, remembered
_LATENCY_SAMPLES = 4096


def msg_id(source: int, seq: int) -> str:
    return f"{source}-{seq}"


class JetStreamOutbox:
    """The sender side (see module doc); the ``spool.SpoolOutbox`` interface plus the relay."""

    def __init__(self, link: Link, root: str, source: int, dests: Iterable[int], *, max_pending: int = 256,
                 batch_records: int = 4096, flush_interval_s: float = 0.1, fsync: bool = False,
                 publish_timeout_s: float = 2.0, id_prefix: str = "", wall=time.time):
        self.link = link
        self.source = source
        self.id_prefix = id_prefix          # in the de-duplication id: sources that are not unique (seeds)
        self.local = SpoolOutbox(root, source, dests, max_pending=max_pending, batch_records=batch_records,
                                 flush_interval_s=flush_interval_s, fsync=fsync, wall=wall)
        self.dests = self.local.dests
        self.publish_timeout_s = publish_timeout_s
        self.wall = wall
        self._relays = {d: SpoolInbox(root, d) for d in self.dests}
        self._tasks: list[asyncio.Task] = []
        self._kick = None
        self.published = 0                  # batches JetStream acknowledged
        self.records_sent = 0
        self.bytes_sent = 0
        self.duplicates = 0                 # publishes the stream had already (a repeat after a lost ack)
        self.retries = 0
        self.refused = 0                    # publishes refused: the destination's backlog was full
        self.last_error = ""
        self.max_publish_s = 0.0            # longest from first try to JetStream's ack (an election)
        self.publish_latency_s: collections.deque = collections.deque(maxlen=_LATENCY_SAMPLES)

    # -- the Outbox interface ------------------------------------------------------------
    def start(self) -> None:
        self._kick = asyncio.Event()
        self._tasks = [asyncio.ensure_future(self._flusher())]
        self._tasks += [asyncio.ensure_future(self._relay(d)) for d in self.dests]

    def stage(self, dest: int, records: list[tuple[int, bytes]]) -> None:
        self.local.stage(dest, records)

    def barrier(self):
        return self.local.barrier()

    async def send(self, dest: int, records: list[tuple[int, bytes]]) -> None:
        await self.local.send(dest, records)
        self._wake()

    async def flush(self) -> None:
        await self.local.flush()
        self._wake()

    @property
    def blocked(self) -> set[int]:
        return self.local.blocked

    @property
    def batches_sent(self) -> int:
        return self.published

    def backlog(self) -> dict[int, dict[str, int]]:
        """Per destination: batches on local disk not yet stored by JetStream, records staged."""
        return self.local.backlog()

    def pending_records(self) -> int:
        return self.local.pending_records()

    def unpublished(self) -> int:
        """Batch files waiting for JetStream's acknowledgement, all destinations."""
        return sum(len(self._files(d)) for d in self.dests)

    def stats(self) -> dict:
        return {"published": self.published, "records": self.records_sent, "bytes": self.bytes_sent,
                "duplicates": self.duplicates, "retries": self.retries, "refused": self.refused,
                "unpublished": self.unpublished(), "last_error": self.last_error}

    async def drain(self, timeout_s: float) -> bool:
        """Write what is staged and wait until JetStream holds every batch; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.local.flush(), timeout_s)
        while self.unpublished() and loop.time() < deadline:
            self._wake()
            await asyncio.sleep(_IDLE_POLL_S)
        return not self.unpublished() and not self.pending_records()

    async def close(self, timeout_s: float = 5.0) -> None:
        """Write what is staged, give the relay up to ``timeout_s`` to publish it, stop. What is
        left stays in the local outbox and is published by the next start."""
        await self.drain(timeout_s)
        await self.local.close(0.1)
        await stop_tasks(self._tasks)
        self._tasks = []

    # -- the flusher and the relay ----------------------------------------------------------
    async def _flusher(self) -> None:
        """Write staged records as batch files every flush interval, then wake the relays at once
        (the local spool's own flusher is not started: this one knows when files appeared)."""
        while True:
            await asyncio.sleep(self.local.flush_interval_s)
            try:
                await self.local.flush()
            except OSError as e:            # a full disk: the records stay staged, tried again
                log.error("hand-off write failed (kept in RAM, retried): %s", e)
                await asyncio.sleep(1.0)
            self._wake()

    def _wake(self) -> None:
        if self._kick is not None:
            self._kick.set()

    def _files(self, dest: int) -> list[str]:
        d = self._relays[dest].dir
        prefix = f"{self.source:05d}-"
        return [n for n in os.listdir(d) if n.startswith(prefix) and n.endswith(".hb")]

    async def _relay(self, dest: int) -> None:
        inbox = self._relays[dest]
        subject = self.link.names.subject(dest)
        while True:
            batches = inbox.receive(1 << 20)
            if not batches:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_RELAY_IDLE_S):      # (no cancel lost, unlike wait_for)
                        await self._kick.wait()
                self._kick.clear()
                continue
            for batch in batches:
                try:
                    await self._publish(subject, batch)
                except nats.errors.ConnectionClosedError:
                    return                  # the link was closed: the files wait for the next start
                inbox.ack(batch)            # deletes the file: JetStream holds the batch now

    async def _publish(self, subject: str, batch: Batch) -> None:
        data = encode_batch(batch.source, batch.seq, batch.records)
        try:
            written = os.stat(batch.ref).st_mtime
        except OSError:
            written = self.wall()
        headers = {MSG_ID: self.id_prefix + msg_id(batch.source, batch.seq), WRITTEN: f"{written:.6f}"}
        delay = 0.0
        first = time.monotonic()
        while True:
            t0 = time.monotonic()
            try:
                ack = await self.link.js.publish(subject, data, timeout=self.publish_timeout_s, headers=headers)
            except nats.errors.ConnectionClosedError:
                raise
            except Exception as e:
                if not (transient(e) or _backlog_full(e)):
                    # not a passing state of the cluster (a deleted stream, a refused subject):
                    # the file stands; say so, and try again slowly
                    if str(e) != self.last_error:
                        log.error("hand-off publish to %s failed (kept, retried): %s", subject, e)
                    self.last_error = str(e)
                    await asyncio.sleep(1.0)
                    continue
                if _backlog_full(e):
                    self.refused += 1
                else:
                    self.retries += 1
                self.last_error = str(e)
                delay = backoff(delay)
                await asyncio.sleep(delay)
                continue
            done = time.monotonic()
            self.publish_latency_s.append(done - t0)
            self.max_publish_s = max(self.max_publish_s, done - first)
            if ack.duplicate:
                self.duplicates += 1
            self.published += 1
            self.records_sent += len(batch.records)
            self.bytes_sent += len(data)
            return


def _backlog_full(e: BaseException) -> bool:
    # 10077: maximum messages per subject exceeded (discard new): the destination is behind
    return isinstance(e, nats.js.errors.APIError) and e.err_code in (10077, 10027, 10047)


class JetStreamInbox:
    """The receiver side of shard ``me`` (see module doc); the ``spool.SpoolInbox`` interface."""

    def __init__(self, link: Link, me: int, *, buffer_batches: int = 32, fetch_wait_s: float = 1.0,
                 ack_wait_s: float = 30.0, max_ack_pending: int = 256, wall=time.time):
        self.link = link
        self.me = me
        self.buffer_batches = buffer_batches
        self.fetch_wait_s = fetch_wait_s
        self.ack_wait_s = ack_wait_s
        self.max_ack_pending = max_ack_pending
        self.wall = wall
        self._buffer: collections.deque[Batch] = collections.deque()
        self._held: dict[int, tuple[object, float]] = {}     # stream seq -> (msg, time of last touch)
        self._recent: collections.OrderedDict[tuple[int, int], None] = collections.OrderedDict()
        self._acks: asyncio.Queue | None = None
        self._tasks: list[asyncio.Task] = []
        self._sub = None
        self.batches_received = 0
        self.records_received = 0
        self.corrupt = 0
        self.redelivered = 0                # deliveries the server counted as a second or later
        self.repeats = 0                    # already applied here: acknowledged again, not handed out
        self.applied_twice = 0              # batches whose records reached the intake twice (DRUM absorbs them)
        self.ack_retries = 0
        self.consumer = {"num_pending": 0, "num_ack_pending": 0, "num_redelivered": 0}
        self.latency_s: collections.deque = collections.deque(maxlen=_LATENCY_SAMPLES)

    async def open(self) -> JetStreamInbox:
        """Create the durable consumer if needed and bind a pull subscription to it."""
        names = self.link.names
        await self.link.ensure_consumer(self.me, ack_wait_s=self.ack_wait_s, max_ack_pending=self.max_ack_pending)
        self._sub = await self.link.retry(
            lambda: self.link.js.pull_subscribe_bind(names.consumer(self.me), names.stream),
            what="bind consumer")
        return self

    def start(self) -> None:
        self._acks = asyncio.Queue()
        self._tasks = [asyncio.ensure_future(self._puller()), asyncio.ensure_future(self._acker()),
                       asyncio.ensure_future(self._watch())]

    # -- the Inbox interface ------------------------------------------------------------
    def receive(self, max_records: int = 65536) -> list[Batch]:
        out: list[Batch] = []
        n = 0
        while self._buffer and n < max_records:
            b = self._buffer.popleft()
            out.append(b)
            n += len(b.records)
        return out

    def ack(self, batch: Batch) -> None:
        """The batch's records are in the seen-set journal: acknowledge it to the stream."""
        key = (batch.source, batch.seq)
        if key in self._recent:             # two copies of one batch both handed out (stored twice)
            self.applied_twice += 1
        self._remember(key)
        self.batches_received += 1
        self.records_received += len(batch.records)
        self._acks.put_nowait(batch.ref)

    def backlog(self) -> int:
        """Batches waiting: buffered here plus not yet delivered by the consumer (last known)."""
        return len(self._buffer) + int(self.consumer.get("num_pending", 0))

    def stats(self) -> dict:
        return {"received": self.batches_received, "records": self.records_received, "corrupt": self.corrupt,
                "redelivered": self.redelivered, "repeats": self.repeats, "applied_twice": self.applied_twice,
                "buffered": len(self._buffer),
                **{k: int(v) for k, v in self.consumer.items()}}

    async def close(self, timeout_s: float = 5.0) -> None:
        """Send the acks queued so far (up to ``timeout_s``), hand buffered batches back (nak:
        delivered again at once, to the next owner), stop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        await stop_tasks(self._tasks[:1] + self._tasks[2:])
        while self._acks is not None and not self._acks.empty() and loop.time() < deadline:
            await asyncio.sleep(0.02)
        await stop_tasks(self._tasks)
        self._tasks = []
        while self._buffer:
            b = self._buffer.popleft()
            with contextlib.suppress(Exception):
                await b.ref.nak()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    # -- tasks ----------------------------------------------------------------------------
    def _remember(self, key: tuple[int, int]) -> None:
        self._recent[key] = None
        if len(self._recent) > _RECENT_ACKED:
            self._recent.popitem(last=False)

    async def _puller(self) -> None:
        delay = 0.0
        while True:
            room = self.buffer_batches - len(self._buffer)
            if room <= 0:
                await asyncio.sleep(0.02)
                continue
            try:
                msgs = await self._sub.fetch(room, timeout=self.fetch_wait_s)
                delay = 0.0
            except (TimeoutError, nats.errors.TimeoutError):
                continue                    # nothing for us within the wait: ask again
            except nats.errors.ConnectionClosedError:
                return                      # the link was closed: this inbox is done
            except Exception as e:
                if not transient(e):
                    raise
                delay = backoff(delay)
                await asyncio.sleep(delay)
                continue
            for m in msgs:
                self._take(m)

    def _take(self, m) -> None:
        md = m.metadata
        sseq = md.sequence.stream
        if md.num_delivered > 1:
            self.redelivered += 1
        try:
            batch = decode_batch(m.data)
        except BatchError as e:
            self.corrupt += 1
            log.error("hand-off message %d for shard %d is not a batch, dropped: %s", sseq, self.me, e)
            self._acks.put_nowait(m)
            return
        key = (batch.source, batch.seq)
        if key in self._recent:             # applied here already; its ack was lost
            self.repeats += 1
            self._acks.put_nowait(m)
            return
        if sseq in self._held:              # redelivered while still in the buffer
            self._held[sseq] = (m, time.monotonic())
            for b in self._buffer:
                if b.extra.get("sseq") == sseq:
                    b.ref = m
            return
        written = (m.headers or {}).get(WRITTEN)
        if written:
            with contextlib.suppress(ValueError):
                self.latency_s.append(max(0.0, self.wall() - float(written)))
        batch.ref = m
        batch.extra["sseq"] = sseq
        self._held[sseq] = (m, time.monotonic())
        self._buffer.append(batch)

    async def _acker(self) -> None:
        while True:
            m = await self._acks.get()
            delay = 0.0
            while True:
                try:
                    await m.ack_sync(timeout=self.link.request_timeout_s)
                    break
                except nats.errors.MsgAlreadyAckdError:
                    break
                except Exception as e:
                    if not transient(e):
                        log.error("hand-off ack for shard %d failed (it will be delivered again): %s", self.me, e)
                        break
                    self.ack_retries += 1
                    delay = backoff(delay)
                    await asyncio.sleep(delay)
            self._held.pop(m.metadata.sequence.stream, None)

    async def _watch(self) -> None:
        """Keep buffered messages from timing out (in_progress); refresh the consumer's numbers."""
        every = max(0.5, min(2.0, self.ack_wait_s / 4))
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            buffered = {b.extra.get("sseq") for b in self._buffer}
            for sseq, (m, touched) in list(self._held.items()):
                if sseq in buffered and now - touched > self.ack_wait_s / 3:
                    with contextlib.suppress(Exception):
                        await m.in_progress()
                    self._held[sseq] = (m, now)
            with contextlib.suppress(Exception):
                info = await self._sub.consumer_info()
                self.consumer = {"num_pending": info.num_pending or 0,
                                 "num_ack_pending": info.num_ack_pending or 0,
                                 "num_redelivered": info.num_redelivered or 0}
