"""An LMDB store written on the writer thread and read on the loop through a RAM overlay.

py-lmdb write transactions are thread-affine (begun, used and committed on one thread), and a
store whose reads run inside its write transaction (budgets: BEAST pops its FIFOs with a cursor;
recrawl: the due index) cannot simply hand its puts over. :class:`Overlay` stands in for that
write transaction on the loop: it has the parts of ``lmdb.Transaction`` and ``lmdb.Cursor`` the
stores use (``get``, ``put``, ``delete``, ``stat``; cursors with ``first``, ``set_range``,
``next``, ``key``, ``value``, ``delete``, ``putmulti``, ``iternext`` and iteration), and

- a write goes into the open *layer* (key -> value, None for a delete) and into the *view* (the
  newest value of every key written and not yet landed, with the layer that wrote it);
- a read answers from the view first, else from a read transaction on the last commit that
  landed; an ordered read (a cursor) merges the view's keys (kept sorted when a cursor needs
  them) with the committed table's, so the loop reads exactly what a write transaction of its
  own would hold;
- ``drop(db)`` empties a table (py-lmdb's ``drop(db, delete=False)``): until the layer that dropped
  it lands, the loop reads nothing of that table's last commit, only what was written after the drop;
- ``commit(then)`` closes the layer and hands it to the :class:`~crawlerd.store.writer.WriteThread`:
  the thread applies every layer of its group in one write transaction (deletes, then sorted
  puts per table) and commits; ``then`` runs on the loop after that commit, when the layer's keys
  leave the view (unless a later layer wrote them again) and the read transaction is renewed.

Read cache (``read_cache={db: cap_bytes}``): a table whose keys the loop reads again and again
(the host turns of a domain's FIFO at every delivery; a URL's recrawl state at its lease and again
at its answer) keeps what its reads of the committed table found, present or absent, in a
:class:`~crawlerd.bytecache.ByteLRU` bounded in bytes. A read that hits costs no LMDB get, and so
no release and re-take of the GIL (py-lmdb drops it around each ``mdb_get``; with the writer, DRUM
and sync threads alive each hand-off is a futex wake and often a context switch). Exact, not a
hint: only this overlay writes the table while it is attached, and when a layer lands each of its
keys the cache holds takes the value that layer wrote (the committed value from then on); a key
written and not landed answers from the view first. RAM only: a new overlay starts empty.

Unlanded bytes (``unlanded_bytes``, ``memory``): what the layers not landed hold, the open one
included, estimated per write: its key and value objects (an empty value is the interpreter's one
``b""``), its slot in the layer and in the list the commit hands the writer (``_PUT_SLOT_BYTES``,
``_DELETE_SLOT_BYTES``: a put's list entry is a (key, value) tuple), and for a key new to the view
its slot and (value, layer) tuple there (``_VIEW_SLOT_BYTES``; a key the view holds already costs
none). Measured against what tracemalloc sees freed when the layers land
(``bench/budget_unlanded_bytes.py``, ``tests/bench/test_budget_unlanded_bytes.py``). It follows
the writer's backlog; a store that bounds it (the budget store) holds its writers back until a
landing (``on_landed``).

Durability: a commit survives ``kill -9`` once it landed (its ``then`` ran; the thread commits
without fdatasync unless asked, ``commit(sync=True)``); a caller whose promise depends on it
(an acknowledgement, a position committed elsewhere) waits for ``then``. A failed write stops
the writer (``WriteThread``: nothing after it is written or acknowledged).
"""

from __future__ import annotations

import functools
import threading
import time
from bisect import insort
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from crawlerd.bytecache import ByteLRU
from crawlerd.store.lmdb_reserve import WriteBudget, pages_changed
from crawlerd.store.overlay_cursor import OverlayCursor
from crawlerd.store.writer import WriterError, WriteThread

_INSORT_MAX = 32        # new keys merged one by one into a sorted list; more: appended and re-sorted
_PRUNE_SLACK = 4096     # a stale sorted list is pruned at a landing once more keys than its view's
                        # (plus this) landed since: bounded memory with no cursor, O(1) a landed key
_BYTES_BASE = 33        # sys.getsizeof(b""): a cached key or value costs this + its length
# a write held until it lands, beside its key and value (module doc, "Unlanded bytes"): its slot in
# the layer's dict and in the commit's list for the writer (a put's is a (key, value) tuple), and a
# key new to the view its slot and (value, layer) tuple there
_PUT_SLOT_BYTES = 104
_DELETE_SLOT_BYTES = 48
_VIEW_SLOT_BYTES = 96
_PEAK_WINDOW_S = 2.0    # ``memory``'s recent peak: the highest over the last 2-4 s
_MISS = object()


def _cost(key: bytes, value: bytes | None) -> int:
    """Estimated bytes of one read-cache entry (key and value objects; the map's own in ByteLRU)."""
    return _BYTES_BASE + len(key) + (0 if value is None else _BYTES_BASE + len(value))


def _held(value: bytes | None) -> int:
    """Estimated bytes of one write a layer holds beside its key: its value (None: a delete holds
    none; ``b""`` is shared) and its slots in the layer and the commit's list."""
    if value is None:
        return _DELETE_SLOT_BYTES
    return _PUT_SLOT_BYTES + _BYTES_BASE + len(value) if value else _PUT_SLOT_BYTES


class Overlay:
    """Key: (table, key) -> (value or None for deleted, id of the layer that wrote it) in the view.
    Invariants: the view holds exactly the keys of the layers not landed yet, each with its newest
    write; a table's sorted key list (once a cursor asked for it) holds every key of its view (plus
    ``_fresh`` keys not merged yet) and, while the table is in ``_stale``, keys that landed since the
    list was last pruned, fewer than its view's keys + ``_PRUNE_SLACK`` (``sorted_keys`` returns
    exactly the view's keys, each once); layers are written and land in commit order."""

    def __init__(self, env, writer: WriteThread, budget: WriteBudget | None = None,
                 read_cache: dict | None = None) -> None:
        self.env = env
        self.writer = writer
        # the writer's transactions stay within the store's reserved page buffers: a group's layers
        # are committed in as many transactions as their charge needs (see _write)
        self._budget = budget
        self._limit = budget.limit if budget is not None else 0
        self._dbs = budget.dbs if budget is not None else ()
        # charge of one write (deepest table + 1) and each table's (depth, branch pages): read at
        # the start of each write transaction (writer thread); the budget's loop side takes the
        # former from here instead of reading it again (WriteBudget.committed)
        self.per_write = budget.per_write if budget is not None else 2
        self._shape: dict[Any, tuple[int, int]] = {}
        if budget is not None:
            budget.source = self
        self.txns = 0                   # write transactions the writer committed
        self.loop_thread = threading.get_ident()      # attached on the loop's thread
        self.write_threads: set[int] = set()          # threads that began a write transaction here
        self.written_by: set[str] = set()             # their names
        self._rtxn = None
        self._view: dict[Any, dict[bytes, tuple[bytes | None, int]]] = {}
        self._sorted: dict[Any, list[bytes]] = {}
        self._fresh: dict[Any, list[bytes]] = {}
        self._stale: dict[Any, int] = {}              # table -> keys landed since its sorted list was pruned
        self._layer: dict[Any, dict[bytes, bytes | None]] = {}
        self._dropped: set = set()                    # tables the open layer emptied (before its writes)
        self._cleared: dict[Any, int] = {}            # table -> the last layer not landed that emptied it
        self._lid = 0
        self._landing: deque[tuple[int, dict, int]] = deque()     # (layer id, its writes, its bytes)
        self.layers = 0
        self.landed = 0
        # "Unlanded bytes": the open layer's, the handed-over ones', every write's ever (monotonic,
        # and the writes of a key new to its layer)
        self._open_bytes = 0
        self._pending_bytes = 0
        self._view_new: dict[Any, int] = {}        # table -> keys the open layer brought into the view
        self.added_bytes = self.added_writes = 0
        self.high_water_bytes = 0
        self._peak = self._peak_prev = 0
        self._peak_t = time.monotonic()
        self.on_landed: Callable[[], None] | None = None      # after each landing, on the loop
        # db -> committed value of keys read (None: absent), exact (see "Read cache")
        self._caches: dict[Any, ByteLRU] = {db: ByteLRU(cap) for db, cap in (read_cache or {}).items() if cap > 0}
        self.cache_hits = 0
        self.cache_misses = 0

    # -- the loop's transaction ---------------------------------------------------------------
    def base(self):
        """The read transaction on the last commit that landed (renewed at each landing)."""
        t = self._rtxn
        if t is None:
            t = self._rtxn = self.env.begin()
        return t

    def get(self, key: bytes, default=None, db=None):
        v = self._view.get(db)
        if v:
            e = v.get(key)
            if e is not None:
                return default if e[0] is None else e[0]
        if db in self._cleared:
            return default             # emptied by a layer not landed yet: the last commit does not count
        c = self._caches.get(db) if self._caches else None
        if c is None:
            return self.base().get(key, default, db=db)
        r = c.get(key, _MISS)
        if r is _MISS:
            self.cache_misses += 1
            r = self.base().get(key, None, db=db)
            c.put(key, r, _cost(key, r))
        else:
            self.cache_hits += 1
        return default if r is None else r

    def put(self, key: bytes, value: bytes | None, db=None) -> bool:
        """Write ``key`` (None: delete it) into the open layer and the view."""
        lay = self._layer.get(db)
        if lay is None:
            lay = self._layer[db] = {}
        old = lay.get(key, _MISS)
        lay[key] = value
        if old is _MISS:
            self.added_writes += 1
        d = (_BYTES_BASE + len(key) if old is _MISS else -_held(old)) + _held(value)
        v = self._view.get(db)
        if v is None:
            v = self._view[db] = {}
        if key not in v:
            d += _VIEW_SLOT_BYTES
            self._view_new[db] = self._view_new.get(db, 0) + 1
            fresh = self._fresh.get(db)
            if fresh is not None:
                fresh.append(key)
        if d < 0:
            self._note_peak()           # a shrinking rewrite: the most held so far is held now
        self._open_bytes += d
        if d > 0:
            self.added_bytes += d
        v[key] = (value, self._lid)
        return True

    def put_many(self, items: Iterable[tuple[bytes, bytes | None]], db=None) -> int:
        """``put`` of each (key, value) in order (a commit's sorted puts: one call, not one per key)."""
        lay = self._layer.get(db)
        if lay is None:
            lay = self._layer[db] = {}
        v = self._view.get(db)
        if v is None:
            v = self._view[db] = {}
        fresh = self._fresh.get(db)
        lid = self._lid
        n = total = added = new = viewed = 0
        get = lay.get
        for key, value in items:
            old = get(key, _MISS)
            lay[key] = value
            if old is _MISS:
                new += 1
                d = _BYTES_BASE + len(key) + _held(value)
            else:
                d = _held(value) - _held(old)
            if key not in v:
                viewed += 1
                d += _VIEW_SLOT_BYTES
                if fresh is not None:
                    fresh.append(key)
            total += d
            added += d if d > 0 else 0
            v[key] = (value, lid)
            n += 1
        if viewed:
            self._view_new[db] = self._view_new.get(db, 0) + viewed
        self._open_bytes += total
        self.added_bytes += added
        self.added_writes += new
        return n

    def delete(self, key: bytes, value: bytes = b"", db=None) -> bool:
        """Delete ``key`` (a key not stored costs the writer a failed delete; True either way)."""
        return self.put(key, None, db=db)

    def drop(self, db, delete: bool = False) -> None:
        """Empty ``db`` (it stays open; ``delete=True`` is not supported here)."""
        if delete:
            raise ValueError("an overlay empties a table, it does not delete it")
        moot = self._layer.pop(db, None)       # writes before the drop are moot
        if moot:
            self._note_peak()                  # before the open layer shrinks
            # with the view slots of the keys they brought into the view (those of the layers
            # handed over stay counted until they land)
            self._open_bytes -= (sum(_BYTES_BASE + len(k) + _held(v) for k, v in moot.items())
                                 + self._view_new.pop(db, 0) * _VIEW_SLOT_BYTES)
        self._dropped.add(db)
        self._cleared[db] = self._lid
        self._view[db] = {}
        if db in self._sorted:
            self._sorted[db] = []
            self._fresh[db] = []
            self._stale.pop(db, None)
        c = self._caches.get(db) if self._caches else None
        if c is not None:
            c.clear()

    def cleared(self, db) -> bool:
        """True while a layer that emptied ``db`` has not landed (the table's last commit is moot)."""
        return db in self._cleared

    def view(self, db) -> dict[bytes, tuple[bytes | None, int]]:
        """Key -> (value, None when deleted; layer) of ``db``'s keys written and not landed yet."""
        return self._view.get(db) or {}

    def cursor(self, db=None) -> OverlayCursor:
        return OverlayCursor(self, db)

    def stat(self, db) -> dict:
        """``entries`` as of the last commit that landed (for statistics: counting the writes not
        landed yet would read each of their keys from the table, tens of ms for a large view)."""
        return {"entries": self.base().stat(db)["entries"]}

    def sorted_keys(self, db) -> list[bytes]:
        """The view's keys of ``db`` in order (built the first time a cursor needs them).

        A landing only marks the list stale; the keys it took out of the view are dropped here,
        when a cursor next needs the list (one pass however many landings came between), and the
        keys written since (``_fresh``) are merged in."""
        keys = self._sorted.get(db)
        if keys is None:
            keys = self._sorted[db] = sorted(self._view.get(db, ()))
            self._fresh[db] = []
            self._stale.pop(db, None)
            return keys
        fresh = self._fresh[db]
        if db in self._stale:
            # a key that landed and was written again is in ``fresh`` (once or more) and may still be
            # in ``keys``: it goes back in once, from ``fresh``; a fresh key that landed since is out
            del self._stale[db]
            v = self._view.get(db) or {}
            if fresh:
                again = set(fresh)
                keys = [k for k in keys if k in v and k not in again]
                fresh = [k for k in again if k in v]
            else:
                keys = [k for k in keys if k in v]
            self._sorted[db] = keys
            self._fresh[db] = fresh
        if fresh:
            if len(fresh) <= _INSORT_MAX:
                for k in fresh:
                    insort(keys, k)
            else:
                keys.extend(fresh)
                keys.sort()
            fresh.clear()
        return keys

    # -- commits ------------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Layers handed over and not landed yet (the open one not counted)."""
        return len(self._landing)

    @property
    def layer_writes(self) -> int:
        """Puts and deletes in the open layer (a key written twice counts once)."""
        return sum(len(changes) for changes in self._layer.values())

    @property
    def unlanded_bytes(self) -> int:
        """Estimated bytes the layers not landed hold, the open one included (see "Unlanded bytes")."""
        return self._open_bytes + self._pending_bytes

    def _note_peak(self) -> None:
        """The highest ``unlanded_bytes`` of this window and the last (checked before each landing,
        each shrinking rewrite or drop of the open layer, and at each read: it only grows between)."""
        b = self._open_bytes + self._pending_bytes
        now = time.monotonic()
        if now - self._peak_t >= _PEAK_WINDOW_S:
            self._peak_prev = self._peak if now - self._peak_t < 2 * _PEAK_WINDOW_S else 0
            self._peak, self._peak_t = 0, now
        if b > self._peak:
            self._peak = b
            if b > self.high_water_bytes:
                self.high_water_bytes = b

    def memory(self) -> dict[str, int]:
        """What the layers not landed hold: bytes now, the most of the last 2-4 s and ever, keys (a
        key two layers wrote once), layers (the open one when it holds writes)."""
        self._note_peak()
        return {"bytes": self.unlanded_bytes, "peak_bytes": max(self._peak, self._peak_prev),
                "high_water_bytes": self.high_water_bytes, "entries": sum(len(v) for v in self._view.values()),
                "layers": len(self._landing) + (1 if self.dirty else 0)}

    @property
    def dirty(self) -> bool:
        """Writes since the last ``commit``."""
        return bool(self._layer) or bool(self._dropped)

    def commit(self, then: Callable[[], None] | None = None, *, sync: bool = False) -> None:
        """Hand what was written since the last commit to the writer; ``then`` runs on the loop once
        it is committed (``sync``: and fdatasync'd). Nothing written and nothing to run: no-op."""
        layer, dropped = self._layer, self._dropped
        if not layer and not dropped and then is None and not sync:
            return
        lid = self._lid
        self._layer = {}
        self._dropped = set()
        self._lid += 1
        nbytes, self._open_bytes = self._open_bytes, 0
        self._view_new = {}
        self._pending_bytes += nbytes
        self._landing.append((lid, layer, nbytes))
        self.layers += 1
        # split and sorted here, so the writer thread runs C calls only (it holds the GIL the loop
        # wants for any Python work it does)
        ops = [(db, None, ()) for db in dropped]        # emptied first: the layer's writes came after
        for db, changes in layer.items():
            dels = [k for k, v in changes.items() if v is None]
            puts = sorted((k, v) for k, v in changes.items() if v is not None)
            ops.append((db, dels, puts))
        self.writer.submit(self._write, (ops, sync), functools.partial(self._landed, lid, then))

    def land_first(self) -> None:
        """In each writer group, write this overlay's layers before other stores' (``WriteThread.first``)."""
        self.writer.first(self._write)

    def barrier(self, then: Callable[[], None]) -> None:
        """Run ``then`` on the loop once every commit made so far landed (now, if all did)."""
        if self._landing:
            self.writer.barrier(then)
        else:
            then()

    def _write(self, items: list[tuple[dict, bool]]) -> None:
        # On the writer thread: the group's layers, in order, in one write transaction, or, once
        # the next layer's writes could change more pages than the store reserved (a put or a
        # delete changes at most depth + 1 pages: WriteBudget), in a new one. Each layer is a
        # consistent state and the layers land in order, so a commit between two of them is one
        # the loop could have made; a layer is never split (a single layer past the reservation
        # is one transaction).
        me = threading.get_ident()
        if me == self.loop_thread:
            raise AssertionError("an overlay's write transaction on the loop thread")
        if me not in self.write_threads:
            self.write_threads.add(me)
            self.written_by.add(threading.current_thread().name)
        sync = False
        limit = self._limit
        txn = self._begin()
        try:
            writes: dict[Any, int] = {}         # table -> puts and deletes in this transaction so far
            for ops, want_sync in items:
                sync = sync or want_sync
                if limit:
                    more = {}
                    for db, dels, puts in ops:
                        if dels is not None:
                            more[db] = more.get(db, 0) + len(dels) + len(puts)
                    if writes and self._charge(writes, more) > limit:
                        txn.commit()
                        self.txns += 1
                        txn = None
                        txn = self._begin()
                        writes = {}
                    for db, n in more.items():
                        writes[db] = writes.get(db, 0) + n
                for db, dels, puts in ops:
                    if dels is None:
                        txn.drop(db, delete=False)
                        continue
                    delete = txn.delete
                    for k in dels:
                        delete(k, db=db)
                    if puts:
                        txn.cursor(db=db).putmulti(puts)
            txn.commit()
            self.txns += 1
        except BaseException:
            if txn is not None:
                txn.abort()
            raise
        if sync:
            self.env.sync(True)

    def _begin(self):
        """A write transaction (writer thread); with a page budget, the shape of the store's tables
        now (their depth and branch pages, for ``_charge``)."""
        txn = self.env.begin(write=True)
        if self._limit:
            try:
                shape = {}
                for db in self._dbs or (None,):
                    st = txn.stat(db) if db is not None else txn.stat()
                    shape[db] = (st["depth"], st["branch_pages"])
            except BaseException:
                txn.abort()
                raise
            self._shape = shape
            self.per_write = max(1, max(d for d, _ in shape.values())) + 1
        return txn

    def _charge(self, writes: dict[Any, int], more: dict[Any, int]) -> int:
        """Most pages the open transaction changes with ``more`` writes added to ``writes`` (per
        table): ``pages_changed`` of each table the store's budget names, depth + 1 a write in any
        other (as WriteBudget charges)."""
        shape, per_write = self._shape, self.per_write
        total = 0
        for db in writes.keys() | more.keys():
            n = writes.get(db, 0) + more.get(db, 0)
            s = shape.get(db)
            total += n * per_write if s is None else pages_changed(n, s[0], s[1])
        return total

    def _landed(self, lid: int, then: Callable[[], None] | None) -> None:
        self._note_peak()               # the most held since the last landing is held now
        first, layer, nbytes = self._landing.popleft()
        if first != lid:
            raise AssertionError(f"overlay layers landed out of order: {first} != {lid}")
        self._pending_bytes -= nbytes
        caches = self._caches
        for db in [db for db, cleared_by in self._cleared.items() if cleared_by == lid]:
            del self._cleared[db]       # the table's last commit is the emptied one from now on
        for db, ops in layer.items():
            v = self._view[db]
            c = caches.get(db) if caches else None
            if c:
                c.replace_present(ops, _cost)           # the committed values from now on
            if db not in self._layer and not any(db in later for _, later, _ in self._landing):
                # no layer after this one wrote the table: every key left in its view is this one's
                v.clear()
                if db in self._sorted:
                    self._sorted[db] = []
                    self._fresh[db] = []
                    self._stale.pop(db, None)
                continue
            # keys whose newest write is this layer's leave the view (a later layer's stay; after a
            # drop the view no longer holds this layer's keys)
            gone = [k for k in ops if (e := v.get(k)) is not None and e[1] == lid]
            if gone:
                for k in gone:
                    del v[k]
                if db in self._sorted:      # pruned when a cursor next needs the sorted keys
                    n = self._stale[db] = self._stale.get(db, 0) + len(gone)
                    if n > len(v) + _PRUNE_SLACK:
                        self.sorted_keys(db)    # or now, if none did for long (bounded memory)
        if self._rtxn is not None:
            self._rtxn.abort()          # the next read sees this commit
            self._rtxn = None
        self.landed += 1
        if then is not None:
            then()
        if self.on_landed is not None:
            self.on_landed()

    def close(self) -> None:
        """Detach: everything must have been committed and landed (else WriterError: not written)."""
        if self._layer or self._dropped or self._landing:
            raise WriterError(f"{len(self._landing)} overlay layers not written, uncommitted writes: "
                              f"{bool(self._layer)}")
        if self._rtxn is not None:
            self._rtxn.abort()
            self._rtxn = None
        if self._budget is not None and self._budget.source is self:
            self._budget.source = None          # the store reads its depth itself again

    def stats(self) -> dict:
        out = {"layers": self.layers, "landed": self.landed, "pending": self.pending,
               "view_keys": sum(len(v) for v in self._view.values()),
               "sorted_keys": sum(len(k) + len(self._fresh[db]) for db, k in self._sorted.items()),
               "unlanded_bytes": self.unlanded_bytes,
               "written_by": sorted(self.written_by),
               "txns": self.txns}
        if self._caches:
            out["read_cache"] = {**self.cache_memory(), "hits": self.cache_hits, "misses": self.cache_misses}
        return out

    def cache_memory(self) -> dict[str, int]:
        """The read caches' estimated bytes against their caps, together (`crawlerd stats` memory)."""
        out = {"bytes": 0, "cap_bytes": 0, "entries": 0, "evictions": 0}
        for c in self._caches.values():
            for k, n in c.memory().items():
                out[k] += n
        return out

