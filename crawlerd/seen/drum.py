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

Files under ``path`` (``<data_dir>/drum/``) and their formats: ``drum_files.py``.
Answers are handed out and acknowledged by ``drum_answers.py``.

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

import fcntl
import logging
import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from crawlerd._native import drum as native_drum
from crawlerd.seen.drum_answers import AnswerQueue, Delivery, DrumResult, Op, ReadyEpoch
from crawlerd.seen.drum_files import (
    FILE_NAME,
    HEADER_BYTES,
    DrumCorrupt,
    DrumError,
    DrumFiles,
    Manifest,
    block_bytes,
)
from crawlerd.store.fsync import fsync_dir

log = logging.getLogger(__name__)


class Drum:
    """Disk-bucketed seen-set over 8-byte keys (the module docstring: semantics, recovery).

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
        self._kern = _kernels or native_drum
        self._files = DrumFiles(self.path, value_size, self._kern.hash_words)
        self._bucket_limit = max(1, merge_bytes // buckets)
        self._closed = True
        self._broken: str | None = None
        self.merges = 0                 # merges run by this object (any trigger), and their time, seconds
        self.merge_s = self.last_merge_s = self.max_merge_s = 0.0
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
            self._answers.ack()
        return self._answers.results(self.max_results if limit is None else limit)

    def delivery(self, limit: int | None = None) -> Delivery:
        """``results`` as a ``Delivery``: the same answers, order, acknowledgement and limit, kept as
        arrays; ``DrumResult`` objects are made as its slices are read."""
        self._usable()
        if self.auto_ack:
            self._answers.ack()
        return self._answers.delivery(self.max_results if limit is None else limit)

    def results_arrays(self, limit: int | None = None):
        """Fast path of ``results``: (first_seq, keys uint64, unique bool, values uint8[n, V]).

        Same order, acknowledgement and limit as ``results``; aux is not returned.
        """
        self._usable()
        if self.auto_ack:
            self._answers.ack()
        return self._answers.results_arrays(self.max_results if limit is None else limit)

    def sync(self) -> None:
        """fsync the journal: calls that returned survive a power loss too, not only kill -9."""
        self._usable()
        os.fsync(self._jfd)

    def ack(self, upto: int | None = None) -> None:
        """Acknowledge every result handed out so far (or those before seq ``upto``, where a
        ``delivery``/``results`` call's answers ended): they are not delivered again after a crash.

        With ``auto_ack=False`` call it once the consumer has made them durable
        (the shard: right after its frontier commit); until then a crash
        redelivers them.
        """
        self._usable()
        self._answers.ack(upto)

    @property
    def acked_seq(self) -> int:
        """Seq of the first result not acknowledged (handed out or not)."""
        return self._answers.acked_seq

    def contains(self, keys) -> list[bool]:
        """Whether each key is in the key file (merged). Keys waiting for the next merge are not looked at.

        A binary search of the sorted key file: O(log n) page reads per key, nothing changes.
        """
        self._usable()
        q = np.asarray(keys, dtype=np.uint64)
        if not self._count or not len(q):
            return [False] * len(q)
        rec = 8 + self.value_size
        mm = np.memmap(self._files.name("keys", self._gen), dtype=np.uint8, mode="r", offset=HEADER_BYTES,
                       shape=(self._count * rec,))
        stored = np.ndarray((self._count,), dtype="<u8", buffer=mm, strides=(rec,))
        pos = np.minimum(np.searchsorted(stored, q), self._count - 1)
        return (stored[pos] == q).tolist()

    @property
    def pending(self) -> int:
        """Keys submitted but not yet handed out by ``results``."""
        return self._next_seq - self._answers.handed_seq

    @property
    def ready(self) -> int:
        """Results dispatched by merges and not yet handed out."""
        return self._answers.available

    @property
    def unmerged(self) -> int:
        """Keys submitted since the last merge (in the buckets and their files, waiting for the next)."""
        return self._next_seq - self._epoch_seq

    @property
    def answers_ram_bytes(self) -> int:
        """Bytes of merged answers (unique flags, values) held in RAM for handing out: the epoch being
        handed out's, not one per epoch waiting behind it."""
        return self._answers.ram_bytes()

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
                    self._answers.ack()
                os.fsync(self._jfd)
        finally:
            self._answers.close()
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
        self._jbytes += block_bytes(n, V, vals is not None, len(blob) if lens is not None else None)
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

    def _merge(self) -> None:
        if self._t0 is None:
            return
        t0 = time.perf_counter()
        try:
            self._merge_epoch()
        except DrumCorrupt as e:
            self._broken = str(e)
            raise
        except OSError as e:
            self._broken = f"I/O error in merge: {e}"
            raise
        dt = time.perf_counter() - t0
        self.merges += 1
        self.merge_s += dt
        self.last_merge_s = dt
        self.max_merge_s = max(self.max_merge_s, dt)

    def _merge_epoch(self) -> None:
        core, V, e = self._core, self.value_size, self._epoch
        P = core.ordinals
        # One buffer for the answers: unique flags then values, written and kept as they are.
        body = np.zeros(P * (1 + V), np.uint8)
        unique, vals = body[:P], body[P:]
        gen, count, khash = self._gen, self._count, self._hash
        if P:
            gen = self._gen + 1
            tmp = self._files.name("keys", gen) + ".tmp"
            new_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            old_fd = -1
            try:
                os.write(new_fd, bytes(HEADER_BYTES))
                if self._count:
                    old_fd = os.open(self._files.name("keys", self._gen), os.O_RDONLY)
                    os.lseek(old_fd, HEADER_BYTES, os.SEEK_SET)
                try:
                    count, khash = core.merge(old_fd, self._count, self._hash, new_fd, unique, vals)
                except ValueError as err:
                    raise DrumCorrupt(f"{self._files.name('keys', self._gen)}: {err}") from None
                os.pwrite(new_fd, self._files.key_header(count, khash, gen), 0)
                os.fsync(new_fd)
            finally:
                os.close(new_fd)
                if old_fd >= 0:
                    os.close(old_fd)
            os.replace(tmp, self._files.name("keys", gen))
        self._files.write_results(e, body)
        os.fsync(self._jfd)
        self._write_manifest(gen, count, khash, e)
        fsync_dir(self.path)
        # Committed. Everything below is cleanup that recovery would also do.
        if gen != self._gen:
            try:
                os.unlink(self._files.name("keys", self._gen))
            except FileNotFoundError:
                pass
        self._gen, self._count, self._hash = gen, count, khash
        for fd in self._spill_fds:
            os.ftruncate(fd, 0)
        core.reset_epoch()
        r = ReadyEpoch(e, self._files.name("journal", e), self._files.name("results", e), self._epoch_seq,
                       self._next_seq)
        if not self._answers.ready:
            # the next to be handed out: its answers stay in RAM. An epoch queued behind others reads
            # its results file back when its turn comes (AnswerQueue.next_block), so a backlog of merged
            # answers waiting for the consumer costs the page cache, not 1 B of private memory per key.
            r.unique, r.values = unique, vals
        self._answers.add(r)
        self._start_epoch(e + 1)

    def _write_manifest(self, gen: int, count: int, khash: int, merged: int) -> None:
        self._files.write_manifest(Manifest(gen, count, khash, merged, self._next_seq))

    def _start_epoch(self, e: int) -> None:
        if getattr(self, "_jfd", -1) >= 0:
            os.close(self._jfd)
        self._epoch = e
        self._epoch_seq = self._next_seq
        self._t0 = None
        self._jfd = os.open(self._files.name("journal", e), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._jbytes = os.fstat(self._jfd).st_size
        self._core.set_files(self._jfd, self._spill_fds)

    # -- open and recovery ------------------------------------------------------------------------

    def _open(self) -> None:
        mpath = os.path.join(self.path, "MANIFEST")
        man = self._files.read_manifest()
        if man is None:
            if any(FILE_NAME.match(n) for n in os.listdir(self.path)):
                raise DrumCorrupt(f"{mpath} is missing but DRUM files are present")
            man = Manifest(0, 0, 0, -1, 0)
            self._next_seq = 0
            self._write_manifest(man.keys_gen, man.count, man.hash, man.merged_epoch)
            fsync_dir(self.path)
        gen, count, khash, merged = man.keys_gen, man.count, man.hash, man.merged_epoch
        self._gen, self._count, self._hash = gen, count, khash
        if gen:
            self._files.check_key_file(gen, count, khash)
        # Leftovers of a merge that did not commit, and old generations.
        journals: list[int] = []
        results: list[int] = []
        for name in sorted(os.listdir(self.path)):
            m = FILE_NAME.match(name)
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
        ce, cs = self._files.read_cursor(self._cursor_fd)
        ready: list[ReadyEpoch] = []
        # Merged epochs: deliver from the cursor on; drop those fully acknowledged.
        for e in sorted(journals):
            if e > merged:
                continue
            first, end = self._files.journal_span(e)
            if e not in results:
                raise DrumCorrupt(f"{self._files.name('journal', e)}: merged epoch without its results file")
            if ce > e or (ce == e and cs >= end):
                os.unlink(self._files.name("journal", e))
                os.unlink(self._files.name("results", e))
            else:
                r = ReadyEpoch(e, self._files.name("journal", e), self._files.name("results", e), first, end)
                if ce == e:
                    r.seq = max(first, cs)
                ready.append(r)
        for e in results:
            if e not in journals and os.path.exists(self._files.name("results", e)):
                os.unlink(self._files.name("results", e))
        open_epochs = [e for e in journals if e > merged]
        if len(open_epochs) > 1 or (open_epochs and open_epochs[0] != merged + 1):
            raise DrumCorrupt(f"{self.path}: unexpected journals {open_epochs} after merged epoch {merged}")
        self._next_seq = man.next_seq
        self._answers = AnswerQueue(self._files, self._kern, self._cursor_fd, ready, (ce, cs),
                                    ready[0].seq if ready else self._next_seq)
        self._jfd = -1
        self._start_epoch(merged + 1)
        self._replay()
        if not ready:
            self._answers.handed_seq = self._answers.acked_seq = self._epoch_seq

    def _replay(self) -> None:
        # Re-check every call of the open epoch that had returned before the crash (recovery rule 2).
        replayed = False
        for blk in self._files.open_journal_blocks(self._epoch, self._next_seq):
            self._core.replay(np.ascontiguousarray(blk.keys), np.ascontiguousarray(blk.hit), blk.op,
                              None if blk.values is None else np.ascontiguousarray(blk.values))
            self._next_seq = blk.first_seq + len(blk.keys)
            replayed = True
        self._jbytes = os.fstat(self._jfd).st_size
        if replayed:
            self._t0 = self._clock()
