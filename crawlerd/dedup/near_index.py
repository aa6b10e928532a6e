"""Near-duplicate index on disk: sorted permuted block tables in files, a bounded delta in RAM.

Manku, Jain, Das Sarma (WWW 2007) §3-4 keep billions of fingerprints in
sorted permuted tables on disk; IRLbot (Lee et al., WWW 2008 §4) keeps
whatever grows with the crawl on disk and merges into it in batches. This
index does both, so its RAM is a fixed budget whatever the number of pages:

- **tail**: the newest pairs, unsorted (``tail_capacity`` of them), with a hash
  chain per 16-bit block (``BlockTail``), so a query looks only at the pairs that
  share a block with it (a linear scan cost ~1.5 µs a query per 1,024 pairs, more
  than all the runs). A full tail is sorted into a small run (4 block tables,
  ``crawlerd._native.blocktables``) on the caller's thread: a few 100 µs.
- **RAM runs**: sorted runs of the recent pairs, the in-RAM delta.
- **disk runs**: the older pairs, one file per run, memory-mapped read-only
  (file-backed pages the kernel may drop; no private memory).

A single background thread does every merge, so the caller (the shard's event
loop) never does: it folds small RAM runs into larger ones (size-tiered, each
run at least ``merge_factor`` times the next newer one), and once the RAM runs
hold ``budget / 3`` bytes it merges all of them, with the newest disk runs the
size rule calls for, into one new run file in one sequential k-way pass per
table (GIL released). Then it writes the manifest (temp, fsync, rename), swaps
the new state in and deletes the files merged away. Queries read one
published ``(ram runs, disk runs)`` tuple, so a swap never shows a pair twice
or not at all. If the RAM runs reach ``2 * budget / 3`` because the thread is
behind (a large disk merge), ``add`` waits for it: RAM stays within budget.

Storage faults: a run file is allocated whole (``posix_fallocate``) before it
is mapped for writing, so a full disk is an ``OSError`` at allocation, never a
SIGBUS on a page of a sparse map. A merge that fails with an ``OSError`` is
dropped (temp file removed, nothing published), kept as ``storage_fault`` for
the owner (the shard pauses fetching, as for any failed write) and retried
every ``retry_s``; meanwhile ``add`` does not wait for the thread, so RAM may
pass the budget by what arrives while the disk is failing. Any other error
stops the thread and is raised by the next ``add``.

RAM: tail (at most 36 B per slot) + RAM runs (40 B per pair, plus 2 MiB of bucket
directory per run of 2**17 pairs or more) + one in-RAM merge output, which
the thresholds above keep below ``ram_budget_bytes`` in all. Disk: 40 B per
pair plus 2 MiB per run file, and transiently the run being written.

Files in ``directory``: ``near-run-<seq>.tbl`` (a 4 KiB header: magic,
version, n, has-directory; then table 0, doc ids, tables 1-3 and the bucket
directory, little-endian 64-bit) and ``manifest.json`` (the live runs and
``docs_below``, one more than the largest doc id in any disk run). Pairs
that were still in RAM at a crash are not on disk: the owner re-adds its
docs from ``docs_below`` on (``near.py`` replays them from its LMDB), which is
exact when doc ids are added in increasing order.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from pathlib import Path

import numpy as np

from crawlerd._native.blocktables import (
    MAX_MERGE,
    OFFSETS_MIN,
    BlockTables,
    BlockTail,
    bucket_offsets,
    merge_into,
    scan_many_into,
)
from crawlerd.dedup.simhash_index import Match, check_doc_id, check_fp, check_k
from crawlerd.sched import background_thread
from crawlerd.store.fsync import fsync_dir

log = logging.getLogger("crawlerd.dedup.near_index")

_MAGIC = 0x4E5552_44574152_43  # "CRAWDRUN"-ish tag, checked on open
_VERSION = 1
_HEADER_WORDS = 512            # 4 KiB header, so the tables start page-aligned
_DIR_WORDS = 4 * 65537         # the bucket directory of the four tables
_RUN_NAME = re.compile(r"near-run-(\d{12})\.tbl$")
_MANIFEST = "manifest.json"
MIN_BUDGET_BYTES = 4 << 20


def match_order(m: Match) -> tuple[int, int, int]:
    """The order of a query's answers: by distance, then doc id (then fingerprint)."""
    return (m[2], m[0], m[1])


def neighbours_within(fps: np.ndarray, k: int) -> list[list[Match]]:
    """For each fingerprint of a small batch, (position, fp, distance) of every fingerprint of the
    batch within k bits of it, itself included: the batch's pages compared with each other."""
    check_k(k)
    fps = np.ascontiguousarray(fps, dtype=np.uint64)
    out: list[list[Match]] = [[] for _ in range(fps.shape[0])]
    scan_many_into(fps, np.arange(fps.shape[0], dtype=np.int64), fps.shape[0], fps, k, out)
    return out


def _run_bytes(run: BlockTables) -> int:
    """RAM held by an in-RAM run: five arrays of 8 B per pair, plus its bucket directory."""
    return 40 * run.n + (0 if run.offsets is None else run.offsets.nbytes)


class _DiskRun:
    """One run file mapped read-only. Key: ``seq`` (its file number); ``tables`` views the map."""

    __slots__ = ("seq", "path", "n", "tables", "docs_max")

    def __init__(self, seq: int, path: Path, n: int, tables: BlockTables, docs_max: int) -> None:
        self.seq, self.path, self.n, self.tables, self.docs_max = seq, path, n, tables, docs_max

    @classmethod
    def open(cls, seq: int, path: Path, n: int, docs_max: int) -> _DiskRun:
        size = path.stat().st_size
        has_dir = n >= OFFSETS_MIN
        want = 8 * (_HEADER_WORDS + 5 * n + (_DIR_WORDS if has_dir else 0))
        if size != want:
            raise ValueError(f"{path}: {size} bytes, expected {want} for {n} pairs")
        mm = np.memmap(path, dtype=np.uint64, mode="r")
        head = mm[:4]
        if int(head[0]) != _MAGIC or int(head[1]) != _VERSION or int(head[2]) != n or int(head[3]) != has_dir:
            raise ValueError(f"{path}: not a near-index run of {n} pairs")
        a = _HEADER_WORDS
        parts = [mm[a + i * n: a + (i + 1) * n] for i in range(5)]
        offsets = mm[a + 5 * n:].view(np.int64).reshape(4, 65537) if has_dir else None
        tables = BlockTables(parts[0], parts[1].view(np.int64), parts[2], parts[3], parts[4], offsets)
        return cls(seq, path, n, tables, docs_max)


def _write_run(path: Path, runs: list[BlockTables]) -> tuple[int, int]:
    """Merge ``runs`` into a new run file at ``path`` (written whole, fsynced); returns (n, max doc id)."""
    n = sum(r.n for r in runs)
    has_dir = n >= OFFSETS_MIN
    total = _HEADER_WORDS + 5 * n + (_DIR_WORDS if has_dir else 0)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, 8 * total)    # ENOSPC here, not SIGBUS on a page of the map
    finally:
        os.close(fd)
    mm = np.memmap(path, dtype=np.uint64, mode="r+", shape=(total,))
    try:
        a = _HEADER_WORDS
        parts = [mm[a + i * n: a + (i + 1) * n] for i in range(5)]
        merge_into(runs, parts[0], parts[1].view(np.int64), parts[2], parts[3], parts[4])
        if has_dir:
            d = mm[a + 5 * n:].view(np.int64).reshape(4, 65537)
            for t in range(4):
                d[t] = bucket_offsets(parts[0] if t == 0 else parts[t + 1])
        mm[:4] = [_MAGIC, _VERSION, n, int(has_dir)]
        mm.flush()
    finally:
        del mm
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    docs_max = max((int(r.doc_ids.max()) for r in runs if r.n), default=-1)
    return n, docs_max


class NearIndex:
    """Multimap fingerprint -> doc ids with Hamming-ball queries (k <= 3), RAM bounded by a budget.

    Key: 64-bit fingerprint; each ``add`` stores one (fp, doc id) pair, duplicates
    included. Invariants: every pair added is in exactly one of the tail, a RAM
    run or a disk run; the disk runs listed in the manifest hold exactly the
    pairs of the docs below ``docs_below`` (doc ids added in increasing order);
    the private memory held (``ram_bytes``) stays within ``ram_budget_bytes``.
    Threads: ``add``/``query`` from one owner thread; merges on the index's own.
    """

    def __init__(self, directory: str | os.PathLike, *, ram_budget_bytes: int = 64 << 20,
                 tail_capacity: int = 4096, merge_factor: int = 4, retry_s: float = 5.0) -> None:
        if ram_budget_bytes < MIN_BUDGET_BYTES:
            raise ValueError(f"ram_budget_bytes must be >= {MIN_BUDGET_BYTES}, got {ram_budget_bytes}")
        if not 1 <= tail_capacity <= ram_budget_bytes // 192:    # the tail: at most 3/16 of the budget
            raise ValueError(f"tail_capacity must be in 1..ram_budget_bytes/192, got {tail_capacity}")
        if merge_factor < 2:
            raise ValueError("merge_factor must be >= 2")
        self.ram_budget_bytes = ram_budget_bytes
        self._flush_bytes = ram_budget_bytes // 3
        self._stall_bytes = 2 * ram_budget_bytes // 3
        self._merge_factor = merge_factor
        self._dir = Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._tail = BlockTail(tail_capacity)
        self._lock = threading.Condition(threading.Lock())
        self._ram_bytes = 0            # RAM runs + the thread's in-RAM merge output (under _lock)
        self._busy = False             # the thread is working (under _lock)
        self._error: BaseException | None = None
        self.storage_fault: OSError | None = None   # the last merge's OSError, until one succeeds
        self._retry_s = retry_s
        self._closing = False
        self.stalls = 0                # adds that waited for the merge thread
        self.stall_s = 0.0
        self.disk_merges = 0
        self.ram_merges = 0
        self.merge_s = 0.0
        disk, self.docs_below, self._next_seq = self._open_manifest()
        self._state: tuple[tuple[BlockTables, ...], tuple[_DiskRun, ...]] = ((), disk)
        self._count_disk = sum(r.n for r in disk)
        self._count = self._count_disk
        self._thread = background_thread(self._run, "near-index-merge")
        self._thread.start()

    # -- open -----------------------------------------------------------------------------
    def _open_manifest(self) -> tuple[tuple[_DiskRun, ...], int, int]:
        """The runs of the manifest; a damaged manifest or run discards the disk part (owner replays)."""
        runs: list[_DiskRun] = []
        docs_below, next_seq = 0, 0
        path = self._dir / _MANIFEST
        try:
            with open(path) as f:
                m = json.load(f)
            if m.get("version") != _VERSION:
                raise ValueError(f"unsupported version {m.get('version')!r}")
            for r in m["runs"]:
                seq = int(r["seq"])
                runs.append(_DiskRun.open(seq, self._dir / r["file"], int(r["n"]), int(r["docs_max"])))
            docs_below, next_seq = int(m["docs_below"]), int(m["next_seq"])
        except FileNotFoundError:
            runs = []
        except (ValueError, KeyError, TypeError, OSError) as e:
            log.warning("near-duplicate index %s discarded (%s): rebuilt from the doc store", self._dir, e)
            runs, docs_below = [], 0
        live = {r.path.name for r in runs}
        for p in self._dir.iterdir():       # leftovers of a merge that was killed, or of a discarded index
            if (_RUN_NAME.match(p.name) and p.name not in live) or p.name.startswith("."):
                p.unlink(missing_ok=True)
            elif (mt := _RUN_NAME.match(p.name)) is not None:
                next_seq = max(next_seq, int(mt.group(1)) + 1)
        return tuple(runs), docs_below, next_seq

    # -- writes (owner thread) -------------------------------------------------------------
    def add(self, fp: int, doc_id: int) -> None:
        """Store one (fingerprint, doc id) pair."""
        check_fp(fp)
        check_doc_id(doc_id)
        self._count += 1
        if self._tail.add(fp, doc_id):
            self._push_tail()

    def add_many(self, fps: np.ndarray, doc_ids: np.ndarray) -> None:
        """Store many pairs (in order), a tail's worth at a time, through the same path as ``add``."""
        fps = np.ascontiguousarray(fps, dtype=np.uint64)
        doc_ids = np.ascontiguousarray(doc_ids, dtype=np.int64)
        if fps.ndim != 1 or fps.shape != doc_ids.shape:
            raise ValueError("fps and doc_ids must be 1-d arrays of one length")
        i, n, tail = 0, fps.shape[0], self._tail
        while i < n:
            take = tail.add_many(fps[i:], doc_ids[i:])
            self._count += take
            i += take
            if tail.n == tail.capacity:
                self._push_tail()

    def _push_tail(self) -> None:
        """The tail's pairs as a new RAM run (sorted on this thread); the tail starts empty."""
        tail = self._tail
        self._push(BlockTables.build(tail.fps[:tail.n], tail.doc_ids[:tail.n]))
        tail.clear()

    def _push(self, run: BlockTables) -> None:
        size = _run_bytes(run)
        with self._lock:
            self._raise_error()
            if self._ram_bytes + size > self._stall_bytes:
                t0 = time.monotonic()
                self.stalls += 1
                while (self._ram_bytes + size > self._stall_bytes and self._error is None
                       and self.storage_fault is None):
                    self._lock.wait()
                self.stall_s += time.monotonic() - t0
                self._raise_error()
            ram, disk = self._state
            self._state = (ram + (run,), disk)
            self._ram_bytes += size
            self._lock.notify_all()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"near-duplicate index merge failed: {self._error!r}") from self._error

    # -- reads (owner thread) ---------------------------------------------------------------
    def query(self, fp: int, k: int = 3) -> list[Match]:
        """Every stored (doc_id, fp, distance) with distance <= k, by distance then doc id."""
        check_fp(fp)
        check_k(k)
        out: list[Match] = []
        for part in self._parts():
            part.query_into(fp, k, out)
        if len(out) > 1:
            out.sort(key=match_order)
        return out

    def query_batch(self, fps: np.ndarray, k: int = 3) -> list[list[Match]]:
        """``query`` for each fingerprint, in one native call per part (tail, each run) for all of
        them; visited in sorted order, so disk pages are read in sequence."""
        check_k(k)
        fps = np.ascontiguousarray(fps, dtype=np.uint64)
        if fps.ndim != 1:
            raise ValueError("fps must be a 1-d array")
        out: list[list[Match]] = [[] for _ in range(fps.shape[0])]
        if not out:
            return out
        order = np.argsort(fps, kind="stable")
        qs, outs = fps[order], [out[i] for i in order.tolist()]
        for part in self._parts():
            part.query_many_into(qs, k, outs)
        for found in out:
            if len(found) > 1:
                found.sort(key=match_order)
        return out

    def _parts(self) -> list:
        """What a query reads: the tail (when it holds pairs), the RAM runs, the files' tables, all
        from one published state (no pair twice, none missing)."""
        ram, disk = self._state
        return [*((self._tail,) if self._tail.n else ()), *ram, *(d.tables for d in disk)]

    def __len__(self) -> int:
        return self._count

    # -- the merge thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closing and (self._busy or not self._work()):
                    self._lock.wait()       # _busy here: the owner is flushing (``flush``)
                if self._closing and (self._busy or not self._work()):
                    return
                self._busy = True
            try:
                self._step()
            except OSError as e:            # disk full, I/O error: nothing published; retried
                log.warning("near-duplicate index merge failed, retrying in %g s: %r", self._retry_s, e)
                with self._lock:
                    self.storage_fault = e
                    self._busy = False
                    self._lock.notify_all()
                    if self._closing:
                        return
                    self._lock.wait(self._retry_s)
                continue
            except BaseException as e:      # a bug: the owner's next add raises it
                log.error("near-duplicate index merge failed: %r", e)
                with self._lock:
                    self._error = e
                    self._busy = False
                    self._lock.notify_all()
                return
            with self._lock:
                self._busy = False
                self.storage_fault = None
                self._lock.notify_all()

    def _work(self) -> bool:
        ram = self._state[0]
        return self._ram_bytes >= self._flush_bytes or self._ram_suffix(ram) < len(ram) - 1

    def _ram_suffix(self, ram: tuple[BlockTables, ...]) -> int:
        """First index of the newest RAM runs the size rule merges (len - 1: none)."""
        if not ram:
            return 0
        i, acc = len(ram) - 1, ram[-1].n
        while i > 0 and ram[i - 1].n < self._merge_factor * acc and len(ram) - i < MAX_MERGE:
            i -= 1
            acc += ram[i].n
        return i

    def _step(self) -> None:
        t0 = time.monotonic()
        with self._lock:
            ram, disk = self._state
            flush = self._ram_bytes >= self._flush_bytes
        if flush:
            self._flush(ram, disk)
            self.disk_merges += 1
        else:
            i = self._ram_suffix(ram)
            part = list(ram[i:])
            n = sum(r.n for r in part)
            arrays = [np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.int64),
                      np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint64)]
            with self._lock:
                self._ram_bytes += 40 * n           # the output exists beside its inputs until the swap
            merge_into(part, *arrays)
            merged = BlockTables(*arrays)
            with self._lock:
                now_ram, now_disk = self._state     # the owner only appended meanwhile
                self._state = (now_ram[:i] + (merged,) + now_ram[len(ram):], now_disk)
                self._ram_bytes += _run_bytes(merged) - 40 * n - sum(_run_bytes(r) for r in part)
            self.ram_merges += 1
        self.merge_s += time.monotonic() - t0

    def _flush(self, ram: tuple[BlockTables, ...], disk: tuple[_DiskRun, ...]) -> None:
        """The RAM runs (the oldest MAX_MERGE / 2 of them: they hold the lowest doc ids), with the
        newest disk runs the size rule calls for, into one new run file."""
        ram = ram[:MAX_MERGE // 2]
        n_new = sum(r.n for r in ram)
        j, acc = len(disk), n_new
        while j > 0 and disk[j - 1].n < self._merge_factor * acc and len(disk) - j + len(ram) < MAX_MERGE:
            j -= 1
            acc += disk[j].n
        inputs = [d.tables for d in disk[j:]] + list(ram)
        seq = self._next_seq
        self._next_seq += 1
        name = f"near-run-{seq:012d}.tbl"
        tmp = self._dir / f".{name}.tmp"
        try:
            n, docs_max = _write_run(tmp, inputs)
            os.replace(tmp, self._dir / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        docs_max = max([docs_max] + [d.docs_max for d in disk[j:]])
        new = _DiskRun.open(seq, self._dir / name, n, docs_max)
        runs = disk[:j] + (new,)
        docs_below = max(self.docs_below, max((int(r.doc_ids.max()) for r in ram if r.n), default=-1) + 1)
        try:
            self._write_manifest(runs, docs_below)
        except BaseException:
            (self._dir / name).unlink(missing_ok=True)     # not published: the old manifest still holds
            (self._dir / f".{_MANIFEST}.tmp").unlink(missing_ok=True)
            raise
        with self._lock:
            now_ram, _ = self._state
            self._state = (now_ram[len(ram):], runs)
            self._ram_bytes -= sum(_run_bytes(r) for r in ram)
            self._count_disk = sum(r.n for r in runs)
            self.docs_below = docs_below
        for d in disk[j:]:
            d.path.unlink(missing_ok=True)      # a query may still map it: the mapping outlives the name

    def _write_manifest(self, runs: tuple[_DiskRun, ...], docs_below: int) -> None:
        body = {"version": _VERSION, "docs_below": docs_below, "next_seq": self._next_seq,
                "runs": [{"seq": r.seq, "file": r.path.name, "n": r.n, "docs_max": r.docs_max} for r in runs]}
        tmp = self._dir / f".{_MANIFEST}.tmp"
        with open(tmp, "w") as f:
            json.dump(body, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._dir / _MANIFEST)
        fsync_dir(str(self._dir))

    # -- owner's control ------------------------------------------------------------------------
    def wait_idle(self) -> None:
        """Block until the merge thread has nothing to do (tests, benches, close)."""
        with self._lock:
            while ((self._busy or self._work()) and self._error is None and self.storage_fault is None
                   and self._thread.is_alive()):
                self._lock.wait()
            self._raise_error()
            if self.storage_fault is not None:
                raise self.storage_fault

    def flush(self) -> None:
        """Move everything in RAM (tail included) to disk now, and wait for it (owner thread)."""
        if self._tail.n:
            self._push_tail()
        self.wait_idle()
        while True:
            with self._lock:
                ram, disk = self._state
                self._busy = bool(ram)
            if not ram:
                return
            try:
                self._flush(ram, disk)
            finally:
                with self._lock:
                    self._busy = False
                    self._lock.notify_all()

    def close(self, *, flush: bool = True) -> None:
        """Stop the merge thread (after ``flush()`` unless ``flush=False``). Idempotent."""
        if self._closing:
            return
        try:
            if flush and self._error is None:
                self.flush()
        finally:
            with self._lock:
                self._closing = True
                self._lock.notify_all()
            self._thread.join()

    def memory(self) -> dict[str, int]:
        """Private bytes held now (tail, RAM runs, merge output) against the budget; disk bytes."""
        with self._lock:
            ram_bytes = self._ram_bytes
            disk = self._state[1]
        disk_bytes = sum(8 * (_HEADER_WORDS + 5 * d.n + (_DIR_WORDS if d.n >= OFFSETS_MIN else 0)) for d in disk)
        return {"bytes": ram_bytes + self._tail.nbytes,
                "cap_bytes": self.ram_budget_bytes, "disk_bytes": disk_bytes}

    def stats(self) -> dict[str, int | float]:
        ram, disk = self._state
        return {"pairs": self._count, "pairs_on_disk": self._count_disk, "ram_runs": len(ram),
                "disk_runs": len(disk), "disk_merges": self.disk_merges, "ram_merges": self.ram_merges,
                "merge_s": round(self.merge_s, 3), "stalls": self.stalls, "stall_s": round(self.stall_s, 3),
                **self.memory()}

    def check_invariant(self) -> None:
        """Verify every run and the pair count (for tests); AssertionError if broken."""
        self.wait_idle()
        ram, disk = self._state
        for run in ram:
            run.check_invariant()
        for d in disk:
            d.tables.check_invariant()
        total = self._tail.n + sum(r.n for r in ram) + sum(d.n for d in disk)
        if total != self._count:
            raise AssertionError(f"pairs do not add up: {total} != {self._count}")
        with self._lock:
            if self._ram_bytes != sum(_run_bytes(r) for r in ram):
                raise AssertionError("RAM account out of step with the RAM runs")
