"""BEAST's reader: the queue it stands on, the ``queues`` table it walks, and the domains due now.

``Beast`` decides what a domain may pass and where it is listed next; this component keeps the
listings and walks them (``beast``'s docstring tells the queues and the spreading).

Queues. ``queues`` (queue number, u64 big-endian | domain key -> empty) lists every domain with
deferred URLs in exactly one queue, at or after the reader (``DomainRecord.queue`` is that queue
+ 1; 0: not listed). The reader moves forward only (``move_to``); each wrap-around (the reader
passing the end of the window) doubles the next window, up to ``MAX_WINDOW``.

Due now. A waiting domain listed in a later queue that gets room in the reader's queue (its
in-degree rose: the graph's listener; a refund) passes at once, in the reader's queue. It is held
in RAM (``make_due``) and keeps its place in the ``queues`` table: ``walk`` reads the reader's
queue as the table's entries and the due domains merged in domain-key order (the order one table
would give), and a pass that lists the domain again where it was listed writes no queue entry.
So a rise in in-degree costs no write (it was a delete and a put, then the pass's delete and put
back, 44 % of the queue writes of a crawl), and the walk does not go over the reader's queue's
entries deleted in RAM.

Durability. Everything is written into the budget store's transaction, which ``Beast`` commits;
the reader's place goes into BEAST's meta record at each commit (``saved``). The due set is
saved at close only: a kill -9 forgets which domains were due now, so such a domain passes in
the queue it is listed in (at most its spread later) instead of at once; no URL is lost, and the
reader still moves on as soon as the frontier runs short.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Iterable, Iterator

from crawlerd.frontier.budgets.fifo import first_entries
from crawlerd.frontier.budgets.store import BudgetStore, DomainRecord, domain_name

_U64BE = struct.Struct(">Q")
MAX_WINDOW = 1 << 40                   # window sizes stop doubling here (queue numbers are u64)
_WALK_FIRST, _WALK_MOST = 16, 1024     # entries of the reader's queue ``walk`` reads at once: first, at most


class BeastCorrupt(Exception):
    """The BEAST tables disagree with each other (a damaged LMDB file)."""


class QueueReader:
    """Where BEAST's reader stands, the domains listed per queue, and those due now (see the module
    docstring).

    Key: queue number | domain key, in ``queues``; the due set by domain key, in RAM. Invariants: a
    domain is listed in at most one queue, never behind the reader (``queue``); a domain is due
    now only while it has deferred URLs and is listed in a later queue (``waits_later``). ``queue``,
    ``window``, ``end``, ``wraps`` and ``advances`` are read by ``Beast``; only this class moves them.
    """

    def __init__(self, store: BudgetStore, meta: dict, queues: int, advances: int = 0):
        self._store = store
        self.queue: int = meta.get("reader", 0)     # the queue the reader stands on
        self.window: int = meta.get("window", queues)
        self.end: int = meta.get("end", queues)     # the first queue of the next window
        self.wraps: int = meta.get("wraps", 0)
        self.advances = advances                    # moves of the reader, counted for stats
        self._due: set[bytes] = set()               # waiting domains that pass in the reader's queue
        self._due_heap: list[bytes] = []            # them in key order (and some no longer due: skipped)

    @staticmethod
    def saved_due(meta: dict) -> list[bytes]:
        """The domain keys due now at the last close (their records say whether they still are)."""
        return [name.encode("utf-8", "surrogateescape") for name in meta.get("due", ())]

    # -- listings -----------------------------------------------------------------------------
    def list_in(self, dk: bytes, d: DomainRecord, q: int) -> None:
        """List domain ``dk`` (record ``d``) in queue ``q`` only; it is no longer due now."""
        if self._due:
            self._due.discard(dk)
        if d.queue == q + 1:            # listed there already (a domain due now, back in its queue)
            return
        txn, db = self._store.txn(), self._store.queues
        if d.queue:
            txn.delete(_U64BE.pack(d.queue - 1) + dk, db=db)
        txn.put(_U64BE.pack(q) + dk, b"", db=db)
        d.queue = q + 1

    def unlist(self, dk: bytes, d: DomainRecord) -> None:
        """Nothing of ``dk`` waits any more: listed nowhere, not due."""
        if self._due:
            self._due.discard(dk)
        if d.queue:
            self._store.txn().delete(_U64BE.pack(d.queue - 1) + dk, db=self._store.queues)
            d.queue = 0

    def waits_later(self, d: DomainRecord) -> bool:
        """The domain has deferred URLs listed in a queue after the reader's (it may be made due)."""
        return bool(d.deferred) and d.queue - 1 > self.queue

    def make_due(self, dk: bytes) -> None:
        """``dk`` (``waits_later``) passes in the reader's queue, its listing kept ("Due now")."""
        if dk not in self._due:
            self._due.add(dk)
            heap = self._due_heap
            if len(heap) > 2 * len(self._due) + 1024:      # mostly domains no longer due: rebuilt
                heap[:] = self._due
                heapq.heapify(heap)
            else:
                heapq.heappush(heap, dk)

    def queue_of(self, dk: bytes, d: DomainRecord) -> int | None:
        """The queue ``dk`` passes in next (the reader's if due now), None if nothing waits."""
        return self.queue if dk in self._due else d.queue - 1 if d.queue else None

    def due(self) -> Iterable[bytes]:
        """The domains due now (for checks: a view, not to change while iterated)."""
        return self._due

    def has_listed(self) -> bool:
        """Some domain is listed in a queue (some URL waits)."""
        st = self._store
        return st.txn().cursor(db=st.queues).first()

    def listed(self) -> int:
        """Domains listed in a queue (domains with URLs waiting)."""
        return self._store.count(self._store.queues)

    # -- the walk -----------------------------------------------------------------------------
    def walk(self, advance: bool) -> Iterator[bytes]:
        """The domains to pass, in order: those listed in the reader's queue and those due now,
        merged in domain-key order; with ``advance``, the reader then moves on through the next
        non-empty queues (each listing read in order).

        The caller passes each domain yielded before it asks for the next: it lists the domain in
        a later queue or unlists it, or, its limit reached, stops the walk (the domain stays where
        it was). Raises BeastCorrupt if a domain is listed behind the reader.
        """
        st = self._store
        txn = st.txn()
        after = b""
        due, heap = self._due, self._due_heap
        # The reader's queue's next entries, read together (reversed: the next one last). While the
        # reader stands on a queue no pass lists a domain in it (a pass lists in a later queue or
        # unlists), so its entries ahead of the last key passed are these, as one seek per entry
        # would find them (one seek per domain passed was a third of a readmission's CPU).
        ahead: list[bytes] = []
        size = _WALK_FIRST
        # A due domain's pass lists it in a later queue, never the reader's: while the table has no
        # entry in the reader's queue ahead (``later``), the due domains pass without reading it again.
        later = False
        while True:
            while heap and heap[0] not in due:
                heapq.heappop(heap)             # passed, or moved since
            if ahead:
                key = ahead[-1]
                q = self.queue
            elif not (later and heap):
                # the queues table ahead of the last key passed: a pass moves its domain to a later
                # queue or out, never behind the reader, so this is its first entry (and a cursor over
                # the writer's overlay does not walk the entries passed, deleted in RAM, again)
                cur = txn.cursor(db=st.queues)
                if cur.set_range(after):
                    key = bytes(cur.key())
                    q = _U64BE.unpack_from(key)[0]
                else:
                    key, q = None, -1
            later = q != self.queue
            if heap and (later or heap[0] < key[8:]):
                yield heap[0]                   # due now: in the reader's queue, in key order
                continue                        # still due only if the caller stopped
            if key is None:
                return
            after = key + b"\0"
            if ahead:
                ahead.pop()
            elif q > self.queue:
                if not advance:
                    return
                self.move_to(q)
            elif q < self.queue:
                raise BeastCorrupt(f"queue {q} lists {domain_name(key[8:])!r} behind the reader at {self.queue}")
            if not ahead:
                ahead = [k for k, _ in first_entries(txn, st.queues, after, _U64BE.pack(q + 1), size)]
                ahead.reverse()
                size = min(2 * size, _WALK_MOST)
            yield key[8:]

    def move_to(self, q: int) -> None:
        """The reader stands on queue ``q`` (ahead of it) now."""
        self.queue = q
        self.advances += 1
        while q >= self.end:                # wrap-around: the next window is twice as long
            self.wraps += 1
            self.window = min(self.window * 2, MAX_WINDOW)
            self.end += self.window

    # -- reading ------------------------------------------------------------------------------
    def stats(self) -> dict:
        return {"reader_queue": self.queue, "window_end": self.end, "window": self.window, "wraps": self.wraps}

    def saved(self, closing: bool) -> dict:
        """The reader's part of BEAST's meta record; the due set only at close (a kill -9 forgets it)."""
        meta = {"reader": self.queue, "window": self.window, "end": self.end, "wraps": self.wraps}
        if closing and self._due:
            meta["due"] = sorted(domain_name(dk) for dk in self._due)
        return meta
