"""The shard's intake: the only way a URL enters the frontier.

Seeds, redirect targets, outlinks and sitemap URLs are normalised and filtered
(``url.filter.UrlFilter``; every drop is counted under its reason in ``metrics.dropped``), then
submitted to the DRUM seen-set with their record (depth, hops, priority, URL) as aux data.
DRUM's answers come back on the loop: duplicates end there; unique URLs pass the BEAST domain
budget (over budget: deferred on disk, not dropped) and are added to the frontier, and only
then are the answers acknowledged. robots.txt decides at admission: a unique URL its host's
current rules (RFC 9309) disallow is dropped here (counted as ``robots_denied``, one event),
not queued to cost its host a lease and a politeness gap later. Two other doors lead past the seen-set: deferred URLs
readmitted when their domain's budget grows, and recrawl revisits that are due.

Order of durability everywhere: the frontier commits before the source of a URL (DRUM's
acknowledgement, the budget deferral table, the recrawl schedule) forgets it, so a crash
repeats a URL and never loses one.

With several shards (``crawl.shards``), a URL whose host another shard owns (``url.hosts.shard_of``)
is not filtered here but staged in the hand-off outbox for its owner, which filters it and
submits it to its own DRUM (``take_handoff``); STAR edges to another shard's domains go to that
shard too (a vouch is counted in its target's shard: ``DomainGraph.export``); a lease
completes only once the outbox holds its links durably. A received batch is acknowledged once DRUM's intake
log holds its records.

The seen-set's intake log is written off the loop (``seen/front.py``): ``submit`` returns before
its record is on disk, so a lease completes only after ``links_barrier`` (its links in the
intake log, and in the outbox for other shards; its STAR edges in the edge DRUM's intake log,
``Answers.process``), and a received batch is acknowledged from ``when_logged`` (its vouches
also from the edge DRUM's).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from crawlerd._native.intake import answers as _answers
from crawlerd._native.intake import links as _links
from crawlerd.config import Config
from crawlerd.fetch.robots import RobotsCache
from crawlerd.frontier import Frontier, QueuedURL
from crawlerd.frontier.budgets import Budgets, domain_name
from crawlerd.frontier.recrawl import Recrawl
from crawlerd.handoff import Batch
from crawlerd.metrics import Metrics
from crawlerd.outcome import Outcome
from crawlerd.records import Link
from crawlerd.seen import AsyncSeenSet, answer_runs
from crawlerd.store.unlanded import UnlandedGate
from crawlerd.url.canonical import fingerprint, normalize
from crawlerd.url.filter import UrlFilter
from crawlerd.url.hosts import host_key, host_of, shard_of

SEEN_SLICE = 512        # DRUM answers judged per loop iteration (~5 ms; 1,024 took 11-20 ms on a loaded box)
# DRUM answers judged per budget + frontier commit at most: a whole delivery of the shard's seen-set;
# sooner once the budget writes could change more pages than the budget store reserved buffers
# for (``Budgets.full``; ARCHITECTURE.md, "Memory bounds").
COMMIT_ANSWERS = 8192

# a URL admitted and not added yet, as the frontier's overlay will hold it (its queue entry, a share
# of its host's record and waiting entry: 320-490 B measured, 1,000 and 100 hosts per 2,000 URLs, ~650 B
# when each is a new host): at least this, more when the last delivery's add measured more
ADDED_URL_BYTES = 768

# deferred URLs readmitted per loop iteration (read from BEAST, queued, both committed): a whole
# readmit_batch (1,000) at once held the loop 25-35 ms in the frontier's add and commit
READMIT_SLICE = 200

_ROBOTS_DENIED = Outcome.ROBOTS_DENIED.value
VOUCH_TAG = b"V "            # a hand-off record that is a STAR vouch, not a URL (its fp is 0)


def encode_aux(depth: int, hops: int, priority: int, url: str) -> bytes:
    """A URL's record as it travels through DRUM and the budget deferral table."""
    return f"{depth} {hops} {priority} {url}".encode()


def decode_aux(aux: bytes) -> tuple[int, int, int, str]:
    depth, hops, priority, url = aux.decode().split(" ", 3)
    return int(depth), int(hops), int(priority), url


class Intake:
    """URLs in: filter → seen-set → (budgets) → frontier; revisits and readmissions → frontier."""

    def __init__(self, cfg: Config, *, frontier: Frontier, seen: AsyncSeenSet, url_filter: UrlFilter,
                 recrawl: Recrawl, metrics: Metrics, wake: Callable[[], None],
                 budgets: Budgets | None = None, wall: Callable[[], float],
                 free_slots: Callable[[], int] = lambda: 0, paused: Callable[[], bool] = lambda: False,
                 robots: RobotsCache | None = None, clock: Callable[[], float] | None = None,
                 on_dropped: Callable[[str, str], None] | None = None,
                 shard: int = 0, shards: int = 1, outbox=None):
        """``outbox``: the hand-off outbox (``crawlerd.handoff``) when ``shards`` > 1."""
        if shards > 1 and outbox is None:
            raise ValueError("a shard of several needs a hand-off outbox")
        self.cfg = cfg
        self.shard = shard
        self.shards = shards
        self.outbox = outbox
        self.frontier = frontier
        self.seen = seen
        self.url_filter = url_filter
        self.recrawl = recrawl
        self.metrics = metrics
        self.wake = wake
        self.budgets = budgets
        if budgets is not None and shards > 1:
            budgets.graph.export = self._hand_vouch      # STAR: a vouch counts where its target lives
        self.wall = wall
        self.free_slots = free_slots        # transfers the lease window has room for now, for BEAST's reader
        self.paused = paused
        # the DUST gate's intake hook (crawlerd.shard.dust), set by the shard: new URLs -> those to queue
        self.admission: Callable[[list[tuple]], list[tuple]] | None = None
        self.robots = robots
        self.clock = clock
        self.on_dropped = on_dropped
        # durable(then): run ``then`` once the frontier's commits are on disk (None: they already are)
        self.durable: Callable[[Callable[[], None]], None] | None = None
        self._last_flush = 0.0
        self._last_readmit = 0.0
        self._readmitting = False       # a readmission's next slice is scheduled
        self._last_recrawl = 0.0
        # the bound on the frontier's and recrawl's writes not landed (``bound_writes``)
        self.frontier_gate = UnlandedGate(0, self._commit_fetch_stores)
        self._added_url_bytes = ADDED_URL_BYTES
        self._pages_linked = 0          # pages whose links were submitted, and those links
        self._page_links = 0

    # -- into the seen-set ----------------------------------------------------------
    def submit_urls(self, urls: list[str], *, depth: int, hops: int = 0, priority: int | None = None,
                    base: str | None = None) -> int:
        """Normalise, filter and send URLs to the seen-set; returns how many were submitted."""
        links = []
        for raw in urls:
            norm = normalize(raw, base)
            if norm is None:
                self.metrics.dropped["bad_url"] += 1
            else:
                links.append(Link(norm, fingerprint(norm), ""))
        return self.submit_links(links, depth=depth, hops=hops, priority=priority)

    def submit_links(self, links: list[Link], *, depth: int, hops: int = 0, priority: int | None = None,
                     page: bool = False) -> int:
        """Filter already normalised, fingerprinted links (from a worker) and send them to the seen-set;
        ``page``: they are a fetched page's (counted for ``page_links``)."""
        if page:
            self._pages_linked += 1
            self._page_links += len(links)
        if priority is None:
            priority = self.priority_for_depth(depth)
        if self.shards > 1:
            links = self._route(links, depth, hops, priority)
        reasons: list[str] = []
        f = self.url_filter
        # one native pass: the filter's quick test, each record ``head + url`` (encode_aux's), the keys
        keys, aux, lens = _links(links, f"{depth} {hops} {priority} ".encode(), f.max_url_length, f.quick_slashes,
                           f.check, reasons)
        if reasons:
            dropped = self.metrics.dropped
            for reason in reasons:
                dropped[reason] += 1
        if aux:
            self.seen.submit(keys, aux, lens)
        return len(aux)

    def page_links(self) -> int:
        """Links a page with links gave so far, on average (rounded up; 0 before the first): what a
        lease in flight is expected to submit (the seen-set's ``reserve``)."""
        n = self._pages_linked
        return -(-self._page_links // n) if n else 0

    def _route(self, links: list[Link], depth: int, hops: int, priority: int) -> list[Link]:
        """Stage the links other shards own in the outbox; return this shard's own."""
        mine, away = [], {}
        me, n = self.shard, self.shards
        for ln in links:
            owner = shard_of(host_of(ln.url), n)
            if owner == me:
                mine.append(ln)
            else:
                away.setdefault(owner, []).append((ln.fp, encode_aux(depth, hops, priority, ln.url)))
        for dest, records in away.items():
            self.outbox.stage(dest, records)
            self.metrics.counters["handoff_staged"] += len(records)
        return mine

    def _hand_vouch(self, src: bytes, dst: bytes) -> bool:
        """A vouch of this shard's domain ``src`` for ``dst``: handed to ``dst``'s owner when that is
        another shard (True). A hashed domain key (an unusable name) stays here."""
        if dst[:1] == b"#":
            return False
        owner = shard_of(domain_name(dst), self.shards)
        if owner == self.shard:
            return False
        self.outbox.stage(owner, [(0, VOUCH_TAG + src + b"\0" + dst)])
        self.metrics.counters["handoff_vouches"] += 1
        return True

    def links_barrier(self):
        """None when every link submitted so far is kept (in DRUM's intake log; those for other
        shards in the outbox), else an awaitable done once they are."""
        logged = self.seen.logged()
        staged = self.outbox.barrier() if self.outbox is not None else None
        if logged is None or staged is None:
            return staged if logged is None else logged
        return asyncio.gather(logged, staged)

    def take_handoff(self, batches: list[Batch], ack: Callable[[Batch], None]) -> int:
        """Batches other shards handed to this one: filtered and sent to the seen-set like any
        link; each is acknowledged once DRUM's intake log holds it. Returns records taken."""
        n = 0
        for batch in batches:
            groups: dict[tuple[int, int, int], list[Link]] = {}
            vouches: list[tuple[bytes, bytes]] = []
            for fp, aux in batch.records:
                if aux[:2] == VOUCH_TAG:        # a STAR vouch for a domain of this shard
                    src, _, dst = aux[2:].partition(b"\0")
                    vouches.append((src, dst))
                    continue
                depth, hops, priority, url = decode_aux(aux)
                groups.setdefault((depth, hops, priority), []).append(Link(url, fp, ""))
            for (depth, hops, priority), links in groups.items():
                self.submit_links(links, depth=depth, hops=hops, priority=priority)
            done = functools.partial(ack, batch)
            if vouches and self.budgets is not None:
                self.budgets.record_vouches(vouches)
                done = functools.partial(self.budgets.when_edges_logged, done)  # and the edge DRUM's log
            # once the seen-set's intake log holds the records (a crash before: delivered again)
            self.seen.when_logged(done)
            n += len(batch.records)
        self.metrics.counters["handoff_received"] += n
        return n

    def priority_for_depth(self, depth: int) -> int:
        """Seeds at level 0; then one level lower every three link hops, down to the last level."""
        levels = self.cfg.frontier.priority_levels
        return 0 if depth == 0 else min(levels - 1, 1 + (depth - 1) // 3)

    def pace_seen_flush(self, now: float) -> None:
        """DRUM flush trigger 3: new URLs wait in DRUM's buckets until a merge.

        A politeness-bound crawl starves hosts whose next URLs are still there, so merge early,
        but keep merging under ~10% of the time (a merge rewrites the whole key file: seconds
        at 10^9 keys)."""
        seen = self.seen
        if seen.pending and not seen.flushing:
            dry = self.frontier.queued() < 2 * self.cfg.fetch.max_in_flight
            interval = max(0.5 if dry else 2.0, 10 * seen.last_flush_s)
            if now - self._last_flush >= interval:
                seen.request_flush()       # merged on the DRUM thread; answers arrive via on_seen_results
                self._last_flush = now

    # -- out of the seen-set ----------------------------------------------------------
    def on_seen_results(self, results: list) -> None:
        """One delivery of DRUM answers (run on the loop by the seen-set's pump): into the frontier, then ack.

        DRUM delivers at least once: answers not yet acknowledged come back after a crash.
        The budget state commits, then (once that commit is written: on the writer thread during
        a crawl) ``frontier.add`` commits the delivery's new URLs with the
        position after its answers (``seen_mark``), then ``ack`` runs (with ``durable`` set, once
        both commits are synced to disk on the sync thread): a unique URL is never lost between
        the seen-set and the frontier, and an answer delivered again is not added (and fetched) a
        second time.
        A delivery (up to a DRUM call of 8,192 answers) is judged ``SEEN_SLICE`` answers per loop
        iteration (robots, DUST, BEAST), so no iteration holds the loop for all of it, and
        committed every ``COMMIT_ANSWERS`` answers judged, after a slice that left the budget
        writes able to fill the budget store's reserved page buffers (``Budgets.full``), and after
        its last slice, and after a slice when one more could take the frontier's writes not landed
        past half of ``frontier.unlanded_bytes`` (``_frontier_full``), each commit in a loop iteration of its own: one budget and one frontier
        commit per delivery when its writes fit, rather than per slice, as each commit writes every
        page its puts touched. After its
        last commit is handed over the delivery is released (the next one is judged while that
        commit lands and syncs) and acknowledged up to its end once the commit is on disk. A slice waits for a commit to land while the budget writes not landed
        are at ``budgets.unlanded_bytes`` (``Budgets.crowded``), or the frontier's and recrawl's at
        ``frontier.unlanded_bytes`` (``frontier_gate``; what the delivery admitted so far is
        committed first). At most one delivery is outstanding, so slices never interleave. A crash
        before a commit redelivers the answers after the last committed mark; a budget commit
        another caller makes meanwhile (readmission, edge answers) can only make such a URL be
        charged or kept twice.
        """
        self._admit_slice(results, 0, [])

    # -- the bound on writes not landed ---------------------------------------------------------
    def bound_writes(self, cap_bytes: int) -> None:
        """Bound the frontier's and recrawl's writes not landed by ``cap_bytes`` (0: none), once
        both write on the writer thread: leasing (the shard), the intake's slices and the recrawl feed
        wait at half of it (``frontier_gate``)."""
        gate = self.frontier_gate
        gate.cap_bytes = cap_bytes
        for ov in (self.frontier.overlay, self.recrawl.overlay):
            if ov is not None:
                gate.attach(ov)

    def _commit_fetch_stores(self) -> None:
        """Hand the frontier's and recrawl's open layers over (the gate's wait needs a landing)."""
        self.frontier.commit(flush=False)
        self.recrawl.commit(flush=False)

    def _crowded(self):
        """The bound a slice's writes must wait on (its ``when_room``), or None: the budget store's,
        then the frontier's and recrawl's."""
        for gate in (self.budgets, self.frontier_gate):
            if gate is not None and gate.crowded():
                return gate
        return None

    def _frontier_full(self, admitted: int) -> bool:
        """The URLs ``admitted`` and not added yet and those of one more slice would take the
        frontier's writes not landed past half their bound (at what the last delivery's URLs cost
        each): the intake commits them now, so one commit adds less than half the bound."""
        g = self.frontier_gate
        return g.active and 2 * (g.held_bytes() + (admitted + SEEN_SLICE) * self._added_url_bytes) > g.cap_bytes

    def _admit_slice(self, results: list, start: int, added: list[QueuedURL], judged: int = 0) -> None:
        gate = self._crowded()
        if gate is not None:
            # the writes not landed are at their bound: what this delivery admitted so far is
            # committed (the frontier gets it), the next slice waits for a landing
            if added:
                self._commit(results, start, added, False)
                added, judged = [], 0
            gate.when_room(functools.partial(self._admit_slice, results, start, added, judged))
            return
        end = start + SEEN_SLICE
        self._admit(answer_runs(results, start, end), added)
        judged += min(end, len(results)) - start
        loop = asyncio.get_running_loop()
        if end >= len(results):
            if start:
                loop.call_soon(self._commit, results, len(results), added, True)    # an iteration of its own
            else:
                self._commit(results, len(results), added, True)
        elif judged >= COMMIT_ANSWERS or (self.budgets is not None and self.budgets.full) \
                or self._frontier_full(len(added)):
            # a whole delivery, or as many budget writes as its store reserved page buffers for
            loop.call_soon(self._commit, results, end, added, False)
            loop.call_soon(self._admit_slice, results, end, [], 0)
        else:
            loop.call_soon(self._admit_slice, results, end, added, judged)

    def _commit(self, results: list, end: int, added: list[QueuedURL], last: bool) -> None:
        """Commit what the answers before ``end`` admitted: the budgets, then (in a loop iteration
        of its own, once the budget commit is written) the frontier; after the delivery's
        ``last`` commit, ack."""
        if self.budgets is not None:
            # deferrals durable before the mark passes their answers: the frontier commits once the
            # budget commit is written (on the writer thread during a crawl; else the next iteration)
            self.budgets.commit(functools.partial(self._commit_frontier, results, end, added, last))
            return
        self._commit_frontier(results, end, added, last)

    def _commit_frontier(self, results: list, end: int, added: list[QueuedURL], last: bool) -> None:
        if end:
            # committed with the position after these answers; new hosts show up in hosts_needing_dns()
            ov = self.frontier.overlay
            b0 = ov.added_bytes if ov is not None else 0
            self.frontier.add(added, seen_mark=results[end - 1].seq + 1)
            if ov is not None and len(added) >= 100:    # what an added URL costs the overlay (``_frontier_full``)
                self._added_url_bytes = max(ADDED_URL_BYTES, (ov.added_bytes - b0) // len(added))
        if added:
            self.wake()
        if not last:
            return
        # the next delivery is judged while this one's commits land and sync; its answers are
        # acknowledged, up to its end, once they are on disk
        self.seen.release()
        ack = functools.partial(self.seen.ack, results[len(results) - 1].seq + 1) if len(results) else self.seen.ack
        if self.durable is not None:
            self.durable(ack)                   # acknowledged once the commits are on disk
            return
        ack()

    def _admit(self, runs: list[tuple], added: list[QueuedURL]) -> None:
        """Judge one slice of answers (``answer_runs``): the unique ones that pass robots, DUST and
        BEAST go to ``added``; nothing is committed here.

        One native pass over the answers' arrays (``_native/intake.pyx``: no answer object, a record
        head parsed once per run of equal heads, ``host_key`` once per run of one host's URLs), then
        the survivors as columns: a page's links share a few hosts, so a run of one host's URLs
        shares its host key (one string, hashed once downstream), its robots rules (looked up once
        per run) and its BEAST record."""
        fresh, hosts, dup, again = _answers(runs, self.frontier.seen_mark, host_key)
        if self.robots is not None and fresh:
            fresh = self._robots_pass(fresh, hosts)
        if self.admission is not None and fresh:
            fresh = self.admission(fresh)       # DUST: skipped URLs end here, suspects deferred
        counters = self.metrics.counters
        counters["seen_duplicate"] += dup
        if again:
            counters["seen_redelivered"] += again
        if not fresh:
            return
        budgets = self.budgets
        if budgets is None:
            for key, _aux, depth, hops, priority, url, hk in fresh:
                added.append(QueuedURL(url, hk, priority, depth, hops, key))
            return
        keys, auxs, depths, _hops, _prios, _urls, hks = zip(*fresh, strict=True)
        if 0 in depths:
            passed = self._offer_each(fresh)    # seeds among them (a trust root changes budgets)
        else:
            passed = budgets.offer_many(auxs, keys, hks)    # BEAST: those it keeps wait for a later queue
        for (key, _aux, depth, hops, priority, url, hk), ok in zip(fresh, passed, strict=True):
            if ok:
                added.append(QueuedURL(url, hk, priority, depth, hops, key))
        deferred = passed.count(False)
        if deferred:
            counters["budget_deferred"] += deferred

    def _robots_pass(self, fresh: list[tuple], hosts: list[tuple[int, str]]) -> list[tuple]:
        """``fresh`` without the URLs their host's current robots.txt rules disallow (each counted
        and reported, ``denied``); a host whose rules disallow nothing costs one lookup, one with
        rules one match call for its run of URLs (``RobotsRules.disallowed``)."""
        robots, now = self.robots, (self.clock() if self.clock is not None else 0.0)
        keep = None                 # the URLs kept so far, once one host's rules denied one
        for i, (at, hk) in enumerate(hosts):
            stop = hosts[i + 1][0] if i + 1 < len(hosts) else len(fresh)
            entry = robots.get(hk, now)
            rules = entry.rules if entry is not None and entry.ok else None
            if rules is None or not rules.rule_count:
                if keep is not None:
                    keep += fresh[at:stop]
                continue
            n = len(hk)
            run = fresh[at:stop]
            # the path and query: rules need no parse of the URL
            denied = rules.disallowed([p if (p := item[5][n:])[:1] == "/" and p[1:2] != "/" else item[5]
                                       for item in run])
            if not denied:
                if keep is not None:
                    keep += run
                continue
            if keep is None:
                keep = fresh[:at]
            last = 0
            for j in denied:
                keep += run[last:j]
                self.denied(run[j][5])      # robots.txt decides at admission
                last = j + 1
            keep += run[last:]
        return fresh if keep is None else keep

    def _offer_each(self, fresh: list[tuple]) -> list[bool]:
        """BEAST's verdict per URL, in order, seeds (depth 0) made trust roots of STAR, never charged."""
        budgets, out = self.budgets, []
        for key, aux, depth, _hops, _priority, url, hk in fresh:
            if depth == 0:
                budgets.add_root(url)
                out.append(True)
            else:
                out.append(budgets.offer(url, aux, key, hk))
        return out

    def denied(self, url: str) -> None:
        """A unique URL its host's robots.txt disallows: dropped at admission, counted, one event."""
        self.metrics.dropped[_ROBOTS_DENIED] += 1
        if self.on_dropped is not None:
            self.on_dropped(url, _ROBOTS_DENIED)

    # -- past the seen-set ----------------------------------------------------------------
    def step_budgets(self, now: float) -> None:
        """Edge merges on their schedule (STAR); BEAST readmission, the reader moving on at once when
        the frontier runs short of ready hosts (work-conserving).

        A readmission of up to ``budgets.readmit_batch`` records runs ``READMIT_SLICE`` records per
        loop iteration (``_readmit_slice``); the next one starts once the last slice is done."""
        b = self.budgets
        if b is None:
            return
        b.step(now)
        if self._readmitting or now - self._last_readmit < 0.1:
            return
        short = self.frontier_short(now)
        if not short and now - self._last_readmit < 1.0:
            return
        self._last_readmit = now
        self._readmit_slice(self.cfg.budgets.readmit_batch, short)

    def _readmit_slice(self, left: int, advance: bool) -> None:
        """One slice of a readmission: take up to ``READMIT_SLICE`` of the ``left`` records BEAST
        lets pass, queue them (the frontier commits), then commit the budgets, all in this callback:
        a budget commit another caller makes (a delivery, edge answers) never holds a pass whose
        URLs the frontier has not committed, so a crash readmits a slice twice, never loses one
        (on the writer thread too: it writes the frontier's layers first in each group).
        The rest follows in the next loop iteration, or at a landing while the budget writes not
        landed are at their bound (``Budgets.crowded``, ``frontier_gate``)."""
        b = self.budgets
        gate = self._crowded()
        if gate is not None:    # the writes not landed are at their bound: after a landing
            self._readmitting = True
            gate.when_room(functools.partial(self._readmit_slice, left, advance))
            return
        recs = b.readmit(min(left, READMIT_SLICE), advance=advance)
        if recs:
            items = []
            hk, prefix = "", "\0"   # a pass hands out a domain's URLs together: hosts repeat
            for rec in recs:
                depth, hops, priority, url = decode_aux(rec)
                if not url.startswith(prefix):
                    hk = host_key(url)
                    prefix = hk + "/"
                items.append(QueuedURL(url, hk, priority, depth, hops, fingerprint(url)))
            self.frontier.add(items)
            b.commit()     # after the frontier: a crash in between readmits twice, never loses
            self.metrics.counters["budget_readmitted"] += len(items)
            self.wake()
        left -= len(recs)
        self._readmitting = left > 0 and len(recs) == READMIT_SLICE
        if self._readmitting:
            asyncio.get_running_loop().call_soon(self._readmit_slice, left, advance)

    def frontier_short(self, now: float) -> bool:
        """Fewer ready hosts than free fetch slots (or than budgets.min_ready_hosts), or free slots and
        no host due soon: the fetcher would idle, so BEAST's reader moves on (work-conserving)."""
        if self.paused() or self.seen.backpressure:
            return False
        free = self.free_slots()
        if free <= 0:
            return False
        if self.frontier.hosts_ready() < (self.cfg.budgets.min_ready_hosts or free):
            return True
        nd = self.frontier.next_due()
        return nd is None or nd > now + 0.5

    def feed_recrawl(self, now: float) -> None:
        """Due revisits go straight to the frontier (they passed the seen-set long ago); once a second."""
        if now - self._last_recrawl < 1.0:
            return
        self._last_recrawl = now
        if self.frontier_gate.crowded():     # the writes not landed are at their bound: next second
            return
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
