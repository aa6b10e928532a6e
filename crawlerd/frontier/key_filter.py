"""A fixed-size filter of the URL fingerprints a store ever held: "surely absent" or "maybe".

Recrawl reads a URL's state at its lease (the validators of a conditional GET) and at its
answer; most leased URLs were never fetched, so both reads find nothing (an LMDB get through the
overlay and its read cache). :class:`KeyFilter` answers those without a read: a bitmap of
``2**b`` bits where a fingerprint sets two bits (two disjoint 26..32-bit slices of it: the
fingerprint is already a 64-bit hash, xxh3). A key whose two bits are not both set was never
added (no false "absent", ever); a key that was added, or collides with added ones, reads as
"maybe" and the caller reads the store as before.

Key: the 64-bit fingerprint. Invariant: every key ``add`` was given since the filter was built
reads as ``maybe`` (bits are only ever set; a key deleted from the store stays "maybe", which
costs a read, never a wrong answer). RAM is ``size_bytes``, fixed (ARCHITECTURE.md invariant 4):
as the keys grow the share of "maybe" grows (about 5 % of absent keys at one key per 8 bits),
and a filter over ``full_keys`` keys says "maybe" to everything (``saturated``), as no filter.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

import numpy as np

_U64 = 0xFFFFFFFFFFFFFFFF
MIN_BITS_LOG2 = 10
MAX_BITS_LOG2 = 32                  # two slices of a 64-bit key, each no wider than 32 bits
_SCAN_CHUNK = 1 << 16               # keys joined and set per vectorised pass at build time


class KeyFilter:
    """The bitmap (module docstring). ``size_bytes`` is rounded down to a power of two."""

    __slots__ = ("_bits", "_mask", "_shift", "keys", "full_keys", "scan_keys", "saturated")

    def __init__(self, size_bytes: int):
        log2 = max(MIN_BITS_LOG2, min(MAX_BITS_LOG2, (max(size_bytes, 1) * 8).bit_length() - 1))
        nbits = 1 << log2
        self._bits = bytearray(nbits >> 3)
        self._mask = nbits - 1
        self._shift = log2
        self.keys = 0                       # keys added (with repeats): drives saturation
        self.full_keys = nbits >> 1         # beyond one key per two bits "absent" is rare: stop asking
        # a store found with more keys than this is not scanned at start (the build reads ~2 M keys
        # a second: ~4 s at the 8 MiB default); below it ~5 % of absent keys read "maybe"
        self.scan_keys = nbits >> 3
        self.saturated = False

    @property
    def size_bytes(self) -> int:
        return len(self._bits)

    def add(self, key: int) -> None:
        key &= _U64
        m, bits = self._mask, self._bits
        a = key & m
        b = (key >> self._shift) & m
        bits[a >> 3] |= 1 << (a & 7)
        bits[b >> 3] |= 1 << (b & 7)
        self.keys += 1
        if self.keys >= self.full_keys:
            self.saturated = True

    def maybe(self, key: int) -> bool:
        """False only if ``key`` was never added."""
        if self.saturated:
            return True
        key &= _U64
        m, bits = self._mask, self._bits
        a = key & m
        if not bits[a >> 3] >> (a & 7) & 1:
            return False
        b = (key >> self._shift) & m
        return bool(bits[b >> 3] >> (b & 7) & 1)

    def add_packed(self, chunks: Iterable[bytes]) -> None:
        """Add keys given as big-endian u64s packed back to back (LMDB keys joined): the build's
        vectorised path, the same bits as ``add`` per key."""
        view = np.frombuffer(self._bits, dtype=np.uint8)
        m, shift = np.uint64(self._mask), np.uint64(self._shift)
        for raw in chunks:
            if self.saturated:
                return
            if len(raw) % 8:                # not 8-byte keys: no filter rather than a wrong one
                self.saturated = True
                return
            keys = np.frombuffer(raw, dtype=">u8").astype(np.uint64)
            for pos in (keys & m, (keys >> shift) & m):
                np.bitwise_or.at(view, (pos >> np.uint64(3)).astype(np.intp),
                                 np.left_shift(1, (pos & np.uint64(7))).astype(np.uint8))
            self.keys += len(keys)
            if self.keys >= self.full_keys:
                self.saturated = True

    def stats(self) -> dict:
        return {"bytes": len(self._bits), "keys": self.keys, "saturated": self.saturated}


def packed_chunks(keys: Iterable[bytes], chunk: int = _SCAN_CHUNK) -> Iterable[bytes]:
    """``keys`` (8-byte LMDB keys) joined ``chunk`` at a time."""
    it = iter(keys)
    while True:
        block = b"".join(islice(it, chunk))
        if not block:
            return
        yield block
