"""A deterministic web on a virtual clock that drives the real Frontier and audits it server-side.

Each simulated host answers like a kind of real server (fast, Crawl-delay,
429/503 with Retry-After, slow, flaky, always timing out, NXDOMAIN, SERVFAIL
for a while, robots.txt 503 first, hanging fetches). The ledger is kept from
the servers' side: it knows when every request started and ended, so it checks
politeness independently of the frontier's own bookkeeping. URL fates are
tracked durably: a completion counts once a frontier commit covers it, so a
simulated crash (the Frontier dropped without close, then reopened) must bring
back exactly the work that was not yet durable.
"""

from __future__ import annotations

import gc
import heapq
import random
from dataclasses import dataclass, field

from crawlerd.frontier import KIND_ROBOTS, Frontier, QueuedURL
from crawlerd.outcome import Outcome

from .server_ledger import EPS, FakeClock, ServerLedger


@dataclass
class Host:
    key: str
    ip: str
    kind: str
    crawl_delay: float = 0.0
    fetches: int = 0
    dns_asks: int = 0
    robots_fetches: int = 0


@dataclass
class Ledger(ServerLedger):
    retry_until: dict[str, float] = field(default_factory=dict)     # host key -> end of its Retry-After
    retry_after_windows: int = 0
    gap_checks: int = 0


KINDS = ["normal"] * 5 + ["crawl_delay", "retry_after", "slow", "flaky", "special"]
SPECIAL = ["failing", "nxdomain", "servfail", "robots_503"]


class Simulation:
    def __init__(self, path: str, *, hosts: int, urls: int, seed: int = 1, ip_group: int = 5,
                 per_ip_concurrency: int = 1, ip_delay_s: float = 0.25, fetch_slots: int = 200,
                 max_active_hosts: int | None = None, levels: int = 4, check_every: int = 400):
        self.path = path
        self.rng = random.Random(seed)
        self.clock = FakeClock()
        self.levels = levels
        self.params = dict(clock=self.clock, wall=self.clock, priority_levels=levels, delay_factor=10.0, min_delay_s=1.0,
                           max_delay_s=30.0, per_ip_concurrency=per_ip_concurrency, ip_delay_s=ip_delay_s,
                           backoff_base_s=10.0, backoff_max_s=120.0, retry_after_cap_s=60.0,
                           park_after_failures=6, park_s=600.0, lease_timeout_s=300.0, max_attempts=3,
                           crawl_delay_cap_s=20.0, max_active_hosts=max_active_hosts or hosts,
                           map_size_bytes=1 << 34, sync=False)
        self.fetch_slots = fetch_slots
        self.check_every = check_every
        self.hosts: list[Host] = []
        for h in range(hosts):
            kind = KINDS[h % 10]
            if kind == "special":
                kind = SPECIAL[(h // 10) % 4]
            g = h // ip_group
            host = Host(f"http://h{h}.grp{h % 7}.test", f"127.10.{g // 250}.{g % 250 + 1}", kind)
            if kind == "crawl_delay":
                host.crawl_delay = 5.0 + (h % 3) * 10.0   # 25 s is above the 20 s cap
            self.hosts.append(host)
        self.by_key = {h.key: h for h in self.hosts}
        # URL fate: url -> [state, attempts, level, host key]; durable copy at the last commit.
        self.url: dict[str, list] = {}
        self.host_urls: dict[str, list[str]] = {}
        self.progress = 0                    # URLs that reached done/dead/dropped (drives the scenario)
        self.durable: dict[str, tuple] = {}
        self.pending: set[str] = set()
        self.done_durable: dict[str, int] = {}
        self.done_pending: list[str] = []
        self.queued_by_level: dict[tuple[str, int], int] = {}
        self.since_pick: dict[tuple[str, int], int] = {}
        self.starvation: list[str] = []
        self.max_pick_gap = [0] * levels
        self.first_lease_robots = set()
        self.session_robots: set[str] = set()
        self.ledger = Ledger(ip_limit=per_ip_concurrency, ip_delay_s=ip_delay_s)
        self.inflight: list[tuple[float, int, object]] = []   # (end, seq, fetch)
        self.hung: dict[int, tuple[float, Host, object]] = {}   # lease id -> (start, host, lease)
        self.expired_complete_refused = 0
        self.expired_pending = 0
        self.seq = 0
        self.crashes = 0
        self.crashed_at: float | None = None      # virtual time of the last crash
        self.restart_delay: float | None = None   # from it to the first request after it
        self.journaled_completions = 0
        self.steps = 0
        self.level_leases = [0] * levels
        self._plan(urls)
        self.f = self._open()
        self._commits = self.f.commits

    # -- setup ---------------------------------------------------------------
    def _plan(self, n: int) -> None:
        # A few hosts get most URLs (heavy tail), every host gets some.
        weights = [1.0 / (1 + i) ** 0.8 for i in range(len(self.hosts))]
        self.rng.shuffle(weights)
        picks = self.rng.choices(range(len(self.hosts)), weights=weights, k=n - len(self.hosts))
        picks += list(range(len(self.hosts)))
        self.rng.shuffle(picks)
        self.batches = []
        items = []
        for i, h in enumerate(picks):
            level = min(self.levels - 1, int(self.rng.expovariate(0.9)))
            items.append(QueuedURL(f"{self.hosts[h].key}/p{i}", self.hosts[h].key, priority=level, fp=i))
        half = len(items) * 3 // 4
        self.batches = [items[:half], items[half:]]

    def _open(self) -> Frontier:
        return Frontier(self.path, rng=random.Random(self.rng.random()), **self.params)

    # -- durable fate tracking ---------------------------------------------------
    def _set(self, url: str, state: str, attempts: int | None = None) -> None:
        rec = self.url[url]
        host, level = rec[3], rec[2]
        if rec[0] == "queued":
            self._level_count(host, level, -1)
        if state == "queued":
            self._level_count(host, level, +1)
        if state in ("done", "dead", "dropped"):
            self.progress += 1
        rec[0] = state
        if attempts is not None:
            rec[1] = attempts
        self.pending.add(url)

    def _level_count(self, host: str, level: int, d: int) -> None:
        k = (host, level)
        n = self.queued_by_level.get(k, 0) + d
        self.queued_by_level[k] = n
        if d > 0 and n == 1:
            self.since_pick[k] = 0

    def _sync_commits(self) -> None:
        if self.f.commits != self._commits:
            self._commits = self.f.commits
            for u in self.pending:
                self.durable[u] = tuple(self.url[u][:2])
            self.pending.clear()
            for u in self.done_pending:
                self.done_durable[u] = self.done_durable.get(u, 0) + 1
            self.done_pending.clear()
            self.expired_complete_refused += self.expired_pending
            self.expired_pending = 0

    # -- the run -------------------------------------------------------------------
    def add_batch(self, items: list[QueuedURL]) -> None:
        for it in items:
            self.url[it.url] = ["new", 0, it.priority, it.host_key]
            self.host_urls.setdefault(it.host_key, []).append(it.url)
        n = self.f.add(items)
        blocked = [it for it in items if self.f.is_blocked(it.host_key)]
        for it in items:
            self._set(it.url, "dropped" if self.f.is_blocked(it.host_key) else "queued")
        assert n == len(items) - len(blocked)
        self._sync_commits()

    def run(self, *, crash_at: float | None = 0.5, block_at: float | None = 0.3, max_steps: int = 10**8) -> None:
        self.add_batch(self.batches[0])
        self.waiting_peak = self.f.stats()["hosts_waiting"]
        total = sum(len(b) for b in self.batches)
        added_second = blocked = crashed = False
        while self.steps < max_steps:
            self.steps += 1
            finished = self.progress
            if not added_second and finished >= total * 0.2:
                self.add_batch(self.batches[1])
                added_second = True
            if block_at is not None and not blocked and finished >= total * block_at:
                self._block("grp3.test")
                blocked = True
            if crash_at is not None and not crashed and added_second and finished >= total * crash_at:
                self.crash()
                crashed = True
            self._answer_dns()
            free = self.fetch_slots - len(self.inflight)
            if free > 0:
                for lease in self.f.lease(self.clock.t, free):
                    self._start(lease)
                self._sync_commits()
            if self.steps % self.check_every == 0:
                self.f.check_invariants()
            if not self._advance():
                break
        self.f.commit()
        self._sync_commits()

    def _advance(self) -> bool:
        """Move the clock to the next event and deliver completions; False when all is done."""
        cands = []
        if self.inflight:
            cands.append(self.inflight[0][0])
        nd = self.f.next_due()
        if nd is not None and len(self.inflight) < self.fetch_slots:
            cands.append(max(nd, self.clock.t))
        if self.hung:
            cands.append(self.f.next_deadline)
        if not cands:
            return self._answer_dns() > 0      # a host activated by the last completion still needs DNS
        t = min(cands)
        assert t >= self.clock.t - EPS
        if t <= self.clock.t and not (self.inflight and self.inflight[0][0] <= t):
            # Something is due but lease() handed out nothing: only allowed if every slot is busy.
            self.stall = getattr(self, "stall", 0) + 1
            assert self.stall < 1000, "frontier reports due work it does not lease"
        else:
            self.stall = 0
        self.clock.t = max(t, self.clock.t)
        while self.inflight and self.inflight[0][0] <= self.clock.t:
            end, _, fetch = heapq.heappop(self.inflight)
            self._finish(fetch, end)
        if self.hung and self.f.next_deadline <= self.clock.t:
            self._expire()
        return True

    # -- DNS -------------------------------------------------------------------------
    def _answer_dns(self) -> int:
        asked = self.f.hosts_needing_dns()
        for hk in asked:
            host = self.by_key[hk]
            host.dns_asks += 1
            if host.kind == "nxdomain":
                self.f.set_host_ip(hk, None, outcome=Outcome.DNS_NXDOMAIN)
                for u in self.host_urls.get(hk, ()):
                    if self.url[u][0] == "queued":
                        self._set(u, "dropped")
            elif host.kind == "servfail" and host.dns_asks <= 2:
                self.f.set_host_ip(hk, None, outcome=Outcome.DNS_SERVFAIL)
            else:
                self.f.set_host_ip(hk, host.ip, expires_at=self.clock.t + 3600.0)
            self._sync_commits()
        return len(asked)

    # -- fetching ----------------------------------------------------------------------
    def _start(self, lease) -> None:
        t, L = self.clock.t, self.ledger
        if self.restart_delay is None and self.crashed_at is not None:
            self.restart_delay = t - self.crashed_at
        host = self.by_key[lease.host_key]
        if lease.ip != host.ip:
            L.violations.append(f"{t}: {host.key} leased with IP {lease.ip}, resolves to {host.ip}")
        L.gap_checks += 1
        if t < L.retry_until.get(host.key, 0.0) - EPS:
            L.violations.append(f"{t}: {host.key}: inside Retry-After until {L.retry_until[host.key]}")
        L.started(host.key, host.ip, t)
        if host.key not in self.first_lease_robots:
            self.first_lease_robots.add(host.key)
            if lease.kind != KIND_ROBOTS:
                L.violations.append(f"{host.key}: first lease is not robots.txt")
        if lease.kind == KIND_ROBOTS:
            host.robots_fetches += 1
            self._schedule(t + 0.05, ("robots", lease, host))
            return
        if host.key not in self.session_robots:
            L.violations.append(f"{t}: {host.key}: URL leased before robots.txt is known")
        url = lease.url
        rec = self.url.get(url)
        if rec is None or rec[0] != "queued":
            L.violations.append(f"{t}: {url} leased in state {rec and rec[0]}")
        if rec[1] + 1 != lease.attempt:
            L.violations.append(f"{url}: attempt {lease.attempt}, expected {rec[1] + 1}")
        self._pick(host.key, rec[2])
        self._set(url, "leased")
        host.fetches += 1
        self._schedule_fetch(lease, host)

    def _pick(self, hk: str, level: int) -> None:
        self.level_leases[level] += 1
        for lv in range(self.levels):
            k = (hk, lv)
            if lv == level:
                self.since_pick[k] = 0
            elif self.queued_by_level.get(k, 0) > 0:
                n = self.since_pick.get(k, 0) + 1
                self.since_pick[k] = n
                self.max_pick_gap[lv] = max(self.max_pick_gap[lv], n)
                bound = 2 ** (lv + 1) if lv < self.levels - 1 else 2 ** lv
                if n > bound:
                    self.starvation.append(f"{hk}: level {lv} skipped {n} picks (bound {bound})")

    def _schedule(self, end: float, fetch) -> None:
        self.seq += 1
        heapq.heappush(self.inflight, (end, self.seq, fetch))

    def _schedule_fetch(self, lease, host: Host) -> None:
        r, t = self.rng.random(), self.clock.t
        kind = host.kind
        res = dict(outcome=Outcome.OK, status=200, rt=self.rng.uniform(0.02, 0.4), retry_after=None,
                   requeue=False)
        if kind == "slow":
            res["rt"] = self.rng.uniform(2.0, 5.0)
        elif kind == "retry_after" and host.fetches % 4 == 0:
            res.update(status=429 if host.fetches % 8 else 503, retry_after=float(self.rng.choice((5, 30, 90))))
        elif kind == "flaky":
            if r < 0.03:
                self.hung[lease.lease_id] = (t, host, lease)   # never answers: the lease must expire
                return
            if r < 0.25:
                res.update(outcome=Outcome.CONNECTION_RESET, status=0, rt=1.0)
            elif r < 0.35:
                res.update(status=500)
        elif kind == "failing":
            res.update(outcome=Outcome.TIMEOUT, status=0, rt=8.0)
        elif kind == "normal" and r < 0.02:
            res.update(outcome=Outcome.ABORTED, status=0, requeue=True, rt=0.01)
        self._schedule(t + res["rt"], ("url", lease, host, res))

    def _finish(self, fetch, end: float) -> None:
        self.clock.t = end
        kind, lease, host = fetch[0], fetch[1], fetch[2]
        self._request_ended(host, end)
        if kind == "robots":
            if host.kind == "robots_503" and host.robots_fetches == 1:
                ok = self.f.complete(lease.lease_id, outcome=Outcome.OK, status=503, response_time_s=0.05)
                self._gap(host, end, 0.05, failed=True)
            else:
                self.f.set_robots(host.key, expires_at=end + 86400.0, crawl_delay_s=host.crawl_delay or None)
                self.session_robots.add(host.key)
                ok = self.f.complete(lease.lease_id, outcome=Outcome.OK, status=200, response_time_s=0.05)
                self._gap(host, end, 0.05)
            assert ok
            self._sync_commits()
            return
        res = fetch[3]
        url = lease.url
        ok = self.f.complete(lease.lease_id, outcome=res["outcome"], status=res["status"],
                             response_time_s=res["rt"], retry_after_s=res["retry_after"], requeue=res["requeue"])
        assert ok, f"complete({lease.lease_id}) refused"
        failed = res["outcome"] != Outcome.OK or res["status"] == 429 or res["status"] >= 500
        # With Retry-After the server named the wait itself; otherwise backoff starts at its base.
        self._gap(host, end, res["rt"], failed=failed and not res["requeue"] and res["retry_after"] is None)
        if res["retry_after"] is not None:
            self.ledger.retry_until[host.key] = end + min(res["retry_after"], self.params["retry_after_cap_s"])
            self.ledger.retry_after_windows += 1
        retry = res["outcome"] != Outcome.OK or res["status"] in (429, 503)
        self._url_outcome(url, lease, retry, res["requeue"])
        self._sync_commits()

    def _url_outcome(self, url: str, lease, retry: bool, requeue: bool) -> None:
        rec = self.url[url]
        if (requeue or retry) and self.f.is_blocked(rec[3]):
            self._set(url, "dropped")          # blocked while it was out: it does not go back
        elif requeue:
            self._set(url, "queued")
        elif retry:
            if lease.attempt >= self.params["max_attempts"]:
                self._set(url, "dead", lease.attempt)
            else:
                self._set(url, "queued", lease.attempt)
        else:
            assert rec[0] == "leased"
            self._set(url, "done")
            self.done_pending.append(url)

    def _request_ended(self, host: Host, end: float) -> None:
        self.ledger.ended(host.key, host.ip, end)

    def _gap(self, host: Host, end: float, rt: float, failed: bool = False) -> None:
        p = self.params
        gap = min(max(p["delay_factor"] * rt, p["min_delay_s"]), p["max_delay_s"])
        gap = max(gap, min(host.crawl_delay, p["crawl_delay_cap_s"]))
        if failed:
            gap = max(gap, p["backoff_base_s"])
        self.ledger.gap(host.key, end + gap)

    def _expire(self) -> None:
        now = self.clock.t
        n = self.f.expire_leases(now)
        gone = [lid for lid, (t0, _h, _l) in self.hung.items() if t0 + self.params["lease_timeout_s"] <= now]
        assert n == len(gone), f"expired {n} leases, {len(gone)} were overdue"
        for lid in gone:
            _t0, host, lease = self.hung.pop(lid)
            # The fetcher's watchdog cut it at the deadline: the server saw it end then.
            self._request_ended(host, now)
            self._gap(host, now, self.params["lease_timeout_s"], failed=True)
            self._url_outcome(lease.url, lease, True, False)
            if not self.f.complete(lid, outcome=Outcome.OK, status=200):
                self.expired_pending += 1       # counted once a commit makes the expiry durable
        self._sync_commits()

    # -- crash ---------------------------------------------------------------------------
    def crash(self) -> None:
        """Drop the Frontier without close (its open transaction dies with it) and reopen."""
        t = self.clock.t
        self.f = None
        gc.collect()
        self.crashes += 1
        self.crashed_at, self.restart_delay = t, None
        # Requests in flight die with the process: the servers see them end now.
        for _end, _seq, fetch in self.inflight:
            self._request_ended(fetch[2], t)
            self._gap(fetch[2], t, 0.0)
        self.inflight.clear()
        for lid, (_t0, host, _lease) in list(self.hung.items()):
            self._request_ended(host, t)
            self._gap(host, t, 0.0)
            del self.hung[lid]
        # Completions since the last commit are in the in-flight journal (written by complete(),
        # after the answer was archived): the restart keeps them, nothing archived is fetched again.
        self.journaled_completions += len(self.done_pending)
        for u in self.done_pending:
            self.durable[u] = tuple(self.url[u][:2])
            self.done_durable[u] = self.done_durable.get(u, 0) + 1
        self.done_pending.clear()
        self.expired_pending = 0
        for u in list(self.pending):
            state, attempts = self.durable.get(u, ("new", 0))
            rec = self.url[u]
            if rec[0] == "queued":
                self._level_count(rec[3], rec[2], -1)
            rec[0], rec[1] = state, attempts
            if state == "queued":
                self._level_count(rec[3], rec[2], +1)
        self.pending.clear()
        # robots.txt stays known across the restart: the frontier keeps its expiry (wall clock)
        self.since_pick.clear()
        self.f = self._open()
        self.redone = self.f.stats()["recovered_completions"]
        for u, rec in self.url.items():
            if rec[0] == "leased":            # the lease table gives it back (or drops it: blocked)
                self._set(u, "dropped" if self.f.is_blocked(rec[3]) else "queued")
        self._commits = self.f.commits
        self._sync_commits()
        self.pending.clear()
        for u, rec in self.url.items():
            self.durable[u] = tuple(rec[:2])
        self.f.check_invariants(deep=True)

    def _block(self, domain: str) -> None:
        self.f.block(domain)
        for hk, urls in self.host_urls.items():
            if self.f.is_blocked(hk):
                for u in urls:
                    if self.url[u][0] == "queued":
                        self._set(u, "dropped")
        self._sync_commits()

