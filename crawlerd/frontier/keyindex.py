"""A string -> slot index that costs ~8-16 bytes a key instead of a dict's ~70.

A dict mapping host key to slot holds an entry (24 B), index space and a boxed
int (28 B) per host; at hundreds of thousands of active hosts that alone breaks
the RAM budget per host (ARCHITECTURE.md invariant 4). This index stores only ``slot + 1`` in
an int32 open-addressing table and compares against the caller's own list of
keys, which it already keeps for the reverse mapping.
"""

from __future__ import annotations

from array import array


class KeyIndex:
    """Key: a str in ``keys[slot]``; value: that slot.

    Invariants: linear probing over ``table`` (0 = empty, else slot + 1);
    every live key is reachable from ``hash(key) & mask`` without crossing an
    empty cell (deletion shifts entries back instead of leaving tombstones);
    load <= 1/2. ``keys[slot]`` must hold the key while it is indexed.
    """

    __slots__ = ("keys", "table", "mask", "n")

    def __init__(self, keys: list):
        self.keys = keys
        self.table = array("i", bytes(4 * 16))
        self.mask = 15
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def get(self, key: str, default=None):
        table, mask, keys = self.table, self.mask, self.keys
        i = hash(key) & mask
        while True:
            v = table[i]
            if v == 0:
                return default
            if keys[v - 1] == key:
                return v - 1
            i = (i + 1) & mask

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def put(self, key: str, slot: int) -> None:
        """Index ``keys[slot] == key``; the key must not be indexed yet."""
        if (self.n + 1) * 2 > self.mask + 1:
            self._grow()
        table, mask = self.table, self.mask
        i = hash(key) & mask
        while table[i]:
            i = (i + 1) & mask
        table[i] = slot + 1
        self.n += 1

    def delete(self, key: str) -> bool:
        table, mask, keys = self.table, self.mask, self.keys
        i = hash(key) & mask
        while True:
            v = table[i]
            if v == 0:
                return False
            if keys[v - 1] == key:
                break
            i = (i + 1) & mask
        # Backward-shift deletion (Knuth 6.4, Algorithm R): refill the hole from later in the run.
        j = i
        while True:
            j = (j + 1) & mask
            v = table[j]
            if v == 0:
                break
            home = hash(keys[v - 1]) & mask
            if (i <= j and (home <= i or home > j)) or (i > j and home <= i and home > j):
                table[i] = v
                i = j
        table[i] = 0
        self.n -= 1
        return True

    def _grow(self) -> None:
        old = self.table
        size = (self.mask + 1) * 2
        self.table = array("i", bytes(4 * size))
        self.mask = size - 1
        self.n = 0
        for v in old:
            if v:
                self.put(self.keys[v - 1], v - 1)

    def values(self):
        return [v - 1 for v in self.table if v]

    def items(self):
        keys = self.keys
        return [(keys[v - 1], v - 1) for v in self.table if v]
