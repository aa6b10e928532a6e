"""Near-duplicate index: every stored simhash within k <= 3 bits of a query.

Manku, Jain, Das Sarma (WWW 2007) §3: split the 64 bits into k + 1 = 4 blocks
of 16 bits. Two fingerprints that differ in at most 3 bits differ in at most 3
blocks, so they agree exactly on at least one; keeping one table per block,
sorted by that block, turns a query into 4 range lookups plus a Hamming check
of the few candidates in each range (about n / 65536 per table).

Storage is log-structured so that adds stay cheap: new pairs go to an unsorted
tail buffer (scanned linearly, at most ``tail_capacity`` long); a full tail
becomes an immutable sorted run (``BlockTables``: the fingerprints with their
doc ids plus three rotated copies, 40 bytes per pair) and runs are merged in
linear time whenever a run is less than ``merge_factor`` times the size of the
next newer one, so there are O(log n) runs. Memory: 40 bytes per stored pair
(10**7 pairs: ~400 MB), plus 2 MiB of bucket offsets for each run of more than
131072 pairs, plus a transient copy of the runs being merged.

The hot loops (bucket lookup, candidate check, tail scan, merge) live in
``crawlerd._native.blocktables`` (reference: ``blocktables_ref.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import xxhash

from crawlerd._native.blocktables import BlockTables, merge_tables, scan_into
from crawlerd.store.fsync import fsync_dir

_MAGIC = b"crawlerd-simhash-index\n"
_VERSION = 1
_U64_MAX = 2**64 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1

Match = tuple[int, int, int]  # (doc_id, fingerprint, Hamming distance)


def check_fp(fp: int) -> int:
    """``fp`` if it is a 64-bit fingerprint, else ValueError."""
    if not 0 <= fp <= _U64_MAX:
        raise ValueError(f"fingerprint out of range [0, 2**64): {fp!r}")
    return fp


def check_k(k: int) -> int:
    """``k`` if it is a distance the 4-block tables answer (0..3), else ValueError."""
    if not 0 <= k <= 3:
        raise ValueError(f"k must be in 0..3 (4 blocks of 16 bits): {k!r}")
    return k


def check_doc_id(doc_id: int) -> int:
    """``doc_id`` if it fits the tables' int64 column, else ValueError."""
    if not _I64_MIN <= doc_id <= _I64_MAX:
        raise ValueError(f"doc id out of int64 range: {doc_id!r}")
    return doc_id


class SimhashIndex:
    """Multimap fingerprint -> doc ids with Hamming-ball queries of radius k <= 3.

    Key: 64-bit fingerprint (unsigned); each ``add`` stores one (fp, doc_id)
    pair, duplicates included. Invariant: every pair added is in exactly one
    place, a run or the tail; the tail holds fewer than ``tail_capacity``
    pairs; each run is at least ``merge_factor`` times as large as the next
    newer run.
    """

    def __init__(self, tail_capacity: int = 2048, merge_factor: int = 4) -> None:
        if tail_capacity < 1:
            raise ValueError("tail_capacity must be >= 1")
        if merge_factor < 2:
            raise ValueError("merge_factor must be >= 2")
        self._tail_capacity = tail_capacity
        self._merge_factor = merge_factor
        self._tail_fps = np.zeros(tail_capacity, dtype=np.uint64)
        self._tail_docs = np.zeros(tail_capacity, dtype=np.int64)
        self._tail_n = 0
        self._runs: list[BlockTables] = []  # oldest (largest) first
        self._count = 0

    # -- writes ---------------------------------------------------------------

    def add(self, fp: int, doc_id: int) -> None:
        """Store one (fingerprint, doc id) pair."""
        check_fp(fp)
        check_doc_id(doc_id)
        self._tail_fps[self._tail_n] = fp
        self._tail_docs[self._tail_n] = doc_id
        self._tail_n += 1
        self._count += 1
        if self._tail_n == self._tail_capacity:
            self._flush_tail()

    def add_many(self, fps: np.ndarray, doc_ids: np.ndarray) -> None:
        """Store many pairs at once (a bulk load sorts them into one run)."""
        fps = np.ascontiguousarray(fps, dtype=np.uint64)
        doc_ids = np.ascontiguousarray(doc_ids, dtype=np.int64)
        if fps.ndim != 1 or fps.shape != doc_ids.shape:
            raise ValueError("fps and doc_ids must be 1-d arrays of one length")
        if fps.shape[0] < self._tail_capacity - self._tail_n:
            for fp, doc in zip(fps.tolist(), doc_ids.tolist(), strict=True):
                self.add(fp, doc)
            return
        self._push_run(BlockTables.build(fps, doc_ids))
        self._count += fps.shape[0]

    def add_and_query(self, fp: int, doc_id: int, k: int = 3) -> list[Match]:
        """Query, then store the pair: the matches are the earlier near-duplicates."""
        found = self.query(fp, k)
        self.add(fp, doc_id)
        return found

    def compact(self) -> None:
        """Merge the tail and all runs into a single run (e.g. before a long read-only phase)."""
        self._flush_tail()
        while len(self._runs) > 1:
            newer = self._runs.pop()
            self._runs[-1] = merge_tables(self._runs[-1], newer)

    def _flush_tail(self) -> None:
        if self._tail_n == 0:
            return
        run = BlockTables.build(self._tail_fps[: self._tail_n], self._tail_docs[: self._tail_n])
        self._tail_n = 0
        self._push_run(run)

    def _push_run(self, run: BlockTables) -> None:
        runs = self._runs
        runs.append(run)
        while len(runs) >= 2 and runs[-2].n < self._merge_factor * runs[-1].n:
            newer = runs.pop()
            runs[-1] = merge_tables(runs[-1], newer)

    # -- reads ----------------------------------------------------------------

    def query(self, fp: int, k: int = 3) -> list[Match]:
        """Every stored (doc_id, fp, distance) with distance <= k, by distance then doc id."""
        check_fp(fp)
        check_k(k)
        out: list[Match] = []
        if self._tail_n:
            scan_into(self._tail_fps, self._tail_docs, self._tail_n, fp, k, out)
        for run in self._runs:
            run.query_into(fp, k, out)
        if len(out) > 1:
            out.sort(key=lambda m: (m[2], m[0], m[1]))
        return out

    def __len__(self) -> int:
        return self._count

    @property
    def run_sizes(self) -> list[int]:
        """Sizes of the sorted runs, oldest first (for stats and tests)."""
        return [run.n for run in self._runs]

    def check_invariant(self) -> None:
        """Verify the layout (for tests); AssertionError if broken."""
        for run in self._runs:
            run.check_invariant()
        for older, newer in zip(self._runs, self._runs[1:], strict=False):
            if older.n < self._merge_factor * newer.n:
                raise AssertionError(f"run of {older.n} should have absorbed the newer {newer.n}")
        if self._tail_n >= self._tail_capacity:
            raise AssertionError("tail overfull")
        if sum(self.run_sizes) + self._tail_n != self._count:
            raise AssertionError("pair count does not add up")

    # -- persistence ----------------------------------------------------------

    def _arrays(self) -> list[np.ndarray]:
        arrays = [
            np.array([_VERSION, len(self._runs), self._tail_n, self._tail_capacity, self._merge_factor],
                     dtype=np.int64)
        ]
        for run in self._runs:
            offsets = run.offsets if run.offsets is not None else np.zeros(0, dtype=np.int64)
            arrays += [run.fps, run.doc_ids, run.rot1, run.rot2, run.rot3, offsets]
        arrays += [self._tail_fps[: self._tail_n], self._tail_docs[: self._tail_n]]
        return arrays

    def save(self, path: str | os.PathLike) -> None:
        """Write the index to ``path`` atomically: temp file, fsync, rename, fsync the directory."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        digest = xxhash.xxh3_64()
        try:
            with open(tmp, "wb") as f:
                f.write(_MAGIC)
                for arr in self._arrays():
                    digest.update(memoryview(np.ascontiguousarray(arr)).cast("B"))
                    np.save(f, arr, allow_pickle=False)
                np.save(f, np.array([digest.intdigest()], dtype=np.uint64), allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(str(path.parent))

    @classmethod
    def load(cls, path: str | os.PathLike) -> SimhashIndex:
        """Read an index written by ``save``; ValueError if the file is not one or is damaged."""
        digest = xxhash.xxh3_64()

        def read(f) -> np.ndarray:
            try:
                arr = np.load(f, allow_pickle=False)
            except (ValueError, EOFError, OSError) as exc:
                raise ValueError(f"{path}: damaged simhash index ({exc})") from exc
            return arr

        with open(path, "rb") as f:
            if f.read(len(_MAGIC)) != _MAGIC:
                raise ValueError(f"{path}: not a crawlerd simhash index")
            head = read(f)
            if head.dtype != np.int64 or head.shape != (5,) or int(head[0]) != _VERSION:
                raise ValueError(f"{path}: unsupported simhash index header")
            digest.update(memoryview(head).cast("B"))
            _, n_runs, tail_n, tail_capacity, merge_factor = (int(x) for x in head)
            if not (0 <= n_runs <= 64 and 0 <= tail_n < tail_capacity):
                raise ValueError(f"{path}: damaged simhash index header")
            arrays = []
            for _ in range(6 * n_runs + 2):
                arr = read(f)
                digest.update(memoryview(np.ascontiguousarray(arr)).cast("B"))
                arrays.append(arr)
            check = read(f)
            if check.shape != (1,) or int(check[0]) != digest.intdigest():
                raise ValueError(f"{path}: simhash index checksum mismatch")
        index = cls(tail_capacity=tail_capacity, merge_factor=merge_factor)
        for i in range(n_runs):
            fps, docs, r1, r2, r3, offsets = arrays[6 * i : 6 * i + 6]
            index._runs.append(BlockTables(fps, docs, r1, r2, r3, offsets if offsets.size else None))
        index._tail_fps[:tail_n] = arrays[-2]
        index._tail_docs[:tail_n] = arrays[-1]
        index._tail_n = tail_n
        index._count = sum(index.run_sizes) + tail_n
        return index
