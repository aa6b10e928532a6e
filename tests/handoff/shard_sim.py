"""Several shards on one virtual clock: real Frontiers, real DRUMs, the real spool hand-off and the
real shared IP slot table, against simulated servers that keep their own ledger.

Each shard owns the hosts ``url.hosts.shard_of`` gives it. A fetched page links to pages of other
hosts; links to hosts of another shard are staged in the shard's outbox, and its lease is
completed only after the outbox flushed them (as ``Answers.process`` waits for the barrier).
A shard takes its inbox's batches into its DRUM and acknowledges each after DRUM journalled it
(``Intake.take_handoff``); DRUM's unique answers go to its frontier and are acknowledged to
DRUM after the frontier committed them (``Intake.on_seen_results``).

A kill drops a shard's Frontier without close (its open transaction dies with it), closes its
DRUM without acknowledging (``auto_ack=False``: the same files a ``kill -9`` leaves) and forgets
its outbox (staged records are lost with the process); the servers see its requests end at
that moment, and the supervisor frees its IP cells (their gaps start then). The shard then
reopens everything from disk.

The ledger is the servers': per host one request at a time and the politeness gap after each;
per IP (shared by hosts of different shards) one request at a time and ``ip_delay_s`` after
each, across all shards.
"""

from __future__ import annotations

import gc
import os
import random
from dataclasses import dataclass

from crawlerd._native.ipslots import IPSlots, create
from crawlerd.frontier import KIND_ROBOTS, Frontier, QueuedURL
from crawlerd.handoff import SpoolInbox, SpoolOutbox
from crawlerd.outcome import Outcome
from crawlerd.seen.drum import Drum
from crawlerd.shard.intake import decode_aux, encode_aux
from crawlerd.url.canonical import fingerprint
from crawlerd.url.hosts import host_key, shard_of_url
from tests.frontier.server_ledger import EPS, FakeClock, ServerLedger

PARAMS = dict(priority_levels=2, delay_factor=10.0, min_delay_s=1.0, max_delay_s=5.0, per_ip_concurrency=1,
              backoff_base_s=10.0, backoff_max_s=60.0, retry_after_cap_s=60.0, park_after_failures=6,
              park_s=600.0, lease_timeout_s=300.0, max_attempts=3, crawl_delay_cap_s=5.0, sync=False,
              map_size_bytes=1 << 30)


@dataclass
class Ledger(ServerLedger):
    shared_ip_requests: int = 0       # requests to an IP that hosts of several shards share


class SimShard:
    """One shard's stores and its requests in flight."""

    def __init__(self, sim: ShardWeb, index: int):
        self.sim = sim
        self.index = index
        self.dir = os.path.join(sim.root, "shards", str(index))
        self.open()
        self.kills = 0

    def open(self) -> None:
        sim = self.sim
        # the wall clock is virtual too: a real one would move the dues read back after a kill by however
        # long the reopen took on this box
        self.frontier = Frontier(os.path.join(self.dir, "frontier"), clock=sim.clock, wall=sim.clock,
                                 ip_delay_s=sim.ip_delay_s,
                                 max_active_hosts=len(sim.hosts), rng=random.Random(sim.rng.random()),
                                 shared_ips=self._slots(), **PARAMS)
        self.drum = Drum(os.path.join(self.dir, "drum"), buckets=4, bucket_buffer_bytes=1 << 12,
                         merge_bytes=1 << 20, cache_entries=1 << 10, auto_ack=False, clock=sim.clock)
        self.outbox = SpoolOutbox(sim.spool, self.index, [j for j in range(sim.n) if j != self.index],
                                  batch_records=512)
        self.inbox = SpoolInbox(sim.spool, self.index)
        self.inflight: list[tuple[float, object, float]] = []      # (end, lease, response time)
        self.waiting: list[tuple[object, float]] = []             # ended, links staged, not completed
        self.staged: list[str] = []                                 # URLs staged since the last flush
        self.last_flush = -1e9

    def _slots(self) -> IPSlots:
        s = IPSlots(self.sim.slots_path)
        s.attach(self.index, self.sim.clock(), self.sim.ip_delay_s)
        self.slots = s
        return s

    # -- the intake ------------------------------------------------------------------------
    def take_inbox(self) -> None:
        for batch in self.inbox.receive():
            self.drum.check_update([fp for fp, _ in batch.records], [aux for _, aux in batch.records])
            self.inbox.ack(batch)               # journalled: the sender's copy may go

    def submit(self, urls: list[str], depth: int) -> None:
        mine, away = [], {}
        for u in urls:
            owner = shard_of_url(u, self.sim.n)
            rec = (fingerprint(u), encode_aux(depth, 0, 1, u))
            if owner == self.index:
                mine.append(rec)
            else:
                away.setdefault(owner, []).append(rec)
                self.staged.append(u)
        if mine:
            self.drum.check_update([fp for fp, _ in mine], [aux for _, aux in mine])
        for dest, recs in away.items():
            self.outbox.stage(dest, recs)

    def seen_answers(self) -> None:
        now = self.sim.clock()
        if not self.drum.pending or now - self.last_flush < 1.0 - EPS:
            return
        self.last_flush = now
        self.drum.flush()
        while True:
            res = self.drum.results()
            if not res:
                break
            items = []
            for r in res:
                if r.unique:
                    depth, hops, prio, u = decode_aux(r.aux)
                    assert shard_of_url(u, self.sim.n) == self.index, f"{u} reached shard {self.index}"
                    items.append(QueuedURL(u, host_key(u), priority=prio, depth=depth, fp=r.key))
                    self.sim.queued_by[u] = self.sim.queued_by.get(u, set()) | {self.index}
            if items:
                self.frontier.add(items)        # committed before DRUM forgets them
            self.drum.ack()

    # -- fetching --------------------------------------------------------------------------
    def lease(self, slots: int) -> None:
        sim, f = self.sim, self.frontier
        now = sim.clock()
        for hk in f.hosts_needing_dns():
            f.set_host_ip(hk, sim.hosts[hk], expires_at=now + 1e6)
        free = slots - len(self.inflight) - len(self.waiting)
        if free <= 0:
            return
        for lease in f.lease(now, free):
            rt = sim.rng.choice((0.02, 0.05, 0.1, 0.3))
            sim.request_started(lease.host_key, sim.hosts[lease.host_key], now)
            self.inflight.append((now + rt, lease, rt))

    def next_event(self) -> float | None:
        """The next request end, or the next due host in the future (one due now waits for a slot)."""
        cands = [e for e, _l, _r in self.inflight]
        nd = self.frontier.next_due()
        if nd is not None and nd > self.sim.clock():
            cands.append(nd)
        if self.drum.pending:
            cands.append(self.last_flush + 1.0)
        return min(cands) if cands else None

    def end_requests(self) -> None:
        sim, now = self.sim, self.sim.clock()
        done = [x for x in self.inflight if x[0] <= now + EPS]
        self.inflight = [x for x in self.inflight if x[0] > now + EPS]
        for _end, lease, rt in done:
            sim.request_ended(lease.host_key, sim.hosts[lease.host_key], now, rt)
            if lease.kind == KIND_ROBOTS:
                self.frontier.set_robots(lease.host_key, expires_at=now + 1e6, crawl_delay_s=None)
                self.frontier.complete(lease.lease_id, outcome=Outcome.OK, status=200, response_time_s=rt)
                continue
            assert shard_of_url(lease.url, sim.n) == self.index, f"{lease.url} fetched by shard {self.index}"
            self.submit(sim.links(lease.url), (lease.item.depth if lease.item else 0) + 1)
            self.waiting.append((lease, rt))

    async def flush_and_complete(self) -> None:
        """The outbox holds the links durably: only now do their leases complete."""
        await self.outbox.flush()
        self.sim.handed.update(self.staged)
        self.staged.clear()
        for lease, rt in self.waiting:
            if self.frontier.complete(lease.lease_id, outcome=Outcome.OK, status=200, response_time_s=rt):
                self.sim.fetched.setdefault(lease.url, []).append(self.index)
        self.waiting.clear()

    # -- kill -9 ---------------------------------------------------------------------------------
    def kill(self) -> None:
        sim, now = self.sim, self.sim.clock()
        for _end, lease, _rt in self.inflight:           # the servers see the connections drop now
            sim.request_ended(lease.host_key, sim.hosts[lease.host_key], now, 0.0)
        # self.waiting: ended, links staged but not flushed: never completed, so fetched again
        self.staged.clear()
        self.frontier = None
        gc.collect()
        self.drum.close()                                # auto_ack=False: what kill -9 leaves on disk
        self.slots.close()
        sim.supervisor_slots.reclaim(self.index, now, sim.ip_delay_s)
        self.kills += 1
        self.open()


class ShardWeb:
    def __init__(self, root: str, *, shards: int = 3, hosts: int = 10_000, shared_share: float = 0.1,
                 ip_group: int = 4, seeds: int = 600, slots: int = 150, ip_delay_s: float = 0.5, seed: int = 3):
        self.root = root
        self.n = shards
        self.rng = random.Random(seed)
        self.clock = FakeClock()
        self.ip_delay_s = ip_delay_s
        self.slots_per_shard = slots
        self.spool = os.path.join(root, "handoff")
        self.slots_path = os.path.join(root, "ipslots")
        create(self.slots_path, shards, 1, 1 << 16)
        self.supervisor_slots = IPSlots(self.slots_path)
        self.hosts: dict[str, str] = {}
        names = [f"http://h{i}.d{i}.test" for i in range(hosts)]
        for i, hk in enumerate(names):
            self.hosts[hk] = f"127.20.{i // 250}.{i % 250 + 1}"
        # shared addresses: groups of hosts from different shards' partitions on one IP
        sharing = self.rng.sample(names, int(hosts * shared_share))
        sharing.sort(key=lambda hk: shard_of_url(hk + "/", shards))
        width = len(sharing) // ip_group
        self.shared_ips: dict[str, list[str]] = {}
        for g in range(width):
            members = [sharing[g + k * width] for k in range(ip_group)]
            ip = f"127.30.{g // 250}.{g % 250 + 1}"
            for hk in members:
                self.hosts[hk] = ip
            self.shared_ips[ip] = members
        self.names = names
        self.ledger = Ledger(ip_delay_s=ip_delay_s)
        self.handed: set[str] = set()
        self.fetched: dict[str, list[int]] = {}
        self.queued_by: dict[str, set[int]] = {}
        self.discovered: set[str] = set()
        self.lost_staged = 0                # staged links a kill took with it (their pages are fetched again)
        self.shards = [SimShard(self, i) for i in range(shards)]
        order = names[:]
        self.rng.shuffle(order)
        self.seeds = [f"{hk}/p0" for hk in order[:seeds]]
        self.children: dict[str, list[str]] = {}
        for k in range(seeds, len(order)):
            self.children.setdefault(order[(k - seeds) // 2], []).append(order[k])

    # -- the web -----------------------------------------------------------------------------
    def links(self, url: str) -> list[str]:
        """Every URL has one in-link, so a lost hand-off would lose it: the hosts form trees (the
        seeds' hosts are the roots, each host's page 0 links to its two children's page 0) and
        page 0 links to page 1 of its host."""
        hk, page = url.rsplit("/", 1)
        if page != "p0":
            return []
        out = [f"{hk}/p1"] + [f"{c}/p0" for c in self.children.get(hk, ())]
        self.discovered.update(out)
        return out

    # -- the servers' ledger -----------------------------------------------------------------------
    def request_started(self, hk: str, ip: str, t: float) -> None:
        if len(self.shared_ips.get(ip, ())) > 1:
            self.ledger.shared_ip_requests += 1
        self.ledger.started(hk, ip, t)

    def request_ended(self, hk: str, ip: str, t: float, rt: float) -> None:
        self.ledger.ended(hk, ip, t)
        self.ledger.gap(hk, t + min(max(PARAMS["delay_factor"] * rt, PARAMS["min_delay_s"]), PARAMS["max_delay_s"]))

    # -- the run -----------------------------------------------------------------------------------
    async def hand_seeds(self) -> None:
        out = SpoolOutbox(self.spool, self.n, range(self.n))
        for u in self.seeds:
            out.stage(shard_of_url(u, self.n), [(fingerprint(u), encode_aux(0, 0, 0, u))])
        await out.flush()
        self.handed.update(self.seeds)
        self.discovered.update(self.seeds)

    def idle(self) -> bool:
        return all(not s.inflight and not s.waiting and not s.drum.pending and s.frontier.queued() == 0
                   and s.inbox.backlog() == 0 and not s.outbox.pending_records() for s in self.shards)

    async def run(self, *, kills: int = 6, max_steps: int = 400_000) -> None:
        await self.hand_seeds()
        kill_at = sorted(self.rng.uniform(0.1, 0.8) for _ in range(kills))
        steps = 0
        while steps < max_steps:
            steps += 1
            for s in self.shards:
                s.take_inbox()
                s.seen_answers()
                s.lease(self.slots_per_shard)
            progress = len(self.fetched) / max(1, len(self.discovered))
            victim = None
            if kill_at and progress >= kill_at[0]:
                victim = self.shards[self.rng.randrange(self.n)]
            t_next = [e for e in (s.next_event() for s in self.shards) if e is not None]
            if not t_next:
                if self.idle():
                    break
                self.clock.t += 0.05         # DRUM answers or spool files still to come
            else:
                self.clock.t = max(self.clock.t, min(min(t_next), self.clock.t + 0.5))
            for s in self.shards:
                s.end_requests()
                if s is victim and s.staged:
                    # mid hand-off: links of ended requests staged, not yet flushed, leases open
                    kill_at.pop(0)
                    self.lost_staged += len(s.staged)
                    s.kill()
                    continue
                await s.flush_and_complete()
        self.steps = steps
