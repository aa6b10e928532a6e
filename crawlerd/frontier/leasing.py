"""One host's lease taken and given back: the frontier's per-host and per-IP checks at lease
time, and at release the politeness gap, backoff, retries and dead letters (ARCHITECTURE.md
invariant 1; the frontier's package docstring tells the whole cycle).

With several shards a lease also takes a cell of its IP in the shared slot table
(``crawlerd._native.ipslots``), keyed by ``ip_key``.
"""

from __future__ import annotations

import xxhash

from crawlerd.frontier import hosts as hs
from crawlerd.frontier.hosts import wall_of
from crawlerd.frontier.items import (
    KIND_ROBOTS,
    KIND_URL,
    Lease,
    decode_url,
    encode_tagged,
    qkey_level,
    qprefix,
    with_attempts,
)
from crawlerd.frontier.politeness import RETRY_LATER_STATUS, is_failure, is_retryable
from crawlerd.frontier.queues import u64
from crawlerd.outcome import Outcome


class LeaseOut:
    """A lease in flight. Key: lease id in the frontier's ``leases`` map."""

    __slots__ = ("lease", "slot", "hid", "ip", "key", "urec")

    def __init__(self, lease: Lease, slot: int, hid: int, ip: int, key: bytes | None, urec: bytes | None):
        self.lease, self.slot, self.hid, self.ip, self.key, self.urec = lease, slot, hid, ip, key, urec


# A lease put off because another shard holds its IP looks again this much later, seconds.
SHARED_IP_RETRY_S = 0.02


def ip_key(ip: str) -> int:
    """The shared IP slot table's key of an address (xxh3_64 of its text)."""
    return xxhash.xxh3_64_intdigest(ip.encode())


class Leasing:
    """Leases over the frontier's own tables (shared, not copied). Key of ``leases``: lease id.
    Invariant: a lease is in ``leases`` from ``lease_host`` until its ``release``; while it is
    out its host counts it in ``out`` and its IP in ``inflight`` (``FrontierOps.check_invariants``
    verifies both counts)."""

    def __init__(self, *, store, counts: dict, hosts, ips, heap, leases: dict[int, LeaseOut], need_dns: set[int],
                 dirty: set[int], blocked_slots: set[int], book, schedule, journal, pol, rng, shared_ips,
                 ip_delay_s: float, lease_timeout_s: float, max_attempts: int, off: float):
        self._store, self._c, self._hosts, self._ips, self._heap = store, counts, hosts, ips, heap
        self._leases, self._need_dns, self._dirty, self._blocked_slots = leases, need_dns, dirty, blocked_slots
        self._book, self._sched, self._journal, self._pol, self._rng = book, schedule, journal, pol, rng
        self._shared, self._ip_delay_s = shared_ips, ip_delay_s
        self._lease_timeout_s, self._max_attempts, self._off = lease_timeout_s, max_attempts, off
        self.shared_ip_waits = 0         # leases put off because another shard held the IP

    def lease_host(self, s: int, now: float) -> Lease | None:
        H, ips = self._hosts, self._ips
        if H.state[s] == hs.DNS_BACKOFF:
            H.state[s] = hs.DNS
            self._need_dns.add(s)
            return None
        ip = H.ip[s]
        if ip < 0 or H.ip_exp[s] <= now:
            H.state[s] = hs.DNS
            self._need_dns.add(s)
            if ip >= 0:
                self._sched.wake_ip(ip)
            return None
        if ips.inflight[ip] >= ips.limit:
            H.state[s] = hs.IPWAIT
            ips.wait(ip, H.due[s], H.hid[s], s)
            return None
        if ips.due[ip] > now:
            self._heap.push(s, ips.due[ip])
            return None
        if self._shared is not None:
            if H.robots_exp[s] <= now and H.out[s]:
                H.state[s] = hs.BUSY     # robots expired while URL leases are out: wait for them
                return None
            wait = self._shared.try_acquire(ip_key(ips.names[ip]), now, self._ip_delay_s)
            if wait:
                # another shard's request to this IP (or its gap): look again then, or soon
                self.shared_ip_waits += 1
                self._heap.push(s, wait if wait > now else now + SHARED_IP_RETRY_S)
                return None
        hk = H.keys[s]
        self._c["lease_seq"] += 1
        lid = self._c["lease_seq"]
        deadline = now + self._lease_timeout_s
        if H.robots_exp[s] <= now:
            if H.out[s]:
                H.state[s] = hs.BUSY     # robots expired while URL leases are out: wait for them
                return None
            H.state[s] = hs.ROBOTS
            lease = Lease(lid, KIND_ROBOTS, hk, hk + "/robots.txt", None, deadline, 1, ips.names[ip])
            self._leases[lid] = LeaseOut(lease, s, H.hid[s], ip, None, None)
        else:
            hid = H.hid[s]
            level = self._sched.pick_level(s)
            head = self._store.pop_head(qprefix(hid, level))
            if head is None:
                raise RuntimeError(f"frontier: queue {hk} level {level} is empty but marked non-empty")
            key, urec, more = head
            if not more:
                H.mask[s] &= ~(1 << level)
            self._c["queued"] -= 1
            item = decode_url(urec, hk, level)
            self._store.put_lease(lid, encode_tagged("", hk, key, urec))
            lease = Lease(lid, KIND_URL, hk, item.url, item, deadline, item.attempts + 1, ips.names[ip])
            self._leases[lid] = LeaseOut(lease, s, hid, ip, key, urec)
            if H.out[s] + 1 < H.conc[s] and H.mask[s]:
                H.state[s] = hs.READY
                self._heap.push(s, H.due[s])
            else:
                H.state[s] = hs.BUSY
        H.out[s] += 1
        self._heap.leased(s)         # counts against the host's working-set session
        ips.start(ip, now)
        ips.refs[ip] += 1            # the lease holds its IP until it is released
        return lease

    def release(self, o: LeaseOut, now: float, outcome: Outcome, status: int, response_time_s: float,
                 retry_after_s: float | None, requeue: bool, unfetched: bool = False) -> float:
        H, ips, pol = self._hosts, self._ips, self._pol
        s, lease = o.slot, o.lease
        if self._shared is not None:
            # unfetched: nothing was sent, so the shared due is not pushed past its acquire-time gap
            self._shared.release(ip_key(ips.names[o.ip]), now, 0.0 if unfetched else self._ip_delay_s)
        if unfetched:
            ips.cancel(o.ip)            # nothing was sent: the IP's own gap does not move
        else:
            ips.finish(o.ip, now)
        ips.detach(o.ip)
        self._sched.wake_ip(o.ip)
        H.out[s] -= 1
        gap = 0.0 if unfetched else pol.gap_s(response_time_s, H.crawl_delay[s], H.demote[s])
        if not requeue and is_failure(outcome, status):
            fails = min(H.fails[s] + 1, 0xFFFF)
            H.fails[s] = fails
            wait = pol.failure_wait_s(fails, retry_after_s if status in RETRY_LATER_STATUS else None, self._rng)
            if wait > gap:
                gap = wait
            self._dirty.add(s)
        elif not requeue and H.fails[s]:
            H.fails[s] >>= 1          # success decays the backoff exponent
            self._dirty.add(s)
        elif requeue and retry_after_s is not None and retry_after_s > gap:
            # handed back unfetched with a reason to wait (robots.txt unavailable): no attempt counted
            gap = min(retry_after_s, pol.retry_after_cap_s)
        due = now + gap
        if due > H.due[s]:
            H.due[s] = due
        done_key = None
        if lease.kind == KIND_URL and self._finish_url(o, outcome, status, requeue):
            done_key = o.key
        # until the next commit the journal holds this due and, for a completed URL, that it is done
        self._journal.ended(lease.lease_id, wall_of(now, self._off), wall_of(H.due[s], self._off), done_key)
        self._dirty.add(s)
        if H.state[s] == hs.ROBOTS:
            H.state[s] = hs.BUSY
        elif H.state[s] == hs.READY:
            self._heap.update(s, H.due[s])
        self._heap.spend(s, now)     # a used-up working-set session: to the back of the idle hosts
        self._sched.settle(s, now)
        return gap

    def _finish_url(self, o: LeaseOut, outcome: Outcome, status: int, requeue: bool) -> bool:
        """Settle a URL lease; True when the URL is completed (it leaves the frontier)."""
        s = o.slot
        self._store.end_lease(o.lease.lease_id)
        hk = o.lease.host_key
        if not requeue and not is_retryable(outcome, status):
            self._c["completed"] += 1
            return True
        if s in self._blocked_slots:
            self._book.drop_raw(hk, o.key, o.urec, "blocked")    # blocked while it was out: not back in
        elif requeue:
            self._c["requeued"] += 1
            self._put_back(s, o.key, o.urec)
        else:
            attempts = o.lease.attempt
            if attempts >= self._max_attempts:
                self._dead_letter(hk, o.key, o.urec, outcome, status)
            else:
                self._c["retried"] += 1
                self._put_back(s, o.key, with_attempts(o.urec, attempts))
        return False

    def _put_back(self, s: int, key: bytes, urec: bytes) -> None:
        H = self._hosts
        self._store.put_queued(key, urec)
        H.mask[s] |= 1 << qkey_level(key)
        self._c["queued"] += 1

    def _dead_letter(self, hk: str, key: bytes, urec: bytes, outcome: Outcome, status: int) -> None:
        st = self._store
        self._c["seq"] += 1
        tag = outcome.value if not status else f"{outcome.value}:{status}"
        st.txn().put(u64(self._c["seq"]), encode_tagged(tag, hk, key, urec), db=st.dead)
        st.txn().put(u64(self._c["seq"]), encode_tagged("dead_letter:" + tag, hk, key, urec), db=st.events)
        self._c["dead"] += 1
