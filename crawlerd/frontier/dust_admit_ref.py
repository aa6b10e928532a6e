"""Plain-Python reference for ``DustLearner.admit_batch`` (``crawlerd.frontier.dust``): the
learner's admission pass as it was written before its native kernels (``_native.dustkeys``,
``ClassTable.admit``), one URL at a time. Same arguments, same decisions, same side effects on
the learner (suspect table, probe budget, pending probes and samples, adopted priors); the
tests run one stream through two learners, one per pass, and compare every step."""

from __future__ import annotations

from collections.abc import Sequence

from crawlerd._native.dustkeys_ref import keys
from crawlerd.frontier.dust import _NORMAL, _NOTHING, _TAG, Decision, DustLearner


def admit_batch(learner: DustLearner, urls: Sequence[str], fps: Sequence[int], depths: Sequence[int],
                hops: Sequence[int], hosts: Sequence[str] | None = None) -> list[Decision]:
    out: list[Decision] = [_NORMAL] * len(urls)
    info = learner.hosts.info
    priors = bool(learner.priors.active)
    defer = learner.defer
    idx: list[int] = []
    keys0: list[int] = []
    keys1: list[int] = []
    forced_l: list[bool] = []
    for i, url in enumerate(urls):
        fp = fps[i]
        relevant = _NOTHING
        if info or priors:
            host = hosts[i] if hosts is not None else url[:url.find("/", 8)]   # its host key
            hi = info.get(host)
            if hi is not None:
                relevant = hi.relevant
            if priors or (hi is not None and hi.trusted):
                d = learner._trusted(url, fp, host, hi)  # noqa: SLF001 (the learner's own pass, moved out)
                if d is not None:
                    out[i] = d
                    continue
        if not defer:
            continue
        k0, k1 = keys(url, fp, relevant)
        idx.append(i)
        keys0.append(k0)
        keys1.append(k1)
        forced_l.append(depths[i] == 0 or hops[i] > 0)
    if not idx:
        return out
    table = learner._classes  # noqa: SLF001
    hit = table.hits(keys0, keys1, _TAG)
    seen: set[int] = set()
    add: list[int] = []
    for j, a in enumerate(keys0):
        b = keys1[j]
        if not forced_l[j] and (hit[j] or a in seen or (a ^ _TAG) in seen or (b and b in seen)):
            i = idx[j]
            url = urls[i]
            host = hosts[i] if hosts is not None else url[:url.find("/", 8)]
            out[i] = learner._probe_or_defer(fps[i], host, a, b)  # noqa: SLF001
            continue
        seen.add(a)
        add.append(a)
        if b:
            b ^= _TAG
            seen.add(b)
            add.append(b)
    if add:
        table.add_many(add)
    return out
