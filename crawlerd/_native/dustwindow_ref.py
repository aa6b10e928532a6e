"""Plain-Python reference for ``crawlerd._native.dustwindow.pairs`` (same arguments, same
answer): the DUST window walk's first step as ``HostState.learn`` wrote it before the native
pass. The tests compare the two on random windows."""

from __future__ import annotations


def _may_differ_by_one(a: str, b: str) -> bool:
    """``dust_evidence._may_differ_by_one`` of two URLs."""
    pa, _, qa = a.partition("?")
    pb, _, qb = b.partition("?")
    if pa == pb:
        return True
    if ";" in a or ";" in b:
        return True
    return qa == qb and pa.rpartition("/")[2] == pb.rpartition("/")[2]


def pairs(evidence: list, url: str, digest: int, simhash: int, near_bits: int) -> tuple[list, bytes]:
    old = [e for e in evidence if e.url != url]
    marks = bytearray(len(old))
    for j, e in enumerate(old):
        if e.digest == digest or (simhash and e.simhash and (simhash ^ e.simhash).bit_count() <= near_bits):
            marks[j] = 1
        elif _may_differ_by_one(url, e.url):
            marks[j] = 2
    return old, bytes(marks)
