"""Where each active host of the frontier waits, and which waiting host gets a free slot.

An active host (one slot of :class:`~crawlerd.frontier.hosts.HostTable`) is in exactly one
place, named by its state: the due-time heap (READY, DNS_BACKOFF; keyed by the earliest start
its politeness allows), the DNS list (DNS: its address is unknown or expired), its IP's waiter
heap (IPWAIT: the IP is at ``per_ip_concurrency``), or nowhere (BUSY: at its lease limit or
with nothing queued; ROBOTS: its robots.txt lease is out). A host with work and no free slot
is listed in the LMDB ``waiting`` table by its best level; slots are given out by a weighted
pick across levels (Mercator §3.2). The frontier (``crawlerd.frontier.scheduler``) owns the
tables and hands them here; this component moves hosts between the places.
"""

from __future__ import annotations

import math

from crawlerd.frontier import hosts as hs
from crawlerd.frontier.hosts import HostRecord, wall_record
from crawlerd.frontier.operations import IN_HEAP as _IN_HEAP
from crawlerd.frontier.queues import u64
from crawlerd.outcome import BACKOFF_OUTCOMES, Outcome


class HostSchedule:
    """The places of the active hosts. Key: host slot. Invariant: a host is in the due heap iff
    it is active and READY or DNS_BACKOFF (``FrontierOps.check_invariants`` verifies it); a
    waiting-table entry of a host that holds a slot by now, or has no work left, is stale and
    skipped when its turn comes (``fill_slots``)."""

    def __init__(self, *, store, counts: dict, hosts, ips, heap, need_dns: set[int], dirty: set[int],
                 blocked_slots: set[int], blocklist, book, host_concurrency: dict[str, int],
                 ip_floor: dict[str, float], levels: int, top: int, deferred_level: int | None,
                 session: int, off: float, not_before: float, pol, rng):
        """The frontier's own tables (shared, not copied). ``levels``: queue levels on disk; ``top``:
        the last level of the weighted pick; ``session``: this run's number; ``off``: wall minus
        clock; ``not_before``: no host starts earlier (after an OS crash, see the scheduler); ``pol``:
        the gap rule, ``rng`` its jitter (DNS backoff)."""
        self._store, self._c, self._hosts, self._ips, self._heap = store, counts, hosts, ips, heap
        self._need_dns, self._dirty, self._blocked_slots = need_dns, dirty, blocked_slots
        self._blocklist, self._book, self._host_conc, self._ip_floor = blocklist, book, host_concurrency, ip_floor
        self._levels, self._top, self.deferred_level = levels, top, deferred_level
        self._dbit = 1 << deferred_level if deferred_level is not None else 0     # the deferred level's mask bit
        self._session, self._off, self._not_before = session, off, not_before
        self._pol, self._rng = pol, rng
        self._wpicks = 0

    def attach_ip(self, ip: str) -> int:
        slot = self._ips.attach(ip)
        if self._ip_floor:
            floor = self._ip_floor.pop(ip, None)
            if floor is not None and floor > self._ips.due[slot]:
                self._ips.due[slot] = floor      # the IP's own gap, begun in the last run
        return slot

    def activate(self, hk: str, rec: HostRecord, now: float) -> int:
        """Give a host with work an active slot and schedule it (``rec`` holds wall-clock times)."""
        off = self._off
        rec = wall_record(rec, now + off)
        rec.due -= off
        if rec.robots_exp > 0:
            rec.robots_exp -= off
        if rec.session != self._session:
            rec.ip, rec.ip_exp = "", 0.0     # resolved (and checked) again: network.allow may differ
        else:
            rec.ip_exp -= off
        rec.flags &= ~hs.FLAG_WAITING
        if rec.due < self._not_before:
            rec.due = self._not_before
        H = self._hosts
        s = H.add(hk, rec, self._host_conc.get(hk, 1) if self._host_conc else 1)
        if rec.ip and rec.ip_exp > now:
            H.ip[s] = self.attach_ip(rec.ip)
        self._dirty.add(s)
        if self._blocklist and self._blocklist.matches(hk):
            self._blocked_slots.add(s)
        self.schedule(s, now)
        return s

    def schedule(self, s: int, now: float) -> None:
        """A host with work and room for a lease: into the heap, or ask DNS first."""
        H = self._hosts
        if H.ip[s] >= 0 and H.ip_exp[s] > now:
            H.state[s] = hs.READY
            self._heap.push(s, H.due[s])
        else:
            H.state[s] = hs.DNS
            self._need_dns.add(s)

    def unschedule(self, s: int) -> None:
        """Take a host out of whatever it waits in (heap, DNS list, IP waiters); state becomes BUSY."""
        H = self._hosts
        st = H.state[s]
        if st in _IN_HEAP:
            self._heap.remove(s)
            if st == hs.READY and H.ip[s] >= 0:
                self.wake_ip(H.ip[s])
        elif st == hs.DNS:
            self._need_dns.discard(s)
        H.state[s] = hs.BUSY   # an IPWAIT entry left behind is skipped when popped

    def settle(self, s: int, now: float) -> None:
        """Re-derive a host's place after its queue or leases changed."""
        H = self._hosts
        if H.mask[s] == 0 or s in self._blocked_slots:
            if H.state[s] != hs.ROBOTS:
                self.unschedule(s)
            self._heap.leave(s)          # nothing to lease: its working-set place goes to another host
            if H.out[s] == 0:
                self.deactivate(s, now)
            return
        if H.state[s] == hs.BUSY and H.out[s] < H.conc[s]:
            self.schedule(s, now)

    def deactivate(self, s: int, now: float) -> None:
        H, ips = self._hosts, self._ips
        ip = H.ip[s]
        rec = H.record(s, self._session, now, ips.names[ip] if ip >= 0 else "", self._off)
        self._store.txn().put(H.keys[s].encode("utf-8", "surrogateescape"), rec.encode(), db=self._store.hosts)
        if ip >= 0:
            ips.detach(ip)
        self._dirty.discard(s)
        self._blocked_slots.discard(s)
        self._heap.leave(s)
        H.release(s)
        self.fill_slots(now)

    def to_waiting(self, hk: str, rec: HostRecord) -> None:
        st = self._store
        level = (rec.mask & -rec.mask).bit_length() - 1
        self._c["wseq"] += 1
        st.txn().put(bytes((level,)) + u64(self._c["wseq"]), hk.encode("utf-8", "surrogateescape"), db=st.waiting)
        rec.flags |= hs.FLAG_WAITING
        st.txn().put(hk.encode("utf-8", "surrogateescape"), rec.encode(), db=st.hosts)
        self._c["waiting"] += 1

    def fill_slots(self, now: float) -> None:
        """Move waiting hosts into free slots: weighted pick across front-queue levels (Mercator §3.2)."""
        st = self._store
        while self._c["waiting"] > 0 and not self._hosts.full():
            txn = st.txn()
            cur = txn.cursor(db=st.waiting)
            heads = {}
            for level in range(self._levels):
                if cur.set_range(bytes((level,))) and cur.key()[0] == level:
                    heads[level] = (cur.key(), cur.value())
            if not heads:
                self._c["waiting"] = 0
                return
            if self._dbit and len(heads) > 1:
                heads.pop(self.deferred_level, None)       # hosts with only deferred work come last
            self._wpicks += 1
            key, hkb = heads[self._nearest(self._ruler(self._wpicks), sum(1 << lv for lv in heads))]
            txn.delete(key, db=st.waiting)
            self._c["waiting"] -= 1
            raw = txn.get(hkb, db=st.hosts)
            if raw is None:
                continue
            rec = HostRecord.decode(raw)
            hk = hkb.decode("utf-8", "surrogateescape")
            rec.flags &= ~hs.FLAG_WAITING
            if rec.mask == 0 or hk in self._hosts.slot_of:
                txn.put(hkb, rec.encode(), db=st.hosts)
                continue
            if self._blocklist.matches(hk):
                self._book.drop_record_queue(hk, rec, "blocked")
                txn.put(hkb, rec.encode(), db=st.hosts)
                continue
            self.activate(hk, rec, now)

    def _ruler(self, n: int) -> int:
        """Target level of the n-th pick: the ruler sequence 0,1,0,2,0,1,0,3,... capped at the last level.

        Level l (< last) is the target every 2**(l+1) picks, the last every
        2**(levels-1): weights 1/2, 1/4, ... and no level waits longer than that.
        """
        t = (n & -n).bit_length() - 1
        return t if t < self._top else self._top

    def _nearest(self, target: int, mask: int) -> int:
        if mask >> target & 1:
            return target
        for d in range(1, self._levels):
            if target - d >= 0 and mask >> (target - d) & 1:
                return target - d
            if mask >> (target + d) & 1:
                return target + d
        raise ValueError("no non-empty level")

    def pick_level(self, s: int) -> int:
        """The level of the host's next URL: the ruler target, or the nearest non-empty level."""
        H = self._hosts
        p = (H.picks[s] + 1) & 0xFFFFFFFF or 1
        H.picks[s] = p
        mask = H.mask[s]
        if mask & self._dbit and mask != self._dbit:
            mask &= ~self._dbit              # the deferred level waits until nothing else is queued
        if mask & (mask - 1) == 0:           # one level non-empty: nothing to choose
            return mask.bit_length() - 1
        target = (p & -p).bit_length() - 1
        if target > self._top:
            target = self._top
        return self._nearest(target, mask)

    def wake_ip(self, ip: int) -> None:
        """The IP has room again: move the earliest-due waiting host back into the heap."""
        H, ips = self._hosts, self._ips
        if ips.inflight[ip] >= ips.limit:
            return
        while True:
            entry = ips.pop_waiter(ip)
            if entry is None:
                return
            _due, hid, s = entry
            if H.keys[s] is not None and H.hid[s] == hid and H.state[s] == hs.IPWAIT and H.ip[s] == ip:
                H.state[s] = hs.READY
                self._heap.push(s, max(H.due[s], ips.due[ip]))
                return

    def set_ip(self, s: int, ip: str | None, outcome: Outcome | None, expires_at: float | None, now: float) -> float:
        """A DNS answer for the host in slot ``s`` (see ``Frontier.set_host_ip``). Returns the
        backoff it set (0.0: none)."""
        H, ips = self._hosts, self._ips
        old = H.ip[s]
        st = H.state[s]
        if ip is None:
            outcome = outcome or Outcome.DNS_ERROR
            if old >= 0:
                ips.detach(old)
                H.ip[s], H.ip_exp[s] = -1, 0.0
            if outcome in BACKOFF_OUTCOMES:
                fails = min(H.fails[s] + 1, 0xFFFF)
                H.fails[s] = fails
                wait = self._pol.failure_wait_s(fails, None, self._rng)
                if now + wait > H.due[s]:
                    H.due[s] = now + wait
                if st not in (hs.BUSY, hs.ROBOTS):
                    self.unschedule(s)
                    H.state[s] = hs.DNS_BACKOFF
                    self._heap.push(s, H.due[s])
                self._dirty.add(s)
                return wait
            else:
                self._dirty.add(s)
                self._book.drop_host_queue(s, outcome.value)
                self.settle(s, now)
            return 0.0
        new = self.attach_ip(ip)
        H.ip[s] = new
        H.ip_exp[s] = math.inf if expires_at is None else expires_at
        if old >= 0:
            ips.detach(old)
        if st == hs.DNS:
            self._need_dns.discard(s)
            self.schedule(s, now)
        elif st == hs.DNS_BACKOFF or (st == hs.IPWAIT and old != new):
            if st == hs.DNS_BACKOFF:
                self._heap.remove(s)
            H.state[s] = hs.READY
            self._heap.push(s, H.due[s])
        return 0.0
