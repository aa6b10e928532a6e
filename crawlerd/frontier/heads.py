"""The first entries of the back queues leased from, in RAM: a lease pops its URL from here.

With a writer attached the loop reads the ``queues`` table through an overlay cursor (the writes
not landed merged with the last commit that landed); a seek there costs a base ``set_range``, the
skipping of keys the view deleted and a bisect in the view's sorted keys, and the old
``pop_head`` made two (the head, then the key after it). A working-set host is leased from again
and again during its session (``working.py``), so :class:`QueueHeads` keeps, per (host, level)
queue, its first few entries, read in one ranged read when a pop finds none, and a pop is a list
pop plus the delete. Every write to the ``queues`` table goes through the store, which tells the
heads (``put``, ``delete``, ``forget``): a URL put back or moved in sorts into the cached entries,
a new URL (``seq`` only grows: after them) extends a queue known whole (only those are looked
up for an add's URLs), a host's queue taken is
forgotten.

Bounded in bytes: ``depth`` entries a queue, and the queues' estimated bytes (``cap_bytes``,
``frontier.queue_heads_bytes``) over which the oldest filled queue is forgotten, one dict pop each;
``memory()`` reports the bytes held against that cap (`crawlerd stats` memory.frontier_heads).
"""

from __future__ import annotations

from bisect import bisect_left

_QUEUE_BYTES = 200          # a cached queue's dict slot, its key and its [entries, whole] list
_ENTRY_BYTES = 130          # one entry's tuple and the key and value objects, beside their lengths
_LEVEL_BYTES = tuple(bytes((level,)) for level in range(256))     # the last byte of a queue prefix


class QueueHeads:
    """Key: queue prefix (host id u32 | level u8) -> [entries, whole]. Invariant: ``entries`` are
    the first ``len(entries)`` entries (key, URL record) of that queue in key order, exactly as the
    store holds them (every queued key up to the last cached one is among them); ``whole``: no
    other entry is queued under the prefix. A queue not cached is read from the store."""

    __slots__ = ("depth", "cap_bytes", "_q", "_whole", "_bytes", "_entries", "fills", "hits")

    def __init__(self, depth: int = 4, cap_bytes: int = 8 << 20) -> None:
        if depth < 1 or cap_bytes < 1:
            raise ValueError(f"queue heads: depth {depth}, cap_bytes {cap_bytes} (both >= 1)")
        self.depth = depth
        self.cap_bytes = cap_bytes
        self._q: dict[bytes, list] = {}
        self._whole: dict[bytes, list] = {}     # the cached queues known whole (what a new URL extends)
        self._bytes = 0
        self._entries = 0           # entries cached, kept as they change (memory() is asked every second)
        self.fills = 0              # ranged reads (a pop found nothing cached)
        self.hits = 0               # pops answered from here

    def pop(self, prefix: bytes) -> tuple[bytes, bytes, bool] | None | bool:
        """The head of a cached queue taken out of the cache: (key, record, more queued after it);
        None when the queue is known empty; False when it is not cached (or its cached entries ran
        out): ``fill`` it first."""
        e = self._q.get(prefix)
        if e is None:
            return False
        entries = e[0]
        if not entries:
            return None if e[1] else False
        key, value = entries.pop(0)
        self._bytes -= _ENTRY_BYTES + len(key) + len(value)
        self._entries -= 1
        self.hits += 1
        return key, value, bool(entries) or not e[1]

    def fill(self, prefix: bytes, entries: list[tuple[bytes, bytes]], whole: bool) -> None:
        """Cache a queue's first entries as just read (``whole``: they are all of it)."""
        q = self._q
        old = q.pop(prefix, None)       # re-inserted: the newest fill is forgotten last
        if old is not None:
            self._bytes -= self._cost(old[0])
            self._entries -= len(old[0])
        e = q[prefix] = [entries, whole]
        if whole:
            self._whole[prefix] = e
        else:
            self._whole.pop(prefix, None)
        self._bytes += self._cost(entries)
        self._entries += len(entries)
        self.fills += 1
        self._evict()

    def put(self, key: bytes, value: bytes) -> None:
        """``key`` was written into the queues table with ``value``."""
        e = self._q.get(key[:5])
        if e is None:
            return
        entries = e[0]
        if entries and key <= entries[-1][0]:
            i = bisect_left(entries, (key,))
            if entries[i][0] == key:
                old = entries[i][1]
                entries[i] = (key, value)
                self._bytes += len(value) - len(old)
            else:
                entries.insert(i, (key, value))
                self._bytes += _ENTRY_BYTES + len(key) + len(value)
                if len(entries) > self.depth:
                    k, v = entries.pop()
                    self._bytes -= _ENTRY_BYTES + len(k) + len(v)
                    self._not_whole(e, key[:5])
                else:
                    self._entries += 1
        elif e[1]:
            if len(entries) < self.depth:
                entries.append((key, value))
                self._bytes += _ENTRY_BYTES + len(key) + len(value)
                self._entries += 1
            else:
                self._not_whole(e, key[:5])     # more after the cached entries now
        # else: after the cached entries of a queue not known whole: nothing cached changes
        if self._bytes > self.cap_bytes:
            self._evict()

    def _not_whole(self, e: list, prefix: bytes) -> None:
        e[1] = False
        self._whole.pop(prefix, None)

    def put_new(self, items: list[tuple[bytes, bytes]]) -> None:
        """``put`` of each (key, value) of a batch of new entries: each key after every key queued
        under its prefix (a new ``seq``, which only grows), so only a queue known whole changes."""
        whole = self._whole
        if not whole:
            return
        get, depth = whole.get, self.depth
        for key, value in items:
            e = get(key[:5])
            if e is not None:
                entries = e[0]
                if len(entries) < depth:
                    entries.append((key, value))
                    self._bytes += _ENTRY_BYTES + len(key) + len(value)
                    self._entries += 1
                else:
                    self._not_whole(e, key[:5])
        if self._bytes > self.cap_bytes:
            self._evict()

    def delete(self, key: bytes) -> None:
        """``key`` was deleted from the queues table (whether or not it was there)."""
        e = self._q.get(key[:5])
        if e is None or not e[0]:
            return
        entries = e[0]
        i = bisect_left(entries, (key,))
        if i < len(entries) and entries[i][0] == key:
            k, v = entries.pop(i)
            self._bytes -= _ENTRY_BYTES + len(k) + len(v)
            self._entries -= 1

    def forget(self, hprefix: bytes) -> None:
        """Forget every cached queue of one host (its queue was taken or rewritten elsewhere).
        A queue's prefix is the host's and one level byte: each level is looked up, not every
        cached queue scanned (a host dropped while thousands of queues are cached)."""
        q = self._q
        for p in [p for p in (hprefix + b for b in _LEVEL_BYTES) if p in q]:
            self._drop(p)

    def _evict(self) -> None:
        """Forget the oldest filled queues while the bytes are over the cap (a dict keeps its
        insertion order and a refill re-inserts: the first key is the oldest fill)."""
        q = self._q
        while self._bytes > self.cap_bytes and q:
            self._drop(next(iter(q)))

    def _drop(self, prefix: bytes) -> None:
        entries = self._q.pop(prefix)[0]
        self._bytes -= self._cost(entries)
        self._entries -= len(entries)
        self._whole.pop(prefix, None)

    def clear(self) -> None:
        self._q.clear()
        self._whole.clear()
        self._bytes = self._entries = 0

    @staticmethod
    def _cost(entries: list[tuple[bytes, bytes]]) -> int:
        return _QUEUE_BYTES + sum(_ENTRY_BYTES + len(k) + len(v) for k, v in entries)

    def check_invariants(self) -> None:
        """The running byte and entry counts equal a recount of what is cached (tests)."""
        entries = [e[0] for e in self._q.values()]
        counted = (sum(self._cost(e) for e in entries), sum(len(e) for e in entries))
        if counted != (self._bytes, self._entries):
            raise AssertionError(f"queue heads count (bytes, entries) {(self._bytes, self._entries)}, hold {counted}")
        if any(len(e) > self.depth for e in entries) or any(self._q.get(p) is not e for p, e in self._whole.items()):
            raise AssertionError("queue heads: a queue over its depth, or a whole queue not cached")

    def memory(self) -> dict[str, int]:
        """Estimated bytes held against the cap, entries, queues; pops answered here and ranged
        reads made."""
        return {"bytes": self._bytes, "cap_bytes": self.cap_bytes, "entries": self._entries,
                "queues": len(self._q), "hits": self.hits, "fills": self.fills}
