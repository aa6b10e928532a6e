"""Pure-Python reference for ``crawlerd._native.simhash`` (same definitions, same bits).

See the native module's docstring for the definition; this file spells it out
plainly: words, 3-word shingles, shingle hash, frequency-weighted bit votes.
"""

from __future__ import annotations

import re
from collections import Counter

_M64 = (1 << 64) - 1
_WORD = re.compile(r"[^\W_]+")  # \w minus "_" is exactly str.isalnum() per code point


def words(text: str) -> list[str]:
    """Lowercased maximal runs of alphanumeric code points."""
    return _WORD.findall(text.lower())


def shingles(text: str) -> list[str]:
    """3-word shingles joined by one space; fewer than 3 words give one shingle (or none)."""
    w = words(text)
    if len(w) < 3:
        return [" ".join(w)] if w else []
    return [" ".join(w[i : i + 3]) for i in range(len(w) - 2)]


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(h: int, k: int) -> int:
    k = (k * 0x87C37B91114253D5) & _M64
    k = _rotl(k, 31)
    k = (k * 0x4CF5AD432745937F) & _M64
    h ^= k
    h = _rotl(h, 27)
    return (h * 5 + 0x52DCE729) & _M64


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _M64
    return k ^ (k >> 33)


def shingle_hash(data: bytes) -> int:
    """64-bit hash of a shingle's UTF-8 bytes: 8-byte little-endian blocks, last one zero-padded."""
    n = len(data)
    h = (n * 0x9E3779B97F4A7C15) & _M64
    padded = bytes(data) + b"\0" * (-n % 8)
    for i in range(0, len(padded), 8):
        h = _round(h, int.from_bytes(padded[i : i + 8], "little"))
    return _fmix(h)


def simhash(text: str) -> int:
    """64-bit simhash: bit b is 1 iff shingles with bit b set outweigh those without."""
    if not isinstance(text, str):
        raise TypeError("simhash() needs a str")
    counts = Counter(shingles(text))
    votes = [0] * 64
    for sh, weight in counts.items():
        h = shingle_hash(sh.encode("utf-8"))
        for b in range(64):
            votes[b] += weight if (h >> b) & 1 else -weight
    return sum(1 << b for b in range(64) if votes[b] > 0)


def hamming(a: int, b: int) -> int:
    """Number of differing bits of two 64-bit fingerprints (OverflowError outside [0, 2**64))."""
    if not (0 <= a <= _M64 and 0 <= b <= _M64):
        raise OverflowError("fingerprints are unsigned 64-bit ints")
    return (a ^ b).bit_count()
