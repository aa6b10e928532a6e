"""The DUST learner's per-host state in RAM (``crawlerd.frontier.dust``): host states cached over
the store (``dust_store``, written back at commit), and for each host with something to apply
what admission needs of it (``HostInfo``), with the rules admission applies there: its trusted
rules, then the active cross-host priors it has not adopted (``dust_priors``)."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from crawlerd.frontier.dust_evidence import HostState, RefHostState
from crawlerd.frontier.dust_priors import PriorTable
from crawlerd.frontier.dust_rules import Rule, rule_mark
from crawlerd.frontier.dust_store import DustStore


class HostInfo(NamedTuple):
    """What admission needs of a host, kept in RAM for hosts with trusted rules, relevant names or
    retired rules."""
    trusted: tuple[tuple[Rule, int], ...]
    epoch: int
    relevant: frozenset[str]
    names: dict[int, str]           # rule id -> text
    priors: frozenset[int]          # ids of rules trusted as cross-host priors only
    retired: frozenset[str]         # texts of rules retired here (never adopted again)
    samples: dict[str, int]         # rule text -> samples that agreed with it (kept current in place)


# RAM of a cached host state, estimated from its decoded objects (CPython 3.11, 64-bit; measured
# with tracemalloc on replayed simweb crawls, plain hosts and hosts with URL variants and rules:
# within 5 % of what dropping the states frees, ``bench/dust_state_bytes.py``). The estimate it
# replaces, 512 B + 7 B per byte of the stored record, dated from Python evidence records and
# overstated the native ones 1.4-3.4x. Rules are shared values (``parse_rule``): not counted.
STATE_BYTES = 720           # HostState and its three lists and set, the LRU's entry and charge, the
                            # store's note of the record's size and sequence (get_host_sized)
EVIDENCE_BYTES = 116        # an Evidence (digest and simhash in C), its window slot, its URL's str header
CANONICAL_BYTES = 57        # a declared canonical's str header (its characters are counted apart)
PARSED_BYTES = 128          # a parsed URL (``Evidence.parts``): the Parts tuple and its tuples ...
PARSED_PER_CHAR = 7         # ... and its pieces, the query's twice (its items and their pairs)
RULE_BYTES = 280            # a RuleStat (15 slots), its targets and values lists, its float
RULE_HASH_BYTES = 40        # one of a rule's target or value hashes: an int above 2**30 and its slot
NAME_BYTES = 72             # a relevant name: its str header and its set slot


def host_state_bytes(st: HostState) -> int:
    """Estimated RAM of one cached host state, from its decoded objects (one pass over its window
    in C, one over its rules)."""
    chars, canonicals, parsed, parsed_chars = st.window_counts()
    n = (STATE_BYTES + EVIDENCE_BYTES * len(st.evidence) + chars + CANONICAL_BYTES * canonicals
         + PARSED_BYTES * parsed + PARSED_PER_CHAR * parsed_chars)
    # most hosts have no rules and no relevant names: no generator for them (charged at each
    # load and each write, so about twice per archived page)
    rules = st.rules + st.retired if st.retired else st.rules
    if rules:
        n += sum(RULE_BYTES + RULE_HASH_BYTES * (len(r.targets) + len(r.values)) for r in rules)
    if st.relevant:
        n += sum(NAME_BYTES + len(name) for name in st.relevant)
    return n


class DustHosts:
    """Host states by host key: the most recently used in an LRU of at most ``cache_hosts``
    entries and ``cache_bytes`` estimated bytes (a changed one also in ``dirty`` until written),
    ``info`` for every host with trusted, relevant or retired rules. Invariants: ``info`` of a
    host is rebuilt (``refresh``) whenever its trusted rules, relevant names or retired rules
    change; an info is replaced then, and only its sample counts change in place (``observe``).
    ``cached_bytes`` is the sum of the cached states' charges, each charged an estimate of its
    decoded objects (``host_state_bytes``) when loaded and again when written (a state grows
    between: by the evidence of the pages archived since the last commit, and the URLs parsed), and the LRU is cut back to its bounds after each load and
    each write of the changed states (it keeps at least the state just used)."""

    def __init__(self, store: DustStore, priors: PriorTable, *, cache_hosts: int, max_host_bytes: int,
                 clock, counters: Counter, on_evict: Callable[[str], None], cache_bytes: int = 16 << 20,
                 native: bool = True):
        """``counters``: the learner's (adoptions are counted there); ``on_evict(host)``: the
        store dropped the host's record to stay in bounds (the learner forgets it too); ``native``:
        host states on ``_native.dustobs`` (else ``RefHostState``, its reference)."""
        self.State = HostState if native else RefHostState
        self.store, self.priors, self.cache_hosts, self.max_host_bytes = store, priors, cache_hosts, max_host_bytes
        self.cache_bytes = cache_bytes
        self._clock, self.counters, self._on_evict = clock, counters, on_evict
        self._cache: OrderedDict[str, HostState] = OrderedDict()
        self._charged: dict[str, int] = {}          # host -> its state's charge, bytes (the cached ones)
        self.cached_bytes = 0
        self.dirty: set[str] = set()
        self.info: dict[str, HostInfo] = {}
        self.skips_by_host: Counter[str] = Counter()
        self._marks: tuple[int, tuple[str, ...]] = (-1, ())
        self._bare: tuple[int, tuple] = (-1, ())
        # id(host info) -> (that info, priors version, its rules): infos are replaced when their rules
        # change (only the sample counts change in place, and rules do not depend on them)
        self._rules_cache: OrderedDict[int, tuple] = OrderedDict()
        for host, rec in self.store.hosts():
            st = self.State(rec)
            self.refresh(host, st)
            self.skips_by_host[host] = sum(r.skips for r in st.rules)

    def state(self, host: str) -> HostState:
        st = self._cache.get(host)
        if st is not None:
            self._cache.move_to_end(host)
            return st
        rec, _size = self.store.get_host_sized(host, remember=True)     # written back without a read
        st = self.State(rec)
        self._cache[host] = st
        self._charge(host, st)
        self._cut()
        return st

    def _charge(self, host: str, st: HostState) -> None:
        b = host_state_bytes(st)
        self.cached_bytes += b - self._charged.get(host, 0)
        self._charged[host] = b

    def _cut(self) -> None:
        """Evict the least recently used states (a changed one is written first) down to the bounds."""
        while len(self._cache) > 1 and (len(self._cache) > self.cache_hosts or self.cached_bytes > self.cache_bytes):
            old, ost = self._cache.popitem(last=False)
            self.cached_bytes -= self._charged.pop(old)
            if old in self.dirty:
                self.write(old, ost)
            self.store.forget(old)

    def memory(self) -> dict[str, int]:
        """The cached states' estimated bytes against ``cache_bytes`` (`crawlerd stats`)."""
        return {"bytes": self.cached_bytes, "cap_bytes": self.cache_bytes, "entries": len(self._cache)}

    def write(self, host: str, st: HostState) -> None:
        raw = self.store.encode(st.to_record())
        while len(raw) > self.max_host_bytes and st.shrink():
            raw = self.store.encode(st.to_record())
        for gone in self.store.put_host(host, raw):      # the least recently written hosts
            self.info.pop(gone, None)
            self.skips_by_host.pop(gone, None)
            self._on_evict(gone)
        self.dirty.discard(host)
        if host in self._charged:
            self._charge(host, st)

    def refresh(self, host: str, st: HostState) -> None:
        trusted = tuple(sorted(((r.rule, r.id) for r in st.trusted()), key=lambda x: x[0].text))
        if trusted or st.relevant or st.retired:
            self.info[host] = HostInfo(trusted, st.epoch, frozenset(st.relevant),
                                       {r.id: r.rule.text for r in st.rules},
                                       frozenset(r.id for r in st.rules if r.prior),
                                       frozenset(r.rule.text for r in st.retired),
                                       {r.rule.text: r.samples for r in st.rules if r.samples})
        else:
            self.info.pop(host, None)

    def rules(self, info: HostInfo | None) -> tuple[tuple[Rule, int], ...]:
        """The rules admission applies on a host: its trusted ones (an adopted prior only while the
        prior is active), then the active priors it has not adopted (id -1) whose name it does not
        know to change content and that it never retired."""
        active = self.priors.active
        if info is None:
            if self._bare[0] != self.priors.version:
                self._bare = (self.priors.version, tuple((r, -1) for r in active))
            return self._bare[1]
        hit = self._rules_cache.get(id(info))
        if hit is not None and hit[0] is info and hit[1] == self.priors.version:
            return hit[2]
        out = self._host_rules(info, active)
        self._rules_cache[id(info)] = (info, self.priors.version, out)
        while len(self._rules_cache) > self.cache_hosts:
            self._rules_cache.popitem(last=False)
        return out

    def _host_rules(self, info: HostInfo, active: tuple[Rule, ...]) -> tuple[tuple[Rule, int], ...]:
        own = info.trusted
        if info.priors:
            own = tuple(x for x in own if x[1] not in info.priors or self.priors.is_active(info.names[x[1]]))
        if not active:
            return own
        texts = info.names.values()
        rel, ret = info.relevant, info.retired
        extra = tuple((r, -1) for r in active if r.name not in rel and r.text not in ret and r.text not in texts)
        return own + extra if extra else own

    def prior_marks(self) -> tuple[str, ...]:
        """Substrings one of which a URL must contain for an active prior to rewrite it."""
        if self._marks[0] != self.priors.version:
            self._marks = (self.priors.version, tuple(sorted({rule_mark(r) for r in self.priors.active})))
        return self._marks[1]

    def adopt(self, host: str, rule: Rule) -> HostInfo | None:
        """Trust an active prior on ``host`` (its first use there): the host's info after, or None."""
        st = self.state(host)
        rs = st.adopt(rule, self._clock())
        if rs is None:
            return None
        self.counters["priors_adopted"] += 1
        self.store.meta["adopted"] = self.store.meta.get("adopted", 0) + 1
        self.refresh(host, st)
        self.dirty.add(host)
        return self.info.get(host)

    def write_dirty(self) -> None:
        """Write every changed host state still cached (into the store's open transaction)."""
        self.write_hosts(list(self.dirty))
        self.dirty.clear()
        self._cut()                 # the states written may have grown past the byte bound

    def write_hosts(self, hosts: list[str]) -> None:
        """Write those of ``hosts`` still changed and cached (into the store's open transaction):
        ``write_dirty`` in parts, a host changed again after its part stays dirty."""
        for host in hosts:
            if host in self.dirty:
                st = self._cache.get(host)
                if st is not None:
                    self.write(host, st)
        self._cut()                 # the states written may have grown past the byte bound
