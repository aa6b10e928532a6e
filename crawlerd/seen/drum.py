"""DRUM: the disk-bucketed seen-set (IRLbot, Lee et al., ACM TWeb 2009, §4).

A set of 8-byte keys (URL fingerprints; later robots hosts and STAR edges),
each with an optional fixed-size value, that answers ``check``,
``update`` and ``check+update`` without a random disk read per key. Keys are
batched per call, journalled, spread over k RAM buckets by their high bits,
spilled to per-bucket files, and answered by a merge pass that sorts each
bucket and merges it with that bucket's range of the sorted key file in one
sequential read and write. Results come back in submission order with the
caller's aux bytes (the URL). RAM: k bucket buffers + the cache + one merge
pass's scratch (the largest bucket), never a function of the keys stored.

Semantics: operations apply in submission order as on a dict. ``unique`` is
True when the key was absent just before the operation; ``value`` is the
value stored just before it (None when absent or when value_size is 0).
check+update inserts an absent key with its value; update inserts or
overwrites; check changes nothing.

Files under ``path`` (``<data_dir>/drum/``), all little-endian:

* ``MANIFEST``: JSON commit record: key file generation, its count and
  checksum, the last merged epoch. Rewritten to a temp name, fsynced, renamed.
* ``keys.<gen>``: 64-byte header (``DRUMKEY1``, version, value_size, count,
  checksum, gen), then ``count`` records ``key u64 | value``, strictly
  increasing by key. Its size must be 64 + count * (8 + value_size); the
  checksum and the order are verified by every merge as it reads the file.
* ``journal.<epoch>``: every accepted call since the last merge, one block
  per call: 40-byte header (magic, op, flags, value_size, n, aux bytes,
  first seq, payload length, checksum), then keys, cache-hit flags, cached
  values, submitted values, aux lengths, aux bytes, padded to 8 bytes.
* ``bucket.<b>``: spilled bucket records ``key | op<<62 | ordinal | value``
  of the open epoch (rebuilt from the journal on open, so never trusted).
* ``results.<epoch>``: a merged epoch's answers per ordinal (unique flag,
  stored value), kept with its journal until every result was handed out.
* ``cursor``: (epoch, seq) of the first result not yet acknowledged.

Each call is one journal block written with one write() before the keys
enter a bucket: a call that returned is in the page cache, so it survives
``kill -9``; it survives a power loss once a merge, ``sync()`` or ``close()``
fsynced the journal. Its keys get sequence numbers ``seq`` (global, stable
across restarts). Not thread-safe: one thread drives a Drum.

Recovery rule (on open, after a clean close or a crash at any point):

1. The MANIFEST names the key file; keys merged by a committed merge are
   there. Key files, results and temp files a merge left behind without
   committing are deleted.
2. The journal of the epoch after the last merged one is replayed into the
   buckets: every call that had returned is checked again by the next merge.
   A torn last block (a call that never returned) is cut off; a bad block
   before the end is an error (``DrumCorrupt``), never read as data.
3. Merged epochs whose results were not all acknowledged are delivered
   again from the cursor on. A result handed out by ``results()`` is
   acknowledged by the next ``results()`` / ``results_arrays()`` / ``close()``
   call, so delivery is at-least-once: after a crash a consumer can see a
   result again (same ``seq``, same answer), never a key answered ``unique``
   by two different checks. With ``auto_ack=False`` only ``ack()``
   acknowledges, so a consumer can acknowledge after its own commit.

Merge triggers: a bucket's bytes (spilled + buffered) reach ``merge_bytes /
buckets`` or the journal reaches ``merge_bytes`` (inline, in the submitting
call); the oldest unanswered submission is ``max_age_s`` old (``poll``); or
``flush()``. A cache of recently seen keys in front of the buckets answers
frequent repeats as duplicates at submission; they still wait for the next
merge to be dispatched in order.
"""

from __future__ import annotations

import enum
import fcntl
import json
import logging
import os
import re
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from crawlerd._native import drum as _native_drum

log = logging.getLogger(__name__)

KEY_MAGIC = b"DRUMKEY1"
RES_MAGIC = b"DRUMRES1"
HEADER_BYTES = 64
BLOCK_HEADER = 40
BLOCK_MAGIC = 0x4D555244
FORMAT = 1
_M64 = (1 << 64) - 1
_KEY_HEAD = struct.Struct("<8sIIQQQ")        # magic, version, value_size, count, checksum, gen
_RES_HEAD = struct.Struct("<8sQQQQ")         # magic, epoch, ordinals, value_size, checksum
_BLOCK = struct.Struct("<IBBHIIQQQ")         # magic, op, flags, V, n, aux bytes, first seq, payload, checksum
_CURSOR = struct.Struct("<QQQ")              # epoch, seq, checksum
_NAME = re.compile(r"^(keys|journal|results)\.(\d{12})(\.tmp)?$")


class Op(enum.IntEnum):
    CHECK = 0
    UPDATE = 1
    CHECK_UPDATE = 2


class DrumError(Exception):
    """DRUM cannot be used (directory locked, parameters do not match the files)."""


class DrumCorrupt(DrumError):
    """A DRUM file is damaged: wrong size, bad checksum, out of order, torn in the middle."""


@dataclass(slots=True)
class DrumResult:
    key: int
    op: Op
    unique: bool             # key absent just before this operation
    value: bytes | None      # value stored just before it (None if absent or value_size 0)
    aux: bytes | None        # the caller's aux bytes for this key, as submitted
    seq: int                 # global submission number, stable across restarts


@dataclass(slots=True)
class _Block:
    """One decoded journal block, with its answers once its epoch is merged."""
    op: int
    first_seq: int
    keys: np.ndarray
    hit: np.ndarray
    hitvals: np.ndarray | None
    values: np.ndarray | None
    aux_lens: np.ndarray | None
    aux: bytes
    end: int                 # journal offset just past the block


class _Ready:
    """A merged epoch whose results are being handed out: journal + answers, read sequentially.

    Invariant: ``seq`` is the next result to hand out; ``ordinal`` counts the
    bucketed keys before it; ``pos`` is the offset of the block holding it.
    """

    __slots__ = ("epoch", "journal", "results", "seq", "end_seq", "ordinal", "pos", "offset_in_block",
                 "unique", "values", "block", "_f")

    def __init__(self, epoch: int, journal: str, results: str, first_seq: int, end_seq: int):
        self.epoch = epoch
        self.journal = journal
        self.results = results
        self.seq = first_seq
        self.end_seq = end_seq
        self.ordinal = 0
        self.pos = 0
        self.offset_in_block = 0
        self.unique: np.ndarray | None = None
        self.values: np.ndarray | None = None
        self.block: _Block | None = None
        self._f = None

    def journal_file(self):
        """The journal, opened on first use (buffered, read sequentially)."""
        if self._f is None:
            self._f = open(self.journal, "rb", buffering=1 << 20)
        return self._f

    def fileno(self) -> int:
        return self.journal_file().fileno()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: str, *parts) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for data in parts:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _pad8(n: int) -> int:
    return (n + 7) & ~7


class Drum:
    """Disk-bucketed seen-set over 8-byte keys (see the module docstring for files and recovery).

    Key: the 8-byte key; one record per key in the key file. Invariant: the
    key file is strictly sorted and holds exactly the keys of every committed
    merge; every submitted key is in the journal of an epoch that is either
    pending (open) or merged with its answers in ``results.<epoch>``.
    """

    def __init__(self, path: str, *, buckets: int = 64, bucket_buffer_bytes: int = 1 << 20,
                 merge_bytes: int = 256 << 20, max_age_s: float = 30.0, cache_entries: int = 1 << 20,
                 value_size: int = 0, clock: Callable[[], float] = time.monotonic,
                 max_results: int = 1 << 16, auto_ack: bool = True, _kernels=None):
        if buckets < 1 or buckets > 4096:
            raise ValueError("buckets must be in [1, 4096]")
        if value_size < 0 or value_size > 4096:
            raise ValueError("value_size must be in [0, 4096]")
        if merge_bytes < 1 or bucket_buffer_bytes < 1 or max_results < 1 or max_age_s < 0:
            raise ValueError("merge_bytes, bucket_buffer_bytes, max_results must be positive")
        self.path = os.path.abspath(path)
        self.buckets = buckets
        self.value_size = value_size
        self.merge_bytes = merge_bytes
        self.max_age_s = max_age_s
        self.max_results = max_results
        self.auto_ack = auto_ack
        self._clock = clock
        self._kern = _kernels or _native_drum
        self._bucket_limit = max(1, merge_bytes // buckets)
        self._closed = True
        self._broken: str | None = None
        os.makedirs(self.path, exist_ok=True)
        self._lock_fd = os.open(os.path.join(self.path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise DrumError(f"{self.path} is in use by another process") from None
        try:
            self._core = self._kern.Core(buckets, bucket_buffer_bytes, value_size, cache_entries)
            self._open()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._closed = False

    # -- public API -------------------------------------------------------------------------------

    def check_update(self, keys, aux: Sequence[bytes] | None = None, values=None) -> None:
        """Check each key and insert it (with its value) when absent."""
        self._submit(Op.CHECK_UPDATE, keys, values, aux)

    def check(self, keys, aux: Sequence[bytes] | None = None) -> None:
        """Check each key; nothing is stored."""
        self._submit(Op.CHECK, keys, None, aux)

    def update(self, keys, values=None, aux: Sequence[bytes] | None = None) -> None:
        """Insert each key, or overwrite its value."""
        self._submit(Op.UPDATE, keys, values, aux)

    def poll(self, now: float | None = None) -> bool:
        """Merge if a trigger fired (a bucket full, or the oldest submission max_age_s old)."""
        self._usable()
        if self._t0 is None:
            return False
        if now is None:
            now = self._clock()
        if self._full() or now - self._t0 >= self.max_age_s:
            self._merge()
            return True
        return False

    def flush(self) -> None:
        """Merge everything pending now (the frontier is about to run dry)."""
        self._usable()
        self._merge()

    def results(self, limit: int | None = None) -> list[DrumResult]:
        """Answers dispatched by merges, in submission order, at most ``limit`` (default max_results).

        Handing them out acknowledges the ones returned by the previous call.
        Call again until it returns an empty list to drain a large merge.
        """
        self._usable()
        if self.auto_ack:
            self._ack()
        out: list[DrumResult] = []
        limit = self.max_results if limit is None else limit
        V = self.value_size
        while len(out) < limit:
            r = self._next_block()
            if r is None:
                break
            blk = r.block
            i0 = r.offset_in_block
            n = min(len(blk.keys) - i0, limit - len(out))
            unique, vals = self._answers(r, blk)
            keys = blk.keys[i0:i0 + n].tolist()
            uniq = unique[i0:i0 + n].tolist()
            op = Op(blk.op)
            if blk.aux_lens is not None:
                ends = np.cumsum(blk.aux_lens, dtype=np.int64).tolist()
                starts = [0] + ends[:-1]
                auxs = [blk.aux[starts[i]:ends[i]] for i in range(i0, i0 + n)]
            else:
                auxs = [None] * n
            seq = blk.first_seq + i0
            for j in range(n):
                value = None
                if V and not uniq[j]:
                    value = vals[(i0 + j) * V:(i0 + j + 1) * V].tobytes()
                out.append(DrumResult(keys[j], op, bool(uniq[j]), value, auxs[j], seq + j))
            self._advance(r, blk, n)
        return out

    def results_arrays(self, limit: int | None = None):
        """Fast path of ``results``: (first_seq, keys uint64, unique bool, values uint8[n, V]).

        Same order, acknowledgement and limit as ``results``; aux is not returned.
        """
        self._usable()
        if self.auto_ack:
            self._ack()
        limit = self.max_results if limit is None else limit
        V = self.value_size
        avail = min(limit, sum(r.end_seq - r.seq for r in self._ready))
        keys = np.empty(avail, np.uint64)
        unique = np.empty(avail, np.uint8)
        values = np.empty(avail * V, np.uint8)
        first_seq = self._handed_seq
        got = 0
        while got < avail:
            r = self._next_block()
            if r is None:
                break
            blk = r.block
            if r.offset_in_block < len(blk.keys):
                # Rest of a block begun by results(), or one too big for the output or a read.
                n = min(len(blk.keys) - r.offset_in_block, avail - got)
                u, v = self._answers(r, blk)
                i0 = r.offset_in_block
                keys[got:got + n] = blk.keys[i0:i0 + n]
                unique[got:got + n] = u[i0:i0 + n]
                if V:
                    values[got * V:(got + n) * V] = v[i0 * V:(i0 + n) * V]
                got += n
                self._advance(r, blk, n)
                if r.offset_in_block < len(blk.keys):
                    continue
            # Whole blocks from here on, decoded natively straight from the journal.
            r.pos = blk.end
            r.ordinal += int(len(blk.keys) - int(blk.hit.sum()))
            r.block = None
            while got < avail and r.seq < r.end_seq:
                chunk = os.pread(r.fileno(), 1 << 22, r.pos)
                try:
                    off, nk, nord = self._kern.decode_blocks(chunk, V, r.unique, r.values, r.ordinal, r.seq,
                                                             keys, unique, values, got)
                except ValueError as e:
                    raise DrumCorrupt(f"{r.journal}: {e}") from None
                if nk == 0:
                    break
                r.pos += off
                r.ordinal += nord
                got += nk
                r.seq += nk
                self._handed_seq += nk
                self._handed = (r.epoch, r.seq)
            if r.seq < r.end_seq and got < avail:
                r.block = self._read_block(r)
                r.offset_in_block = 0
        return first_seq, keys[:got], unique[:got].view(bool), values[:got * V].reshape(got, V)

    def sync(self) -> None:
        """fsync the journal: calls that returned survive a power loss too, not only kill -9."""
        self._usable()
        os.fsync(self._jfd)

    def ack(self) -> None:
        """Acknowledge every result handed out so far: they are not delivered again after a crash.

        With ``auto_ack=False`` call it once the consumer has made them durable
        (the shard: right after its frontier commit); until then a crash
        redelivers them.
        """
        self._usable()
        self._ack()

    def contains(self, keys) -> list[bool]:
        """Whether each key is in the key file (merged). Keys waiting for the next merge are not looked at.

        A binary search of the sorted key file: O(log n) page reads per key, nothing changes.
        """
        self._usable()
        q = np.asarray(keys, dtype=np.uint64)
        if not self._count or not len(q):
            return [False] * len(q)
        rec = 8 + self.value_size
        mm = np.memmap(self._p("keys", self._gen), dtype=np.uint8, mode="r", offset=HEADER_BYTES,
                       shape=(self._count * rec,))
        stored = np.ndarray((self._count,), dtype="<u8", buffer=mm, strides=(rec,))
        pos = np.minimum(np.searchsorted(stored, q), self._count - 1)
        return (stored[pos] == q).tolist()

    @property
    def pending(self) -> int:
        """Keys submitted but not yet handed out by ``results``."""
        return self._next_seq - self._handed_seq

    @property
    def ready(self) -> int:
        """Results dispatched by merges and not yet handed out."""
        return sum(r.end_seq - r.seq for r in self._ready)

    @property
    def next_seq(self) -> int:
        """Sequence number the next submitted key gets."""
        return self._next_seq

    @property
    def cache_hits(self) -> int:
        return self._core.cache_hits

    def __len__(self) -> int:
        """Keys stored by committed merges."""
        return self._count

    def disk_bytes(self) -> int:
        """Bytes of all DRUM files now."""
        total = 0
        for name in os.listdir(self.path):
            try:
                total += os.stat(os.path.join(self.path, name)).st_size
            except FileNotFoundError:
                pass
        return total

    def close(self) -> None:
        """Acknowledge handed-out results, make the journal durable, release the directory."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._broken is None:
                if self.auto_ack:
                    self._ack()
                os.fsync(self._jfd)
        finally:
            for r in self._ready:
                r.close()
            for fd in [self._jfd, self._cursor_fd, *self._spill_fds]:
                os.close(fd)
            os.close(self._lock_fd)

    def __enter__(self) -> Drum:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- submission -------------------------------------------------------------------------------

    def _submit(self, op: Op, keys, values, aux) -> None:
        self._usable()
        if isinstance(keys, np.ndarray) and keys.dtype == np.uint64:
            karr = np.ascontiguousarray(keys)
        else:
            karr = np.array(keys, dtype=np.uint64)
        if karr.ndim != 1:
            raise ValueError("keys must be one-dimensional")
        n = len(karr)
        if n == 0:
            return
        V = self.value_size
        vals = None
        if values is not None and V and op != Op.CHECK:
            vals = self._values_bytes(values, n)
        lens = blob = None
        if aux is not None:
            if len(aux) != n:
                raise ValueError("aux must have one entry per key")
            lens = np.fromiter(map(len, aux), dtype=np.uint32, count=n)
            blob = b"".join(aux)
        if self._t0 is None:
            self._t0 = self._clock()
        try:
            self._core.submit(karr, int(op), vals, lens, blob, self._next_seq)
        except OSError as e:
            # The journal may hold part of this call: reopening replays it consistently.
            self._broken = f"I/O error in submit: {e}"
            raise
        self._next_seq += n
        self._jbytes += BLOCK_HEADER + _pad8(n * (9 + V) + (n * V if vals is not None else 0)
                                             + (n * 4 + len(blob) if lens is not None else 0))
        if self._full():
            self._merge()

    def _values_bytes(self, values, n: int) -> bytes:
        V = self.value_size
        if isinstance(values, np.ndarray):
            data = np.ascontiguousarray(values, dtype=np.uint8).tobytes()
        elif isinstance(values, bytes | bytearray | memoryview):
            data = bytes(values)
        else:
            vs = list(values)
            if len(vs) != n or any(len(v) != V for v in vs):
                raise ValueError(f"values must be {n} byte strings of {V} bytes")
            data = b"".join(vs)
        if len(data) != n * V:
            raise ValueError(f"values must be {n} x {V} bytes")
        return data

    def _full(self) -> bool:
        return self._core.max_bucket_bytes >= self._bucket_limit or self._jbytes >= self.merge_bytes

    def _usable(self) -> None:
        if self._closed:
            raise DrumError("DRUM is closed")
        if self._broken is not None:
            raise DrumError(f"DRUM unusable until reopened: {self._broken}")

    # -- merge ------------------------------------------------------------------------------------

    def _p(self, kind: str, n: int) -> str:
        return os.path.join(self.path, f"{kind}.{n:012d}")

    def _merge(self) -> None:
        if self._t0 is None:
            return
        try:
            self._merge_epoch()
        except DrumCorrupt as e:
            self._broken = str(e)
            raise
        except OSError as e:
            self._broken = f"I/O error in merge: {e}"
            raise

    def _merge_epoch(self) -> None:
        core, V, e = self._core, self.value_size, self._epoch
        P = core.ordinals
        # One buffer for the answers: unique flags then values, written and kept as they are.
        body = np.zeros(P * (1 + V), np.uint8)
        unique, vals = body[:P], body[P:]
        gen, count, khash = self._gen, self._count, self._hash
        if P:
            gen = self._gen + 1
            tmp = self._p("keys", gen) + ".tmp"
            new_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            old_fd = -1
            try:
                os.write(new_fd, bytes(HEADER_BYTES))
                if self._count:
                    old_fd = os.open(self._p("keys", self._gen), os.O_RDONLY)
                    os.lseek(old_fd, HEADER_BYTES, os.SEEK_SET)
                try:
                    count, khash = core.merge(old_fd, self._count, self._hash, new_fd, unique, vals)
                except ValueError as err:
                    raise DrumCorrupt(f"{self._p('keys', self._gen)}: {err}") from None
                os.pwrite(new_fd, _KEY_HEAD.pack(KEY_MAGIC, FORMAT, V, count, khash, gen)
                          .ljust(HEADER_BYTES, b"\0"), 0)
                os.fsync(new_fd)
            finally:
                os.close(new_fd)
                if old_fd >= 0:
                    os.close(old_fd)
            os.replace(tmp, self._p("keys", gen))
        _write_atomic(self._p("results", e),
                      _RES_HEAD.pack(RES_MAGIC, e, P, V, self._kern.hash_words(body)).ljust(HEADER_BYTES, b"\0"),
                      body)
        os.fsync(self._jfd)
        self._write_manifest(gen, count, khash, e)
        _fsync_dir(self.path)
        # Committed. Everything below is cleanup that recovery would also do.
        if gen != self._gen:
            try:
                os.unlink(self._p("keys", self._gen))
            except FileNotFoundError:
                pass
        self._gen, self._count, self._hash = gen, count, khash
        for fd in self._spill_fds:
            os.ftruncate(fd, 0)
        core.reset_epoch()
        r = _Ready(e, self._p("journal", e), self._p("results", e), self._epoch_seq, self._next_seq)
        r.unique, r.values = unique, vals
        self._ready.append(r)
        self._start_epoch(e + 1)

    def _write_manifest(self, gen: int, count: int, khash: int, merged: int) -> None:
        doc = {"format": FORMAT, "value_size": self.value_size, "keys_gen": gen, "count": count,
               "hash": khash, "merged_epoch": merged, "next_seq": self._next_seq}
        _write_atomic(os.path.join(self.path, "MANIFEST"), json.dumps(doc).encode() + b"\n")

    def _start_epoch(self, e: int) -> None:
        if getattr(self, "_jfd", -1) >= 0:
            os.close(self._jfd)
        self._epoch = e
        self._epoch_seq = self._next_seq
        self._t0 = None
        self._jfd = os.open(self._p("journal", e), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._jbytes = os.fstat(self._jfd).st_size
        self._core.set_files(self._jfd, self._spill_fds)

    # -- dispatch ---------------------------------------------------------------------------------

    def _next_block(self) -> _Ready | None:
        # The ready epoch and block holding the next result to hand out, or None.
        while self._ready:
            r = self._ready[0]
            if r.seq >= r.end_seq:
                r.close()
                self._ready.pop(0)
                self._done.append(r)
                continue
            if r.unique is None:
                r.unique, r.values = self._load_results(r)
            if r.block is None or r.offset_in_block >= len(r.block.keys):
                if r.block is not None:
                    r.pos = r.block.end
                    r.ordinal += int(len(r.block.keys) - int(r.block.hit.sum()))
                r.block = self._read_block(r)
                r.offset_in_block = 0
                if r.block.first_seq > r.seq:
                    raise DrumCorrupt(f"{r.journal}: sequence gap at {r.seq}")
                if r.block.first_seq + len(r.block.keys) <= r.seq:
                    # A block entirely before the cursor (resuming after a restart).
                    r.offset_in_block = len(r.block.keys)
                    continue
                r.offset_in_block = r.seq - r.block.first_seq
            return r
        return None

    def _read_block(self, r: _Ready) -> _Block:
        f = r.journal_file()
        f.seek(r.pos)
        blk = self._parse_block(f, r.pos, os.fstat(f.fileno()).st_size)
        if blk is None:
            raise DrumCorrupt(f"{r.journal}: journal ends before result {r.seq}")
        return blk

    def _answers(self, r: _Ready, blk: _Block):
        # unique flags and values for every key of the block (cache hits answered as duplicates).
        V = self.value_size
        m = int(len(blk.keys) - int(blk.hit.sum()))
        if r.ordinal + m > len(r.unique):
            raise DrumCorrupt(f"{r.results}: fewer answers than journalled keys")
        if m == len(blk.keys):
            unique = r.unique[r.ordinal:r.ordinal + m]
            vals = r.values[r.ordinal * V:(r.ordinal + m) * V] if V else None
            return unique, vals
        miss = blk.hit == 0
        unique = np.zeros(len(blk.keys), np.uint8)
        unique[miss] = r.unique[r.ordinal:r.ordinal + m]
        vals = None
        if V:
            v2 = blk.hitvals.reshape(-1, V).copy()
            v2[miss] = r.values[r.ordinal * V:(r.ordinal + m) * V].reshape(-1, V)
            vals = v2.reshape(-1)
        return unique, vals

    def _advance(self, r: _Ready, blk: _Block, n: int) -> None:
        r.offset_in_block += n
        r.seq += n
        self._handed_seq += n
        self._handed = (r.epoch, r.seq)

    def _load_results(self, r: _Ready):
        with open(r.results, "rb") as f:
            head = f.read(HEADER_BYTES)
            body = f.read()
        V = self.value_size
        if len(head) < HEADER_BYTES:
            raise DrumCorrupt(f"{r.results}: truncated header")
        magic, epoch, P, v, h = _RES_HEAD.unpack_from(head)
        if magic != RES_MAGIC or epoch != r.epoch or v != V or len(body) != P * (1 + V):
            raise DrumCorrupt(f"{r.results}: bad header or size ({len(body)} bytes for {P} answers)")
        if self._kern.hash_words(body) != h:
            raise DrumCorrupt(f"{r.results}: checksum mismatch")
        arr = np.frombuffer(body, np.uint8)
        return arr[:P], arr[P:]

    def _ack(self) -> None:
        # Persist the cursor past everything handed out so far; drop fully delivered epochs.
        if self._handed == self._acked:
            return
        e, s = self._handed
        os.pwrite(self._cursor_fd, _CURSOR.pack(e, s, self._kern.hash_words(struct.pack("<QQ", e, s))), 0)
        self._acked = self._handed
        while self._ready and self._ready[0].seq >= self._ready[0].end_seq:
            r = self._ready.pop(0)
            r.close()
            self._done.append(r)
        for r in self._done:
            for p in (r.journal, r.results):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        self._done = []

    def _parse_block(self, f, off: int, size: int) -> _Block | None:
        """Next journal block at ``off`` of an open file; None at a clean end.

        Raises _Torn for a bad block; the caller decides whether it is a torn tail.
        """
        if off >= size:
            return None
        head = f.read(BLOCK_HEADER)
        if len(head) < BLOCK_HEADER:
            raise _Torn(off, size)
        magic, op, flags, V, n, auxb, first_seq, plen, h = _BLOCK.unpack(head)
        if magic != BLOCK_MAGIC or op > 2 or V != self.value_size or plen % 8 or flags > 3:
            raise _Torn(off, size)
        want = n * (9 + V) + (n * V if flags & 1 else 0) + (n * 4 + auxb if flags & 2 else 0)
        if _pad8(want) != plen:
            raise _Torn(off, off + BLOCK_HEADER + plen)
        payload = f.read(plen)
        if len(payload) < plen:
            raise _Torn(off, off + BLOCK_HEADER + plen)
        if (self._kern.hash_words(head[:32]) + self._kern.hash_words(payload, 4)) & _M64 != h:
            raise _Torn(off, off + BLOCK_HEADER + plen)
        a = np.frombuffer(payload, np.uint8)
        p = n * 8
        keys = a[:p].view("<u8")
        hit = a[p:p + n]
        p += n
        hitvals = a[p:p + n * V] if V else None
        p += n * V
        values = None
        if flags & 1:
            values = a[p:p + n * V]
            p += n * V
        aux_lens, aux = None, b""
        if flags & 2:
            aux_lens = a[p:p + 4 * n].view("<u4")
            p += 4 * n
            aux = payload[p:p + auxb]
        return _Block(op, first_seq, keys, hit, hitvals, values, aux_lens, aux, off + BLOCK_HEADER + plen)

    # -- open and recovery ------------------------------------------------------------------------

    def _open(self) -> None:
        V = self.value_size
        mpath = os.path.join(self.path, "MANIFEST")
        if os.path.exists(mpath):
            try:
                with open(mpath, "rb") as f:
                    doc = json.loads(f.read())
                gen, count, khash, merged = doc["keys_gen"], doc["count"], doc["hash"], doc["merged_epoch"]
                manifest_seq = doc["next_seq"]
                fmt, mv = doc["format"], doc["value_size"]
            except (ValueError, KeyError, TypeError) as e:
                raise DrumCorrupt(f"{mpath}: unreadable manifest ({e})") from None
            if fmt != FORMAT:
                raise DrumError(f"{mpath}: format {fmt}, this build reads {FORMAT}")
            if mv != V:
                raise DrumError(f"{self.path} holds value_size {mv}, opened with {V}")
        else:
            if any(_NAME.match(n) for n in os.listdir(self.path)):
                raise DrumCorrupt(f"{mpath} is missing but DRUM files are present")
            gen, count, khash, merged, manifest_seq = 0, 0, 0, -1, 0
            self._next_seq = 0
            self._write_manifest(gen, count, khash, merged)
            _fsync_dir(self.path)
        self._gen, self._count, self._hash = gen, count, khash
        if gen:
            self._check_key_file(gen, count, khash)
        # Leftovers of a merge that did not commit, and old generations.
        journals: list[int] = []
        results: list[int] = []
        for name in sorted(os.listdir(self.path)):
            m = _NAME.match(name)
            full = os.path.join(self.path, name)
            if name.endswith(".tmp") and (m or name == "MANIFEST.tmp"):
                os.unlink(full)
            elif m and m.group(1) == "keys" and int(m.group(2)) != gen:
                os.unlink(full)
            elif m and m.group(1) == "results":
                if int(m.group(2)) > merged:
                    os.unlink(full)
                else:
                    results.append(int(m.group(2)))
            elif m and m.group(1) == "journal":
                journals.append(int(m.group(2)))
            elif name.startswith("bucket."):
                os.unlink(full)
        self._spill_fds = [os.open(os.path.join(self.path, f"bucket.{b:05d}"),
                                   os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644) for b in range(self.buckets)]
        self._cursor_fd = os.open(os.path.join(self.path, "cursor"), os.O_RDWR | os.O_CREAT, 0o644)
        ce, cs = self._read_cursor()
        self._ready: list[_Ready] = []
        self._done: list[_Ready] = []
        # Merged epochs: deliver from the cursor on; drop those fully acknowledged.
        for e in sorted(journals):
            if e > merged:
                continue
            first, end = self._journal_span(e)
            if e not in results:
                raise DrumCorrupt(f"{self._p('journal', e)}: merged epoch without its results file")
            if ce > e or (ce == e and cs >= end):
                os.unlink(self._p("journal", e))
                os.unlink(self._p("results", e))
            else:
                r = _Ready(e, self._p("journal", e), self._p("results", e), first, end)
                if ce == e:
                    r.seq = max(first, cs)
                self._ready.append(r)
        for e in results:
            if e not in journals and os.path.exists(self._p("results", e)):
                os.unlink(self._p("results", e))
        open_epochs = [e for e in journals if e > merged]
        if len(open_epochs) > 1 or (open_epochs and open_epochs[0] != merged + 1):
            raise DrumCorrupt(f"{self.path}: unexpected journals {open_epochs} after merged epoch {merged}")
        self._next_seq = manifest_seq
        self._handed_seq = self._ready[0].seq if self._ready else self._next_seq
        self._handed = self._acked = (ce, cs)
        self._jfd = -1
        self._start_epoch(merged + 1)
        self._replay()
        if not self._ready:
            self._handed_seq = self._epoch_seq

    def _read_cursor(self) -> tuple[int, int]:
        data = os.pread(self._cursor_fd, _CURSOR.size, 0)
        if len(data) < _CURSOR.size:
            return (0, 0)
        e, s, h = _CURSOR.unpack(data)
        if self._kern.hash_words(struct.pack("<QQ", e, s)) != h:
            log.warning("drum cursor %s unreadable; results since the last merge are delivered again",
                        self.path)
            return (0, 0)
        return (e, s)

    def _journal_span(self, e: int) -> tuple[int, int]:
        # First and end seq of a merged epoch's journal (verifies every block).
        path = self._p("journal", e)
        first = end = None
        size = os.path.getsize(path)
        with open(path, "rb", buffering=1 << 20) as f:
            off = 0
            while True:
                try:
                    blk = self._parse_block(f, off, size)
                except _Torn as t:
                    raise DrumCorrupt(f"{path}: bad journal block at offset {t.off}") from None
                if blk is None:
                    break
                if first is None:
                    first = blk.first_seq
                elif blk.first_seq != end:
                    raise DrumCorrupt(f"{path}: sequence gap at offset {off}")
                end = blk.first_seq + len(blk.keys)
                off = blk.end
        if first is None:
            raise DrumCorrupt(f"{path}: merged epoch with an empty journal")
        return first, end

    def _replay(self) -> None:
        # Re-check every call of the open epoch that had returned before the crash (rule 2).
        path = self._p("journal", self._epoch)
        size = os.fstat(self._jfd).st_size
        if size == 0:
            return
        off = 0
        first = None
        with open(path, "rb", buffering=1 << 20) as f:
            while True:
                try:
                    blk = self._parse_block(f, off, size)
                except _Torn as t:
                    if t.end >= size or _zeros_from(path, t.off):
                        log.warning("drum journal %s: torn tail at offset %d cut off (a call that never "
                                    "returned)", path, t.off)
                        os.truncate(path, t.off)
                        self._jbytes = t.off
                        break
                    raise DrumCorrupt(f"{path}: bad journal block at offset {t.off}") from None
                if blk is None:
                    break
                if first is None:
                    first = blk.first_seq
                    if first != self._next_seq:
                        raise DrumCorrupt(f"{path}: starts at seq {first}, the last merge ended at "
                                          f"{self._next_seq}")
                elif blk.first_seq != self._next_seq:
                    raise DrumCorrupt(f"{path}: sequence gap at offset {off}")
                self._core.replay(np.ascontiguousarray(blk.keys), np.ascontiguousarray(blk.hit), blk.op,
                                  None if blk.values is None else np.ascontiguousarray(blk.values))
                self._next_seq = blk.first_seq + len(blk.keys)
                off = blk.end
        if first is not None:
            self._t0 = self._clock()

    def _check_key_file(self, gen: int, count: int, khash: int) -> None:
        path = self._p("keys", gen)
        want = HEADER_BYTES + count * (8 + self.value_size)
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                head = f.read(HEADER_BYTES)
        except FileNotFoundError:
            raise DrumCorrupt(f"{path}: key file named by MANIFEST is missing") from None
        if size != want:
            raise DrumCorrupt(f"{path}: {size} bytes, expected {want} for {count} keys")
        magic, version, v, c, h, g = _KEY_HEAD.unpack_from(head)
        if magic != KEY_MAGIC or version != FORMAT or v != self.value_size or c != count or h != khash \
                or g != gen:
            raise DrumCorrupt(f"{path}: header does not match MANIFEST")


class _Torn(Exception):
    def __init__(self, off: int, end: int):
        super().__init__(off)
        self.off = off
        self.end = end


def _zeros_from(path: str, off: int) -> bool:
    # A tail of zeros: the file grew but the data never reached the disk (power loss).
    with open(path, "rb") as f:
        f.seek(off)
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return True
            if chunk.count(0) != len(chunk):
                return False
