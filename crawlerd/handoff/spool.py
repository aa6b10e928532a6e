"""The one-machine hand-off transport: a spool directory per destination, one file per batch.

``<root>/<dest>/<source:05d>-<seq:020d>.hb`` is written under a dot-name and renamed into place
(optionally fsynced first), so a file the receiver sees is whole; the receiver deletes it once
its seen-set journal holds the records: the delete *is* the acknowledgement, and a batch
survives ``kill -9`` of either side (it is in the page cache; with ``fsync`` it survives power
loss too). The number of a source's files in a destination's directory is the channel's fill
level: at ``max_pending`` the sender waits (backpressure) instead of writing more.

Key of a batch: (source, seq); a source's seq grows across its restarts (it starts above the
largest seq it finds and above the wall clock in microseconds). Invariant: a staged record is in
RAM (``staged``) until a file holding it was renamed into place; ``durable`` is the mark of the
last stage call all of whose records are in files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Iterable

from crawlerd.handoff.batch import Batch, BatchError, decode_batch, encode_batch
from crawlerd.store.fsync import fsync_dir, write_all

log = logging.getLogger("crawlerd.handoff")

_NAME = re.compile(r"^(\d{5})-(\d{20})\.hb$")
_ROOM_POLL_S = 0.05             # a full channel is looked at again this often


def batch_name(source: int, seq: int) -> str:
    return f"{source:05d}-{seq:020d}.hb"


class SpoolOutbox:
    """Records staged per destination, written as batch files by a flusher task (see module doc)."""

    def __init__(self, root: str, source: int, dests: Iterable[int], *, max_pending: int = 256,
                 batch_records: int = 4096, flush_interval_s: float = 0.1, fsync: bool = False,
                 wall=time.time):
        if max_pending < 1 or batch_records < 1 or flush_interval_s <= 0:
            raise ValueError("max_pending, batch_records and flush_interval_s must be positive")
        self.root = root
        self.source = source
        self.dests = sorted(set(dests))
        self.max_pending = max_pending
        self.batch_records = batch_records
        self.flush_interval_s = flush_interval_s
        self.fsync = fsync
        self.staged: dict[int, list[tuple[int, bytes]]] = {d: [] for d in self.dests}
        self._pending: dict[int, int] = {}
        self.blocked: set[int] = set()          # destinations whose channel is full right now
        self.batches_sent = 0
        self.records_sent = 0
        self.bytes_sent = 0
        self._mark = 0                          # stage calls so far
        self._durable = 0
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closed = False
        top = 0
        prefix = f"{source:05d}-"
        for d in self.dests:
            path = self._dir(d)
            os.makedirs(path, exist_ok=True)
            mine = 0
            for name in os.listdir(path):
                if name.startswith(f".tmp-{prefix}"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(path, name))     # a write cut short by a crash
                    continue
                m = _NAME.match(name)
                if m and name.startswith(prefix):
                    mine += 1
                    top = max(top, int(m.group(2)))
            self._pending[d] = mine
        self._seq = max(top + 1, int(wall() * 1e6))

    def _dir(self, dest: int) -> str:
        return os.path.join(self.root, str(dest))

    # -- the sender's calls -------------------------------------------------------------
    def start(self) -> None:
        """Start the flusher on the running loop."""
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._flusher())

    def stage(self, dest: int, records: list[tuple[int, bytes]]) -> None:
        if self._closed:
            raise RuntimeError("outbox is closed")
        if dest not in self.staged:
            raise ValueError(f"no channel to shard {dest}")
        self.staged[dest].extend(records)
        self._mark += 1
        if len(self.staged[dest]) >= self.batch_records and self._wake is not None:
            self._wake.set()

    def barrier(self) -> asyncio.Future | None:
        """None when everything staged is in files; else a future resolved once it is."""
        if self._durable >= self._mark:
            return None
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((self._mark, fut))
        return fut

    async def send(self, dest: int, records: list[tuple[int, bytes]]) -> None:
        self.stage(dest, records)
        await self.flush()

    async def flush(self) -> None:
        """Write everything staged so far (waiting for room in full channels)."""
        fut = self.barrier()
        if fut is None:
            return
        if self._task is None:
            await self._flush_round()
        else:
            self._wake.set()
            await fut

    def backlog(self) -> dict[int, dict[str, int]]:
        """Per destination: batch files not yet consumed (counted now), records staged in RAM."""
        for d in self.dests:
            self._pending[d] = self._count(d)
        return {d: {"batches": self._pending[d], "staged": len(self.staged[d])} for d in self.dests}

    def pending_records(self) -> int:
        return sum(len(v) for v in self.staged.values())

    async def close(self, timeout_s: float = 5.0) -> None:
        """Write what is staged (up to ``timeout_s``: a full channel may keep records in RAM, whose
        leases then never completed, so they are fetched again), then stop the flusher."""
        if self._task is not None:
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self.flush(), timeout_s)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._closed = True
        for _m, fut in self._waiters:
            if not fut.done():
                fut.cancel()
        self._waiters.clear()

    # -- the flusher ----------------------------------------------------------------------
    async def _flusher(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
            self._wake.clear()
            try:
                await self._flush_round()
            except OSError as e:        # a full disk: keep the records, say so, try again
                log.error("hand-off write failed (kept in RAM, retried): %s", e)
                await asyncio.sleep(1.0)

    async def _flush_round(self) -> None:
        mark = self._mark
        for d in self.dests:
            recs = self.staged[d]
            while recs:
                await self._room(d)
                chunk = recs[:self.batch_records]
                self._write(d, chunk)
                del recs[:len(chunk)]       # only once the file holding them is in place
        # staged during the round (while waiting for room) belongs to the next one
        if all(not self.staged[d] for d in self.dests):
            mark = self._mark
        self._durable = max(self._durable, mark)
        keep = []
        for m, fut in self._waiters:
            if m <= self._durable:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((m, fut))
        self._waiters = keep

    async def _room(self, dest: int) -> None:
        while self._pending[dest] >= self.max_pending:
            self._pending[dest] = self._count(dest)
            if self._pending[dest] < self.max_pending:
                break
            self.blocked.add(dest)
            await asyncio.sleep(_ROOM_POLL_S)
        self.blocked.discard(dest)

    def _count(self, dest: int) -> int:
        prefix = f"{self.source:05d}-"
        return sum(1 for n in os.listdir(self._dir(dest)) if n.startswith(prefix) and n.endswith(".hb"))

    def _write(self, dest: int, records: list[tuple[int, bytes]]) -> None:
        seq = self._seq
        self._seq += 1
        data = encode_batch(self.source, seq, records)
        d = self._dir(dest)
        tmp = os.path.join(d, f".tmp-{self.source:05d}-{seq}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            write_all(fd, [data])
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(d, batch_name(self.source, seq)))
        if self.fsync:
            fsync_dir(d)
        self._pending[dest] += 1
        self.batches_sent += 1
        self.records_sent += len(records)
        self.bytes_sent += len(data)


class SpoolInbox:
    """Batch files handed to shard ``me``, oldest first per source; ``ack`` deletes one."""

    def __init__(self, root: str, me: int):
        self.dir = os.path.join(root, str(me))
        os.makedirs(self.dir, exist_ok=True)
        self._delivered: set[str] = set()       # names handed out and not acknowledged yet
        self.batches_received = 0
        self.records_received = 0
        self.corrupt = 0

    def receive(self, max_records: int = 65536) -> list[Batch]:
        out: list[Batch] = []
        n = 0
        for name in sorted(os.listdir(self.dir)):
            if n >= max_records:
                break
            if name in self._delivered or not _NAME.match(name):
                continue
            path = os.path.join(self.dir, name)
            try:
                with open(path, "rb") as f:
                    data = f.read()
                batch = decode_batch(data)
            except FileNotFoundError:
                continue
            except BatchError as e:
                # only a power loss without handoff.fsync can leave one: keep it aside, say so
                self.corrupt += 1
                log.error("hand-off batch %s is corrupt, moved aside: %s", path, e)
                with contextlib.suppress(OSError):
                    os.rename(path, os.path.join(self.dir, ".bad-" + name))
                continue
            batch.ref = path
            self._delivered.add(name)
            out.append(batch)
            n += len(batch.records)
        return out

    def ack(self, batch: Batch) -> None:
        """The batch's records are in the seen-set journal: the sender's copy may go."""
        path = batch.ref
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._delivered.discard(os.path.basename(path))
        self.batches_received += 1
        self.records_received += len(batch.records)

    def backlog(self) -> int:
        return sum(1 for n in os.listdir(self.dir) if _NAME.match(n))
