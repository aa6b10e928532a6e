"""What the DUST learner knows about one host: its evidence window and its rules, and how one
archived page changes them.

Evidence is what an archived page says about itself: (URL, payload digest, simhash, declared
same-host ``rel=canonical``). Two pages of a host *agree* when their digests are equal, or
their simhashes are near and their canonicals agree (one names the other, or both name the
same URL); they *disagree* when their texts are far apart (or they name different
canonicals); otherwise (near, nothing declared) the pair says nothing.

A rule is born from an agreeing pair it explains (``dust_rules.derive``), then every pair of
the window it relates (maps onto one URL) is a test: agreement confirms, disagreement retires
it at once and for good (and marks its parameter as one that changes content). A rule is
*trusted* once it has ``k`` independent confirmations: ``k`` distinct URLs it mapped agreeing
pages onto, one of them a pair with its own image (the canonical itself, not only two
variants of it), and for rules over many values (``?p``, ``?p=<cls>``) at least two distinct
values removed (KDD 2008 §5: support across the cluster, not one instance repeated).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from xxhash import xxh32_intdigest

from crawlerd._native import dustobs, dustobs_ref
from crawlerd._native.dustobs import BY_ONE, COMPARE, Evidence
from crawlerd.frontier.dust_rules import (
    Rule,
    derive,
    differing_name,
    parse_rule,
    relation,
)

__all__ = ["ID_CLASSES", "AGREE", "NEUTRAL", "DISAGREE", "CANDIDATE", "TRUSTED", "RETIRED", "Evidence", "RuleStat",
           "HostState", "RefHostState", "Learned", "compare"]

AGREE, NEUTRAL, DISAGREE = 1, 0, -1
CANDIDATE, TRUSTED, RETIRED = "candidate", "trusted", "retired"
MAX_RULES = 16              # candidate + trusted rules per host
MAX_RETIRED = 32            # retired rules remembered per host (so they are not learned again)
MAX_RELEVANT = 64           # names known to change content, per host
MAX_TARGETS = 16
ID_CLASSES = ("hex", "token")   # value classes of session-id-like values (unique per visit)


def compare(a: Evidence, b: Evidence, near_bits: int) -> int:
    if a.digest == b.digest:
        return AGREE
    if a.simhash and b.simhash and (a.simhash ^ b.simhash).bit_count() <= near_bits:
        if a.canonical == b.url or b.canonical == a.url or (a.canonical and a.canonical == b.canonical):
            return AGREE
        return DISAGREE if a.canonical and b.canonical else NEUTRAL
    return DISAGREE


@dataclass(slots=True)
class RuleStat:
    """A rule on one host and its record. Invariant: state TRUSTED only as the module docstring
    says; RETIRED is final; ``mismatches`` counts contradictions found while it was trusted."""
    rule: Rule
    id: int                                  # 0..255, unique among the host's rules (archived-set tag)
    state: str = CANDIDATE
    targets: list[int] = field(default_factory=list)   # 32-bit hashes of distinct confirmed images
    target_seen: bool = False
    values: list[int] = field(default_factory=list)    # up to 2 hashes of distinct removed values
    confirmations: int = 0
    skips: int = 0
    samples: int = 0
    mismatches: int = 0
    logged: int = 0                          # skips in the store's skip log
    since: float = 0.0                       # wall time of the last state change
    prior: bool = False                      # trusted as a cross-host prior (``dust_priors``), not
                                             # yet on this host's own k confirmations
    vouched: bool = False                    # met the trust conditions with k = 1 here (counted once
                                             # per host towards a cross-host prior)

    def to_list(self) -> list:
        return [self.rule.text, self.id, self.state, self.targets, int(self.target_seen), self.values,
                self.confirmations, self.skips, self.samples, self.mismatches, self.logged, round(self.since, 1),
                int(self.prior) | int(self.vouched) << 1]

    @classmethod
    def from_list(cls, x: list) -> RuleStat:
        flags = x[12] if len(x) > 12 else 0
        return cls(parse_rule(x[0]), x[1], x[2], list(x[3]), bool(x[4]), list(x[5]), *x[6:12],
                   bool(flags & 1), bool(flags & 2))

    def vouch(self) -> bool:
        """True once, when this host's evidence first meets the trust conditions with k = 1 (a pair
        with its image; two distinct values for a rule over many values, one for a rule over an
        id-like class: ``dust_priors`` asks for two distinct values over the hosts that vouch)."""
        if self.vouched or self.state == RETIRED or not self.target_seen or \
                (self.rule.general and len(self.values) < (1 if self.rule.vclass in ID_CLASSES else 2)):
            return False
        self.vouched = True
        return True

    def confirm(self, image: str, target: bool, values: tuple[str, ...], k: int) -> bool:
        """Count one agreeing pair; True when this makes the rule trusted."""
        self.confirmations += 1
        h = xxh32_intdigest(image.encode("utf-8", "surrogatepass"))
        if h not in self.targets and len(self.targets) < MAX_TARGETS:
            self.targets.append(h)
        self.target_seen = self.target_seen or target
        for v in values:
            hv = xxh32_intdigest(v.encode("utf-8", "surrogatepass"))
            if hv not in self.values and len(self.values) < 2:
                self.values.append(hv)
        if self.state != RETIRED and (self.state == CANDIDATE or self.prior) and len(self.targets) >= k and \
                self.target_seen and (not self.rule.general or len(self.values) >= 2):
            self.state, self.prior = TRUSTED, False     # a prior's adoption now stands on its own
            return True
        return False

    def view(self) -> dict:
        return {"rule": self.rule.text, "state": self.state, "confirmations": self.confirmations,
                "independent": len(self.targets), "prior": self.prior, "skips": self.skips, "samples": self.samples,
                "sample_mismatches": self.mismatches}


@dataclass(slots=True)
class Learned:
    """What one observation changed."""
    agreed: bool = False                                    # the page agreed with another one
    trusted: list[RuleStat] = field(default_factory=list)
    retired: list[RuleStat] = field(default_factory=list)
    related: list[RuleStat] = field(default_factory=list)   # rules this page was a test of
    vouched: list[RuleStat] = field(default_factory=list)   # rules this host now vouches for
    relevant: list[str] = field(default_factory=list)        # names newly known to change content


class HostState:
    """Key: host key. Invariants: at most MAX_RULES active rules (candidate or trusted), MAX_RETIRED
    retired, ``window`` evidence entries (oldest first, one per URL); ``epoch`` grows by one each
    time a rule is retired (rewrites recorded under an older epoch are void)."""

    __slots__ = ("rules", "retired", "evidence", "relevant", "epoch", "next_id")
    # the evidence records and the window's first pass: native (``_native.dustobs``); ``RefHostState``
    # runs on their plain-Python reference
    Evidence = Evidence
    _ev = dustobs

    def __init__(self, record: dict | None = None):
        r = record or {}
        self.rules = [RuleStat.from_list(x) for x in r.get("r", ())]
        self.retired = [RuleStat.from_list(x) for x in r.get("x", ())]
        self.evidence = self._ev.from_lists(r.get("e", ()))
        self.relevant: set[str] = set(r.get("rel", ()))
        self.epoch: int = r.get("ep", 0)
        self.next_id: int = r.get("id", 0)

    def to_record(self) -> dict:
        # the evidence lists in one call (``Evidence.to_list``): a record is encoded per archived page
        return {"r": [x.to_list() for x in self.rules], "x": [x.to_list() for x in self.retired],
                "e": self._ev.to_lists(self.evidence),
                "rel": sorted(self.relevant), "ep": self.epoch, "id": self.next_id}

    def window_counts(self) -> tuple[int, int, int, int]:
        """(URL and canonical characters, canonicals, parsed URLs, their characters) of the
        evidence window: what the cache's RAM estimate counts (``dust_hosts.host_state_bytes``)."""
        return self._ev.window_counts(self.evidence)

    def shrink(self) -> bool:
        """Give up the least valuable state (oldest evidence, then oldest retired rule, then the
        weakest candidate) to fit a byte bound; False when nothing is left to give up."""
        if len(self.evidence) > 2:
            del self.evidence[0]
        elif self.retired:
            del self.retired[0]
        elif any(r.state == CANDIDATE for r in self.rules):
            weakest = min((r for r in self.rules if r.state == CANDIDATE), key=lambda r: r.confirmations)
            self.rules.remove(weakest)
        elif self.evidence:
            del self.evidence[0]
        else:
            return False
        return True

    def trusted(self) -> list[RuleStat]:
        return [r for r in self.rules if r.state == TRUSTED]

    def find(self, text: str) -> RuleStat | None:
        for r in self.rules:
            if r.rule.text == text:
                return r
        for r in self.retired:
            if r.rule.text == text:
                return r
        return None

    def by_id(self, rid: int) -> RuleStat | None:
        for r in self.rules:
            if r.id == rid:
                return r
        return None

    def adopt(self, rule: Rule, now: float) -> RuleStat | None:
        """Trust ``rule`` here as a cross-host prior (``dust_priors``): a candidate of it is raised,
        a new one made; None when the host retired it or has no room."""
        rs = self.find(rule.text)
        if rs is not None:
            if rs.state != CANDIDATE:
                return None
        else:
            if len(self.rules) >= MAX_RULES and not self._make_room():
                return None
            rs = RuleStat(rule, self._new_id(), since=now)
            self.rules.append(rs)
        rs.state, rs.prior, rs.since = TRUSTED, True, now
        return rs

    def _new_id(self) -> int:
        used = {r.id for r in self.rules}
        while True:
            rid = self.next_id
            self.next_id = (self.next_id + 1) & 0xFF
            if rid not in used:
                return rid

    # -- one archived page -------------------------------------------------------------------
    def learn(self, ev: Evidence, *, k: int, near_bits: int, window: int, now: float | None = None) -> Learned:
        out = Learned()
        now = time.time() if now is None else now
        # the pairs with the window that may teach something (the rest disagree, far apart, and
        # cannot differ in one name), in window order; a refetch is no pair
        old, teach = self._ev.scan(self.evidence, ev, near_bits)
        fresh: list[RuleStat] = []
        for i, flags in teach:
            e = old[i]
            v = compare(ev, e, near_bits) if flags & COMPARE else DISAGREE
            if v == AGREE:
                out.agreed = True
                for rule in derive(ev.url, e.url, frozenset(self.relevant), ev.canonical or e.canonical,
                                   (ev.parts, e.parts)):
                    if self.find(rule.text) is not None or any(t.rule.covers(rule) for t in self.trusted()):
                        continue
                    if len(self.rules) >= MAX_RULES and not self._make_room():
                        break
                    rs = RuleStat(rule, self._new_id(), since=now)
                    self.rules.append(rs)
                    fresh.append(rs)
            elif v == DISAGREE and flags & BY_ONE:
                name = differing_name(ev.parts, e.parts)
                if name and name not in self.relevant and len(self.relevant) < MAX_RELEVANT:
                    self.relevant.add(name)
                    out.relevant.append(name)
        every = old + [ev]
        memo: dict = {}             # (rule, parts) -> the rule applied: each URL rewritten once a rule
        for rs in list(self.rules):
            if rs not in self.rules:         # pruned by a rule trusted earlier in this loop
                continue
            name = rs.rule.name
            if rs in fresh:          # a new rule meets the whole window, each pair once
                idx = [i for i, x in enumerate(every) if name in x.url]
                named = set(idx)
                pairs = [(every[i], every[j]) for i in idx for j in range(len(every))
                         if j != i and not (j in named and j < i)]
            elif name in ev.url:
                pairs = [(ev, e) for e in old]
            else:
                pairs = [(ev, e) for e in old if name in e.url]
            if not pairs:
                continue
            # other rules of its kind, for pairs that differ in several parameters at once
            # (``?utm_source=..&utm_medium=..``): such a pair only confirms, never retires
            also = tuple(r.rule for r in self.rules if r is not rs and r.rule.kind == rs.rule.kind and
                         r.rule.name != name)
            for a, b in pairs:
                rel = relation(rs.rule, a.parts, b.parts, memo=memo)
                joint = False
                if rel is None:
                    if not also:
                        continue
                    rel = relation(rs.rule, a.parts, b.parts, also, memo=memo)
                    if rel is None:
                        continue
                    joint = True
                v = compare(a, b, near_bits)
                if v == AGREE:
                    if rs not in out.related:
                        out.related.append(rs)
                    trusted_now = rs.confirm(rel.image, rel.target, rel.values, k)
                    if rs.vouch():
                        out.vouched.append(rs)
                    if trusted_now:
                        rs.since = now
                        out.trusted.append(rs)
                        # rules it covers add nothing now (a literal under a trusted "any value"); a
                        # trusted one that skipped URLs stays, so its retirement can give them back
                        self.rules = [r for r in self.rules if not rs.rule.covers(r.rule) or
                                      (r.state == TRUSTED and r.logged)]
                elif v == DISAGREE and not joint:
                    if rs not in out.related:
                        out.related.append(rs)
                    self.retire(rs, now)
                    out.retired.append(rs)
                    if rs in out.trusted:
                        out.trusted.remove(rs)
                    break
        self.evidence = every[-window:]
        return out

    def _make_room(self) -> bool:
        """Drop the weakest candidate (fewest confirmations, then oldest) for a new one."""
        cands = [r for r in self.rules if r.state == CANDIDATE]
        if not cands:
            return False
        self.rules.remove(min(cands, key=lambda r: (r.confirmations, r.since)))
        return True

    def retire(self, rs: RuleStat, now: float) -> None:
        if rs.state == TRUSTED:
            rs.mismatches += 1
        rs.state, rs.since = RETIRED, now
        self.rules.remove(rs)
        self.retired.append(rs)
        del self.retired[:-MAX_RETIRED]
        self.epoch += 1
        if len(self.relevant) < MAX_RELEVANT:
            self.relevant.add(rs.rule.name)


class RefHostState(HostState):
    """``HostState`` on the plain-Python reference of its native parts (``_native.dustobs_ref``):
    the same rules, evidence and records from the same pages; the tests compare the two."""

    __slots__ = ()
    Evidence = dustobs_ref.Evidence
    _ev = dustobs_ref
