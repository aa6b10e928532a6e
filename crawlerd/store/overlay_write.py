"""The writer thread's side of an :class:`~crawlerd.store.overlay.Overlay`: one writer group's
layers written into as few LMDB write transactions as the store's reserved page buffers allow.

A layer is what the loop wrote between two ``Overlay.commit`` calls: per table, key -> value (None
for a delete), plus the tables it emptied. The layers of one group land in order, and each one is
a consistent state, so a commit between two of them is one the loop could have made; a layer is
never split (a single layer past the reservation is one transaction).

Within one transaction the layers are **merged per table, last write wins**: a key that several
layers of the transaction wrote (a host's or a domain's record rewritten at every offer or lease,
a lease taken in one layer and given back in the next) is written once, with its newest value or
as a delete. The table after the transaction is the same as after writing every layer in turn:
the transaction is atomic, so no state between its layers is ever seen on disk. A delete of a key
the last commit does not hold (a put then a delete of a new key) stays a delete: it finds nothing
and changes no page. The charge of a transaction (:func:`crawlerd.store.lmdb_reserve.pages_changed`
per table) counts each key once, so a group whose layers rewrite the same keys fits in fewer
transactions. A table that only one layer of the transaction wrote, or whose layers wrote no key
in common, is written from the layers' own sorted puts (split and sorted on the loop at
``commit``): the writer thread merges, splits and sorts in Python (under the GIL the loop wants)
only where keys repeat. A layer that empties a table (``drop``) writes what the transaction merged
so far first, then empties the table, then goes on merging from its own writes.

Counters (``GroupWriter``'s, read by ``Overlay.stats``): ``writes`` the puts and deletes handed to
LMDB, ``merged`` the writes a merge saved (a key written by several layers of one transaction, all
but one).
"""

from __future__ import annotations

from typing import Any

# per table in the open transaction: [merged changes (key -> value or None), whether that dict is a
# layer's own (not to be changed: the loop reads it at the landing), the layers' sorted
# (dels, puts) in order, whether two of those layers wrote a key in common]
_MERGED, _SHARED, _PARTS, _OVERLAP = range(4)


class GroupWriter:
    """Key: table -> its merged writes in the open transaction. Invariant: what ``flush`` writes
    leaves every table as writing each added layer's deletes and then its puts, in order, would."""

    def __init__(self) -> None:
        self._open: dict[Any, list] = {}
        self._flushed: dict[Any, int] = {}     # table -> writes already in the transaction
        self.writes = 0
        self.merged = 0

    def reset(self) -> None:
        """A new transaction: nothing charged."""
        self._open = {}
        self._flushed = {}

    @property
    def empty(self) -> bool:
        return not self._open and not self._flushed

    def more(self, ops: list[tuple[Any, list | None, list]], layer: dict[Any, dict[bytes, bytes | None]]) -> dict[Any, int]:
        """Per table, how many writes the layer (``ops``, ``layer``: as for :meth:`add`) adds to the
        open transaction's (a key the transaction already wrote counts once, unless the layer empties
        its table: then the earlier writes are written before the drop and its own after it)."""
        dropped = [db for db, dels, _ in ops if dels is None]
        out = {}
        for db, changes in layer.items():
            st = self._open.get(db)
            if st is None or db in dropped:
                out[db] = len(changes)
            else:
                out[db] = len(changes) - len(changes.keys() & st[_MERGED].keys())
        return out

    def charged(self, more: dict[Any, int] | None = None) -> dict[Any, int]:
        """Per table, the writes of the open transaction (with ``more`` added)."""
        out = dict(self._flushed)
        for db, st in self._open.items():
            out[db] = out.get(db, 0) + len(st[_MERGED])
        for db, n in (more or {}).items():
            out[db] = out.get(db, 0) + n
        return out

    def add(self, ops: list[tuple[Any, list | None, list]], layer: dict[Any, dict[bytes, bytes | None]], txn) -> None:
        """Merge one layer (its split ``ops`` from ``Overlay.commit`` and its ``layer`` of changes)
        into the open transaction ``txn``; a table it empties is emptied in ``txn`` now, after the
        transaction's earlier writes."""
        opens = self._open
        for db, dels, puts in ops:
            if dels is None:                    # emptied: the earlier writes first, then the drop
                self._flush_table(db, txn)
                txn.drop(db, delete=False)
                continue
            changes = layer[db]
            st = opens.get(db)
            if st is None:
                opens[db] = [changes, True, [(dels, puts)], False]
                continue
            merged = st[_MERGED]
            before = len(merged)
            if st[_SHARED]:
                merged = st[_MERGED] = dict(merged)
                st[_SHARED] = False
            merged.update(changes)
            st[_PARTS].append((dels, puts))
            if len(merged) < before + len(changes):
                st[_OVERLAP] = True

    def flush(self, txn) -> None:
        """Write every table's merged writes into ``txn`` (still open: the caller commits)."""
        for db in list(self._open):
            self._flush_table(db, txn)

    def _flush_table(self, db, txn) -> None:
        st = self._open.pop(db, None)
        if st is None:
            return
        merged, _shared, parts, overlap = st
        if overlap:
            dels = [k for k, v in merged.items() if v is None]
            puts = sorted([(k, v) for k, v in merged.items() if v is not None])
            self.merged += sum(len(d) + len(p) for d, p in parts) - len(merged)
            parts = [(dels, puts)]
        n = 0
        for dels, puts in parts:
            delete = txn.delete
            for k in dels:
                delete(k, db=db)
            if puts:
                txn.cursor(db=db).putmulti(puts)
            n += len(dels) + len(puts)
        self.writes += n
        self._flushed[db] = self._flushed.get(db, 0) + n
