"""The frontier's commits: what it writes to make its state durable, when, and what follows a landing.

The frontier (``scheduler.py``) decides *that* work was done (a URL queued, a host leased or
released); :class:`Durability` decides *when* that work becomes durable and does the writing: the
records of the hosts the work touched, the counters and the clock, in one write transaction of the
frontier's store (``queues.py``). During a crawl the store hands each transaction to the writer
thread (``store/writer.py``) and the loop reads its own writes through an overlay until it lands;
offline (the CLI, recovery, the stop) it commits on the calling thread.

The in-flight journal (``journal.py``) is rewritten after a commit: with a writer, only once that
commit landed, keeping the lines written meanwhile (ARCHITECTURE.md invariant 3).

Invariant: ``commits`` counts the write transactions made (handed over or committed here): a crash
keeps everything that preceded the last one that landed; ``landed`` counts those handed over whose
landing ran on the loop; ``ops`` counts lease and release work since the last commit.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from crawlerd.frontier import journal
from crawlerd.frontier.hosts import HostTable, wall_of
from crawlerd.frontier.ips import IPTable
from crawlerd.frontier.leasing import LeaseOut
from crawlerd.frontier.queues import FrontierStore
from crawlerd.store.writer import WriterError


class Durability:
    """Commits the frontier's state: host records of dirty hosts, counters, clock, journal rotation.

    Collaborators, shared with the frontier (it mutates them; this class reads them at a commit):
    ``store``, ``counts``/``dropped`` (the meta counters), ``hosts``/``ips`` (the active host and IP
    tables), ``dirty`` (slots of hosts whose record changed since the last commit; emptied here),
    ``leases`` (the leases out, for the journal's rewrite). ``journal`` is set once the frontier's
    recovery has run (the first commit precedes it).
    """

    def __init__(self, *, store: FrontierStore, counts: dict, dropped: dict, hosts: HostTable, ips: IPTable,
                 dirty: set[int], leases: dict[int, LeaseOut], clock, off: float, session: int,
                 lease_timeout_s: float, group_ops: int, commit_interval_s: float) -> None:
        self.store, self.counts, self.dropped = store, counts, dropped
        self.hosts, self.ips, self.dirty, self.leases = hosts, ips, dirty, leases
        self.clock, self.off, self.session = clock, off, session
        self.lease_timeout_s = lease_timeout_s
        self.group_ops, self.commit_interval_s = group_ops, commit_interval_s
        self.journal: journal.InflightJournal | None = None
        self.commits = 0
        self.landed = 0
        self.ops = 0
        self.last_commit = -math.inf

    def due(self, now: float) -> bool:
        """Whether the group commit is due: ``group_ops`` operations, ``commit_interval_s`` since
        the last commit, or the store's write-buffer budget (``store/lmdb_reserve.py``) spent."""
        return (self.ops >= self.group_ops or now - self.last_commit >= self.commit_interval_s
                or self.store.budget.full)

    def commit_open(self, then: Callable[[], None] | None = None, sync: bool = False) -> None:
        """Commit what is open (host records of dirty hosts, counters, clock). With a writer the
        commit is handed over and ``then`` runs once it landed; without one, ``then`` runs here."""
        st, H, ips = self.store, self.hosts, self.ips
        if self.dirty:
            txn, hdb, now = st.txn(), st.hosts, self.clock()
            for s in self.dirty:
                hk = H.keys[s]
                if hk is not None:
                    ip = H.ip[s]
                    txn.put(hk.encode("utf-8", "surrogateescape"),
                            H.record(s, self.session, now, ips.names[ip] if ip >= 0 else "", self.off).encode(),
                            db=hdb)
            self.dirty.clear()
        if ips.idle:
            ips.sweep(self.clock())
        if st.open:
            st.save_meta(self.counts, self.dropped)
            st.save_clock(self.clock() + self.off)
            jr = self.journal
            rotate = None
            if st.overlay is not None and jr is not None and not jr.marked and jr.needs_rotation():
                # the journal is rewritten once this commit landed: with the leases and IP gaps of
                # now, and the lines written meanwhile (journal.py)
                rotate = self.journal_state()
                jr.mark()
            if st.commit(self._landed if rotate is None and then is None else
                         functools.partial(self._landed, rotate, then), sync=sync):
                self.commits += 1
                self.ops = 0
                self.last_commit = self.clock()
                return
            self.commits += 1
            if jr is not None and jr.needs_rotation():
                self.rewrite_journal()
        elif st.overlay is not None and (then is not None or sync):
            st.commit(then, sync=sync)      # nothing new: runs once what was committed before landed
            then = None
        self.ops = 0
        self.last_commit = self.clock()
        if then is not None:
            then()

    def _landed(self, rotate: tuple | None = None, then: Callable[[], None] | None = None) -> None:
        """A commit handed to the writer landed (on the loop): the journal's pending rotation, ``then``."""
        self.landed += 1
        if rotate is not None and self.journal is not None:
            self.journal.rewrite(*rotate, tail=self.journal.take_tail())
        if then is not None:
            then()

    def journal_state(self) -> tuple[list, dict]:
        """The leases still out and the IP gaps still running: the journal's content after a commit."""
        off, timeout = self.off, self.lease_timeout_s
        out = [(lid, o.lease.deadline - timeout + off, o.lease.ip, o.lease.host_key) for lid, o in self.leases.items()]
        ips, now = self.ips, self.clock()
        ip_end = {}
        if ips.delay_s > 0:
            ip_end = {name: wall_of(ips.due[i] - ips.delay_s, off) for i, name in enumerate(ips.names)
                      if name is not None and ips.due[i] > now}
        return out, ip_end

    def rewrite_journal(self) -> None:
        """The journal afresh (right after a commit): leases still out, IP gaps still running."""
        self.journal.rewrite(*self.journal_state())

    def commit(self, *, flush: bool = True, then: Callable[[], None] | None = None) -> None:
        """Make everything so far durable (fsync even when the store does not sync each commit):
        see ``Frontier.commit``."""
        st = self.store
        if st.lost:
            raise WriterError("the frontier's writer failed: nothing more is committed")
        st.txn()
        if st.overlay is not None:
            self.commit_open(then, sync=flush and not st.sync)
            return
        self.commit_open()
        if flush and not st.sync:
            st.flush()
        if then is not None:
            then()

    def attach_writer(self, writer) -> None:
        """Commit on ``writer`` from now on, or back on this thread (None): see ``Frontier.attach_writer``."""
        if self.journal is not None:
            self.journal.attach_writer(writer)
        self.store.attach_writer(writer)

    def close(self) -> None:
        """Commit every active host's record and close the store and the journal: see ``Frontier.close``."""
        st = self.store
        if st.overlay is not None:
            try:
                self.attach_writer(None)
            except WriterError:
                pass
        if st.lost:
            st.close()
            self.journal.close()
            return
        self.counts["clean"] = 1
        self.dirty.update(s for s, k in enumerate(self.hosts.keys) if k is not None)
        st.txn()
        self.commit_open()
        st.flush()
        st.close()
        self.rewrite_journal()
        self.journal.close()
