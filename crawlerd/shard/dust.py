"""The shard's DUST gate: the learner (``crawlerd.frontier.dust``) at its three touch points.

* **intake** (``admit``, the intake's ``admission`` hook): URLs the seen-set found new are asked
  about before the frontier gets them. A skipped one ends here (counted ``dust_skipped``, an
  event naming its rule, its record kept in the learner's skip log); a suspect goes to the
  frontier's deferred level; a probe to the top level.
* **lease** (``lease_skip``, the lease runner's ``lease_gate``): a URL queued before its host's
  rule was trusted is skipped when leased, the same way, instead of being fetched.
* **answer** (``observe``, the answers' ``evidence`` hook): every archived 200 answer is
  evidence. A declared ``rel=canonical`` goes to the intake at the page's own depth (the
  seen-set queues it once; if the page naming it is one of its variants it is a suspect there,
  as that content was just archived). A rule retired by a contradiction gives back its logged skips, which
  go straight to the frontier (they are in the seen-set already), and the host's deferred URLs
  that are suspects no more move up; a host still learning has one deferred URL fetched next,
  as a probe.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from crawlerd.config import Config
from crawlerd.frontier import Frontier, Lease, QueuedURL
from crawlerd.frontier.dust import DEFER, NORMAL, PROBE, SKIP, Decision, DustLearner
from crawlerd.frontier.items import PRIORITY_DEFERRED
from crawlerd.metrics import Metrics
from crawlerd.outcome import Outcome
from crawlerd.records import Link
from crawlerd.shard.events import FetchEvents
from crawlerd.shard.intake import Intake, decode_aux, encode_aux
from crawlerd.url.canonical import fingerprint
from crawlerd.url.hosts import host_key as host_key_of

log = logging.getLogger("crawlerd.shard")

PROBE_SCAN = 64             # deferred URLs looked at for one probe
WRITE_SLICE = 128           # changed host states written per loop iteration by ``commit_sliced``
MORE_PASSES = 4             # passes of ``commit_sliced`` over the hosts changed during its round
_AS_IS = Decision(NORMAL)   # a URL to queue as it came


def open_learner(cfg: Config, directory: str | None = None) -> DustLearner | None:
    """The DUST learner on ``directory`` (the shard's own ``dust/``; default: under the data dir)."""
    d = cfg.dust
    if not d.enabled:
        return None
    return DustLearner(directory or cfg.path("dust"), confirmations=d.confirmations, sample_share=d.sample_share,
                       probe_share=d.probe_share, defer=d.defer_suspects, window=d.evidence_per_host,
                       max_bytes=d.max_bytes, max_host_bytes=d.max_host_bytes, class_entries=d.class_entries,
                       cache_hosts=d.cache_hosts, cache_bytes=d.cache_bytes, near_bits=cfg.dedup.simhash_distance,
                       prior_hosts=d.prior_hosts, prior_counter_hosts=d.prior_counter_hosts,
                       prior_sample_share=d.prior_sample_share, sample_halving=d.sample_halving,
                       min_sample_share=d.min_sample_share, initial_probes=d.initial_probes,
                       admission_probes=not cfg.budgets.enabled,
                       write_buffer_bytes=cfg.storage.lmdb_write_buffer_bytes,
                       archived_filter_bytes=d.archived_filter_bytes, unlanded_bytes=d.unlanded_bytes,
                       read_cache_bytes=d.read_cache_bytes)


class DustGate:
    """Intake, lease and answer hooks over one learner. Holds no URL state of its own."""

    def __init__(self, cfg: Config, learner: DustLearner, *, frontier: Frontier, intake: Intake,
                 events: FetchEvents, metrics: Metrics):
        self.cfg = cfg
        self.learner = learner
        self.frontier = frontier
        self.intake = intake
        self.events = events
        self.metrics = metrics
        self.final: dict | None = None          # stats at close
        self._committing: object | None = None  # the sliced commit under way (its token)

    # -- intake ------------------------------------------------------------------------------
    def admit(self, fresh: list[tuple]) -> list[tuple]:
        """(fp, aux, depth, hops, priority, url, host key) of URLs the seen-set found new -> those to queue."""
        fps, _aux, depths, hops, _priority, urls, hosts = zip(*fresh, strict=True)
        decisions = self.learner.admit_batch(urls, fps, depths, hops, hosts)
        if decisions.count(_AS_IS) == len(decisions):
            return fresh                            # nearly always: nothing to skip, defer or probe
        out = []
        counters = self.metrics.counters
        for item, d in zip(fresh, decisions, strict=True):
            action = d.action
            if action is NORMAL:
                out.append(item)
            elif action == DEFER:
                # the record says so too: a URL that BEAST holds back is readmitted deferred
                url = item[5]
                out.append((item[0], encode_aux(item[2], item[3], PRIORITY_DEFERRED, url), item[2], item[3],
                            PRIORITY_DEFERRED, url, item[6]))
                counters["dust_deferred"] += 1
            elif action == SKIP:
                self._skipped(item[5], item[6], d, item[1])
            elif action == PROBE:
                out.append(item[:4] + (0, item[5], item[6]))
                counters["dust_probes"] += 1
                self.events.record("dust_probe", item[5], "dust_probe")
            else:                                   # a sample: fetched to re-validate its rule
                out.append(item)
                counters["dust_samples"] += 1
                self.events.record("dust_sample", item[5], "dust_sample", rule=d.rule, canonical=d.canonical)
        return out

    def _skipped(self, url: str, host_key: str, d: Decision, aux: bytes) -> None:
        self.metrics.counters["dust_skipped"] += 1
        self.learner.skipped(host_key, d, aux)
        self.events.record("dust_skipped", url, Outcome.DUST_SKIPPED.value, rule=d.rule, canonical=d.canonical)

    # -- lease -------------------------------------------------------------------------------
    def lease_skip(self, lease: Lease, url: str, fp: int, host_key: str) -> bool:
        """True when the lease was completed as a DUST skip (nothing to fetch)."""
        item = lease.item
        suspect = item is not None and item.priority == self.frontier.deferred_level
        d = self.learner.check_lease(url, fp, host_key, suspect)
        if d is None:
            if suspect:                 # a suspect fetched after all: its host had nothing else
                self.events.record("dust_suspect_fetched", url, "dust_suspect_fetched")
            return False
        depth, hops = (item.depth, item.hops) if item is not None else (0, 0)
        self.frontier.complete(lease.lease_id, outcome=Outcome.DUST_SKIPPED)
        self.metrics.outcomes[Outcome.DUST_SKIPPED.value] += 1
        self._skipped(url, host_key, d, encode_aux(depth, hops, self.intake.priority_for_depth(depth), url))
        return True

    # -- answer --------------------------------------------------------------------------------
    def observe(self, url: str, fp: int, host_key: str, sha1: bytes, pr, depth: int) -> None:
        """An archived 200 answer (its payload SHA-1 and processing result ``pr``)."""
        learner, counters = self.learner, self.metrics.counters
        ch = learner.observe(url, fp, host_key, sha1, pr.simhash, pr.canonical)
        for rule in ch.trusted:
            counters["dust_rules_trusted"] += 1
            self._rule_event(host_key, rule, "trusted")
        for rule in ch.retired:
            counters["dust_rules_retired"] += 1
            self._rule_event(host_key, rule, "retired")
        if ch.requeue:
            items = []
            for aux in ch.requeue:
                d, hops, priority, u = decode_aux(aux)
                items.append(QueuedURL(url=u, host_key=host_key_of(u), priority=priority, depth=d, hops=hops,
                                       fp=fingerprint(u)))
            self.frontier.add(items)        # committed before the learner's log forgets them
            counters["dust_requeued"] += len(items)
        if ch.promote:
            prio = self.intake.priority_for_depth
            counters["dust_promoted"] += self.frontier.promote_deferred(
                host_key, lambda it: None if learner.still_suspect(it.url, host_key) else prio(it.depth))
        if learner.wants_probe(host_key):
            counters["dust_probes"] += self.frontier.promote_deferred(
                host_key, lambda it: self._probe(it.url) if learner.take_probe(it.url, it.fp, host_key) else None,
                limit=1, max_scan=PROBE_SCAN)
        canonical = pr.canonical
        if canonical and canonical != url and depth < self.cfg.crawl.max_depth:
            link = Link(canonical, fingerprint(canonical), host_key_of(canonical))
            if self.intake.submit_links([link], depth=depth):
                counters["dust_canonical_fed"] += 1

    def _probe(self, url: str) -> int:
        """A deferred URL taken as a probe: an event (the bench's account), the top level."""
        self.events.record("dust_probe", url, "dust_probe")
        return 0

    def _rule_event(self, host_key: str, rule: str, state: str) -> None:
        log.info("dust rule %s host=%s rule=%s", state, host_key, rule)
        self.events.record("dust_rule", host_key, f"dust_{state}", rule=rule)

    # -- the rest ----------------------------------------------------------------------------------
    def commit(self) -> None:
        """Write every changed host and commit, now (checkpoint, close; past the gate: a sliced
        commit waiting for room is moot)."""
        self._committing = None
        self.learner.commit()

    def close_gate(self) -> None:
        """Closing: a sliced commit waiting for room is dropped (the final ``commit`` writes its
        hosts), none waits again."""
        self._committing = None
        self.learner.store.gate.close()

    def unlanded_memory(self) -> dict[str, int]:
        """The store's writes not landed against ``dust.unlanded_bytes`` (`crawlerd stats`)."""
        return self.learner.store.gate.memory()

    def commit_sliced(self) -> None:
        """``commit`` spread over loop iterations: the changed hosts (about 1,000 in 2 s of a fast
        crawl, ~20-40 ms to encode and write) ``WRITE_SLICE`` per iteration, then the commit in an
        iteration of its own. One at a time; a ``commit`` meanwhile makes the rest moot. While the
        store's writes not landed are at ``dust.unlanded_bytes`` (``DustStore.gate``) the next
        slice waits for a landing (what the slices wrote so far is handed over first, unsynced:
        the round's last commit syncs it all); the hosts not written yet stay changed in the cache.
        Hosts changed during the round are sliced too, in a pass of their own (at most
        ``MORE_PASSES``; a round that waited would otherwise write them all in its last step),
        until no more than a slice is left for the commit."""
        if self._committing is not None:
            return
        token = self._committing = object()
        loop = asyncio.get_running_loop()
        gate = self.learner.store.gate

        def part(hosts: list[str], start: int, passes: int) -> None:
            if self._committing is not token:
                return
            if gate.crowded():
                gate.when_room(functools.partial(part, hosts, start, passes))
                return
            if start < len(hosts):
                self.learner.write_hosts(hosts[start:start + WRITE_SLICE])
                loop.call_soon(part, hosts, start + WRITE_SLICE, passes)
                return
            if passes < MORE_PASSES:
                more = self.learner.dirty_hosts()
                if len(more) > WRITE_SLICE:
                    loop.call_soon(part, more, 0, passes + 1)
                    return
            self._committing = None
            self.learner.commit()       # writes what changed since, then commits
        part(self.learner.dirty_hosts(), 0, 0)

    def attach_writer(self, writer) -> None:
        """The learner's store commits on ``writer`` (a ``WriteThread``) from now on; None: detach
        (every commit handed over must have landed)."""
        self.learner.store.attach_writer(writer)

    def close(self) -> None:
        self._committing = None
        self.final = self.stats()
        self.learner.close()

    def memory(self) -> dict[str, int]:
        """The learner's cached host states against ``dust.cache_bytes`` (`crawlerd stats`)."""
        return self.learner.hosts.memory()

    def stats(self) -> dict:
        """Rules and counters for ``crawlerd stats`` (the last ones once closed)."""
        if self.final is not None:
            return self.final
        return {"enabled": True, **self.learner.stats()}
