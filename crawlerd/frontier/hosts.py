"""Per-host politeness state: a compact in-RAM table for active hosts, a record on disk for all.

A host is *active* while it has queued URLs or leases out, up to
``max_active_hosts``; its state then lives in one slot of :class:`HostTable`
(struct-of-arrays, about 50 bytes a slot, plus its key string and ~12 bytes of
index). When it runs
dry it is written back as a :class:`HostRecord` under its host key in the LMDB
``hosts`` table and its slot is reused, so RAM follows active hosts only
(ARCHITECTURE.md invariant 4).
"""

from __future__ import annotations

import math
import struct
from array import array
from dataclasses import dataclass

from crawlerd.frontier.keyindex import KeyIndex

# Host states (slot of an active host). In the due heap exactly when READY or DNS_BACKOFF.
DNS = 1            # waiting for set_host_ip (listed by hosts_needing_dns)
DNS_BACKOFF = 2    # DNS failed transiently; at its due time it asks again
READY = 3          # may be leased at its due time
IPWAIT = 4         # due, but its IP is at per_ip_concurrency; waits in the IP's waiter heap
BUSY = 5           # at its lease limit, or has leases out and nothing queued
ROBOTS = 6         # its robots.txt lease is out: no URL lease until that returns

FLAG_WAITING = 1   # HostRecord: listed in the waiting table (no free slot when it got work)
FLAG_WALL = 2      # HostRecord: times are wall-clock seconds (records without it: session-relative)

_REC = struct.Struct("<IHIHBBIddddd")


@dataclass(slots=True)
class HostRecord:
    """Value of the ``hosts`` table. Key: host key (UTF-8).

    Invariant (every committed transaction): for a host that is not active,
    ``mask`` has bit ``l`` set iff level ``l`` of its queue is non-empty. An
    active host's mask lives in RAM and its record may lag behind (add() does
    not rewrite records), so opening the store re-derives every mask from the
    ``queues`` table. With ``FLAG_WALL`` (every record this version writes) the
    times are absolute wall-clock seconds: ``due`` is the earliest next request
    (last request end + its gap, or a backoff), ``robots_exp`` when robots.txt must
    be read again (0: unknown), ``ip_exp`` when ``ip`` (resolved in session
    ``session``) expires, ``written_at`` when the record was written. Records of
    older versions hold clock readings of their session instead (see
    :func:`wall_record`).
    """

    hid: int
    mask: int = 0
    picks: int = 0
    fails: int = 0
    demote: int = 0
    flags: int = 0
    session: int = 0
    written_at: float = 0.0
    due: float = 0.0
    robots_exp: float = 0.0
    crawl_delay: float = 0.0
    ip_exp: float = 0.0
    ip: str = ""

    def encode(self) -> bytes:
        return _REC.pack(self.hid, self.mask, self.picks & 0xFFFFFFFF, min(self.fails, 0xFFFF),
                         self.demote, self.flags, self.session, self.written_at, self.due, self.robots_exp,
                         self.crawl_delay, self.ip_exp) + self.ip.encode()

    @classmethod
    def decode(cls, raw: bytes) -> HostRecord:
        return cls(*_REC.unpack_from(raw), raw[_REC.size:].decode())


def wall_of(t: float, off: float) -> float:
    """Clock time ``t`` as wall-clock time, rounded up: ``wall_of(t, off) - off >= t``.

    ``t + off`` rounds to the grid of the larger wall-clock number (about 0.2 us near 1.7e9), so
    a due converted there and back may come out a few ns early; a gap end must never come early
    (ARCHITECTURE.md invariant 1)."""
    w = t + off
    while w - off < t:
        w = math.nextafter(w, math.inf)
    return w


def wall_record(rec: HostRecord, now_wall: float) -> HostRecord:
    """``rec`` with wall-clock times: a record of an older version keeps only its remaining wait."""
    if not rec.flags & FLAG_WALL:
        rec.due = now_wall + max(0.0, rec.due - rec.written_at)
        rec.written_at = now_wall
        rec.robots_exp = 0.0
        rec.ip, rec.ip_exp = "", 0.0
        rec.flags |= FLAG_WALL
    return rec


class HostTable:
    """Active hosts by slot. Key: slot (dense int, reused; the due heap's host id).

    Invariant: ``slot_of.get(keys[s]) == s`` for every live slot ``s``; ``keys[s]``
    is None exactly for slots on the free list; ``len(slot_of) <= capacity``.
    """

    __slots__ = ("capacity", "slot_of", "keys", "free", "hid", "mask", "picks", "fails", "demote",
                 "state", "out", "conc", "due", "robots_exp", "crawl_delay", "ip_exp", "ip")

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.keys: list[str | None] = []
        self.slot_of = KeyIndex(self.keys)
        self.free: list[int] = []
        self.hid = array("I")           # persistent host id (queue key prefix)
        self.mask = array("H")          # bit l set iff level l of its queue is non-empty (0: no work)
        self.picks = array("I")         # level picks so far (drives the ruler sequence)
        self.fails = array("H")         # consecutive failures (backoff exponent)
        self.demote = array("B")        # near-duplicate demotion, levels
        self.state = array("B")
        self.out = array("B")           # leases out
        self.conc = array("B")          # lease limit (1 unless host_concurrency says more)
        self.due = array("d")           # earliest start of the next request
        self.robots_exp = array("d")    # robots.txt known until (0: unknown)
        self.crawl_delay = array("f")   # robots Crawl-delay, capped, seconds
        self.ip_exp = array("d")        # IP known until
        self.ip = array("i")            # IP slot, -1 unknown

    def __len__(self) -> int:
        return len(self.slot_of)

    def full(self) -> bool:
        return len(self.slot_of) >= self.capacity

    def add(self, key: str, rec: HostRecord, conc: int) -> int:
        """Give ``key`` a slot filled from ``rec`` (times already converted to this session's clock)."""
        if self.free:
            s = self.free.pop()
            self.keys[s] = key
            self.hid[s], self.mask[s], self.picks[s] = rec.hid, rec.mask, rec.picks
            self.fails[s], self.demote[s], self.state[s], self.out[s], self.conc[s] = (
                rec.fails, rec.demote, 0, 0, conc)
            self.due[s], self.robots_exp[s], self.crawl_delay[s], self.ip_exp[s], self.ip[s] = (
                rec.due, rec.robots_exp, rec.crawl_delay, rec.ip_exp, -1)
        else:
            s = len(self.keys)
            self.keys.append(key)
            self.hid.append(rec.hid)
            self.mask.append(rec.mask)
            self.picks.append(rec.picks)
            self.fails.append(rec.fails)
            self.demote.append(rec.demote)
            self.state.append(0)
            self.out.append(0)
            self.conc.append(conc)
            self.due.append(rec.due)
            self.robots_exp.append(rec.robots_exp)
            self.crawl_delay.append(rec.crawl_delay)
            self.ip_exp.append(rec.ip_exp)
            self.ip.append(-1)
        self.slot_of.put(key, s)
        return s

    def record(self, s: int, session: int, now: float, ip: str, off: float) -> HostRecord:
        """Slot ``s`` as a wall-clock record; ``off`` is wall minus clock for this session."""
        rexp = self.robots_exp[s]
        return HostRecord(self.hid[s], self.mask[s], self.picks[s], self.fails[s],
                          self.demote[s], FLAG_WALL, session, now + off, wall_of(self.due[s], off),
                          rexp + off if rexp > 0 else 0.0, self.crawl_delay[s], self.ip_exp[s] + off, ip)

    def release(self, s: int) -> None:
        self.slot_of.delete(self.keys[s])
        self.keys[s] = None
        self.state[s] = 0
        self.free.append(s)
