"""One crawl shard's event loop: the only place the stages are wired together.

A URL's life (see ``crawlerd/frontier/__init__.py`` for the frontier's side):

1. **Born** as a seed, a redirect target or an outlink. It is normalised and
   filtered (``url.UrlFilter``), fingerprinted, and submitted to the DRUM
   seen-set with its record as aux data.
2. **Unique** answers come back from DRUM in submission order and are added
   to the frontier (LMDB); duplicates end there.
3. **Leased** when its host is due (per-host and per-IP politeness). A host's
   first lease is for its robots.txt; no URL of a host is fetched before its
   robots state is known (RFC 9309). The host's address was resolved (DNS
   cache) and checked by the address guard before the host became eligible.
4. **Fetched** by curl-multi on this loop; the lease is completed at once so
   the politeness clock starts at the end of the transfer.
5. **Processed**: decoded, parsed, links extracted, digest and simhash
   computed, WARC records written, a fetch event logged; its outlinks go back
   to step 1.

Backpressure: leasing stops when ``fetch.max_in_flight`` transfers or the
processing queue are full; nothing is dropped to make room.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import deque

from crawlerd import url as urlmod
from crawlerd.config import Config
from crawlerd.dedup.near import NearDuplicates
from crawlerd.fetch.curl import Fetcher
from crawlerd.fetch.dns import Resolver
from crawlerd.fetch.guard import AddressGuard
from crawlerd.fetch.robots import RobotsCache
from crawlerd.frontier import Frontier, QueuedURL
from crawlerd.frontier.blocklist import Blocklist
from crawlerd.frontier.budgets import Budgets, DomainGraph
from crawlerd.frontier.politeness import Politeness
from crawlerd.frontier.recrawl import Recrawl
from crawlerd.metrics import Metrics
from crawlerd.outcome import Outcome
from crawlerd.process.pool import WorkerPool, default_workers
from crawlerd.records import FetchRequest, FetchResult, Link
from crawlerd.seen import AsyncSeenSet
from crawlerd.shard.hostfiles import HostFiles, parse_retry_after
from crawlerd.store.digest_set import DigestSet, digest_key
from crawlerd.store.events import EventLog
from crawlerd.store.warc import recover_segment

log = logging.getLogger("crawlerd.shard")

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
EVENT_SCHEMA = 1


def encode_aux(depth: int, hops: int, priority: int, url: str) -> bytes:
    return f"{depth} {hops} {priority} {url}".encode()


def decode_aux(aux: bytes) -> tuple[int, int, int, str]:
    depth, hops, priority, url = aux.decode().split(" ", 3)
    return int(depth), int(hops), int(priority), url


class Shard(HostFiles):
    """Wires DRUM, frontier, robots, DNS, fetcher, processing and storage for one host partition.

    The robots.txt and sitemap side of a host's leases lives in :class:`crawlerd.shard.hostfiles.HostFiles`."""

    def __init__(self, cfg: Config, metrics: Metrics, *, clock=time.monotonic, wall=time.time):
        self.cfg = cfg
        self.metrics = metrics
        self.clock = clock
        self.wall = wall
        self.paused = False
        self._stopping = False
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._leases: dict[int, object] = {}
        self._dns_pending: set[str] = set()
        self._recent_errors: deque[str] = deque(maxlen=20)
        self._last_flush = 0.0
        self._last_commit = 0.0
        self._final_frontier_stats: dict | None = None      # set when the frontier is closed
        self._final_recrawl_stats: dict | None = None
        self._final_budget_stats: dict | None = None
        p = cfg.politeness
        fr = cfg.frontier
        self.frontier = Frontier(
            cfg.path("frontier"), clock=clock, priority_levels=fr.priority_levels,
            delay_factor=p.delay_factor, min_delay_s=p.min_delay_s, max_delay_s=p.max_delay_s,
            per_ip_concurrency=p.per_ip_concurrency, ip_delay_s=p.ip_delay_s,
            backoff_base_s=p.backoff_base_s, backoff_max_s=p.backoff_max_s,
            retry_after_cap_s=p.retry_after_cap_s, park_after_failures=p.park_after_failures,
            park_s=p.park_s, lease_timeout_s=fr.lease_timeout_s, max_attempts=fr.max_attempts,
            crawl_delay_cap_s=cfg.robots.crawl_delay_cap_s, max_active_hosts=fr.max_active_hosts,
            map_size_bytes=fr.map_size_bytes, blocklist=[],
            host_concurrency=dict(p.host_concurrency))
        rc = cfg.recrawl
        self.recrawl = Recrawl(cfg.path("recrawl"), enabled=rc.enabled, initial_interval_s=rc.initial_interval_s,
                               min_interval_s=rc.min_interval_s, max_interval_s=rc.max_interval_s,
                               reissue_timeout_s=rc.reissue_timeout_s, drop_after_errors=rc.drop_after_errors,
                               jitter=rc.jitter, clock=wall, map_size_bytes=rc.map_size_bytes)
        self._last_recrawl = 0.0
        bu = cfg.budgets
        self.graph: DomainGraph | None = None
        self.budgets: Budgets | None = None
        if bu.enabled:
            self.graph = DomainGraph(cfg.path("budgets"), lru_entries=bu.cache_entries,
                                     map_size_bytes=bu.map_size_bytes, drum_buckets=min(cfg.drum.buckets, 16),
                                     drum_merge_bytes=bu.edge_merge_bytes, drum_max_age_s=bu.edge_max_age_s,
                                     drum_cache_entries=bu.edge_cache_entries, clock=clock)
            self.budgets = Budgets(self.graph, base_budget=bu.base_budget, per_inlink=bu.per_inlink,
                                   max_budget=bu.max_budget, cache_entries=bu.cache_entries)
        self._last_readmit = 0.0
        self._cycle_anchor = wall()
        d = cfg.drum
        # DRUM runs on its own thread: a merge (seconds at 10^9 keys) never stalls this loop
        self.seen = AsyncSeenSet(cfg.path("drum"), buckets=d.buckets, bucket_buffer_bytes=d.bucket_buffer_bytes,
                                 merge_bytes=d.merge_bytes, max_age_s=d.max_age_s, cache_entries=d.cache_entries,
                                 max_pending_keys=d.max_pending_keys, clock=clock)
        self.digests = DigestSet(cfg.path("dedup", "digests"))
        self.near = NearDuplicates(cfg.path("dedup"), distance_bits=cfg.dedup.simhash_distance,
                                   demote_ratio=cfg.dedup.near_dup_demote_ratio)
        self.robots = RobotsCache(max_entries=max(1024, fr.max_active_hosts))
        uf = cfg.url_filter
        self.url_filter = urlmod.UrlFilter(
            max_url_length=cfg.fetch.max_url_length, max_path_depth=uf.max_path_depth,
            max_repeated_segments=uf.max_repeated_segments, max_query_params=uf.max_query_params,
            max_param_values=uf.max_param_values, max_hosts=uf.max_hosts, max_tracked_values=uf.max_tracked_values)
        self.events = EventLog(cfg.path("events")) if cfg.log.events else None
        self.pool = WorkerPool(default_workers(cfg.process.workers), {
            "warc_dir": cfg.path("warc"), "index_dir": cfg.path("index"), "prefix": cfg.warc.prefix,
            "digest_dir": cfg.path("dedup", "digests"),
            "segment_max_bytes": cfg.warc.segment_max_bytes, "shard": "0", "user_agent": cfg.crawl.user_agent,
            "agent_token": cfg.robots.agent_token, "max_decoded_bytes": cfg.fetch.max_decoded_bytes,
            "max_links": cfg.process.max_links_per_page}, on_worker_death=self._worker_died)
        self._apply_config_blocklist(cfg.blocklist.hosts)
        self.guard = AddressGuard(list(cfg.network.allow))
        self.politeness = Politeness(delay_factor=p.delay_factor, min_delay_s=p.min_delay_s,
                                     max_delay_s=p.max_delay_s)
        self.resolver: Resolver | None = None
        self.fetcher: Fetcher | None = None

    # -- intake ---------------------------------------------------------------
    def submit_urls(self, urls: list[str], *, depth: int, hops: int = 0, priority: int | None = None,
                    base: str | None = None) -> int:
        """Normalise, filter and send URLs to the seen-set; returns how many were submitted."""
        links = []
        for raw in urls:
            norm = urlmod.normalize(raw, base)
            if norm is None:
                self.metrics.dropped["bad_url"] += 1
            else:
                links.append(Link(norm, urlmod.fingerprint(norm), ""))
        return self.submit_links(links, depth=depth, hops=hops, priority=priority)

    def submit_links(self, links: list[Link], *, depth: int, hops: int = 0, priority: int | None = None) -> int:
        """Filter already normalised, fingerprinted links (from a worker) and send them to the seen-set."""
        keys, aux = [], []
        if priority is None:
            priority = self._priority_for_depth(depth)
        check, dropped = self.url_filter.check, self.metrics.dropped
        for ln in links:
            reason = check(ln.url)
            if reason:
                dropped[reason] += 1
                continue
            keys.append(ln.fp)
            aux.append(encode_aux(depth, hops, priority, ln.url))
        if keys:
            self.seen.submit(keys, aux)
        return len(keys)

    def _priority_for_depth(self, depth: int) -> int:
        levels = self.cfg.frontier.priority_levels
        return 0 if depth == 0 else min(levels - 1, 1 + (depth - 1) // 3)

    def _on_seen_results(self, results: list) -> None:
        """One delivery of DRUM answers (run on the loop by the seen-set's pump): into the frontier, then ack.

        DRUM delivers at least once: answers not yet acknowledged come back after a crash.
        ``frontier.add`` commits before ``ack``, so a unique URL is never lost between the two.
        """
        added = []
        dup = 0
        for r in results:
            if not r.unique:
                dup += 1
                continue
            depth, hops, priority, url = decode_aux(r.aux)
            if self.budgets is not None and depth > 0:
                pld = urlmod.registered_domain(urlmod.host_of(url))
                if not self.budgets.admit(pld):
                    self.budgets.defer(pld, r.aux)      # BEAST: deferred, not dropped
                    self.metrics.counters["budget_deferred"] += 1
                    continue
            added.append(QueuedURL(url=url, host_key=urlmod.host_key(url), priority=priority,
                                   depth=depth, hops=hops, fp=r.key))
        self.metrics.counters["seen_duplicate"] += dup
        if self.budgets is not None:
            self.budgets.commit()       # deferrals durable before DRUM's answers are acknowledged
        if added:
            self.frontier.add(added)  # committed; new hosts show up in hosts_needing_dns()
            self._wake.set()
        self.seen.ack()

    # -- the loop ---------------------------------------------------------------
    async def run(self, stop: asyncio.Event, *, max_pages: int = 0) -> None:
        loop = asyncio.get_running_loop()
        f, dn = self.cfg.fetch, self.cfg.dns
        self.resolver = Resolver(loop, nameservers=list(dn.nameservers), timeout_s=dn.timeout_s, tries=dn.tries,
                                 min_ttl_s=dn.min_ttl_s, max_ttl_s=dn.max_ttl_s, negative_ttl_s=dn.negative_ttl_s,
                                 max_in_flight=dn.max_in_flight, static_hosts=dict(dn.static_hosts),
                                 ipv6=self.cfg.network.ipv6)
        self.fetcher = Fetcher(loop, user_agent=self.cfg.crawl.user_agent, guard=self.guard,
                               connect_timeout_s=f.connect_timeout_s, timeout_s=f.timeout_s,
                               low_speed_bytes_per_s=f.low_speed_bytes_per_s, low_speed_time_s=f.low_speed_time_s,
                               max_body_bytes=f.max_body_bytes, max_header_bytes=f.max_header_bytes,
                               max_connections=f.max_connections, verify_tls=f.verify_tls, ca_file=f.ca_file)
        await self.pool.start()
        self.seen.start(loop, self._on_seen_results)
        try:
            while not stop.is_set():
                if max_pages and self.metrics.pages >= max_pages:
                    log.info("max_pages reached: %d", self.metrics.pages)
                    break
                self._step()
                await self._sleep_until_next()
        finally:
            await self._shutdown()

    def _step(self) -> None:
        now = self.clock()
        self.seen.raise_if_failed()
        for host in self.frontier.hosts_needing_dns():
            if host not in self._dns_pending:
                self._dns_pending.add(host)
                self._spawn(self._resolve_host(host))
        free = self.cfg.fetch.max_in_flight - len(self._leases)
        if free > 0 and not self.paused and not self.seen.backpressure:
            for lease in self.frontier.lease(now, free):
                self._leases[lease.lease_id] = lease
                self._spawn(self._handle(lease))
        # DRUM flush trigger 3: new URLs wait in DRUM's buckets until a merge. A politeness-bound
        # crawl starves hosts whose next URLs are still there, so merge early, but keep merging
        # under ~10% of the time (a merge rewrites the whole key file: seconds at 10^9 keys).
        if self.seen.pending and not self.seen.flushing:
            dry = self.frontier.queued() < 2 * self.cfg.fetch.max_in_flight
            interval = max(0.5 if dry else 2.0, 10 * self.seen.last_flush_s)
            if now - self._last_flush >= interval:
                self.seen.request_flush()       # merged on the DRUM thread; answers arrive via _on_seen_results
                self._last_flush = now
        if self.graph is not None:
            self._step_budgets(now)
        if now - self._last_recrawl >= 1.0 and not self.paused:
            self._last_recrawl = now
            self._feed_recrawl()
        if now - self._last_commit > 2.0:
            self._last_commit = now
            self._drain_frontier_drops()
            self.recrawl.commit()
            self.frontier.expire_leases(now)
            self.frontier.commit()
            if self.events:
                self.events.flush()
            self.metrics.trim_hosts()
        self.metrics.tick()

    def _step_budgets(self, now: float) -> None:
        """Apply new domain in-links (STAR) and readmit deferred URLs whose domain budget grew (BEAST)."""
        bu = self.cfg.budgets
        self.graph.poll(now)
        if bu.cycle_s and self.wall() - (self.budgets.cycle_started_at or self._cycle_anchor) >= bu.cycle_s:
            self.budgets.new_cycle(at=self.wall())
        if now - self._last_readmit < 1.0:
            return
        self._last_readmit = now
        recs = self.budgets.readmit(bu.readmit_batch)
        if recs:
            items = []
            for rec in recs:
                depth, hops, priority, url = decode_aux(rec)
                items.append(QueuedURL(url=url, host_key=urlmod.host_key(url), priority=priority, depth=depth,
                                       hops=hops, fp=urlmod.fingerprint(url)))
            self.frontier.add(items)
            self.budgets.commit()     # after the frontier: a crash in between readmits twice, never loses
            self.metrics.counters["budget_readmitted"] += len(items)

    def _feed_recrawl(self) -> None:
        """Due revisits go straight to the frontier (they passed the seen-set long ago)."""
        rc = self.cfg.recrawl
        room = rc.max_queued - self.frontier.queued()
        if room <= 0:
            return
        items = self.recrawl.due(self.wall(), min(room, rc.batch))
        if items:
            # frontier first (it commits), then recrawl: a crash repeats a fetch, never loses one
            self.frontier.add([QueuedURL(url=i.url, host_key=i.host_key, priority=rc.priority, depth=i.depth,
                                         fp=i.fp) for i in items])
            self.recrawl.commit()
            self.metrics.counters["recrawl_queued"] += len(items)

    async def _sleep_until_next(self) -> None:
        nd = self.frontier.next_due()
        now = self.clock()
        if self.paused or len(self._leases) >= self.cfg.fetch.max_in_flight:
            nd = None                 # nothing can be leased now: wait for a finished task or a tick
        timeout = 0.25 if nd is None else min(0.25, max(0.0, nd - now))
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=max(timeout, 0.002))

    def _spawn(self, coro) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._task_done)

    def _task_done(self, t: asyncio.Task) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            exc = t.exception()
            import traceback
            log.error("task failed: %s", "".join(traceback.format_exception(exc)).replace("\n", " | "))
            self._recent_errors.append(repr(exc))
        self._wake.set()

    # -- DNS ------------------------------------------------------------------------
    async def _resolve_host(self, host_key: str) -> None:
        try:
            res = await self.resolver.resolve(urlmod.host_of(host_key))
            ip = next((a for a in res.ips if self.guard.allowed(a)), None)
            if res.outcome is not Outcome.OK:
                self.metrics.counters[res.outcome.value] += 1
                self.frontier.set_host_ip(host_key, None, outcome=res.outcome)
            elif ip is None:
                self.metrics.counters["dns_blocked_address"] += 1
                if self.metrics.counters["dns_blocked_address"] <= 10:   # say why, a few times, not per host
                    log.warning("host refused by the address guard host=%s ips=%s outcome=blocked_address "
                                "hint=add the network to network.allow to crawl private/loopback addresses",
                                host_key, ",".join(res.ips[:4]))
                self.frontier.set_host_ip(host_key, None, outcome=Outcome.BLOCKED_ADDRESS)
            else:
                self.frontier.set_host_ip(host_key, ip, expires_at=self.clock() + max(res.ttl_s, 1.0))
        finally:
            self._dns_pending.discard(host_key)

    # -- one lease ------------------------------------------------------------------
    async def _handle(self, lease) -> None:
        try:
            if lease.kind == "robots":
                await self._fetch_robots(lease)
            else:
                await self._fetch_url(lease)
        finally:
            self._leases.pop(lease.lease_id, None)

    def _request(self, url: str, ip: str, headers=None) -> FetchRequest | None:
        if not ip or not self.guard.allowed(ip):     # network.allow may have narrowed since DNS (SIGHUP)
            return None
        return FetchRequest(url=url, ip=ip, port=urlmod.port_of(url), headers=list(headers or ()))

    async def _fetch_url(self, lease) -> None:
        host_key, url, item = lease.host_key, lease.url, lease.item
        fp = (item.fp if item is not None else 0) or urlmod.fingerprint(url)
        now = self.clock()
        if self.frontier.is_blocked(urlmod.host_of(host_key)):
            self.frontier.complete(lease.lease_id, outcome=Outcome.BLOCKED)
            self._count_unfetched(host_key, Outcome.BLOCKED)
            self._log_dropped(url, Outcome.BLOCKED.value)
            self.recrawl.forget(fp)
            return
        entry = self.robots.get(host_key, now) or self.robots.stale(host_key)
        if entry is None:
            # evicted from the robots cache (or never known here): fetch robots.txt again first
            self.frontier.set_robots(host_key, expires_at=now, crawl_delay_s=None)
            self.frontier.complete(lease.lease_id, outcome=Outcome.ROBOTS_UNAVAILABLE, requeue=True)
            self.metrics.counters["robots_refetch"] += 1
            return
        if not entry.ok:
            # robots.txt unavailable (5xx / network): disallow all until its retry, keep the URL
            self.frontier.complete(lease.lease_id, outcome=Outcome.ROBOTS_UNAVAILABLE, requeue=True,
                                   retry_after_s=max(1.0, entry.expires_at - now))
            self.metrics.counters["robots_deferred"] += 1
            return
        if not entry.rules.allowed(url):
            self.recrawl.forget(fp)
            self.frontier.complete(lease.lease_id, outcome=Outcome.ROBOTS_DENIED)
            self._count_unfetched(host_key, Outcome.ROBOTS_DENIED)
            self._log_event(url, FetchResult(url=url, outcome=Outcome.ROBOTS_DENIED))
            return
        etag, last_modified = self.recrawl.validators(fp)
        conditional = [("If-None-Match", etag)] if etag else []
        if last_modified:
            conditional.append(("If-Modified-Since", last_modified))
        req = self._request(url, lease.ip, conditional)
        if req is None:     # network.allow narrowed since DNS: the whole host goes, with a reason
            self.frontier.complete(lease.lease_id, outcome=Outcome.BLOCKED_ADDRESS)
            self._count_unfetched(host_key, Outcome.BLOCKED_ADDRESS)
            self._log_dropped(url, Outcome.BLOCKED_ADDRESS.value)
            self.frontier.set_host_ip(host_key, None, outcome=Outcome.BLOCKED_ADDRESS)
            return
        res = await self.fetcher.fetch(req)
        if res.outcome is Outcome.ABORTED:
            # abandoned at shutdown: the URL goes back to the front of its queue (nothing lost)
            self.frontier.complete(lease.lease_id, outcome=Outcome.ABORTED, requeue=True)
            self.metrics.outcomes[Outcome.ABORTED.value] += 1
            self._log_event(url, res)
            return
        retry_after = None
        if res.status in (429, 503):
            retry_after = parse_retry_after(res.header("retry-after"), self.wall())
        self.metrics.fetched(host_key, res.outcome.value, res.status, len(res.body))
        if res.outcome is not Outcome.OK and res.outcome is not Outcome.NOT_MODIFIED:
            self.frontier.complete(lease.lease_id, outcome=res.outcome, status=res.status,
                                   response_time_s=res.elapsed_s, retry_after_s=retry_after)
            self._recent_errors.append(f"{url} {res.outcome.value} {res.error}")
            self._log_event(url, res)
            return
        try:
            await self._process_answer(url, fp, host_key, item, res)
        except asyncio.CancelledError:      # shutdown gave up on it: back to its queue
            self.frontier.complete(lease.lease_id, outcome=Outcome.ABORTED, requeue=True)
            raise
        # Completed only once the answer is archived and its links are in the seen-set journal: a
        # crash (or a bug raising above: the lease then expires) fetches the URL again instead of
        # losing it (DESIGN §1.3). The host's gap starts now, after processing: never shorter.
        self.frontier.complete(lease.lease_id, outcome=res.outcome, status=res.status,
                               response_time_s=res.elapsed_s, retry_after_s=retry_after)

    async def _process_answer(self, url: str, fp: int, host_key: str, item, res: FetchResult) -> None:
        """Archive an answer in a worker, decide duplicates, and send its links to the seen-set."""
        depth = item.depth if item is not None else 0
        hops = item.hops if item is not None else 0
        # the worker takes the payload digest and finds the duplicate owner itself (pool module doc)
        pr = await self.pool.process(res, lookup=res.status == 200)
        sha1 = digest_key(pr.digest) if res.status == 200 and pr.digest else None
        # only an archived answer may name a capture (digest owner) or carry validators (recrawl):
        # otherwise a refetch would be a revisit of, or a 304 against, a record that does not exist
        if pr.warc_file:
            if sha1 is not None and not pr.duplicate_of:
                self.digests.add(sha1, url, repr(res.started_at))
            self._record_visit(url, fp, host_key, res, sha1, depth)
        if pr.simhash and res.status == 200:       # simhash 0: no text (not HTML, or empty)
            near = self.near.check_and_add(pr.simhash, url, host_key)
            if near and not pr.duplicate_of:
                pr.near_duplicate_of = near
                self.metrics.counters["duplicate_near"] += 1
            if self.near.should_demote(host_key):   # mostly near-duplicates lately: a trap, slow it down
                self.frontier.demote_host(host_key)
                self.metrics.counters["near_dup_demotions"] += 1
        if pr.outcome is not Outcome.OK:
            self.metrics.counters[f"process_{pr.outcome.value}"] += 1
        if pr.duplicate_of:
            self.metrics.counters["duplicate_exact"] += 1
        if res.status in REDIRECT_STATUSES:
            loc = res.header("location")
            if loc:
                if hops + 1 > self.cfg.fetch.max_redirects:
                    self.metrics.dropped[Outcome.TOO_MANY_REDIRECTS.value] += 1
                    self._log_dropped(urlmod.normalize(loc, url) or loc, Outcome.TOO_MANY_REDIRECTS.value)
                else:
                    self.submit_urls([loc], depth=depth, hops=hops + 1, base=url,
                                     priority=item.priority if item else None)
        elif pr.links and depth < self.cfg.crawl.max_depth and not pr.nofollow:
            follow = [ln for ln in pr.links if not ln.nofollow]
            self.metrics.dropped["nofollow"] += len(pr.links) - len(follow)
            self.submit_links(follow, depth=depth + 1)
            if self.graph is not None and follow:
                # STAR reputation: unique domain -> domain edges (nofollow links earn nothing)
                hosts = {ln.host_key for ln in follow}
                self.graph.add_edges(urlmod.registered_domain(urlmod.host_of(url)),
                                     {urlmod.registered_domain(urlmod.host_of(h)) for h in hosts})
        self._log_event(url, res, pr=pr)

    def _record_visit(self, url: str, fp: int, host_key: str, res: FetchResult, sha1: bytes | None,
                      depth: int) -> None:
        """Recrawl bookkeeping for an answer the frontier will not retry (not 429/503)."""
        if res.status in (429, 503):
            return
        if res.status in (301, 308):
            self.recrawl.forget(fp)         # moved permanently: the target is crawled in its own right
            return
        self.recrawl.record(url, fp, host_key, fetched_at=res.started_at, status=res.status,
                            etag=res.header("etag"), last_modified=res.header("last-modified"),
                            digest=sha1.hex() if sha1 is not None else None, changed=None, depth=depth)
        if res.status == 304:
            self.metrics.counters["not_modified"] += 1

    def _count_unfetched(self, host_key: str, outcome: Outcome) -> None:
        self.metrics.outcomes[outcome.value] += 1

    def _log_event(self, url: str, res: FetchResult, *, pr=None, kind: str = "page") -> None:
        if self.events is None:
            return
        ev = {"schema": EVENT_SCHEMA, "kind": kind, "url": url, "final_url": res.url,
              "fetched_at": res.started_at, "status": res.status,
              "outcome": (pr.outcome if pr is not None else res.outcome).value,
              "ip": res.ip, "fetch_ms": round(res.elapsed_s * 1000, 1)}
        if pr is not None:
            ev.update(content_type=pr.content_type, digest=pr.digest, simhash=f"{pr.simhash:016x}",
                      warc={"file": pr.warc_file, "offset": pr.warc_offset, "length": pr.warc_length},
                      duplicate_of=pr.duplicate_of, near_duplicate_of=pr.near_duplicate_of,
                      robots_meta={"noindex": pr.noindex, "nofollow": pr.nofollow},
                      links_out=len(pr.links))
        error = (pr.error if pr is not None and pr.error else "") or res.error
        if error:
            ev["error"] = error
        self.events.write(ev)

    def _log_dropped(self, url: str, reason: str) -> None:
        """A URL that passed the seen-set but will never be fetched: one event, so nothing vanishes."""
        if self.events is not None:
            self.events.write({"schema": EVENT_SCHEMA, "kind": "dropped", "url": url, "outcome": reason,
                               "fetched_at": self.wall(), "status": 0})

    def _drain_frontier_drops(self) -> None:
        for item, reason in self.frontier.drain_dropped():
            self.metrics.dropped[reason] += 1
            self._log_dropped(item.url, reason)

    # -- control ------------------------------------------------------------------------
    def status(self) -> dict:
        st = self._final_frontier_stats if self._final_frontier_stats is not None else self.frontier.stats()
        return {"in_flight": len(self._leases), "queued": st.get("queued", 0),
                "hosts_active": st.get("hosts_active", 0), "seen_pending": self.seen.pending,
                "paused": self.paused, "frontier": st, "recent_errors": list(self._recent_errors)[-5:],
                "worker_cpu_s": self.pool.cpu_s(), "worker_restarts": self.pool.restarts,
                "recrawl": self._final_recrawl_stats or self.recrawl.stats(),
                "budgets": self._final_budget_stats or (self.budgets.stats() if self.budgets else {})}

    def reload(self, cfg: Config) -> None:
        """SIGHUP: runtime settings (blocklist, network.allow)."""
        self.guard.reload(list(cfg.network.allow))
        self._apply_config_blocklist(cfg.blocklist.hosts)

    def _apply_config_blocklist(self, hosts: list[str]) -> None:
        """Make the config file's blocklist entries effective, keeping entries added at run time.

        The entries that came from the file are remembered in ``<data_dir>/blocklist-config.json``
        (temp, fsync, rename), so an entry deleted from the file is unblocked by the next SIGHUP
        or restart, while ``crawlerd block add`` entries stay until ``crawlerd block remove``.
        """
        wanted = set()
        for h in hosts:
            try:
                wanted.add(Blocklist.normalise(h))
            except ValueError as e:
                log.error("blocklist entry ignored: %s", e)
        path = self.cfg.path("blocklist-config.json")
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
        self.frontier.commit()
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(sorted(wanted), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _worker_died(self, index: int, segment: str) -> None:
        """A dead worker's open segment is closed at once (torn tail cut) so no file stays .open."""
        self.metrics.counters["worker_restarts"] += 1
        if segment:
            for line in recover_segment(segment, index_dir=self.cfg.path("index")):
                log.warning("worker %d segment recovery: %s", index, line)

    def checkpoint(self) -> None:
        self.seen.request_flush()
        self.frontier.commit()
        self.recrawl.commit()
        self.digests.flush()
        self.near.save()
        if self.graph is not None:
            self.graph.flush()
            self.budgets.commit()
        if self.events:
            self.events.flush()

    # -- ordered shutdown ------------------------------------------------------------------
    async def _shutdown(self) -> None:
        """Stop leasing; finish or abandon fetches within the grace; persist everything."""
        self._stopping = True
        grace = self.cfg.fetch.shutdown_grace_s
        if self.fetcher is not None:
            await self.fetcher.close(grace)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=grace + 10.0)
        for t in list(self._tasks):
            t.cancel()
        await self.pool.close()
        self.near.close()
        for lease_id in list(self._leases):
            self.frontier.complete(lease_id, outcome=Outcome.ABORTED, requeue=True)
        self._leases.clear()
        self._drain_frontier_drops()
        try:
            await self.seen.flush()
        except Exception:      # unacknowledged DRUM answers are delivered again at the next start
            log.exception("final seen-set drain failed; its answers are redelivered on restart")
        await self.seen.close()     # before the frontier closes: no delivery after this
        if self.graph is not None:
            self._final_budget_stats = self.budgets.stats()
            self.budgets.close()
            self.graph.close()
        self.frontier.commit()
        self._final_frontier_stats = self.frontier.stats()
        self.frontier.close()
        self.recrawl.commit()
        self._final_recrawl_stats = self.recrawl.stats()
        self.recrawl.close()
        self.digests.close()
        if self.events:
            self.events.close()
        if self.resolver is not None:
            await self.resolver.close()


def data_dir_problem(path: str) -> str | None:
    """Why the data dir cannot be used, or None."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        return f"cannot create data dir {path}: {e.strerror}"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"data dir {path} is not writable"
    return None
