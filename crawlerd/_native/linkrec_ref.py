"""Pure-Python reference for ``crawlerd._native.linkrec.Link`` (the same fields, constructor,
equality, repr and pickling; tests/_native/test_linkrec.py runs the same cases against both)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Link:
    url: str           # normalised absolute URL
    fp: int            # 64-bit fingerprint (unsigned)
    host_key: str      # scheme://host[:port], the politeness key
    nofollow: bool = False


def followed(links: list) -> tuple[list, set[str]]:
    """The links whose ``nofollow`` is false, in order, and the set of their host keys."""
    follow = [ln for ln in links if not ln.nofollow]
    return follow, {ln.host_key for ln in follow}
