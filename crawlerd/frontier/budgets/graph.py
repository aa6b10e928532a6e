"""STAR (Spam Tracking and Avoidance through Reputation, IRLbot §7): reputation from links between domains.

A pay-level domain's (PLD, ``url.hosts.registered_domain``) reputation is its in-degree in the PLD graph:
how many *other* domains link to it. Hostnames and pages under one PLD cost a spammer nothing,
links from domains he does not own do, so links inside a PLD never count. The unique
(source PLD, target PLD) edges come from a DRUM (IRLbot §4, ``edges``), so RAM does not grow with
the number of edges and each edge counts once.

Vouching. A farm of hundreds of domains that link to each other earns every one of them an
in-degree of hundreds by plain counting (``mode="all"``, IRLbot's rule), more than most honest
sites of a small crawl. So by default (``mode="vouched"``) a link counts only as a *vouch*: a
domain vouches for at most ``floor(vouch_ratio x its own in-degree)`` of the domains it links to
(the first ones it was seen linking to), and the domains of seed URLs (trust roots) vouch for all.
Reputation then flows from the seeds along links and halves (at the default ratio 0.5) with each
domain it passes through, as TrustRank's damping does (Gyöngyi et al., VLDB 2004): what a farm
earns is bounded by the vouches honest domains give it, not by how many domains it owns. A link
that cannot count yet waits in ``votes`` and counts as soon as its source may vouch for more.

Across shards (``crawl.shards`` > 1) a domain's record lives in the shard that owns it, and the
pages of a domain are fetched there, so an edge is decided where its *source* lives (its DRUM,
its vouching limit). A vouch for a domain another shard owns is handed to that shard (``export``)
and enters its edge DRUM as a vouch record (``vouch_keys``): counted once however often the
hand-off delivers it, it raises the target's in-degree there and lets the target vouch for more.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

import xxhash

from crawlerd.frontier.budgets.store import BudgetStore, RecordCache, domain_key, domain_name
from crawlerd.frontier.budgets.topk import TopK

_EMPTY_KEY = domain_key("")      # an empty registered domain (edge_keys leaves its links out)

MODE_VOUCHED = "vouched"
MODE_ALL = "all"
MODES = (MODE_VOUCHED, MODE_ALL)
ROOT = 1                                   # GraphRecord.flags: a trust root (domain of a seed URL)
_REC = struct.Struct("<QQQI")              # in-degree, vouches cast, votes pending, flags
_SEQ = struct.Struct(">Q")
_NO_LIMIT = 1 << 62
VOTES_BYTES = 1536                         # a ``votes`` entry is closed before its value passes this
VOUCH = b"\x01"                            # edge DRUM aux of a vouch another shard handed over


class GraphCorrupt(Exception):
    """The graph tables disagree with each other (a damaged LMDB file)."""


class GraphRecord:
    """Value of the ``graph`` table. Key: domain key.

    ``indeg``: distinct other domains whose vouch for it was counted. ``cast``: vouches it has
    given. ``pending``: its links waiting in ``votes`` (invariant: > 0 only while ``cast`` has
    reached its vouching limit).

    ``votes`` entries: key source domain key | NUL | seq u64 (of its first link) -> the target
    domain keys joined by NUL, in arrival order: the links of one source that one delivery leaves
    waiting are one entry (at most ``VOTES_BYTES``), not one put each (FIFO format 4; before it,
    one target per entry, which reads the same).
    """

    __slots__ = ("indeg", "cast", "pending", "flags")

    def __init__(self, indeg: int = 0, cast: int = 0, pending: int = 0, flags: int = 0):
        self.indeg, self.cast, self.pending, self.flags = indeg, cast, pending, flags

    def encode(self) -> bytes:
        return _REC.pack(self.indeg, self.cast, self.pending, self.flags)


class DomainGraph:
    """The PLD graph's in-degrees (in the shared :class:`BudgetStore`), fed with unique edges.

    Key: domain key -> :class:`GraphRecord`, cached in an LRU of ``cache_entries`` (write-back:
    records changed since the last commit stay in RAM until it). Invariants (``check_invariants``):
    the in-degrees add up to the vouches cast; a domain's ``pending`` equals its entries in
    ``votes``; every edge the DRUM answered with a sequence number below ``applied_seq`` has been
    applied exactly once (answers delivered again after a crash are recognised and skipped).
    """

    def __init__(self, store: BudgetStore, *, mode: str = MODE_VOUCHED, vouch_ratio: float = 0.5,
                 cache_entries: int = 1 << 16, top_n: int = 20):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        if not 0.0 < vouch_ratio <= 1.0 or cache_entries < 1:
            raise ValueError("need 0 < vouch_ratio <= 1 and cache_entries >= 1")
        self.store = store
        self.mode = mode
        self.vouch_ratio = vouch_ratio
        self._records = RecordCache(store, store.graph, lambda raw: GraphRecord(*_REC.unpack(raw)), GraphRecord,
                                    cache_entries)
        self._listeners: list[Callable[[list[bytes]], None]] = []
        # (source key, target key) -> True when the target's owner is another shard, which the
        # vouch was handed to (set by the shard of several; None: every domain is here)
        self.export: Callable[[bytes, bytes], bool] | None = None
        meta = store.get_meta(b"graph")
        self._applied_seq: int = meta.get("applied_seq", 0)
        self._vseq: int = meta.get("vseq", 0)
        self._votes: int = meta["votes"] if "votes" in meta else store.count(store.votes)   # links waiting
        self._vbuf: dict[bytes, list] = {}    # source -> [first seq, targets, bytes]: one delivery's votes
        self._c = dict.fromkeys(("edges_submitted", "edges_unique", "edges_duplicate", "redelivered_skipped",
                                 "vouches", "roots", "vouches_handed", "vouches_received"), 0)
        self._c.update(meta.get("counters", {}))
        self._top = TopK(top_n, meta.get("top"))
        self._saved_top: list | None = None
        store.add_hook(self._flush, lambda: self._records.changed_count)
        params = [mode, vouch_ratio]
        if meta and meta.get("params") != params:
            self._resweep()          # vouching limits changed: count what they now allow
        self._params = params

    # -- recording ----------------------------------------------------------------------------
    def edge_keys(self, src_pld: str, targets: Iterable[str]) -> tuple[list[int], list[bytes]]:
        """DRUM keys and aux of the links of one page of ``src_pld`` to the given PLDs.

        Links to the page's own PLD, empty names and repeats within the call are left out;
        repeats across pages are the DRUM's to find. Aux: source key | NUL | target key.
        """
        src = domain_key(src_pld)
        keys, aux = [], []
        h = xxhash.xxh3_64_intdigest
        for dst in targets if isinstance(targets, (set, frozenset)) else set(targets):
            if not dst or dst == src_pld:
                continue
            dk = domain_key(dst)
            if dk == src:
                continue
            a = src + b"\0" + dk
            keys.append(h(a))
            aux.append(a)
        self._c["edges_submitted"] += len(keys)
        return keys, aux

    def domain_edge_keys(self, src: bytes, targets: set[bytes]) -> tuple[list[int], list[bytes]]:
        """``edge_keys`` with the page's domain and the linked ones given by their domain keys
        (``domain_key``; a set): the links to the page's own domain and to the empty name left out."""
        keys, aux = [], []
        h = xxhash.xxh3_64_intdigest
        for dk in targets:
            if dk == src or dk == _EMPTY_KEY:
                continue
            a = src + b"\0" + dk
            keys.append(h(a))
            aux.append(a)
        self._c["edges_submitted"] += len(keys)
        return keys, aux

    def vouch_keys(self, pairs: Iterable[tuple[bytes, bytes]]) -> tuple[list[int], list[bytes]]:
        """DRUM keys and aux of vouches another shard handed over ((source key, target key)):
        a key space of their own, so a vouch delivered twice counts once."""
        keys, aux = [], []
        h = xxhash.xxh3_64_intdigest
        for src, dst in pairs:
            a = VOUCH + src + b"\0" + dst
            keys.append(h(a))
            aux.append(a)
        return keys, aux

    def add_root(self, pld: str) -> bool:
        """Make ``pld`` a trust root (the domain of a seed URL): it vouches for every domain it links to."""
        dk = domain_key(pld)
        r = self._records.get(dk)
        if r.flags & ROOT:
            return False
        r.flags |= ROOT
        self._records.changed(dk, r)
        self._c["roots"] += 1
        changed: dict[bytes, None] = {}
        self._vouch_all([dk], changed)
        self._tell(changed)
        return True

    def apply(self, results) -> int:
        """Apply one delivery of edge DRUM answers (in sequence order); returns unique edges applied.

        Writes into the store's open transaction: commit it, then acknowledge the DRUM.
        """
        changed: dict[bytes, None] = {}
        work: list[bytes] = []
        unique = 0
        applied = self._applied_seq
        for res in results:
            if res.seq < applied:
                self._c["redelivered_skipped"] += 1
                continue
            applied = res.seq + 1
            if not res.unique:
                self._c["edges_duplicate"] += 1
                continue
            vouch = res.aux[:1] == VOUCH
            src, sep, dst = (res.aux[1:] if vouch else res.aux).partition(b"\0")
            if not sep or not src or not dst:
                raise GraphCorrupt(f"edge answer {res.seq} has no source|target aux: {res.aux[:80]!r}")
            unique += 1
            if vouch:               # cast where its source lives: only the target's side is here
                self._c["vouches_received"] += 1
                self._credit(dst, changed, work)
            else:
                self._edge(src, dst, changed, work)
        self._applied_seq = applied
        self._c["edges_unique"] += unique
        self._write_votes()
        self._vouch_all(work, changed)
        self._tell(changed)
        return unique

    def _edge(self, src: bytes, dst: bytes, changed: dict, work: list[bytes]) -> None:
        s = self._records.get(src)
        if s.pending == 0 and s.cast < self._limit(s):
            self._count(src, s, dst, changed, work)
            return
        b = self._vbuf.get(src)
        if b is None or b[2] + len(dst) >= VOTES_BYTES:
            if b is not None:
                self._put_votes(src, b)
            b = self._vbuf[src] = [self._vseq, [], 0]
        b[1].append(dst)
        b[2] += len(dst) + 1
        self._vseq += 1
        self._votes += 1
        s.pending += 1
        self._records.changed(src, s)

    def _put_votes(self, src: bytes, b: list) -> None:
        self.store.txn().put(src + b"\0" + _SEQ.pack(b[0]), b"\0".join(b[1]), db=self.store.votes)

    def _write_votes(self) -> None:
        # a delivery's waiting links, one entry per source (its first link's seq keeps the order)
        for src, b in self._vbuf.items():
            self._put_votes(src, b)
        self._vbuf = {}

    def _count(self, src: bytes, s: GraphRecord, dst: bytes, changed: dict, work: list[bytes]) -> None:
        s.cast += 1
        self._records.changed(src, s)
        self._c["vouches"] += 1
        if self.export is not None and self.export(src, dst):
            self._c["vouches_handed"] += 1
            return
        self._credit(dst, changed, work)

    def _credit(self, dst: bytes, changed: dict, work: list[bytes]) -> None:
        d = self._records.get(dst)
        d.indeg += 1
        self._records.changed(dst, d)
        self._top.note(dst, d.indeg)
        changed[dst] = None
        if d.pending and d.cast < self._limit(d):
            work.append(dst)

    def _vouch_all(self, work: list[bytes], changed: dict) -> None:
        # A domain whose in-degree rose may vouch for more: count its waiting links, oldest first.
        # Each stored link is counted at most once, so the cascade costs O(1) per link overall.
        st = self.store
        while work:
            y = work.pop()
            r = self._records.get(y)
            if not r.pending or r.cast >= self._limit(r):
                continue
            prefix = y + b"\0"
            cur = st.txn().cursor(db=st.votes)
            if not cur.set_range(prefix):
                raise GraphCorrupt(f"{domain_name(y)}: {r.pending} pending votes counted, none stored")
            while r.pending and r.cast < self._limit(r):
                key = cur.key()
                if not key.startswith(prefix):
                    raise GraphCorrupt(f"{domain_name(y)}: fewer pending votes stored than counted")
                key, targets = bytes(key), bytes(cur.value()).split(b"\0")
                cur.delete()                # moves to the source's next entry, if any
                i = 0
                while i < len(targets) and r.cast < self._limit(r):
                    r.pending -= 1
                    self._votes -= 1
                    self._count(y, r, targets[i], changed, work)
                    i += 1
                if i < len(targets):        # its limit is reached: the rest waits under the same key
                    st.txn().put(key, b"\0".join(targets[i:]), db=st.votes)
                    break

    def _limit(self, r: GraphRecord) -> int:
        if self.mode == MODE_ALL or r.flags & ROOT:
            return _NO_LIMIT
        return int(self.vouch_ratio * r.indeg)

    def _resweep(self) -> None:
        work = [k for k, raw in self.store.txn().cursor(db=self.store.graph) if _REC.unpack(raw)[2]]
        changed: dict[bytes, None] = {}
        self._vouch_all(work, changed)

    def _tell(self, changed: dict) -> None:
        if changed:
            dks = list(changed)
            for fn in self._listeners:
                fn(dks)

    # -- reading ------------------------------------------------------------------------------
    def indegree(self, pld: str) -> int:
        """Distinct other domains whose vouch for ``pld`` counts (all that link to it in mode "all")."""
        return self.indegree_key(domain_key(pld))

    def indegree_key(self, dk: bytes) -> int:
        r = self._records.peek(dk)
        if r is not None:
            return r.indeg
        return self._records.get(dk).indeg

    def unvouched_key(self, dk: bytes) -> bool:
        """True while no link to domain ``dk`` counts (in-degree 0) and it is not a trust root."""
        r = self._records.peek(dk)
        if r is None:
            r = self._records.get(dk)
        return r.indeg == 0 and not r.flags & ROOT

    def standing_key(self, dk: bytes) -> tuple[int, bool]:
        """``(indegree_key(dk), unvouched_key(dk))`` from one read of its record (intake, per domain)."""
        r = self._records.peek(dk)
        if r is None:
            r = self._records.get(dk)
        return r.indeg, r.indeg == 0 and not r.flags & ROOT

    def is_root(self, pld: str) -> bool:
        return bool(self._records.get(domain_key(pld)).flags & ROOT)

    def record(self, pld: str) -> GraphRecord:
        r = self._records.get(domain_key(pld))
        return GraphRecord(r.indeg, r.cast, r.pending, r.flags)

    def add_listener(self, fn: Callable[[list[bytes]], None]) -> None:
        """Call ``fn(domain keys)`` with the domains whose in-degree rose, inside the applying transaction."""
        self._listeners.append(fn)

    @property
    def applied_seq(self) -> int:
        return self._applied_seq

    @property
    def cached(self) -> int:
        return len(self._records)

    def stats(self, top: int = 10) -> dict:
        st = self.store
        return {**self._c, "mode": self.mode, "vouch_ratio": self.vouch_ratio,
                "domains": st.count(st.graph), "votes_waiting": self._votes,
                "top_indegree": [{"domain": domain_name(dk), "indegree": v} for dk, v in self._top.top(top)]}

    def top(self, n: int) -> list[bytes]:
        return [dk for dk, _ in self._top.top(n)]

    def check_invariants(self) -> None:
        """Scan the tables and raise AssertionError naming the first broken invariant."""
        self.store.commit()
        st = self.store
        txn = st.txn()
        waiting: dict[bytes, int] = {}
        for k, v in txn.cursor(db=st.votes):
            src = bytes(k[:-9])
            waiting[src] = waiting.get(src, 0) + bytes(v).count(b"\0") + 1
        assert sum(waiting.values()) == self._votes, f"{sum(waiting.values())} votes stored, {self._votes} counted"
        indeg = cast = 0
        for dk, raw in txn.cursor(db=st.graph):
            r = GraphRecord(*_REC.unpack(raw))
            indeg += r.indeg
            cast += r.cast
            name = domain_name(dk)
            assert r.pending == waiting.pop(dk, 0), f"{name}: pending {r.pending} != stored votes"
            assert r.pending == 0 or r.cast >= self._limit(r), f"{name}: votes wait though it may vouch"
        assert not waiting, f"votes of domains without a record: {sorted(waiting)[:3]}"
        # vouches handed to other shards count there; those handed here were cast there
        handed, received = self._c["vouches_handed"], self._c["vouches_received"]
        assert indeg == cast - handed + received, \
            f"in-degrees add up to {indeg}, vouches cast to {cast} ({handed} handed away, {received} received)"

    # -- records ------------------------------------------------------------------------------
    def _flush(self) -> None:
        self._records.flush()
        if self.store.save_slow or self._saved_top is None:
            self._saved_top = self._top.saved()
        self.store.put_meta(b"graph", {"applied_seq": self._applied_seq, "vseq": self._vseq, "votes": self._votes,
                                       "counters": self._c,
                                       "top": self._saved_top, "params": self._params})
