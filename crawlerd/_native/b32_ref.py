"""Pure-Python reference for ``crawlerd._native.b32.sha1_base32`` (the same text).

Ten bits at a time through a table of character pairs: ``base64.b32encode`` is pure Python
and took as long as hashing a 2 KB block.
"""

from __future__ import annotations

_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"           # RFC 4648 §6 alphabet
_B32_PAIRS = [_B32[i >> 5] + _B32[i & 31] for i in range(1024)]     # 10 bits -> 2 characters


def sha1_base32(digest: bytes) -> str:
    """Base32 of a 20-byte digest: 160 bits, 32 characters, no padding."""
    if len(digest) != 20:
        raise ValueError(f"a SHA-1 digest is 20 bytes, got {len(digest)}")
    n = int.from_bytes(digest, "big")
    t = _B32_PAIRS
    return (t[n >> 150] + t[(n >> 140) & 1023] + t[(n >> 130) & 1023] + t[(n >> 120) & 1023]
            + t[(n >> 110) & 1023] + t[(n >> 100) & 1023] + t[(n >> 90) & 1023] + t[(n >> 80) & 1023]
            + t[(n >> 70) & 1023] + t[(n >> 60) & 1023] + t[(n >> 50) & 1023] + t[(n >> 40) & 1023]
            + t[(n >> 30) & 1023] + t[(n >> 20) & 1023] + t[(n >> 10) & 1023] + t[n & 1023])
