"""The robots.txt entries of the hosts being crawled, bounded, least recently used out first,
and kept on disk (``store``) so that a restart reuses every copy still fresh."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from crawlerd.bytecache import INT_BYTES, ByteLRU, slots_bytes, str_bytes
from crawlerd.fetch.robots.policy import RobotsEntry, RobotsState
from crawlerd.fetch.robots.rules import RobotsRules
from crawlerd.fetch.robots.store import RobotsStore, StoredEntry
from crawlerd.store.writer import WriteThread

__all__ = ["RobotsCache", "entry_bytes"]

_STATES = tuple(RobotsState)
_STATE_INDEX = {s.value: i for i, s in enumerate(_STATES)}
_KEEP_S = 30 * 86400.0          # no stale copy is used after this (robots_decision's stale_max_s)
_ENTRY_BYTES = slots_bytes(7) + 3 * INT_BYTES     # RobotsEntry and its numbers, rules and strs apart


def entry_bytes(host_key: str, entry: RobotsEntry) -> int:
    """Estimated bytes of one cache entry in RAM: key, entry, rules, note."""
    return (str_bytes(host_key) + _ENTRY_BYTES + entry.rules.nbytes() + str_bytes(entry.note)
            + str_bytes(entry.outcome_name))


class RobotsCache:
    """Robots entries by host key, bounded in bytes, least recently used evicted first.

    Key: host key ``"scheme://host[:port]"`` (the politeness key; robots.txt applies per
    scheme and authority, RFC 9309 §2.3). Invariant: the entries in RAM are charged their
    estimated bytes (``entry_bytes``), at most ``cap_bytes`` in all; the least recently used go
    first (``get``/``put`` refresh an entry), each in O(1). Expired entries stay until evicted,
    so ``stale`` can still hand them out. ``max_entries`` bounds the on-disk store's index.

    With ``directory`` every ``put`` is also logged on disk (:class:`RobotsStore`), and an entry
    not in RAM is read back from there (its rules parsed again for ``agent_token``). Times are
    readings of ``clock``; on disk they are wall-clock (``wall``), so they keep their meaning
    across restarts.

    With a writer thread (``attach_writer``) a ``put`` hands its record over and returns; the
    store is then written only on that thread. Invariant: ``_unwritten`` holds, per host, the
    last entry put and not yet written, and a read back (an entry evicted from RAM) answers from
    it first, so the loop never sees an older copy than it put. A ``kill -9`` loses at most the
    copies not yet written: their hosts fetch robots.txt again (robots first holds: a lease of
    a host without a copy refetches it). A failed write is raised by the next ``put``.
    """

    __slots__ = ("_entries", "_max_entries", "_store", "_off", "_agent", "_max_bytes", "_writer", "_unwritten",
                 "_write_failed")

    def __init__(self, max_entries: int = 100_000, *, cap_bytes: int = 64 << 20, directory: str | None = None,
                 agent_token: str = "",
                 max_bytes: int = 512 * 1024, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        if max_entries < 1 or cap_bytes < 1:
            raise ValueError("max_entries and cap_bytes must be >= 1")
        self._entries = ByteLRU(cap_bytes)
        self._max_entries = max_entries
        self._off = wall() - clock()
        self._agent = agent_token
        self._max_bytes = max_bytes
        self._store = None
        self._writer: WriteThread | None = None
        self._unwritten: dict[str, RobotsEntry] = {}
        self._write_failed: OSError | None = None
        if directory is not None:
            self._store = RobotsStore(directory, max_entries=max_entries, keep_s=_KEEP_S,
                                      now_wall=clock() + self._off)

    def get(self, host_key: str, now: float) -> RobotsEntry | None:
        """The entry for ``host_key`` if known and not expired at ``now``, else None."""
        entry = self._entries.get(host_key)
        if entry is None:
            entry = self._read_back(host_key)
            if entry is None:
                return None
        return entry if now < entry.expires_at else None

    def stale(self, host_key: str) -> RobotsEntry | None:
        """The last entry for ``host_key``, expired or not (None if never stored or evicted)."""
        entry = self._entries.peek(host_key)
        return entry if entry is not None else self._read_back(host_key)

    def put(self, host_key: str, entry: RobotsEntry, source: bytes | None = None) -> None:
        """Keep ``entry``. ``source``: the body its rules were parsed from (None: the same as the
        host's previous entry, as for a 304 or a kept stale copy; allow-all needs none)."""
        self._remember(host_key, entry)
        if self._store is None:
            return
        if self._writer is None:
            self._write([(host_key, entry, source)])
            return
        if self._write_failed is not None:
            err, self._write_failed = self._write_failed, None
            raise err
        self._unwritten[host_key] = entry
        self._writer.submit(self._write_later, (host_key, entry, source),
                            functools.partial(self._landed, host_key, entry))

    def attach_writer(self, writer: WriteThread | None) -> None:
        """Write the store through ``writer`` from now on (None: on the caller's thread again; the
        writer must have written everything first, i.e. be closed)."""
        self._writer = writer

    def _write(self, items: list[tuple[str, RobotsEntry, bytes | None]]) -> None:
        off, store = self._off, self._store
        for host_key, entry, source in items:
            if source is None:      # the previous copy's body (written before: items keep their order)
                before = store.get(host_key)
                source = before.source if before is not None else b""
            store.put(StoredEntry(host_key, entry.fetched_at + off, entry.expires_at + off, entry.status,
                                  entry.failures, _STATE_INDEX.get(entry.outcome_name, 0), entry.note, source))

    def _write_later(self, items: list[tuple[str, RobotsEntry, bytes | None]]) -> None:
        # on the writer thread: a failure is kept for the next put (on the loop) to raise
        try:
            self._write(items)
        except OSError as e:
            self._write_failed = e

    def _landed(self, host_key: str, entry: RobotsEntry) -> None:
        if self._unwritten.get(host_key) is entry:
            del self._unwritten[host_key]

    def _remember(self, host_key: str, entry: RobotsEntry) -> None:
        self._entries.put(host_key, entry, entry_bytes(host_key, entry))

    def memory(self) -> dict[str, int]:
        """Estimated bytes in RAM against the cap."""
        return self._entries.memory()

    def _read_back(self, host_key: str) -> RobotsEntry | None:
        if self._store is None:
            return None
        entry = self._unwritten.get(host_key)
        if entry is not None:
            self._remember(host_key, entry)
            return entry
        se = self._store.get(host_key)
        if se is None:
            return None
        state = _STATES[se.state] if se.state < len(_STATES) else RobotsState.UNREACHABLE
        if state is RobotsState.UNREACHABLE:
            rules = RobotsRules.disallow_all()
        else:
            rules = RobotsRules.parse(se.source, self._agent, self._max_bytes)
        off = self._off
        entry = RobotsEntry(rules, se.fetched_at - off, se.expires_at - off, se.status, state.value, se.note,
                            se.failures)
        self._remember(host_key, entry)
        return entry

    def discard(self, host_key: str) -> None:
        self._entries.pop(host_key, None)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    def stored(self) -> int:
        """Entries kept on disk (0 without a directory)."""
        return 0 if self._store is None else len(self._store)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, host_key: object) -> bool:
        return host_key in self._entries
