"""The frontier's LMDB environment: back queues, host records, leases, and the ledgers.

Tables (all keys big-endian where they are numbers, so byte order is queue order):

``queues``   hid u32 | level u8 | seq u64 -> URL record. One FIFO per (host, level);
             ``seq`` is global and only grows, so a URL put back under its old key
             returns to the front of its queue.
``hosts``    host key -> :class:`~crawlerd.frontier.hosts.HostRecord`.
``leases``   lease id u64 -> (host key, queue key, URL record) of every URL lease
             out at the last commit; on open they all go back to their queues. Its
             changes are kept in RAM until the commit, which writes them (a lease
             that ends before it is never written).
``waiting``  level u8 | seq u64 -> host key: hosts with work but no free active
             slot (Mercator's front queues, one per priority level).
``dead``     seq u64 -> (outcome, host key, queue key, URL record): gave up.
``events``   seq u64 -> (reason, host key, queue key, URL record): dropped or dead
             URLs not yet handed to the event log (``drain_dropped``).
``meta``     counters, sequence numbers, session, wall clock of the last commit,
             blocklist entries (``block:<pattern>``).

Durability: one write transaction is open at a time. ``add()`` commits it (a URL
that passed the seen-set must not be lost); ``lease()`` and ``complete()``
group-commit it every ``group_ops`` operations or ``commit_interval_s``
(an uncommitted lease only means the URL is still queued after a crash; an
uncommitted completion means it is fetched again); ``commit()`` forces it. LMDB commits are atomic (copy-on-write B-tree, two meta pages), so
``kill -9`` loses only the open transaction. With ``sync=True`` each commit is
flushed with one fdatasync (``metasync=False``: an OS crash may undo the last
transaction but cannot corrupt the file). With ``sync=False`` a commit reaches
only the page cache: it survives ``kill -9`` but an OS crash may lose or
corrupt recent transactions; ``commit()`` then forces a flush. What the commits leave
out for politeness (requests in flight, ends since the last commit) is in ``journal.py``.

With a writer attached (``attach_writer``: the shard's ``WriteThread``, during the crawl) no
write transaction runs on the loop: ``txn()`` is an :class:`~crawlerd.store.overlay.Overlay`
(the loop reads its own writes, the queues through an overlay cursor, from RAM until they
land) and ``commit(then)`` hands the changes over; a lease pops its queue's head from the
:class:`~crawlerd.frontier.heads.QueueHeads` (the first entries of the queues leased from, kept
exact by every write to ``queues``, which goes through this class); a commit survives ``kill -9`` once its
``then`` ran on the loop (``when_written``). Without one (offline, the CLI, tests) the
transaction is LMDB's, on the caller's thread, as above.
"""

from __future__ import annotations

import json
import operator
import os
import struct

import lmdb

from crawlerd.frontier.heads import QueueHeads
from crawlerd.store.lmdb_reserve import WriteBudget
from crawlerd.store.overlay import Overlay
from crawlerd.store.writer import WriteThread

_U64 = struct.Struct(">Q")
_COUNTERS = ("seq", "lease_seq", "hid_next", "session", "wseq", "added", "queued", "completed", "dead",
             "waiting", "clean", "retried", "requeued", "expired")
_CLOCK = struct.Struct("<d")
_META_COUNTERS = struct.Struct("<" + "Q" * len(_COUNTERS))
# the counters in _COUNTERS' order, as one tuple of its exact size (a generator's tuple is built at
# 10 slots and shrunk, which leaves a 14-slot tuple on CPython's free list per call, up to 2,000)
_COUNTER_VALUES = operator.itemgetter(*_COUNTERS)


def u64(n: int) -> bytes:
    return _U64.pack(n)


def _after(prefix: bytes) -> bytes:
    """The least key above every key that starts with ``prefix`` (a queue prefix is never all 0xff)."""
    return (int.from_bytes(prefix, "big") + 1).to_bytes(len(prefix), "big")


class FrontierStore:
    """One LMDB environment. Key/invariants per table: see the module docstring."""

    def __init__(self, path: str, *, map_size_bytes: int, sync: bool, write_buffer_bytes: int = 0,
                 heads_bytes: int = 8 << 20):
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.env = lmdb.open(path, map_size=map_size_bytes, max_dbs=8, sync=sync, metasync=False,
                             readahead=False, meminit=False)
        # LMDB's page buffers: reserved here, every transaction kept within them (the scheduler
        # charges its writes and commits when it is full)
        self.budget = WriteBudget(self.env, write_buffer_bytes)
        self.sync = sync
        self.queues = self.env.open_db(b"queues")
        self.hosts = self.env.open_db(b"hosts")
        self.leases = self.env.open_db(b"leases")
        self.waiting = self.env.open_db(b"waiting")
        self.dead = self.env.open_db(b"dead")
        self.events = self.env.open_db(b"events")
        self.meta = self.env.open_db(b"meta")
        self.budget.dbs = (self.queues, self.hosts, self.leases, self.waiting)
        self._txn: lmdb.Transaction | None = None
        self._qcur = None
        # with a writer attached: the loop's transaction, whether it is open (written to, or asked
        # for by txn(), since the last commit) and the landing the cached queues cursor reads after
        self._overlay: Overlay | None = None
        self._ov_open = False
        self._qcur_at = -1
        # with a writer attached: the first entries of the queues leased from (see heads.py)
        self.heads: QueueHeads | None = None
        self._heads_bytes = heads_bytes        # their byte cap (0: none cached)
        self.lost = False           # a commit handed over was not written: what is on disk is the last that was
        # the ``leases`` table's changes since the last commit, applied at the commit (one sorted
        # putmulti; a lease that ends before the commit costs no write at all): lease id -> value
        # put, and the ids of leases of the last commit that ended (deleted)
        self._lease_puts: dict[int, bytes] = {}
        self._lease_dels: list[int] = []

    # -- transactions ------------------------------------------------------
    def txn(self) -> lmdb.Transaction | Overlay:
        ov = self._overlay
        if ov is not None:
            self._ov_open = True
            return ov
        if self._txn is None:
            self._txn = self.env.begin(write=True)
        return self._txn

    def qcursor(self):
        """The ``queues`` cursor of the open transaction (with a writer: an overlay cursor, renewed
        once a commit landed, as its read transaction is)."""
        ov = self._overlay
        if ov is not None:
            self._ov_open = True
            if self._qcur is None or self._qcur_at != ov.landed:
                self._qcur = ov.cursor(self.queues)
                self._qcur_at = ov.landed
            return self._qcur
        if self._qcur is None:
            self._qcur = self.txn().cursor(db=self.queues)
        return self._qcur

    @property
    def open(self) -> bool:
        return self._txn is not None or self._ov_open

    @property
    def overlay(self) -> Overlay | None:
        return self._overlay

    def attach_writer(self, writer: WriteThread | None) -> None:
        """Write on ``writer`` from now on (the open transaction commits here first); None: detach,
        once every commit handed over landed, back to transactions of this thread (else
        ``WriterError``, and ``lost``: nothing more is committed, the file keeps what landed)."""
        if writer is not None:
            self.commit()
            self._overlay = Overlay(self.env, writer, self.budget)
            self._overlay.land_first()      # lands no later than what a source forgets after it
            self._qcur, self._qcur_at = None, -1
            self.heads = QueueHeads(cap_bytes=self._heads_bytes) if self._heads_bytes > 0 else None
        elif self._overlay is not None:
            ov, self._overlay = self._overlay, None
            self._qcur, self._ov_open = None, False
            self.heads = None
            try:
                ov.close()
            except BaseException:
                self.lost = True
                raise

    def when_written(self, then) -> None:
        """Run ``then`` on the loop once every commit made so far is written (now, without a writer)."""
        if self._overlay is not None:
            self._overlay.barrier(then)
        else:
            then()

    def put_lease(self, lid: int, value: bytes) -> None:
        """A lease out: in the ``leases`` table from the next commit on (with it, atomically)."""
        self.txn()
        self._lease_puts[lid] = value

    def end_lease(self, lid: int) -> None:
        """A lease ended: out of the ``leases`` table from the next commit on."""
        self.txn()
        if self._lease_puts.pop(lid, None) is None:
            self._lease_dels.append(lid)

    def _write_leases(self) -> None:
        txn = self.txn()
        pack = _U64.pack
        if self._overlay is not None:
            if self._lease_dels:
                txn.put_many([(pack(lid), None) for lid in self._lease_dels], db=self.leases)
                self._lease_dels = []
            if self._lease_puts:
                puts = self._lease_puts
                txn.put_many([(pack(lid), puts[lid]) for lid in sorted(puts)], db=self.leases)
                self._lease_puts = {}
            return
        for lid in self._lease_dels:
            txn.delete(pack(lid), db=self.leases)
        self._lease_dels = []
        if self._lease_puts:
            puts = self._lease_puts
            txn.cursor(db=self.leases).putmulti([(pack(lid), puts[lid]) for lid in sorted(puts)])
            self._lease_puts = {}

    def commit(self, then=None, *, sync: bool = False) -> bool:
        """Commit the open transaction. With a writer: hand it over (``sync``: fdatasync'd there
        too) and return True; ``then`` runs on the loop once it is written. Without one: commit
        here and return False (``then`` is the caller's to run; ``sync`` likewise)."""
        ov = self._overlay
        if ov is not None:
            if self._ov_open:
                self._write_leases()
                self._ov_open = False
            ov.commit(then, sync=sync)
            self.budget.committed()
            return True
        if self._txn is not None:
            self._write_leases()
            self._qcur = None
            txn, self._txn = self._txn, None
            txn.commit()
            self.budget.committed()
        return False

    def flush(self) -> None:
        self.env.sync(True)

    def close(self) -> None:
        self._lease_puts, self._lease_dels = {}, []      # uncommitted: lost with the transaction
        if self._overlay is not None:                   # detach first to keep what it holds
            self._overlay = None
            self.lost = True
        self.heads = None
        self._qcur, self._ov_open = None, False
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
        self.env.close()

    # -- meta ----------------------------------------------------------------
    def load_meta(self) -> tuple[dict[str, int], dict[str, int], list[str]]:
        txn = self.txn()
        raw = txn.get(b"counters", db=self.meta)
        counters = dict.fromkeys(_COUNTERS, 0)
        if raw is not None:
            counters.update(zip(_COUNTERS, _META_COUNTERS.unpack(raw), strict=True))
        dropped_raw = txn.get(b"dropped", db=self.meta)
        dropped = json.loads(dropped_raw) if dropped_raw else {}
        blocked = []
        cur = txn.cursor(db=self.meta)
        if cur.set_range(b"block:"):
            for k in cur.iternext(values=False):
                if not k.startswith(b"block:"):
                    break
                blocked.append(k[6:].decode())
        return counters, dropped, blocked

    def save_meta(self, counters: dict[str, int], dropped: dict[str, int] | None) -> None:
        txn = self.txn()
        txn.put(b"counters", _META_COUNTERS.pack(*_COUNTER_VALUES(counters)), db=self.meta)
        if dropped is not None:
            txn.put(b"dropped", json.dumps(dropped, sort_keys=True).encode(), db=self.meta)

    def save_clock(self, now_wall: float) -> None:
        """The wall clock at this commit: without a journal, a restart's grace counts from it."""
        self.txn().put(b"wallclock", _CLOCK.pack(now_wall), db=self.meta)

    def load_clock(self) -> float | None:
        raw = self.txn().get(b"wallclock", db=self.meta)
        return None if raw is None else _CLOCK.unpack(raw)[0]

    def save_mark(self, name: bytes, value: int) -> None:
        """A source's position (e.g. the seen-set's first answer not yet added), committed with the adds."""
        self.txn().put(b"mark:" + name, u64(value), db=self.meta)

    def load_mark(self, name: bytes) -> int:
        raw = self.txn().get(b"mark:" + name, db=self.meta)
        return 0 if raw is None else _U64.unpack(raw)[0]

    def put_block(self, pattern: str, on: bool) -> None:
        k = b"block:" + pattern.encode()
        if on:
            self.txn().put(k, b"", db=self.meta)
        else:
            self.txn().delete(k, db=self.meta)

    # -- back queues ---------------------------------------------------------
    def pop_head(self, prefix: bytes) -> tuple[bytes, bytes, bool] | None:
        """Remove the head of one (host, level) queue: (key, record, level still non-empty)."""
        heads = self.heads
        if heads is not None:
            head = heads.pop(prefix)
            if head is False:
                entries, whole = self.qcursor().read_range(prefix, _after(prefix), heads.depth + 1)
                if not entries:
                    heads.fill(prefix, entries, True)
                    return None
                key, value = entries.pop(0)
                heads.fill(prefix, entries, whole)
                head = key, value, bool(entries) or not whole
            elif head is None:
                return None
            self._ov_open = True
            self._overlay.put(head[0], None, db=self.queues)
            return head
        cur = self.qcursor()
        if not cur.set_range(prefix):
            return None
        key = cur.key()
        if key[:5] != prefix:
            return None
        value = cur.value()
        cur.delete()                         # moves to the next entry
        nxt = cur.key()
        return key, value, bool(nxt) and nxt[:5] == prefix

    def level_mask(self, hid_prefix: bytes, levels: int) -> int:
        """Bit l set iff the host's level-l queue is non-empty (one probe if it has none)."""
        cur = self.qcursor()
        if not cur.set_range(hid_prefix) or cur.key()[:4] != hid_prefix:
            return 0
        mask = 1 << cur.key()[4]
        for level in range(cur.key()[4] + 1, levels):
            p = hid_prefix + bytes((level,))
            if cur.set_range(p) and cur.key()[:5] == p:
                mask |= 1 << level
        return mask

    def put_sorted(self, items: list[tuple[bytes, bytes]]) -> None:
        """Insert many new queue entries in key order (fewer page visits, one call into C). New:
        each key's ``seq`` drawn from the ``seq`` counter, so after every key queued before it."""
        items.sort()
        self.qcursor().putmulti(items)
        if self.heads is not None:
            self.heads.put_new(items)

    def put_queued(self, key: bytes, urec: bytes) -> None:
        """Put one queue entry (a URL back in its queue)."""
        self.txn().put(key, urec, db=self.queues)
        if self.heads is not None:
            self.heads.put(key, urec)

    def delete_queued(self, key: bytes) -> None:
        """Delete one queue entry (present or not)."""
        self.txn().delete(key, db=self.queues)
        if self.heads is not None:
            self.heads.delete(key)

    def take_host(self, hprefix: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        """Remove and return up to ``limit`` queued entries of one host, in key order."""
        cur = self.qcursor()
        out = []
        if self.heads is not None:
            self.heads.forget(hprefix)
        if not cur.set_range(hprefix):
            return out
        while len(out) < limit:
            key = cur.key()
            if not key or key[:4] != hprefix:
                break
            out.append((key, cur.value()))
            cur.delete()
        return out

    def scan(self, db, limit: int = 10000):
        """Yield every (key, value) of a table, read in chunks so the caller may write to it meanwhile."""
        after = None
        while True:
            cur = self.txn().cursor(db=db)
            if not (cur.set_range(after) if after is not None else cur.first()):
                return
            chunk = []
            for k, v in cur:
                if k == after:
                    continue
                chunk.append((k, v))
                if len(chunk) >= limit:
                    break
            if not chunk:
                return
            yield from chunk
            after = chunk[-1][0]

    def usage(self) -> dict[str, int]:
        """Bytes in use per table (pages x page size) and entries; the map file's size (with a
        writer: as of the last commit that landed)."""
        out = {"file_bytes": os.path.getsize(os.path.join(self.path, "data.mdb"))}
        ov = self._overlay
        txn = ov.base() if ov is not None else self.txn()
        for name in ("queues", "hosts", "leases", "waiting", "dead", "events", "meta"):
            st = txn.stat(getattr(self, name))
            out[f"{name}_entries"] = st["entries"]
            out[f"{name}_bytes"] = st["psize"] * (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"])
        return out

    def count(self, db, *, exact: bool = False) -> int:
        """Entries of a table. With a writer: as of the last commit that landed, unless ``exact``
        (then each key written and not landed is looked up: for checks, not for statistics)."""
        if db is self.leases:
            self._write_leases()
        ov = self._overlay
        if ov is None:
            return self.txn().stat(db)["entries"]
        if ov.cleared(db):
            return sum(1 for v, _ in ov.view(db).values() if v is not None)
        base = ov.base()
        n = base.stat(db)["entries"]
        if exact:
            for k, (v, _) in ov.view(db).items():
                n += (v is not None) - (base.get(k, db=db) is not None)
        return n
