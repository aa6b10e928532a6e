"""A least-recently-used map bounded in bytes, for every cache whose size is an operator's RAM budget.

Each entry is charged an estimate of the bytes it holds, given by the caller
(``put(key, value, nbytes)``) plus ``ENTRY_OVERHEAD`` for the map itself; the
sum is kept in ``bytes`` and never exceeds ``cap_bytes`` after a ``put``: the
least recently used entries are evicted first, each in O(1) (an
``OrderedDict`` pops its oldest end in constant time, and an entry is evicted
at most once per insertion, so a ``put`` costs amortised O(1)).

The estimates are CPython 3.11 sizes on 64-bit (``sys.getsizeof`` of the
object and its parts): a str key of n ASCII characters is ``49 + n`` bytes
(``str_bytes``), an int up to 2**30 is 28 bytes, a small slotted object 16 +
8 per slot; the OrderedDict spends about 100 bytes per entry (its hash
table slot with ~1/3 free, and the doubly linked node), the side table of
costs about 56 more (``ENTRY_OVERHEAD``). They are estimates,
not a census: `crawlerd stats` reports them beside the process's RSS, and the
soak bench checks that the private memory of a long crawl stays flat.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any

ENTRY_OVERHEAD = 160      # OrderedDict slot + linked node (~104) and the cost dict's slot + int (~56), bytes
STR_BASE = 49             # sys.getsizeof("") for an ASCII str
INT_BYTES = 32            # a small int, rounded up to the allocator's 16-byte granule
TUPLE_BASE = 40           # sys.getsizeof(()) + the GC header
SLOT_OBJECT_BASE = 32     # a __slots__ object: header, GC header, rounded
SLOT_BYTES = 8


def str_bytes(s: str) -> int:
    """Estimated bytes of a str (``49 + len`` for ASCII; 2 or 4 bytes per code point otherwise)."""
    if s.isascii():
        return STR_BASE + len(s)
    width = 4 if any(ord(c) > 0xFFFF for c in s) else 2
    return 74 + width * len(s)


def slots_bytes(n_slots: int) -> int:
    """Estimated bytes of an object of a class with ``n_slots`` slots (the slot values not included)."""
    return SLOT_OBJECT_BASE + SLOT_BYTES * n_slots


class ByteLRU:
    """Map key -> value in LRU order, bounded by an estimate of its bytes.

    Key: any hashable. Invariant: ``bytes == sum(cost of each entry) <= cap_bytes``
    after every ``put`` (cost = ``nbytes`` given to ``put`` + ``ENTRY_OVERHEAD``);
    the first entry in iteration order is the least recently used. An entry
    whose cost alone exceeds the cap is not kept. ``on_evict(key, value)``, if
    given, is called for each entry pushed out by a ``put`` (not for ``pop``).
    """

    __slots__ = ("_map", "_cost", "bytes", "cap_bytes", "evictions", "_on_evict")

    def __init__(self, cap_bytes: int, on_evict: Callable[[Any, Any], None] | None = None) -> None:
        if cap_bytes < 0:
            raise ValueError(f"cap_bytes must be >= 0, got {cap_bytes}")
        self._map: OrderedDict[Hashable, Any] = OrderedDict()
        self._cost: dict[Hashable, int] = {}
        self.bytes = 0
        self.cap_bytes = cap_bytes
        self.evictions = 0
        self._on_evict = on_evict

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value (and mark it most recently used), or ``default``."""
        try:
            value = self._map[key]
        except KeyError:
            return default
        self._map.move_to_end(key)
        return value

    def peek(self, key: Hashable, default: Any = None) -> Any:
        """The value without touching the LRU order."""
        return self._map.get(key, default)

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        """Insert or replace ``key`` (most recently used), charged ``nbytes``; evict to fit."""
        cost = nbytes + ENTRY_OVERHEAD
        old = self._cost.pop(key, None)
        if old is not None:
            self.bytes -= old
            del self._map[key]
        if cost > self.cap_bytes:
            return
        self._map[key] = value
        self._cost[key] = cost
        self.bytes += cost
        while self.bytes > self.cap_bytes:
            k, v = self._map.popitem(last=False)
            self.bytes -= self._cost.pop(k)
            self.evictions += 1
            if self._on_evict is not None:
                self._on_evict(k, v)

    def replace_present(self, items: dict, nbytes: Callable[[Any, Any], int]) -> None:
        """``put(key, value, nbytes(key, value))`` of each item of ``items`` whose key is held, in
        ``items``' order (the others are not added): one call for a batch of updates, most of
        them to keys not held."""
        m = self._map
        for key, value in items.items():
            if key in m:
                self.put(key, value, nbytes(key, value))

    def resize(self, key: Hashable, nbytes: int) -> None:
        """Re-charge an entry whose value grew or shrank in place (evicts others to fit)."""
        if key in self._map:
            self.put(key, self._map[key], nbytes)

    def pop(self, key: Hashable, default: Any = None) -> Any:
        cost = self._cost.pop(key, None)
        if cost is None:
            return default
        self.bytes -= cost
        return self._map.pop(key)

    def clear(self) -> None:
        self._map.clear()
        self._cost.clear()
        self.bytes = 0

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def __len__(self) -> int:
        return len(self._map)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._map)

    def items(self):
        return self._map.items()

    def values(self):
        return self._map.values()

    def memory(self) -> dict[str, int]:
        """Current estimated bytes against the cap (for `crawlerd stats`)."""
        return {"bytes": self.bytes, "cap_bytes": self.cap_bytes, "entries": len(self._map),
                "evictions": self.evictions}
