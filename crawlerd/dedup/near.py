"""Near-duplicate owner of the crawl process: simhash index, doc id -> URL, per-host trap feedback.

Manku, Jain, Das Sarma (WWW 2007): a page whose 64-bit simhash lies within
Hamming distance k (<= 3) of a stored page's is a near duplicate. The crawl
process asks :meth:`NearDuplicates.check_and_add` once per fetched HTML page (a worker's
batch of them at once: :meth:`NearDuplicates.check_and_add_many`, same answers);
the answer names the stored page (its URL), so the event and the stats can say
``near_duplicate_of``. A near duplicate is still archived, only flagged.

Only *originals* are stored: a page that matched is not added, so an index
entry is always a page that had no stored neighbour when it came, and a trap
that serves the same text under endless URLs (session ids) does not grow the
index. A page whose closest stored neighbour has its own URL is a recrawl of
that page, not a near duplicate.

Trap feedback: per host, the last ``window_pages`` answers are kept as a bit
window (in a byte-bounded LRU of ``host_windows_bytes``); :meth:`should_demote` says True once at least ``demote_min_pages`` are
in the window and at least ``demote_ratio`` of them were near duplicates, and
then starts a fresh window, so each further demotion needs another window of
mostly-duplicate pages (the shard lowers the host one level each time).

Persistence under ``directory`` (``data_dir/dedup``):

``near/``
    LMDB: key = doc id (8 bytes, big endian), value = simhash (8 bytes, big
    endian) + URL (UTF-8). Each add is committed before ``check_and_add`` returns
    (inside ``batch()``: before the batch ends, one transaction for all its adds),
    written then and fsynced by ``save``, so ``kill -9`` loses no doc the crawl
    was told about. With a writer attached (``attach_writer``: the shard's ``WriteThread``,
    during the crawl) no write transaction runs on the loop: a batch's new docs are kept in RAM
    (``check_and_add`` reads them there) and handed over when the batch ends; the writer thread
    appends them in one transaction per group and ``save``'s fsync runs there too. A page's lease
    completes only once its doc is written (``written()``, awaited by the shard's answers), so a
    ``kill -9`` loses only docs of pages whose leases had not completed: fetched again, asked
    again, stored again.
``near-index/``
    The :class:`NearIndex`: sorted block tables in run files on disk and a
    delta in RAM of at most ``index_ram_bytes``. Its manifest names the
    first doc id not on disk; on open the LMDB docs from there on are
    replayed into the index, so it is whole again after a crash. (Index
    files of the older in-RAM index, ``near-simhash-*.idx``, are removed;
    the replay then rebuilds the index from LMDB.)
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

import lmdb
import numpy as np

from crawlerd.bytecache import ByteLRU, slots_bytes, str_bytes
from crawlerd.dedup.near_index import NearIndex, match_order, neighbours_within
from crawlerd.dedup.simhash_index import check_fp
from crawlerd.store.writer import WriteThread

log = logging.getLogger("crawlerd.dedup.near")

_KEY = struct.Struct(">Q")
_FP = struct.Struct(">Q")
_WINDOW_BYTES = slots_bytes(6) + 5 * 32     # _HostWindow + its ints (the bit window up to ~48 bytes)


class _HostWindow:
    """Counters of one host. ``bits``: the last ``n`` answers, newest in bit 0 (1 = near duplicate);
    invariant ``near == popcount(bits)`` and ``n <= window``."""

    __slots__ = ("pages", "near_total", "bits", "n", "near", "demotions")

    def __init__(self) -> None:
        self.pages = 0          # pages checked since the host was (re)tracked
        self.near_total = 0     # of which near duplicates
        self.bits = 0
        self.n = 0
        self.near = 0
        self.demotions = 0


class NearDuplicates:
    """Near-duplicate state of one crawl: index of original pages, their URLs, per-host windows.

    Key: doc id (a sequence number from 0, int64) -> (simhash, URL) in LMDB;
    the index maps simhash -> doc id. Invariants: every doc id below
    ``next_id`` is in LMDB, and (after open and after each add) also in the
    index; no two stored docs are within ``distance_bits`` of each other at
    the time the later one was checked. Host windows: ``host_key ->
    _HostWindow`` in a byte-bounded LRU of ``host_windows_bytes`` (a forgotten
    host starts counting afresh, so RAM is bounded whatever the number of hosts).
    """

    def __init__(self, directory: str | os.PathLike, *, distance_bits: int = 3, demote_ratio: float = 0.5,
                 demote_min_pages: int = 20, window_pages: int = 100, host_windows_bytes: int = 16 << 20,
                 map_size_bytes: int = 64 * 2**30, index_ram_bytes: int = 64 << 20,
                 tail_capacity: int = 4096) -> None:
        if not 0 <= distance_bits <= 3:
            raise ValueError(f"distance_bits must be 0..3, got {distance_bits}")
        if not 0.0 <= demote_ratio <= 1.0:
            raise ValueError(f"demote_ratio must be in [0, 1], got {demote_ratio}")
        if not 1 <= demote_min_pages <= window_pages:
            raise ValueError(f"need 1 <= demote_min_pages <= window_pages, got {demote_min_pages}, {window_pages}")
        if host_windows_bytes < 0:
            raise ValueError(f"host_windows_bytes must be >= 0, got {host_windows_bytes}")
        self.distance_bits = distance_bits
        self.demote_ratio = demote_ratio
        self.demote_min_pages = demote_min_pages
        self.window_pages = window_pages
        self._mask = (1 << window_pages) - 1
        self._hosts = ByteLRU(host_windows_bytes)
        self._dir = Path(directory)
        self._env_dir = self._dir / "near"
        self._env_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self._env_dir / "owner.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise RuntimeError(f"near-duplicate store {self._env_dir} is already open by another owner") from None
        for p in [*self._dir.glob(".near-simhash-*.tmp-*"), *self._dir.glob("near-simhash-*.idx")]:
            p.unlink(missing_ok=True)       # files of the in-RAM index this one replaces
        try:
            # sync=False: every commit reaches the file before it returns (a process crash
            # loses nothing); the fsync waits for save().
            self._env = lmdb.open(str(self._env_dir), map_size=map_size_bytes, subdir=True, max_dbs=0,
                                  sync=False, metasync=False, readahead=False, lock=True)
            self._index = NearIndex(self._dir / "near-index", ram_budget_bytes=index_ram_bytes,
                                    tail_capacity=tail_capacity)
            try:
                self.next_id = self._replay()
            except BaseException:
                self._index.close(flush=False)
                raise
        except BaseException:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise
        self._txn: lmdb.Transaction | None = None     # the write transaction of the open batch()
        self._writer: WriteThread | None = None
        self._unlanded: dict[bytes, bytes] = {}       # with a writer: docs handed over, not written yet
        self._added: list[tuple[bytes, bytes]] | None = None   # ... and the open batch's new docs
        self._write_failed: BaseException | None = None
        self._written: asyncio.Future | None = None    # done once the last batch handed over is written
        self.handed_over = 0            # docs handed to the writer
        self.checked = 0            # pages checked since open
        self.near_found = 0         # of which near duplicates
        self.demotions = 0          # True answers of should_demote since open

    # -- open -------------------------------------------------------------------------
    def _replay(self) -> int:
        """Add the LMDB docs the index's disk part lacks; return the next free doc id."""
        next_id = self._index.docs_below
        with self._env.begin(buffers=True) as txn:
            cur = txn.cursor()
            if cur.set_range(_KEY.pack(next_id)):
                for key, value in cur:
                    doc = _KEY.unpack(key)[0]
                    self._index.add(_FP.unpack_from(value)[0], doc)
                    next_id = doc + 1
        # LMDB behind the index (lost or restored): next_id stays at the index's mark,
        # so an id the index holds is never reused
        return next_id

    # -- the question -------------------------------------------------------------------
    def check_and_add(self, simhash: int, url: str, host_key: str) -> str:
        """URL of a stored page within ``distance_bits`` of ``simhash``, or "" (then this page is stored).

        Counts the answer in ``host_key``'s window. Call it once per fetched page that has text.
        Inside ``batch()`` the page is written in the batch's transaction, else in its own.
        """
        if self._txn is None:
            with self.batch():
                return self.check_and_add(simhash, url, host_key)
        self.checked += 1
        match, _doc = self._answer(self._txn, self._index.query(simhash, self.distance_bits), simhash, url)
        self._count(host_key, bool(match))
        return match

    def _answer(self, txn: lmdb.Transaction, found: list, simhash: int, url: str) -> tuple[str, int | None]:
        """One page's answer from its stored neighbours (closest first): the first whose URL is
        read, and None; or "" and the doc id the page was stored as, when there is none."""
        match = ""
        for doc, _fp, _dist in found:
            match = self._url_in(txn, doc)
            if match:
                break       # closest first; a doc whose URL is lost (damaged LMDB) is passed over
        if match == url:
            return "", None     # the same URL again (recrawl): not a near duplicate, already stored
        if not match:
            return "", self._store(txn, simhash, url)
        self.near_found += 1
        return match, None

    def _store(self, txn: lmdb.Transaction, simhash: int, url: str) -> int:
        """Keep a page that had no stored neighbour as the next doc (LMDB, or handed over; index)."""
        doc = self.next_id
        key, value = _KEY.pack(doc), _FP.pack(simhash) + url.encode("utf-8", "surrogatepass")
        if self._added is not None:
            self._added.append((key, value))
            self._unlanded[key] = value
        else:
            txn.put(key, value, append=True)
        self._index.add(simhash, doc)
        self.next_id = doc + 1
        return doc

    def check_and_add_many(self, pages: Sequence[tuple[int, str, str]]) -> tuple[list[str], list[str]]:
        """``check_and_add(simhash, url, host_key)`` then ``should_demote(host_key)`` for each page,
        in order, with the same answers; returns (the answers, the host key of each True demotion).

        The index is asked once for the whole batch (one native pass per part of it), and the
        batch's own pages are compared with each other, so a page may still match one stored
        earlier in the batch. Inside ``batch()`` the pages are written in the batch's transaction.
        """
        if self._txn is None:
            with self.batch():
                return self.check_and_add_many(pages)
        k = self.distance_bits
        fps = [check_fp(p[0]) for p in pages]
        qs = np.array(fps, dtype=np.uint64)
        before = self._index.query_batch(qs, k)       # the stored pages as the batch began
        peers = neighbours_within(qs, k)                # within the batch: few, usually only itself
        txn, window, hosts = self._txn, self._window, self._hosts
        stored_as: dict[int, int] = {}                # batch position -> doc id, of the pages stored
        answers: list[str] = []
        demoted: list[str] = []
        for i, (simhash, url, host_key) in enumerate(pages):
            self.checked += 1
            found = before[i]
            if len(peers[i]) > 1 and stored_as:
                mine = [(stored_as[j], fp, dist) for j, fp, dist in peers[i] if j < i and j in stored_as]
                if mine:
                    found = sorted(found + mine, key=match_order)
            match, doc = self._answer(txn, found, simhash, url)
            if doc is not None:
                stored_as[i] = doc
            h = window(host_key)
            self._count_in(h, bool(match))
            if hosts.peek(host_key) is h and self._demote(h):     # as should_demote: a window held
                demoted.append(host_key)
            answers.append(match)
        return answers, demoted

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """One LMDB write transaction for every ``check_and_add`` inside, committed when the block
        ends (a worker's batch of questions costs one commit, not one per page). A page may match
        one stored earlier in the same batch."""
        if self._txn is not None:
            yield
            return
        if self._writer is not None:
            yield from self._handed_over()
            return
        with self._env.begin(write=True) as txn:
            self._txn = txn
            try:
                yield
            finally:
                self._txn = None

    def _handed_over(self) -> Iterator[None]:
        # batch() with a writer: reads in a read transaction (the docs not landed from RAM), the new
        # docs handed over in submit order when the block ends (doc ids ascending: appends)
        if self._write_failed is not None:
            err, self._write_failed = self._write_failed, None
            raise err
        added: list[tuple[bytes, bytes]] = []
        with self._env.begin() as txn:
            self._txn, self._added = txn, added
            try:
                yield
            finally:
                self._txn = self._added = None
                if added:
                    self.handed_over += len(added)
                    done = self._written = asyncio.get_running_loop().create_future()
                    self._writer.submit(self._write, added, functools.partial(self._landed, added, done))

    def _write(self, groups: list[list[tuple[bytes, bytes]]]) -> None:
        # on the writer thread: a group's docs in one transaction
        try:
            with self._env.begin(write=True) as txn:
                for added in groups:
                    for key, value in added:
                        txn.put(key, value, append=True)
        except lmdb.Error as e:
            self._write_failed = e

    def _landed(self, added: list[tuple[bytes, bytes]], done: asyncio.Future) -> None:
        unlanded = self._unlanded
        for key, _ in added:
            unlanded.pop(key, None)
        if not done.done():
            done.set_result(None)

    def written(self) -> asyncio.Future | None:
        """None when every doc handed to the writer is written, else an awaitable done once those
        handed over so far are (batches land in order): a page's lease completes after it, so a
        ``kill -9`` never keeps a completed page whose doc was not written."""
        done = self._written
        return None if done is None or done.done() else done

    def attach_writer(self, writer: WriteThread | None) -> None:
        """Write on ``writer`` from now on; None: write on the caller's thread again (every doc handed
        over must have landed: detach after the writer's ``barrier``, or once it is closed)."""
        if writer is None and self._unlanded and self._write_failed is None and self._writer is not None \
                and self._writer.error is None:
            raise RuntimeError(f"{len(self._unlanded)} near-duplicate docs handed over and not written")
        self._writer = writer

    @property
    def pending(self) -> int:
        """Docs handed to the writer and not written yet."""
        return len(self._unlanded)

    def url_of(self, doc_id: int) -> str:
        """URL of a stored doc, or "" if unknown."""
        with self._env.begin() as txn:
            return self._url_in(txn, doc_id)

    def _url_in(self, txn: lmdb.Transaction, doc_id: int) -> str:
        key = _KEY.pack(doc_id)
        value = self._unlanded.get(key) if self._unlanded else None
        if value is None:
            value = txn.get(key)
        return "" if value is None else value[_FP.size:].decode("utf-8", "surrogatepass")

    # -- per-host windows ----------------------------------------------------------------
    def _count(self, host_key: str, near: bool) -> None:
        self._count_in(self._window(host_key), near)

    def _window(self, host_key: str) -> _HostWindow:
        """The host's window (most recently used now), made if it was not tracked."""
        hosts = self._hosts
        h = hosts.get(host_key)
        if h is None:
            h = _HostWindow()
            hosts.put(host_key, h, str_bytes(host_key) + _WINDOW_BYTES)
        return h

    def _count_in(self, h: _HostWindow, near: bool) -> None:
        h.pages += 1
        h.near_total += near
        if h.n == self.window_pages:
            h.near -= (h.bits >> (self.window_pages - 1)) & 1      # the oldest answer leaves
        else:
            h.n += 1
        h.bits = ((h.bits << 1) | near) & self._mask
        h.near += near

    def should_demote(self, host_key: str) -> bool:
        """True when the host's recent pages are mostly near duplicates; a True starts a fresh window."""
        h = self._hosts.peek(host_key)
        return h is not None and self._demote(h)

    def _demote(self, h: _HostWindow) -> bool:
        if h.n < self.demote_min_pages or h.near < self.demote_ratio * h.n:
            return False
        h.bits = h.n = h.near = 0
        h.demotions += 1
        self.demotions += 1
        return True

    def host_counts(self, host_key: str) -> dict[str, int]:
        """Counters of one host (zeros when untracked): pages, near duplicates, window, demotions."""
        h = self._hosts.peek(host_key) or _HostWindow()
        return {"pages": h.pages, "near_duplicates": h.near_total, "window_pages": h.n,
                "window_near_duplicates": h.near, "demotions": h.demotions}

    def top_hosts(self, n: int = 10) -> list[tuple[str, int]]:
        """Tracked hosts with the most near duplicates: (host key, count), most first."""
        ranked = sorted(((h.near_total, k) for k, h in self._hosts.items() if h.near_total), reverse=True)
        return [(k, c) for c, k in ranked[:n]]

    def stats(self) -> dict[str, int]:
        return {"stored": self.next_id, "checked": self.checked, "near_duplicates": self.near_found,
                "demotions": self.demotions, "hosts_tracked": len(self._hosts)}

    @property
    def storage_fault(self) -> OSError | None:
        """The index's last failed disk merge (disk full, I/O error), until a merge succeeds."""
        return self._index.storage_fault

    def index_stats(self) -> dict[str, int | float]:
        """The index's layout, merges and bytes (RAM against its budget, disk)."""
        return self._index.stats()

    def memory(self) -> dict[str, dict[str, int]]:
        """Bytes held in RAM against each cap: the index delta and the host windows."""
        return {"near_index": self._index.memory(), "near_host_windows": self._hosts.memory()}

    def __len__(self) -> int:
        return len(self._index)

    # -- persistence -----------------------------------------------------------------------
    def save(self) -> None:
        """Checkpoint: fsync the LMDB. The index's disk runs are durable as they are written, and
        what it holds in RAM is replayed from the LMDB on open, so nothing else needs writing."""
        self._check_open()
        if self._writer is not None:
            self._writer.submit(self._sync)       # after the docs handed over before it
            return
        self._env.sync(True)

    def _sync(self, _items: list) -> None:
        try:
            self._env.sync(True)
        except lmdb.Error as e:
            self._write_failed = e

    def close(self, *, save: bool = True) -> None:
        """Save and move the index's RAM part to disk (unless ``save=False``), release the LMDB and
        the owner lock. Idempotent."""
        if self._lock_fd < 0:
            return
        try:
            if save:
                self.save()
            self._index.close(flush=save)
        finally:
            self._env.close()
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _check_open(self) -> None:
        if self._lock_fd < 0:
            raise RuntimeError("near-duplicate store is closed")

    def __enter__(self) -> NearDuplicates:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
