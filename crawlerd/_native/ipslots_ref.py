"""Pure-Python reference of ``ipslots.IPSlots``: the same file, the same answers, serialised by locks.

Every operation takes an exclusive ``fcntl`` lock on the whole file, reads and writes the words
through an mmap, and lets go; a process killed inside an operation drops its lock with it. Used
to test the native kernel against (same operation sequences, same results, same bytes on disk)
and where the native module is not built.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct

MAGIC = 0x31544C5350494352
VERSION = 1
HEADER_BYTES = 64
MAX_SHARDS = 0xFFFF
GEN_MASK = (1 << 48) - 1
_HEAD = struct.Struct("<QIIQI")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")


def _gens_bytes(shards: int) -> int:
    return ((shards * 8 + 63) // 64) * 64


def table_bytes(shards: int, cells: int, entries: int) -> int:
    return HEADER_BYTES + _gens_bytes(shards) + entries * 8 * (1 + cells)


def _check_shape(shards: int, cells: int, entries: int) -> None:
    if not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shards = {shards}: expected 1..{MAX_SHARDS}")
    if not 1 <= cells <= 255:
        raise ValueError(f"cells = {cells}: expected 1..255")
    if entries < 1 or entries & (entries - 1):
        raise ValueError(f"entries = {entries}: expected a power of two")


def create(path: str, shards: int, cells: int, entries: int = 1 << 20) -> None:
    _check_shape(shards, cells, entries)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, table_bytes(shards, cells, entries))
        os.pwrite(fd, _HEAD.pack(MAGIC, VERSION, cells, entries, shards), 0)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _bits(x: float) -> int:
    return _U64.unpack(_F64.pack(x))[0]


def _float(b: int) -> float:
    return _F64.unpack(_U64.pack(b))[0]


class RefIPSlots:
    """Same API and semantics as the native ``IPSlots`` (see ``ipslots.pyx``)."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_RDWR)
        head = os.pread(self._fd, HEADER_BYTES, 0)
        if len(head) < _HEAD.size:
            os.close(self._fd)
            raise ValueError(f"{path}: not an IP slot table (too short)")
        magic, version, cells, entries, shards = _HEAD.unpack_from(head)
        if magic != MAGIC or version != VERSION:
            os.close(self._fd)
            raise ValueError(f"{path}: not an IP slot table (magic {magic:#x}, version {version})")
        _check_shape(shards, cells, entries)
        self.cells, self.entries, self.shards = cells, entries, shards
        size = table_bytes(shards, cells, entries)
        if os.fstat(self._fd).st_size < size:
            os.close(self._fd)
            raise ValueError(f"{path}: truncated IP slot table")
        self._m = mmap.mmap(self._fd, size)
        self._gens = HEADER_BYTES
        self._entries = HEADER_BYTES + _gens_bytes(shards)
        self._stride = 1 + cells
        self.shard = -1
        self.generation = 0
        self._tag = 0

    # words ---------------------------------------------------------------
    def _get(self, off: int) -> int:
        return _U64.unpack_from(self._m, off)[0]

    def _put(self, off: int, v: int) -> None:
        _U64.pack_into(self._m, off, v)

    def _entry(self, key: int) -> int:
        return self._entries + (key & (self.entries - 1)) * self._stride * 8

    def _locked(self):
        if self._m is None:
            raise ValueError("IP slot table is closed")
        return _Lock(self._fd)

    # API ----------------------------------------------------------------------
    def close(self) -> None:
        if self._m is not None:
            self._m.close()
            os.close(self._fd)
            self._m = None

    def attach(self, shard: int, now: float = 0.0, delay_s: float = 0.0) -> int:
        if not 0 <= shard < self.shards:
            raise ValueError(f"shard {shard} outside 0..{self.shards - 1}")
        with self._locked():
            off = self._gens + 8 * shard
            gen = (self._get(off) + 1) & ((1 << 64) - 1)
            self._put(off, gen)
            gen &= GEN_MASK
            self.shard, self.generation = shard, gen
            self._tag = (gen << 16) | (shard + 1)
            self._free_cells(shard, gen, now + delay_s if delay_s > 0 else 0.0)
        return gen

    def reclaim(self, shard: int, now: float = 0.0, delay_s: float = 0.0) -> int:
        if not 0 <= shard < self.shards:
            raise ValueError(f"shard {shard} outside 0..{self.shards - 1}")
        with self._locked():
            return self._free_cells(shard, None, now + delay_s if delay_s > 0 else 0.0)

    def _free_cells(self, shard: int, keep_gen: int | None, due_at: float) -> int:
        n = 0
        for e in range(self.entries):
            base = self._entries + e * self._stride * 8
            for c in range(1, self._stride):
                v = self._get(base + 8 * c)
                if v and (v & 0xFFFF) == shard + 1 and (keep_gen is None or v >> 16 != keep_gen):
                    if due_at > 0 and _float(self._get(base)) < due_at:
                        self._put(base, _bits(due_at))
                    self._put(base + 8 * c, 0)
                    n += 1
        return n

    def try_acquire(self, key: int, now: float, delay_s: float) -> float:
        if self._m is None:
            raise ValueError("IP slot table is closed")
        if self.shard < 0:
            raise ValueError("attach(shard) first")
        if not now > 0:
            raise ValueError(f"now = {now!r}: times must be positive")
        base = self._entry(key)
        with self._locked():
            due = _float(self._get(base))
            if delay_s > 0 and due > now:
                return due
            for c in range(1, self._stride):
                if self._get(base + 8 * c) == 0:
                    self._put(base + 8 * c, self._tag)
                    break
            else:
                return now
            if delay_s > 0:
                self._put(base, _bits(max(now + delay_s, due)))
            return 0.0

    def release(self, key: int, now: float, delay_s: float) -> bool:
        if self._m is None:
            raise ValueError("IP slot table is closed")
        if self.shard < 0:
            raise ValueError("attach(shard) first")
        base = self._entry(key)
        with self._locked():
            if delay_s > 0:
                want = now + delay_s
                if _float(self._get(base)) < want:
                    self._put(base, _bits(want))
            for c in range(1, self._stride):
                if self._get(base + 8 * c) == self._tag:
                    self._put(base + 8 * c, 0)
                    return True
            return False

    def held(self, shard: int = -1) -> int:
        with self._locked():
            n = 0
            for e in range(self.entries):
                base = self._entries + e * self._stride * 8
                for c in range(1, self._stride):
                    v = self._get(base + 8 * c)
                    if v and (shard < 0 or (v & 0xFFFF) == shard + 1):
                        n += 1
            return n

    def due(self, key: int) -> float:
        with self._locked():
            return _float(self._get(self._entry(key)))


class _Lock:
    """An exclusive lock on the whole file for one operation."""

    def __init__(self, fd: int):
        self.fd = fd

    def __enter__(self):
        fcntl.lockf(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.lockf(self.fd, fcntl.LOCK_UN)
        return False
