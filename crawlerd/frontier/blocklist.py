"""Operator blocklist: hosts and domains never fetched (ARCHITECTURE.md invariant 2: it wins over everything)."""

from __future__ import annotations


def hostname_of(host: str) -> str:
    """``https://www.Example.com:8443`` or ``www.example.com.`` -> ``www.example.com``."""
    h = host.partition("://")[2] if "://" in host else host
    h = h.split("/", 1)[0].rsplit("@", 1)[-1]
    if h.startswith("["):
        h = h[1:].split("]", 1)[0]          # IPv6 literal: the port follows the bracket
    elif h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.strip(".").lower()


class Blocklist:
    """Set of patterns. Key: a hostname or domain, lower case, no trailing dot.

    Invariant: a host is blocked iff its name or one of its parent domains
    (label-wise suffix: ``example.com`` covers ``a.example.com`` but not
    ``badexample.com``) is in ``patterns``.
    """

    __slots__ = ("patterns",)

    def __init__(self, patterns=()):
        self.patterns: set[str] = set()
        for p in patterns:
            self.add(p)

    @staticmethod
    def normalise(pattern: str) -> str:
        p = hostname_of(pattern.strip())
        if not p:
            raise ValueError(f"blocklist pattern {pattern!r} names no host")
        return p

    def add(self, pattern: str) -> str:
        p = self.normalise(pattern)
        self.patterns.add(p)
        return p

    def discard(self, pattern: str) -> str:
        p = self.normalise(pattern)
        self.patterns.discard(p)
        return p

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def matches(self, host: str) -> bool:
        if not self.patterns:
            return False
        name = hostname_of(host)
        pats = self.patterns
        while True:
            if name in pats:
                return True
            dot = name.find(".")
            if dot < 0:
                return False
            name = name[dot + 1:]

    @staticmethod
    def covers(pattern: str, host: str) -> bool:
        """Whether the single (normalised) ``pattern`` blocks ``host``."""
        name = hostname_of(host)
        return name == pattern or name.endswith("." + pattern)

    def __iter__(self):
        return iter(sorted(self.patterns))
