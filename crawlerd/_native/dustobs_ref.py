"""Plain-Python reference for ``crawlerd._native.dustobs`` (same API, same answers): the DUST
learner's per-page observation as it was written before the native pass. A learner built with
``native=False`` (``DustLearner``) runs on these; the tests compare the two on long streams."""

from __future__ import annotations

from crawlerd.frontier.dust_rules import Parts, parse

COMPARE = 1
BY_ONE = 2


class Evidence:
    """One archived page. ``digest``: first 8 bytes of the payload SHA-1 as an int; ``simhash``
    0 when the page had no text; ``canonical`` its declared same-host canonical URL or ""."""

    __slots__ = ("url", "digest", "simhash", "canonical", "_parts")

    def __init__(self, url: str, digest: int, simhash: int, canonical: str = ""):
        self.url, self.digest, self.simhash, self.canonical = url, digest, simhash, canonical
        self._parts: Parts | None = None

    @property
    def parts(self) -> Parts:
        if self._parts is None:
            self._parts = parse(self.url)
        return self._parts

    @property
    def parsed(self) -> bool:
        """``parts`` was asked for (it is kept from then on)."""
        return self._parts is not None

    def to_list(self) -> list:
        return [self.url, self.digest, self.simhash, self.canonical]


def from_lists(records) -> list[Evidence]:
    return [Evidence(*x) for x in records]


def to_lists(evidence: list) -> list[list]:
    return [[e.url, e.digest, e.simhash, e.canonical] for e in evidence]


def window_counts(window: list) -> tuple[int, int, int, int]:
    """(URL and canonical characters, canonicals, parsed entries, their URLs' characters)."""
    chars = canonicals = parsed = parsed_chars = 0
    for e in window:
        chars += len(e.url) + len(e.canonical)
        canonicals += bool(e.canonical)
        if e.parsed:
            parsed += 1
            parsed_chars += len(e.url)
    return chars, canonicals, parsed, parsed_chars


def _shape(a: str) -> tuple[str, str, str, bool]:
    """What ``_may_differ_by_one`` needs of a URL: its path, query, last segment, and whether it has
    path parameters (made once for the page observed, not once per pair)."""
    pa, _, qa = a.partition("?")
    return pa, qa, pa.rpartition("/")[2], ";" in a


def _may_differ_by_one(a: tuple[str, str, str, bool], b: str) -> bool:
    """Cheap pre-test for differing_name (``a``: ``_shape`` of the other URL): the same path, or
    the same last segment and query."""
    pa, qa, last, semi = a
    pb, _, qb = b.partition("?")
    if pa == pb:
        return True
    if semi or ";" in b:
        return True
    return qa == qb and last == pb.rpartition("/")[2]


def scan(window: list, ev, near_bits: int) -> tuple[list, list[tuple[int, int]]]:
    url, digest, simhash = ev.url, ev.digest, ev.simhash
    old = [e for e in window if e.url != url]         # a refetch is no pair
    shape = _shape(url)
    out = []
    for i, e in enumerate(old):
        flags = 0
        if e.digest == digest or (simhash and e.simhash and (simhash ^ e.simhash).bit_count() <= near_bits):
            flags = COMPARE
        if _may_differ_by_one(shape, e.url):
            flags |= BY_ONE
        if flags:
            out.append((i, flags))
    return old, out


def probe(pending: list[dict], filters: list[bytearray] | None, mask: int, g: int, fp: int):
    for gen in (g, 1 - g):
        raw = pending[gen].get(fp)
        if raw is not None:
            return raw
        if filters is None:
            return gen
        f = filters[gen]
        a, b = fp & mask, (fp >> 32) & mask
        if f[a >> 3] >> (a & 7) & 1 and f[b >> 3] >> (b & 7) & 1:
            return gen
    return None


def put(pending: dict, filt: bytearray | None, mask: int, fp: int, value: bytes) -> None:
    pending[fp] = value
    if filt is not None:
        a, b = fp & mask, (fp >> 32) & mask
        filt[a >> 3] |= 1 << (a & 7)
        filt[b >> 3] |= 1 << (b & 7)
