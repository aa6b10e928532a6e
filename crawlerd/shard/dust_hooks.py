"""The crawl shard's side of the DUST learner (``crawlerd.frontier.dust``): three hooks.

* **intake** (``_dust_admit``): URLs the seen-set found new are asked about before the frontier
  gets them: skipped ones end here (counted ``dust_skipped``, an event naming the rule, the
  record kept in the learner's skip log), suspects go to the frontier's deferred level,
  probes to the top level.
* **lease** (``_dust_lease_skip``): a URL queued before its host's rule was trusted is skipped
  when leased, the same way, instead of being fetched.
* **answer** (``_dust_observe``): every archived 200 answer is evidence; a declared
  ``rel=canonical`` is sent to the seen-set (once, at the page's own priority); a rule retired
  by a contradiction gives back its logged skips, which go straight to the frontier (they are
  in the seen-set already), and the host's deferred URLs that are no longer suspects move up.

:class:`DustHooks` is a mixin of :class:`crawlerd.shard.Shard` (its frontier, metrics, events,
URL filter); ``self.dust`` is None when ``dust.enabled`` is false.
"""

from __future__ import annotations

import logging

from crawlerd import url as urlmod
from crawlerd.frontier import QueuedURL
from crawlerd.frontier.dust import DEFER, NORMAL, PROBE, SKIP, Decision, DustLearner
from crawlerd.frontier.items import PRIORITY_DEFERRED
from crawlerd.outcome import Outcome

log = logging.getLogger("crawlerd.shard")

DUST_EVENT_SCHEMA = 1


def _aux_codec():
    """The seen-set record codec (``encode_aux``, ``decode_aux``) of crawlerd.shard, which imports this module."""
    from crawlerd.shard import decode_aux, encode_aux
    return encode_aux, decode_aux


def open_dust(cfg) -> DustLearner | None:
    d = cfg.dust
    if not d.enabled:
        return None
    return DustLearner(cfg.path("dust"), confirmations=d.confirmations, sample_share=d.sample_share,
                       probe_share=d.probe_share, defer=d.defer_suspects, window=d.evidence_per_host,
                       max_bytes=d.max_bytes, max_host_bytes=d.max_host_bytes, class_entries=d.class_entries,
                       cache_hosts=d.cache_hosts, near_bits=cfg.dedup.simhash_distance)


class DustHooks:
    """Mixin: the shard's DUST hooks. Needs ``dust``, ``frontier``, ``metrics``, ``events``,
    ``url_filter``, ``wall``, ``cfg``, ``seen`` and ``_priority_for_depth`` of the shard."""

    dust: DustLearner | None
    _final_dust_stats: dict | None

    def _dust_admit(self, fresh: list[tuple]) -> list[tuple]:
        """(fp, aux, depth, hops, priority, url) of new URLs -> those to queue, priorities set."""
        host_key = urlmod.host_key
        asks = [(it[5], it[0], host_key(it[5]), it[2], it[3]) for it in fresh]
        decisions = self.dust.admit_batch(asks)
        out = []
        counters = self.metrics.counters
        for item, ask, d in zip(fresh, asks, decisions, strict=True):
            action = d.action
            if action == NORMAL:
                out.append(item)
            elif action == DEFER:
                out.append(item[:4] + (PRIORITY_DEFERRED, item[5]))
                counters["dust_deferred"] += 1
            elif action == SKIP:
                self._dust_skipped(item[5], ask[2], d, item[1])
            elif action == PROBE:
                out.append(item[:4] + (0, item[5]))
                counters["dust_probes"] += 1
            else:
                out.append(item)
                counters["dust_samples"] += 1
        return out

    def _dust_skipped(self, url: str, host_key: str, d: Decision, aux: bytes) -> None:
        self.metrics.counters["dust_skipped"] += 1
        self.dust.skipped(host_key, d, aux)
        if self.events is not None:
            self.events.write({"schema": DUST_EVENT_SCHEMA, "kind": "dust_skipped", "url": url,
                               "outcome": Outcome.DUST_SKIPPED.value, "rule": d.rule, "canonical": d.canonical,
                               "fetched_at": self.wall(), "status": 0})

    def _dust_lease_skip(self, lease, url: str, fp: int, host_key: str) -> bool:
        """True when the lease was completed as a DUST skip (nothing to fetch)."""
        d = self.dust.check_lease(url, fp, host_key)
        if d is None:
            return False
        item = lease.item
        self.frontier.complete(lease.lease_id, outcome=Outcome.DUST_SKIPPED)
        self.metrics.outcomes[Outcome.DUST_SKIPPED.value] += 1
        depth = item.depth if item else 0
        self._dust_skipped(url, host_key, d, _aux_codec()[0](depth, item.hops if item else 0,
                                                             self._priority_for_depth(depth), url))
        return True

    def _dust_observe(self, url: str, fp: int, host_key: str, sha1: bytes, pr, depth: int) -> None:
        ch = self.dust.observe(url, fp, host_key, sha1, pr.simhash, pr.canonical)
        counters = self.metrics.counters
        for rule in ch.trusted:
            counters["dust_rules_trusted"] += 1
            self._dust_rule_event(host_key, rule, "trusted")
        for rule in ch.retired:
            counters["dust_rules_retired"] += 1
            self._dust_rule_event(host_key, rule, "retired")
        if ch.requeue:
            decode_aux = _aux_codec()[1]
            items = []
            for aux in ch.requeue:
                d_, hops, priority, u = decode_aux(aux)
                items.append(QueuedURL(url=u, host_key=urlmod.host_key(u), priority=priority, depth=d_, hops=hops,
                                       fp=urlmod.fingerprint(u)))
            self.frontier.add(items)
            counters["dust_requeued"] += len(items)
        if ch.promote and self.frontier.deferred_level is not None:
            dust, prio = self.dust, self._priority_for_depth
            moved = self.frontier.promote_deferred(
                host_key, lambda it: None if dust.still_suspect(it.url, host_key) else prio(it.depth))
            counters["dust_promoted"] += moved
        if self.dust.wants_probe(host_key) and self.frontier.deferred_level is not None:
            dust = self.dust        # learning: one deferred suspect of the host goes first, as a probe
            counters["dust_probes"] += self.frontier.promote_deferred(
                host_key, lambda it: 0 if dust.take_probe(it.url, it.fp, host_key) else None, limit=1, max_scan=64)
        canonical = pr.canonical
        if canonical and canonical != url and depth < self.cfg.crawl.max_depth and \
                self.url_filter.check(canonical) is None:
            cfp = urlmod.fingerprint(canonical)
            self.dust.feed(cfp)
            self.seen.submit([cfp], [self._dust_aux(depth, canonical)])
            counters["dust_canonical_fed"] += 1

    def _dust_aux(self, depth: int, url: str) -> bytes:
        return _aux_codec()[0](depth, 0, self._priority_for_depth(depth), url)

    def _dust_rule_event(self, host_key: str, rule: str, state: str) -> None:
        log.info("dust rule %s host=%s rule=%s", state, host_key, rule)
        if self.events is not None:
            self.events.write({"schema": DUST_EVENT_SCHEMA, "kind": "dust_rule", "url": host_key, "rule": rule,
                               "outcome": f"dust_{state}", "fetched_at": self.wall(), "status": 0})

    def dust_stats(self) -> dict:
        """Rules and counters for ``crawlerd stats`` (the last ones once the learner is closed)."""
        if self.dust is None:
            return {"enabled": False}
        if self._final_dust_stats is not None:
            return self._final_dust_stats
        return {"enabled": True, **self.dust.stats()}
