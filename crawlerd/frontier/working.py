"""The working set: the hosts the frontier leases from, so their connections outlive the gap.

When more hosts are ready than the crawl can serve, a due-time heap alone serves the most
overdue host first and round-robins over all of them: each host's turn comes back only after
every other ready host's, far beyond any keep-alive, so almost every request opens a new
connection (and over HTTPS makes a full TLS handshake). Like Heritrix's active queues and
BUbiNG's workbench, the frontier instead leases from a *working set* of hosts (members): each
member comes due every politeness gap, its connection is kept alive across the gap
(``fetch.keep_alive_idle_s``'s "next turn soon" rule, ``sharers``), and it stays for a
*session* of at most ``session_fetches`` leases or ``session_s`` seconds. Other scheduled
hosts wait in the *idle* heap: a FIFO by the time they became ready (due, or pushed, whichever
is later), so a host that just ended its session goes to the back.

Sizing. A member enters when ``pop_due`` finds fewer due members than the leases asked for
(free transfer slots): the set grows until throughput, not politeness, binds. While members
are due, nobody enters, and members whose session ends are not replaced, so a set larger than
the crawl's rate needs shrinks back (its members wait overdue meanwhile, still within their
politeness). ``cap`` bounds it (``frontier.working_set_max``; 0 turns the working set off: every
host is a member of one heap, the due-time order of earlier versions).

A session ends only while some host waits idle (with none, a member goes on: a one-host crawl
keeps its connection). Starvation-free: members leave after a bounded session while hosts wait
(or once they have no URL queued), a free slot then admits the idle host that became ready
first, and a host entering the idle heap is keyed no earlier than the latest lease call, so it
queues behind every host ready before it. Politeness is untouched: an idle key is never earlier
than the host's due.
"""

from __future__ import annotations

import math

from crawlerd._native.heap import DueHeap


class WorkingSet:
    """The frontier's due heap, split into members and idle hosts; the same calls as ``DueHeap``.

    Key: host slot. Invariant: a scheduled host (READY or DNS_BACKOFF) is in exactly one of the
    two heaps, the members' heap iff it is a member (``check_invariant``); ``session`` holds
    exactly the members, each with its leases this session and its start; with the working set
    off there are no members and every host is in the members' heap.
    """

    def __init__(self, cap: int = 0, session_fetches: int = 20, session_s: float = 30.0):
        if cap < 0 or session_fetches < 1 or not session_s > 0:
            raise ValueError(f"working set: cap {cap} (>= 0), session_fetches {session_fetches} (>= 1), "
                             f"session_s {session_s} (> 0)")
        self.cap = cap
        self.session_fetches = session_fetches
        self.session_s = session_s
        self._act = DueHeap(1024)        # members (all hosts when off), keyed by due
        self._idle = DueHeap(1024)       # the others, keyed by max(due, the latest lease call's now)
        self.session: dict[int, list] = {}      # member slot -> [leases this session, session start]
        self._now = -math.inf            # the latest time pop_due was asked about
        self.sessions = 0                # sessions started
        self.spent = 0                   # sessions ended by their lease or time budget

    @property
    def on(self) -> bool:
        return self.cap > 0

    # -- DueHeap's calls, routed by membership -------------------------------------------
    def push(self, s: int, due: float) -> None:
        if self.cap <= 0 or s in self.session:
            self._act.push(s, due)
        else:
            self._idle.push(s, due if due > self._now else self._now)

    def update(self, s: int, due: float) -> None:
        if self.cap <= 0 or s in self.session:
            self._act.update(s, due)
        else:
            self._idle.update(s, due if due > self._now else self._now)

    def remove(self, s: int) -> bool:
        return self._act.remove(s) or self._idle.remove(s)

    def __contains__(self, s: int) -> bool:
        return s in self._act or s in self._idle

    def __len__(self) -> int:
        return len(self._act) + len(self._idle)

    def peek(self) -> tuple[int, float] | None:
        """The earliest entry a lease call could take: a member's, or an idle host's while there is room."""
        a = self._act.peek()
        if self.cap <= 0 or len(self.session) >= self.cap:
            return a
        b = self._idle.peek()
        if a is None or (b is not None and b[1] < a[1]):
            return b
        return a

    def pop_due(self, now: float, limit: int) -> list[int]:
        """Up to ``limit`` due hosts: due members first; for the rest, idle hosts in the order they
        became ready, each starting a session, while the set has room."""
        if now > self._now:
            self._now = now
        out = self._act.pop_due(now, limit)
        room = limit - len(out)
        if room > 0 and self.cap > 0:
            room = min(room, self.cap - len(self.session))
            if room > 0:
                new = self._idle.pop_due(now, room)
                for s in new:
                    self.session[s] = [0, now]
                self.sessions += len(new)
                out += new
        return out

    # -- sessions -----------------------------------------------------------------------
    def leased(self, s: int) -> None:
        """A lease of ``s`` went out: it counts against the member's session."""
        m = self.session.get(s)
        if m is not None:
            m[0] += 1

    def spend(self, s: int, now: float) -> None:
        """A lease of ``s`` came back: a member whose session is used up goes to the back of the idle
        heap, or, with no host idle (a one-host crawl), starts its next session at once."""
        m = self.session.get(s)
        if m is not None and (m[0] >= self.session_fetches or now - m[1] >= self.session_s):
            self.spent += 1
            if len(self._idle):
                self.leave(s)
            else:
                m[0], m[1] = 0, now
                self.sessions += 1

    def leave(self, s: int) -> None:
        """``s`` is a member no more (no URL queued, session spent, slot freed); its heap entry, if
        any, moves to the idle heap at its due (or later)."""
        if self.session.pop(s, None) is None:
            return
        due = self._act.due_of(s)
        if due is not None:
            self._act.remove(s)
            self._idle.push(s, due if due > self._now else self._now)

    def sharers(self, s: int, now: float) -> int | None:
        """How many hosts take turns with ``s`` before its next one (its connection is worth keeping
        when they fit in the keep-alive time): the members, for a member with session left; every
        scheduled host with the working set off; None for a host whose session ends while hosts wait
        idle (its next turn comes after theirs)."""
        if self.cap <= 0:
            return len(self)
        m = self.session.get(s)
        if m is None:
            return None
        if (m[0] >= self.session_fetches or now - m[1] >= self.session_s) and len(self._idle):
            return None
        return len(self.session)

    def placed(self, s: int) -> bool:
        """Whether ``s`` is in the heap its membership names (or in none)."""
        if s in self._act:
            return self.cap <= 0 or s in self.session
        return s not in self._idle or s not in self.session

    def check_invariant(self, live=None) -> None:
        """Both heaps' invariants; members only in the members' heap; ``live(s)``: the slot is in use."""
        self._act.check_invariant()
        self._idle.check_invariant()
        for s in self.session:
            assert s not in self._idle, f"member {s} in the idle heap"
            assert live is None or live(s), f"member {s} holds no host slot"
        if self.cap <= 0:
            assert not self.session and len(self._idle) == 0, "working set off but members or idle hosts"
        assert len(self.session) <= self.cap or self.cap <= 0, f"{len(self.session)} members over cap {self.cap}"

    def stats(self) -> dict:
        return {"working_set_hosts": len(self.session), "working_set_max": self.cap,
                "sessions_started": self.sessions, "sessions_spent": self.spent}
