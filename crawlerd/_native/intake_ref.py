"""Plain-Python reference for ``crawlerd._native.intake`` (same arguments, same outputs): the shard
intake's per-URL loops as they were written before the native passes (``Intake.submit_links`` and
``Intake._admit`` up to robots.txt). The tests run the same streams through both and compare."""

from __future__ import annotations

import numpy as np


def links(links: list, head: bytes, max_len: int, few: int, check,
          reasons: list) -> tuple[np.ndarray, list[bytes], np.ndarray]:
    """Every link goes to ``check`` (whose own quick test is the kernel's ``max_len``/``few`` one)."""
    keys, aux = [], []
    text = head.decode()
    for ln in links:
        reason = check(ln.url, ln.host_key)
        if reason:
            reasons.append(reason)
            continue
        keys.append(ln.fp)
        aux.append((text + ln.url).encode())
    return np.array(keys, dtype=np.uint64), aux, np.array([len(a) for a in aux], dtype="<u4")


def answers(runs: list, mark: int, host_key) -> tuple[list[tuple], list[tuple[int, str]], int, int]:
    fresh: list[tuple] = []
    hosts: list[tuple[int, str]] = []
    dup = again = 0
    heads: dict[tuple[bytes, bytes, bytes], tuple[int, int, int]] = {}
    hk, prefix = "", None       # the last URL's host key, and it with the path's "/"
    for keys, unique, seq, i0, i1, aux, ends in runs:
        if i0 < 0 or i1 > len(keys) or i1 > len(unique):
            raise IndexError("answers out of range")
        if aux is None or ends is None or i1 > len(ends):
            raise ValueError("an intake answer needs its record")
        prev = int(ends[i0 - 1]) if i0 > 0 else 0
        for j in range(i0, i1):
            end = int(ends[j])
            if end < prev or end > len(aux):
                raise ValueError("aux ends out of order")
            rec = bytes(aux[prev:end])
            prev = end
            if seq + j < mark:
                again += 1
                continue
            if not unique[j]:
                dup += 1
                continue
            try:
                d, h, p, u = rec.split(b" ", 3)
            except ValueError:
                raise ValueError(f"not an intake record: {rec!r}") from None
            head = heads.get((d, h, p))
            if head is None:
                head = heads[d, h, p] = (int(d), int(h), int(p))
            url = u.decode()
            if prefix is None or not url.startswith(prefix):
                key = host_key(url)
                if key != hk:
                    hk, prefix = key, key + "/"
                    hosts.append((len(fresh), hk))
            fresh.append((int(keys[j]), rec, *head, url, hk))
    return fresh, hosts, dup, again
