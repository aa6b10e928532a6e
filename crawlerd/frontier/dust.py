"""Do not crawl in the DUST: learn per-host URL rewrite rules from archived pages, apply them at admission.

Bar-Yossef, Keidar and Schonfeld (WWW 2007) and Dasgupta, Kumar and Sasturkar (KDD 2008) show
that most "different URLs, same content" on a site come from a few rewrites (tracking and
session parameters, sort orders, print/mobile views). The shard tells this learner about
every archived page (``observe``) and asks it about every new URL (``admit_batch``):

SKIP     a *trusted* rule of the host rewrites the URL onto a URL already archived (or the
         URL is the rewrite of an archived page): it is not queued. Logged with its rule, so
         that the rule's retirement queues it again.
SAMPLE   would be a skip, but a share ``sample_share`` (chosen by fingerprint) is fetched
         anyway: its evidence re-validates the rule, and one contradiction retires it.
DEFER    a *suspect*: its skeleton (the URL without the parameters not known to change content,
         also without its first directory token) equals the skeleton of a URL admitted
         before. It is queued in the frontier's deferred level, fetched only when its host has
         nothing else; if a parameter turns out to change content, ``promote`` moves it back.
PROBE    a suspect fetched at once (top level) to gather evidence: probes cost at most a
         share ``probe_share`` of the pages archived (a probe that finds new content is free).
NORMAL   everything else.

Nothing is dropped on suspicion: a URL is either queued (NORMAL, PROBE, SAMPLE, DEFER) or
skipped because a trusted rule maps it onto content already in the archive. Rules, evidence,
the archived set and the skip log persist under ``<data_dir>/dust`` (``dust_store``); the
suspect table is RAM only (losing it means fetching, never skipping). Rules and evidence:
``dust_evidence``; their grammar: ``dust_rules``.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from xxhash import xxh3_64_intdigest as _fp

from crawlerd.frontier.dust_evidence import AGREE, DISAGREE, NEUTRAL, TRUSTED, Evidence, HostState
from crawlerd.frontier.dust_rules import MAX_VIEW_TOKEN, Rule, parse, skeleton, unparse
from crawlerd.frontier.dust_store import CANON, SKEL, URL, DustStore
from crawlerd.url.canonical import fingerprint
from crawlerd.url.hosts import host_key as host_key_of

__all__ = ["DustLearner", "ClassTable", "Decision", "Changes", "NORMAL", "PROBE", "SAMPLE", "DEFER", "SKIP"]

NORMAL, PROBE, SAMPLE, DEFER, SKIP = "normal", "probe", "sample", "defer", "skip"
_TAG = 0x5851F42D4C957F2D          # marks "skeleton without its first directory token" keys
_INITIAL_TOKENS = 8.0
_MAX_TOKENS = 64.0
_PENDING = 1 << 16                 # probes and samples remembered until their page is archived
_NOTHING: frozenset[str] = frozenset()


def _alt_path(url: str, relevant: frozenset[str]) -> str:
    """A URL without query or path parameters, minus its first directory token when that is short
    (``/m/``, ``/amp/``, ``/print/``: view tokens), not known to matter and followed by at least
    one more directory; else "". Must agree with ``dust_rules.skeleton``."""
    s = url.find("/", 8)                # the path's "/" (scheme://host is at least 8 characters)
    if s < 0:
        return ""
    e = url.find("/", s + 1)
    if e < 0 or e == s + 1 or e - s - 1 > MAX_VIEW_TOKEN or url.find("/", e + 1) < 0 or \
            url[s + 1:e] in relevant:
        return ""
    return url[:s] + url[e:]


class Decision(NamedTuple):
    action: str
    rule: str = ""          # the rule that skipped or sampled it
    canonical: str = ""     # the URL whose content stands for it


_NORMAL = Decision(NORMAL)
_DEFER = Decision(DEFER)
_PROBE = Decision(PROBE)


@dataclass(slots=True)
class Changes:
    """What an observation changed that the frontier must act on."""
    trusted: list[str] = field(default_factory=list)      # rules now trusted
    retired: list[str] = field(default_factory=list)      # rules retired (a counter-example)
    requeue: list[bytes] = field(default_factory=list)    # seen-set records of retired rules' skips
    promote: bool = False                                 # the host's deferred URLs may be suspects no more


class _HostInfo(NamedTuple):
    """What admission needs of a host, kept in RAM for hosts with trusted rules or relevant names."""
    trusted: tuple[tuple[Rule, int], ...]
    epoch: int
    relevant: frozenset[str]
    names: dict[int, str]           # rule id -> text


class ClassTable:
    """Skeleton keys of recently admitted URLs: a set-associative cache of 64-bit keys (WAYS per
    bucket, round-robin replacement), RAM only. Invariant: holds at most ``capacity`` keys; a
    key lost to replacement makes a later duplicate look new (fetched), never the reverse."""

    WAYS = 4

    def __init__(self, entries: int):
        nb = 1 << max(8, (max(1, entries // self.WAYS) - 1).bit_length())
        self._t = np.zeros((nb, self.WAYS), dtype=np.uint64)
        self._next = np.zeros(nb, dtype=np.uint8)
        self._mask = np.uint64(nb - 1)
        self.capacity = nb * self.WAYS

    def _prep(self, keys) -> tuple[np.ndarray, np.ndarray]:
        k = np.asarray(keys, dtype=np.uint64)
        k = np.where(k == 0, np.uint64(1), k)
        return k, ((k ^ (k >> np.uint64(29))) & self._mask).astype(np.intp)

    def has_many(self, keys) -> np.ndarray:
        k, b = self._prep(keys)
        return (self._t[b] == k[:, None]).any(axis=1)

    def add_many(self, keys) -> None:
        k, b = self._prep(keys)
        keep = ~(self._t[b] == k[:, None]).any(axis=1)
        k, b = k[keep], b[keep]
        for _ in range(self.WAYS):          # keys sharing a bucket in one batch: one per round
            if not len(k):
                break
            ub, first = np.unique(b, return_index=True)
            w = self._next[ub]
            self._t[ub, w] = k[first]
            self._next[ub] = (w + 1) % self.WAYS
            rest = np.ones(len(k), dtype=bool)
            rest[first] = False
            k, b = k[rest], b[rest]


class DustLearner:
    """Per-host DUST rules for one shard. Single-threaded (the shard's loop)."""

    def __init__(self, path: str, *, confirmations: int = 3, sample_share: float = 0.02,
                 probe_share: float = 0.005, defer: bool = True, window: int = 24,
                 max_bytes: int = 256 << 20, max_host_bytes: int = 16 << 10, class_entries: int = 1 << 21,
                 cache_hosts: int = 2048, near_bits: int = 3, sync: bool = True, clock=time.time):
        self.k = confirmations
        self.sample_share = sample_share
        self.probe_share = probe_share
        self.defer = defer
        self.window = window
        self.near_bits = near_bits
        self.max_host_bytes = max_host_bytes
        self.cache_hosts = cache_hosts
        self.max_probes_per_host = confirmations + 2
        self._clock = clock
        self.store = DustStore(path, max_bytes=max_bytes, max_host_bytes=max_host_bytes, sync=sync)
        self._cache: OrderedDict[str, HostState] = OrderedDict()
        self._dirty: set[str] = set()
        self._info: dict[str, _HostInfo] = {}
        self._skips_by_host: Counter[str] = Counter()
        for host, rec in self.store.hosts():
            st = HostState(rec)
            self._refresh(host, st)
            self._skips_by_host[host] = sum(r.skips for r in st.rules)
        self._classes = ClassTable(class_entries)
        # fp -> (kind, rule, canonical, its digest u32, its simhash) of probes and samples in flight
        self._pending: OrderedDict[int, tuple[str, str, str, int, int]] = OrderedDict()
        self._host_probes: Counter[str] = Counter()
        self._learning: OrderedDict[str, None] = OrderedDict()     # hosts with candidate rules
        self.tokens = _INITIAL_TOKENS
        self.counters: Counter[str] = Counter()

    # -- host state ----------------------------------------------------------------------------
    def _state(self, host: str) -> HostState:
        st = self._cache.get(host)
        if st is not None:
            self._cache.move_to_end(host)
            return st
        st = HostState(self.store.get_host(host))
        self._cache[host] = st
        while len(self._cache) > self.cache_hosts:
            old, ost = self._cache.popitem(last=False)
            if old in self._dirty:
                self._write(old, ost)
        return st

    def _write(self, host: str, st: HostState) -> None:
        rec = st.to_record()
        while self.store.encoded_size(rec) > self.max_host_bytes and st.shrink():
            rec = st.to_record()
        for gone in self.store.put_host(host, rec):      # the least recently written hosts
            self._info.pop(gone, None)
            self._skips_by_host.pop(gone, None)
            self._host_probes.pop(gone, None)
        self._dirty.discard(host)

    def _refresh(self, host: str, st: HostState) -> None:
        trusted = tuple(sorted(((r.rule, r.id) for r in st.trusted()), key=lambda x: x[0].text))
        if trusted or st.relevant:
            self._info[host] = _HostInfo(trusted, st.epoch, frozenset(st.relevant),
                                         {r.id: r.rule.text for r in st.rules})
        else:
            self._info.pop(host, None)

    # -- admission ----------------------------------------------------------------------------
    def admit(self, url: str, fp: int, depth: int = 1, hops: int = 0) -> Decision:
        return self.admit_batch([url], [fp], [depth], [hops])[0]

    def admit_batch(self, urls: list[str], fps: list[int], depths: list[int], hops: list[int]) -> list[Decision]:
        """Decisions for URLs the seen-set found new (normalised URLs, their fingerprints, link
        depths, redirect hops: parallel lists), in order.
        Seeds (depth 0) and redirect targets (hops) are never suspects. A declared canonical comes
        through here like any link: a suspect when the page that named it (a variant of it) was
        admitted, since fetching it would fetch that content again.
        Hot path (every new URL): plain string work, one hash per URL with parameters or a short
        first directory, the table looked up once per batch."""
        out: list[Decision] = [_NORMAL] * len(urls)
        info = self._info
        defer = self.defer
        idx: list[int] = []
        keys0: list[int] = []
        keys1: list[int] = []
        forced_l: list[bool] = []
        for i, url in enumerate(urls):
            fp = fps[i]
            relevant = _NOTHING
            if info:
                hi = info.get(url[:url.find("/", 8)])        # the host key of a normalised URL
                if hi is not None:
                    if hi.trusted:
                        d = self._trusted(url, fp, url[:url.find("/", 8)], hi)
                        if d is not None:
                            out[i] = d
                            continue
                    relevant = hi.relevant
            if not defer:
                continue
            if "?" in url or ";" in url:
                main, _dropped, alt = skeleton(url, relevant)
                k0 = _fp(main.encode()) if main != url else fp
            else:
                k0, alt = fp, _alt_path(url, relevant)
            idx.append(i)
            keys0.append(k0)
            keys1.append(_fp(alt.encode()) if alt else 0)
            forced_l.append(depths[i] == 0 or hops[i] > 0)
        if not idx:
            return out
        n = len(keys0)
        k0a = np.array(keys0, dtype=np.uint64)
        k1a = np.array(keys1, dtype=np.uint64)
        table = self._classes
        h = table.has_many(np.concatenate((k0a, k0a ^ np.uint64(_TAG), k1a)))
        hit = (h[:n] | h[n:2 * n] | ((k1a != 0) & h[2 * n:])).tolist()
        seen: set[int] = set()
        add: list[int] = []
        for j, a in enumerate(keys0):
            b = keys1[j]
            if not forced_l[j] and (hit[j] or a in seen or (a ^ _TAG) in seen or (b and b in seen)):
                i = idx[j]
                url = urls[i]
                out[i] = self._probe_or_defer(fps[i], url[:url.find("/", 8)], a, b)
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

    @staticmethod
    def _skeleton(url: str, relevant: frozenset[str]) -> tuple[str, str, tuple[str, ...]]:
        if "?" in url or ";" in url:
            main, dropped, alt = skeleton(url, relevant)
            return main, alt, dropped
        return url, _alt_path(url, relevant), ()

    def _trusted(self, url: str, fp: int, host: str, info: _HostInfo, sample: bool = True) -> Decision | None:
        """SKIP or SAMPLE when the host's trusted rules map ``url`` onto archived content."""
        q = parse(url)
        first = None
        for rule, _rid in info.trusted:
            n = rule.apply(q)
            if n is not None:
                q = n
                first = first or rule
        if first is not None:
            canonical = unparse(q)
            hit = self.store.archived(fingerprint(canonical))
            if hit is None or not (hit[0] == URL or (hit[0] == CANON and hit[2] == info.epoch)):
                return None
            text = first.text
        else:
            hit = self.store.archived(fp)
            if hit is None or hit[0] != CANON or hit[2] != info.epoch or hit[1] not in info.names:
                return None
            canonical, text = url, info.names[hit[1]]
        if sample and (fp >> 40) < self.sample_share * (1 << 24):
            self._remember(fp, "sample", text, canonical, hit.digest, hit.simhash)
            self.counters["samples"] += 1
            return Decision(SAMPLE, text, canonical)
        return Decision(SKIP, text, canonical)

    def _probe_or_defer(self, fp: int, host: str, k0: int, k1: int) -> Decision:
        # a host whose candidates wait for confirmations goes first; a new one starts only while
        # the budget could see it through (k probes), so few hosts learn rather than none
        need = 1.0 if host in self._learning else float(self.k + 1)
        if self.tokens >= need and self._host_probes[host] < self.max_probes_per_host:
            if self.store.archived(k0) is not None or (k1 and self.store.archived(k1) is not None):
                self.tokens -= 1.0
                self._host_probes[host] += 1
                self._remember(fp, "probe")
                self.counters["probes"] += 1
                return _PROBE
        self.counters["deferred"] += 1
        return _DEFER

    def wants_probe(self, host: str) -> bool:
        """A host whose candidate rules wait for confirmations, with probe budget left: the shard
        then offers its deferred URLs to ``take_probe``."""
        return host in self._learning and self.tokens >= 1.0 and \
            self._host_probes[host] < self.max_probes_per_host

    def take_probe(self, url: str, fp: int, host: str) -> bool:
        """Fetch this deferred URL now as a probe? (Only if what it may duplicate is archived.)"""
        if not self.wants_probe(host):
            return False
        info = self._info.get(host)
        main, alt, _ = self._skeleton(url, info.relevant if info else _NOTHING)
        if self.store.archived(fingerprint(main)) is None and not (alt and self.store.archived(fingerprint(alt))):
            return False
        self.tokens -= 1.0
        self._host_probes[host] += 1
        self._remember(fp, "probe")
        self.counters["probes"] += 1
        return True

    def _remember(self, fp: int, kind: str, rule: str = "", canonical: str = "", digest: int = 0,
                  simhash: int = 0) -> None:
        """A probe or sample on its way: what its answer will be checked against."""
        self._pending[fp] = (kind, rule, canonical, digest, simhash)
        while len(self._pending) > _PENDING:
            self._pending.popitem(last=False)

    def check_lease(self, url: str, fp: int, host: str) -> Decision | None:
        """At lease time (URLs queued before a rule was trusted): a SKIP decision, or None: fetch."""
        info = self._info.get(host)
        if info is None or not info.trusted:
            return None
        d = self._trusted(url, fp, host, info)
        return d if d is not None and d.action == SKIP else None

    def still_suspect(self, url: str, host: str) -> bool:
        """For a deferred URL after its host learned something: stay deferred? (A URL it lets go
        becomes the first of its skeleton, so its own variants stay suspects.)"""
        info = self._info.get(host)
        if info is not None and info.trusted and self._trusted(url, fingerprint(url), host, info) is not None:
            return True
        main, alt, _ = self._skeleton(url, info.relevant if info else frozenset())
        a, b = fingerprint(main), fingerprint(alt) if alt else 0
        hit = self._classes.has_many([a, a ^ _TAG, b or 1])
        if hit[0] or hit[1] or (b and hit[2]):
            return True
        self._classes.add_many([a] + ([b ^ _TAG] if b else []))
        return False

    def skipped(self, host: str, decision: Decision, record: bytes) -> None:
        """The shard skipped a URL on ``decision``: count it under its rule and log ``record``
        (its seen-set record) so a retirement of the rule queues it again."""
        st = self._state(host)
        rs = st.find(decision.rule)
        self.counters["skipped"] += 1
        self.store.meta["skipped"] = self.store.meta.get("skipped", 0) + 1
        if rs is None:
            return
        rs.skips += 1
        rs.logged = self.store.log_skip(host, rs.rule.text, record, rs.logged)
        self._skips_by_host[host] += 1
        self._dirty.add(host)

    # -- evidence -----------------------------------------------------------------------------
    def observe(self, url: str, fp: int, host: str, digest: bytes, simhash: int, canonical: str = "") -> Changes:
        """One archived 200 answer: learn from it, record it in the archived set."""
        st = self._state(host)
        same_host = canonical if canonical and host_key_of(canonical) == host else ""
        ev = Evidence(url, int.from_bytes(digest[:8], "big"), simhash, same_host)
        learned = st.learn(ev, k=self.k, near_bits=self.near_bits, window=self.window, now=self._clock())
        ch = Changes()
        self.tokens = min(_MAX_TOKENS, self.tokens + self.probe_share)
        pend = self._pending.pop(fp, None)
        if pend is not None and pend[0] == "probe" and not learned.agreed:
            self.tokens += 1.0            # the probe found new content: it cost nothing
            self._host_probes[host] -= 1
        elif pend is not None and pend[0] == "sample":
            rs = st.find(pend[1])
            if rs is not None and rs.state == TRUSTED and rs not in learned.related:
                # its stand-in may have left the window: compare with what the archived set kept
                v = self._versus(ev, digest, pend)
                if v == DISAGREE:
                    st.retire(rs, self._clock())
                    learned.retired.append(rs)
                if v != NEUTRAL:
                    learned.related.append(rs)
            if rs is not None and rs in learned.related:
                rs.samples += 1
        meta = self.store.meta
        for rs in learned.trusted:
            ch.trusted.append(rs.rule.text)
            meta["learned"] = meta.get("learned", 0) + 1
        for rs in learned.retired:
            ch.retired.append(rs.rule.text)
            meta["retired"] = meta.get("retired", 0) + 1
            meta["mismatches"] = meta.get("mismatches", 0) + (1 if rs.mismatches else 0)
            ch.requeue += self.store.pop_skips(host, rs.rule.text)
            rs.logged = 0
        if learned.trusted or learned.retired or learned.relevant:
            self._refresh(host, st)
        if any(r.state != TRUSTED for r in st.rules):
            self._learning[host] = None
            while len(self._learning) > _PENDING:
                self._learning.popitem(last=False)
        else:
            self._learning.pop(host, None)
        ch.promote = bool(learned.retired or learned.relevant)
        d32 = int.from_bytes(digest[:4], "big")
        self.store.add_archived(fp, URL, digest=d32, simhash=simhash)
        info = self._info.get(host)
        main = self._skeleton(url, info.relevant if info else frozenset())[0]
        if main != url:
            self.store.add_archived(fingerprint(main), SKEL, digest=d32, simhash=simhash)
        if info is not None and info.trusted:
            for e in (st.evidence if learned.trusted else st.evidence[-1:]):
                self._record_rewrite(e, info)
        self._dirty.add(host)
        return ch

    def _versus(self, ev: Evidence, digest: bytes, pend: tuple) -> int:
        """A sample's answer against the archived page its rule maps it onto (as kept in the
        archived set): the agreement rule of ``dust_evidence.compare`` on what is kept."""
        _kind, _rule, canonical, d32, sim = pend
        if int.from_bytes(digest[:4], "big") == d32:
            return AGREE
        if ev.simhash and sim and (ev.simhash ^ sim).bit_count() <= self.near_bits:
            return AGREE if ev.canonical == canonical else NEUTRAL
        return DISAGREE

    def _record_rewrite(self, e: Evidence, info: _HostInfo) -> None:
        q = parse(e.url)
        first = None
        for rule, rid in info.trusted:
            n = rule.apply(q)
            if n is not None:
                q = n
                first = first if first is not None else rid
        if first is not None:
            self.store.add_archived(fingerprint(unparse(q)), CANON, first, info.epoch, e.digest >> 32, e.simhash)

    # -- durability and reporting -------------------------------------------------------------
    def commit(self) -> None:
        for host in list(self._dirty):
            st = self._cache.get(host)
            if st is not None:
                self._write(host, st)
        self._dirty.clear()
        self.store.commit()

    def close(self) -> None:
        if self.store.env is not None:
            self.commit()
            self.store.close()

    def rules_of(self, host: str) -> list[dict]:
        st = self._state(host)
        rules = sorted(st.rules, key=lambda r: (r.state != TRUSTED, -r.skips, -r.confirmations))
        return [r.view() for r in rules] + [r.view() for r in st.retired if r.mismatches]

    def stats(self, top_hosts: int = 10, top_rules: int = 5) -> dict:
        meta = self.store.meta
        trusted = sum(len(i.trusted) for i in self._info.values())
        hosts = sorted((h for h, i in self._info.items() if i.trusted),
                       key=lambda h: (-self._skips_by_host[h], h))[:top_hosts]
        return {"rules_trusted": trusted, "hosts_with_rules": sum(1 for i in self._info.values() if i.trusted),
                "rules_learned_total": meta.get("learned", 0), "rules_retired_total": meta.get("retired", 0),
                "sample_mismatches_total": meta.get("mismatches", 0), "skipped_total": meta.get("skipped", 0),
                "probe_tokens": round(self.tokens, 2), **{k: v for k, v in self.counters.items()},
                "top": [{"host": h, "rules": self.rules_of(h)[:top_rules]} for h in hosts]}
