"""Pure-Python reference for ``crawlerd._native.fiforuns.pack_block`` (the same bytes)."""

from __future__ import annotations

import struct

_HEAD = struct.Struct("<QIQ")       # seq, length of fp | record, fp
ENTRY = 12                          # seq u64 | length u32


def pack_block(hosts: list, i: int, j: int, seq: int, fps: list[int], records: list[bytes], used: int,
               cap: int) -> tuple[bytes, int, int]:
    """See ``fiforuns.pyx``."""
    if j > len(hosts) or j > len(fps) or j > len(records) or i < 0 or i >= j:
        raise IndexError("pack_block: i..j outside the lists")
    host = hosts[i]
    parts = []
    e, u = i, used
    while e < j:
        if e > i and hosts[e] != host:
            break
        rec = records[e]
        if type(rec) is not bytes:
            raise TypeError(f"pack_block: a record is bytes, not {type(rec).__name__}")
        n = len(rec) + 8
        if u and u + n > cap:
            break
        if not 0 <= fps[e] < 1 << 64:
            raise OverflowError("pack_block: a fingerprint is a u64")
        parts.append(_HEAD.pack(seq + e - i, n, fps[e]) + rec)
        u += n + ENTRY
        e += 1
    return b"".join(parts), e, u


def block_ends(items) -> list[int]:
    """See ``fiforuns.pyx``."""
    out = [k for k in range(1, len(items)) if items[k] != items[k - 1]]
    if items:
        out.append(len(items))
    return out
