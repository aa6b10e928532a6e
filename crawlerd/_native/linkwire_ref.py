"""Pure-Python reference for ``crawlerd._native.linkwire`` (the same bytes from ``pack``, the same
links or the same ValueError from ``unpack``; tests/_native/test_linkwire.py runs both)."""

from __future__ import annotations

import struct

from crawlerd._native.linkrec import Link

_HEAD = struct.Struct("<II")          # links, URL bytes
_PER_LINK = 17                        # fp 8, url end 4, host index 4, nofollow 1


def pack(links: list, hosts: dict) -> bytes:
    """``links`` as one bytes (layout: ``linkwire.pyx``); new host keys added to ``hosts``."""
    n = len(links)
    urls = [ln.url.encode("utf-8", "surrogatepass") for ln in links]
    ends, off = [], 0
    for u in urls:
        off += len(u)
        ends.append(off)
    if n >= (1 << 32) // _PER_LINK or _HEAD.size + _PER_LINK * n + off >= 1 << 32:
        raise ValueError("links too long for one record")
    fps = [ln.fp for ln in links]
    if any(not 0 <= fp < 1 << 64 for fp in fps):
        raise OverflowError("a fingerprint does not fit in 64 bits, unsigned")
    index = [hosts.setdefault(ln.host_key, len(hosts)) for ln in links]
    return b"".join([_HEAD.pack(n, off), struct.pack(f"<{n}Q", *fps),
                     struct.pack(f"<{n}I", *ends), struct.pack(f"<{n}I", *index),
                     bytes(1 if ln.nofollow else 0 for ln in links), *urls])


def unpack(rec: object, hosts: list) -> list:
    """The links of a ``pack``ed bytes, in order; ValueError if it is not one."""
    if type(rec) is not bytes:
        raise ValueError(f"links record is a {type(rec).__name__}, not bytes")
    if len(rec) < _HEAD.size:
        raise ValueError("links record shorter than its head")
    n, blob = _HEAD.unpack_from(rec)
    if len(rec) != _HEAD.size + _PER_LINK * n + blob:
        raise ValueError(f"links record of {len(rec)} bytes for {n} links and {blob} URL bytes")
    at = _HEAD.size
    fps = struct.unpack_from(f"<{n}Q", rec, at)
    ends = struct.unpack_from(f"<{n}I", rec, at + 8 * n)
    index = struct.unpack_from(f"<{n}I", rec, at + 12 * n)
    nofollow = rec[at + 16 * n:at + 17 * n]
    body = at + 17 * n
    out, prev = [], 0
    for i in range(n):
        end, h = ends[i], index[i]
        if end < prev or end > blob:
            raise ValueError(f"link {i}: URL end {end} out of order")
        if h >= len(hosts):
            raise ValueError(f"link {i}: host index {h} past the frame's {len(hosts)} hosts")
        out.append(Link(rec[body + prev:body + end].decode("utf-8", "surrogatepass"), fps[i], hosts[h],
                        nofollow[i] != 0))
        prev = end
    return out
