"""Plain-Python reference for ``crawlerd._native.dustkeys.scan`` (same arguments, same outputs):
the DUST learner's per-URL admission keys as they were computed before the native pass. The
reference stops only where the host's rules must decide (it computes the keys of every shape);
the tests run the same URL streams through both and compare every key."""

from __future__ import annotations

from xxhash import xxh3_64_intdigest as _xxh

from crawlerd.frontier.dust_rules import alt_path, skeleton


def _fp(s: str) -> int:
    return _xxh(s.encode("utf-8", "surrogatepass"))     # ``crawlerd.url.canonical.fingerprint``


def keys(url: str, fp: int, relevant: frozenset[str]) -> tuple[int, int]:
    """A URL's two suspect keys: its skeleton's fingerprint (``fp`` when the skeleton is the URL
    itself) and its alternative skeleton's (0 when it has none)."""
    if "?" in url or ";" in url:
        main, _dropped, alt = skeleton(url, relevant)
        k0 = _fp(main) if main != url else fp
    else:
        k0, alt = fp, alt_path(url, relevant)
    return k0, (_fp(alt) if alt else 0)


def scan(urls, fps, depths, hops, hosts, start: int, info: dict, lookup: bool, marks: tuple, defer: bool,
         keys0, keys1, forced, idx, m: int) -> tuple[int, int]:
    n = len(urls)
    for i in range(start, n):
        url = urls[i]
        relevant: frozenset[str] = frozenset()
        if lookup:
            hi = info.get(hosts[i])
            if hi is not None:
                if hi.trusted:
                    return i, m
                relevant = hi.relevant
            if any(mark in url for mark in marks):
                return i, m
        if not defer:
            continue
        keys0[m], keys1[m] = keys(url, fps[i], relevant)
        forced[m] = depths[i] == 0 or hops[i] > 0
        idx[m] = i
        m += 1
    return n, m
