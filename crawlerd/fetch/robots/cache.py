"""The robots.txt entries of the hosts being crawled, bounded, least recently used out first."""

from __future__ import annotations

from collections import OrderedDict

from crawlerd.fetch.robots.policy import RobotsEntry

__all__ = ["RobotsCache"]


class RobotsCache:
    """Robots entries by host key, bounded, least recently used evicted first.

    Key: host key ``"scheme://host[:port]"`` (the politeness key; robots.txt applies per
    scheme and authority, RFC 9309 §2.3). Invariant: at most ``max_entries`` entries; the
    iteration order of ``_entries`` is least to most recently used (``get``/``put`` move an entry
    to the end). Expired entries stay until evicted, so ``stale`` can still hand them out.
    """

    __slots__ = ("_entries", "_max_entries")

    def __init__(self, max_entries: int = 100_000) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self._entries: OrderedDict[str, RobotsEntry] = OrderedDict()
        self._max_entries = max_entries

    def get(self, host_key: str, now: float) -> RobotsEntry | None:
        """The entry for ``host_key`` if known and not expired at ``now``, else None."""
        entry = self._entries.get(host_key)
        if entry is None:
            return None
        self._entries.move_to_end(host_key)
        return entry if now < entry.expires_at else None

    def stale(self, host_key: str) -> RobotsEntry | None:
        """The last entry for ``host_key``, expired or not (None if never stored or evicted)."""
        return self._entries.get(host_key)

    def put(self, host_key: str, entry: RobotsEntry) -> None:
        self._entries[host_key] = entry
        self._entries.move_to_end(host_key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def discard(self, host_key: str) -> None:
        self._entries.pop(host_key, None)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, host_key: object) -> bool:
        return host_key in self._entries
