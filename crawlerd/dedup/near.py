"""Near-duplicate owner of the crawl process: simhash index, doc id -> URL, per-host trap feedback.

Manku, Jain, Das Sarma (WWW 2007): a page whose 64-bit simhash lies within
Hamming distance k (<= 3) of a stored page's is a near duplicate. The crawl
process asks :meth:`NearDuplicates.check_and_add` once per fetched HTML page;
the answer names the stored page (its URL), so the event and the stats can say
``near_duplicate_of``. A near duplicate is still archived, only flagged.

Only *originals* are stored: a page that matched is not added, so an index
entry is always a page that had no stored neighbour when it came, and a trap
that serves the same text under endless URLs (session ids) does not grow the
index. A page whose closest stored neighbour has its own URL is a recrawl of
that page, not a near duplicate.

Trap feedback: per host, the last ``window_pages`` answers are kept as a bit
window; :meth:`should_demote` says True once at least ``demote_min_pages`` are
in the window and at least ``demote_ratio`` of them were near duplicates, and
then starts a fresh window, so each further demotion needs another window of
mostly-duplicate pages (the shard lowers the host one level each time).

Persistence under ``directory`` (``data_dir/dedup``):

``near/``
    LMDB: key = doc id (8 bytes, big endian), value = simhash (8 bytes, big
    endian) + URL (UTF-8). Each add is its own committed transaction (written
    before it returns; fsynced by ``save``), so ``kill -9`` loses no doc.
``near-simhash-<next id>.idx``
    The :class:`SimhashIndex` as of ``save``; the number is the first doc id
    *not* in it. Written to a temp name, fsynced, renamed (ARCHITECTURE.md "On disk"); older
    files are removed afterwards. On open the newest readable file is loaded
    and the LMDB docs from its number on are replayed into the index, so the
    index is whole again after a crash.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import struct
from collections import OrderedDict
from pathlib import Path

import lmdb

from crawlerd.dedup.simhash_index import SimhashIndex

log = logging.getLogger("crawlerd.dedup.near")

_KEY = struct.Struct(">Q")
_FP = struct.Struct(">Q")
_INDEX_NAME = re.compile(r"near-simhash-(\d{16})\.idx$")


def _index_name(next_id: int) -> str:
    return f"near-simhash-{next_id:016d}.idx"


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
    _HostWindow`` in LRU order, at most ``max_hosts`` (a forgotten host starts
    counting afresh, so RAM is bounded whatever the number of hosts).
    """

    def __init__(self, directory: str | os.PathLike, *, distance_bits: int = 3, demote_ratio: float = 0.5,
                 demote_min_pages: int = 20, window_pages: int = 100, max_hosts: int = 100_000,
                 map_size_bytes: int = 64 * 2**30, tail_capacity: int = 2048) -> None:
        if not 0 <= distance_bits <= 3:
            raise ValueError(f"distance_bits must be 0..3, got {distance_bits}")
        if not 0.0 <= demote_ratio <= 1.0:
            raise ValueError(f"demote_ratio must be in [0, 1], got {demote_ratio}")
        if not 1 <= demote_min_pages <= window_pages:
            raise ValueError(f"need 1 <= demote_min_pages <= window_pages, got {demote_min_pages}, {window_pages}")
        if max_hosts < 1:
            raise ValueError(f"max_hosts must be >= 1, got {max_hosts}")
        self.distance_bits = distance_bits
        self.demote_ratio = demote_ratio
        self.demote_min_pages = demote_min_pages
        self.window_pages = window_pages
        self.max_hosts = max_hosts
        self._mask = (1 << window_pages) - 1
        self._hosts: OrderedDict[str, _HostWindow] = OrderedDict()
        self._dir = Path(directory)
        self._env_dir = self._dir / "near"
        self._env_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self._env_dir / "owner.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise RuntimeError(f"near-duplicate store {self._env_dir} is already open by another owner") from None
        for p in self._dir.glob(".near-simhash-*.tmp-*"):
            p.unlink(missing_ok=True)       # temp file of a save that was killed
        try:
            # sync=False: every commit reaches the file before it returns (a process crash
            # loses nothing); the fsync waits for save().
            self._env = lmdb.open(str(self._env_dir), map_size=map_size_bytes, subdir=True, max_dbs=0,
                                  sync=False, metasync=False, readahead=False, lock=True)
            self._index, self._saved_id = self._load_index(tail_capacity)
            self.next_id = self._replay()
        except BaseException:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise
        self.checked = 0            # pages checked since open
        self.near_found = 0         # of which near duplicates
        self.demotions = 0          # True answers of should_demote since open

    # -- open -------------------------------------------------------------------------
    def _index_files(self) -> list[tuple[int, Path]]:
        found = []
        for p in self._dir.iterdir():
            m = _INDEX_NAME.match(p.name)
            if m:
                found.append((int(m.group(1)), p))
        return sorted(found, reverse=True)

    def _load_index(self, tail_capacity: int) -> tuple[SimhashIndex, int]:
        """Newest readable index file (a damaged one is skipped: replay rebuilds from LMDB)."""
        for next_id, path in self._index_files():
            try:
                return SimhashIndex.load(path), next_id
            except (ValueError, OSError) as e:
                log.warning("skipping near-duplicate index %s: %s", path, e)
        return SimhashIndex(tail_capacity=tail_capacity), 0

    def _replay(self) -> int:
        """Add the LMDB docs the loaded index lacks; return the next free doc id."""
        next_id = self._saved_id
        with self._env.begin(buffers=True) as txn:
            cur = txn.cursor()
            if cur.set_range(_KEY.pack(self._saved_id)):
                for key, value in cur:
                    doc = _KEY.unpack(key)[0]
                    self._index.add(_FP.unpack_from(value)[0], doc)
                    next_id = doc + 1
        # LMDB behind the index file (lost or restored): next_id stays at the file's number,
        # so an id the index holds is never reused
        return next_id

    # -- the question -------------------------------------------------------------------
    def check_and_add(self, simhash: int, url: str, host_key: str) -> str:
        """URL of a stored page within ``distance_bits`` of ``simhash``, or "" (then this page is stored).

        Counts the answer in ``host_key``'s window. Call it once per fetched page that has text.
        """
        self.checked += 1
        match = ""
        for doc, _fp, _dist in self._index.query(simhash, self.distance_bits):
            match = self.url_of(doc)
            if match:
                break       # closest first; a doc whose URL is lost (damaged LMDB) is passed over
        if match == url:
            match = ""      # the same URL again (recrawl): not a near duplicate, already stored
        elif not match:
            doc = self.next_id
            with self._env.begin(write=True) as txn:
                txn.put(_KEY.pack(doc), _FP.pack(simhash) + url.encode("utf-8", "surrogatepass"), append=True)
            self._index.add(simhash, doc)
            self.next_id = doc + 1
        else:
            self.near_found += 1
        self._count(host_key, bool(match))
        return match

    def url_of(self, doc_id: int) -> str:
        """URL of a stored doc, or "" if unknown."""
        with self._env.begin() as txn:
            value = txn.get(_KEY.pack(doc_id))
        return "" if value is None else value[_FP.size:].decode("utf-8", "surrogatepass")

    # -- per-host windows ----------------------------------------------------------------
    def _count(self, host_key: str, near: bool) -> None:
        hosts = self._hosts
        h = hosts.get(host_key)
        if h is None:
            h = hosts[host_key] = _HostWindow()
            if len(hosts) > self.max_hosts:
                hosts.popitem(last=False)
        else:
            hosts.move_to_end(host_key)
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
        h = self._hosts.get(host_key)
        if h is None or h.n < self.demote_min_pages or h.near < self.demote_ratio * h.n:
            return False
        h.bits = h.n = h.near = 0
        h.demotions += 1
        self.demotions += 1
        return True

    def host_counts(self, host_key: str) -> dict[str, int]:
        """Counters of one host (zeros when untracked): pages, near duplicates, window, demotions."""
        h = self._hosts.get(host_key) or _HostWindow()
        return {"pages": h.pages, "near_duplicates": h.near_total, "window_pages": h.n,
                "window_near_duplicates": h.near, "demotions": h.demotions}

    def top_hosts(self, n: int = 10) -> list[tuple[str, int]]:
        """Tracked hosts with the most near duplicates: (host key, count), most first."""
        ranked = sorted(((h.near_total, k) for k, h in self._hosts.items() if h.near_total), reverse=True)
        return [(k, c) for c, k in ranked[:n]]

    def stats(self) -> dict[str, int]:
        return {"stored": self.next_id, "checked": self.checked, "near_duplicates": self.near_found,
                "demotions": self.demotions, "hosts_tracked": len(self._hosts)}

    def __len__(self) -> int:
        return len(self._index)

    # -- persistence -----------------------------------------------------------------------
    def save(self) -> None:
        """Checkpoint: fsync the LMDB, write the index (temp, fsync, rename), drop older index files."""
        self._check_open()
        self._env.sync(True)
        if self.next_id == self._saved_id and self._index_files():
            return
        self._index.save(self._dir / _index_name(self.next_id))
        self._saved_id = self.next_id
        for next_id, path in self._index_files():
            if next_id != self._saved_id:
                path.unlink(missing_ok=True)

    def close(self, *, save: bool = True) -> None:
        """Save (unless ``save=False``), release the LMDB and the owner lock. Idempotent."""
        if self._lock_fd < 0:
            return
        try:
            if save:
                self.save()
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
