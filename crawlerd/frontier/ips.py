"""Per-IP politeness: requests in flight, the IP's own gap, and hosts waiting for it.

Many hosts can share one address (virtual hosting), so the per-host gap alone
does not bound the load on a server (IRLbot §6.2 budgets per IP as well).
"""

from __future__ import annotations

import heapq
from array import array

from crawlerd.frontier.keyindex import KeyIndex


class IPTable:
    """Addresses used by active hosts or leases. Key: IP slot (dense int, reused).

    Invariants: ``inflight[s] <= limit`` for every slot; ``slot_of[names[s]] ==
    s`` (a :class:`KeyIndex`) for live slots; a slot is freed only when no host refers to it, nothing
    is in flight and its ``due`` has passed (so ``ip_delay_s`` survives a host
    leaving). ``waiters[s]`` is a heap of ``(host due, host id, host slot)`` of
    hosts that were due while the IP was full; entries are checked against the
    host table when popped (a host that left IPWAIT is skipped).
    """

    __slots__ = ("limit", "delay_s", "slot_of", "names", "free", "inflight", "due", "refs", "waiters", "idle")

    def __init__(self, limit: int, delay_s: float):
        self.limit = limit
        self.delay_s = delay_s
        self.names: list[str | None] = []
        self.slot_of = KeyIndex(self.names)
        self.free: list[int] = []
        self.inflight = array("H")
        self.due = array("d")
        self.refs = array("I")
        self.waiters: dict[int, list[tuple[float, int, int]]] = {}
        self.idle: set[int] = set()

    def __len__(self) -> int:
        return len(self.slot_of)

    def attach(self, ip: str) -> int:
        """A host (or lease) starts using ``ip``; returns its slot."""
        s = self.slot_of.get(ip)
        if s is None:
            if self.free:
                s = self.free.pop()
                self.names[s] = ip
                self.inflight[s], self.due[s], self.refs[s] = 0, 0.0, 0
            else:
                s = len(self.names)
                self.names.append(ip)
                self.inflight.append(0)
                self.due.append(0.0)
                self.refs.append(0)
            self.slot_of.put(ip, s)
        self.refs[s] += 1
        self.idle.discard(s)
        return s

    def detach(self, s: int) -> None:
        self.refs[s] -= 1
        if self.refs[s] == 0:
            self.idle.add(s)

    def sweep(self, now: float) -> int:
        """Free idle slots whose gap has passed; returns how many."""
        done = [s for s in self.idle if self.refs[s] == 0 and self.inflight[s] == 0 and self.due[s] <= now]
        for s in done:
            self.idle.discard(s)
            self.waiters.pop(s, None)
            self.slot_of.delete(self.names[s])
            self.names[s] = None
            self.free.append(s)
        return len(done)

    def available(self, s: int, now: float) -> bool:
        return self.inflight[s] < self.limit and self.due[s] <= now

    def start(self, s: int, now: float) -> None:
        # The caller holds a ref for the lease until finish().
        self.inflight[s] += 1
        d = now + self.delay_s
        if d > self.due[s]:
            self.due[s] = d

    def cancel(self, s: int) -> None:
        """A lease on the IP ended without a request: one fewer in flight, its due time unchanged."""
        self.inflight[s] -= 1

    def finish(self, s: int, now: float) -> None:
        self.inflight[s] -= 1
        d = now + self.delay_s
        if d > self.due[s]:
            self.due[s] = d

    def wait(self, s: int, due: float, hid: int, slot: int) -> None:
        w = self.waiters.get(s)
        if w is None:
            self.waiters[s] = [(due, hid, slot)]
        else:
            heapq.heappush(w, (due, hid, slot))

    def pop_waiter(self, s: int) -> tuple[float, int, int] | None:
        w = self.waiters.get(s)
        if not w:
            return None
        entry = heapq.heappop(w)
        if not w:
            del self.waiters[s]
        return entry
