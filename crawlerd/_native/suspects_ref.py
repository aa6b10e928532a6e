"""Pure-Python (numpy) reference for ``crawlerd._native.suspects.ClassTable`` (same API, same
results): the DUST learner's suspect table as it was before the native kernel. The tests run the
same key streams against both and compare every answer and the table's contents."""

from __future__ import annotations

import numpy as np


class RefClassTable:
    """Skeleton keys of recently admitted URLs: a set-associative cache of 64-bit keys (WAYS per
    bucket, round-robin replacement), RAM only. Invariant: holds at most ``capacity`` keys; a
    key lost to replacement makes a later duplicate look new (fetched), never the reverse."""

    WAYS = 4

    def __init__(self, entries: int):
        nb = 1 << max(8, (max(1, entries // self.WAYS) - 1).bit_length())
        self._t = np.zeros((nb, self.WAYS), dtype=np.uint64)
        self._next = np.zeros(nb, dtype=np.uint8)
        self._mask = np.uint64(nb - 1)
        self.capacity = nb * self.WAYS
        self.nbytes = self._t.nbytes + self._next.nbytes

    def _prep(self, keys) -> tuple[np.ndarray, np.ndarray]:
        k = np.asarray(keys, dtype=np.uint64)
        k = np.where(k == 0, np.uint64(1), k)
        return k, ((k ^ (k >> np.uint64(29))) & self._mask).astype(np.intp)

    def has_many(self, keys) -> np.ndarray:
        k, b = self._prep(keys)
        return (self._t[b] == k[:, None]).any(axis=1)

    def hits(self, keys0, keys1, tag: int) -> bytes:
        k0 = np.asarray(keys0, dtype=np.uint64)
        k1 = np.asarray(keys1, dtype=np.uint64)
        n = len(k0)
        if len(k1) != n:
            raise ValueError("keys0 and keys1 differ in length")
        h = self.has_many(np.concatenate((k0, k0 ^ np.uint64(tag), k1)))
        return (h[:n] | h[n:2 * n] | ((k1 != 0) & h[2 * n:])).tobytes()

    def add_many(self, keys) -> None:
        k, b = self._prep(keys)
        keep = ~(self._t[b] == k[:, None]).any(axis=1)
        k, b = k[keep], b[keep]
        for _ in range(self.WAYS):          # keys sharing a bucket in one batch: one per round
            if not len(k):
                break
            ub, first = np.unique(b, return_index=True)
            w = self._next[ub]
            self._t[ub, w] = k[first]
            self._next[ub] = (w + 1) % self.WAYS
            rest = np.ones(len(k), dtype=bool)
            rest[first] = False
            k, b = k[rest], b[rest]

    def admit(self, keys0, keys1, forced, n: int, tag: int) -> list[int]:
        return ref_admit(self, keys0, keys1, forced, n, tag)

    def dump(self) -> tuple[bytes, bytes]:
        """The table's slots and round-robin cursors (to compare implementations)."""
        return self._t.tobytes(), self._next.tobytes()


def ref_admit(table, keys0, keys1, forced, n: int, tag: int) -> list[int]:
    """``ClassTable.admit`` on any table with ``hits`` and ``add_many``: the learner's suspect
    pass over a batch as it was written in Python before the native one."""
    keys0, keys1 = [int(k) for k in keys0[:n]], [int(k) for k in keys1[:n]]
    hit = table.hits(keys0, keys1, tag) if n else b""
    seen: set[int] = set()
    add: list[int] = []
    out: list[int] = []
    for j, a in enumerate(keys0):
        b = keys1[j]
        if not forced[j] and (hit[j] or a in seen or (a ^ tag) in seen or (b and b in seen)):
            out.append(j)
            continue
        seen.add(a)
        add.append(a)
        if b:
            b ^= tag
            seen.add(b)
            add.append(b)
    if add:
        table.add_many(add)
    return out
