"""The lease runner: from a due host to a completed lease.

Before a host can be leased it needs an address: ``resolve_hosts`` starts one lookup per host
the frontier asks about (``hosts_needing_dns``) and answers ``set_host_ip`` with the first
address the guard allows, or with the DNS outcome (the host's URLs then end with a reason).
``start`` takes up to the free in-flight slots of due leases and runs each as a task:

- a robots lease goes to :class:`~crawlerd.shard.hostfiles.HostFiles`;
- a URL lease is checked against the operator blocklist and the host's robots rules (unknown:
  the URL waits for a fresh robots.txt; unreachable: it waits for the retry; disallowed: it
  ends as ``robots_denied``), fetched with the recrawl validators as a conditional GET, and a
  usable answer is handed to :class:`~crawlerd.shard.answers.Answers`.

The lease is completed only after its answer is processed (archived, links in the seen-set
journal), so a crash fetches the URL again instead of losing it, and the host's politeness gap
starts at the end of processing: never shorter than the gap after the transfer. The lease does
not hold a transfer slot while it waits for processing: ``fetch.max_in_flight`` bounds
transfers on the wire (the fetcher's count plus leases not started yet; ``LeaseWindow`` keeps
fewer while the workers' answer rate needs fewer), and the processing queue has its own bound
(``WorkerPool.behind``, the shard's backpressure).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator

from crawlerd.fetch.robots import RobotsCache
from crawlerd.frontier import Frontier, Lease
from crawlerd.frontier.recrawl import Recrawl
from crawlerd.metrics import Metrics
from crawlerd.outcome import Outcome
from crawlerd.records import FetchRequest, FetchResult
from crawlerd.shard.answers import Answers
from crawlerd.shard.events import FetchEvents
from crawlerd.shard.hostfiles import HostFiles, parse_retry_after
from crawlerd.shard.outbound import Outbound
from crawlerd.shard.storage import StorageFailure
from crawlerd.shard.tasks import Tasks
from crawlerd.url.canonical import fingerprint
from crawlerd.url.hosts import host_of

log = logging.getLogger("crawlerd.shard")

BLOCKED_ADDRESS_WARNINGS = 10       # say why hosts are refused a few times, not once per host
# Leases taken per shard step. Each starts a task whose first steps run together on the loop's
# next iteration, and whose transfers then start, finish and are answered together: a window
# opening by ~1,000 at once made iterations of 100+ ms (loop stalls, bench/RESULTS.md). The
# shard steps again within ~2 ms while hosts are due, so this bounds bursts, not the rate.
LEASES_PER_STEP = 32


class LeaseTable:
    """The leases this shard is working on. Key: lease id. Invariant: a lease is here from
    ``LeaseRunner.start`` until its task ends (or shutdown abandons it); it is in ``unstarted``
    from then until its task first runs (it has not reached the fetcher yet, so the fetcher's
    count of transfers does not include it)."""

    def __init__(self) -> None:
        self._by_id: dict[int, Lease] = {}
        self._unstarted: set[int] = set()

    def add(self, lease: Lease) -> None:
        self._by_id[lease.lease_id] = lease
        self._unstarted.add(lease.lease_id)

    def started(self, lease_id: int) -> None:
        self._unstarted.discard(lease_id)

    @property
    def unstarted(self) -> int:
        return len(self._unstarted)

    def discard(self, lease_id: int) -> None:
        self._by_id.pop(lease_id, None)
        self._unstarted.discard(lease_id)

    def host_busy(self, host_key: str) -> bool:
        """Whether any lease of ``host_key`` is running (a linear scan: only robots redirects ask)."""
        return any(le.host_key == host_key for le in self._by_id.values())

    def ids(self) -> Iterator[int]:
        return iter(list(self._by_id))

    def clear(self) -> None:
        self._by_id.clear()
        self._unstarted.clear()

    def __len__(self) -> int:
        return len(self._by_id)


class LeaseWindow:
    """How many transfers may be going at once (on the wire, queued in the fetcher, or leased and
    not started): enough to keep the processing workers busy, no more. A lease whose answer waits
    for a worker is not counted (``WorkerPool.behind`` bounds those).

    Little's law: feeding the pool at its rate ``R`` (answers per second, the best second of
    about the last minute) when a fetch takes ``L`` seconds (moving average) needs ``R x L``
    fetches in flight. Beyond that, fetched responses only queue unarchived: RAM, and work a
    kill -9 makes the crawl redo (a run starting with thousands of hosts due at once would
    lease ``fetch.max_in_flight`` in one step). Size: ``2 x R x L`` plus ``floor`` (twice the
    workers' slots), at most ``ceiling`` (``fetch.max_in_flight``).

    Bytes (``max_bytes``, ``process.queue_bytes``): the bodies fetched and not archived yet plus
    the transfers going, each at the mean body so far (``body_mean``, at least ``MIN_BODY_BYTES``),
    must fit, or no lease starts (``free``). Only leasing waits: the transfers going land, and the
    count of transfers is the window's as long as the bytes fit. With nothing fetched or going one
    lease may always start, so one body larger than the cap still goes (``fetch.max_body_bytes``
    bounds it).
    """

    MIN_BODY_BYTES = 1024           # an empty answer still costs its record and headers
    FIRST_BODY_BYTES = 64 << 10     # the mean assumed before any body landed: a web's bodies are unknown

    def __init__(self, floor: int, ceiling: int, max_bytes: int = 0):
        self.floor = floor
        self.ceiling = ceiling
        self.max_bytes = max_bytes      # 0: no byte bound
        self.fetch_s = 0.0              # moving average of transfer times, seconds
        self.body_mean = float(self.FIRST_BODY_BYTES)   # moving average of bodies fetched, bytes
        self.rate = 0.0                 # best answers-per-second lately
        self._last_t: float | None = None
        self._last_answered = 0

    def fetched(self, elapsed_s: float, body_bytes: int = 0) -> None:
        self.fetch_s += 0.05 * (max(elapsed_s, 0.0) - self.fetch_s)
        self.body_mean += 0.05 * (max(body_bytes, self.MIN_BODY_BYTES) - self.body_mean)

    def free(self, transfers: int, queued_bytes: int) -> int:
        """Leases that may start now: the window less the ``transfers`` going (on the wire, waiting
        for the fetcher, or leased and not started), and no more than the bytes left once the
        ``queued_bytes`` (bodies fetched, not archived) and the transfers' expected bodies are
        counted. With nothing going and nothing queued, at least one."""
        room = self.size - transfers
        if self.max_bytes > 0:
            room = min(room, int((self.max_bytes - queued_bytes) // self.body_mean) - transfers)
        if transfers <= 0 and queued_bytes <= 0:
            room = max(room, 1)
        return room

    def tick(self, now: float, answered: int) -> None:
        """Once a second or so: the pool's answers so far."""
        if self._last_t is None:
            self._last_t, self._last_answered = now, answered
            return
        dt = now - self._last_t
        if dt < 1.0:
            return
        rate = (answered - self._last_answered) / dt
        self._last_t, self._last_answered = now, answered
        self.rate = rate if rate > self.rate else self.rate * 0.98 ** dt

    @property
    def size(self) -> int:
        return min(self.ceiling, self.floor + int(2.0 * self.rate * self.fetch_s))


class LeaseRunner:
    """DNS for hosts that need it; one task per lease: check, fetch, hand over, complete."""

    def __init__(self, *, frontier: Frontier, table: LeaseTable, tasks: Tasks, outbound: Outbound,
                 fetch: Callable[[FetchRequest], Awaitable[FetchResult]], robots: RobotsCache,
                 recrawl: Recrawl, host_files: HostFiles, answers: Answers, events: FetchEvents,
                 metrics: Metrics, clock: Callable[[], float], wall: Callable[[], float],
                 storage_failed: Callable[[str, str], None], window: LeaseWindow | None = None,
                 keep_alive_s: float = 5.0):
        self.frontier = frontier
        self.table = table
        self.tasks = tasks
        self.outbound = outbound
        self.fetch = fetch
        self.robots = robots
        self.recrawl = recrawl
        self.host_files = host_files
        self.answers = answers
        self.events = events
        self.metrics = metrics
        self.clock = clock
        self.wall = wall
        self.storage_failed = storage_failed
        self.window = window
        self.keep_alive_s = keep_alive_s
        self._dns_pending: set[str] = set()
        # the DUST gate's lease hook (crawlerd.shard.dust), set by the shard: True = completed, skip it
        self.lease_gate: Callable[[Lease, str, int, str], bool] | None = None

    # -- DNS ------------------------------------------------------------------------
    def resolve_hosts(self) -> None:
        """Start a lookup for every host the frontier needs an address for (one at a time per host)."""
        for host in self.frontier.hosts_needing_dns():
            if host not in self._dns_pending:
                self._dns_pending.add(host)
                self.tasks.spawn(self._resolve_host(host))

    async def _resolve_host(self, host_key: str) -> None:
        try:
            res, ip = await self.outbound.lookup(host_of(host_key))
            if res.outcome is not Outcome.OK:
                self.metrics.counters[res.outcome.value] += 1
                self.frontier.set_host_ip(host_key, None, outcome=res.outcome)
            elif ip is None:
                self.metrics.counters["dns_blocked_address"] += 1
                if self.metrics.counters["dns_blocked_address"] <= BLOCKED_ADDRESS_WARNINGS:
                    log.warning("host refused by the address guard host=%s ips=%s outcome=blocked_address "
                                "hint=add the network to network.allow to crawl private/loopback addresses",
                                host_key, ",".join(res.ips[:4]))
                self.frontier.set_host_ip(host_key, None, outcome=Outcome.BLOCKED_ADDRESS)
            else:
                self.frontier.set_host_ip(host_key, ip, expires_at=self.clock() + max(res.ttl_s, 1.0))
        finally:
            self._dns_pending.discard(host_key)

    def keep_alive(self, host_key: str) -> bool:
        """Whether the connection of this request is worth keeping for the host's next one: the host
        has more URLs queued and its turn should come within ``keep_alive_s``. A crawl bound by its
        own rate rather than by politeness reaches a host again only after every host taking turns
        with it (the frontier's working set, or every host scheduled with it off; divided by the
        answers per second): kept connections would otherwise wait idle for tens of seconds, fill
        curl's cache and be evicted (a scan of the cache per transfer) before their host's turn.
        The last lease of a working-set session closes its connection (the host's next turn comes
        after the idle hosts')."""
        sharers = self.frontier.turn_sharers(host_key)
        if sharers is None:
            return False
        rate = self.window.rate if self.window is not None else 0.0
        return rate <= 0.0 or sharers <= rate * self.keep_alive_s

    # -- leases -----------------------------------------------------------------------
    def start(self, now: float, free: int) -> None:
        """Lease up to ``free`` due URLs/robots files (at most ``LEASES_PER_STEP``) and run each
        in its own task."""
        for lease in self.frontier.lease(now, min(free, LEASES_PER_STEP)):
            self.table.add(lease)
            self.tasks.spawn(self._run(lease))

    def abandon_all(self) -> None:
        """Shutdown: every lease still open goes back to the front of its queue (nothing lost)."""
        for lease_id in self.table.ids():
            self.frontier.complete(lease_id, outcome=Outcome.ABORTED, requeue=True)
        self.table.clear()

    async def _run(self, lease: Lease) -> None:
        self.table.started(lease.lease_id)      # from here its transfer is the fetcher's to count
        try:
            if lease.kind == "robots":
                await self.host_files.fetch_robots(lease)
            else:
                await self.fetch_url(lease)
        finally:
            self.table.discard(lease.lease_id)

    async def fetch_url(self, lease: Lease) -> None:
        """One URL lease: check blocklist and robots, fetch (conditionally), process, complete."""
        host_key, url, item = lease.host_key, lease.url, lease.item
        fp = (item.fp if item is not None else 0) or fingerprint(url)
        now = self.clock()
        if self.frontier.is_blocked(host_of(host_key)):
            self.frontier.complete(lease.lease_id, outcome=Outcome.BLOCKED)
            self.metrics.outcomes[Outcome.BLOCKED.value] += 1
            self.events.dropped(url, Outcome.BLOCKED.value)
            self.recrawl.forget(fp)
            return
        if self.lease_gate is not None and self.lease_gate(lease, url, fp, host_key):
            return          # DUST: a trusted rule maps it onto archived content
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
            # queued before the rules said so (or they changed): no request was made, so the
            # host is not charged a politeness gap for it
            self.recrawl.forget(fp)
            self.frontier.complete(lease.lease_id, outcome=Outcome.ROBOTS_DENIED, unfetched=True)
            self.metrics.outcomes[Outcome.ROBOTS_DENIED.value] += 1
            self.events.fetched(url, FetchResult(url=url, outcome=Outcome.ROBOTS_DENIED))
            return
        etag, last_modified = self.recrawl.validators(fp)
        conditional = [("If-None-Match", etag)] if etag else []
        if last_modified:
            conditional.append(("If-Modified-Since", last_modified))
        req = self.outbound.request(url, lease.ip, conditional, keep_alive=self.keep_alive(host_key))
        if req is None:     # network.allow narrowed since DNS: the whole host goes, with a reason
            self.frontier.complete(lease.lease_id, outcome=Outcome.BLOCKED_ADDRESS)
            self.metrics.outcomes[Outcome.BLOCKED_ADDRESS.value] += 1
            self.events.dropped(url, Outcome.BLOCKED_ADDRESS.value)
            self.frontier.set_host_ip(host_key, None, outcome=Outcome.BLOCKED_ADDRESS)
            return
        res = await self.fetch(req)
        if self.window is not None:
            self.window.fetched(res.elapsed_s, res.size)
        if res.outcome is Outcome.ABORTED:
            # abandoned at shutdown: the URL goes back to the front of its queue (nothing lost)
            self.frontier.complete(lease.lease_id, outcome=Outcome.ABORTED, requeue=True)
            self.metrics.outcomes[Outcome.ABORTED.value] += 1
            self.events.fetched(url, res)
            return
        retry_after = None
        if res.status in (429, 503):
            retry_after = parse_retry_after(res.header("retry-after"), self.wall())
        self.metrics.fetched(host_key, res.outcome.value, res.status, res.size)
        if res.outcome is not Outcome.OK and res.outcome is not Outcome.NOT_MODIFIED:
            self.frontier.complete(lease.lease_id, outcome=res.outcome, status=res.status,
                                   response_time_s=res.elapsed_s, retry_after_s=retry_after)
            self.tasks.note_error(f"{url} {res.outcome.value} {res.error}")
            self.events.fetched(url, res)
            return
        try:
            await self.answers.process(url, fp, host_key, item, res)
        except asyncio.CancelledError:      # shutdown gave up on it: back to its queue
            self.frontier.complete(lease.lease_id, outcome=Outcome.ABORTED, requeue=True)
            raise
        except StorageFailure as e:         # not archived: back to the front of its queue, crawl paused
            self.storage_failed(e.reason, e.path)
            self.frontier.complete(lease.lease_id, outcome=Outcome.ABORTED, requeue=True,
                                   response_time_s=res.elapsed_s)
            self.metrics.counters["not_archived_requeued"] += 1
            return
        # Completed only once the answer is archived and its links are in the seen-set journal: a
        # crash (or a bug raising above: the lease then expires) fetches the URL again instead of
        # losing it (ARCHITECTURE.md invariant 3). The host's gap starts now, after processing.
        self.frontier.complete(lease.lease_id, outcome=res.outcome, status=res.status,
                               response_time_s=res.elapsed_s, retry_after_s=retry_after)
