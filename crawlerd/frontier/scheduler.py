"""The frontier the crawl shard drives: queue, schedule, lease, release (see the package docstring)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable

from crawlerd.frontier import hosts as hs
from crawlerd.frontier import journal
from crawlerd.frontier.blocklist import Blocklist
from crawlerd.frontier.durability import Durability
from crawlerd.frontier.hosts import HostRecord, HostTable, wall_of, wall_record
from crawlerd.frontier.ips import IPTable
from crawlerd.frontier.items import (
    PRIORITY_DEFERRED,
    Lease,
    QueuedURL,
    encode_url,
    qkey,
)
from crawlerd.frontier.leasing import LeaseOut, Leasing
from crawlerd.frontier.operations import FrontierOps
from crawlerd.frontier.politeness import Politeness
from crawlerd.frontier.queues import FrontierStore
from crawlerd.frontier.restart import Restart
from crawlerd.frontier.schedule import HostSchedule
from crawlerd.frontier.working import WorkingSet
from crawlerd.outcome import Outcome

GiB = 1 << 30


# Upper bound on the time between the frontier's last commit and a crash: the shard commits at
# least every 2 s, and group commits add at most commit_interval_s (1 s by default). Used only
# when the in-flight journal is gone (an OS crash): then every host waits a whole grace.
CRASH_MARGIN_S = 3.0

# Writes charged to the store's WriteBudget (LMDB page buffers, store/lmdb_reserve.py), at most:
# an add puts the URL's queue entry and may write its host's record and waiting entry; a lease
# takes the entry off its queue and puts the lease; a release deletes the lease, may put the URL
# back, and its host's record is rewritten at the commit.
_ADD_WRITES, _LEASE_WRITES, _RELEASE_WRITES = 3, 2, 3


class Frontier:
    """Per-host back queues in LMDB, scheduled by a due-time heap under host and IP politeness.

    Heap invariant: a host is in the due heap iff it is active, in state READY
    (has queued URLs, fewer leases out than its limit, a known unexpired IP,
    robots not being fetched) or DNS_BACKOFF (has queued URLs, waiting to ask
    DNS again); its key is the earliest start its politeness allows.
    Accounting invariant: ``added == queued + leased URLs + completed +
    dead_letter + dropped`` (``check_invariants`` verifies both).

    Single-threaded: call it from one thread (LMDB write transactions are bound to it). With a
    writer attached (``attach_writer``, the shard during a crawl) its commits land on the writer
    thread and it reads its own writes through an overlay until they do (``queues.py``).
    """

    def __init__(self, path: str, *, clock=time.monotonic, wall=time.time, rng: random.Random | None = None,
                 priority_levels: int = 4, delay_factor: float = 10.0, min_delay_s: float = 1.0,
                 max_delay_s: float = 60.0, per_ip_concurrency: int = 1, ip_delay_s: float = 0.0,
                 backoff_base_s: float = 30.0, backoff_max_s: float = 3600.0, retry_after_cap_s: float = 86400.0,
                 park_after_failures: int = 10, park_s: float = 21600.0, lease_timeout_s: float = 300.0,
                 max_attempts: int = 3, crawl_delay_cap_s: float = 60.0, max_active_hosts: int = 200000,
                 map_size_bytes: int = 64 * GiB, host_concurrency: dict[str, int] | None = None,
                 blocklist: Iterable[str] = (), sync: bool = True, group_ops: int = 4096,
                 commit_interval_s: float = 1.0, shared_ips=None, deferred_level: bool = False,
                 write_buffer_bytes: int = 0, working_set_max: int = 4096, session_fetches: int = 20,
                 session_s: float = 30.0, queue_heads_bytes: int = 8 << 20):
        """Open (or create) the frontier in the LMDB directory ``path``; times are seconds of ``clock``.

        ``wall`` is the wall clock: host records store absolute wall-clock times, so a restart
        resumes each host at its last request end plus its gap (``clock`` may restart at boot).

        The politeness parameters are those of ARCHITECTURE.md invariant 1 (see ``Politeness``).
        ``sync``: fsync every commit (else only commit()/close(); see queues.py).
        ``group_ops``/``commit_interval_s``: how much lease/complete work a crash
        may lose (it is redone, never lost). ``host_concurrency``: hosts allowed
        more than one lease at a time (still under per_ip_concurrency).
        ``blocklist``: patterns added to the persisted blocklist.
        ``shared_ips``: the per-IP slot table shared with the other shards of this machine
        (``crawlerd._native.ipslots.IPSlots``, attached): a lease also takes a cell of its IP
        there, so per-IP limits hold across shards (ARCHITECTURE.md invariant 1).
        ``deferred_level``: one more level, after ``priority_levels``, that a host serves only
        when its other levels are empty (suspected duplicate URLs, ``crawlerd.frontier.dust``).
        ``working_set_max``, ``session_fetches``, ``session_s``: the hosts leased from and how long
        each stays (``crawlerd.frontier.working``; 0 hosts: off, every ready host by due time).
        ``queue_heads_bytes``: the byte cap of the queue heads cached with a writer attached
        (``crawlerd.frontier.heads``; 0: none cached).
        """
        if not 1 <= priority_levels <= (15 if deferred_level else 16):
            raise ValueError(f"priority_levels = {priority_levels}: expected 1..{15 if deferred_level else 16}")
        if not 1 <= per_ip_concurrency <= 0xFFFF:
            raise ValueError(f"per_ip_concurrency = {per_ip_concurrency}: expected 1..65535")
        if max_active_hosts < 1 or max_attempts < 1 or lease_timeout_s <= 0 or group_ops < 1:
            raise ValueError("max_active_hosts, max_attempts, lease_timeout_s and group_ops must be positive")
        self._clock = clock
        self._wall = wall
        self._off = wall() - clock()      # wall minus clock, fixed for the session: exact round trips
        self._journal: journal.InflightJournal | None = None
        self._ip_floor: dict[str, float] = {}
        self._rng = rng if rng is not None else random.Random()
        self._levels = priority_levels + (1 if deferred_level else 0)     # queue levels on disk
        self._top = priority_levels - 1                     # the last level of the weighted pick
        self.deferred_level: int | None = priority_levels if deferred_level else None
        self._pol = Politeness(delay_factor, min_delay_s, max_delay_s, crawl_delay_cap_s, backoff_base_s,
                               backoff_max_s, retry_after_cap_s, park_after_failures, park_s)
        self._grace = self._pol.restart_grace_s(ip_delay_s)
        self._lease_timeout_s = lease_timeout_s
        self._max_attempts = max_attempts
        self._host_conc = {k: max(1, min(int(v), 255)) for k, v in (host_concurrency or {}).items()}
        self._store = FrontierStore(path, map_size_bytes=map_size_bytes, sync=sync,
                                    write_buffer_bytes=write_buffer_bytes, heads_bytes=queue_heads_bytes)
        self._hosts = HostTable(max_active_hosts)
        self._ips = IPTable(per_ip_concurrency, ip_delay_s)
        self._shared = shared_ips
        self._ip_delay_s = ip_delay_s
        self._heap = WorkingSet(working_set_max, session_fetches, session_s)
        self._leases: dict[int, LeaseOut] = {}
        self._min_deadline = math.inf
        self._need_dns: set[int] = set()
        self._dirty: set[int] = set()
        self._blocked_slots: set[int] = set()
        self._c, self._dropped, patterns = self._store.load_meta()
        self._seen_mark = self._store.load_mark(b"seen")
        self._blocklist = Blocklist(patterns)
        self._book = FrontierOps(store=self._store, counts=self._c, dropped=self._dropped, hosts=self._hosts,
                                 ips=self._ips, heap=self._heap, leases=self._leases, blocklist=self._blocklist,
                                 blocked_slots=self._blocked_slots, dirty=self._dirty, levels=self._levels,
                                 pol=self._pol, clock=self._clock, top=self._top, deferred_level=self.deferred_level)
        for p in blocklist:
            if self._blocklist.normalise(p) not in self._blocklist.patterns:
                self._store.put_block(self._blocklist.add(p), True)
        crashed = self._c["session"] > 0 and not self._c["clean"]
        replay = journal.read(path)
        now = self._clock()
        now_wall = now + self._off
        last = self._store.load_clock()
        if last is None or last > now_wall:
            last = now_wall
        self._not_before = -math.inf
        if crashed and not replay.usable:
            # No journal of this boot (an OS crash, or an older version): which hosts were being
            # fetched is unknown, and so is per-IP state. No host starts before the grace has
            # passed since the crash, which came at most CRASH_MARGIN_S after the last commit.
            self._not_before = min(now_wall, last + CRASH_MARGIN_S) + self._grace - self._off
        self._c["session"] += 1
        self._c["clean"] = 0
        self._session = self._c["session"]
        self._sched = HostSchedule(store=self._store, counts=self._c, hosts=self._hosts, ips=self._ips,
                                   heap=self._heap, need_dns=self._need_dns, dirty=self._dirty,
                                   blocked_slots=self._blocked_slots, blocklist=self._blocklist, book=self._book,
                                   host_concurrency=self._host_conc, ip_floor=self._ip_floor, levels=self._levels,
                                   top=self._top, deferred_level=self.deferred_level, session=self._session,
                                   off=self._off, not_before=self._not_before, pol=self._pol, rng=self._rng)
        restart = Restart(store=self._store, counts=self._c, book=self._book, blocklist=self._blocklist,
                          hosts=self._hosts, ips=self._ips, ip_floor=self._ip_floor, schedule=self._sched,
                          levels=self._levels, lease_timeout_s=self._lease_timeout_s, pol=self._pol,
                          off=self._off, grace=self._grace)
        self._book.recovered = restart.recover(now, replay, crashed, last)
        self._dur = Durability(store=self._store, counts=self._c, dropped=self._dropped, hosts=self._hosts,
                               ips=self._ips, dirty=self._dirty, leases=self._leases, clock=self._clock,
                               off=self._off, session=self._session, lease_timeout_s=lease_timeout_s,
                               group_ops=group_ops, commit_interval_s=commit_interval_s)
        self._dur.commit_open()
        self._journal = self._dur.journal = journal.InflightJournal(
            path, self._session, {ip: wall_of(t - self._ips.delay_s, self._off) for ip, t in self._ip_floor.items()})
        self._leasing = Leasing(store=self._store, counts=self._c, hosts=self._hosts, ips=self._ips, heap=self._heap,
                                leases=self._leases, need_dns=self._need_dns, dirty=self._dirty,
                                blocked_slots=self._blocked_slots, book=self._book, schedule=self._sched,
                                journal=self._journal, pol=self._pol, rng=self._rng, shared_ips=shared_ips,
                                ip_delay_s=ip_delay_s, lease_timeout_s=lease_timeout_s, max_attempts=max_attempts,
                                off=self._off)

    # == add ===================================================================
    def add(self, items: Iterable[QueuedURL], *, seen_mark: int | None = None) -> int:
        """Queue URLs that passed the seen-set (one write transaction, committed). Returns URLs queued.

        URLs of blocked hosts are dropped with reason "blocked" (see drain_dropped). ``seen_mark``:
        the seen-set's position after these answers, committed in the same transaction, so answers
        the seen-set delivers again after a crash (at-least-once) are known as added (``seen_mark``).
        """
        st, H = self._store, self._hosts
        items = items if isinstance(items, list) else list(items)
        # a URL's queue entry and at most its host's record and waiting entry: committing what is open
        # first keeps this transaction within the reserved page buffers (the add itself stays one)
        if st.open and not st.budget.fits(_ADD_WRITES * len(items)):
            self._dur.commit_open()
        st.budget.spend(_ADD_WRITES * len(items))
        if seen_mark is not None and seen_mark > self._seen_mark:
            self._seen_mark = seen_mark
            self._store.save_mark(b"seen", seen_mark)
        now = self._clock()
        txn, hdb = st.txn(), st.hosts
        groups: dict[str, list[QueuedURL]] = {}
        for it in items:
            g = groups.get(it.host_key)
            if g is None:
                groups[it.host_key] = [it]
            else:
                g.append(it)
        last, deferred = self._top, self.deferred_level
        seq = self._c["seq"]
        queued = 0
        puts: list[tuple[bytes, bytes]] = []
        blocklist = self._blocklist
        for hk, lst in groups.items():
            if blocklist and blocklist.matches(hk):
                self._c["seq"] = seq
                self._book.drop_items(hk, lst, "blocked")
                seq = self._c["seq"]
                continue
            s = H.slot_of.get(hk)
            rec = None
            if s is not None:
                hid, demote = H.hid[s], H.demote[s]
            else:
                raw = txn.get(hk.encode("utf-8", "surrogateescape"), db=hdb)
                if raw is None:
                    rec = HostRecord(self._c["hid_next"], flags=hs.FLAG_WALL)
                    self._c["hid_next"] += 1
                else:
                    rec = HostRecord.decode(raw)
                hid, demote = rec.hid, rec.demote
            mask = 0
            for it in lst:
                if it.priority == PRIORITY_DEFERRED and deferred is not None:
                    level = deferred
                else:
                    level = it.priority + demote
                    level = 0 if level < 0 else (last if level > last else level)
                seq += 1
                puts.append((qkey(hid, level, seq), encode_url(it)))
                mask |= 1 << level
            queued += len(lst)
            if s is not None:
                # No record rewrite: an active host's mask is re-derived from the queues on open.
                H.mask[s] |= mask
                if H.state[s] == hs.BUSY:
                    self._sched.settle(s, now)
            else:
                rec.mask |= mask
                if rec.flags & hs.FLAG_WAITING:
                    txn.put(hk.encode("utf-8", "surrogateescape"), rec.encode(), db=hdb)
                elif H.full():
                    self._sched.to_waiting(hk, rec)
                else:
                    self._sched.activate(hk, rec, now)
        st.put_sorted(puts)
        self._c["seq"] = seq
        self._c["added"] += queued
        self._c["queued"] += queued
        self._dur.commit_open()
        return queued

    # == lease ==================================================================
    def lease(self, now: float | None = None, limit: int = 100) -> list[Lease]:
        """Lease up to ``limit`` due hosts (one request each), per-IP limits applied.

        Commits when ``group_ops`` operations or ``commit_interval_s`` have gone by since the last commit.
        """
        if now is None:
            now = self._clock()
        out: list[Lease] = []
        heap = self._heap
        while len(out) < limit:
            due = heap.pop_due(now, limit - len(out))
            if not due:
                break
            for s in due:
                lease = self._leasing.lease_host(s, now)
                if lease is not None:
                    out.append(lease)
        if out:
            t = now + self._off
            self._journal.started([(x.lease_id, t, x.ip, x.host_key) for x in out])
        if out and out[0].deadline < self._min_deadline:
            self._min_deadline = out[0].deadline
        # Group commit: an uncommitted lease is harmless (after a crash the URL is simply still
        # queued); completions wait at most commit_interval_s or group_ops operations.
        self._dur.ops += len(out)
        self._store.budget.spend(_LEASE_WRITES * len(out))
        if self._dur.due(now):
            self._dur.commit_open()
        return out



    # == complete ================================================================
    def complete(self, lease_id: int, *, outcome: Outcome, status: int = 0, response_time_s: float = 0.0,
                 retry_after_s: float | None = None, requeue: bool = False, unfetched: bool = False) -> bool:
        """Release a lease. False if the id is unknown, expired or already completed.

        The host's next start is at least now + the gap rule (ARCHITECTURE.md invariant 1);
        failures back off (429/503 honour Retry-After); a retryable failure
        returns the URL to the front of its queue, or dead-letters it after
        ``max_attempts``. ``requeue`` returns it without counting an attempt.
        ``unfetched``: no request was made for the lease (robots.txt disallows the URL): the host
        and its IP are released without a politeness gap (their due times stay as they were).
        Durable at the next commit (add, commit, or lease's group commit), or at
        once when it set a wait longer than a restart's grace: after a crash a
        completion that was not durable is fetched again (at least once).
        """
        o = self._leases.pop(lease_id, None)
        if o is None:
            return False
        self._released(self._leasing.release(o, self._clock(), outcome, status, response_time_s, retry_after_s,
                                             requeue, unfetched))
        return True

    def _released(self, gap: float) -> None:
        """A lease was given back with this gap before its host's next request."""
        dur = self._dur
        dur.ops += 1
        self._store.budget.spend(_RELEASE_WRITES)
        # a wait longer than the grace is committed at once: it must outlive even an OS crash
        if gap > self._grace or dur.ops >= dur.group_ops or self._store.budget.full:
            self._dur.commit_open()

    # == leases that never came back =================================================
    def expire_leases(self, now: float | None = None) -> int:
        """Take back leases past their deadline as timeouts (attempt counted, host backed off)."""
        if now is None:
            now = self._clock()
        if now < self._min_deadline:
            return 0
        late = [lid for lid, o in self._leases.items() if o.lease.deadline <= now]
        for lid in late:
            o = self._leases.pop(lid)
            self._c["expired"] += 1
            self._released(self._leasing.release(o, now, Outcome.TIMEOUT, 0, self._lease_timeout_s, None, False))
        self._min_deadline = min((o.lease.deadline for o in self._leases.values()), default=math.inf)
        return len(late)

    @property
    def shared_ip_waits(self) -> int:
        """Leases put off because another shard held the IP."""
        return self._leasing.shared_ip_waits

    @property
    def seen_mark(self) -> int:
        """The seen-set position up to which answers were added and committed (see ``add``)."""
        return self._seen_mark

    def next_due(self) -> float | None:
        """Earliest time a lease() could hand something out (None: nothing scheduled)."""
        top = self._heap.peek()
        return None if top is None else top[1]

    @property
    def next_deadline(self) -> float:
        """Earliest lease deadline (inf when none): when expire_leases() has work.

        Cached; recomputed (O(leases out)) only once the cached time has passed.
        """
        if self._min_deadline <= self._clock() or not self._leases:
            self._min_deadline = min((o.lease.deadline for o in self._leases.values()), default=math.inf)
        return self._min_deadline

    # == DNS and robots ==============================================================
    def hosts_needing_dns(self) -> list[str]:
        """Hosts with work whose IP is unknown or expired; each is listed once per lookup round.

        Answer every one with set_host_ip (a host is never leased before its IP is known).
        """
        H = self._hosts
        out = [H.keys[s] for s in self._need_dns if H.state[s] == hs.DNS]
        self._need_dns.clear()
        return out

    def set_host_ip(self, host_key: str, ip: str | None, *, outcome: Outcome | None = None,
                    expires_at: float | None = None) -> None:
        """Record a DNS answer. ``ip=None`` is a failure named by ``outcome`` (default dns_error).

        Transient failures (dns_servfail, dns_timeout, dns_error) back the host off
        like a failed fetch and ask again later; any other (dns_nxdomain,
        blocked_address) drops the host's queued URLs with that outcome as reason.
        """
        s = self._hosts.slot_of.get(host_key)
        if s is None:
            return
        # a wait longer than the grace is committed at once: it must outlive even an OS crash
        if self._sched.set_ip(s, ip, outcome, expires_at, self._clock()) > self._grace:
            self._dur.commit_open()

    def needs_robots(self, host_key: str, now: float | None = None) -> bool:
        """Whether the host's robots.txt is unknown or expired (it gets a robots lease first)."""
        if now is None:
            now = self._clock()
        s = self._hosts.slot_of.get(host_key)
        if s is not None:
            return self._hosts.robots_exp[s] <= now
        rec = self._book.record(host_key)
        return rec is None or not rec.flags & hs.FLAG_WALL or rec.robots_exp - self._off <= now

    def set_robots(self, host_key: str, *, expires_at: float, crawl_delay_s: float | None) -> None:
        """Robots.txt of the host is known until ``expires_at``; Crawl-delay capped at crawl_delay_cap_s."""
        delay = self._pol.crawl_delay(crawl_delay_s)
        s = self._hosts.slot_of.get(host_key)
        if s is not None:
            self._hosts.robots_exp[s] = expires_at
            self._hosts.crawl_delay[s] = delay
            self._dirty.add(s)
            return
        rec = self._book.record(host_key)
        if rec is not None:
            rec = wall_record(rec, self._clock() + self._off)
            rec.robots_exp, rec.crawl_delay = expires_at + self._off, delay
            self._book.put_record(host_key, rec)

    # == the operator's side (crawlerd.frontier.operations) ===================================
    def block(self, pattern: str) -> int:
        """Block a host or domain (covers subdomains) at once; drops its queued URLs. Returns URLs dropped."""
        n = self._book.block(pattern, self._sched.settle)
        self._dur.commit_open()
        return n

    def unblock(self, pattern: str) -> None:
        self._book.unblock(pattern)
        self._dur.commit_open()

    def blocked(self) -> list[str]:
        return self._book.blocked()

    def is_blocked(self, host: str) -> bool:
        return self._blocklist.matches(host)

    def turn_sharers(self, host_key: str) -> int | None:
        """How many hosts take turns with this one before its next lease (``WorkingSet.sharers``);
        None when it has nothing queued or its working-set session ends (no next turn soon)."""
        H = self._hosts
        s = H.slot_of.get(host_key)
        if s is None or H.mask[s] == 0:
            return None
        return self._heap.sharers(s, self._clock())

    def demote_host(self, host_key: str, levels: int = 1) -> None:
        """Near-duplicate trap feedback: see ``FrontierOps.demote_host``."""
        self._book.demote_host(host_key, levels)

    def promote_deferred(self, host_key: str, level_of: Callable[[QueuedURL], int | None], limit: int = 0,
                         max_scan: int = 0) -> int:
        """Move deferred URLs of a host up: see ``FrontierOps.promote_deferred``. Committed."""
        n = self._book.promote_deferred(host_key, level_of, limit, max_scan)
        if n:
            self._dur.commit_open()
        return n

    def deferred_count(self, host_key: str) -> int:
        return self._book.deferred_count(host_key)

    def drain_dropped(self, limit: int = 10000) -> list[tuple[QueuedURL, str]]:
        """Hand out (and forget) up to ``limit`` dropped or dead-lettered URLs with their reason."""
        out = self._book.drain_dropped(limit)
        self._dur.commit_open()
        return out

    def dead_letters(self, limit: int = 1000) -> list[tuple[QueuedURL, str]]:
        return self._book.dead_letters(limit)

    def check_invariants(self, deep: bool = False) -> None:
        """Raise AssertionError naming the first broken invariant. ``deep`` also recounts LMDB."""
        self._book.check_invariants(deep)

    def queued(self) -> int:
        return self._c["queued"]

    def hosts_ready(self) -> int:
        """Hosts scheduled to be leased (work, room for a lease, a known address): BEAST's "ready hosts"."""
        return len(self._heap)

    def explain(self, url: str, host_key: str, now: float | None = None) -> dict:
        """Where the frontier holds ``url`` and its host's state: see ``FrontierOps.explain``."""
        return self._book.explain(url, host_key, now)

    def storage(self) -> dict[str, int]:
        """LMDB bytes and entries per table (for stats and the bench)."""
        return self._book.storage()

    def stats(self) -> dict:
        return self._book.stats()

    def memory(self) -> dict[str, int]:
        """The queue heads cached in RAM (with a writer attached; else nothing)."""
        heads = self._store.heads
        return heads.memory() if heads is not None else {}

    def backed_off(self, now: float, n: int = 10) -> list[dict]:
        """The ``n`` hosts with the most consecutive failures: see ``FrontierOps.backed_off``."""
        return self._book.backed_off(now, n)

    # == durability (durability.py) ==========================================================
    @property
    def commits(self) -> int:
        """Write transactions committed: the durability watermark (a crash keeps what preceded it)."""
        return self._dur.commits

    @property
    def landed(self) -> int:
        """Of the commits handed to a writer, those that landed (their ``then`` ran)."""
        return self._dur.landed

    def commit(self, *, flush: bool = True, then: Callable[[], None] | None = None) -> None:
        """Make everything so far durable (fsync even when sync=False). ``flush=False``: commit
        only (``kill -9``-safe); ``flush()`` then makes it power-safe, from any thread. With a
        writer attached both happen there, and ``then`` runs on the loop once they did (without
        one: before this returns)."""
        self._dur.commit(flush=flush, then=then)

    def when_written(self, then: Callable[[], None]) -> None:
        """Run ``then`` on the loop once every commit made so far landed (now, without a writer)."""
        self._store.when_written(then)

    @property
    def overlay(self):
        """The store's overlay while a writer is attached (``queues.py``), else None."""
        return self._store.overlay

    def attach_writer(self, writer) -> None:
        """Commit on ``writer`` (a ``store.writer.WriteThread``) from now on: the store's write
        transactions and the in-flight journal's end lines (``queues.py``, ``journal.py``). None:
        back on this thread, once the writer is closed and every commit handed over landed (else
        ``WriterError``: the store keeps what landed, as after a ``kill -9``, and commits nothing more)."""
        self._dur.attach_writer(writer)

    def flush(self) -> None:
        """fdatasync what is committed (thread-safe beside the loop's write transactions)."""
        self._store.flush()

    def close(self) -> None:
        """Commit and close. Leases still out go back to their queues on the next open.

        Every active host's due is recorded, so the next run resumes each host at its own time.
        A writer still attached is detached first (its commits must have landed); after a writer
        failed nothing is committed: the store keeps what landed, as after a ``kill -9``.
        """
        self._dur.close()
