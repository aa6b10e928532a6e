"""BEAST (Budget Enforcement with Anti-Spam Tactics, IRLbot §7): URLs over budget wait, never drop.

Queues. The reader stands on one BEAST queue at a time (``reader``). While it stands there a
domain may pass ``budget`` URLs to the frontier (``rule.BudgetRule`` of its STAR in-degree); the
rest of its URLs wait in its FIFO (``deferred``), and the domain is listed in the next queue it
will pass URLs in: its first ``budget`` waiting URLs in the next queue to be read, the next
``budget`` in the queue after that, and so on. Moving the reader to a queue passes every domain
listed there its next budget, oldest URLs first. A URL is thus placed in queue
``reader + 1 + position // budget`` exactly as IRLbot spreads it, without writing it again at every
step: only a domain's place is kept, so a pass costs O(1) per URL passed. The listings and the
walk over them are the ``reader``'s (``QueueReader``); this module decides what passes and where
a domain is listed next.

Hosts in turn. A domain's FIFO is ordered by host turn, then arrival: a host's k-th waiting URL
takes turn ``max(k, domain turn)``, where the domain turn is the turn of the last URL passed (a
host that was idle, or is new, starts at the current turn: start-time fair queueing, one queue
per host without a table per host). A pass thus hands out the first waiting URL of every host
before the second of any, so a domain with many hosts (a university, a hosting provider, every
host of a crawl under one domain) spreads its budget over its hosts, and the frontier gets hosts
to fetch in parallel rather than one host's backlog to wait out gap by gap.

Geometric spreading. The queues come in windows; the first holds ``queues`` queues and each
wrap-around (the reader passing the end of the window) doubles the next window. A domain that
is still over budget when the reader wraps around has its passes spread twice as far apart
(every 2, 4, 8, ... queues, at most ``max_spread``): a spammer with endless URLs gets about
``queues`` passes per window, so its share shrinks as the crawl goes on, while a domain whose
backlog runs dry starts again at every queue. Delayed, never dropped.

Probation (``probation``). A domain no counted link vouches for (in-degree 0) and that is not a
trust root passes nothing at intake: its URLs wait for the next queue the reader moves to, and pass
there at its base budget; still over budget, it passes next in the first queue of the next window
(one pass per window: 1, 8, 24, 56, ... for ``queues`` = 8), where a vouched domain passes every
``2**level`` queues. A vouch that raises its in-degree lets it pass at once (the graph's listener).
So a farm of fresh domains that only link to each other costs no fetch while honest work is ready
and its share shrinks geometrically from its first pass, instead of ``base_budget`` per domain in
every queue the reader reads. The crawl stays work-conserving: the reader moves on as soon as the
frontier runs short and skips empty queues, so a web nobody vouches for is read window by window.

Due now. A waiting domain listed in a later queue that gets room in the reader's queue (its
in-degree rose: the graph's listener; a refund) passes at once, in the reader's queue, its place
in the queues kept (``reader``: the reader's position, the queues table, the walk and the due set).

Work-conserving. The reader does not move on a timer: the caller moves it
(``readmit(advance=True)``) as soon as the frontier runs short of ready hosts, and empty queues
are skipped, so a crawl with one domain (every host under one PLD) runs at the politeness limit.

Charge point: a URL is charged to its domain when it passes to the frontier (``offer`` or
``readmit``); a URL the frontier then drops (blocked host, DNS failure) is refunded (``refund``)
while the reader is still on the queue it was charged in. The budget is read with the current
in-degree at each charge, and a rise in in-degree lets a waiting domain pass more at once (the
graph's listener).

Durability: everything is written into the shared store's transaction. The shard commits
deferrals before the seen-set acknowledges the answers they came from, and commits readmissions
after the frontier has queued them: a crash loses nothing and at worst queues a URL twice. The
charges of a domain that deferred nothing (it passed URLs at intake, or got a refund) are written
``store.SOFT_COMMITS`` commits later rather than at the next one (``RecordCache.changed_soft``; at
close, all): a domain passing URLs at every commit costs one record write per few seconds, not one
per commit. A kill -9 may thus forget the last few seconds of such charges, so such a domain may
pass up to one budget more in the reader's queue after a restart; a deferral, a pass from the FIFO
and a domain's place in the queues are written at the next commit, as before. A kill -9 also
forgets which domains were due now (``reader``: "Durability"); no URL is lost.
"""

from __future__ import annotations

import struct
from bisect import bisect_right

import xxhash

from crawlerd.frontier.budgets import audit, fifo
from crawlerd.frontier.budgets.fifo import blocks_by
from crawlerd.frontier.budgets.graph import DomainGraph
from crawlerd.frontier.budgets.reader import BeastCorrupt, QueueReader
from crawlerd.frontier.budgets.rule import BudgetRule
from crawlerd.frontier.budgets.store import (
    RECORD,
    BudgetStore,
    DomainRecord,
    KeyMemo,
    RecordCache,
    domain_key,
    domain_name,
)
from crawlerd.frontier.budgets.topk import TopK
from crawlerd.layout import StateFormatError

_U64BE = struct.Struct(">Q")
_FP = struct.Struct("<Q")
FIFO_FORMAT = 5                        # 5: the domain records in ``deferred`` (key | RECORD); 4: the first
#                                        host's turn in the domain record, a delivery's votes of a source
#                                        one entry (``graph``); 3: a host's run is one entry (``fifo``);
#                                        2: one key per URL; 1: no turn
EXPLAIN_SCAN = 200_000                 # deferred URLs of one domain ``explain`` walks at most


def _move_records(store: BudgetStore) -> None:
    """FIFO format 4 and before: the domain records from ``domains`` to ``deferred`` (key | ``RECORD``),
    in the open transaction (committed with the new format's meta)."""
    txn = store.txn()
    if not txn.stat(store.domains)["entries"]:
        return
    rows = [(bytes(k) + RECORD, bytes(v)) for k, v in txn.cursor(db=store.domains)]
    txn.cursor(db=store.deferred).putmulti(rows)
    txn.drop(store.domains, delete=False)


def _host_hash_of(host: str) -> tuple[int, bytes]:
    h = xxhash.xxh3_64_intdigest(host.encode("utf-8", "surrogateescape"))
    return h, _FP.pack(h)


# a host key's hash and its part of its ``turns`` key (a page's links share hosts: memoised, read once per run)
_host_hashes = KeyMemo(_host_hash_of, 1 << 16)


class Beast:
    """The BEAST queues over the graph's in-degrees (see the module docstring).

    Key: domain key -> :class:`DomainRecord`, cached in an LRU of ``cache_entries`` (records
    changed since the last commit stay in RAM until it). Invariants (``check_invariants``): a
    domain's ``deferred`` equals its entries in the deferred table; it is listed in exactly one
    queue iff it has deferred URLs, and no listed queue is behind the reader (``QueueReader``).
    """

    def __init__(self, store: BudgetStore, graph: DomainGraph, rule: BudgetRule, *, queues: int = 8,
                 max_spread: int = 1024, cache_entries: int = 1 << 16, top_n: int = 20, probation: bool = False):
        if queues < 1 or max_spread < 1 or max_spread & (max_spread - 1) or cache_entries < 1:
            raise ValueError("need queues >= 1, max_spread a power of two >= 1, cache_entries >= 1")
        self.store = store
        self.graph = graph
        self.rule = rule
        self.queues = queues
        self.max_spread = max_spread
        self.probation = probation
        self._max_level = max_spread.bit_length() - 1
        self._records = RecordCache(store, store.deferred, DomainRecord.decode,
                                    lambda: DomainRecord(at=self._reader.queue), cache_entries, suffix=RECORD)
        meta = store.get_meta(b"beast")
        self._seq: int = meta.get("seq", 0)
        counters = dict(meta.get("counters", {}))
        self._reader = QueueReader(store, meta, queues, advances=counters.pop("advances", 0))  # it counts its moves
        self._c = dict.fromkeys(("admitted", "deferred", "readmitted", "refunded", "passes", "probation"), 0)
        self._c.update(counters)
        self._top_admitted = TopK(top_n, meta.get("top_admitted"))
        self._top_deferred = TopK(top_n, meta.get("top_deferred"))
        self._saved_tops: tuple[list, list] | None = None
        self._runs = fifo.RunBuffer()                     # deferred URLs not yet in the table
        self._turns: dict[bytes, dict[bytes, int]] = {}   # domain key -> turns key -> next turn, changed since the last commit
        if meta.get("fifo", 1) > FIFO_FORMAT:     # its entries may not mean what this code reads
            raise StateFormatError(f"{store.path}: BEAST's deferred FIFOs are of format {meta['fifo']}, written by a "
                                   f"newer crawlerd (this one reads formats 1 to {FIFO_FORMAT})")
        # URLs waiting (table and buffer); before runs, an entry was a URL
        self._waiting: int = meta["waiting"] if "waiting" in meta else store.count(store.deferred)
        if meta.get("fifo", 1) < 2:
            fifo.upgrade_v1(store.txn(), store.deferred)
        if meta.get("fifo", 1) < 5:
            _move_records(store)
        if meta.get("fifo", 1) < FIFO_FORMAT:
            self._flush()           # the new format's meta, with what was rewritten (one commit)
        reader = self._reader
        for dk in reader.saved_due(meta):            # saved at close (see "Due now")
            if reader.waits_later(self._records.get(dk)):
                reader.make_due(dk)
        store.add_hook(self._flush, self._unwritten)
        graph.add_listener(self._grew)

    # -- intake -------------------------------------------------------------------------------
    def budget(self, pld: str) -> int:
        """URLs ``pld`` may pass per queue now (STAR)."""
        return self._budget(domain_key(pld))

    def _budget(self, dk: bytes) -> int:
        return self.rule.budget(self.graph.indegree_key(dk))

    def offer(self, pld: str, record: bytes, fp: int = 0, host: str = "") -> bool:
        """A new URL of ``pld``: True if it passes now (charged), False if it waits (kept in its FIFO).

        ``fp`` (the URL's fingerprint) lets ``explain`` find it; 0 when unknown. ``host``: the URL's
        host key, which sets its turn in the FIFO (see "Hosts in turn"). Durable at commit.
        """
        dk = domain_key(pld)
        d = self._records.get(dk)
        r = self._reader.queue
        if d.at != r:
            d.at, d.spent = r, 0
        if d.deferred == 0 and d.spent < self._budget(dk):
            if not (self.probation and self.graph.unvouched_key(dk)):
                d.spent += 1
                d.admitted += 1
                self._records.changed_soft(dk, d)     # a crash may lose a charge (see "Charge point")
                self._c["admitted"] += 1
                self._top_admitted.note(dk, d.admitted)
                return True
            self._c["probation"] += 1             # nobody vouches for it yet: the next queue, not now
        if d.deferred == 0:                       # a new backlog: its next pass is in the next queue
            d.level, d.wrap = 0, self._reader.wraps
            self._reader.list_in(dk, d, r + 1)
        self._append(dk, d, record, fp, host)
        return False

    def offer_many(self, dks: list[bytes], records: list[bytes], fps: list[int], hosts: list[str]) -> list[bool]:
        """``offer`` for several URLs in order (parallel lists: domain key, record, fingerprint, host
        key), with the same decisions and state as one ``offer`` each; returns passed or not, per URL."""
        return self.offer_groups(blocks_by(dks), records, fps, hosts)

    def offer_groups(self, groups: dict[bytes, list[tuple[int, int]]], records: list[bytes], fps: list[int],
                     hosts: list[str]) -> list[bool]:
        """``offer_many`` with the URLs given per domain: domain key -> its consecutive blocks (first,
        end) in order, the domains in the order of their first URL (``Budgets.offer_many``: one block
        per run of a host's URLs).

        A domain's URLs in the call (a page's links share a few hosts; a delivery's pages link
        the same domains again) read its record, budget and probation once and pass or defer
        together, in their order: the per-URL work is the FIFO entry, packed per host block
        (``fifo.RunBuffer.add_block``). Domains are independent, so judging them one after the
        other gives the decisions one ``offer`` per URL gives; each deferred URL takes the arrival
        sequence it would have had (the sequence orders a domain's hosts at one turn).
        """
        n = len(records)
        out = [False] * n
        waits = []                                  # (domain key, record, its blocks, URLs passed)
        passes: list[tuple[int, int]] = []          # (first, count) of the URLs passed
        r = self._reader.queue
        get, standing, budget_of = self._records.get, self.graph.standing_key, self.rule.budget
        probation = self.probation
        admitted = held = 0
        for dk, segs in groups.items():
            d = get(dk)
            if d.at != r:
                d.at, d.spent = r, 0
            if len(segs) == 1:
                total = segs[0][1] - segs[0][0]
            else:
                total = 0
                for i, j in segs:
                    total += j - i
            if d.deferred:                          # a backlog: its URLs wait behind it
                waits.append((dk, d, segs, 0))
                continue
            indeg, unvouched = standing(dk)
            room = budget_of(indeg) - d.spent
            if room <= 0:
                waits.append((dk, d, segs, 0))
                continue
            if probation and unvouched:
                held += 1                           # nobody vouches for it yet: the next queue, not now
                waits.append((dk, d, segs, 0))
                continue
            passed = room if room < total else total
            d.spent += passed
            d.admitted += passed
            self._records.changed_soft(dk, d)       # a crash may lose a charge (see "Charge point")
            admitted += passed
            self._top_admitted.note(dk, d.admitted)      # values only grow: the last one is enough
            left = passed
            for i, j in segs:
                k = left if left < j - i else j - i
                out[i:i + k] = [True] * k
                passes.append((i, k))
                left -= k
                if not left:
                    break
            if passed < total:
                waits.append((dk, d, segs, passed))
        c = self._c
        c["admitted"] += admitted
        c["probation"] += held
        if not waits:
            return out
        # a deferred URL's arrival sequence: the URLs deferred before it in the call, as one offer
        # per URL would number them
        base = self._seq
        reader = self._reader
        if passes:
            passes.sort()
            starts = [i for i, _ in passes]
            before = [0]
            for _, k in passes:
                before.append(before[-1] + k)
        else:
            starts, before = [], [0]
        for dk, d, segs, passed in waits:
            if d.deferred == 0:                   # a new backlog: its next pass is in the next queue
                d.level, d.wrap = 0, reader.wraps
                reader.list_in(dk, d, r + 1)
            parts = []
            for i, j in segs:
                if passed >= j - i:
                    passed -= j - i
                    continue
                i += passed
                passed = 0
                parts.append((i, j, base + i - before[bisect_right(starts, i)] if starts else base + i))
            self._append_parts(dk, d, records, fps, hosts, parts)
        self._seq = base + n - before[-1]
        return out

    def _append_parts(self, dk: bytes, d: DomainRecord, records: list[bytes], fps: list[int], hosts: list[str],
                      parts: list[tuple[int, int, int]]) -> None:
        # URLs of domain ``dk`` into its FIFO, parts (first, end, arrival sequence of the first) in
        # order, buffered (written in key order before anything reads the table, and at commit:
        # sorted puts touch each B-tree page once, a host's run as one entry). A host's next turn
        # is in the domain record if that host started the backlog (``DomainRecord.host``), else in
        # ``turns``; keys built once per host block.
        mine = self._turns.get(dk)
        head = dk + b"\0"
        add, host_hashes = self._runs.add_block, _host_hashes
        deferred, floor = d.deferred, d.turn
        n = 0
        for x, j, seq in parts:
            n += j - x
            while x < j:
                host = hosts[x]
                hh, hb = host_hashes[host]
                hk = head + hb
                if not deferred:            # a new backlog: its first host's turns go in the record
                    d.host, d.host_next = hh, 0
                if d.host_next and d.host == hh or not deferred:
                    turn, own = d.host_next, True
                else:
                    own = False
                    if mine is None:
                        mine = self._turns[dk] = {}
                    turn = mine.get(hk)
                    if turn is None:
                        raw = self.store.txn().get(hk, db=self.store.turns)
                        turn = _U64BE.unpack(raw)[0] if raw else 0
                if turn < floor:
                    turn = floor
                y = add(hk, turn, seq, hosts, fps, records, x, j)   # this host's URLs in a row: consecutive turns
                turn += y - x
                seq += y - x
                deferred += y - x
                x = y
                if own:
                    d.host_next = turn
                else:
                    mine[hk] = turn
        self._waiting += n
        d.deferred = deferred
        d.deferred_all += n
        self._records.changed(dk, d)
        self._c["deferred"] += n
        self._top_deferred.note(dk, d.deferred_all)

    def keep(self, dk: bytes, record: bytes, fp: int = 0) -> None:
        """Add a record to the end of domain ``dk``'s FIFO without charging it (an older state imported)."""
        d = self._records.get(dk)
        if d.deferred == 0:
            d.level, d.wrap = 0, self._reader.wraps
            self._reader.list_in(dk, d, self._reader.queue + 1)
        self._append(dk, d, record, fp, "")

    def _append(self, dk: bytes, d: DomainRecord, record: bytes, fp: int, host: str) -> None:
        self._append_parts(dk, d, [record], [fp], [host], [(0, 1, self._seq)])
        self._seq += 1

    def refund(self, pld: str, n: int = 1) -> int:
        """Give back the charge of ``n`` URLs of ``pld`` the frontier dropped; returns URLs refunded.

        Only charges of the queue the reader stands on are refunded (earlier queues are closed).
        """
        dk = domain_key(pld)
        d = self._records.get(dk)
        if d.at != self._reader.queue or d.spent == 0 or n <= 0:
            return 0
        k = min(n, d.spent)
        d.spent -= k
        self._c["refunded"] += k
        if self._reader.waits_later(d):
            self._reader.make_due(dk)           # room again in this queue: pass at once ("Due now")
        self._records.changed_soft(dk, d)
        return k

    # -- the reader ---------------------------------------------------------------------------
    def readmit(self, limit: int, *, advance: bool = False) -> list[bytes]:
        """Up to ``limit`` waiting records that may pass now, oldest first per domain (charged).

        First the domains listed in the reader's queue (a budget grew, a refund); with ``advance``
        the reader then moves on through the next non-empty queues until ``limit`` records passed
        or no domain waits. Queue them, then ``commit``: a crash before the commit hands them out
        again (never loses them).
        """
        out: list[bytes] = []
        self._write_puts()
        if limit > 0:
            for dk in self._reader.walk(advance):
                self._pass(dk, limit - len(out), out)
                if len(out) >= limit:
                    break
        self._c["readmitted"] += len(out)
        return out

    def _pass(self, dk: bytes, left: int, out: list[bytes]) -> None:
        d = self._records.get(dk)
        reader = self._reader
        r = reader.queue
        if d.at != r:
            d.at, d.spent = r, 0
        budget = self._budget(dk)
        n = min(budget - d.spent, d.deferred, left)
        if n > 0:
            self._pop(dk, d, n, out)
            d.spent += n
            d.admitted += n
            self._top_admitted.note(dk, d.admitted)
            self._c["passes"] += 1
        if d.deferred == 0:
            reader.unlist(dk, d)
            self._forget_turns(dk, d)
            d.level = 0
        elif d.spent >= budget:
            if d.wrap < reader.wraps:       # over budget across a wrap-around: spread it further
                d.level = min(self._max_level, d.level + reader.wraps - d.wrap)
                d.wrap = reader.wraps
            nxt = r + (1 << d.level)
            if nxt < reader.end and self.probation and self.graph.unvouched_key(dk):
                nxt = reader.end            # nobody vouches for it: one pass per window
            reader.list_in(dk, d, nxt)
        self._records.changed(dk, d)        # else: ``limit`` reached, it stays in the reader's queue

    def _pop(self, dk: bytes, d: DomainRecord, n: int, out: list[bytes]) -> None:
        # The domain's first n URLs are among its first n entries (an entry's key is its first URL's):
        # read those in one range read, take the n first URLs of their runs merged, delete the entries
        # taken from and put each run's rest back under its first URL's key (``fifo``), as taking
        # them one by one would leave it.
        st, prefix = self.store, dk + b"\0"
        txn = st.txn()
        got = fifo.first_entries(txn, st.deferred, prefix, dk + b"\x01", n)
        try:
            turn, gone, rest = fifo.take_first(got, len(prefix), n, out)
        except IndexError:
            raise BeastCorrupt(f"{domain_name(dk)}: fewer deferred URLs stored than its count {d.deferred}") from None
        for key in gone:
            txn.delete(key, db=st.deferred)
        for key, value in rest:
            txn.put(key, value, db=st.deferred)
        d.deferred -= n
        self._waiting -= n
        d.turn = turn           # the last one taken has the latest turn

    def _forget_turns(self, dk: bytes, d: DomainRecord) -> None:
        # Nothing waits any more: the domain's host turns start again from 0 (keeps the table to
        # the hosts of domains with a backlog).
        d.turn = d.host_next = 0
        self._turns.pop(dk, None)
        prefix = dk + b"\0"
        cur = self.store.txn().cursor(db=self.store.turns)
        if cur.set_range(prefix):
            while cur.key().startswith(prefix) and cur.delete():
                pass

    def _grew(self, dks: list[bytes]) -> None:
        # STAR listener: a waiting domain whose budget now has room in the reader's queue passes at once.
        reader, txn, db = self._reader, self.store.txn(), self.store.deferred
        r = reader.queue
        for dk in dks:
            d = self._records.peek(dk)
            if d is None:
                raw = txn.get(dk + RECORD, db=db)
                if raw is None or DomainRecord.decode(raw).deferred == 0:
                    continue
                d = self._records.get(dk)
            if reader.waits_later(d):
                spent = d.spent if d.at == r else 0
                if spent < self._budget(dk):
                    reader.make_due(dk)     # in RAM, its table place kept ("Due now")

    # -- reading ------------------------------------------------------------------------------
    @property
    def reader(self) -> int:
        """The BEAST queue the reader stands on."""
        return self._reader.queue

    @property
    def waiting(self) -> int:
        """Deferred URLs waiting now (those written and those not yet)."""
        return self._waiting

    def has_waiting(self) -> bool:
        return self._reader.has_listed()

    def domain(self, pld: str) -> dict:
        """What BEAST knows about one domain now."""
        return self._domain(domain_key(pld))

    def _domain(self, dk: bytes) -> dict:
        d = self._records.get(dk)
        spread = 1 << d.level
        return {"domain": domain_name(dk), "indegree": self.graph.indegree_key(dk), "budget": self._budget(dk),
                "spent": d.spent if d.at == self._reader.queue else 0, "deferred": d.deferred,
                "queue": self._reader.queue_of(dk, d), "spread": spread, "admitted": d.admitted,
                "deferred_all": d.deferred_all, "on_probation": self.probation and self.graph.unvouched_key(dk)}

    def explain(self, pld: str, fp: int) -> dict:
        """Where a URL (by fingerprint) waits, if it does: its place in its domain's FIFO and the queue
        it should pass in. Walks that domain's FIFO only, at most ``EXPLAIN_SCAN`` entries."""
        self._write_puts()
        txn = self.store.txn()
        info = self.domain(pld)
        info["reader"] = self._reader.queue
        info["waiting"] = False
        prefix = domain_key(pld) + b"\0"
        want = _FP.pack(fp)
        cur = txn.cursor(db=self.store.deferred)
        found = cur.set_range(prefix)
        urls: list[tuple[bytes, bytes]] = []        # (turn | seq, fp | record): runs interleave
        while found and fp and len(urls) < EXPLAIN_SCAN and cur.key().startswith(prefix):
            urls += fifo.entries(cur.key(), cur.value(), len(prefix))
            found = cur.next()
        urls.sort()
        for pos, (_, v) in enumerate(urls[:EXPLAIN_SCAN]):
            if v[:8] == want:
                budget = max(1, info["budget"])
                first = info["queue"] if info["queue"] is not None else self._reader.queue + 1
                info.update(waiting=True, position=pos, expected_queue=first + (pos // budget) * info["spread"])
                return info
        if len(urls) >= EXPLAIN_SCAN:
            info["scan"] = f"stopped after {EXPLAIN_SCAN} of its waiting URLs"
        return info

    def stats(self, top: int = 10) -> dict:
        seen: dict[bytes, None] = {}
        for dk in self.graph.top(top) + [k for k, _ in self._top_admitted.top(top)] + \
                [k for k, _ in self._top_deferred.top(top)]:
            seen.setdefault(dk)
        tops = [self._domain(dk) for dk in seen]
        tops.sort(key=lambda t: (-t["indegree"], -t["admitted"], t["domain"]))
        return {**self.rule_stats(), **self._reader.stats(), **self._counters(), "deferred_now": self.waiting,
                "domains_waiting": self._reader.listed(), "top_domains": tops}

    def rule_stats(self) -> dict:
        r = self.rule
        return {"base_budget": r.base_budget, "per_inlink": r.per_inlink, "max_budget": r.max_budget,
                "queues": self.queues, "max_spread": self.max_spread}

    def check_invariants(self) -> None:
        """Commit, scan every table and raise AssertionError naming the first broken invariant."""
        self.store.commit()
        reader = self._reader
        audit.check_tables(self.store, waiting=self._waiting, reader=reader.queue)
        for dk in reader.due():
            assert reader.waits_later(self._records.get(dk)), f"{domain_name(dk)} due now with nothing waiting later"

    # -- records ------------------------------------------------------------------------------
    @property
    def cached(self) -> int:
        return len(self._records)

    def _unwritten(self) -> int:
        """Puts ``_flush`` would write now (deferred entries, host turns, changed records)."""
        return len(self._runs) + sum(map(len, self._turns.values())) + self._records.changed_count

    def _write_puts(self) -> None:
        if len(self._runs):
            self.store.txn().cursor(db=self.store.deferred).putmulti(self._runs.take())

    def _write_turns(self) -> None:
        if self._turns:
            pack = _U64BE.pack
            puts = [(hk, pack(turn)) for mine in self._turns.values() for hk, turn in mine.items()]
            puts.sort()
            self.store.txn().cursor(db=self.store.turns).putmulti(puts)
            self._turns = {}

    def _flush(self) -> None:
        self._write_puts()
        self._write_turns()
        self._records.flush(everything=self.store.closing)
        if self._saved_tops is None or self.store.save_slow:
            self._saved_tops = (self._top_admitted.saved(), self._top_deferred.saved())
        meta = {"fifo": FIFO_FORMAT, "waiting": self._waiting, **self._reader.saved(self.store.closing),
                "seq": self._seq, "counters": self._counters(),
                "top_admitted": self._saved_tops[0], "top_deferred": self._saved_tops[1]}
        self.store.put_meta(b"beast", meta)

    def _counters(self) -> dict:
        """BEAST's counters, the reader's moves (``advances``) among them."""
        return {**self._c, "advances": self._reader.advances}
