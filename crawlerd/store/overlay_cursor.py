"""The cursor of :class:`~crawlerd.store.overlay.Overlay`: one table as the loop sees it, the
overlay's view (writes not landed yet) merged in key order with the last commit that landed."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crawlerd.store.overlay import Overlay


class OverlayCursor:
    """A cursor over one table as the overlay sees it (the view merged with the last commit)."""

    __slots__ = ("_o", "_db", "_bc", "_k", "_v")

    def __init__(self, overlay: Overlay, db) -> None:
        self._o, self._db = overlay, db
        self._bc = None
        self._k: bytes | None = None
        self._v: bytes | None = b""     # None: the committed value under the base cursor, not read yet

    def _seek(self, k: bytes, after: bool) -> bool:
        """Move to the first key >= ``k`` (> ``k`` with ``after``); False (unpositioned) at the end."""
        o, db = self._o, self._db
        view = o.view(db)
        bc = self._bc
        if bc is None:
            bc = self._bc = o.base().cursor(db=db)
        bkey = None
        found = not o.cleared(db) and bc.set_range(k)
        while found:
            key = bc.key()
            if key in view or (after and key == k):     # the view decides for its keys
                found = bc.next()
                continue
            bkey = key
            break
        okey = None
        if view:
            keys = o.sorted_keys(db)
            i = bisect_right(keys, k) if after else bisect_left(keys, k)
            n = len(keys)
            while i < n:
                if view[keys[i]][0] is not None:
                    okey = keys[i]
                    break
                i += 1
        if okey is not None and (bkey is None or okey < bkey):
            self._k, self._v = okey, view[okey][0]
        elif bkey is not None:
            self._k, self._v = bkey, None       # read from the base cursor if asked (each read drops the GIL)
        else:
            self._k, self._v = None, b""
            return False
        return True

    def first(self) -> bool:
        return self._seek(b"", False)

    def set_range(self, key: bytes) -> bool:
        return self._seek(key, False)

    def next(self) -> bool:
        if self._k is None:
            return self.first()
        return self._seek(self._k, True)

    def key(self) -> bytes:
        return b"" if self._k is None else self._k

    def value(self) -> bytes:
        v = self._v
        if v is None:                   # the base cursor still stands on the key (it moves only in _seek)
            v = self._v = self._bc.value()
        return v

    def delete(self) -> bool:
        """Delete the current key and move to the next (unpositioned past the end)."""
        k = self._k
        if k is None:
            return False
        self._o.delete(k, db=self._db)
        self._seek(k, True)
        return True

    def read_range(self, lo: bytes, hi: bytes, limit: int) -> tuple[list[tuple[bytes, bytes]], bool]:
        """The first ``limit`` (key, value) with ``lo <= key < hi`` in key order, and whether they
        are all of them: one base seek, not one per key. Leaves the cursor unpositioned."""
        o, db = self._o, self._db
        view = o.view(db)
        self._k, self._v = None, b""
        out: list[tuple[bytes, bytes]] = []
        stop = hi                   # the view's keys count below this (the first base key not read)
        whole = True
        if not o.cleared(db):
            bc = self._bc
            if bc is None:
                bc = self._bc = o.base().cursor(db=db)
            if bc.set_range(lo):
                for k, v in bc.iternext():
                    if k >= hi:
                        break
                    if k in view:               # the view decides for its keys
                        continue
                    if len(out) == limit:
                        stop, whole = k, False
                        break
                    out.append((k, v))
        if view:
            keys = o.sorted_keys(db)
            i, j = bisect_left(keys, lo), bisect_left(keys, stop)
            if i < j:
                mine = [(k, v) for k in keys[i:j] if (v := view[k][0]) is not None]
                if mine:
                    out = sorted(out + mine) if out else mine
                    if len(out) > limit:
                        del out[limit:]
                        whole = False
        return out, whole

    def putmulti(self, items: Iterable[tuple[bytes, bytes]]) -> tuple[int, int]:
        n = self._o.put_many(items, db=self._db)
        return n, n

    def iternext(self, keys: bool = True, values: bool = True) -> Iterator:
        """From the current key (the first when unpositioned) to the end, as py-lmdb's does."""
        if self._k is None and not self.first():
            return
        while True:
            if keys and values:
                yield self._k, self.value()
            elif keys:
                yield self._k
            else:
                yield self.value()
            if not self.next():
                return

    def __iter__(self) -> Iterator:
        return self.iternext()
