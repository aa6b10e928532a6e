"""The LMDB environment of the budget stage: its tables, one write transaction, commit hooks.

Both halves of the stage (the STAR graph and the BEAST queues) keep their state here, so one
commit makes a consistent state of both: a deferral and the in-degree it was judged by, a
readmission and the queue position it came from.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from functools import lru_cache

import lmdb
import xxhash

from crawlerd.store.lmdb_reserve import WriteBudget
from crawlerd.store.overlay import Overlay
from crawlerd.store.unlanded import UnlandedGate
from crawlerd.store.writer import WriteThread

_MAX_KEY = 200          # LMDB keys are at most 511 bytes; a domain key is at most this long


@lru_cache(maxsize=1 << 16)
def domain_key(pld: str) -> bytes:
    """LMDB key of a registered domain: its UTF-8 name, or ``#`` + a hash when the name is unusable.

    Never contains NUL (keys of the per-domain tables put a NUL after it) and never exceeds
    ``_MAX_KEY`` bytes.
    """
    b = pld.encode("utf-8", "surrogateescape")
    if len(b) > _MAX_KEY or b"\0" in b or not b or b[:1] == b"#":
        return b"#" + xxhash.xxh3_64_hexdigest(b).encode()
    return b


class KeyMemo(dict):
    """``fn(key)`` by key, at most ``entries`` of them (emptied when full; the misses refill it).

    For the keys intake derives once per run of a host's URLs (``stage``, ``beast``): a hit is a
    plain dict subscript, which touches less memory than an ``lru_cache`` hit (whose move to the
    front rewrites three list nodes); in the crawl process, whose heap is far larger than the CPU
    caches, that is ~2.5x the time (bench/RESULTS.md, fifteenth pass, branch adm15)."""

    __slots__ = ("fn", "entries")

    def __init__(self, fn: Callable[[str], bytes], entries: int):
        super().__init__()
        self.fn = fn
        self.entries = entries

    def __missing__(self, key: str) -> bytes:
        if len(self) >= self.entries:
            self.clear()
        v = self[key] = self.fn(key)
        return v


RECORD = b"\x01"        # a BEAST domain record's key in ``deferred``: domain key | RECORD (see BudgetStore)


def domain_name(dk: bytes) -> str:
    """The name behind a domain key (a hashed key reads as ``#<hash>``)."""
    return dk.decode("utf-8", "surrogateescape")


_REC = struct.Struct("<QQQQIIQQQQQ")   # spent, at, deferred, queue+1, level, wrap, admitted, deferred in all, turn,
#                                        the first host's hash and next turn (FIFO format 4)
_REC_V3 = struct.Struct("<QQQQIIQQQ")   # the same without the first host (FIFO format 3: every host in ``turns``)
_REC_V1 = struct.Struct("<QQQQIIQQ")    # the same without turn (state written before hosts took turns)


class DomainRecord:
    """A BEAST domain record, in the ``deferred`` table. Key: domain key | ``RECORD``.

    ``spent`` URLs passed while the reader stood on queue ``at``; ``deferred`` URLs waiting in its
    FIFO; ``queue`` the BEAST queue it passes next in, +1 (0: none; invariant: non-zero iff
    ``deferred`` > 0, and then the ``queues`` table lists it there and nowhere else); ``level``:
    its passes are ``2**level`` queues apart, raised at each wrap-around it spent over budget
    (``wrap``: the wrap count it was last raised at); ``admitted``/``deferred_all``: lifetime counts;
    ``turn``: the host turn of the last URL passed (0 when nothing waits). ``host``/``host_next``:
    the host hash and next turn of the host that started the backlog (``host_next`` 0: none), kept
    here instead of in ``turns`` (the record is written whenever that host defers anyway; most
    domains' backlogs are one host's); invariant: ``host_next`` is 0 when nothing waits.
    """

    __slots__ = ("spent", "at", "deferred", "queue", "level", "wrap", "admitted", "deferred_all", "turn", "host",
                 "host_next")

    def __init__(self, spent=0, at=0, deferred=0, queue=0, level=0, wrap=0, admitted=0, deferred_all=0, turn=0,
                 host=0, host_next=0):
        self.spent, self.at, self.deferred, self.queue = spent, at, deferred, queue
        self.level, self.wrap, self.admitted, self.deferred_all = level, wrap, admitted, deferred_all
        self.turn, self.host, self.host_next = turn, host, host_next

    def encode(self) -> bytes:
        return _REC.pack(self.spent, self.at, self.deferred, self.queue, self.level, self.wrap,
                         self.admitted, self.deferred_all, self.turn, self.host, self.host_next)

    @classmethod
    def decode(cls, raw: bytes) -> DomainRecord:
        n = len(raw)
        return cls(*(_REC.unpack(raw) if n == _REC.size else _REC_V3.unpack(raw) if n == _REC_V3.size
                     else _REC_V1.unpack(raw)))


SOFT_COMMITS = 32       # a record changed only in what a crash may lose is written this many commits later
SOFT_MAX = 1 << 16      # at most this many such records wait; past it the oldest are written


class RecordCache:
    """A write-back cache of one table's records (``graph``, or BEAST's in ``deferred``), for one owner.

    Key: domain key -> record (a mutable object with ``encode()``), stored in the table under
    domain key | ``suffix`` (BEAST: ``RECORD``, after the domain's FIFO entries). The ``cap`` most recently
    used records are held in an LRU; a changed record is also in ``dirty`` until ``flush`` writes
    it. Invariant: every change since the last flush is in ``dirty`` or ``soft`` (an evicted changed
    record is read back from there, never from the table), so eviction loses nothing.

    While the LRU holds fewer than ``cap`` records, nothing is evicted and a hit does not move its
    record (a move was almost half of a hit): the records are then in order of first use, and once the
    LRU is full each hit moves its record as before (the first evictions may take a record used
    since, read back from the table when next used; what is read is the same either way).

    ``soft`` (``changed_soft``): records changed only in fields whose loss at a crash the owner
    allows (BEAST: a domain's charges in the reader's queue and its lifetime count, when it passed
    URLs and deferred none). They are written ``SOFT_COMMITS`` flushes after their first such change (or with a
    hard change, or at close), not at every commit: a domain that passes URLs at every commit is
    written once per ``SOFT_COMMITS`` commits (a few seconds of a crawl; counted in commits, so the
    writes are a function of the calls, as every other write here). ``soft_order``: (flush count at
    the first soft change, key), oldest first, from ``soft_head`` on; keys no longer in ``soft``
    (written since) are skipped.
    """

    def __init__(self, store: BudgetStore, db, decode: Callable[[bytes], object], new: Callable[[], object],
                 cap: int, suffix: bytes = b""):
        self.store, self.db, self.decode, self.new, self.cap = store, db, decode, new, cap
        self.suffix = suffix
        self.lru: OrderedDict[bytes, object] = OrderedDict()
        self.dirty: dict[bytes, object] = {}
        self.soft: dict[bytes, object] = {}
        self.soft_order: list[tuple[int, bytes]] = []
        self.soft_head = 0
        self.soft_due = 0           # soft_order[soft_head:soft_due] are due (an estimate: written ones count)
        self.flushes = 0

    def get(self, dk: bytes):
        """The record of ``dk`` (a new one when the table has none); a hit moves once the LRU is full."""
        c = self.lru
        r = c.get(dk)
        if r is not None:
            if len(c) >= self.cap:
                c.move_to_end(dk)       # below its cap nothing is evicted, so the order does not matter yet
            return r
        r = self.dirty.get(dk)
        if r is None:
            r = self.soft.get(dk)
            if r is None:
                raw = self.store.txn().get(dk + self.suffix, db=self.db)
                r = self.decode(raw) if raw else self.new()
        c[dk] = r
        if len(c) > self.cap:
            c.popitem(last=False)        # a changed record stays in dirty until the flush
        return r

    def peek(self, dk: bytes):
        """The record of ``dk`` if it is held here (cached or changed), else None; reads no table."""
        return self.lru.get(dk) or self.dirty.get(dk) or self.soft.get(dk)

    def changed(self, dk: bytes, r) -> None:
        self.dirty[dk] = r
        if self.soft:
            self.soft.pop(dk, None)

    def changed_soft(self, dk: bytes, r) -> None:
        """``r`` changed only in fields a crash may lose: written within ``SOFT_COMMITS`` (see the class)."""
        if dk not in self.dirty and dk not in self.soft:
            self.soft[dk] = r
            self.soft_order.append((self.flushes, dk))

    def _due(self) -> int:
        """Soft records the next flush writes (at most; advances ``soft_due``)."""
        order, i = self.soft_order, self.soft_due
        if i < len(order):
            old = self.flushes - SOFT_COMMITS + 1     # the SOFT_COMMITS-th flush after its first change
            n = len(order) - SOFT_MAX
            while i < len(order) and (order[i][0] <= old or i - self.soft_head < n):
                i += 1
            self.soft_due = i
        return i - self.soft_head

    def flush(self, everything: bool = False) -> None:
        """Write the changed records into the store's transaction, in key order: the hard ones, and
        the soft ones that are due (``everything``: all of them)."""
        soft = self.soft
        if not soft:
            if self.soft_order:
                self.soft_order.clear()
                self.soft_head = self.soft_due = 0
        else:
            end = len(self.soft_order) if everything else self.soft_head + self._due()
            if end > self.soft_head:
                dirty = self.dirty
                for _, dk in self.soft_order[self.soft_head:end]:
                    r = soft.pop(dk, None)
                    if r is not None:
                        dirty[dk] = r
                self.soft_head = self.soft_due = end
                if end == len(self.soft_order) or end > 4096 and 2 * end > len(self.soft_order):
                    del self.soft_order[:end]
                    self.soft_head = self.soft_due = 0
        if self.dirty:
            sfx = self.suffix
            puts = [(dk + sfx, r.encode()) for dk, r in self.dirty.items()]
            puts.sort()
            self.store.txn().cursor(db=self.db).putmulti(puts)
            self.dirty.clear()
        self.flushes += 1

    def __len__(self) -> int:
        return len(self.lru)

    @property
    def changed_count(self) -> int:
        """Records the next ``flush`` writes (at most)."""
        return len(self.dirty) + (self._due() if self.soft else 0)


class BudgetStore:
    """The budget stage's LMDB environment; one write transaction open at a time.

    Tables (domain key = :func:`domain_key`; integers big-endian where they order keys):

    ``graph``     domain key -> STAR record (``graph.GraphRecord``).
    ``votes``     source domain key | NUL | seq -> target domain keys joined by NUL: cross-domain links
                  not yet counted (their source cannot vouch for more domains yet), oldest first;
                  one entry per source and edge delivery (``graph.GraphRecord``).
    ``deferred``  domain key | NUL | host turn u64 | seq u64 -> fp u64 | caller's record: a domain's
                  deferred URLs, in host turns, then arrival (``beast``: "Hosts in turn"); a host's
                  run of them is one entry (key suffix ``RUN``, ``fifo``). And domain key | ``RECORD``
                  -> BEAST record (``DomainRecord``): right after the domain's entries, where a
                  deferral appends, so that a commit's deferral and the record it changes usually
                  share a leaf page (LMDB rewrites each page a commit touched: with the records in
                  a table of their own, each deferral touched two). A key with a NUL is an entry,
                  one without is a record (a domain key never holds a NUL).
    ``domains``   empty (FIFO format 4 and before kept the BEAST records there; ``Beast`` moves them).
    ``turns``     domain key | NUL | host hash u64 -> the host's next turn u64 (only domains with a backlog;
                  not the host that started it, whose next turn is in its ``domains`` record).
    ``queues``    queue u64 | domain key -> empty: the BEAST queues, each listing the domains that
                  pass their next budget of URLs when the reader reaches it.
    ``meta``      JSON state of the graph and of BEAST.

    ``commit`` runs the registered hooks (write-back caches) first, so every commit is a consistent
    state; an uncommitted transaction dies with the process (kill -9), leaving the last commit.

    With a writer attached (``attach_writer``: the shard's ``WriteThread``, during the crawl) no
    write transaction runs on the loop: ``txn()`` is an :class:`~crawlerd.store.overlay.Overlay`
    (the loop reads its own writes from RAM until they land) and ``commit`` hands the changes
    over; a commit is on disk (survives kill -9) once its ``then`` ran on the loop. The overlay
    keeps the ``turns`` it read in a read cache of ``read_cache_bytes`` (0: off; see ``Overlay``).

    Unlanded writes: what the overlay holds for the writer (its layers not landed, the open one
    included) follows the writer's backlog; ``unlanded_bytes`` (0: no bound) bounds it. The loop's
    steps that write here (an intake slice, a readmission slice, an edge slice) each ask ``crowded()``
    first and, when it says so, wait for a landing (``when_room``): backpressure, nothing dropped.
    ``crowded`` counts the records the write-back hooks hold for the next commit with them and says
    so past half the bound: a step adds less than half (a slice of 512 answers: a few hundred KiB;
    ``largest_step`` in stats), so the bytes stay within the bound.
    """

    def __init__(self, path: str, *, map_size_bytes: int, sync: bool, write_buffer_bytes: int = 0,
                 read_cache_bytes: int = 0, unlanded_bytes: int = 0):
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.sync = sync
        self.read_cache_bytes = read_cache_bytes
        self.unlanded_bytes = unlanded_bytes
        # the bound on the overlay's unlanded writes, with the records the hooks hold for the commit
        self.gate = UnlandedGate(unlanded_bytes, self.commit, self._hooked_bytes)
        self._hook_write_bytes = 320    # a hook's write, estimated (measured at each commit's flush)
        self.env = lmdb.open(path, map_size=map_size_bytes, max_dbs=8, sync=sync, metasync=False,
                             readahead=False, meminit=False)
        # the reserved page buffers: callers commit once ``full`` (the intake after a slice, an edge
        # delivery between slices) and the writer commits a group of layers within them (Overlay)
        self.budget = WriteBudget(self.env, write_buffer_bytes)
        self.graph = self.env.open_db(b"graph")
        self.votes = self.env.open_db(b"votes")
        self.domains = self.env.open_db(b"domains")
        self.deferred = self.env.open_db(b"deferred")
        self.queues = self.env.open_db(b"queues")
        self.turns = self.env.open_db(b"turns")
        self.meta = self.env.open_db(b"meta")
        self.budget.dbs = (self.graph, self.votes, self.deferred, self.queues, self.turns, self.meta)   # not domains: empty
        self._txn: lmdb.Transaction | None = None
        self._overlay: Overlay | None = None
        self._hooks: list[Callable[[], None]] = []
        self._pending: list[Callable[[], int]] = []
        self._closing = False
        self.commits = 0
        self._slow_saved_at = -1e18
        # State kept only for statistics (top lists) is saved with a commit every 10 s at most:
        # sorting it at every commit would cost more than the commit. A crash loses at most 10 s
        # of such statistics, never budget state. Hooks read this flag.
        self.save_slow = True

    def txn(self) -> lmdb.Transaction | Overlay:
        if self._overlay is not None:
            return self._overlay
        if self._txn is None:
            self._txn = self.env.begin(write=True)
        return self._txn

    def attach_writer(self, writer: WriteThread | None) -> None:
        """Write on ``writer`` from now on (the open transaction commits here first); None: detach,
        once every commit handed over landed (``when_written``), back to transactions of this thread."""
        if writer is not None:
            self.commit()
            # the host turns are read per URL deferred (once per host and commit): cached, exact
            self._overlay = Overlay(self.env, writer, self.budget, read_cache={self.turns: self.read_cache_bytes})
            self.gate.attach(self._overlay)
        elif self._overlay is not None:
            self.gate.detach(self._overlay)
            self._overlay.close()
            self._overlay = None

    @property
    def closing(self) -> bool:
        """The commit being made is the last before close (write-back hooks write everything)."""
        return self._closing

    @property
    def overlay(self) -> Overlay | None:
        return self._overlay

    def when_written(self, then: Callable[[], None]) -> None:
        """Run ``then`` on the loop once every commit made so far is written (now, without a writer)."""
        if self._overlay is not None:
            self._overlay.barrier(then)
        else:
            then()

    # -- the bound on unlanded writes -----------------------------------------------------------
    def crowded(self) -> bool:
        """Whether a step that writes here must wait for a landing (``when_room``) before it runs:
        the unlanded bytes (with the hooks' records) pass half of ``unlanded_bytes``. Called once
        per step (``UnlandedGate.crowded``)."""
        return self.gate.crowded()

    def _hooked_bytes(self) -> int:
        """Estimated bytes the write-back hooks will write at the next commit (their records, at the
        mean bytes of a write their last flushes made)."""
        return sum(fn() for fn in self._pending) * self._hook_write_bytes

    def when_room(self, step: Callable[[], None]) -> None:
        """Run ``step`` on the loop at the first landing that leaves room (after ``crowded`` said
        True; it asks again then). The open layer is handed over now if nothing else is pending."""
        self.gate.when_room(step)

    def close_gate(self) -> None:
        """Closing: steps waiting for room are dropped (a readmission's records stay deferred; an
        intake or edge delivery not acknowledged comes again at the next start), none waits again."""
        self.gate.close()

    def unlanded_memory(self) -> dict[str, int]:
        """The unlanded writes against their bound (`crawlerd stats` memory.budget_unlanded)."""
        out = self.gate.memory()
        out["hooked_bytes"] = out.pop("extra_bytes")
        return out

    def add_hook(self, fn: Callable[[], None], pending: Callable[[], int] | None = None) -> None:
        """Run ``fn`` at each commit, before it; ``pending``: how many puts it would write now."""
        self._hooks.append(fn)
        if pending is not None:
            self._pending.append(pending)

    def pending_writes(self) -> int:
        """Puts and deletes of the open transaction: made (counted during a crawl, with a writer) and
        held by the write-back hooks for the commit."""
        n = sum(fn() for fn in self._pending)
        ov = self._overlay
        return n + ov.layer_writes if ov is not None else n

    @property
    def full(self) -> bool:
        """Whether the open transaction's writes could change as many pages as the store reserved
        (``WriteBudget``: depth + 1 each): a caller at a consistent point should commit."""
        b = self.budget
        return 0 < b.limit <= self.pending_writes() * b.per_write

    def get_meta(self, name: bytes) -> dict:
        raw = self.txn().get(name, db=self.meta)
        return json.loads(raw) if raw else {}

    def put_meta(self, name: bytes, doc: dict) -> None:
        self.txn().put(name, json.dumps(doc, sort_keys=True).encode(), db=self.meta)

    def count(self, db) -> int:
        return self.txn().stat(db)["entries"]

    def commit(self, then: Callable[[], None] | None = None) -> None:
        """Commit what the hooks and callers wrote. ``then`` runs on the loop once it is written:
        after the writer's commit, or (no writer) in the next loop iteration."""
        self.txn()
        now = time.monotonic()
        self.save_slow = self._closing or now - self._slow_saved_at >= 10.0
        if self.save_slow:
            self._slow_saved_at = now
        ov = self._overlay
        if ov is not None:
            b0, w0 = ov.added_bytes, ov.added_writes
        for fn in self._hooks:
            fn()
        self.commits += 1
        if ov is not None:
            if ov.added_writes > w0 + 100:      # the hooks' mean write, for ``crowded``
                self._hook_write_bytes = (ov.added_bytes - b0) // (ov.added_writes - w0)
            self._overlay.commit(then)
            self.budget.committed()
            return
        txn, self._txn = self._txn, None
        txn.commit()
        self.budget.committed()
        if then is not None:
            asyncio.get_running_loop().call_soon(then)

    def flush(self) -> None:
        """fdatasync what is committed (any thread; LMDB allows it beside a write transaction)."""
        env = self.env
        if env is not None:
            env.sync(True)

    def close(self) -> None:
        if self.env is None:
            return
        self._closing = True
        self.attach_writer(None)        # raises if a commit handed over was not written
        self.commit()
        self._hooks = []
        if not self.sync:
            self.env.sync(True)
        self.env.close()
        self.env = None
