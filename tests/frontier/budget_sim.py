"""A web with a link farm on a virtual clock, crawled through the real Frontier and the real budgets.

The web: ordinary sites (one host, one registered domain each, finite pages, a few links to other
sites), a few big legitimate domains (many hosts, many in-links), a farm (many domains of a few
hosts each, endless pages linking mostly to each other; a tiny share of ordinary links lead in)
and, optionally, one single-PLD site (many hosts under one registered domain, nothing links in).
The crawl: the Frontier leases hosts under politeness, a fixed number of fetch slots answers
after a fixed-ish response time, each page's links go through a seen-set (a Python set, as the
DRUM would answer) into ``Beast.offer``, and the loop does what the shard's periodic step does:
edge merges on their schedule, readmission, the reader moving on as soon as the frontier runs
short. The ledger is kept from the servers' side (fetches per kind, politeness per host).
"""

from __future__ import annotations

import heapq
import os
import random
from collections import Counter
from dataclasses import dataclass, field

from crawlerd.frontier import KIND_ROBOTS, Frontier, QueuedURL
from crawlerd.frontier.budgets import Beast, BudgetRule, BudgetStore, DomainGraph, EdgeDrum
from crawlerd.outcome import Outcome

from .server_ledger import EPS, FakeClock

ENDLESS = 10 ** 9


@dataclass
class Site:
    key: str           # host key
    pld: str
    kind: str          # "legit", "giant", "farm", "single"
    pages: int
    ip: str


@dataclass
class Ledger:
    fetches: Counter = field(default_factory=Counter)          # kind -> pages fetched
    by_pld: Counter = field(default_factory=Counter)
    violations: list = field(default_factory=list)
    last_end: dict = field(default_factory=dict)
    inflight: Counter = field(default_factory=Counter)
    timeline: list = field(default_factory=list)               # (time, reader queue, farm, total)


class FarmWeb:
    """The web's shape and links; pure function of the arguments and the seed."""

    def __init__(self, *, seed: int = 1, legit: int = 1500, giants: int = 5, giant_hosts: int = 8,
                 farm: int = 40, farm_hosts: int = 3, single_hosts: int = 0, legit_pages=(20, 200),
                 farm_in: float = 0.003, farm_out: int = 8):
        rng = random.Random(seed)
        self.rng = random.Random(seed + 1)
        self.sites: list[Site] = []
        n = 0

        def add(host, pld, kind, pages):
            nonlocal n
            self.sites.append(Site(f"http://{host}", pld, kind, pages, f"127.{1 + n // 62500}.{1 + n // 250 % 250}.{1 + n % 250}"))
            n += 1
        for i in range(legit):
            add(f"site{i}.test", f"site{i}.test", "legit", rng.randint(*legit_pages))
        for g in range(giants):
            for h in range(giant_hosts):
                add(f"w{h}.giant{g}.test", f"giant{g}.test", "giant", 2000)
        for f in range(farm):
            for h in range(farm_hosts):
                add(f"h{h}.spam{f}.test", f"spam{f}.test", "farm", ENDLESS)
        for h in range(single_hosts):
            add(f"dept{h}.onesite.test", "onesite.test", "single", 500)
        self.by_key = {s.key: i for i, s in enumerate(self.sites)}
        self.kind_ix: dict[str, list[int]] = {}
        for i, s in enumerate(self.sites):
            self.kind_ix.setdefault(s.kind, []).append(i)
        self.pld_ix: dict[str, list[int]] = {}
        for i, s in enumerate(self.sites):
            self.pld_ix.setdefault(s.pld, []).append(i)
        self.farm_in = farm_in
        self.farm_out = farm_out

    def url(self, i: int, page: int) -> str:
        return f"{self.sites[i].key}/p/{page}"

    def seeds(self, n: int) -> list[int]:
        pool = self.kind_ix.get("legit") or self.kind_ix["single"]
        return random.Random(7).sample(pool, min(n, len(pool)))

    def links(self, i: int, page: int) -> list[tuple[int, int]]:
        """The links of one page: (site index, page)."""
        r = self.rng
        s = self.sites[i]
        out = []
        if s.kind == "farm":
            own = self.pld_ix[s.pld]
            out += [(r.choice(own), r.randrange(ENDLESS)) for _ in range(12)]
            farm = self.kind_ix["farm"]
            out += [(r.choice(farm), r.randrange(ENDLESS)) for _ in range(self.farm_out)]
            out.append((r.choice(self.kind_ix["legit"]), 0))
            return out
        own = self.pld_ix[s.pld] if s.kind in ("giant", "single") else [i]
        out += [(r.choice(own), r.randrange(s.pages)) for _ in range(8)]
        if s.kind == "single":
            return out                                   # a closed site: nothing leaves, nothing comes in
        legit = self.kind_ix["legit"]
        for _ in range(3):
            j = r.choice(legit)
            out.append((j, r.randrange(self.sites[j].pages)))
        if "giant" in self.kind_ix and r.random() < 0.6:
            j = r.choice(self.kind_ix["giant"])
            out.append((j, r.randrange(2000)))
        if "farm" in self.kind_ix and s.kind == "legit" and r.random() < self.farm_in:
            out.append((r.choice(self.kind_ix["farm"]), r.randrange(ENDLESS)))
        return out


class BudgetCrawl:
    """One crawl of a :class:`FarmWeb` on a virtual clock (see the module docstring)."""

    def __init__(self, path: str, web: FarmWeb, *, budgets: bool = True, slots: int = 20, seeds: int = 300,
                 base_budget: int = 2, per_inlink: int = 2, mode: str = "vouched", min_ready_hosts: int = 0,
                 edge_max_age_s: float = 5.0, rt=(0.05, 0.15), log_every_s: float = 5.0, on_commit=None,
                 probation: bool = True, working_set_max: int = 4096):
        self.web = web
        self.clock = FakeClock()
        self.rng = random.Random(3)
        self.slots = slots
        self.rt = rt
        self.min_ready = min_ready_hosts
        self.log_every_s = log_every_s
        self.on_commit = on_commit
        self.f = Frontier(os.path.join(path, "frontier"), clock=self.clock, wall=self.clock, rng=random.Random(1), priority_levels=4,
                          delay_factor=10.0, min_delay_s=1.0, max_delay_s=30.0, per_ip_concurrency=1,
                          lease_timeout_s=300.0, max_active_hosts=len(web.sites) + 10, map_size_bytes=1 << 32,
                          sync=False, working_set_max=working_set_max)
        self.budgets = budgets
        if budgets:
            self.store = BudgetStore(os.path.join(path, "budgets"), map_size_bytes=1 << 30, sync=False)
            self.graph = DomainGraph(self.store, mode=mode)
            self.beast = Beast(self.store, self.graph, BudgetRule(base_budget, per_inlink, 100_000), probation=probation)
            self.edges = EdgeDrum(os.path.join(path, "edges"), self.graph, max_age_s=edge_max_age_s,
                                  buckets=4, clock=self.clock)
        self.seen: set[str] = set()
        self.ledger = Ledger()
        self.inflight: list = []
        self.seq = 0
        self.last_log = -1e9
        self.readmitted = 0
        self.unacked: list[str] = []
        self.last_commit = -1e9
        self.offer([(i, 0) for i in web.seeds(seeds)], depth=0)

    # -- intake: the shard's _on_seen_results -------------------------------------------------------
    def offer(self, links, depth: int) -> None:
        items, fresh = [], []
        for i, page in links:
            url = self.web.url(i, page)
            if url in self.seen:
                continue
            self.seen.add(url)
            s = self.web.sites[i]
            rec = f"{depth} {url}".encode()
            if self.budgets:
                if depth == 0:
                    self.graph.add_root(s.pld)
                elif not self.beast.offer(s.pld, rec, hash(url) & 0xFFFFFFFFFFFFFFFF or 1, s.key):
                    fresh.append(url)
                    continue
            items.append(QueuedURL(url, s.key, priority=min(3, depth), depth=depth))
            fresh.append(url)
        if items:
            self.f.add(items)
        self.unacked.extend(fresh)
        if not self.budgets or self.clock.t - self.last_commit >= 0.5:
            self.commit()

    def commit(self) -> None:
        """Deferrals durable, then the seen-set's answers count as taken (the shard's commit-then-ack)."""
        self.last_commit = self.clock.t
        if self.budgets:
            self.store.commit()
        if self.on_commit is not None and self.unacked:
            self.on_commit("offered", self.unacked)
        self.unacked = []

    # -- the shard's periodic step ------------------------------------------------------------------
    def short(self, now: float) -> bool:
        """The shard's ``_frontier_short``: free slots, and too few ready hosts or none due soon."""
        free = self.slots - len(self.inflight)
        if free <= 0:
            return False
        if self.f.hosts_ready() < (self.min_ready or free):
            return True
        nd = self.f.next_due()
        return nd is None or nd > now + 0.5

    def step_budgets(self, now: float) -> None:
        if not self.budgets:
            return
        self.edges.poll(now)
        recs = self.beast.readmit(1000, advance=self.short(now))
        if recs:
            items = []
            for rec in recs:
                depth, url = rec.decode().split(" ", 1)
                s = self.web.sites[self.web.by_key[url[:url.index("/p/")]]]
                items.append(QueuedURL(url, s.key, priority=min(3, int(depth)), depth=int(depth)))
            self.f.add(items)
            self.commit()
            self.readmitted += len(items)

    # -- the run ---------------------------------------------------------------------------------------
    def run(self, until_s: float) -> None:
        end = self.clock.t + until_s
        while self.clock.t < end:
            now = self.clock.t
            for hk in self.f.hosts_needing_dns():
                self.f.set_host_ip(hk, self.web.sites[self.web.by_key[hk]].ip, expires_at=now + 1e6)
            self.step_budgets(now)
            free = self.slots - len(self.inflight)
            if free > 0:
                for lease in self.f.lease(now, free):
                    self._start(lease, now)
            if now - self.last_log >= self.log_every_s:
                self.last_log = now
                L = self.ledger
                self.ledger.timeline.append((now, self.beast.reader if self.budgets else 0, L.fetches["farm"],
                                             sum(L.fetches.values())))
            cands = [end]
            if self.inflight:
                cands.append(self.inflight[0][0])
            nd = self.f.next_due()
            if nd is not None and len(self.inflight) < self.slots:
                cands.append(max(nd, now + 1e-3))
            if self.budgets and self.beast.has_waiting():
                cands.append(now + 0.1)                  # the shard's readmission step while it runs short
            if self.budgets and self.edges.pending:
                cands.append(now + 1.0)
            self.clock.t = max(min(cands), now)
            while self.inflight and self.inflight[0][0] <= self.clock.t + EPS:
                end_t, _, lease = heapq.heappop(self.inflight)
                self._finish(lease, end_t)

    def _start(self, lease, now: float) -> None:
        L = self.ledger
        hk = lease.host_key
        if L.inflight[hk]:
            L.violations.append(f"{now}: {hk}: two requests at once")
        if now < L.last_end.get(hk, -1e9) + 1.0 - EPS:
            L.violations.append(f"{now}: {hk}: gap {now - L.last_end[hk]:.3f} s < 1 s")
        L.inflight[hk] += 1
        rt = 0.05 if lease.kind == KIND_ROBOTS else self.rng.uniform(*self.rt)
        self.seq += 1
        heapq.heappush(self.inflight, (now + rt, self.seq, lease))

    def _finish(self, lease, end_t: float) -> None:
        self.clock.t = end_t
        L = self.ledger
        hk = lease.host_key
        L.inflight[hk] -= 1
        L.last_end[hk] = end_t
        if lease.kind == KIND_ROBOTS:
            self.f.set_robots(hk, expires_at=end_t + 1e6, crawl_delay_s=None)
            self.f.complete(lease.lease_id, outcome=Outcome.OK, status=200, response_time_s=0.05)
            return
        i = self.web.by_key[hk]
        s = self.web.sites[i]
        L.fetches[s.kind] += 1
        L.by_pld[s.pld] += 1
        page = int(lease.url.rsplit("/", 1)[1])
        links = self.web.links(i, page)
        depth = lease.item.depth + 1
        self.offer(links, depth)
        if self.budgets:
            self.edges.add(s.pld, {self.web.sites[j].pld for j, _ in links})
        # logged as fetched before the frontier hears of it: once complete() has journaled the
        # completion, the frontier's restart counts the URL done, so a kill between the two must
        # not leave it in neither place
        if self.on_commit is not None:
            self.on_commit("done", [lease.url])
        self.f.complete(lease.lease_id, outcome=Outcome.OK, status=200, response_time_s=end_t - L.last_end[hk] + 0.1)

    # -- results -----------------------------------------------------------------------------------------
    def farm_share(self) -> float:
        total = sum(self.ledger.fetches.values())
        return self.ledger.fetches["farm"] / max(total, 1)

    def close(self) -> None:
        self.commit()
        self.f.close()
        if self.budgets:
            self.store.close()
            self.edges.close()
