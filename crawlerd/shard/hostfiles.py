"""The robots.txt and sitemap leases of a host: a component of the crawl shard.

A host's first lease (and one after each robots.txt expiry) is for its robots.txt
(RFC 9309 §2.3.1): 2xx parse, 3xx follow up to ``fetch.max_redirects`` hops,
each hop waiting the politeness gap, 4xx allow all, 5xx or failure disallow all
for now. The sitemaps robots.txt announces are read within the same lease, so
the host stays busy and every request still waits its gap.

:class:`HostFiles` receives what it uses explicitly: the frontier (to record the
robots state and complete the lease), the robots cache, the politeness rule, an
:class:`~crawlerd.shard.outbound.Outbound` for guard-checked requests, the fetch
coroutine, an ``archive`` callable (robots.txt and sitemap answers are archived like
pages), a ``read_sitemap`` coroutine (a worker archives and parses a sitemap answer: its
reading, or None if it could not be archived), the event writer and the intake's
``submit_links`` for sitemap URLs (normalised and fingerprinted by the worker).
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Awaitable, Callable

from crawlerd.config import Config
from crawlerd.fetch.codec import DecodeError, decode_body
from crawlerd.fetch.robots import RobotsCache, RobotsEntry, RobotsFollow, RobotsState, robots_decision
from crawlerd.frontier import Frontier, Lease
from crawlerd.frontier.politeness import Politeness
from crawlerd.metrics import Metrics
from crawlerd.outcome import Outcome
from crawlerd.records import FetchRequest, FetchResult, Link
from crawlerd.shard.events import FetchEvents
from crawlerd.shard.outbound import Outbound
from crawlerd.url.canonical import normalize
from crawlerd.url.hosts import host_key as host_key_of
from crawlerd.url.hosts import host_of

GAP_TOPUPS = 3      # extra sleeps wait_gap may take (each ends later in real time: never a spin)


async def wait_gap(gap_s: float) -> None:
    """Sleep at least ``gap_s`` of real time. The loop's timers run on its cached time (read at the
    start of an iteration) and whole milliseconds, so ``asyncio.sleep`` alone may end a fraction of a
    millisecond early; a politeness gap must not (the monotonic clock is checked, and the rest slept)."""
    due = time.monotonic() + gap_s
    await asyncio.sleep(gap_s)
    for _ in range(GAP_TOPUPS):
        rest = due - time.monotonic()
        if rest <= 0:
            return
        await asyncio.sleep(rest + 0.001)


def parse_retry_after(value: str | None, now_wall: float) -> float | None:
    """Retry-After (RFC 9110 §10.2.3): delay-seconds or an HTTP-date; None if absent/garbage."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - now_wall)


def robots_source(entry: RobotsEntry, body: bytes, max_bytes: int) -> bytes | None:
    """The bytes ``entry``'s rules come from, for the robots cache on disk (None: the previous copy's)."""
    if entry.status == 304 or entry.outcome_name == RobotsState.STALE:
        return None                 # the rules of the copy already held
    return body[:max_bytes] if entry.outcome_name == RobotsState.PARSED else b""


class HostFiles:
    """robots.txt and sitemap fetching for one robots lease; ``fetch_robots`` completes the lease."""

    def __init__(self, cfg: Config, *, frontier: Frontier, robots: RobotsCache, politeness: Politeness,
                 outbound: Outbound, fetch: Callable[[FetchRequest], Awaitable[FetchResult]],
                 archive: Callable[[FetchResult], None],
                 read_sitemap: Callable[[FetchResult], Awaitable[tuple | None]], events: FetchEvents,
                 submit_links: Callable[..., int], metrics: Metrics, clock: Callable[[], float],
                 wall: Callable[[], float], stopping: Callable[[], bool],
                 links_barrier: Callable[[], Awaitable | None] = lambda: None):
        self.cfg = cfg
        self.frontier = frontier
        self.robots = robots
        self.politeness = politeness
        self.outbound = outbound
        self.fetch = fetch
        self.archive = archive
        self.read_sitemap = read_sitemap
        self.events = events
        self.submit_links = submit_links
        self.links_barrier = links_barrier          # awaited before the lease completes: sitemap links kept
        self.metrics = metrics
        self.clock = clock
        self.wall = wall
        self.stopping = stopping

    async def fetch_robots(self, lease: Lease) -> None:
        """Fetch (following redirects) and cache the host's robots.txt, read its sitemaps, complete the lease."""
        host_key = lease.host_key
        url = lease.url
        previous = self.robots.stale(host_key)
        rc = self.cfg.robots
        total_s = 0.0
        for hops in range(self.cfg.fetch.max_redirects + 2):
            same_host = host_key_of(url) == host_key
            req = self.outbound.request(url, lease.ip) if same_host else await self.outbound.request_elsewhere(url)
            if req is None:
                res = FetchResult(url=url, outcome=Outcome.BLOCKED_ADDRESS)
            else:
                res = await self.fetch(req)
            total_s += res.elapsed_s
            if res.outcome is Outcome.ABORTED:
                self.frontier.complete(lease.lease_id, outcome=Outcome.ABORTED, requeue=True)
                return
            self.metrics.counters["robots_fetches"] += 1
            body = b""
            if res.outcome is Outcome.OK:
                self.archive(res)     # archive robots.txt answers too
                if 200 <= res.status < 300:
                    try:
                        # decoded up to the page cap; the parser reads the first robots.max_bytes
                        body = decode_body(res.content(), chunked=res.chunked,
                                           content_encoding=res.header("content-encoding"),
                                           max_bytes=self.cfg.fetch.max_decoded_bytes)
                    except DecodeError:
                        body = b""      # undecodable: parsed as empty (allow all), RFC 9309 §2.3.1.1
            decision = robots_decision(
                status=res.status, outcome_ok=res.outcome is Outcome.OK, body=body,
                location=res.header("location"), hops=hops, previous=previous, now=self.clock(),
                agent_token=rc.agent_token, cache_ttl_s=rc.cache_ttl_s, error_retry_s=rc.error_retry_s,
                max_bytes=rc.max_bytes)
            if isinstance(decision, RobotsFollow):
                nxt = normalize(decision.url, url)
                if nxt is None:
                    break
                url = nxt
                # the lease keeps the host busy; the next hop still waits the politeness gap, and
                # only if the hop can finish before the lease expires (else: unusable, below)
                gap = self.politeness.gap_s(res.elapsed_s, 0.0, 0)
                if lease.deadline - self.clock() < gap + self.cfg.fetch.timeout_s:
                    break
                await wait_gap(gap)
                continue
            self.robots.put(host_key, decision, robots_source(decision, body, rc.max_bytes))
            self.frontier.set_robots(host_key, expires_at=decision.expires_at,
                                     crawl_delay_s=decision.rules.crawl_delay)
            self.events.fetched(lease.url, res, kind="robots")
            last = res
            if decision.ok and self.cfg.sitemaps.enabled and same_host and not self.stopping():
                last = await self._read_sitemaps(host_key, lease.ip, decision.rules, res, lease.deadline)
                kept = self.links_barrier()
                if kept is not None:
                    await kept      # the sitemap links in the intake log before the lease completes
            retry_after = None
            if last.status in (429, 503):
                retry_after = parse_retry_after(last.header("retry-after"), self.wall())
            self.frontier.complete(lease.lease_id, outcome=last.outcome, status=last.status,
                                   response_time_s=last.elapsed_s, retry_after_s=retry_after)
            return
        # redirect target unusable: RFC 9309 §2.3.1.2 lets us treat it as unavailable (4xx-like)
        decision = robots_decision(status=404, outcome_ok=True, body=b"", location=None, hops=0,
                                   previous=previous, now=self.clock(), agent_token=rc.agent_token,
                                   cache_ttl_s=rc.cache_ttl_s, error_retry_s=rc.error_retry_s,
                                   max_bytes=rc.max_bytes)
        self.robots.put(host_key, decision, b"")
        self.frontier.set_robots(host_key, expires_at=decision.expires_at, crawl_delay_s=None)
        self.frontier.complete(lease.lease_id, outcome=Outcome.OK, status=404, response_time_s=total_s)

    async def _read_sitemaps(self, host_key: str, ip: str, rules, last: FetchResult,
                             deadline: float) -> FetchResult:
        """Read the host's sitemaps within its robots lease: the host stays busy, and every fetch
        waits the politeness gap (and Crawl-delay) after the previous one; a 429/503 or a transport
        failure ends the reading. Returns the last fetch's result, which the lease completes with
        (so its response time, status and Retry-After set the host's next due time). Only
        same-host sitemaps are read (sitemaps.org: a sitemap vouches for its
        own host); index children are followed up to ``sitemaps.max_fetches_per_host`` files."""
        sm = self.cfg.sitemaps
        queue = [u for u in (normalize(x) for x in [*rules.sitemaps, *sm.urls])
                 if u is not None and host_key_of(u) == host_key]
        done: set[str] = set()
        crawl_delay = min(rules.crawl_delay or 0.0, self.cfg.robots.crawl_delay_cap_s)
        fetches = 0
        while queue and fetches < sm.max_fetches_per_host:
            url = queue.pop(0)
            if url in done or not rules.allowed(url):
                continue
            done.add(url)
            gap = self.politeness.gap_s(last.elapsed_s, crawl_delay, 0)
            if deadline - self.clock() < gap + self.cfg.fetch.timeout_s:
                break                     # never outlive the lease: the rest waits for the next reading
            await wait_gap(gap)
            if self.stopping() or self.frontier.is_blocked(host_of(host_key)):
                break                     # the operator blocklist wins at once
            req = self.outbound.request(url, ip)
            if req is None:
                break
            res = await self.fetch(req)
            fetches += 1
            self.metrics.counters["sitemap_fetches"] += 1
            if res.outcome is Outcome.ABORTED:
                break                     # shutdown: the robots answer still completes the lease
            last = res
            self.events.fetched(url, res, kind="sitemap")
            if res.outcome is not Outcome.OK:
                break                     # host trouble: back off through the lease completion
            if res.status in (429, 503):
                self.archive(res)   # archived like any answer
                break
            if res.status != 200:
                self.archive(res)
                continue
            # archived and parsed by a worker (a 50,000-URL sitemap never stalls this loop)
            reading = await self.read_sitemap(res)
            if reading is None:
                break               # not archived (storage): the crawl pauses, the lease completes
            urls, children, rejected, problem = reading
            if problem:             # "undecodable", or "unread" (the worker failed on it)
                self.metrics.counters[f"sitemap_{problem}"] += 1
                continue
            queue.extend(children)
            recent_after = self.wall() - sm.recent_s
            fresh = [Link(u, fp, "") for u, fp, lastmod in urls if lastmod is not None and lastmod >= recent_after]
            other = [Link(u, fp, "") for u, fp, lastmod in urls if lastmod is None or lastmod < recent_after]
            self.submit_links(fresh, depth=1, priority=0)   # lastmod raises priority
            self.submit_links(other, depth=1, priority=1)
            self.metrics.counters["sitemap_urls"] += len(urls)
            self.metrics.dropped["sitemap_foreign_url"] += rejected
        return last
