"""Per-domain crawl budgets against spam and traps: STAR and BEAST (IRLbot, Lee et al., TWeb 2009, §5).

STAR (Spam Tracking and Avoidance through Reputation)
    A pay-level domain's (PLD, ``url.registered_domain``) reputation is its in-degree in the PLD graph:
    how many *other* PLDs link to it. Hostnames and pages under one PLD cost a spammer nothing, links
    from domains he does not own do, so links inside a PLD never count. :class:`DomainGraph` records the
    (source PLD, target PLD) edges of every processed page and deduplicates them with its own DRUM
    (IRLbot §4), so RAM does not grow with the number of edges and each edge counts once.

BEAST (Budget Enforcement with Anti-Spam Tactics)
    A domain may admit ``budget = min(max_budget, base_budget + per_inlink x in-degree)`` URLs per
    cycle. ``Budgets.admit`` charges a new URL to its domain while under budget; over budget the
    caller hands it to ``Budgets.defer``, which keeps it in LMDB instead of dropping it (ARCHITECTURE.md invariant 3).
    Deferred URLs come back through ``Budgets.readmit`` when their domain's budget grows (checked
    whenever its in-degree rises) or in a later cycle (``Budgets.new_cycle`` restarts every spent
    count at 0), oldest first per domain. While a domain has deferred URLs its new URLs queue behind
    them, so a domain's URLs leave in the order they arrived.

Durability (both classes share one LMDB environment and its one write transaction)
    ``defer`` and ``readmit`` write into the open transaction; ``commit`` makes it durable. The shard
    commits deferrals before its seen-set acknowledges the answers they came from, and commits
    readmissions after the frontier has queued them: a crash then loses nothing and at worst readmits
    a URL twice. ``DomainGraph.poll`` applies in-degree changes and the readmission marks they cause in
    one commit, then acknowledges its DRUM; answers the DRUM delivers again after a crash are
    recognised by their sequence number and not counted twice.
"""

from __future__ import annotations

import json
import os
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

import lmdb
import xxhash

from crawlerd.seen.drum import Drum

_U64BE = struct.Struct(">Q")
_U64 = struct.Struct("<Q")
_DOM = struct.Struct("<QQQQ")            # spent, deferred, cycle, grown seq
_MAX_KEY = 255


class BudgetsCorrupt(Exception):
    """The budget tables disagree with each other (a damaged LMDB file)."""


def domain_key(pld: str) -> bytes:
    """LMDB key of a domain: its UTF-8 name, or a hash for names LMDB keys cannot hold."""
    b = pld.encode("utf-8", "surrogateescape")
    if len(b) > _MAX_KEY or b"\0" in b or not b:
        return b"#" + xxhash.xxh3_64_hexdigest(b).encode()
    return b


def _name(dk: bytes) -> str:
    return dk.decode("utf-8", "surrogateescape")


class BudgetStore:
    """The LMDB environment of the budget stage; one write transaction open at a time.

    Tables (keys: domain key = :func:`domain_key`; numbers big-endian where they order keys):

    ``indeg``     domain key -> u64 in-degree. Invariant: the number of distinct other domains whose
                  edge to it the graph has applied.
    ``domains``   domain key -> spent, deferred, cycle, grown seq (``_DOM``). Invariant: ``deferred``
                  is the number of its entries in ``deferred``; ``spent`` counts the cycle ``cycle``.
    ``deferred``  domain key | NUL | seq u64 -> caller's record. One FIFO per domain, by global seq.
    ``backlog``   domain key -> empty. Invariant: present iff the domain's ``deferred`` > 0.
    ``grown``     seq u64 -> domain key. Invariant: present iff that domain's grown seq is ``seq`` != 0;
                  a domain with deferred URLs and room under its budget is here (or not yet swept).
    ``meta``      JSON state of the graph and of the budgets.

    ``commit`` runs the registered hooks (write-back caches) before it commits, so every commit
    is a consistent state.
    """

    def __init__(self, path: str, *, map_size_bytes: int, sync: bool):
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.sync = sync
        self.env = lmdb.open(path, map_size=map_size_bytes, max_dbs=8, sync=sync, metasync=False,
                             readahead=False, meminit=False)
        self.indeg = self.env.open_db(b"indeg")
        self.domains = self.env.open_db(b"domains")
        self.deferred = self.env.open_db(b"deferred")
        self.backlog = self.env.open_db(b"backlog")
        self.grown = self.env.open_db(b"grown")
        self.meta = self.env.open_db(b"meta")
        self._txn: lmdb.Transaction | None = None
        self._hooks: list[Callable[[], None]] = []

    def txn(self) -> lmdb.Transaction:
        if self._txn is None:
            self._txn = self.env.begin(write=True)
        return self._txn

    def add_hook(self, fn: Callable[[], None]) -> None:
        self._hooks.append(fn)

    def get_meta(self, name: bytes) -> dict:
        raw = self.txn().get(name, db=self.meta)
        return json.loads(raw) if raw else {}

    def put_meta(self, name: bytes, doc: dict) -> None:
        self.txn().put(name, json.dumps(doc, sort_keys=True).encode(), db=self.meta)

    def count(self, db) -> int:
        return self.txn().stat(db)["entries"]

    def commit(self) -> None:
        self.txn()
        for fn in self._hooks:
            fn()
        txn, self._txn = self._txn, None
        txn.commit()

    def close(self) -> None:
        self.commit()
        self._hooks = []
        self.env.close()


class _TopK:
    """The k domains with the largest value (spent, in-degree), exact.

    Key: domain key -> its value when last noted. Invariant: every domain whose value exceeds
    ``floor`` is here (values only grow between resets, and every change is noted); at most 2k
    entries, trimmed back to the k largest, whose smallest value becomes the floor.
    """

    __slots__ = ("k", "floor", "values")

    def __init__(self, k: int, saved: Iterable | None = None):
        self.k = k
        self.floor = 0
        self.values: dict[bytes, int] = {}
        for name, v in saved or ():
            self.values[domain_key(name)] = v
        self._trim()

    def note(self, dk: bytes, value: int) -> None:
        if value > self.floor or dk in self.values:
            self.values[dk] = value
            if len(self.values) > 2 * self.k:
                self._trim()

    def _trim(self) -> None:
        kept = sorted(self.values.items(), key=lambda kv: -kv[1])[:self.k]
        self.values = dict(kept)
        self.floor = kept[-1][1] if len(kept) == self.k else 0

    def top(self, n: int) -> list[tuple[bytes, int]]:
        return sorted(self.values.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def saved(self) -> list:
        return [[_name(dk), v] for dk, v in self.top(self.k)]

    def clear(self) -> None:
        self.values = {}
        self.floor = 0


class DomainGraph:
    """The PLD link graph, kept as unique edges (in a DRUM) and in-degrees (in LMDB).

    Key: ``xxh3_64(source PLD | NUL | target PLD)`` in the DRUM; target domain key -> in-degree in
    ``indeg``. Invariant: a target's in-degree is the number of distinct other source PLDs among the
    edges the DRUM has answered and ``poll`` applied (``applied_seq``: every answer below it is
    counted once). RAM: the DRUM's buffers and an LRU of ``lru_entries`` in-degrees.
    """

    def __init__(self, path: str, *, lru_entries: int = 1 << 16, map_size_bytes: int = 16 << 30,
                 sync: bool = True, drum_buckets: int = 16, drum_bucket_buffer_bytes: int = 256 << 10,
                 drum_merge_bytes: int = 64 << 20, drum_max_age_s: float = 30.0,
                 drum_cache_entries: int = 1 << 18, clock: Callable[[], float] = time.monotonic,
                 top_n: int = 20):
        if lru_entries < 1:
            raise ValueError("lru_entries must be >= 1")
        self.path = path
        self.store = BudgetStore(os.path.join(path, "state"), map_size_bytes=map_size_bytes, sync=sync)
        try:
            self._drum = Drum(os.path.join(path, "edges"), buckets=drum_buckets,
                              bucket_buffer_bytes=drum_bucket_buffer_bytes, merge_bytes=drum_merge_bytes,
                              max_age_s=drum_max_age_s, cache_entries=drum_cache_entries, clock=clock,
                              auto_ack=False)
        except BaseException:
            self.store.env.close()
            raise
        self._lru_entries = lru_entries
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self._listeners: list[Callable[[list[bytes]], None]] = []
        meta = self.store.get_meta(b"graph")
        self._applied_seq: int = meta.get("applied_seq", 0)
        self._c = {"edges_submitted": 0, "edges_unique": 0, "edges_duplicate": 0, "redelivered_skipped": 0}
        self._c.update(meta.get("counters", {}))
        self._top = _TopK(top_n, meta.get("top"))
        self.store.add_hook(self._save_meta)

    # -- recording ----------------------------------------------------------------------------
    def add_edges(self, src_pld: str, targets: Iterable[str]) -> int:
        """Record the links of one page from ``src_pld`` to the given PLDs; returns edges submitted.

        Links to the page's own PLD and repeats within the call are left out; repeats across calls
        and pages are left to the DRUM.
        """
        src = src_pld.encode("utf-8", "surrogateescape") + b"\0"
        keys, aux = [], []
        h = xxhash.xxh3_64_intdigest
        for dst in set(targets):
            if not dst or dst == src_pld:
                continue
            d = dst.encode("utf-8", "surrogateescape")
            keys.append(h(src + d))
            aux.append(domain_key(dst))
        if keys:
            self._drum.check_update(keys, aux=aux)
            self._c["edges_submitted"] += len(keys)
        return len(keys)

    def poll(self, now: float | None = None) -> int:
        """Merge edges if a DRUM trigger fired and apply the answers; returns unique edges applied."""
        self._drum.poll(now)
        return self._apply() if self._drum.ready else 0

    def flush(self) -> int:
        """Merge every pending edge now and apply the answers; returns unique edges applied."""
        self._drum.flush()
        return self._apply()

    def _apply(self) -> int:
        txn, idb = self.store.txn(), self.store.indeg
        changed: dict[bytes, None] = {}
        unique = 0
        applied = self._applied_seq
        for r in iter(self._drum.results, []):
            for res in r:
                if res.seq < applied:
                    self._c["redelivered_skipped"] += 1
                    continue
                applied = res.seq + 1
                if not res.unique:
                    self._c["edges_duplicate"] += 1
                    continue
                unique += 1
                dk = res.aux
                n = self._indeg(dk) + 1
                txn.put(dk, _U64.pack(n), db=idb)
                self._cache[dk] = n
                self._top.note(dk, n)
                changed[dk] = None
        self._applied_seq = applied
        self._c["edges_unique"] += unique
        if changed:
            for fn in self._listeners:
                fn(list(changed))
        self.store.commit()
        self._drum.ack()
        return unique

    # -- reading ------------------------------------------------------------------------------
    def indegree(self, pld: str) -> int:
        """Distinct other PLDs known to link to ``pld``."""
        return self._indeg(domain_key(pld))

    def indegree_key(self, dk: bytes) -> int:
        """``indegree`` by domain key (:func:`domain_key`)."""
        return self._indeg(dk)

    def _indeg(self, dk: bytes) -> int:
        c = self._cache
        n = c.get(dk)
        if n is not None:
            c.move_to_end(dk)
            return n
        raw = self.store.txn().get(dk, db=self.store.indeg)
        n = _U64.unpack(raw)[0] if raw else 0
        c[dk] = n
        if len(c) > self._lru_entries:
            c.popitem(last=False)
        return n

    def add_listener(self, fn: Callable[[list[bytes]], None]) -> None:
        """Call ``fn(domain keys)`` with the domains whose in-degree rose, inside the applying commit."""
        self._listeners.append(fn)

    @property
    def pending(self) -> int:
        """Edges submitted and not yet applied."""
        return self._drum.pending

    @property
    def cached(self) -> int:
        return len(self._cache)

    def stats(self, top: int = 10) -> dict:
        return {**self._c, "domains_linked": self.store.count(self.store.indeg), "pending": self.pending,
                "drum_keys": len(self._drum), "drum_disk_bytes": self._drum.disk_bytes(),
                "top_indegree": [{"domain": _name(dk), "indegree": v} for dk, v in self._top.top(top)]}

    def _save_meta(self) -> None:
        self.store.put_meta(b"graph", {"applied_seq": self._applied_seq, "counters": self._c,
                                       "top": self._top.saved()})

    def commit(self) -> None:
        self.store.commit()

    def close(self) -> None:
        """Commit and close; edges not yet merged stay in the DRUM journal and are applied after reopening."""
        try:
            self.store.close()
        finally:
            self._drum.close()


class _Dom:
    __slots__ = ("spent", "deferred", "cycle", "grown")

    def __init__(self, spent: int, deferred: int, cycle: int, grown: int):
        self.spent = spent
        self.deferred = deferred
        self.cycle = cycle
        self.grown = grown


class Budgets:
    """BEAST over the graph's in-degrees: admit, defer, readmit (see the module docstring).

    Key: domain key -> its record (``domains``), cached write-back in an LRU of ``cache_entries``.
    Invariants (``check_invariants`` proves them): a domain's ``deferred`` equals its entries in the
    deferred table; it is in ``backlog`` iff that is > 0; ``spent`` never exceeds the budget it had
    when charged; a domain with deferred URLs and room under its budget is in ``grown`` (or waits in
    the unswept part of ``backlog`` after a new cycle).
    """

    def __init__(self, graph: DomainGraph, *, base_budget: int, per_inlink: int, max_budget: int,
                 cache_entries: int = 1 << 16, sweep_step: int = 1024, top_n: int = 20):
        if min(base_budget, cache_entries, sweep_step) < 1 or per_inlink < 0 or max_budget < base_budget:
            raise ValueError("need base_budget >= 1, per_inlink >= 0, max_budget >= base_budget, "
                             "cache_entries >= 1, sweep_step >= 1")
        self.base_budget = base_budget
        self.per_inlink = per_inlink
        self.max_budget = max_budget
        self._graph = graph
        self._st = graph.store
        self._cap = cache_entries
        self._sweep_step_n = sweep_step
        self._cache: OrderedDict[bytes, _Dom] = OrderedDict()
        self._dirty: set[bytes] = set()
        meta = self._st.get_meta(b"budgets")
        self._c = dict.fromkeys(("admitted", "refused", "deferred", "readmitted", "seq", "gseq", "cycle"), 0)
        self._c.update(meta.get("counters", {}))
        self.cycle_started_at: float | None = meta.get("cycle_started_at")   # caller's wall clock, seconds
        self._sweep: str | None = meta.get("sweep")      # backlog key (as name) the sweep continues after
        self._top = _TopK(top_n, meta.get("top"))
        params = [base_budget, per_inlink, max_budget]
        if meta and meta.get("params") != params and self._sweep is None:
            self._sweep = ""      # budgets may have grown: look at every backlogged domain once
        self._params = params
        self._st.add_hook(self._flush)
        graph.add_listener(self._grew)

    # -- the rule -----------------------------------------------------------------------------
    def budget(self, pld: str) -> int:
        """URLs ``pld`` may admit per cycle: base + per_inlink x in-degree, capped (STAR)."""
        return self._budget(domain_key(pld))

    def _budget(self, dk: bytes) -> int:
        return min(self.max_budget, self.base_budget + self.per_inlink * self._graph.indegree_key(dk))

    def spent(self, pld: str) -> int:
        return self._get(domain_key(pld)).spent

    def deferred_of(self, pld: str) -> int:
        return self._get(domain_key(pld)).deferred

    def admit(self, pld: str) -> bool:
        """Charge one new URL of ``pld``; False when over budget or behind deferred ones (defer it)."""
        dk = domain_key(pld)
        d = self._get(dk)
        if d.deferred == 0 and (d.spent < self.base_budget or d.spent < self._budget(dk)):
            d.spent += 1
            self._dirty.add(dk)
            self._c["admitted"] += 1
            self._top.note(dk, d.spent)
            return True
        self._c["refused"] += 1
        return False

    def defer(self, pld: str, record: bytes) -> None:
        """Keep a URL record of ``pld`` until its budget allows it (BEAST); durable at ``commit``."""
        dk = domain_key(pld)
        d = self._get(dk)
        txn = self._st.txn()
        seq = self._c["seq"]
        self._c["seq"] = seq + 1
        txn.put(dk + b"\0" + _U64BE.pack(seq), record, db=self._st.deferred)
        if d.deferred == 0:
            txn.put(dk, b"", db=self._st.backlog)
        d.deferred += 1
        self._dirty.add(dk)
        self._c["deferred"] += 1
        if d.grown == 0 and d.spent < self._budget(dk):
            self._mark_grown(dk, d)

    def readmit(self, limit: int) -> list[bytes]:
        """Up to ``limit`` deferred records whose domains now have room, oldest first per domain.

        They are charged to their domains. Queue them, then ``commit``: a crash before the commit
        hands them out again (never loses them).
        """
        out: list[bytes] = []
        if limit <= 0:
            return out
        if self._sweep is not None:
            self._sweep_step(self._sweep_step_n)
        st = self._st
        txn = st.txn()
        gcur = txn.cursor(db=st.grown)
        dcur = txn.cursor(db=st.deferred)
        while len(out) < limit and gcur.first():
            dk = gcur.value()
            d = self._get(dk)
            budget = self._budget(dk)
            n = min(budget - d.spent, d.deferred, limit - len(out))
            if n > 0:
                prefix = dk + b"\0"
                dcur.set_range(prefix)
                for _ in range(n):
                    key = dcur.key()
                    if not key.startswith(prefix):
                        raise BudgetsCorrupt(f"budgets: domain {_name(dk)!r} has fewer deferred records "
                                                  f"than its count {d.deferred}")
                    out.append(dcur.value())
                    dcur.delete()
                d.spent += n
                d.deferred -= n
                self._dirty.add(dk)
                self._c["readmitted"] += n
                self._top.note(dk, d.spent)
                if d.deferred == 0:
                    txn.delete(dk, db=st.backlog)
            if d.deferred == 0 or d.spent >= budget:
                gcur.delete()
                d.grown = 0
                self._dirty.add(dk)
            else:
                break
        return out

    @property
    def cycle(self) -> int:
        return self._c["cycle"]

    def new_cycle(self, at: float | None = None) -> None:
        """Start a budget cycle (at wall time ``at``): spent counts restart, backlogs become readmittable.

        IRLbot re-reads its overflow queue each cycle so a domain's deferred URLs are never stuck.
        """
        self.cycle_started_at = at
        self._c["cycle"] += 1
        for d in self._cache.values():
            self._renew(d)
        self._dirty.update(self._cache)
        self._top.clear()
        self._sweep = ""

    def commit(self) -> None:
        self._st.commit()

    def close(self) -> None:
        self._st.commit()

    # -- stats and checks -------------------------------------------------------------------
    def stats(self, top: int = 10) -> dict:
        st, c = self._st, self._c
        tops = [{"domain": _name(dk), "spent": v, "budget": self._budget(dk),
                 "indegree": self._graph.indegree_key(dk), "deferred": self._get(dk).deferred}
                for dk, v in self._top.top(top)]
        return {"base_budget": self.base_budget, "per_inlink": self.per_inlink, "max_budget": self.max_budget,
                "cycle": c["cycle"], "cycle_started_at": self.cycle_started_at, "admitted": c["admitted"],
                "refused": c["refused"], "deferred_total": c["deferred"], "readmitted": c["readmitted"],
                "deferred_now": st.count(st.deferred), "domains_backlogged": st.count(st.backlog),
                "domains_readmittable": st.count(st.grown), "sweeping": self._sweep is not None,
                "top_spenders": tops, "graph": self._graph.stats(top)}

    def check_invariants(self) -> None:
        """Scan every table and raise AssertionError naming the first broken invariant."""
        self._st.commit()
        txn, st = self._st.txn(), self._st
        counts: dict[bytes, int] = {}
        for k in txn.cursor(db=st.deferred).iternext(values=False):
            dk = k[:-9]
            counts[dk] = counts.get(dk, 0) + 1
        backlog = set(txn.cursor(db=st.backlog).iternext(values=False))
        grown = {v: _U64BE.unpack(k)[0] for k, v in txn.cursor(db=st.grown)}
        assert backlog == set(counts), "backlog is not the set of domains with deferred records"
        sweep = None if self._sweep is None else self._sweep.encode("utf-8", "surrogateescape")
        for dk, raw in txn.cursor(db=st.domains):
            d = _Dom(*_DOM.unpack(raw))
            assert d.deferred == counts.get(dk, 0), f"{_name(dk)}: count {d.deferred} != {counts.get(dk, 0)}"
            assert (d.grown != 0) == (dk in grown), f"{_name(dk)}: grown seq {d.grown} vs table"
            assert d.grown == 0 or grown[dk] == d.grown, f"{_name(dk)}: grown seq mismatch"
            spent = d.spent if d.cycle == self._c["cycle"] else 0
            budget = self._budget(dk)
            assert spent <= budget, f"{_name(dk)}: spent {spent} over budget {budget}"
            if d.deferred and spent < budget and (sweep is None or dk <= sweep):
                assert dk in grown, f"{_name(dk)}: room and deferred records but not readmittable"
            counts.pop(dk, None)
        assert not counts, f"deferred records of domains without a record: {sorted(counts)[:3]}"
        assert set(grown) <= backlog, "a readmittable domain has no deferred records"

    @property
    def cached(self) -> int:
        return len(self._cache)

    # -- internals ------------------------------------------------------------------------------
    def _renew(self, d: _Dom) -> None:
        if d.cycle != self._c["cycle"]:
            d.cycle = self._c["cycle"]
            d.spent = 0

    def _get(self, dk: bytes) -> _Dom:
        c = self._cache
        d = c.get(dk)
        if d is None:
            raw = self._st.txn().get(dk, db=self._st.domains)
            d = _Dom(*_DOM.unpack(raw)) if raw else _Dom(0, 0, self._c["cycle"], 0)
            c[dk] = d
            if len(c) > self._cap:
                old, od = c.popitem(last=False)
                if old in self._dirty:
                    self._dirty.discard(old)
                    self._put(old, od)
        else:
            c.move_to_end(dk)
        if d.cycle != self._c["cycle"]:
            self._renew(d)
            self._dirty.add(dk)
        return d

    def _put(self, dk: bytes, d: _Dom) -> None:
        self._st.txn().put(dk, _DOM.pack(d.spent, d.deferred, d.cycle, d.grown), db=self._st.domains)

    def _mark_grown(self, dk: bytes, d: _Dom) -> None:
        seq = self._c["gseq"] + 1
        self._c["gseq"] = seq
        self._st.txn().put(_U64BE.pack(seq), dk, db=self._st.grown)
        d.grown = seq
        self._dirty.add(dk)

    def _grew(self, dks: list[bytes]) -> None:
        # In-degree rose (STAR): a backlogged domain with room becomes readmittable.
        txn, ddb = self._st.txn(), self._st.domains
        for dk in dks:
            if dk not in self._cache:
                raw = txn.get(dk, db=ddb)
                if raw is None or _DOM.unpack(raw)[1] == 0:
                    continue
            d = self._get(dk)
            if d.deferred and d.grown == 0 and d.spent < self._budget(dk):
                self._mark_grown(dk, d)

    def _sweep_step(self, n: int) -> None:
        # After a new cycle or a budget change: visit backlogged domains in key order, n per call.
        after = self._sweep.encode("utf-8", "surrogateescape")
        cur = self._st.txn().cursor(db=self._st.backlog)
        found = cur.set_range(after) if after else cur.first()
        if found and cur.key() == after:
            found = cur.next()
        keys = []
        while found and len(keys) < n:
            keys.append(cur.key())
            found = cur.next()
        for dk in keys:
            d = self._get(dk)
            if d.deferred and d.grown == 0 and d.spent < self._budget(dk):
                self._mark_grown(dk, d)
        self._sweep = _name(keys[-1]) if found else None

    def _flush(self) -> None:
        for dk in self._dirty:
            d = self._cache.get(dk)
            if d is not None:
                self._put(dk, d)
        self._dirty.clear()
        self._st.put_meta(b"budgets", {"counters": self._c, "sweep": self._sweep, "params": self._params,
                                       "top": self._top.saved(), "cycle_started_at": self.cycle_started_at})
