"""The shard's operator side: status, SIGHUP reload, checkpoint, the config blocklist, drop accounting.

These are the calls the supervisor makes for ``crawlerd status``, ``reload``, ``checkpoint``;
none of them fetches. After shutdown closes a store, ``status`` keeps answering with the
numbers that store had at its close (``keep_final_stats``).
"""

from __future__ import annotations

import json
import logging
import os

from crawlerd.config import Config
from crawlerd.dedup.near import NearDuplicates
from crawlerd.fetch.guard import AddressGuard
from crawlerd.frontier import Frontier
from crawlerd.frontier.blocklist import Blocklist
from crawlerd.frontier.budgets import Budgets
from crawlerd.frontier.recrawl import Recrawl
from crawlerd.metrics import Metrics
from crawlerd.process.pool import WorkerPool
from crawlerd.seen import AsyncSeenSet
from crawlerd.shard.events import FetchEvents
from crawlerd.shard.leases import LeaseTable
from crawlerd.shard.tasks import Tasks
from crawlerd.store.digest_set import DigestSet

log = logging.getLogger("crawlerd.shard")

CONFIG_BLOCKLIST_FILE = "blocklist-config.json"


class Operations:
    """Status, reload and checkpoint over the shard's stores."""

    def __init__(self, cfg: Config, *, frontier: Frontier, seen: AsyncSeenSet, recrawl: Recrawl,
                 digests: DigestSet, near: NearDuplicates, pool: WorkerPool, guard: AddressGuard,
                 table: LeaseTable, tasks: Tasks, events: FetchEvents, metrics: Metrics,
                 budgets: Budgets | None = None, state_dir: str | None = None):
        """``state_dir``: where this shard keeps its own files (default: the data dir)."""
        self.cfg = cfg
        self.state_dir = state_dir or cfg.crawl.data_dir
        self.frontier = frontier
        self.seen = seen
        self.recrawl = recrawl
        self.digests = digests
        self.near = near
        self.pool = pool
        self.guard = guard
        self.table = table
        self.tasks = tasks
        self.events = events
        self.metrics = metrics
        self.budgets = budgets
        self.final: dict[str, dict] = {}        # part -> its stats at close

    def status(self, *, paused: bool) -> dict:
        st = self.final["frontier"] if "frontier" in self.final else self.frontier.stats()
        return {"in_flight": len(self.table), "queued": st.get("queued", 0),
                "hosts_active": st.get("hosts_active", 0), "working_set_hosts": st.get("working_set_hosts", 0),
                "sessions_started": st.get("sessions_started", 0), "seen_pending": self.seen.pending,
                "paused": paused, "frontier": st, "recent_errors": list(self.tasks.recent_errors)[-5:],
                "worker_cpu_s": self.pool.cpu_s(), "worker_restarts": self.pool.restarts,
                "recrawl": self.final.get("recrawl") or self.recrawl.stats(),
                "budgets": self.final.get("budgets") or (self.budgets.stats() if self.budgets else {})}

    def keep_final_stats(self, part: str) -> None:
        """Remember the stats of ``part`` (frontier, recrawl, budgets) just before it closes."""
        source = {"frontier": self.frontier, "recrawl": self.recrawl, "budgets": self.budgets}[part]
        if source is not None:
            self.final[part] = source.stats()

    def reload(self, cfg: Config) -> None:
        """SIGHUP: runtime settings (blocklist, network.allow)."""
        self.guard.reload(list(cfg.network.allow))
        self.apply_config_blocklist(cfg.blocklist.hosts)

    def apply_config_blocklist(self, hosts: list[str]) -> None:
        """Make the config file's blocklist entries effective, keeping entries added at run time.

        The entries that came from the file are remembered in ``<shard dir>/blocklist-config.json``
        (temp, fsync, rename), so an entry deleted from the file is unblocked by the next SIGHUP
        or restart, while ``crawlerd block add`` entries stay until ``crawlerd block remove``.
        """
        wanted = set()
        for h in hosts:
            try:
                wanted.add(Blocklist.normalise(h))
            except ValueError as e:
                log.error("blocklist entry ignored: %s", e)
        path = os.path.join(self.state_dir, CONFIG_BLOCKLIST_FILE)
        try:
            with open(path) as f:
                before = set(json.load(f))
        except (OSError, ValueError):
            before = set()
        current = set(self.frontier.blocked())
        for pat in sorted(wanted - current):
            self.frontier.block(pat)
        for pat in sorted((before - wanted) & current):
            self.frontier.unblock(pat)

        def remember() -> None:
            # once the frontier's commit is on disk (on the writer thread during a crawl): a file
            # written first would, after a kill -9 before that commit, forget an entry the frontier
            # still blocks, which no later reload would then unblock
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(sorted(wanted), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)

        self.frontier.commit(then=remember)

    def drain_frontier_drops(self) -> None:
        """URLs the frontier dropped (blocked host, dead letter, ...): counted and logged, one event each."""
        for item, reason in self.frontier.drain_dropped():
            self.metrics.dropped[reason] += 1
            self.events.dropped(item.url, reason)
            if self.budgets is not None and not reason.startswith("dead_letter"):
                self.budgets.refund(item.url)     # dropped unfetched: its charge goes back (BEAST)

    def checkpoint(self) -> None:
        self.seen.request_flush()
        self.frontier.commit()
        self.recrawl.commit()
        self.digests.flush()
        self.near.save()
        if self.budgets is not None:
            self.budgets.request_flush()
            self.budgets.commit()
        self.events.flush()
