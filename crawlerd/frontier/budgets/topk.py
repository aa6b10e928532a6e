"""Exact top-k of values that only grow (per-domain in-degree, URLs admitted)."""

from __future__ import annotations

from collections.abc import Iterable

from crawlerd.frontier.budgets.store import domain_key, domain_name


class TopK:
    """The k domains with the largest value, exact.

    Key: domain key -> its value when last noted. Invariant: every domain whose value exceeds
    ``floor`` is here (values only grow, and every change is noted); at most 2k entries, trimmed
    back to the k largest, whose smallest value becomes the floor.
    """

    __slots__ = ("k", "floor", "values")

    def __init__(self, k: int, saved: Iterable | None = None):
        self.k = k
        self.floor = 0
        self.values: dict[bytes, int] = {}
        for name, v in saved or ():
            self.values[domain_key(name)] = v
        self._trim()

    def note(self, dk: bytes, value: int) -> None:
        if value > self.floor or dk in self.values:
            self.values[dk] = value
            if len(self.values) > 2 * self.k:
                self._trim()

    def _trim(self) -> None:
        kept = sorted(self.values.items(), key=lambda kv: -kv[1])[:self.k]
        self.values = dict(kept)
        self.floor = kept[-1][1] if len(kept) == self.k else 0

    def top(self, n: int) -> list[tuple[bytes, int]]:
        return sorted(self.values.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def saved(self) -> list:
        return [[domain_name(dk), v] for dk, v in self.top(self.k)]
