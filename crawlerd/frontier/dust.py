"""Do not crawl in the DUST: learn per-host URL rewrite rules from archived pages, apply them at admission.

Bar-Yossef, Keidar and Schonfeld (WWW 2007) and Dasgupta, Kumar and Sasturkar (KDD 2008) show
that most "different URLs, same content" on a site come from a few rewrites (tracking and
session parameters, sort orders, print/mobile views). The shard tells this learner about
every archived page (``observe``) and asks it about every new URL (``admit_batch``):

SKIP     a *trusted* rule of the host rewrites the URL onto a URL already archived (or the
         URL is the rewrite of an archived page): it is not queued. Logged with its rule, so
         that the rule's retirement queues it again.
SAMPLE   would be a skip, but a share ``sample_share`` (chosen by fingerprint) is fetched
         anyway: its evidence re-validates the rule, and one contradiction retires it. The
         share halves after every ``sample_halving`` samples that agreed with the rule (on its
         host, or on any host for a prior's text), down to ``min_sample_share``: a rule proven
         again and again costs fewer fetches.
DEFER    a *suspect*: its skeleton (the URL without the parameters not known to change content,
         also without its first directory token) equals the skeleton of a URL admitted
         before. It is queued in the frontier's deferred level, fetched only when its host has
         nothing else; if a parameter turns out to change content, ``promote`` moves it back.
PROBE    a suspect fetched at once (top level) to gather evidence: probes cost at most a
         share ``probe_share`` of the pages archived (a probe that finds new content is free).
NORMAL   everything else.

Nothing is dropped on suspicion: a URL is either queued (NORMAL, PROBE, SAMPLE, DEFER) or
skipped because a trusted rule maps it onto content already in the archive. Rules, evidence,
the archived set and the skip log persist under ``<data_dir>/dust`` (``dust_store``); the
suspect table (``dust_suspects``) is RAM only (losing it means fetching, never skipping). Rules
and evidence: ``dust_evidence``, cached per host in ``dust_hosts``; their grammar: ``dust_rules``.
"""

from __future__ import annotations

import time
from array import array
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from crawlerd._native.dustkeys import keys as _keys
from crawlerd._native.dustkeys import scan as _scan
from crawlerd._native.dustkeys_ref import keys as _ref_keys
from crawlerd._native.suspects_ref import ref_admit
from crawlerd.frontier.dust_evidence import AGREE, DISAGREE, NEUTRAL, RETIRED, TRUSTED, Evidence
from crawlerd.frontier.dust_hosts import DustHosts, HostInfo
from crawlerd.frontier.dust_priors import PriorTable
from crawlerd.frontier.dust_rules import alt_path, parse, rule_mark, skeleton, unparse
from crawlerd.frontier.dust_store import CANON, SKEL, URL, DustStore
from crawlerd.frontier.dust_suspects import ClassTable
from crawlerd.url.canonical import fingerprint
from crawlerd.url.hosts import host_key as host_key_of

__all__ = ["DustLearner", "Decision", "Changes", "NORMAL", "PROBE", "SAMPLE", "DEFER", "SKIP"]

NORMAL, PROBE, SAMPLE, DEFER, SKIP = "normal", "probe", "sample", "defer", "skip"
_TAG = 0x5851F42D4C957F2D          # marks "skeleton without its first directory token" keys
_MAX_TOKENS = 64.0
_PENDING = 1 << 16                 # probes and samples remembered until their page is archived
_NOTHING: frozenset[str] = frozenset()
_ZERO = (0,)
RULE_JOIN = " + "                   # joins the rules of one decision (no normalised URL has spaces)


class Decision(NamedTuple):
    action: str
    rule: str = ""          # the rule that skipped or sampled it
    canonical: str = ""     # the URL whose content stands for it


_NORMAL = Decision(NORMAL)
_DEFER = Decision(DEFER)
_PROBE = Decision(PROBE)


@dataclass(slots=True)
class Changes:
    """What an observation changed that the frontier must act on."""
    trusted: list[str] = field(default_factory=list)      # rules now trusted
    retired: list[str] = field(default_factory=list)      # rules retired (a counter-example)
    requeue: list[bytes] = field(default_factory=list)    # seen-set records of retired rules' skips
    promote: bool = False                                 # the host's deferred URLs may be suspects no more




class DustLearner:
    """Per-host DUST rules for one shard. Single-threaded (the shard's loop)."""

    def __init__(self, path: str, *, confirmations: int = 3, sample_share: float = 0.02,
                 probe_share: float = 0.005, defer: bool = True, window: int = 24,
                 max_bytes: int = 256 << 20, max_host_bytes: int = 16 << 10, class_entries: int = 1 << 21,
                 cache_hosts: int = 2048, near_bits: int = 3, prior_hosts: int = 3, prior_counter_hosts: int = 2,
                 prior_sample_share: float = 0.03, sample_halving: int = 5, min_sample_share: float = 0.002,
                 initial_probes: int = 24, admission_probes: bool = True, sync: bool = True,
                 clock=time.time, write_buffer_bytes: int = 0, cache_bytes: int = 32 << 20,
                 archived_filter_bytes: int = 4 << 20, unlanded_bytes: int = 0, read_cache_bytes: int = 1 << 20,
                 native: bool = True):
        """``admission_probes``: a suspect may be a probe when it is admitted. False when what is
        admitted may wait elsewhere before the frontier (BEAST budgets): a probe held there
        spends the budget on nothing, so probes are then only taken from the frontier's deferred
        level (``take_probe``). ``native``: observe on ``_native.dustobs`` (False: on its
        plain-Python reference, ``dustobs_ref``, for the tests that compare the two)."""
        self.k = confirmations
        self.admission_probes = admission_probes
        self.sample_share = sample_share
        self.prior_sample_share = prior_sample_share
        self.sample_halving = sample_halving
        self.min_sample_share = min_sample_share
        self.probe_share = probe_share
        self.defer = defer
        self.window = window
        self.near_bits = near_bits
        self.max_host_bytes = max_host_bytes
        self.cache_hosts = cache_hosts
        self.max_probes_per_host = confirmations + 2
        # a new host starts learning while the budget could see it through: k probes to trust a
        # rule on its own, or 2 to vouch for a cross-host prior (a pair with the image, a value)
        self._start_need = 2.0 if prior_hosts > 0 else float(confirmations + 1)
        self._clock = clock
        self.store = DustStore(path, max_bytes=max_bytes, max_host_bytes=max_host_bytes, sync=sync,
                               write_buffer_bytes=write_buffer_bytes, filter_bytes=archived_filter_bytes,
                               unlanded_bytes=unlanded_bytes, read_cache_bytes=read_cache_bytes, native=native)
        self.priors = PriorTable(self.store.meta.get("priors"), min_hosts=prior_hosts,
                                 max_counter_hosts=prior_counter_hosts)
        self.counters: Counter[str] = Counter()
        self._host_probes: Counter[str] = Counter()
        self.hosts = DustHosts(self.store, self.priors, cache_hosts=cache_hosts, max_host_bytes=max_host_bytes,
                               clock=clock, counters=self.counters, on_evict=self._forget_host,
                               cache_bytes=cache_bytes, native=native)
        self._classes = ClassTable(class_entries)
        # fp -> (kind, rule, canonical, its digest u32, its simhash) of probes and samples in flight
        self._pending: OrderedDict[int, tuple[str, str, str, int, int]] = OrderedDict()
        self._learning: OrderedDict[str, None] = OrderedDict()     # hosts with candidate rules
        self.tokens = float(min(initial_probes, _MAX_TOKENS))

    def _forget_host(self, host: str) -> None:
        """The store dropped the host's record (bounds): its probe count goes too."""
        self._host_probes.pop(host, None)

    # -- admission ----------------------------------------------------------------------------
    def admit(self, url: str, fp: int, depth: int = 1, hops: int = 0) -> Decision:
        return self.admit_batch([url], [fp], [depth], [hops])[0]

    def admit_batch(self, urls: Sequence[str], fps: Sequence[int], depths: Sequence[int], hops: Sequence[int],
                    hosts: Sequence[str] | None = None) -> list[Decision]:
        """Decisions for URLs the seen-set found new (normalised URLs, their fingerprints, link
        depths, redirect hops, and their host keys when the caller has them: parallel sequences),
        in order.
        Seeds (depth 0) and redirect targets (hops) are never suspects. A declared canonical comes
        through here like any link: a suspect when the page that named it (a variant of it) was
        admitted, since fetching it would fetch that content again.
        Hot path (every new URL): one native pass (``_native.dustkeys``) computes the suspect keys
        and stops only at a URL the host's rules (or an active prior's mark) must decide, or of a
        shape it leaves to ``dustkeys_ref.keys`` (after the rules, ``dustkeys.keys`` computes the keys of
        one URL); one more (``ClassTable.admit``) finds the
        suspects. The plain-Python pass it replaces: ``admit_batch_reference``."""
        n = len(urls)
        out: list[Decision] = [_NORMAL] * n
        if hosts is None:
            hosts = [url[:url.find("/", 8)] for url in urls]      # their host keys
        info = self.hosts.info
        priors = bool(self.priors.active)
        lookup = bool(info) or priors
        marks = self.hosts.prior_marks() if priors else ()
        defer = self.defer
        keys0, keys1, idx = array("Q", _ZERO) * n, array("Q", _ZERO) * n, array("q", _ZERO) * n
        forced = bytearray(n)
        i = m = 0
        while True:
            i, m = _scan(urls, fps, depths, hops, hosts, i, info, lookup, marks, defer, keys0, keys1, forced, idx, m)
            if i >= n:
                break
            url, host, fp = urls[i], hosts[i], fps[i]
            hi = info.get(host) if lookup else None
            if lookup and (priors or (hi is not None and hi.trusted)):
                d = self._trusted(url, fp, host, hi)
                if d is not None:
                    out[i] = d
                    i += 1
                    continue
            if defer:
                keys0[m], keys1[m] = _keys(url, fp, hi.relevant if hi is not None else _NOTHING)
                forced[m] = depths[i] == 0 or hops[i] > 0
                idx[m] = i
                m += 1
            i += 1
        if m:
            for j in self._classes.admit(keys0, keys1, forced, m, _TAG):
                i = idx[j]
                out[i] = self._probe_or_defer(fps[i], hosts[i], keys0[j], keys1[j])
        return out

    def admit_batch_reference(self, urls: Sequence[str], fps: Sequence[int], depths: Sequence[int],
                              hops: Sequence[int], hosts: Sequence[str] | None = None) -> list[Decision]:
        """``admit_batch`` as plain Python, one URL at a time (the pass before its native kernels):
        the same decisions and the same effects on the learner; the tests compare the two."""
        out: list[Decision] = [_NORMAL] * len(urls)
        info = self.hosts.info
        priors = bool(self.priors.active)
        defer = self.defer
        idx: list[int] = []
        keys0: list[int] = []
        keys1: list[int] = []
        forced_l: list[bool] = []
        for i, url in enumerate(urls):
            fp = fps[i]
            relevant = _NOTHING
            if info or priors:
                host = hosts[i] if hosts is not None else url[:url.find("/", 8)]   # its host key
                hi = info.get(host)
                if hi is not None:
                    relevant = hi.relevant
                if priors or (hi is not None and hi.trusted):
                    d = self._trusted(url, fp, host, hi)
                    if d is not None:
                        out[i] = d
                        continue
            if not defer:
                continue
            k0, k1 = _ref_keys(url, fp, relevant)
            idx.append(i)
            keys0.append(k0)
            keys1.append(k1)
            forced_l.append(depths[i] == 0 or hops[i] > 0)
        for j in ref_admit(self._classes, keys0, keys1, forced_l, len(idx), _TAG):
            i = idx[j]
            url = urls[i]
            host = hosts[i] if hosts is not None else url[:url.find("/", 8)]
            out[i] = self._probe_or_defer(fps[i], host, keys0[j], keys1[j])
        return out

    @staticmethod
    def _skeleton(url: str, relevant: frozenset[str]) -> tuple[str, str, tuple[str, ...]]:
        if "?" in url or ";" in url:
            main, dropped, alt = skeleton(url, relevant)
            return main, alt, dropped
        return url, alt_path(url, relevant), ()

    def _trusted(self, url: str, fp: int, host: str, info: HostInfo | None, sample: bool = True,
                 adopt: bool = True) -> Decision | None:
        """SKIP or SAMPLE when the host's trusted rules (and the active priors, ``_rules``) map
        ``url`` onto archived content. A prior that decides is adopted on the host (``adopt``)."""
        if (info is None or not info.trusted) and not any(m in url for m in self.hosts.prior_marks()):
            return None                 # the hot path: no prior can touch this URL
        rules = self.hosts.rules(info)
        if not rules:
            return None
        q = None
        used = []
        for rule, rid in rules:
            if rule_mark(rule) not in url:  # a substring test before the parse and the rewrite
                continue
            if q is None:
                q = parse(url)
            n = rule.apply(q)
            if n is not None:
                q = n
                used.append((rule, rid))
        epoch = info.epoch if info is not None else -1
        if used and q is not None:
            canonical = unparse(q)
            hit = self.store.archived(fingerprint(canonical))
            if hit is None or not (hit[0] == URL or (hit[0] == CANON and hit[2] == epoch)):
                return None
            new = [rule for rule, rid in used if rid < 0]
            if new and not adopt:
                return _DEFER
            for rule in new:
                info = self.hosts.adopt(host, rule)
                if info is None:
                    return None
            if new:                     # the host's archived variants: their rewrites count as archived
                for e in self.hosts.state(host).evidence:
                    self._record_rewrite(e, info)
            # the skip is logged under every rule that made it: any one's retirement gives it back
            text = RULE_JOIN.join(rule.text for rule, _rid in used)
            by_prior = any(rid < 0 or rid in info.priors for _rule, rid in used)
        else:
            if info is None:
                return None
            hit = self.store.archived(fp)
            if hit is None or hit[0] != CANON or hit[2] != info.epoch or hit[1] not in info.names:
                return None
            canonical, text = url, info.names[hit[1]]
            by_prior = hit[1] in info.priors
            if by_prior and len(info.priors) > 1:
                # the rewrite kept one prior's id of those that made it: logged under each of the
                # host's priors, so that any one's retirement gives the skip back
                text = RULE_JOIN.join(sorted(info.names[rid] for rid in info.priors if rid in info.names))
        share = self.prior_sample_share if by_prior else self.sample_share
        if sample and self.sample_halving:
            own = info.samples if info is not None else {}
            agreed = min(max(own.get(t, 0), self.priors.agreed(t)) for t in text.split(RULE_JOIN))
            if agreed >= self.sample_halving:
                share = max(min(share, self.min_sample_share), share * 0.5 ** (agreed // self.sample_halving))
        if sample and (fp >> 40) < share * (1 << 24):
            self._remember(fp, "sample", text, canonical, hit.digest, hit.simhash)
            self.counters["samples"] += 1
            return Decision(SAMPLE, text, canonical)
        return Decision(SKIP, text, canonical)

    def _probe_or_defer(self, fp: int, host: str, k0: int, k1: int) -> Decision:
        # a host whose candidates wait for confirmations goes first; a new one starts only while
        # the budget could see it through (k probes), so few hosts learn rather than none
        need = 1.0 if host in self._learning else self._start_need
        if self.admission_probes and self.tokens >= need and self._host_probes[host] < self.max_probes_per_host:
            if self.store.archived(k0) is not None or (k1 and self.store.archived(k1) is not None):
                self.tokens -= 1.0
                self._host_probes[host] += 1
                self._remember(fp, "probe")
                self.counters["probes"] += 1
                return _PROBE
        self.counters["deferred"] += 1
        return _DEFER

    def wants_probe(self, host: str) -> bool:
        """A host whose candidate rules wait for confirmations (or, without admission probes, any
        host while the budget could see it through), with probe budget left: the shard then
        offers its deferred URLs to ``take_probe``."""
        if host in self._learning:
            need = 1.0
        elif not self.admission_probes:
            need = self._start_need
        else:
            return False
        return self.tokens >= need and self._host_probes[host] < self.max_probes_per_host

    def take_probe(self, url: str, fp: int, host: str) -> bool:
        """Fetch this deferred URL now as a probe? (Only if what it may duplicate is archived.)"""
        if not self.wants_probe(host):
            return False
        info = self.hosts.info.get(host)
        main, alt, _ = self._skeleton(url, info.relevant if info else _NOTHING)
        if self.store.archived(fingerprint(main)) is None and not (alt and self.store.archived(fingerprint(alt))):
            return False
        self.tokens -= 1.0
        self._host_probes[host] += 1
        self._remember(fp, "probe")
        self.counters["probes"] += 1
        return True

    def _remember(self, fp: int, kind: str, rule: str = "", canonical: str = "", digest: int = 0,
                  simhash: int = 0) -> None:
        """A probe or sample on its way: what its answer will be checked against."""
        self._pending[fp] = (kind, rule, canonical, digest, simhash)
        while len(self._pending) > _PENDING:
            self._pending.popitem(last=False)

    def check_lease(self, url: str, fp: int, host: str, suspect: bool = False) -> Decision | None:
        """At lease time (URLs queued before a rule was trusted): a SKIP decision, or None: fetch.
        A ``suspect`` (leased from the deferred level) is also checked against the host's evidence
        window under the active priors (``_adopt_window``): its variant may have been archived
        before the prior that maps it here was active."""
        info = self.hosts.info.get(host)
        d = self._trusted(url, fp, host, info)
        if d is None and suspect and self.priors.active:
            new = self._adopt_window(host, info)
            if new is not None:
                d = self._trusted(url, fp, host, new)
        return d if d is not None and d.action == SKIP else None

    def _adopt_window(self, host: str, info: HostInfo | None) -> HostInfo | None:
        """The host's archived pages (its evidence window) that an active prior rewrites adopt the
        prior, as ``observe`` would have had the prior been active then, and their rewrites count
        as archived. The host's info after, or None when nothing was adopted."""
        marks = self.hosts.prior_marks()
        st = self.hosts.state(host)
        out = info
        for e in st.evidence:
            if any(m in e.url for m in marks):
                out = self._adopt_seen(e.url, host, out, e.canonical) or out
        if out is None or not out.trusted:
            return None
        for e in st.evidence:           # a prior adopted at admission recorded no rewrites yet
            self._record_rewrite(e, out)
        return out

    def still_suspect(self, url: str, host: str) -> bool:
        """For a deferred URL after its host learned something: stay deferred? (A URL it lets go
        becomes the first of its skeleton, so its own variants stay suspects.)"""
        info = self.hosts.info.get(host)
        if self._trusted(url, fingerprint(url), host, info, sample=False, adopt=False) is not None:
            return True
        main, alt, _ = self._skeleton(url, info.relevant if info else frozenset())
        a, b = fingerprint(main), fingerprint(alt) if alt else 0
        if self._classes.hits((a,), (b,), _TAG)[0]:
            return True
        self._classes.add_many([a] + ([b ^ _TAG] if b else []))
        return False

    def skipped(self, host: str, decision: Decision, record: bytes) -> None:
        """The shard skipped a URL on ``decision``: count it under its rule and log ``record``
        (its seen-set record) so a retirement of the rule queues it again."""
        st = self.hosts.state(host)
        self.counters["skipped"] += 1
        self.store.meta["skipped"] = self.store.meta.get("skipped", 0) + 1
        for text in decision.rule.split(RULE_JOIN):
            rs = st.find(text)
            if rs is None:
                continue
            rs.skips += 1
            rs.logged = self.store.log_skip(host, rs.rule.text, record, rs.logged)
            self.hosts.dirty.add(host)
        self.hosts.skips_by_host[host] += 1

    # -- evidence -----------------------------------------------------------------------------
    def observe(self, url: str, fp: int, host: str, digest: bytes, simhash: int, canonical: str = "") -> Changes:
        """One archived 200 answer: learn from it, record it in the archived set."""
        st = self.hosts.state(host)
        same_host = canonical if canonical and host_key_of(canonical) == host else ""
        ev = st.Evidence(url, int.from_bytes(digest[:8], "big"), simhash, same_host)
        learned = st.learn(ev, k=self.k, near_bits=self.near_bits, window=self.window, now=self._clock())
        ch = Changes()
        self.tokens = min(_MAX_TOKENS, self.tokens + self.probe_share)
        pend = self._pending.pop(fp, None)
        if pend is not None and pend[0] == "probe" and not learned.agreed:
            self.tokens += 1.0            # the probe found new content: it cost nothing
            self._host_probes[host] -= 1
        elif pend is not None and pend[0] == "sample":
            v = self._versus(ev, digest, pend)
            for text in pend[1].split(RULE_JOIN):
                rs = st.find(text)
                if rs is not None and rs.state == TRUSTED and rs not in learned.related:
                    # its stand-in may have left the window: compare with what the archived set kept
                    if v == DISAGREE:
                        st.retire(rs, self._clock())
                        learned.retired.append(rs)
                    if v != NEUTRAL:
                        learned.related.append(rs)
                if rs is not None and rs in learned.related:
                    rs.samples += 1
                    if rs.state != RETIRED:
                        self.priors.sampled(text)
                    info = self.hosts.info.get(host)
                    if info is not None:
                        info.samples[text] = rs.samples
        # a name this host now shows to change content: rules adopted from priors about it go
        # (their skips come back); not counted against the prior, which no pair contradicted
        direct = list(learned.retired)
        if learned.relevant or direct:
            names = set(learned.relevant) | {rs.rule.name for rs in direct}
            for rs in [r for r in st.rules if r.prior and r.rule.name in names]:
                st.retire(rs, self._clock())
                learned.retired.append(rs)
        meta = self.store.meta
        for rs in learned.trusted:
            ch.trusted.append(rs.rule.text)
            meta["learned"] = meta.get("learned", 0) + 1
        for rs in learned.vouched:
            if rs.state != RETIRED and self.priors.supported(rs.rule.text, rs.values):
                self.counters["priors_made"] += 1
        for rs in learned.retired:
            ch.retired.append(rs.rule.text)
            if rs in direct and self.priors.contradicted(rs.rule.text):
                self.counters["priors_dropped"] += 1
            meta["retired"] = meta.get("retired", 0) + 1
            meta["mismatches"] = meta.get("mismatches", 0) + (1 if rs.mismatches else 0)
            ch.requeue += self.store.pop_skips(host, rs.rule.text)
            rs.logged = 0
        if learned.trusted or learned.retired or learned.relevant:
            self.hosts.refresh(host, st)
        if st.rules and any(r.state != TRUSTED for r in st.rules):     # most hosts have none
            self._learning[host] = None
            while len(self._learning) > _PENDING:
                self._learning.popitem(last=False)
        else:
            self._learning.pop(host, None)
        ch.promote = bool(learned.retired or learned.relevant)
        d32 = int.from_bytes(digest[:4], "big")
        self.store.add_archived(fp, URL, digest=d32, simhash=simhash)
        info = self.hosts.info.get(host)
        if self.priors.active and any(m in url for m in self.hosts.prior_marks()):   # else no prior rewrites it
            info = self._adopt_seen(url, host, info, same_host) or info
        if "?" in url or ";" in url:
            # its skeleton's fingerprint when that is not the URL itself (``keys`` gives the 0 passed then)
            main = _keys(url, 0, info.relevant if info else _NOTHING)[0]
            if main:
                self.store.add_archived(main, SKEL, digest=d32, simhash=simhash)
        if info is not None and info.trusted:
            for e in (st.evidence if learned.trusted else st.evidence[-1:]):
                self._record_rewrite(e, info)
        self.hosts.dirty.add(host)
        return ch

    def _adopt_seen(self, url: str, host: str, info: HostInfo | None, canonical: str) -> HostInfo | None:
        """An archived URL that an active prior rewrites: adopt the prior on its host, so that the
        rewrite's image counts as archived (``_record_rewrite``). Not when the page declares a
        canonical other than that image (the site says the parameter matters)."""
        q = None
        out = None
        for rule, rid in self.hosts.rules(info):
            if rid >= 0 or rule_mark(rule) not in url:
                continue
            if q is None:
                q = parse(url)
            n = rule.apply(q)
            if n is None:
                continue
            if canonical and canonical != unparse(n):
                # several priors may apply: the page's canonical must be the image of them all
                full = n
                for other, orid in self.hosts.rules(info):
                    if orid < 0 and other is not rule:
                        full = other.apply(full) or full
                if canonical != unparse(full):
                    continue
            out = self.hosts.adopt(host, rule) or out
            info = out or info
        return out

    def _versus(self, ev: Evidence, digest: bytes, pend: tuple) -> int:
        """A sample's answer against the archived page its rule maps it onto (as kept in the
        archived set): the agreement rule of ``dust_evidence.compare`` on what is kept."""
        _kind, _rule, canonical, d32, sim = pend
        if int.from_bytes(digest[:4], "big") == d32:
            return AGREE
        if ev.simhash and sim and (ev.simhash ^ sim).bit_count() <= self.near_bits:
            return AGREE if ev.canonical == canonical else NEUTRAL
        return DISAGREE

    def _record_rewrite(self, e: Evidence, info: HostInfo) -> None:
        q = parse(e.url)
        used = []
        for rule, rid in info.trusted:
            n = rule.apply(q)
            if n is not None:
                q = n
                used.append(rid)
        # one rule id is kept with the rewrite: that of a prior when one took part (the weakest;
        # a skip on it is logged under all the host's priors, ``_trusted``)
        weak = [rid for rid in used if rid in info.priors]
        if used:
            self.store.add_archived(fingerprint(unparse(q)), CANON, (weak or used)[0], info.epoch,
                                    e.digest >> 32, e.simhash)

    # -- durability and reporting -------------------------------------------------------------
    def commit(self, then=None) -> None:
        """Write every changed host and commit (with a writer attached: handed over, ``then`` once
        it landed; see ``DustStore.commit``)."""
        self.store.meta["priors"] = self.priors.to_record()
        self.hosts.write_dirty()
        self.store.commit(then)

    def dirty_hosts(self) -> list[str]:
        """Hosts whose state changed since it was last written (``commit`` writes them)."""
        return list(self.hosts.dirty)

    def write_hosts(self, hosts: list[str]) -> None:
        """Write part of ``dirty_hosts()`` into the open transaction; ``commit`` writes the rest."""
        self.hosts.write_hosts(hosts)

    def close(self) -> None:
        if self.store.env is not None:
            if self.store.overlay is None:
                self.commit()
            self.store.close()

    def rules_of(self, host: str) -> list[dict]:
        st = self.hosts.state(host)
        rules = sorted(st.rules, key=lambda r: (r.state != TRUSTED, -r.skips, -r.confirmations))
        return [r.view() for r in rules] + [r.view() for r in st.retired if r.mismatches]

    def stats(self, top_hosts: int = 10, top_rules: int = 5) -> dict:
        meta = self.store.meta
        trusted = sum(len(i.trusted) for i in self.hosts.info.values())
        hosts = sorted((h for h, i in self.hosts.info.items() if i.trusted),
                       key=lambda h: (-self.hosts.skips_by_host[h], h))[:top_hosts]
        return {"rules_trusted": trusted, "hosts_with_rules": sum(1 for i in self.hosts.info.values() if i.trusted),
                "rules_learned_total": meta.get("learned", 0), "rules_retired_total": meta.get("retired", 0),
                "sample_mismatches_total": meta.get("mismatches", 0), "skipped_total": meta.get("skipped", 0),
                "probe_tokens": round(self.tokens, 2), "priors_active": len(self.priors.active),
                "priors_adopted_total": meta.get("adopted", 0),
                "priors": self.priors.view()[:top_hosts], **{k: v for k, v in self.counters.items()},
                "top": [{"host": h, "rules": self.rules_of(h)[:top_rules]} for h in hosts]}
