"""robots.txt entries on disk, so a restart does not fetch a fresh robots.txt again.

An append-only log, one record per entry the crawler decided (RFC 9309 §2.4: a copy may be
used for up to 24 hours), written with one unbuffered ``write`` and no fsync: a write that
returned survives ``kill -9`` (the page cache outlives the process). A record holds the host
key, the wall-clock fetch and expiry times, the state, status, failures, note and the
*source*: the bytes the rules are parsed from (empty for allow-all). Rules are parsed again
when an entry is read back, with the agent token of that run.

Record layout: ``<IHHdd HHB`` header (record length, host length, note length, fetched_at,
expires_at, status, failures, state index) then host, note and source bytes. A torn last
record (the process died mid-write) is cut off at open.

Bounds: the index keeps the newest record of at most ``max_entries`` hosts (oldest out
first) and only records younger than ``keep_s`` (a stale copy is never used after that); the
log is rewritten with the live records when it grows past twice their size.

Threads: ``put`` (and the compaction it may start) runs on one thread, the shard's writer
thread (``RobotsCache`` hands its writes over); ``get`` may run on another (the loop). A lock
covers an index lookup with its ``pread`` and the compaction's swap of file and index, so a
read never sees an index entry of the other file; the compaction's copying runs outside it.
"""

from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict
from typing import NamedTuple

__all__ = ["RobotsStore", "StoredEntry"]

FILE_NAME = "robots.log"
_HEAD = struct.Struct("<IHHddHHB")
_MIN_COMPACT_BYTES = 1 << 20


class StoredEntry(NamedTuple):
    """One record read back (times in wall-clock seconds)."""

    host_key: str
    fetched_at: float
    expires_at: float
    status: int
    failures: int
    state: int
    note: str
    source: bytes


def _encode(e: StoredEntry) -> bytes:
    hk = e.host_key.encode("utf-8", "surrogateescape")
    note = e.note.encode("utf-8", "replace")[:0xFFFF]
    total = _HEAD.size + len(hk) + len(note) + len(e.source)
    return (_HEAD.pack(total, len(hk), len(note), e.fetched_at, e.expires_at, min(max(e.status, 0), 0xFFFF),
                       min(e.failures, 0xFFFF), e.state) + hk + note + e.source)


def _decode(buf: bytes | memoryview, pos: int) -> tuple[StoredEntry, int] | None:
    if pos + _HEAD.size > len(buf):
        return None
    total, hlen, nlen, fetched, expires, status, failures, state = _HEAD.unpack_from(buf, pos)
    end = pos + total
    if total < _HEAD.size + hlen + nlen or end > len(buf):
        return None
    p = pos + _HEAD.size
    hk = bytes(buf[p:p + hlen]).decode("utf-8", "surrogateescape")
    note = bytes(buf[p + hlen:p + hlen + nlen]).decode("utf-8", "replace")
    source = bytes(buf[p + hlen + nlen:end])
    return StoredEntry(hk, fetched, expires, status, failures, state, note, source), end


class RobotsStore:
    """The log and its index. Key: host key → (offset, length) of its newest record.

    Invariant: every indexed record lies wholly inside the file and is the last one written
    for its host; ``_live_bytes`` is the sum of the indexed records' lengths.
    """

    def __init__(self, directory: str, *, max_entries: int, keep_s: float, now_wall: float):
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, FILE_NAME)
        self._max_entries = max_entries
        self._keep_s = keep_s
        self._index: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._live_bytes = 0
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._size = self._load(now_wall)

    def _load(self, now_wall: float) -> int:
        with open(self.path, "rb") as f:
            data = f.read()
        pos = 0
        while True:
            got = _decode(data, pos)
            if got is None:
                break
            e, end = got
            self._index_put(e.host_key, pos, end - pos)
            pos = end
        if pos < len(data):
            os.truncate(self.path, pos)             # a torn last record
        for hk in [hk for hk, (off, n) in self._index.items() if _fetched_at(data, off) < now_wall - self._keep_s]:
            self._index_drop(hk)
        return pos

    def _index_put(self, hk: str, off: int, n: int) -> None:
        old = self._index.pop(hk, None)
        if old is not None:
            self._live_bytes -= old[1]
        self._index[hk] = (off, n)
        self._live_bytes += n
        while len(self._index) > self._max_entries:
            _k, (_o, m) = self._index.popitem(last=False)
            self._live_bytes -= m

    def _index_drop(self, hk: str) -> None:
        old = self._index.pop(hk, None)
        if old is not None:
            self._live_bytes -= old[1]

    def get(self, host_key: str) -> StoredEntry | None:
        with self._lock:
            where = self._index.get(host_key)
            if where is None:
                return None
            off, n = where
            raw = os.pread(self._fd, n, off)
        got = _decode(raw, 0)
        return None if got is None else got[0]

    def put(self, e: StoredEntry) -> None:
        data = _encode(e)
        os.pwrite(self._fd, data, self._size)
        with self._lock:
            self._index_put(e.host_key, self._size, len(data))
        self._size += len(data)
        if self._size > _MIN_COMPACT_BYTES and self._size > 2 * self._live_bytes:
            self._compact()

    def _compact(self) -> None:
        """Rewrite the log with the indexed records only (temp name, rename). Runs on the thread
        that puts, so the index does not change while it is copied; only the swap is locked."""
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        index: OrderedDict[str, tuple[int, int]] = OrderedDict()
        pos = 0
        try:
            for hk, (off, n) in list(self._index.items()):
                os.pwrite(fd, os.pread(self._fd, n, off), pos)
                index[hk] = (pos, n)
                pos += n
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            os.close(self._fd)
            self._fd, self._index, self._size, self._live_bytes = fd, index, pos, pos

    def __len__(self) -> int:
        return len(self._index)

    @property
    def size_bytes(self) -> int:
        return self._size

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _fetched_at(data: bytes, off: int) -> float:
    return _HEAD.unpack_from(data, off)[3]
