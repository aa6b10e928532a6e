"""Pure-Python reference for ``crawlerd._native.blocktables`` (same API, same answers in the same order).

See the native module's docstring for the scheme (Manku et al., WWW 2007, §3):
four tables of the run's fingerprints rotated by 0, 16, 32, 48 bits, each
sorted, so one 16-bit block of a query selects one contiguous range per table.
"""

from __future__ import annotations

import numpy as np

BLOCKS = 4
BUCKETS = 65536
MAX_MERGE = 64
OFFSETS_MIN = 1 << 17          # runs at least this long get a bucket directory (as the native kernel)
_M64 = (1 << 64) - 1


def rotl_array(fps, r: int) -> np.ndarray:
    """rotl(fp, r) for every element of a uint64 array (r in 0..63)."""
    a = np.ascontiguousarray(fps, dtype=np.uint64)
    if r == 0:
        return a.copy()
    return (a << np.uint64(r)) | (a >> np.uint64(64 - r))


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64 if r else x


def _bucket_offsets(table: np.ndarray) -> np.ndarray:
    bounds = np.arange(BUCKETS, dtype=np.uint64) << np.uint64(48)
    off = np.empty(BUCKETS + 1, dtype=np.int64)
    off[:BUCKETS] = np.searchsorted(table, bounds, side="left")
    off[BUCKETS] = table.shape[0]
    return off


class BlockTables:
    """One immutable sorted run of (fingerprint, doc id) pairs, four block tables.

    Key: table t (0..3) holds ``rotl(fp, 16 t)`` sorted ascending; table 0 is
    ``fps`` itself and ``doc_ids`` is aligned with it. Invariant: all five
    arrays have length n; each table is a permutation of the rotated
    fingerprints, sorted; ``offsets[t, b]`` (when present) is the first index in
    table t whose top 16 bits are >= b.
    """

    def __init__(self, fps, doc_ids, rot1, rot2, rot3, offsets=None):
        arrays = [np.ascontiguousarray(x, dtype=np.uint64) for x in (fps, rot1, rot2, rot3)]
        docs = np.ascontiguousarray(doc_ids, dtype=np.int64)
        n = arrays[0].shape[0]
        if any(x.ndim != 1 or x.shape[0] != n for x in arrays) or docs.ndim != 1 or docs.shape[0] != n:
            raise ValueError("block tables must be 1-d arrays of one length")
        self.fps, self.rot1, self.rot2, self.rot3 = arrays
        self.doc_ids = docs
        self.n = n
        if offsets is None and n >= OFFSETS_MIN:
            offsets = np.stack([_bucket_offsets(x) for x in arrays])
        if offsets is not None:
            offsets = np.ascontiguousarray(offsets, dtype=np.int64)
            if offsets.shape != (BLOCKS, BUCKETS + 1):
                raise ValueError("bucket offsets must have shape (4, 65537)")
        self.offsets = offsets

    @staticmethod
    def build(fps, doc_ids) -> BlockTables:
        """Sort unsorted (fingerprint, doc id) arrays into a run."""
        fps = np.ascontiguousarray(fps, dtype=np.uint64)
        doc_ids = np.ascontiguousarray(doc_ids, dtype=np.int64)
        if fps.shape != doc_ids.shape or fps.ndim != 1:
            raise ValueError("fps and doc_ids must be 1-d arrays of one length")
        order = np.argsort(fps, kind="stable")
        rots = [np.sort(rotl_array(fps, 16 * t)) for t in range(1, BLOCKS)]
        return BlockTables(fps[order], doc_ids[order], *rots)

    def __len__(self) -> int:
        return self.n

    def _tables(self) -> list[np.ndarray]:
        return [self.fps, self.rot1, self.rot2, self.rot3]

    def check_invariant(self) -> None:
        """Verify sortedness, table contents and offsets (for tests); AssertionError if broken."""
        base = np.sort(self.fps)
        for t, table in enumerate(self._tables()):
            if self.n and not bool(np.all(table[1:] >= table[:self.n - 1])):
                raise AssertionError(f"table {t} not sorted")
            if not np.array_equal(np.sort(rotl_array(table, (64 - 16 * t) % 64)), base):
                raise AssertionError(f"table {t} does not hold the run's fingerprints")
            if self.offsets is not None and not np.array_equal(self.offsets[t], _bucket_offsets(table)):
                raise AssertionError(f"table {t} bucket offsets are stale")

    def query_into(self, q: int, k: int, out: list) -> int:
        """Append (doc_id, fp, distance) for every pair in the run within k bits of q; returns the count."""
        if k < 0 or k > 3:
            raise ValueError("k must be in 0..3")
        if not 0 <= q <= _M64:
            raise OverflowError("fingerprints are unsigned 64-bit ints")
        found = 0
        if self.n == 0:
            return 0
        fps0 = self.fps.tolist()
        docs = self.doc_ids.tolist()
        for t, table in enumerate(self._tables()):
            qr = _rotl(q, 16 * t)
            key = qr >> 48
            lo = int(np.searchsorted(table, np.uint64(key << 48), side="left"))
            hi = self.n if key == BUCKETS - 1 else int(np.searchsorted(table, np.uint64((key + 1) << 48), side="left"))
            prev = None
            for i, x in enumerate(table[lo:hi].tolist(), lo):
                if (x ^ qr).bit_count() > k:
                    continue
                # Each fingerprint once per table beyond table 0, expanded to its pairs there.
                if t > 0 and x == prev:
                    continue
                prev = x
                fp = _rotl(x, (64 - 16 * t) & 63)
                d = fp ^ q
                # Only from the first table whose block matches the query.
                if any(((d >> (48 - 16 * tt)) & 0xFFFF) == 0 for tt in range(t)):
                    continue
                dist = d.bit_count()
                if t == 0:
                    out.append((docs[i], fp, dist))
                    found += 1
                else:
                    j = int(np.searchsorted(self.fps, np.uint64(fp), side="left"))
                    while j < self.n and fps0[j] == fp:
                        out.append((docs[j], fp, dist))
                        found += 1
                        j += 1
        return found

    def query_many_into(self, qs, k: int, outs: list) -> int:
        """``query_into(qs[i], k, outs[i])`` for each i; returns the total count."""
        if k < 0 or k > 3:
            raise ValueError("k must be in 0..3")
        qs = np.asarray(qs, dtype=np.uint64).tolist()
        if len(outs) != len(qs):
            raise ValueError("one output list per query")
        return sum(self.query_into(q, k, out) for q, out in zip(qs, outs, strict=True))


class BlockTail:
    """The newest pairs, unsorted, up to ``capacity``; queried by a scan (the native one hashes)."""

    def __init__(self, capacity: int) -> None:
        if not 1 <= capacity <= 1 << 30:
            raise ValueError(f"capacity must be in 1..2**30, got {capacity}")
        self.capacity = capacity
        self.n = 0
        self.fps = np.zeros(capacity, dtype=np.uint64)
        self.doc_ids = np.zeros(capacity, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return self.fps.nbytes + self.doc_ids.nbytes

    def __len__(self) -> int:
        return self.n

    def add(self, fp: int, doc_id: int) -> bool:
        if self.n >= self.capacity:
            raise ValueError("the tail is full")
        self.fps[self.n], self.doc_ids[self.n] = fp, doc_id
        self.n += 1
        return self.n == self.capacity

    def add_many(self, fps, doc_ids) -> int:
        if len(fps) != len(doc_ids):
            raise ValueError("fps and doc_ids must have one length")
        take = min(len(fps), self.capacity - self.n)
        for fp, doc in zip(np.asarray(fps[:take]).tolist(), np.asarray(doc_ids[:take]).tolist(), strict=True):
            self.add(fp, doc)
        return take

    def clear(self) -> None:
        self.n = 0

    def query_into(self, q: int, k: int, out: list) -> int:
        return scan_into(self.fps, self.doc_ids, self.n, q, k, out)

    def query_many_into(self, qs, k: int, outs: list) -> int:
        return scan_many_into(self.fps, self.doc_ids, self.n, qs, k, outs)


def scan_into(fps, doc_ids, n: int, q: int, k: int, out: list) -> int:
    """Append (doc_id, fp, distance) for each of the first n unsorted pairs within k bits of q."""
    if k < 0 or k > 3:
        raise ValueError("k must be in 0..3")
    if n > len(fps) or n > len(doc_ids) or n < 0:
        raise ValueError("n exceeds the arrays")
    found = 0
    for fp, doc in zip(np.asarray(fps[:n]).tolist(), np.asarray(doc_ids[:n]).tolist(), strict=True):
        if (fp ^ q).bit_count() <= k:
            out.append((doc, fp, (fp ^ q).bit_count()))
            found += 1
    return found


def scan_many_into(fps, doc_ids, n: int, qs, k: int, outs: list) -> int:
    """``scan_into`` for each query ``qs[j]`` into ``outs[j]``; returns the total count."""
    if k < 0 or k > 3:
        raise ValueError("k must be in 0..3")
    if n > len(fps) or n > len(doc_ids) or n < 0:
        raise ValueError("n exceeds the arrays")
    qs = np.asarray(qs, dtype=np.uint64).tolist()
    if len(outs) != len(qs):
        raise ValueError("one output list per query")
    return sum(scan_into(fps, doc_ids, n, q, k, out) for q, out in zip(qs, outs, strict=True))


def merge_tables(a: BlockTables, b: BlockTables) -> BlockTables:
    """Merge two runs into one (a's pairs first among equal fingerprints)."""
    if a.n == 0 or b.n == 0:
        return b if a.n == 0 else a
    fps = np.concatenate([a.fps, b.fps])
    order = np.argsort(fps, kind="stable")            # stable: a before b among equals
    docs = np.concatenate([a.doc_ids, b.doc_ids])[order]
    rots = [np.sort(np.concatenate([x, y])) for x, y in ((a.rot1, b.rot1), (a.rot2, b.rot2), (a.rot3, b.rot3))]
    return BlockTables(fps[order], docs, *rots)


def merge_into(runs: list[BlockTables], fps_out, docs_out, rot1_out, rot2_out, rot3_out) -> int:
    """Merge ``runs`` (oldest first) into the five output buffers; older pairs first among equals."""
    if not 1 <= len(runs) <= MAX_MERGE:
        raise ValueError(f"merge_into merges 1..{MAX_MERGE} runs, got {len(runs)}")
    total = sum(r.n for r in runs)
    outs = (fps_out, docs_out, rot1_out, rot2_out, rot3_out)
    if any(np.asarray(o).shape != (total,) for o in outs):
        raise ValueError(f"output buffers must hold {total} elements")
    if total == 0:
        return 0
    fps = np.concatenate([r.fps for r in runs])
    order = np.argsort(fps, kind="stable")            # stable: older runs first among equals
    fps_out[:] = fps[order]
    docs_out[:] = np.concatenate([r.doc_ids for r in runs])[order]
    for out, name in ((rot1_out, "rot1"), (rot2_out, "rot2"), (rot3_out, "rot3")):
        out[:] = np.sort(np.concatenate([getattr(r, name) for r in runs]))
    return total


def bucket_offsets(table) -> np.ndarray:
    """The bucket directory of one sorted table: 65537 offsets (first index with top 16 bits >= b)."""
    return _bucket_offsets(np.asarray(table))
