"""The frontier's restart: the last run's leases back to their queues, its hosts back in place
at the dues its records and the in-flight journal (``crawlerd.frontier.journal``) give them
(ARCHITECTURE.md invariants 1 and 3; see ``Restart.recover``)."""

from __future__ import annotations

import math

from crawlerd.frontier import hosts as hs
from crawlerd.frontier import journal
from crawlerd.frontier.hosts import HostRecord, wall_of, wall_record
from crawlerd.frontier.items import decode_tagged, hprefix


class Restart:
    """Runs once, as the frontier opens, over the frontier's own tables (shared, not copied)."""

    def __init__(self, *, store, counts: dict, book, blocklist, hosts, ips, ip_floor: dict[str, float],
                 schedule, levels: int, lease_timeout_s: float, pol, off: float, grace: float):
        """``ip_floor`` is filled here: per-IP gaps begun in the last run, in clock seconds, for
        the schedule to apply when it attaches the IP. ``grace``: ``Politeness.restart_grace_s``."""
        self._store, self._c, self._book, self._blocklist = store, counts, book, blocklist
        self._hosts, self._ips, self._ip_floor, self._sched = hosts, ips, ip_floor, schedule
        self._levels, self._lease_timeout_s, self._pol = levels, lease_timeout_s, pol
        self._off, self._grace = off, grace

    def recover(self, now: float, replay: journal.Replay, crashed: bool, last_wall: float) -> int:
        """Return leases of the last run to their queues; activate hosts with work. Returns leases restored.

        Politeness across the restart (ARCHITECTURE.md invariant 1): records hold each host's
        due as of the last commit; the journal adds the dues of requests that ended since, and
        names the hosts whose request may have been cut off. Those wait a whole gap counted from
        the latest the request can have ended (now, or its lease deadline), as if it had lasted
        that long; every other host resumes at its own due.
        """
        self._replay(replay, now)
        st, txn = self._store, self._store.txn()
        touched: dict[str, HostRecord] = {}
        restored = 0
        done = set(replay.completed)
        redone = 0
        for _lid, raw in txn.cursor(db=st.leases):
            _tag, hk, key, urec = decode_tagged(raw)
            if key in done:
                # archived and completed after the last commit: the journal says so, do not fetch again
                done.discard(key)
                redone += 1
                continue
            rec = touched.get(hk)
            if rec is None:
                rec = touched[hk] = HostRecord.decode(txn.get(hk.encode("utf-8", "surrogateescape"), db=st.hosts))
            txn.put(key, urec, db=st.queues)
            restored += 1
        txn.drop(st.leases, delete=False)
        self._c["queued"] += restored
        for key in done:                     # leased and completed since the last commit
            if txn.delete(key, db=st.queues):
                self._c["queued"] -= 1
                redone += 1
        self._c["completed"] += redone
        self._book.redone = redone
        for hk, rec in touched.items():
            txn.put(hk.encode("utf-8", "surrogateescape"), rec.encode(), db=st.hosts)
        for kb, raw in st.scan(st.hosts):
            rec = HostRecord.decode(raw)
            mask = st.level_mask(hprefix(rec.hid), self._levels)   # records of active hosts may lag
            if mask != rec.mask:
                rec.mask = mask
                txn.put(kb, rec.encode(), db=st.hosts)
            if not mask or rec.flags & hs.FLAG_WAITING:
                continue
            hk = kb.decode("utf-8", "surrogateescape")
            if self._blocklist.matches(hk):
                self._book.drop_record_queue(hk, rec, "blocked")
                txn.put(kb, rec.encode(), db=st.hosts)
                continue
            if hk in touched and not replay.usable:
                # a lease was out at the last commit and no journal says how it ended
                rec = wall_record(rec, now + self._off)
                rec.due = max(rec.due, last_wall + self._grace)
                txn.put(kb, rec.encode(), db=st.hosts)
            if self._hosts.full():
                self._sched.to_waiting(hk, rec)
            else:
                self._sched.activate(hk, rec, now)
        self._sched.fill_slots(now)                # reopened with more room than before
        return restored

    def _replay(self, replay: journal.Replay, now: float) -> None:
        """Apply the journal of the last run to the host records (see ``recover``)."""
        if not replay.usable:
            return
        st, txn, off = self._store, self._store.txn(), self._off
        now_wall = wall_of(now, off)
        for hk in replay.ended.keys() | replay.inflight.keys():
            kb = hk.encode("utf-8", "surrogateescape")
            raw = txn.get(kb, db=st.hosts)
            if raw is None:
                continue
            rec = wall_record(HostRecord.decode(raw), now_wall)
            due = replay.ended.get(hk, rec.due)
            t0 = replay.inflight.get(hk)
            if t0 is not None:
                end = max(t0, min(now_wall, t0 + self._lease_timeout_s))
                # one step up: the sum rounded on the wall-clock grid must not end the gap early
                due = max(due, math.nextafter(end + self._pol.gap_s(end - t0, rec.crawl_delay, rec.demote), math.inf))
            if due > rec.due:
                rec.due = due
                txn.put(kb, rec.encode(), db=st.hosts)
        if self._ips.delay_s > 0:
            for ip, end in replay.ip_end.items():
                floor = (min(end, now_wall) - off) + self._ips.delay_s    # wall minus off is exact (Sterbenz)
                if floor > now:
                    self._ip_floor[ip] = floor
