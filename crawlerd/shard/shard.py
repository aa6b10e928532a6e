"""The Shard: wires the components of one crawl shard, runs its loop, shuts it down in order.

Nothing here decides about a URL; each decision lives in one component (see the package
docstring for the map). This module creates the stores, hands each component exactly the
parts it uses, steps the loop, and closes everything in an order that loses nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time

import lmdb

from crawlerd import layout, sched
from crawlerd._native.bodypool import BodyPool
from crawlerd.allocator import Trimmer
from crawlerd.config import Config
from crawlerd.dedup.near import NearDuplicates
from crawlerd.dedup.owners import DigestOwner, DigestOwners, DigestOwnerServer
from crawlerd.fetch.curl import Fetcher, connection_slots
from crawlerd.fetch.dns import Resolver, write_snapshot
from crawlerd.fetch.guard import AddressGuard
from crawlerd.fetch.robots import RobotsCache
from crawlerd.frontier import Frontier
from crawlerd.frontier.budgets import Budgets
from crawlerd.frontier.politeness import Politeness
from crawlerd.frontier.recrawl import Recrawl
from crawlerd.memtrace import MemTrace
from crawlerd.metrics import LoopLag, Metrics
from crawlerd.process.pool import WorkerPool, default_workers
from crawlerd.records import FetchResult
from crawlerd.seen import AsyncSeenSet, DrumError
from crawlerd.shard.answers import Answers, on_worker_death
from crawlerd.shard.dust import DustGate, open_learner
from crawlerd.shard.events import FetchEvents
from crawlerd.shard.hostfiles import HostFiles
from crawlerd.shard.intake import Intake
from crawlerd.shard.leases import LeaseRunner, LeaseTable, LeaseWindow
from crawlerd.shard.operations import Operations
from crawlerd.shard.outbound import Outbound
from crawlerd.shard.storage import StorageHealth
from crawlerd.shard.tasks import Tasks, Wake
from crawlerd.shard.view import shard_memory, shard_status
from crawlerd.store.digest_set import DigestSet
from crawlerd.store.syncer import SyncThread
from crawlerd.store.writer import WriterError, WriteThread
from crawlerd.url.filter import UrlFilter

log = logging.getLogger("crawlerd.shard")

# What a failed write of an LMDB store or the seen-set raises: the crawl stops in order (storage.py)
STORE_ERRORS = (OSError, lmdb.Error, DrumError, WriterError)   # WriterError: a write handed over failed
COMMIT_INTERVAL_S = 2.0         # frontier/recrawl commits, lease expiry, event flush
BUDGETS_WRITE_BUFFERS = 2      # × storage.lmdb_write_buffer_bytes the budget store reserves (it writes most)
DNS_SAVE_INTERVAL_S = 60.0      # the DNS cache is written this often (and at stop) for the next run
DNS_CACHE_FILE = "dns-cache.jsonl"
IDLE_TICK_S = 0.25              # longest sleep of the loop when nothing is due
INBOX_POLL_S = 0.1              # batches other shards handed to this one are looked for this often
STALL_WATCH_S = 0.02             # a loop stall longer than this (the 20 ms bound) is traced to where it happened (`crawlerd stats`)


class Shard:
    """One host partition: DRUM, frontier, robots, DNS, fetcher, processing and storage, wired.

    Public face (used by the supervisor or the shard process): ``submit_urls``, ``run``,
    ``status``, ``reload``, ``checkpoint``, ``paused``, and the stores ``frontier``, ``seen``,
    ``pool``. Shard ``index`` of ``shards`` keeps its state under ``data_dir/shards/<index>/``;
    with ``shards`` > 1 it needs the hand-off ``outbox`` and ``inbox``, the shared per-IP slot
    table ``ip_slots`` (attached) and its ``ownership`` lease (``crawlerd.handoff``)."""

    def __init__(self, cfg: Config, metrics: Metrics, *, clock=time.monotonic, wall=time.time,
                 index: int = 0, shards: int = 1, outbox=None, inbox=None, ip_slots=None, ownership=None):
        self.cfg = cfg
        sched.set_background_batch(cfg.process.batch_scheduling)     # before this shard's threads start
        self.index = index
        self.shards = shards
        self.outbox = outbox
        self.inbox = inbox
        self.ownership = ownership
        self.state_dir = layout.shard_dir(cfg.crawl.data_dir, index)
        os.makedirs(self.state_dir, exist_ok=True)
        self._last_inbox = 0.0
        self.metrics = metrics
        self.clock = clock
        self.wall = wall
        self.paused = False
        self.stopping = False
        self._wake = Wake()
        self._last_commit = 0.0
        self._last_dns_save = 0.0
        self.trimmer = Trimmer(cfg.malloc.trim_interval_s, clock=clock)
        self.memtrace = MemTrace.from_env(self._state("tracemalloc"), clock=clock)     # debug: None unless asked
        self.storage = StorageHealth(cfg.crawl.data_dir, min_free_bytes=cfg.storage.min_free_bytes,
                                     probe_interval_s=cfg.storage.probe_interval_s, clock=clock,
                                     on_change=self._wake.set)
        p = cfg.politeness
        fr = cfg.frontier
        self.frontier = Frontier(
            self._state("frontier"), clock=clock, wall=wall, priority_levels=fr.priority_levels,
            delay_factor=p.delay_factor, min_delay_s=p.min_delay_s, max_delay_s=p.max_delay_s,
            per_ip_concurrency=p.per_ip_concurrency, ip_delay_s=p.ip_delay_s,
            backoff_base_s=p.backoff_base_s, backoff_max_s=p.backoff_max_s,
            retry_after_cap_s=p.retry_after_cap_s, park_after_failures=p.park_after_failures,
            park_s=p.park_s, lease_timeout_s=fr.lease_timeout_s, max_attempts=fr.max_attempts,
            crawl_delay_cap_s=cfg.robots.crawl_delay_cap_s, max_active_hosts=fr.max_active_hosts,
            map_size_bytes=fr.map_size_bytes, blocklist=[],
            host_concurrency=dict(p.host_concurrency), shared_ips=ip_slots, deferred_level=True,
            sync=False, write_buffer_bytes=cfg.storage.lmdb_write_buffer_bytes,    # fdatasync on the sync thread
            working_set_max=fr.working_set_max, session_fetches=fr.session_fetches, session_s=fr.session_s,
            queue_heads_bytes=fr.queue_heads_bytes)
        rc = cfg.recrawl
        self.recrawl = Recrawl(self._state("recrawl"), enabled=rc.enabled, initial_interval_s=rc.initial_interval_s,
                               min_interval_s=rc.min_interval_s, max_interval_s=rc.max_interval_s,
                               reissue_timeout_s=rc.reissue_timeout_s, drop_after_errors=rc.drop_after_errors,
                               jitter=rc.jitter, clock=wall, map_size_bytes=rc.map_size_bytes, sync=False,
                               write_buffer_bytes=cfg.storage.lmdb_write_buffer_bytes,
                               read_cache_bytes=rc.read_cache_bytes, key_filter_bytes=rc.key_filter_bytes)
        bu = cfg.budgets
        self.budgets: Budgets | None = None         # STAR/BEAST (frontier/budgets)
        if bu.enabled:
            self.budgets = Budgets(self._state("budgets"), base_budget=bu.base_budget, per_inlink=bu.per_inlink,
                                   max_budget=bu.max_budget, mode=bu.indegree, vouch_ratio=bu.vouch_ratio,
                                   queues=bu.queues, max_spread=bu.max_spread, cache_entries=bu.cache_entries,
                                   map_size_bytes=bu.map_size_bytes, edge_max_age_s=bu.edge_max_age_s,
                                   edge_max_pending=bu.edge_max_pending, edge_buckets=min(cfg.drum.buckets, 16),
                                   edge_merge_bytes=bu.edge_merge_bytes, edge_cache_entries=bu.edge_cache_entries,
                                   clock=clock, sync=False,     # fdatasync on the sync thread
                                   write_buffer_bytes=BUDGETS_WRITE_BUFFERS * cfg.storage.lmdb_write_buffer_bytes,
                                   probation=bu.probation,
                                   read_cache_bytes=bu.read_cache_bytes, unlanded_bytes=bu.unlanded_bytes)
        d = cfg.drum
        # DRUM runs on its own thread: a merge (seconds at 10^9 keys) never stalls this loop
        self.seen = AsyncSeenSet(self._state("drum"), buckets=d.buckets, bucket_buffer_bytes=d.bucket_buffer_bytes,
                                 merge_bytes=d.merge_bytes, max_age_s=d.max_age_s, cache_entries=d.cache_entries,
                                 max_pending_keys=d.max_pending_keys, clock=clock,
                                 threaded_intake=True)  # a lease completes once its links are logged
        self.digests = DigestSet(self._state("dedup", "digests"), write_buffer_bytes=cfg.storage.lmdb_write_buffer_bytes)
        dd = cfg.dedup
        self.near = NearDuplicates(self._state("dedup"), distance_bits=dd.simhash_distance,
                                   demote_ratio=dd.near_dup_demote_ratio, index_ram_bytes=dd.near_index_ram_bytes,
                                   host_windows_bytes=dd.host_windows_bytes)
        # robots.txt copies outlive a restart (kept on disk with their expiry, RFC 9309 §2.4)
        self.robots = RobotsCache(max_entries=max(1024, fr.max_active_hosts), cap_bytes=cfg.robots.cache_bytes,
                                  directory=self._state("robots"),
                                  agent_token=cfg.robots.agent_token, max_bytes=cfg.robots.max_bytes,
                                  clock=clock, wall=wall)
        uf = cfg.url_filter
        url_filter = UrlFilter(
            max_url_length=cfg.fetch.max_url_length, max_path_depth=uf.max_path_depth,
            max_repeated_segments=uf.max_repeated_segments, max_query_params=uf.max_query_params,
            max_param_values=uf.max_param_values, state_bytes=uf.state_bytes)
        self.url_filter = url_filter
        self.events = FetchEvents(cfg.path("events") if cfg.log.events else None, wall=wall,
                                  on_error=self.storage.failed, name=layout.events_name(index))
        # response bodies from the wire to their worker, outside malloc (the fetcher writes, workers read)
        self.bodies = BodyPool(cfg.fetch.body_pool_bytes, name=f"crawlerd-shard{index}-bodies")
        self.pool = WorkerPool(default_workers(cfg.process.workers, shards), {
            "warc_dir": cfg.path("warc"), "index_dir": cfg.path("index"), "prefix": cfg.warc.prefix,
            "digest_dir": self._state("dedup", "digests"), "captures_bytes": cfg.dedup.worker_captures_bytes,
            "segment_max_bytes": cfg.warc.segment_max_bytes, "shard": str(index), "user_agent": cfg.crawl.user_agent,
            "agent_token": cfg.robots.agent_token, "max_decoded_bytes": cfg.fetch.max_decoded_bytes,
            "max_links": cfg.process.max_links_per_page, "index_sort_buffer_bytes": cfg.warc.index_sort_buffer_bytes,
            "nice": cfg.process.worker_nice, "batch": cfg.process.batch_scheduling,
            "trim_interval_s": cfg.malloc.trim_interval_s,
            "memtrace_dir": self._state("tracemalloc")},    # the workers' debug switches (memtrace)
            on_worker_death=on_worker_death(metrics, cfg.path("index")), body_pool=self.bodies)
        self.guard = AddressGuard(list(cfg.network.allow))
        self.politeness = Politeness(delay_factor=p.delay_factor, min_delay_s=p.min_delay_s,
                                     max_delay_s=p.max_delay_s)
        self.tasks = Tasks(self._wake.set, store_errors=STORE_ERRORS,
                           on_store_error=lambda e: self.storage.fatal(e, "a lease"))
        self.leases = LeaseTable()
        self.window = LeaseWindow(floor=2 * self.pool.capacity, ceiling=cfg.fetch.max_in_flight,
                                  max_bytes=cfg.process.queue_bytes)
        self.intake = Intake(cfg, frontier=self.frontier, seen=self.seen, url_filter=url_filter,
                             recrawl=self.recrawl, metrics=metrics, wake=self._wake.set, budgets=self.budgets,
                             wall=wall, free_slots=lambda: self.window.size - self._transfers(),
                             paused=lambda: self.paused or self.storage.paused,
                             robots=self.robots, clock=clock, on_dropped=self.events.dropped,
                             shard=index, shards=shards, outbox=outbox)
        self.owners: DigestOwners | None = None
        self.owner_server: DigestOwnerServer | None = None
        if shards > 1:      # one owner per payload digest across the shards (dedup/owners.py)
            owner = DigestOwner(self.digests)
            self.owners = DigestOwners(index, shards, owner, lambda i: layout.dedup_socket(cfg.crawl.data_dir, i))
            self.owner_server = DigestOwnerServer(layout.dedup_socket(cfg.crawl.data_dir, index), owner)
        self.answers = Answers(cfg, pool=self.pool, digests=self.digests, near=self.near, recrawl=self.recrawl,
                               frontier=self.frontier, intake=self.intake, events=self.events, metrics=metrics,
                               budgets=self.budgets, owners=self.owners)
        self.pool.near_duplicates = self.answers.near_duplicates     # asked before a batch is archived
        learner = open_learner(cfg, self._state("dust"))                                 # DUST rules (None: dust.enabled false)
        self.dust = DustGate(cfg, learner, frontier=self.frontier, intake=self.intake, events=self.events,
                             metrics=metrics) if learner is not None else None
        if self.dust is not None:
            self.intake.admission = self.dust.admit
            self.answers.evidence = self.dust.observe
        self.ops = Operations(cfg, frontier=self.frontier, seen=self.seen, recrawl=self.recrawl,
                              digests=self.digests, near=self.near, pool=self.pool, guard=self.guard,
                              table=self.leases, tasks=self.tasks, events=self.events, metrics=metrics,
                              budgets=self.budgets, state_dir=self.state_dir)
        self.ops.apply_config_blocklist(cfg.blocklist.hosts)
        # need the running loop: made by run()
        self.resolver: Resolver | None = None
        self.fetcher: Fetcher | None = None
        self.runner: LeaseRunner | None = None
        self.syncer: SyncThread | None = None
        self.writer: WriteThread | None = None
        # operator's view and the bench: how late this loop runs a 10 ms timer (its stalls)
        self.loop_lag = LoopLag(interval_s=0.01, watch_s=STALL_WATCH_S)

    def _state(self, *parts: str) -> str:
        return os.path.join(self.state_dir, *parts)

    # -- the supervisor's calls -------------------------------------------------------
    def submit_urls(self, urls: list[str], *, depth: int, hops: int = 0, priority: int | None = None,
                    base: str | None = None) -> int:
        """Normalise, filter and send URLs to the seen-set; returns how many were submitted."""
        return self.intake.submit_urls(urls, depth=depth, hops=hops, priority=priority, base=base)

    def links_barrier(self):
        """None when every URL submitted so far is kept (intake log, outbox), else an awaitable."""
        return self.intake.links_barrier()

    def status(self, detail: bool = True) -> dict:
        """The shard's numbers; ``detail`` adds the operator's view (crawlerd/shard/view.py)."""
        return shard_status(self, detail)

    def memory(self) -> dict[str, dict[str, int]]:
        """Each bounded RAM component's estimated bytes against its cap (`crawlerd stats`)."""
        return shard_memory(self)

    def reload(self, cfg: Config) -> None:
        """SIGHUP: runtime settings (blocklist, network.allow)."""
        self.ops.reload(cfg)

    def checkpoint(self) -> None:
        self.ops.checkpoint()
        if self.dust is not None:
            self.dust.commit()

    # -- the loop ---------------------------------------------------------------
    async def run(self, stop: asyncio.Event, *, max_pages: int = 0) -> None:
        loop = asyncio.get_running_loop()
        f, dn = self.cfg.fetch, self.cfg.dns
        self.resolver = Resolver(loop, nameservers=list(dn.nameservers), timeout_s=dn.timeout_s, tries=dn.tries,
                                 min_ttl_s=dn.min_ttl_s, max_ttl_s=dn.max_ttl_s, negative_ttl_s=dn.negative_ttl_s,
                                 max_in_flight=dn.max_in_flight, static_hosts=dict(dn.static_hosts),
                                 ipv6=self.cfg.network.ipv6, cache_bytes=dn.cache_bytes)
        n = self.resolver.load(self._state(DNS_CACHE_FILE), self.wall())     # answers still within their TTL
        if n:
            log.info("dns cache: %d answers from the last run", n)
        self._last_dns_save = self.clock()
        self.fetcher = Fetcher(loop, user_agent=self.cfg.crawl.user_agent, guard=self.guard,
                               connect_timeout_s=f.connect_timeout_s, timeout_s=f.timeout_s,
                               low_speed_bytes_per_s=f.low_speed_bytes_per_s, low_speed_time_s=f.low_speed_time_s,
                               max_body_bytes=f.max_body_bytes, max_header_bytes=f.max_header_bytes,
                               max_connections=connection_slots(f.connection_cache_bytes), verify_tls=f.verify_tls,
                               ca_file=f.ca_file, keep_alive_idle_s=f.keep_alive_idle_s,
                               max_transfers=f.max_in_flight, on_done=self._wake.set, body_pool=self.bodies)
        if self.ownership is not None:      # the fence again at the fetcher: a queued request too
            own = self.ownership
            self.fetcher.gate = lambda: own.held(self.clock())
        outbound = Outbound(guard=self.guard, frontier=self.frontier, resolve=self.resolver.resolve,
                            host_busy=self.leases.host_busy)
        host_files = HostFiles(self.cfg, frontier=self.frontier, robots=self.robots, politeness=self.politeness,
                               outbound=outbound, fetch=self.fetcher.fetch, archive=self._archive,
                               read_sitemap=self._read_sitemap,
                               events=self.events, submit_links=self.intake.submit_links, metrics=self.metrics,
                               clock=self.clock, wall=self.wall, stopping=lambda: self.stopping,
                               links_barrier=self.intake.links_barrier)
        self.runner = LeaseRunner(frontier=self.frontier, table=self.leases, tasks=self.tasks, outbound=outbound,
                                  fetch=self.fetcher.fetch, robots=self.robots, recrawl=self.recrawl,
                                  host_files=host_files, answers=self.answers, events=self.events,
                                  metrics=self.metrics, clock=self.clock, wall=self.wall,
                                  storage_failed=self.storage.failed, window=self.window,
                                  keep_alive_s=f.keep_alive_idle_s)
        if self.dust is not None:
            self.runner.lease_gate = self.dust.lease_skip
        # group commit: the loop commits without fdatasync; this thread syncs, and DRUM's answers are
        # acknowledged only once the frontier holding them is on disk
        self.syncer = SyncThread(loop)
        self.intake.durable = self._when_durable
        # the seen-set's bound counts the links the leases in flight can still submit
        self.seen.reserve = lambda: len(self.leases) * self.intake.page_links()
        # the robots copies and first-capture digests are written on this thread; the loop hands
        # them over (each store answers from a RAM overlay until its write lands)
        self.writer = WriteThread(loop, name="crawlerd-writer",
                                  on_error=lambda e: self.storage.fatal(e, "writer thread"))
        self.robots.attach_writer(self.writer)
        self.digests.attach_writer(self.writer)
        # the frontier, recrawl and budget state: their LMDB write transactions too (the loop reads
        # them through a RAM overlay until each commit lands), and the in-flight journal's end lines
        self.frontier.attach_writer(self.writer)
        self.recrawl.attach_writer(self.writer)
        if self.budgets is not None:
            self.budgets.attach_writer(self.writer)
        # DUST's store and the near-duplicate docs: theirs too (and their fsyncs)
        if self.dust is not None:
            self.dust.attach_writer(self.writer)
        self.near.attach_writer(self.writer)
        self.intake.bound_writes(self.cfg.frontier.unlanded_bytes)
        await self.pool.start()
        self.seen.start(loop, self.intake.on_seen_results)
        if self.outbox is not None:
            self.outbox.start()
        if self.owner_server is not None:
            await self.owner_server.start()
        if self.budgets is not None:
            self.budgets.start(loop)
        self.loop_lag.start(loop)
        try:
            while not stop.is_set() and self.storage.fatal_reason is None:
                if max_pages and self.metrics.pages >= max_pages:
                    log.info("max_pages reached: %d", self.metrics.pages)
                    break
                try:
                    self._step(self.runner)
                except STORE_ERRORS as e:
                    # a store that cannot retry in place (a failed commit loses its transaction)
                    self.storage.fatal(e, "frontier, seen-set or state store")
                    break
                await self._sleep_until_next()
        finally:
            self.loop_lag.stop()
            await self._shutdown()

    def _when_durable(self, then) -> None:
        """Run ``then`` on the loop once the frontier and budget state committed so far are on disk:
        once the frontier's commits landed (written on the writer thread; the budget commits they
        follow landed before them), after the sync thread's next sync."""
        def synced() -> None:
            if self.budgets is not None:
                self._sync(self.budgets.sync)
            self._sync(self.frontier.flush, then)
        try:
            self.frontier.when_written(synced)
        except WriterError:         # the writer failed: nothing more is acknowledged
            return

    def _sync(self, flush, then=None) -> None:
        """``flush`` on the sync thread, then ``then`` on the loop; once that thread stopped (a commit
        that landed during the shutdown), both here."""
        try:
            self.syncer.request(flush, then)
        except RuntimeError:
            flush()
            if then is not None:
                then()

    def _archive(self, res: FetchResult) -> None:
        """A robots.txt or sitemap answer: archived by a worker in the background (no dedup, no links)."""
        self.tasks.spawn(self._archive_one(res))

    async def _archive_one(self, res: FetchResult) -> None:
        pr = await self.pool.process(res, None)
        if pr.storage_error:
            self.storage.failed(pr.storage_error, self.cfg.path("warc"))

    async def _read_sitemap(self, res: FetchResult) -> tuple | None:
        """A sitemap answer archived and parsed by a worker: its reading, or None if not archived."""
        sm = self.cfg.sitemaps
        pr = await self.pool.process(res, None, sitemap=(sm.max_urls, sm.max_bytes))
        if pr.storage_error:
            self.storage.failed(pr.storage_error, self.cfg.path("warc"))
            return None
        return pr.sitemap if pr.sitemap is not None else ([], [], 0, "unread")

    def _step(self, runner: LeaseRunner) -> None:
        now = self.clock()
        self.seen.raise_if_failed()
        self.pool.raise_if_failed()
        if self.near.storage_fault is not None:      # the index's merge thread could not write
            self.storage.failed(self.near.storage_fault, self._state("dedup", "near-index"))
        self.storage.step(now)
        runner.resolve_hosts()
        self.window.tick(now, self.pool.answered)
        free = self._free_transfers()
        # fencing: no request starts unless this process still owns the shard
        owned = self.ownership is None or self.ownership.held(now)
        halted = self.paused or self.storage.paused or not owned
        # processing behind: more fetches would only wait, unarchived, for a worker
        # nor while the frontier's and recrawl's writes not landed are at their bound (until a landing)
        if free > 0 and not halted and not self.seen.backpressure and not self.pool.behind \
                and not self.intake.frontier_gate.crowded_wake(self._wake.set):
            runner.start(now, free)
        # a fenced shard takes no hand-off: what it does not acknowledge goes to the lease's next owner
        if self.inbox is not None and owned and now - self._last_inbox >= INBOX_POLL_S and not self.seen.backpressure:
            self._last_inbox = now
            batches = self.inbox.receive(min(self.cfg.drum.max_pending_keys // 4, self.seen.room))
            if batches:
                self.intake.take_handoff(batches, self._ack_handoff)
        self.intake.pace_seen_flush(now)
        self.intake.step_budgets(now)
        if not halted:
            self.intake.feed_recrawl(now)
        if now - self._last_commit > COMMIT_INTERVAL_S:
            self._last_commit = now
            self.ops.drain_frontier_drops()
            syncer = self.syncer
            # recrawl's commit is written on the writer thread; synced once it is
            self.recrawl.commit(flush=False, then=None if syncer is None else
                                (lambda: syncer.request(self.recrawl.flush)))
            self.frontier.expire_leases(now)
            # written on the writer thread too; synced once it is
            self.frontier.commit(flush=False, then=None if syncer is None else
                                 functools.partial(self._sync, self.frontier.flush))
            if self.dust is not None:
                self.dust.commit_sliced()       # over the next loop iterations
            self.events.flush()
            self.trimmer.maybe_trim(now)    # freed C-heap pages (bodies, batches, LMDB buffers) back
            if self.memtrace is not None:
                self.memtrace.maybe_dump(now)
            self.metrics.trim_hosts()
            if now - self._last_dns_save > DNS_SAVE_INTERVAL_S:
                self._last_dns_save = now
                self._save_dns()
        self.metrics.tick()

    def _ack_handoff(self, batch) -> None:
        """A received batch is in DRUM's intake log: acknowledge it, unless the lease was lost since
        (then it is delivered again, to the shard's next owner; this copy is absorbed there)."""
        if self.ownership is None or self.ownership.held(self.clock()):
            self.inbox.ack(batch)

    def _transfers(self) -> int:
        """Transfers on the wire or waiting for one, and leases whose task has not reached the fetcher yet."""
        f = self.fetcher
        return (f.in_flight + f.waiting if f is not None else 0) + self.leases.unstarted

    def _free_transfers(self) -> int:
        """Leases that may start: the lease window (``fetch.max_in_flight`` at most) less the
        transfers, within ``process.queue_bytes`` for the bodies not archived plus the transfers'
        expected ones (``LeaseWindow.free``). A lease waiting for a worker holds no transfer slot:
        ``pool.behind`` bounds that queue's count, the byte bound its bodies."""
        return self.window.free(self._transfers(), self.pool.body_bytes)

    async def _sleep_until_next(self) -> None:
        nd = self.frontier.next_due()
        now = self.clock()
        if self.paused or self.storage.paused or self.pool.behind or self._free_transfers() <= 0:
            nd = None                 # nothing can be leased now: wait for a transfer or task to end, or a tick
        tick = INBOX_POLL_S if self.inbox is not None else IDLE_TICK_S
        timeout = tick if nd is None else min(tick, max(0.0, nd - now))
        await self._wake.sleep(max(timeout, 0.002))

    def _save_dns(self, *, now: bool = False) -> None:
        """The DNS cache to its file for the next run: formatted and written on the writer thread
        (tens of ms per 10,000 hosts), ``now`` on the loop (at the end, the writer closed)."""
        if self.resolver is None:
            return
        path, snap = self._state(DNS_CACHE_FILE), self.resolver.snapshot(self.wall())
        if not now and self.writer is not None:
            self.writer.submit(lambda snaps: _write_dns(path, snaps[-1]), snap)     # only the newest counts
            return
        _write_dns(path, snap)

    # -- ordered shutdown ------------------------------------------------------------------
    async def _shutdown(self) -> None:
        """Stop leasing; finish or abandon fetches within the grace; persist everything.

        Every step runs even when an earlier one failed on storage: a full disk must not cost the
        steps that can still succeed, and each failure is one log line, never a traceback."""
        self.stopping = True
        grace = self.cfg.fetch.shutdown_grace_s
        if self.fetcher is not None:
            await self.fetcher.close(grace)
        await self.tasks.finish(grace + 10.0)
        await self.pool.close()
        if self.writer is not None:     # no question after the pool: its docs written, then closed here
            await self._written()
            self.near.attach_writer(None)
        self._safely("near-duplicate index", self.near.close)
        if self.runner is not None:
            self._safely("frontier", self.runner.abandon_all)
        if self.owners is not None:
            await self.owners.close()
            await self.owner_server.close()
        self._safely("frontier", self.ops.drain_frontier_drops)
        try:
            await self.seen.flush()
        except STORE_ERRORS as e:      # unacknowledged DRUM answers are delivered again at the next start
            log.error("final seen-set drain failed; its answers are redelivered on restart: %r", e)
        try:
            await self.seen.close()     # before the frontier closes: no delivery after this
        except STORE_ERRORS as e:
            self.storage.fatal(e, "seen-set")
        self.intake.frontier_gate.close()   # a slice waiting for room: not acknowledged, delivered again
        if self.syncer is not None:
            self.syncer.close()     # after the seen-set: its last acks wait for a sync
            await asyncio.sleep(0)  # run the acks it queued on the loop
        if self.budgets is not None:
            self.ops.keep_final_stats("budgets")
            try:
                await self.budgets.close()
            except STORE_ERRORS as e:
                self.storage.fatal(e, "budgets")
        if self.outbox is not None:
            # what is staged: written (its leases completed; the vouches of the last edge merge)
            await self.outbox.close()
        if self.writer is not None:
            # nothing hands over after this point: write everything, then the stores close here
            self._safely("recrawl", functools.partial(self.recrawl.commit, flush=False))
            if self.dust is not None:
                self.dust.close_gate()          # a sliced commit waiting for room: this one writes its hosts
                self._safely("dust", self.dust.commit)
            self.writer.close()
            self.robots.attach_writer(None)
            self.digests.attach_writer(None)
            await asyncio.sleep(0)      # its last callbacks (overlays emptied)
            self._safely("frontier", functools.partial(self.frontier.attach_writer, None))
            self._safely("recrawl", functools.partial(self.recrawl.attach_writer, None))
            if self.dust is not None:
                self._safely("dust", functools.partial(self.dust.attach_writer, None))
        self._safely("frontier", self.frontier.commit)
        self.ops.keep_final_stats("frontier")
        self._safely("frontier", self.frontier.close)
        self._safely("recrawl", self.recrawl.commit)
        self.ops.keep_final_stats("recrawl")
        self._safely("recrawl", self.recrawl.close)
        if self.dust is not None:
            self._safely("dust", self.dust.close)
        self._safely("digests", self.digests.close)
        self._safely("events", self.events.close)
        self._safely("robots cache", self.robots.close)
        if self.resolver is not None:
            self._save_dns(now=True)
            await self.resolver.close()

    async def _written(self) -> None:
        """Wait until everything handed to the writer so far is written (at once if it stopped)."""
        done = asyncio.get_running_loop().create_future()
        try:
            self.writer.barrier(lambda: done.done() or done.set_result(None))
        except WriterError:
            return
        while not done.done() and self.writer.error is None:      # a failed write runs no barrier
            await asyncio.wait({done}, timeout=0.05)

    def _safely(self, what: str, step) -> None:
        try:
            step()
        except STORE_ERRORS as e:
            self.storage.fatal(e, what)


def _write_dns(path: str, snap) -> None:
    try:
        write_snapshot(path, snap)
    except OSError as e:      # only lookups are lost: they are asked again next run (never stops the writer)
        log.warning("cannot save the dns cache: %s", e.strerror)
