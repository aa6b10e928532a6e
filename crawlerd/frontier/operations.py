"""The operator's side of the Frontier: dropping, blocklist, demotion, drains, stats, invariant checks.

A component of :class:`crawlerd.frontier.scheduler.Frontier`, split out to keep the
scheduling core readable. The Frontier makes one at start and hands it the parts of its
state it works on (the LMDB store, counters, host/IP tables, due heap, leases, blocklist).
It holds no reference back to the Frontier (so dropping a Frontier releases its LMDB
environment at once): the Frontier's own operator methods (``block``, ``stats``, ...)
delegate here and commit afterwards, and the scheduler drops URLs through
``drop_items``/``drop_raw``/``drop_host_queue``/``drop_record_queue``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import numpy as np

from crawlerd.frontier import hosts as hs
from crawlerd.frontier.blocklist import Blocklist
from crawlerd.frontier.hosts import HostRecord
from crawlerd.frontier.items import (
    QueuedURL,
    decode_tagged,
    decode_url,
    encode_tagged,
    encode_url,
    hprefix,
    qkey,
    qkey_level,
    qprefix,
)
from crawlerd.frontier.queues import u64

IN_HEAP = (hs.READY, hs.DNS_BACKOFF)
_STATE_NAMES = {hs.DNS: "waiting for DNS", hs.DNS_BACKOFF: "DNS failed, asking again later", hs.READY: "ready",
                hs.IPWAIT: "waiting for its IP address (per-IP limit)", hs.BUSY: "fetching",
                hs.ROBOTS: "fetching robots.txt"}
DROP_CHUNK = 10000


class FrontierOps:
    """Operator and bookkeeping methods over the Frontier's state (shared by reference, never copied).

    ``recovered`` is set by the Frontier once its start-up recovery has run (leases restored),
    ``redone`` with it (completions the in-flight journal held that the last commit had not)."""

    def __init__(self, *, store, counts: dict, dropped: dict, hosts, ips, heap, leases: dict,
                 blocklist: Blocklist, blocked_slots: set[int], dirty: set[int], levels: int, pol,
                 clock: Callable[[], float], top: int | None = None, deferred_level: int | None = None):
        self._store = store
        self._c = counts
        self._dropped = dropped
        self._hosts = hosts
        self._ips = ips
        self._heap = heap
        self._leases = leases
        self._blocklist = blocklist
        self._blocked_slots = blocked_slots
        self._dirty = dirty
        self._levels = levels
        self._top = levels - 1 if top is None else top          # the last level of the weighted pick
        self.deferred_level = deferred_level                     # served only when a host has nothing else
        self._dbit = 1 << deferred_level if deferred_level is not None else 0
        self._pol = pol
        self._clock = clock
        self.recovered = 0
        self.redone = 0

    # == dropping ===================================================================
    def _event(self, reason: str, hk: str, key: bytes, urec: bytes) -> None:
        self._c["seq"] += 1
        self._store.txn().put(u64(self._c["seq"]), encode_tagged(reason, hk, key, urec), db=self._store.events)

    def _count_drop(self, reason: str, n: int) -> None:
        if n:
            self._dropped[reason] = self._dropped.get(reason, 0) + n

    def drop_items(self, hk: str, items: list[QueuedURL], reason: str) -> None:
        for it in items:
            self._event(reason, hk, qkey(0, min(max(it.priority, 0), self._levels - 1), 0), encode_url(it))
        self._c["added"] += len(items)
        self._count_drop(reason, len(items))

    def drop_raw(self, hk: str, key: bytes, urec: bytes, reason: str) -> None:
        self._event(reason, hk, key, urec)
        self._count_drop(reason, 1)

    def _drain_queue(self, hid: int, hk: str, reason: str) -> int:
        n = 0
        while True:
            chunk = self._store.take_host(hprefix(hid), DROP_CHUNK)
            for key, urec in chunk:
                self._event(reason, hk, key, urec)
            n += len(chunk)
            if len(chunk) < DROP_CHUNK:
                break
        self._c["queued"] -= n
        self._count_drop(reason, n)
        return n

    def drop_host_queue(self, s: int, reason: str) -> None:
        H = self._hosts
        self._drain_queue(H.hid[s], H.keys[s], reason)
        H.mask[s] = 0

    def drop_record_queue(self, hk: str, rec: HostRecord, reason: str) -> None:
        self._drain_queue(rec.hid, hk, reason)
        rec.mask = 0

    def drain_dropped(self, limit: int = 10000) -> list[tuple[QueuedURL, str]]:
        """Hand out (and forget) up to ``limit`` dropped or dead-lettered URLs with their reason (caller commits)."""
        st = self._store
        txn = st.txn()
        out = []
        cur = txn.cursor(db=st.events)
        if cur.first():
            while len(out) < limit:
                raw = cur.value()
                if not raw:
                    break
                reason, hk, key, urec = decode_tagged(raw)
                out.append((decode_url(urec, hk, qkey_level(key)), reason))
                if not cur.delete():
                    break
        return out

    def dead_letters(self, limit: int = 1000) -> list[tuple[QueuedURL, str]]:
        """Dead-lettered URLs with the outcome they ended in (oldest first; they stay stored)."""
        out = []
        for _k, raw in self._store.txn().cursor(db=self._store.dead):
            if len(out) >= limit:
                break
            tag, hk, key, urec = decode_tagged(raw)
            out.append((decode_url(urec, hk, qkey_level(key)), tag))
        return out

    # == blocklist ====================================================================
    def block(self, pattern: str, settle: Callable[[int, float], None]) -> int:
        """Block a host or domain (covers subdomains) at once; drops its queued URLs. Returns URLs dropped.

        ``settle(slot, now)`` reschedules an active host (the Frontier's); the caller commits."""
        p = self._blocklist.add(pattern)
        self._store.put_block(p, True)
        now = self._clock()
        before = self._dropped.get("blocked", 0)
        H = self._hosts
        for hk, s in sorted(H.slot_of.items()):      # sorted: the same order in every run
            if Blocklist.covers(p, hk) and H.keys[s] == hk:
                self._blocked_slots.add(s)
                self._dirty.add(s)
                self.drop_host_queue(s, "blocked")
                settle(s, now)
        hit = []
        for kb, raw in self._store.scan(self._store.hosts):
            hk = kb.decode("utf-8", "surrogateescape")
            if hk not in H.slot_of and Blocklist.covers(p, hk):
                rec = HostRecord.decode(raw)
                if rec.mask:
                    hit.append((hk, rec))
        for hk, rec in hit:
            self.drop_record_queue(hk, rec, "blocked")
            self.put_record(hk, rec)
        return self._dropped.get("blocked", 0) - before

    def unblock(self, pattern: str) -> None:
        """Unblock a pattern (caller commits)."""
        p = self._blocklist.discard(pattern)
        self._store.put_block(p, False)
        H = self._hosts
        # in place: the Frontier holds the same set
        self._blocked_slots.intersection_update({s for s in self._blocked_slots if self._blocklist.matches(H.keys[s])})

    def blocked(self) -> list[str]:
        return list(self._blocklist)

    def is_blocked(self, host: str) -> bool:
        return self._blocklist.matches(host)

    # == feedback ======================================================================
    def demote_host(self, host_key: str, levels: int = 1) -> None:
        """Near-duplicate trap feedback: later URLs of the host queue ``levels`` lower and it is
        visited (1 + demotion) times less often. Already queued URLs keep their level."""
        last = self._top
        s = self._hosts.slot_of.get(host_key)
        if s is not None:
            self._hosts.demote[s] = max(0, min(last, self._hosts.demote[s] + levels))
            self._dirty.add(s)
            return
        rec = self.record(host_key)
        if rec is None:
            rec = HostRecord(self._c["hid_next"], flags=hs.FLAG_WALL)
            self._c["hid_next"] += 1
        rec.demote = max(0, min(last, rec.demote + levels))
        self.put_record(host_key, rec)

    def promote_deferred(self, host_key: str, level_of: Callable[[QueuedURL], int | None], limit: int = 0,
                         max_scan: int = 0) -> int:
        """Move URLs of the host's deferred level to the level ``level_of`` gives (None: stay),
        oldest first, at most ``limit`` of the first ``max_scan`` (0: no limit).

        Called when what made them suspects changed (a parameter turned out to change content),
        or to fetch one as a probe. Returns how many moved. Nothing is lost or counted twice."""
        if self.deferred_level is None:
            return 0
        H, st = self._hosts, self._store
        s = H.slot_of.get(host_key)
        rec = None
        if s is not None:
            hid, mask = H.hid[s], H.mask[s]
        else:
            rec = self.record(host_key)
            if rec is None:
                return 0
            hid, mask = rec.hid, rec.mask
        if not mask & self._dbit:
            return 0
        prefix = qprefix(hid, self.deferred_level)
        cur = st.qcursor()
        moves, left, scanned = [], False, 0
        if cur.set_range(prefix):
            for key, urec in cur:
                if key[:5] != prefix:
                    break
                scanned += 1
                if (limit and len(moves) >= limit) or (max_scan and scanned > max_scan):
                    left = True
                    break
                level = level_of(decode_url(urec, host_key, self.deferred_level))
                if level is None:
                    left = True
                else:
                    moves.append((key, urec, max(0, min(self._top, level))))
        if not moves:
            return 0
        puts = []
        for key, urec, level in moves:
            st.delete_queued(key)
            self._c["seq"] += 1
            puts.append((qkey(hid, level, self._c["seq"]), urec))
            mask |= 1 << level
        st.put_sorted(puts)
        if not left:
            mask &= ~self._dbit
        if s is not None:
            H.mask[s] = mask
        else:
            rec.mask = mask
            self.put_record(host_key, rec)
        return len(moves)

    def deferred_count(self, host_key: str) -> int:
        """URLs waiting in the host's deferred level (a scan of that range: for tests and tools)."""
        if self.deferred_level is None:
            return 0
        s = self._hosts.slot_of.get(host_key)
        if s is not None:
            hid = self._hosts.hid[s]
        else:
            rec = self.record(host_key)
            if rec is None:
                return 0
            hid = rec.hid
        prefix = qprefix(hid, self.deferred_level)
        cur, n = self._store.qcursor(), 0
        if cur.set_range(prefix):
            for key in cur.iternext(values=False):
                if key[:5] != prefix:
                    break
                n += 1
        return n

    # == records ==========================================================================
    def record(self, host_key: str) -> HostRecord | None:
        raw = self._store.txn().get(host_key.encode("utf-8", "surrogateescape"), db=self._store.hosts)
        return None if raw is None else HostRecord.decode(raw)

    def put_record(self, host_key: str, rec: HostRecord) -> None:
        self._store.txn().put(host_key.encode("utf-8", "surrogateescape"), rec.encode(), db=self._store.hosts)

    # == introspection =======================================================================
    def check_invariants(self, deep: bool = False) -> None:
        """Raise AssertionError naming the first broken invariant. ``deep`` also recounts LMDB."""
        H, heap, ips = self._hosts, self._heap, self._ips
        heap.check_invariant(lambda s: s < len(H.keys) and H.keys[s] is not None)
        in_heap = 0
        out_total = 0
        for hk, s in H.slot_of.items():
            st, mask, out = H.state[s], H.mask[s], H.out[s]
            where = f"host {hk} (state {st}, levels {mask:b}, leases {out})"
            assert H.keys[s] == hk, f"{where}: slot key mismatch"
            assert (s in heap) == (st in IN_HEAP), f"{where}: in heap {s in heap}"
            assert heap.placed(s), f"{where}: in the wrong heap of the working set"
            in_heap += st in IN_HEAP
            out_total += out
            assert mask or out > 0, f"{where}: active with no work and no lease"
            if st in (hs.READY, hs.DNS, hs.DNS_BACKOFF, hs.IPWAIT):
                assert mask and out < H.conc[s], f"{where}: scheduled without work or room"
            if st in (hs.READY, hs.IPWAIT):
                assert H.ip[s] >= 0, f"{where}: scheduled without an IP"
            if st in (hs.BUSY, hs.ROBOTS):
                assert out > 0, f"{where}: busy without a lease"
            assert st != 0, f"{where}: no state"
        assert in_heap == len(heap), f"heap holds {len(heap)} hosts, {in_heap} are scheduled"
        assert out_total == len(self._leases), f"{out_total} leases by host, {len(self._leases)} out"
        per_ip: dict[int, int] = {}
        for o in self._leases.values():
            per_ip[o.ip] = per_ip.get(o.ip, 0) + 1
        for ip, n in per_ip.items():
            assert n == ips.inflight[ip] <= ips.limit, f"IP {ips.names[ip]}: {n} leases, {ips.inflight[ip]} counted"
        s = self.stats()
        total = s["queued"] + s["leased_urls"] + s["completed"] + s["dead_letter"] + s["dropped_total"]
        assert s["added"] == total, f"accounting: added {s['added']} != {total} ({s})"
        if deep:
            st = self._store
            masks: dict[bytes, int] = {}
            entries = 0
            for k in st.txn().cursor(db=st.queues).iternext(values=False):
                masks[k[:4]] = masks.get(k[:4], 0) | 1 << k[4]
                entries += 1
            assert entries == s["queued"], f"{entries} queue entries, {s['queued']} counted"
            assert st.count(st.leases, exact=True) <= s["leased_urls"]
            for hk, s_ in H.slot_of.items():
                p = hprefix(H.hid[s_])
                assert masks.get(p, 0) == H.mask[s_], f"host {hk}: levels {masks.get(p, 0):b} != {H.mask[s_]:b}"
            waiting = 0
            for kb, raw in st.scan(st.hosts):
                rec = HostRecord.decode(raw)
                waiting += bool(rec.flags & hs.FLAG_WAITING)
                hk = kb.decode("utf-8", "surrogateescape")
                if hk in H.slot_of:
                    continue
                p = hprefix(rec.hid)
                assert masks.get(p, 0) == rec.mask, f"inactive host {hk}: levels {rec.mask:b}"
                assert rec.mask == 0 or rec.flags & hs.FLAG_WAITING, f"inactive host {hk} has work, not waiting"
            assert waiting == self._c["waiting"] == st.count(st.waiting, exact=True), "waiting table out of step"

    def queued(self) -> int:
        return self._c["queued"]

    def explain(self, url: str, host_key: str, now: float | None = None, max_scan: int = 200_000) -> dict:
        """Where the frontier holds ``url``: leased, queued (level and place), or not held; its host's state.

        Looks at the leases in flight and walks that one host's queue (at most ``max_scan`` entries),
        never the whole frontier.
        """
        now = self._clock() if now is None else now
        out: dict = {"host": host_key, "blocked": self._blocklist.matches(host_key)}
        for o in self._leases.values():
            if o.lease.url == url:
                out["leased"] = {"kind": o.lease.kind, "attempt": o.lease.attempt,
                                 "deadline_in_s": round(o.lease.deadline - now, 3)}
        H = self._hosts
        s = H.slot_of.get(host_key)
        if s is not None:
            hid, mask = H.hid[s], H.mask[s]
            out["host_state"] = _STATE_NAMES.get(H.state[s], str(H.state[s]))
            out["due_in_s"] = round(H.due[s] - now, 3)
            out["leases_out"] = H.out[s]
            out["failures"] = H.fails[s]
            out["robots_known"] = H.robots_exp[s] > now
        else:
            rec = self.record(host_key)
            if rec is None:
                out["host_state"] = "unknown to the frontier"
                return out
            hid, mask = rec.hid, rec.mask
            out["host_state"] = "waiting for an active slot" if rec.flags & hs.FLAG_WAITING else "inactive"
            out["failures"] = rec.fails
        out["levels_queued"] = [lv for lv in range(self._levels) if mask >> lv & 1]
        cur = self._store.txn().cursor(db=self._store.queues)
        prefix = hprefix(hid)
        ahead = [0] * self._levels
        scanned = 0
        found = cur.set_range(prefix)
        while found and scanned < max_scan:
            key = cur.key()
            if not key.startswith(prefix):
                break
            level = qkey_level(key)
            if decode_url(cur.value(), host_key, level).url == url:
                out["queued"] = {"level": level, "ahead_in_level": ahead[level]}
                break
            ahead[level] += 1
            scanned += 1
            found = cur.next()
        if scanned >= max_scan and "queued" not in out:
            out["queue_scan"] = f"stopped after {max_scan} entries"
        for _key, raw in itertools.islice(self._store.scan(self._store.dead), max_scan):   # dead letters: bounded
            tag, hk, _k, urec = decode_tagged(raw)
            if hk == host_key and decode_url(urec, hk, qkey_level(_k)).url == url:
                out["dead_letter"] = tag
                break
        return out

    def storage(self) -> dict[str, int]:
        """LMDB bytes and entries per table (for stats and the bench)."""
        return self._store.usage()

    def backed_off(self, now: float, n: int = 10) -> list[dict]:
        """The ``n`` active hosts with the most consecutive failures (backoff exponent), worst first:
        host, failures, seconds until it may be fetched again, and whether it is parked."""
        H = self._hosts
        found = [(f, H.due[s], s) for s, f in enumerate(H.fails) if f and H.keys[s] is not None]
        park = self._pol.park_after_failures
        return [{"host": H.keys[s], "failures": f, "wait_s": round(max(0.0, due - now), 3), "parked": f >= park}
                for f, due, s in heapq.nlargest(n, found)]

    def stats(self) -> dict:
        H = self._hosts
        park = self._pol.park_after_failures
        # counted in C over the slot arrays (a free slot has state 0): status is asked every second
        # and a Python walk of 20,000 active hosts cost the loop milliseconds each time
        state = H.state.tobytes()
        active = np.frombuffer(state, dtype=np.uint8) != 0
        parked = int(np.count_nonzero(active & (np.frombuffer(H.fails, dtype=np.uint16) >= park)))
        url_leases = sum(1 for o in self._leases.values() if o.key is not None)
        return {
            "added": self._c["added"],
            "queued": self._c["queued"],
            "leased": len(self._leases),
            "leased_urls": url_leases,
            "completed": self._c["completed"],
            "dead_letter": self._c["dead"],
            "dropped": dict(self._dropped),
            "dropped_total": sum(self._dropped.values()),
            "retried": self._c["retried"],
            "requeued": self._c["requeued"],
            "expired": self._c["expired"],
            "recovered_leases": self.recovered, "recovered_completions": self.redone,
            "hosts_active": len(H),
            "hosts_total": self._store.count(self._store.hosts),
            "hosts_waiting": self._c["waiting"],
            "hosts_ready": len(self._heap),
            **self._heap.stats(),
            "hosts_dns": state.count(hs.DNS) + state.count(hs.DNS_BACKOFF),
            "hosts_ip_wait": state.count(hs.IPWAIT),
            "parked": parked,
            "ips_active": len(self._ips),
        }
